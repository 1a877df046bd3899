"""A whole line on one machine: a labgrid coordinator, exporters acting as separate hosts,
an OpenSSH server on loopback that the fleet client reaches every "host" through, and
emulated boards.

Every host name (`hosta`, `hostb`, …) is an SSH alias of 127.0.0.1 on a private port,
given to ssh through a wrapper on PATH (`ssh -F our config`): labgrid runs plain `ssh`,
and ssh reads its per-user configuration from the passwd home, not from $HOME. Each host
has its own audit database and its own boards. Everything listens on 127.0.0.1 only.
The operator's config file (`AMDFLASH_CONFIG` of every command run here) allows the hosts
added with `add_host`, each with its own database (`fleet_hosts`); `start_rogue` runs an
exporter that publishes whatever it is given. Used by the fleet tests and by
tests/bench/bench_fleet.py.
"""
from __future__ import annotations

import getpass
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from amdflash.stages.sim import create_board

BIN = Path(sys.executable).parent
SSH_KEY_ALIAS = "amdflash-fleet-test-sshd"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_sshd() -> str | None:
    return shutil.which("sshd", path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]))


def missing() -> str | None:
    """Why the lab cannot run here, or None."""
    try:
        import labgrid  # noqa: F401
    except ImportError:
        return "labgrid is not installed (pip install '.[test]' brings it)"
    if not find_sshd() or not shutil.which("ssh") or not shutil.which("ssh-keygen"):
        return "OpenSSH (sshd, ssh, ssh-keygen) not found: install openssh-server (.ci/run does)"
    return None


def wait_for(check, timeout: float, what: str, interval: float = 0.1):  # noqa: ANN001, ANN201
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class _StderrInFile(subprocess.Popen):
    """A process whose stderr is a file, read back whole by communicate() as a pipe's would be."""

    def __init__(self, argv: list[str], err: Any, **kwargs: Any):
        super().__init__(argv, stderr=err, **kwargs)
        self._err = err

    def communicate(self, input: Any = None, timeout: float | None = None) -> tuple[Any, Any]:
        out, _ = super().communicate(input, timeout)
        self._err.seek(0)
        text = self._err.read()
        self._err.close()
        return out, text


@dataclass
class Host:
    name: str
    db: Path
    boards: list[Path] = field(default_factory=list)
    config: Path | None = None
    exporter: subprocess.Popen | None = None


