"""Issue 27 items 5 and 6, central side: the central record tells a run's end as the host's
own trail does. A flash killed while it writes and then finished by a resume is pushed, and
`fleet report HOST/RUN` and `fleet runs` must say what `report` and `runs` say on the host:
the same status, the same fixed-by, both runs verifying, and for the run left unfinished the
board's state, its backup and the next step (to be run on that host)."""
from __future__ import annotations

import html
import json
import re
import shlex

import pytest

from tests.pipeline.cli import test_original_across_runs as across
from tests.pipeline.fleet import test_central
from tests.pipeline.fleet.test_central import enroll, push

pytest.importorskip("psycopg", reason="psycopg is not installed (pip install '.[test]' brings it)")

killed = across.killed        # a board whose flash was killed while writing units (its run, its backup)
central = test_central.central    # a fresh central database, set up


@pytest.mark.slow
def test_a_killed_then_resumed_flash_reads_the_same_centrally_as_locally(cli, db, central, killed, tmp_path):
    board, run = killed["board"], killed["run"]
    enroll(cli, central, tmp_path)
    assert push(cli, central)[0].code == 0

    # Before the resume: the next step (on the host), the board's state and the backup.
    here = json.loads(cli("report", run, "--format", "json").out)
    there = json.loads(cli("fleet", "report", f"hosta/{run}", "--from", central, "--format", "json").out)
    assert there["status"] == here["status"] == "interrupted"
    assert there["outcome"]["state"] == here["outcome"]["state"] and "erased" in there["outcome"]["state"]
    # The same backup. Its put-back command names this host's trail (--db) here only: the record
    # does not keep the host's paths (its next step says to add them, below).
    put_back = shlex.split(here["outcome"]["backup"]["put_back"])
    assert put_back[1:3] == ["--db", str(db)], put_back
    assert there["outcome"]["backup"] == {**here["outcome"]["backup"],
                                          "put_back": shlex.join([put_back[0], *put_back[3:]])}
    assert there["outcome"]["backup"]["path"] == str(killed["backup"])
    step = here["outcome"]["next_step"]
    assert there["outcome"]["next_step"].startswith("on hosta")
    assert f"amdflash resume --board sim:{board} --yes -- {run}" in there["outcome"]["next_step"]
    assert step.split("To finish the flash: ")[0] in there["outcome"]["next_step"]
    text = cli("fleet", "report", f"hosta/{run}", "--from", central).out
    [listed] = [r for r in json.loads(cli("fleet", "runs", "--from", central, "--format", "json").out)
                if r["run_id"] == run]
    assert listed["status"] == "interrupted" and listed["fixed_by"] is None     # as report says it
    page = tmp_path / "there.html"
    assert cli("fleet", "report", f"hosta/{run}", "--from", central, "--format", "html", "-o", page).code == 0
    # The page wraps a command only between words (each word its own element): read as text.
    assert "on hosta: the flash is partly written" in html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))
    assert "next       on hosta" in text and f"backup     backup of the board's original content: " \
                                               f"{killed['backup']}" in text, text

    # The step as the central report says it, pasted on the host, finishes the flash.
    pasted = there["outcome"]["next_step"].split("To finish the flash: ")[1].split(" (run there")[0].split("; ")[0]
    assert shlex.split(pasted) == ["amdflash", "resume", "--board", f"sim:{board}", "--yes", "--", run]
    done = across.run_printed(cli, pasted)
    assert done.code == 0, done.err
    fix = json.loads(cli("runs", "--format", "json").out)[-1]["run_id"]
    assert push(cli, central)[0].code == 0

    # The same story: status, fixed-by, both runs verify, no next step left.
    here = json.loads(cli("report", run, "--format", "json").out)
    there = json.loads(cli("fleet", "report", f"hosta/{run}", "--from", central, "--format", "json").out)
    assert here["fixed_by"] == fix
    for key in ("status", "fixed_by", "finished_by", "resumed_by"):
        assert there[key] == here[key], key
    assert there["resumed_by"] == [{"run_id": fix, "status": "succeeded", "verified": True}]
    assert there["outcome"]["next_step"] is None and there["outcome"]["fixed_by"] == fix
    assert there["chain"]["ok"] and here["chain"]["ok"]
    resume = json.loads(cli("fleet", "report", f"hosta/{fix}", "--from", central, "--format", "json").out)
    assert resume["status"] == "succeeded" and resume["chain"]["ok"] and resume["resumes_run_id"] == run
    text = cli("fleet", "report", f"hosta/{run}", "--from", central).out
    assert f"fixed by   {fix}" in text and "does not verify" not in text, text

    # fleet runs: the same rows as runs (host added), interrupted (fixed by …), and its filters.
    local = json.loads(cli("runs", "--format", "json").out)
    remote = json.loads(cli("fleet", "runs", "--from", central, "--format", "json").out)
    assert [r.pop("host") for r in remote] == ["hosta"] * len(local)
    for r in remote:
        r.pop("witnessed")      # the central record's word on the host's witnesses: no local field
    assert remote == local
    lines = cli("fleet", "runs", "--from", central, "--status", "interrupted").out.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{'hosta':16} {run}"), lines
    assert f"interrupted (fixed by {fix})" in lines[0]
    assert lines == [f"{'hosta':16} {line}" for line in cli("runs", "--status", "interrupted").out.splitlines()]
    resumes = cli("fleet", "runs", "--from", central, "--command", "resume", "--format", "json").out
    assert [r["run_id"] for r in json.loads(resumes)] == [fix]


