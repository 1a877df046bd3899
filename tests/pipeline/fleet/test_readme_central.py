"""The README's "One record" set-up and its line view's, run as written (issue 27 item 11): every
line of the two `sh` blocks, in their order, against a PostgreSQL cluster of this test's own
whose pg_hba.conf gets the README's line, so every login but the administrator needs the
password the README puts in a `.pgpass`. A line this test does not know fails it: the README
cannot gain a step that nobody has run.

What cannot run here is said per line (`SKIPPED`): the service manager (the cluster is the
test's own, started by it), TCP (the cluster listens on its socket only: the README's
`host … 10.0.0.0/24` line becomes the same line for `local` connections) and the units
(tests/pipeline/fleet/test_units.py checks their commands). `fleet serve` listens on a free
port rather than its default (tests run side by side). The names stay the README's: the
database `amdflash`, the host `hosta`, its login `hosta`, `reviewer`, `line_viewer`; `central`
is the cluster's socket directory; `sudo -u ACCOUNT` is a HOME of that account's own (where
libpq looks for .pgpass), and a line without sudo is the reviewer's.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.pipeline.fleet.central_trail import psql
from tests.pipeline.fleet.pgcluster import PORT, SUPERUSER, PostgresCluster
from tests.support import cli as command_line
from tests.support.readme import README, drop_optional

pytest.importorskip("psycopg", reason="psycopg is not installed (pip install '.[test]' brings it)")

PASSWORD = "pw-of-hosta"
HBA_LINE = r"echo '(host\s+.*)' \| sudo tee -a \"\$\(sudo -u postgres psql -tAc 'SHOW hba_file'\)\""
SKIPPED = {      # the first marker a line holds says why it is not run here
    "sudo cp pipeline/fleet/units/": "a systemd unit (test_units.py checks its command)",
    "systemctl enable --now amdflash-push.timer": "a systemd unit (test_units.py checks its command)",
    "sudo systemctl ": "the service manager: this cluster is the test's own, started by it",
    "ALTER SYSTEM SET listen_addresses": "TCP: this cluster listens on its unix socket only",
}


def readme_block(marker: str) -> list[str]:
    """The command lines of the README's `sh` block that holds `marker`."""
    blocks = [b for b in re.findall(r"```sh\n(.*?)```", README.read_text(), re.S) if marker in b]
    assert len(blocks) == 1, f"the README's block with {marker!r}"
    return [line.strip() for line in blocks[0].splitlines() if line.strip() and not line.lstrip().startswith("#")]


def without_options(line: str) -> str:
    """A line with its optional parts ([--blob-quota 64G], [HOST/]) dropped and its trailing
    comment cut; of alternatives (text|json|html) the first."""
    line = drop_optional(re.sub(r"\s+#\s.*$", "", line))
    return re.sub(r"\b(\w+)(\|\w+)+\b", r"\1", line)