class Lab:
    def __init__(self, root: Path, jobs_nice: int = 0):
        """`jobs_nice`: the CPU priority (nice) of the hosts' jobs (sshd and what it starts). A
        job's process carries its emulated board, whose CPU stands for work a real board does in
        its own silicon, on another machine: on one small machine, 64 of them would otherwise
        take the CPU from the services a test measures (the follow services, fleet serve, the
        browser)."""
        self.root = root
        self.jobs_nice = jobs_nice
        self.root.mkdir(parents=True, exist_ok=True)
        self.procs: list[subprocess.Popen] = []
        self.hosts: dict[str, Host] = {}
        self.ssh_dir = root / "ssh"
        self.ssh_port = 0
        self.coordinator: subprocess.Popen | None = None
        self.coordinator_port = free_port()
        self.address = f"127.0.0.1:{self.coordinator_port}"

    # -- processes ----------------------------------------------------------------------------

    def _spawn(self, argv: list[str], log: str, env: dict[str, str] | None = None, nice: int = 0,
               **kwargs: Any) -> subprocess.Popen:
        out = open(self.root / log, "ab")
        if nice:
            kwargs["preexec_fn"] = lambda: os.nice(nice)   # inherited by what it starts
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=self.env(PYTHONUNBUFFERED="1", **(env or {})), **kwargs)
        out.close()
        self.procs.append(proc)
        return proc

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LG_", "AMDFLASH_"))}
        env["PATH"] = os.pathsep.join([str(self.ssh_dir / "bin"), str(BIN), env.get("PATH", "")])
        env["LG_COORDINATOR"] = self.address
        env["AMDFLASH_CONFIG"] = str(self.config)
        env.update(extra)
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    @property
    def config(self) -> Path:
        """The operator's config file: the lab's hosts are the allowlist."""
        path = self.root / "config.toml"
        if not path.exists():
            path.write_text("")
        return path

    def allow(self, *entries: str) -> None:
        """Write the operator's allowlist (`fleet_hosts`)."""
        self.config.write_text(f"fleet_hosts = {json.dumps(list(entries))}\n")

    def close(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        # labgrid's SSH control masters detach from their client (ControlPersist): the ones
        # of a client that was killed outlive it; they are ours by their configuration file.
        for pid, argv in self._ssh_masters():
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            for arg in argv:   # and the directory labgrid made for its control socket
                if arg.startswith("ControlPath="):
                    # only labgrid's own temporary directory: an ssh of the lab's config still
                    # running (a fleet job's, `ControlPath=none`) must never make this remove
                    # the working directory ("none".parent is ".")
                    sockets = Path(arg.split("=", 1)[1]).parent
                    if sockets.is_absolute() and sockets.name.startswith("lg-con-"):
                        shutil.rmtree(sockets, ignore_errors=True)

    def _ssh_masters(self) -> list[tuple[int, list[str]]]:
        mark = str(self.ssh_dir / "ssh_config")
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
                except OSError:
                    continue
                if mark in argv:
                    found.append((int(entry.name), argv))
        return found

    # -- SSH on loopback ------------------------------------------------------------------------

    def start_sshd(self) -> None:
        d = self.ssh_dir
        (d / "bin").mkdir(parents=True)
        d.chmod(0o700)
        for key in ("host_key", "client_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", key, "-f", str(d / key)], check=True)
        (d / "authorized_keys").write_text((d / "client_key.pub").read_text())
        host_pub = (d / "host_key.pub").read_text().split()
        (d / "known_hosts").write_text(f"{SSH_KEY_ALIAS} {host_pub[0]} {host_pub[1]}\n")
        port = free_port()
        (d / "sshd_config").write_text("\n".join([
            f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {d / 'host_key'}", f"PidFile {d / 'sshd.pid'}",
            f"AuthorizedKeysFile {d / 'authorized_keys'}", "StrictModes no", "PubkeyAuthentication yes",
            "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no",
            "PermitRootLogin prohibit-password", "MaxSessions 64", "MaxStartups 64:30:128", "LogLevel ERROR",
            # each "host" signs its trail with its own key (as separate machines would)
            "AcceptEnv AMDFLASH_HOST_KEY",
            *([f"ForceCommand {self._low_priority_shell()}"] if self.jobs_nice else []), ""]))
        if os.geteuid() == 0:
            # sshd running as root needs its privilege-separation directory (the package's
            # service unit makes it; a machine without systemd has none).
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        self._spawn([find_sshd(), "-D", "-e", "-f", str(d / "sshd_config")], "sshd.log", nice=self.jobs_nice)
        wait_for(lambda: _port_open(port), 15, "sshd to listen")
        self.ssh_port = port
        self._write_ssh_config()
        ssh = d / "bin" / "ssh"
        ssh.write_text(f"#!/bin/sh\nexec {shutil.which('ssh')} -F {d / 'ssh_config'} \"$@\"\n")
        ssh.chmod(0o755)

    def _low_priority_shell(self) -> Path:
        """What sshd runs each SSH command through when the jobs run at low priority: sshd gives
        every session its own scheduling group (autogroup), whose weight a process's nice value
        does not change, so the group's own nice is set too, then the command runs as sshd
        would have run it."""
        path = self.ssh_dir / "low-priority"
        path.write_text("#!/bin/sh\n"
                        f"echo {self.jobs_nice} > /proc/self/autogroup 2>/dev/null\n"
                        'exec /bin/sh -c "$SSH_ORIGINAL_COMMAND"\n')
        path.chmod(0o755)
        return path

    def _write_ssh_config(self) -> None:
        d = self.ssh_dir
        per_host = [line for name in self.hosts
                    for line in (f"Host {name}", f"  SetEnv AMDFLASH_HOST_KEY={self.host_key(name)}")]
        (d / "ssh_config").write_text("\n".join([
            *per_host,
            "Host *", "  HostName 127.0.0.1", f"  Port {self.ssh_port}", f"  User {getpass.getuser()}",
            f"  IdentityFile {d / 'client_key'}", "  IdentitiesOnly yes", f"  UserKnownHostsFile {d / 'known_hosts'}",
            f"  HostKeyAlias {SSH_KEY_ALIAS}", "  BatchMode yes", ""]))

    def host_key(self, name: str) -> Path:
        """The host's own signing key (its jobs get it through SSH's SetEnv)."""
        return self.root / name / "host_key.pem"

    # -- the central record and the line view -----------------------------------------------------

    def central(self, postgres: Any, url: str) -> str:
        """Set up the central database at `url` and enrol every host (login: its name); returns
        the URL of a reviewer login (amdflash_read) for `fleet serve`."""
        self.amdflash("fleet", "central-setup", url)
        for name in self.hosts:
            pub = self.root / name / "host.pub"
            self.amdflash("audit", "key", "-o", str(pub), AMDFLASH_HOST_KEY=str(self.host_key(name)))
            self.amdflash("fleet", "enroll", "--to", url, "--key", str(pub), "--name", name)
        import psycopg

        with psycopg.connect(url, autocommit=True) as pg:
            pg.execute("CREATE ROLE line_viewer LOGIN IN ROLE amdflash_read")
        return url.replace("postgresql://amdflash@", "postgresql://line_viewer@")

    def watched_line(self, cluster: Any, *tags: str) -> tuple[str, str, list[dict[str, Any]]]:
        """The line as it is watched: a fresh central database with every host enrolled, the
        exporters up, a place per board (tagged), each host's follow service. Returns the
        administrator's URL, a reviewer's URL for `fleet serve`, and the places."""
        from tests.pipeline.fleet.central_trail import new_database

        admin = new_database(cluster)
        viewer = self.central(cluster, admin)
        for name in self.hosts:
            self.start_exporter(name)
        places = self.make_places(*tags)
        for name in self.hosts:
            self.start_follow(name, admin)
        return admin, viewer, places

    def start_follow(self, name: str, url: str) -> subprocess.Popen:
        """The host's follow service (`audit push --follow`), as its own login."""
        host = self.hosts[name]
        login = url.replace("postgresql://amdflash@", f"postgresql://{name}@")
        return self._spawn([sys.executable, "-m", "amdflash.pipeline.cli", "--db", str(host.db), "audit", "push",
                            "--follow", "--to", login, "--interval", "0.2", "--exporter-config", str(host.config),
                            "--host-name", name], f"follow-{name}.log", cwd=self.root,
                           env={"AMDFLASH_HOST_KEY": str(self.host_key(name))})

    def start_serve(self, url: str, *options: str) -> str:
        """`fleet serve` on a free port; its base URL once it answers."""
        port = free_port()
        self._spawn([sys.executable, "-m", "amdflash.pipeline.cli", "fleet", "serve", "--from", url, "--listen",
                     f"127.0.0.1:{port}", "--state-dir", str(self.root / "serve-state"), *options], "serve.log",
                    cwd=self.root)
        base = f"http://127.0.0.1:{port}/"

        def up() -> bool:
            import urllib.request

            try:
                with urllib.request.urlopen(base, timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        wait_for(up, 60, "fleet serve to answer")
        return base

    # -- labgrid --------------------------------------------------------------------------------

    def start_coordinator(self) -> None:
        workdir = self.root / "coordinator"
        workdir.mkdir(exist_ok=True)
        self.coordinator = self._spawn([str(BIN / "labgrid-coordinator"), "-l", self.address], "coordinator.log",
                                       cwd=workdir)
        wait_for(lambda: _port_open(self.coordinator_port), 20, "the labgrid coordinator to listen")

    def add_host(self, name: str, boards: int, *, realtime: float = 0.0, seed: int = 0, seed_step: int = 1,
                 faults: dict[int, list[str]] | None = None, transport: str = "asm24",
                 content: str | bytes | None = None) -> Host:
        """A host with `boards` emulated boards (board i: seed + i * seed_step, faults[i]) and its
        exporter configuration; the exporter is started by start_exporter."""
        host = Host(name, self.root / name / "audit.sqlite")
        for i in range(boards):
            host.boards.append(create_board(self.root / name / f"board{i}", seed=seed + i * seed_step,
                                            realtime_scale=realtime,
                                            transport=transport, faults=(faults or {}).get(i),
                                            **({"content": content} if content is not None else {})))
        host.config = self.root / name / "exporter.yaml"
        self.amdflash("--db", str(host.db), "fleet", "exporter-config", "--no-hardware",
                      *[a for b in host.boards for a in ("--sim", str(b))], "-o", str(host.config))
        self.hosts[name] = host
        self.allow(*[f"{h.name}={h.db}" for h in self.hosts.values()])
        if self.ssh_dir.joinpath("ssh_config").exists():
            self._write_ssh_config()
        return host

    def start_exporter(self, name: str) -> None:
        host = self.hosts[name]
        host.exporter = self._spawn([str(BIN / "labgrid-exporter"), "-c", self.address, "-n", name,
                                     "--hostname", name, str(host.config)], f"exporter-{name}.log")

    def start_rogue(self, name: str, resources: dict[str, dict[str, Any]], hostname: str | None = None) -> Path:
        """An exporter `name` publishing `resources` ({group: {class: attributes}}) as given: what
        anyone who reaches the coordinator can do. Returns its configuration file."""
        config = self.root / f"rogue-{name}.yaml"
        config.write_text(json.dumps(resources))       # JSON is YAML
        self._spawn([str(BIN / "labgrid-exporter"), "-c", self.address, "-n", name, "--hostname", hostname or name,
                     str(config)], f"exporter-{name}.log")
        return config

    def make_places(self, *tags: str) -> list[dict[str, Any]]:
        """`fleet places` until every board of every host has its place."""
        want = sum(len(h.boards) for h in self.hosts.values())

        def complete() -> list[dict[str, Any]] | None:
            listed = json.loads(self.amdflash("fleet", "places", "--format", "json",
                                              *[a for t in tags for a in ("--tag", t)]).stdout)
            return listed if len(listed) >= want else None

        return wait_for(complete, 30, f"{want} boards to be published", interval=0.3)

    # -- commands -------------------------------------------------------------------------------

    def amdflash(self, *args: str, check: bool = True, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, "-m", "amdflash.pipeline.cli", *args], capture_output=True, text=True,
                              timeout=timeout, env=self.env(**env), cwd=self.root)
        if check and done.returncode != 0:
            raise AssertionError(f"amdflash {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
        return done

    def fleet_popen(self, *args: str, **env: str) -> subprocess.Popen:
        # stderr goes to a file: off a terminal `fleet flash` says each board's progress every few
        # seconds, and a caller that polls the process while the line runs (the line-view bench,
        # 64 boards) would otherwise fill the pipe and leave the client blocked in a write.
        import tempfile

        err = tempfile.TemporaryFile(mode="w+", dir=self.root)
        return _StderrInFile([sys.executable, "-m", "amdflash.pipeline.cli", "fleet", *args, "--format", "json"],
                             err, stdout=subprocess.PIPE, text=True, env=self.env(**env),
                             cwd=self.root, start_new_session=True)   # a process group, as in a terminal

    def fleet(self, *args: str, timeout: float = 300, **env: str) -> "FleetOutcome":
        proc = self.fleet_popen(*args, **env)
        out, err = proc.communicate(timeout=timeout)
        return FleetOutcome.parse(proc.returncode, out, err)

    def labgrid_client(self, *args: str, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "labgrid-client"), *args], capture_output=True, text=True, timeout=60,
                              env=self.env(**env), cwd=self.root)

    def stop(self, proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
        proc.send_signal(sig)
        proc.wait(timeout=30)


@dataclass
class FleetOutcome:
    code: int
    boards: dict[str, dict[str, Any]]
    notes: list[str]
    stderr: str

    @classmethod
    def parse(cls, code: int, out: str, err: str) -> "FleetOutcome":
        try:
            data = json.loads(out)
        except json.JSONDecodeError:
            raise AssertionError(f"fleet printed no JSON (exit {code}):\n{out}\n{err}") from None
        return cls(code, {b["board"]: b for b in data["boards"]}, data["notes"], err)

    def statuses(self) -> dict[str, str]:
        return {name: b["status"] for name, b in self.boards.items()}
