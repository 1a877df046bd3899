"""One status for a run, decided in one place and shown the same by every view: `running` only
while the process that recorded the run lives (store.status)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from amdflash.store.status import run_status, this_process
from tests.support import cli


def amdflash(*args: object, check: bool = False) -> cli.Result:
    done = cli.run(*args)
    assert not check or done.returncode == 0, done.stderr
    return done


def amdflash_killed(*args: object) -> cli.Result:
    """A command whose host the emulator kills (kill-after-writes): a process of its own."""
    return cli.run_process(*args)


def statuses() -> dict[str, str]:
    return {r["run_id"]: r["status"] for r in json.loads(amdflash("runs", "--json", check=True).stdout)}


def every_view(run_id: str, tmp_path: Path) -> dict[str, str]:
    """The run's status as runs, report (text, JSON, HTML) and replay show it."""
    text = amdflash("report", run_id, check=True).stdout
    html_file = tmp_path / f"{run_id}.html"
    amdflash("report", run_id, "--format", "html", "-o", html_file, "--overwrite", check=True)
    html = html_file.read_text()
    replayed = json.loads(amdflash("replay", run_id, "--format", "json").stdout)
    return {
        "runs": statuses()[run_id],
        "report": json.loads(amdflash("report", run_id, "--json", check=True).stdout)["status"],
        # run  ID  (command, status[; what a --force overrode])
        "text": text.splitlines()[0].split("(", 1)[1].split(", ")[1].split(")")[0].split(";")[0],
        "html": html.split('data-field="status-badge">', 1)[1].split("<", 1)[0],
        "replay": replayed["status"],
    }


@pytest.mark.slow   # a long scenario: CI runs it (pytest -m slow)
def test_a_killed_run_is_interrupted_at_once_everywhere(make_board, image, db, tmp_path):
    board = make_board(content="blank", transport="ideal", faults=["kill-after-writes=30000"])
    killed = amdflash_killed("-q", "flash", image, "--yes", "--force", "--board", f"sim:{board}")
    assert killed.returncode < 0 or killed.returncode == 137 or killed.returncode != 0
    [(run_id, status)] = statuses().items()
    assert status == "interrupted"        # nobody resumed it yet: its process is gone, and that is checked
    assert set(every_view(run_id, tmp_path).values()) == {"interrupted"}


def test_a_run_whose_process_lives_is_running_until_it_is_killed(make_board, image, db):
    board = make_board(content="blank", transport="asm24", realtime_scale=1.0)
    proc = subprocess.Popen([sys.executable, "-m", "amdflash", "-q", "flash", str(image), "--yes", "--force",
                             "--board", f"sim:{board}"], env=dict(os.environ),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        seen: dict[str, str] = {}
        while time.monotonic() < deadline and not seen:
            time.sleep(0.5)
            if Path(db).exists():
                listed = amdflash("runs", "--json")
                seen = {r["run_id"]: r["status"] for r in json.loads(listed.stdout)} if listed.returncode == 0 else {}
        assert list(seen.values()) == ["running"], seen
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert list(statuses().values()) == ["interrupted"]


@pytest.mark.slow   # a long scenario: CI runs it (pytest -m slow)
def test_a_run_resumed_twice_has_one_status_in_every_view(make_board, image, db, tmp_path):
    board = make_board(content="blank", transport="ideal", faults=["kill-after-writes=20000"])
    amdflash_killed("-q", "flash", image, "--yes", "--force", "--board", f"sim:{board}")
    amdflash("sim", "fault", board, "kill-after-writes=20000", check=True)     # the first resume dies too
    amdflash_killed("-q", "resume", "--yes", "--board", f"sim:{board}")
    amdflash("sim", "fault", board, "--clear", check=True)
    amdflash("-q", "resume", "--yes", "--board", f"sim:{board}", check=True)
    first, second, third = statuses()
    assert statuses() == {first: "interrupted", second: "interrupted", third: "succeeded"}
    report = json.loads(amdflash("report", first, "--json", check=True).stdout)
    assert [(r["run_id"], r["status"]) for r in report["resumed_by"]] == [(second, "interrupted")]
    assert report["finished_by"] == third
    text = amdflash("report", first, check=True).stdout
    assert f"fixed by   {third}" in text, text
    assert f"{second} (interrupted)" in text and "(running)" not in text
    assert set(every_view(second, tmp_path).values()) == {"interrupted"}


def test_the_status_rule():
    me = this_process()
    assert run_status("succeeded", resumed=True, process=me) == "succeeded"
    assert run_status("running", resumed=False, process=me) == "running"           # this very process
    assert run_status(None, resumed=True, process=me) == "interrupted"
    gone = json.loads(me)
    gone["start_ticks"] += 1                  # same pid, another process (the pid was reused)
    assert run_status("running", resumed=False, process=json.dumps(gone)) == "interrupted"
    elsewhere = {**json.loads(me), "boot_id": "another-machine"}
    assert run_status("running", resumed=False, process=json.dumps(elsewhere), run_machine="other") == "running"
