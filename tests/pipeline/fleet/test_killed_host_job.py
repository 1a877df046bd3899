"""The host-side job (`amdflash fleet job`) itself killed mid-flash (issue 27 item 4): its top
process alone, or its whole process group. The boards' flashes must not go on unobserved,
and the client must call their runs interrupted, by run id — not "lost" — since the host
was reachable all along."""
from __future__ import annotations

import os
import re
import signal
import sqlite3
from pathlib import Path

import pytest

from tests.pipeline.fleet.conftest import flash_of, job_processes
from tests.pipeline.fleet.lab import FleetOutcome, Lab, wait_for
from tests.pipeline.fleet.test_line import _wait_mid_flash, host_runs, place_of, two_hosts

pytestmark = pytest.mark.slow


def _wait_writing(db: Path) -> None:
    """Until the host's flash has erased or programmed a unit: a flash killed before (in its
    backup) changed nothing, and is not unfinished (issue 40 item 6)."""
    def writing() -> bool:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            return con.execute("SELECT 1 FROM units WHERE state IN ('erased', 'programmed') LIMIT 1").fetchone() \
                is not None
        except sqlite3.OperationalError:         # not there yet
            return False
        finally:
            con.close()
    wait_for(writing, 120, "the flash to write a unit", interval=0.05)


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
        # Its next step is the fleet flash that resumes it, for that place alone (with the
        # line's config file, which $AMDFLASH_CONFIG names here).
        assert row["next_step"].startswith(f"amdflash --config {lab.config} fleet flash {fleet_image} --where name=")

    # The next fleet flash of the same image resumes each interrupted run, to the exact image.
    second = lab.fleet("flash", str(fleet_image), "--where", "line=a", "--yes")
    assert second.code == 0, second.boards
    for board in boards.values():
        again = second.boards[place_of(places, board)]
        assert again["job"] == "resume" and again["resumes"] == first.boards[place_of(places, board)]["run_id"]
        assert again["status"] == "succeeded", again
        assert flash_of(board) == fleet_image.read_bytes()


def test_an_unfinished_flash_of_another_image_is_refused_with_its_next_step_until_start_over(
        lab: Lab, fleet_image: Path, tmp_path: Path) -> None:
    """A board whose unfinished flash the fleet cannot resume (it was of another image): the
    host's flash refuses it (exit 2, nothing written), and the fleet reports it refused with
    the host CLI's reason and next steps — not as failed or lost. --start-over is passed on."""
    from amdflash.stages.sim.synth import synthetic_ifwi

    lab.add_host("hosta", 1, seed=100, realtime=0.25)
    lab.start_exporter("hosta")
    place = lab.make_places("line=c")[0]["place"]
    board = lab.hosts["hosta"].boards[0]
    running = lab.fleet_popen("flash", str(fleet_image), "--where", "line=c", "--yes")
    _wait_mid_flash(board)
    _wait_writing(lab.hosts["hosta"].db)
    os.kill(job_processes(board)[0], signal.SIGKILL)
    killed = FleetOutcome.parse(running.returncode, *running.communicate(timeout=300))
    assert killed.statuses() == {place: "interrupted"}, killed.boards

    other = tmp_path / "other.bin"
    other.write_bytes(synthetic_ifwi(777))
    half = flash_of(board)
    refused = lab.fleet("flash", str(other), "--where", "line=c", "--yes")
    row = refused.boards[place]
    assert refused.code == 2 and row["status"] == "refused", row
    assert killed.boards[place]["run_id"] in row["error"] and "--start-over" in row["error"], row["error"]
    assert f"amdflash --config {lab.config} fleet flash {other} --where name={place} --yes --start-over" \
        in row["next_step"], row
    assert flash_of(board) == half                       # nothing was written

    done = lab.fleet("flash", str(other), "--where", "line=c", "--yes", "--start-over")
    assert done.statuses() == {place: "succeeded"} and done.code == 0, done.boards
    assert done.boards[place]["job"] == "flash"
    assert flash_of(board) == other.read_bytes()
    # Off a terminal the client said the board's progress on stderr while it ran (item 9).
    assert re.search(rf"^{re.escape(place)} \(hosta\): (backup|erase|program|verify) [0-9.]+ [KM]iB/2\.00 MiB",
                     done.stderr, re.M), done.stderr



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
