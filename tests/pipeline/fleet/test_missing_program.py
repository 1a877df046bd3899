"""A fleet job that cannot be prepared because this machine lacks a program (labgrid copies the
image to its host with rsync) is not an unreachable host: its row says what to install here, and
its next step is to install it, then the same fleet command (a line brought up from the README:
with rsync missing, both boards read `unreachable` and `check that hosta answers`)."""
from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from types import SimpleNamespace

from amdflash.pipeline.fleet.coordinator import BoardPlace
from amdflash.pipeline.fleet.run import FleetRun, Row, _Batch, _Job


def _job(place: str) -> _Job:
    board = BoardPlace(place, "hosta", "sim-1", "NetworkAmdflashBoard", "NetworkAmdflashBoard",
                       {"host": "hosta", "spec": "sim:/var/lib/amdflash/boards/b1", "kind": "sim"}, {})
    return _Job(board, "token", Row(place, "hosta", spec=board.args["spec"]))


def _prepare_fails(monkeypatch, tmp_path: Path, exc_from) -> list[Row]:
    fleet = FleetRun("127.0.0.1:20408", {"line": "a"}, "flash", image=Path("/srv/images/new.bin"))
    monkeypatch.setattr(FleetRun, "_command", lambda self, batch: exc_from())
    batch = _Batch([_job("hosta-b1"), _job("hosta-b2")])
    asyncio.run(fleet._run_batch(SimpleNamespace(lost=True), batch))
    for job in batch.jobs:
        job.row.next_step = fleet._next_step(job.row, job.board)
    return [job.row for job in batch.jobs]


def test_rsync_missing_here_is_said_as_such_with_the_install_as_next_step(monkeypatch, tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))      # no rsync: as subprocess (labgrid) fails to start it
    rows = _prepare_fails(monkeypatch, tmp_path, lambda: subprocess.run(["rsync", "--version"], check=False))
    for row in rows:
        assert row.status == "refused", row
        assert "nothing ran on hosta: rsync is not installed on this machine" in row.error
        assert row.next_step == ("install rsync on this machine (Debian: apt-get install rsync), then amdflash "
                                 f"fleet flash /srv/images/new.bin --where name={row.board} --yes")


def test_another_failure_to_prepare_still_reads_unreachable(monkeypatch, tmp_path: Path) -> None:
    def refused() -> None:
        raise OSError("ssh: connect to host hosta port 22: Connection refused")

    for row in _prepare_fails(monkeypatch, tmp_path, refused):
        assert row.status == "unreachable" and "Connection refused" in row.error
        assert row.next_step.startswith("check that hosta answers: ssh hosta true; then amdflash fleet flash")