def test_a_killed_never_resumed_flash_reads_as_its_host_says_from_another_machine(cli, db, central, killed, tmp_path,
                                                                                  monkeypatch):
    """Issue 27 item 5: read on another machine, a killed run that nothing resumed is `running`
    only while its process may be alive. Its host's follow service, which sees the host's /proc,
    says it interrupted; fleet runs then reads it interrupted, as runs does on the host."""
    from amdflash.pipeline.fleet.live import Follower
    from amdflash.store import central as record
    from amdflash.store import status

    run = killed["run"]
    enroll(cli, central, tmp_path)
    assert push(cli, central)[0].code == 0
    [local] = [r for r in json.loads(cli("runs", "--format", "json").out) if r["run_id"] == run]
    assert local["status"] == "interrupted"

    def elsewhere() -> tuple[str, dict]:    # fleet runs and fleet report as read on another machine
        with monkeypatch.context() as m:
            m.setattr(status, "machine_id", lambda: "another-machine")
            (tmp_path / "boot_id").write_text("another-boot\n")
            m.setattr(status, "BOOT_ID", tmp_path / "boot_id")
            [row] = [r for r in record.runs(central) if r["run_id"] == run]
            there = json.loads(cli("fleet", "report", f"hosta/{run}", "--from", central, "--format", "json").out)
            return str(row["status"]), there

    listed, there = elsewhere()
    assert listed == there["status"] == "running"   # nothing in the record says its process is gone: it may run
    follower = Follower(str(db), central, push=False, log=lambda line: None)
    for _ in range(2):                             # the first tick finds the trail, the next sends what it saw
        follower.tick()
    follower.watch.close()
    follower.pg.close()
    listed, there = elsewhere()
    assert listed == there["status"] == "interrupted" == local["status"]
    here = json.loads(cli("report", run, "--format", "json").out)
    assert there["outcome"]["state"] == here["outcome"]["state"]
    assert there["outcome"]["next_step"].startswith("on hosta")


def test_read_elsewhere_a_run_whose_machine_booted_since_is_interrupted(tmp_path, monkeypatch):
    """store.status.run_status off the host: a later process its machine recorded under another
    boot id ends a run with no end (no process survives a boot); the same boot leaves it running."""
    from amdflash.store import status

    monkeypatch.setattr(status, "machine_id", lambda: "the-reader")
    (tmp_path / "boot_id").write_text("the-reader-boot\n")
    monkeypatch.setattr(status, "BOOT_ID", tmp_path / "boot_id")
    process = json.dumps({"pid": 4242, "start_ticks": 7, "boot_id": "boot-1"})
    assert status.run_status(None, False, process, "hostm") == "running"
    assert status.run_status(None, False, process, "hostm", machine_boot="boot-1") == "running"
    assert status.run_status(None, False, process, "hostm", machine_boot="boot-2") == "interrupted"
    assert status.run_status(None, False, process, "hostm", host_said="running") == "running"
    assert status.run_status("failed", False, process, "hostm", machine_boot="boot-2") == "failed"


def _unsealed_run(db, run_id: str, pid: int) -> None:
    """A run's first rows committed and never sealed, as a host that lost power leaves them (its
    writer gone with it): its runs row and the process row naming `pid` of this boot."""
    import os
    import sqlite3

    from amdflash.store.status import this_process

    con = sqlite3.connect(db)
    top = max(con.execute("SELECT seq FROM chain_head").fetchone()[0],
              *(con.execute(f"SELECT coalesce(max(seq), 0) FROM {t}").fetchone()[0] for t in ("runs", "stages")))
    detail = this_process() if pid == os.getpid() else json.dumps(
        {**json.loads(this_process()), "pid": pid, "start_ticks": 1})    # a process this boot no longer has
    con.execute("INSERT INTO runs (seq, run_id, command, at) VALUES (?, ?, 'dump', 'now')", [top + 1, run_id])
    con.execute("INSERT INTO stages (seq, run_id, stage, event, detail, at) VALUES (?, ?, 'process', 'start', ?, "
                "'now')", [top + 2, run_id, detail])
    con.commit()
    con.close()


