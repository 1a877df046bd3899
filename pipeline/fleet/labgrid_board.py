"""labgrid classes for our boards: the `AmdflashBoard` resource and the `AmdflashDriver`.

A board is published by its host's exporter as a `NetworkAmdflashBoard`: the host that
owns it (`host`, where labgrid reaches it over SSH), the board spec the `amdflash`
command line takes there (`usb:SERIAL`, `pci:ADDRESS`, `sim:PATH`), what identifies the
flash (chip, JEDEC id, unique ID, bridge serial, PCI address) and the host's audit
database. `AmdflashBoard` is the same for a board on the machine running labgrid itself,
with the `amdflash` command to run there (the operator's own environment file says it).

The driver never touches the board: it runs `amdflash fleet job` on the board's host and
reads the JSON lines that job prints. For a network board everything published about it
came through labgrid's coordinator, which anyone can talk to (pipeline/fleet/trust.py): the
driver uses the board only if its host is in the operator's allowlist and its attributes
have their expected form, runs its own command (`host_command`, else this amdflash) over
SSH with strict host-key checking, and never one a resource names. Images reach the host
the labgrid way (`ManagedFile`: copied into labgrid's cache on the host unless the host
already sees the same file, over labgrid's own SSH connection, which checks host keys
strictly too).

Importing this module registers the classes with labgrid's target factory; a labgrid
environment file names it under `imports:`.
"""
from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path
from typing import Any
from collections.abc import Sequence

import attr
from labgrid.driver.common import Driver
from labgrid.factory import target_factory
from labgrid.protocol import BootstrapProtocol
from labgrid.resource.common import NetworkResource, Resource
from labgrid.step import step
from labgrid.util.managedfile import ManagedFile

from amdflash.pipeline.fleet.attributes import BOARD_ATTRIBUTES

_str = attr.validators.instance_of(str)
_opt_str = attr.validators.optional(_str)
_opt_bool = attr.validators.optional(attr.validators.instance_of(bool))


@attr.s(eq=False, kw_only=True)
class _BoardAttributes:
    """The board attributes (`attributes.BOARD_ATTRIBUTES`), shared by the local and the network resource."""

    spec = attr.ib(default="", validator=_str)
    kind = attr.ib(default=None, validator=_opt_str)
    chip = attr.ib(default=None, validator=_opt_str)
    jedec = attr.ib(default=None, validator=_opt_str)
    unique_id = attr.ib(default=None, validator=_opt_str)
    bridge_serial = attr.ib(default=None, validator=_opt_str)
    pci_address = attr.ib(default=None, validator=_opt_str)
    emulated = attr.ib(default=None, validator=_opt_bool)
    db = attr.ib(default=None, validator=_opt_str)


@target_factory.reg_resource
@attr.s(eq=False)
class AmdflashBoard(Resource, _BoardAttributes):
    """A board attached to the machine that runs labgrid (`command`: amdflash there)."""

    command = attr.ib(default="amdflash", validator=_str, kw_only=True)


@target_factory.reg_resource
@attr.s(eq=False)
class NetworkAmdflashBoard(NetworkResource, _BoardAttributes):
    """A board attached to an exporter host (`host`), reached over SSH. It names no command."""


class JobError(RuntimeError):
    """The job on the board's host could not be started or said nothing we understand."""


def host_job_argv(command: Sequence[str], board: Any, job: str, *args: str, also: Sequence[str] = (),
                  operator: str | None = None) -> list[str]:
    """The `amdflash fleet job` command line as run on the board's host (`command`: amdflash
    there; `also`: specs of more boards of that host, in the same database, run in the same
    process; `operator`: who says they run it, recorded as claimed beside the host's account)."""
    argv = [*command, "fleet", "job"]
    if operator:
        argv.append(f"--operator={operator}")     # one word: a name that begins with - stays a value
    if getattr(board, "host", None):
        argv += ["--host-name", board.host]     # the line's name for the host, for its messages
    for spec in (board.spec, *also):
        argv += ["--board", spec]
    if board.db:
        argv += ["--db", board.db]
    return [*argv, job, *args]


