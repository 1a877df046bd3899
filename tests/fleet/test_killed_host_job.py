"""The host-side job (`amdflash fleet job`) itself killed mid-flash (issue 27 item 4): its top
process alone, or its whole process group. The boards' flashes must not go on unobserved,
and the client must call their runs interrupted, by run id — not "lost" — since the host
was reachable all along."""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.fleet.conftest import flash_of, job_processes
from tests.fleet.lab import FleetOutcome, Lab, wait_for
from tests.fleet.test_line import _wait_mid_flash, host_runs, place_of, two_hosts

pytestmark = pytest.mark.slow


def _argv(pid: int) -> list[str]:
    try:
        return [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return []


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def host_job(board: Path) -> int:
    """Pid of the `amdflash fleet job` process working on `board`: of the processes with its
    command line (it, the boards' jobs it forks, their audit writers), the one whose parent is
    none of them."""
    found = {int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
             and f"sim:{board}" in (argv := _argv(int(p.name))) and "fleet" in argv and "job" in argv}
    tops = [pid for pid in found if _parent(pid) not in found]
    assert len(tops) == 1, (found, tops)
    return tops[0]


def test_a_killed_host_job_stops_its_runs_and_is_reported_interrupted_by_run_id(lab: Lab, fleet_image: Path) -> None:
    places = two_hosts(lab, 1, realtime=0.25)
    boards = {host: lab.hosts[host].boards[0] for host in ("hosta", "hostb")}
    running = lab.fleet_popen("flash", str(fleet_image), "--where", "line=a", "--yes")
    for board in boards.values():
        _wait_mid_flash(board)
    top_a, top_b = host_job(boards["hosta"]), host_job(boards["hostb"])
    assert os.getpgid(top_b) == top_b            # a process group of its own
    os.kill(top_a, signal.SIGKILL)               # hosta: the job's top process only
    os.killpg(top_b, signal.SIGKILL)             # hostb: the whole job
    out, err = running.communicate(timeout=300)
    first = FleetOutcome.parse(running.returncode, out, err)
    assert first.code == 130, first.boards

    for host, board in boards.items():
        row = first.boards[place_of(places, board)]
        assert row["status"] == "interrupted" and row["run_id"], row
        assert f"the fleet job on {host} ended without reporting" in row["error"] and row["run_id"] in row["error"]
        # Nothing goes on writing the board unobserved: its job stopped (hosta: at a safe point).
        wait_for(lambda b=board: not job_processes(b), 60, f"{host}'s flash to stop")
        recorded = {r["run_id"]: r for r in host_runs(lab, host)}
        assert recorded[row["run_id"]]["status"] == "interrupted"
        assert flash_of(board) != fleet_image.read_bytes()



def test_a_job_that_goes_on_after_its_connection_dropped_is_lost_not_interrupted(lab: Lab, fleet_image: Path) -> None:
    """The other side of it: the connection to hosta drops (its ssh client dies), the job goes
    on there. That is "lost" — the client cannot know how it ends — naming the run it began,
    which the host's trail then records as finished."""
    places = two_hosts(lab, 1, realtime=0.25)
    board = lab.hosts["hosta"].boards[0]
    running = lab.fleet_popen("flash", str(fleet_image), "--where", "line=a", "--yes")
    _wait_mid_flash(board)
    ssh = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
           and (argv := _argv(int(p.name))) and Path(argv[0]).name == "ssh" and f"sim:{board}" in argv[-1]]
    assert len(ssh) == 1, ssh
    os.kill(ssh[0], signal.SIGKILL)
    out, err = running.communicate(timeout=300)
    row = FleetOutcome.parse(running.returncode, out, err).boards[place_of(places, board)]
    assert row["status"] == "lost" and row["run_id"], row
    assert "lost contact with hosta: the job may have gone on there" in row["error"]
    wait_for(lambda: not job_processes(board), 120, "the job to end on hosta")
    assert {r["run_id"]: r for r in host_runs(lab, "hosta")}[row["run_id"]]["status"] != "running"