def test_the_follow_service_tells_a_dead_run_s_unsealed_rows_once_as_such(cli, db, central, make_board, image,
                                                                            tmp_path):
    """Issue 27 item 2: rows a run committed and whose writer died before sealing them (the host
    lost power) are not rows of a running run that the next push sends: nothing will ever seal
    them. A push says so, naming the run, and the follow service says it once, not at every push
    for as long as it runs; the rows of a run still going are still said to wait."""
    import os

    from amdflash.pipeline.fleet.live import Follower

    test_central.flash(cli, make_board, image)
    enroll(cli, central, tmp_path)
    _unsealed_run(db, "20260101T000000-0000dead", 2**22 + 1)
    _unsealed_run(db, "20260101T000001-00000a11", os.getpid())          # this process: alive, still being written
    r, sent = push(cli, central)
    assert r.code == 0 and sent["held_back"] == 2 and sent["stranded"] == {"20260101T000000-0000dead": 2}, sent
    text = cli("audit", "push", "--to", central).out
    assert "run 20260101T000000-0000dead ended without sealing its last 2 row(s)" in text, text
    heard: list[str] = []
    follower = Follower(str(db), central, log=heard.append)
    for _ in range(3):
        follower.push_once()
    told = [line for line in heard if line.startswith("run 20260101T000000-0000dead ended without sealing")]
    assert len(told) == 1 and "no push will send them" in told[0], heard


@pytest.mark.slow
def test_the_line_tells_a_killed_flash_s_end_and_the_resume_that_fixed_it(cli, db, central, killed, tmp_path,
                                                                          monkeypatch):
    """Issue 27 item 1: the line view's notification of a killed flash carries its next step on
    its host, as fleet report says it (the host's follow service said its process is gone), and
    once the pasted resume has finished it, the line's summary says which run fixed it."""
    from amdflash.pipeline.fleet.live import Follower
    from amdflash.pipeline.fleet.serve.notify import Notifier
    from amdflash.store import status
    from tests.pipeline.fleet.lab import wait_for
    from tests.pipeline.fleet.test_serve import Receiver, _line

    run = killed["run"]
    enroll(cli, central, tmp_path)
    assert push(cli, central)[0].code == 0
    with monkeypatch.context() as m:               # the report as read on another machine
        m.setattr(status, "machine_id", lambda: "another-machine")
        (tmp_path / "boot_id").write_text("another-boot\n")
        m.setattr(status, "BOOT_ID", tmp_path / "boot_id")
        follower = Follower(str(db), central, log=lambda line: None)
        receiver = Receiver()
        line = _line(central, notifier=Notifier([receiver.url], lambda m: None), settle=1.0)
        try:
            m.undo()                               # the follow service is on the host: it sees its /proc
            for _ in range(2):
                follower.tick()
            m.setattr(status, "machine_id", lambda: "another-machine")
            m.setattr(status, "BOOT_ID", tmp_path / "boot_id")
            wait_for(lambda: any(run in t for t in receiver.titles()), 60, "the killed flash notified")
            [told] = [x["message"] for x in receiver.got if run in x["title"]]
            step = next(s for s in told.splitlines() if s.startswith("next: on hosta: "))
            pasted = step.split("To finish the flash: ")[1].split(" (run there")[0].split("; ")[0]
            assert pasted == f"amdflash resume --board sim:{killed['board']} --yes -- {run}", told
            m.undo()
            assert across.run_printed(cli, pasted).code == 0
            fix = json.loads(cli("runs", "--format", "json").out)[-1]["run_id"]
            for _ in range(2):
                follower.tick()
            follower.push_once()
            # Said in the line's summary: of the round it ended in, or of the round the resume ran in.
            wait_for(lambda: [x for x in receiver.got if "line done" in x["title"] and fix in x["message"]], 60,
                     "the line done with the resume")
            done = "\n".join(x["message"] for x in receiver.got if "line done" in x["title"])
            assert f"- interrupted (fixed by {fix}): hosta" in done or f"- run {run} fixed by {fix}: hosta" in done, \
                done
        finally:
            line.close()
            receiver.close()
            follower.watch.close()
            follower.pg.close()


def test_a_run_whose_process_died_unreaped_is_not_running():
    """A killed job's process can linger as a zombie until its parent reaps it; it runs nothing,
    so its run is interrupted, not running (the killed host job's runs read on their host)."""
    import os
    import time

    from amdflash.store import status

    pid = os.fork()
    if pid == 0:
        os._exit(0)
    try:
        stat = f"/proc/{pid}/stat"
        deadline = time.monotonic() + 10
        while open(stat).read().rsplit(")", 1)[1].split()[0] != "Z" and time.monotonic() < deadline:
            time.sleep(0.01)
        detail = json.dumps({"pid": pid, "start_ticks": status._start_ticks(pid), "boot_id": status._boot_id()})
        assert status.process_alive(detail) is False
        assert status.run_status(None, False, detail, status.machine_id()) == "interrupted"
    finally:
        os.waitpid(pid, 0)
    assert status.process_alive(status.this_process()) is True