@target_factory.reg_driver
@attr.s(eq=False)
class AmdflashDriver(Driver, BootstrapProtocol):
    """Runs amdflash jobs for one board on the host that owns it.

    `load(image)` (labgrid's BootstrapProtocol) flashes the image, resuming the board's
    unfinished flash of the same image if there is one.
    """

    bindings = {"board": {"AmdflashBoard", "NetworkAmdflashBoard"}}
    #: amdflash on the boards' hosts (shell words); default: this amdflash (fleet_host_command in the config)
    host_command = attr.ib(default=None, validator=_opt_str)
    #: the hosts it may reach, HOST or HOST=DATABASE (default: fleet_hosts in the config)
    hosts = attr.ib(default=None, validator=attr.validators.optional(attr.validators.instance_of(list)))

    def on_activate(self) -> None:
        pass

    def on_deactivate(self) -> None:
        pass

    # -- pieces the fleet client uses to run jobs concurrently -----------------------------------

    @property
    def host(self) -> str:
        return getattr(self.board, "host", "localhost")

    @property
    def network(self) -> bool:
        return isinstance(self.board, NetworkAmdflashBoard)

    def _checked(self) -> None:
        """A network board is used only as trust.board_problem allows (its attributes came
        through the coordinator); a local one is the operator's own environment file."""
        if not self.network:
            return
        from amdflash.pipeline.fleet import trust

        allow = trust.Allowlist.parse(*self._hosts())
        args = {name: getattr(self.board, name) for name in BOARD_ATTRIBUTES if getattr(self.board, name) is not None}
        why = trust.board_problem(type(self.board).__name__, {**args, "host": self.board.host},
                                  getattr(self.board, "extra", None) or {}, allow)
        if why:
            raise JobError(f"board {self.board.spec} on {self.board.host} refused, nothing run: {why}")

    def _hosts(self) -> tuple[list[Any], str]:
        if self.hosts is not None:
            return self.hosts, "AmdflashDriver hosts"
        from amdflash.pipeline.fleet.settings import configured_hosts

        return configured_hosts()

    def _host_command(self) -> list[str]:
        if self.host_command:
            return shlex.split(self.host_command)
        from amdflash.pipeline.fleet.settings import host_command

        return host_command()

    def command(self, job: str, *args: str, also: Sequence[str] = (), operator: str | None = None) -> list[str]:
        """argv that runs `job` for this board (and the boards `also` names, of the same host and
        database) on its host: over strict SSH of its own for a network board."""
        if not self.network:
            return host_job_argv(shlex.split(self.board.command), self.board, job, *args, also=also,
                                 operator=operator)
        self._checked()
        from amdflash.pipeline.fleet.trust import ssh_argv

        return ssh_argv(self.board.host, host_job_argv(self._host_command(), self.board, job, *args, also=also,
                                                       operator=operator))

    def _on_host(self, argv: list[str]) -> list[str]:
        """A plain command (cat, rm) on the board's host."""
        if not self.network:
            return argv
        from amdflash.pipeline.fleet.trust import ssh_argv

        return ssh_argv(self.board.host, argv)

    def stage_image(self, image: str | Path) -> str:
        """Make the image available on the board's host; returns its path there."""
        self._checked()
        managed = ManagedFile(str(image), self.board)
        managed.sync_to_resource()
        return managed.get_remote_path()

    def fetch(self, remote_path: str, local_path: str | Path, overwrite: bool = True) -> None:
        """Copy a file the job left on the board's host (a dump) here, then remove it there.
        Without `overwrite` an existing file here is left as it was (OutputExists), and the
        copy on the host is kept."""
        from amdflash.stages.files import new_file

        # Written as every output is (stages/files.py): a fresh file renamed into place, so a link
        # planted at the name is replaced, never followed, and a failed copy leaves nothing.
        with new_file(Path(local_path), overwrite=overwrite) as out:
            done = subprocess.run(self._on_host(["cat", "--", remote_path]), stdout=out,
                                  stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, check=False)
            if done.returncode != 0:
                raise JobError(f"cannot copy {remote_path} from {self.host}: "
                               f"{done.stderr.decode(errors='replace').strip()}")
        subprocess.run(self._on_host(["rm", "-f", "--", remote_path]), stdin=subprocess.DEVNULL,
                       capture_output=True, check=False)

    # -- blocking jobs, for labgrid environments and strategies ----------------------------------

    def _run(self, job: str, *args: str) -> dict[str, Any]:
        done = subprocess.run(self.command(job, *args), stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, check=False)
        results = parse_results(done.stdout, done.stderr, done.returncode)
        return next(iter(results.values()))

    @Driver.check_active
    @step(args=["filename"])
    def load(self, filename: str | None = None) -> dict[str, Any]:
        if filename is None:
            raise ValueError("AmdflashDriver.load needs an image file")
        return self.flash(filename)

    @Driver.check_active
    @step(args=["image"])
    def flash(self, image: str | Path) -> dict[str, Any]:
        return self._run("flash", self.stage_image(image))

    @Driver.check_active
    @step(args=["image"])
    def verify(self, image: str | Path) -> dict[str, Any]:
        return self._run("verify", self.stage_image(image))

    @Driver.check_active
    @step()
    def info(self) -> dict[str, Any]:
        return self._run("info")

    @Driver.check_active
    @step(args=["output"])
    def dump(self, output: str | Path) -> dict[str, Any]:
        result = self._run("dump")
        if result.get("status") == "succeeded" and result.get("output"):
            self.fetch(result["output"], output)
            result["output"] = str(output)
        return result


def started(stdout: str) -> bool:
    """Whether the job on the host began (its first line says so before anything else)."""
    first = stdout.lstrip().split("\n", 1)[0]
    return first.startswith("{") and '"started"' in first


def parse_results(stdout: str, stderr: str, returncode: int) -> dict[str, dict[str, Any]]:
    """The job's results, by board spec: its JSON lines that carry a status."""
    results: dict[str, dict[str, Any]] = {}
    for line in stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                result = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "status" in result and "board" in result:
                results[result["board"]] = result
    if not results:
        tail = (stderr.strip().splitlines() or [""])[-1]
        raise JobError(f"the job printed no result (exit status {returncode}){': ' + tail if tail else ''}")
    return results