class Line:
    """The README's line, and the accounts, files and cluster it speaks of, here."""

    def __init__(self, tmp_path: Path, cluster: PostgresCluster, db: Path):
        self.cluster, self.db, self.work = cluster, db, tmp_path / "work"
        self.work.mkdir()
        self.homes = {name: tmp_path / "home" / name for name in ("postgres", "amdflash", "reviewer")}
        for home in self.homes.values():
            home.mkdir(parents=True)
        self.socket = str(cluster.socket_dir)
        self.run_id = ""
        self.serving: list[tuple[subprocess.Popen, int]] = []
        self.outputs: list[tuple[str, command_line.Result]] = []

    def url(self, text: str) -> str:
        """`postgresql:///amdflash` (the administrator, by the socket) and
        `postgresql://LOGIN@central/amdflash` (over the network) to this cluster's socket."""
        text = text.replace("postgresql:///amdflash", f"postgresql://{SUPERUSER}@/amdflash?host={self.socket}&port={PORT}")
        return re.sub(r"postgresql://(\w+)@central/amdflash",
                      rf"postgresql://\1@/amdflash?host={self.socket}&port={PORT}", text)

    def amdflash(self, account: str, words: list[str]) -> command_line.Result:
        words = [self.url(w).replace("/var/lib/amdflash/audit.sqlite", str(self.db)) for w in words]
        words = [re.sub(r"(^|/)RUN$", rf"\g<1>{self.run_id}", w) for w in words]
        env = {"HOME": str(self.homes[account]), "PGPASSFILE": None, "PGPASSWORD": None, "AMDFLASH_CENTRAL": None}
        done = command_line.run("-q", *words, env=env, cwd=self.work)
        self.outputs.append((" ".join(words), done))
        assert done.code == 0, f"amdflash {' '.join(words)}: exit {done.code}\n{done.err}"
        return done

    def step(self, line: str) -> str:
        """Run one README line; what was done, for the failure message of a later step."""
        for marker, reason in SKIPPED.items():
            if marker in line:
                return f"skipped ({reason})"
        line = without_options(line)
        if re.fullmatch(HBA_LINE, line):
            _kind, database, user, _network, method = re.search(r"'(.*?)'", line).group(1).split()
            self.allow_local(database, user, method)
            return "pg_hba.conf: the same line for the socket"
        if m := re.fullmatch(r"sudo -u postgres createdb (\w+)", line):
            self.cluster.psql(f"CREATE DATABASE {m.group(1)}")
            return "createdb"
        if m := re.fullmatch(r"sudo -u postgres psql (\w+) -c \"(.*)\"", line):
            sql = m.group(2).replace("'…'", f"'{PASSWORD}'")
            psql(self.cluster.dsn.replace("/postgres?", f"/{m.group(1)}?"), sql)
            return "psql"
        if m := re.fullmatch(r"echo '([^']*)' \| sudo -u (\w+) tee ~(\w+)/\.pgpass >/dev/null", line):
            entry = self.pgpass_entry(m.group(1))
            path = self.homes[m.group(3)] / ".pgpass"
            path.write_text(entry + "\n")
            path.chmod(0o644)              # as tee makes it: the next line of the README makes it 0600
            return ".pgpass written"
        if m := re.fullmatch(r"echo '([^']*)' >> ~/\.pgpass && chmod 0600 ~/\.pgpass", line):
            entry = self.pgpass_entry(m.group(1))
            with open(self.homes["reviewer"] / ".pgpass", "a") as f:      # a reviewer's own (no sudo)
                f.write(entry + "\n")
            (self.homes["reviewer"] / ".pgpass").chmod(0o600)
            return "the reviewer's .pgpass"
        if m := re.fullmatch(r"sudo chmod 0600 ~(\w+)/\.pgpass", line):
            (self.homes[m.group(1)] / ".pgpass").chmod(0o600)
            return "chmod"
        if m := re.fullmatch(r"install -D -m 0600 /dev/null ~/(\S+)", line):
            path = self.homes["reviewer"] / m.group(1)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch(mode=0o600)
            return "made, 0600"
        words = shlex.split(line)
        account = "reviewer"
        if words[:2] == ["sudo", "-u"]:
            account, words = words[2], words[3:]
        # The shell's ~ and ~ACCOUNT.
        words = [re.sub(r"^~(\w*)/", lambda m: f"{self.homes[m.group(1) or account]}/", w) for w in words]
        if words[:3] == ["amdflash", "fleet", "serve"]:
            self.serve(account, words[1:])
            return "serving"
        if words[:1] == ["amdflash"]:
            self.amdflash(account, words[1:])
            return "amdflash"
        raise AssertionError(f"the README's central set-up has a line this test does not know: {line!r}")

    def pgpass_entry(self, written: str) -> str:
        """The README's .pgpass line for this cluster: `central` is its socket directory."""
        return written.replace("central", self.socket.replace(":", r"\:"), 1).replace("…", PASSWORD)

    def serve(self, account: str, words: list[str]) -> None:
        """`fleet serve` as a process of its own, on a free port (tests run side by side: the
        README's default 8470 could be taken), until the test ends."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        argv = [sys.executable, "-m", "amdflash", *[self.url(w) for w in words], "--listen", f"127.0.0.1:{port}"]
        env = {k: v for k, v in os.environ.items() if k not in ("PGPASSFILE", "PGPASSWORD", "AMDFLASH_CENTRAL")}
        env["HOME"] = str(self.homes[account])
        log = open(self.work / "serve.log", "wb")
        self.serving.append((subprocess.Popen(argv, env=env, cwd=self.work, stdout=log, stderr=log), port))
        log.close()

    def page(self, path: str, timeout: float = 60) -> str:
        """A page of the running `fleet serve`, once it answers."""
        proc, port = self.serving[-1]
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
                    return response.read().decode()
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"fleet serve (exit {proc.poll()}): "
                                         f"{(self.work / 'serve.log').read_text()}") from None
                time.sleep(0.2)

    def stop(self) -> None:
        for proc, _ in self.serving:
            proc.terminate()
            proc.wait(timeout=30)

    def allow_local(self, database: str, user: str, method: str) -> None:
        """pg_hba.conf: the administrator by trust (as `sudo -u postgres` is by peer on Debian),
        then the README's rule for everyone else, and nothing after it."""
        hba = self.cluster.data / "pg_hba.conf"
        hba.write_text(f"local all {SUPERUSER} trust\nlocal {database} {user} {method}\n")
        self.cluster.psql("SELECT pg_reload_conf()")


