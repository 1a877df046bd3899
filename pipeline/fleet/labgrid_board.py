"""labgrid classes for our boards: the `AmdflashBoard` resource and the `AmdflashDriver`.

A board is published by its host's exporter as a `NetworkAmdflashBoard`: the host that
owns it (`host`, where labgrid reaches it over SSH), the board spec the `amdflash`
command line takes there (`usb:SERIAL`, `pci:ADDRESS`, `sim:PATH`), what identifies the
flash (chip, JEDEC id, unique ID, bridge serial, PCI address), the host's audit database
and the `amdflash` command on that host. `AmdflashBoard` is the same for a board on the
machine running labgrid itself.

The driver never touches the board: it runs `amdflash fleet job` on the board's host —
through the resource's `wrap_command`, which for a network resource is labgrid's SSH
connection to the exporter host — and reads the one JSON line that job prints. Images
reach the host the labgrid way too (`ManagedFile`: copied into labgrid's cache on the host
unless the host already sees the same file).

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
    command = attr.ib(default="amdflash", validator=_str)


@target_factory.reg_resource
@attr.s(eq=False)
class AmdflashBoard(Resource, _BoardAttributes):
    """A board attached to the machine that runs labgrid."""


@target_factory.reg_resource
@attr.s(eq=False)
class NetworkAmdflashBoard(NetworkResource, _BoardAttributes):
    """A board attached to an exporter host (`host`), reached over SSH."""


class JobError(RuntimeError):
    """The job on the board's host could not be started or said nothing we understand."""


def host_job_argv(board: Any, job: str, *args: str, also: Sequence[str] = ()) -> list[str]:
    """The `amdflash fleet job` command line as run on the board's host (`also`: specs of more
    boards of that host, in the same database, run in the same process)."""
    argv = [*shlex.split(board.command), "fleet", "job"]
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

    def on_activate(self) -> None:
        pass

    def on_deactivate(self) -> None:
        pass

    # -- pieces the fleet client uses to run jobs concurrently -----------------------------------

    @property
    def host(self) -> str:
        return getattr(self.board, "host", "localhost")

    def command(self, job: str, *args: str, also: Sequence[str] = ()) -> list[str]:
        """argv that runs `job` for this board (and the boards `also` names, of the same host and
        database) on its host: through SSH for a network board."""
        return self.board.wrap_command(host_job_argv(self.board, job, *args, also=also))

    def stage_image(self, image: str | Path) -> str:
        """Make the image available on the board's host; returns its path there."""
        managed = ManagedFile(str(image), self.board)
        managed.sync_to_resource()
        return managed.get_remote_path()

    def fetch(self, remote_path: str, local_path: str | Path) -> None:
        """Copy a file the job left on the board's host (a dump) here, then remove it there."""
        with open(local_path, "wb") as out:
            done = subprocess.run(self.board.wrap_command(["cat", remote_path]), stdout=out,
                                  stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, check=False)
        if done.returncode != 0:
            raise JobError(f"cannot copy {remote_path} from {self.host}: "
                           f"{done.stderr.decode(errors='replace').strip()}")
        subprocess.run(self.board.wrap_command(["rm", "-f", remote_path]), stdin=subprocess.DEVNULL,
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