@pytest.fixture
def cluster(postgres_binaries: Path):
    cluster = PostgresCluster(postgres_binaries).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.mark.slow
def test_the_readme_sets_up_the_central_record_as_written(tmp_path, cluster, db, make_board, image, cli) -> None:
    if psql(cluster.dsn, "SELECT count(*) FROM pg_available_extensions WHERE name = 'plpython3u'") == "0":
        pytest.skip("the PostgreSQL server has no PL/Python (Debian: apt-get install postgresql-plpython3-NN "
                    "python3-cryptography; .ci/run does)")
    line = Line(tmp_path, cluster, db)
    # The host's line work before the block: a flash recorded in its trail by its account.
    board = make_board(transport="ideal")
    home = {"HOME": str(line.homes["amdflash"])}
    assert cli("flash", image, "--yes", "--sector-count", "16", "--board", f"sim:{board}", env=home).code == 0
    line.run_id = json.loads(cli("runs", "--format", "json", env=home).out)[-1]["run_id"]
    done = []
    for step in readme_block("fleet central-setup"):
        try:
            done.append(f"{line.step(step)}: {step}")
        except AssertionError as e:
            raise AssertionError(f"{e}\nafter:\n" + "\n".join(done)) from None

    # Every step ran, and the way it says: passwords were asked for and found where the README
    # put them (the administrator alone is trusted), the run is in the central record, and the
    # trail still holds what central holds.
    assert sum(d.startswith("amdflash") for d in done) == 7, done
    central = cluster.dsn.replace("/postgres?", "/amdflash?")
    assert psql(central, "SELECT name || ' ' || login FROM amdflash.hosts") == "hosta hosta"
    assert psql(central, f"SELECT h.name FROM amdflash.runs r JOIN amdflash.hosts h ON h.id = r.host_id "
                         f"WHERE r.run_id = '{line.run_id}'") == "hosta"
    said = {name: next(r for c, r in line.outputs if f" {name} " in f" {c} ")
            for name in ("fleet runs", "fleet report", "audit push", "audit verify")}
    assert line.run_id in said["fleet runs"].out and "hosta" in said["fleet runs"].out
    assert line.run_id in said["fleet report"].out
    assert said["audit push"].code == said["audit verify"].code == 0
    # Without the password file the README writes, the host's login is refused: the file did it.
    (line.homes["amdflash"] / ".pgpass").unlink()
    refused = command_line.run("-q", "--db", db, "audit", "push", "--to",
                               line.url("postgresql://hosta@central/amdflash"),
                               env={"HOME": str(line.homes["amdflash"]), "PGPASSFILE": None, "PGPASSWORD": None})
    assert refused.code != 0 and "password" in refused.err, refused

    # The line view's block: its login, its password where libpq looks, an empty notification
    # list made private first, and the view itself, which shows the run from the record.
    try:
        for step in readme_block("fleet serve --from"):
            done.append(f"{line.step(step)}: {step}")
        assert sum(d.startswith("serving") for d in done) == 1, done
        assert line.run_id in line.page("/history")
        assert "amdflash_runs" in line.page("/metrics")
    finally:
        line.stop()
