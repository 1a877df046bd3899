"""Issue 27 items 5 and 6, central side: the central record tells a run's end as the host's
own trail does. A flash killed while it writes and then finished by a resume is pushed, and
`fleet report HOST/RUN` and `fleet runs` must say what `report` and `runs` say on the host:
the same status, the same fixed-by, both runs verifying, and for the run left unfinished the
board's state, its backup and the next step (to be run on that host)."""
from __future__ import annotations

import json
import shlex

import pytest

from tests.pipeline.cli import test_original_across_runs as across
from tests.pipeline.fleet import test_central
from tests.pipeline.fleet.test_central import enroll, push

pytest.importorskip("psycopg", reason="psycopg is not installed (pip install '.[test]' brings it)")

killed = across.killed        # a board whose flash was killed while writing units (its run, its backup)
central = test_central.central    # a fresh central database, set up


def test_a_killed_then_resumed_flash_reads_the_same_centrally_as_locally(cli, db, central, killed, tmp_path):
    board, run = killed["board"], killed["run"]
    enroll(cli, central, tmp_path)
    assert push(cli, central)[0].code == 0

    # Before the resume: the next step (on the host), the board's state and the backup.
    here = json.loads(cli("report", run, "--format", "json").out)
    there = json.loads(cli("fleet", "report", f"hosta/{run}", "--from", central, "--format", "json").out)
    assert there["status"] == here["status"] == "interrupted"
    assert there["outcome"]["state"] == here["outcome"]["state"] and "erased" in there["outcome"]["state"]
    assert there["outcome"]["backup"] == here["outcome"]["backup"]
    assert there["outcome"]["backup"]["path"] == str(killed["backup"])
    step = here["outcome"]["next_step"]
    assert there["outcome"]["next_step"].startswith("on hosta")
    assert f"amdflash resume {run} --board sim:{board} --yes" in there["outcome"]["next_step"]
    assert step.split("To finish the flash: ")[0] in there["outcome"]["next_step"]
    text = cli("fleet", "report", f"hosta/{run}", "--from", central).out
    [listed] = [r for r in json.loads(cli("fleet", "runs", "--from", central, "--format", "json").out)
                if r["run_id"] == run]
    assert listed["status"] == "interrupted" and listed["fixed_by"] is None     # as report says it
    page = tmp_path / "there.html"
    assert cli("fleet", "report", f"hosta/{run}", "--from", central, "--format", "html", "-o", page).code == 0
    assert "on hosta: the flash is partly written" in page.read_text()
    assert "next       on hosta" in text and f"backup     backup of the board's original content: " \
                                               f"{killed['backup']}" in text, text

    # The step as the central report says it, pasted on the host, finishes the flash.
    pasted = there["outcome"]["next_step"].split("To finish the flash: ")[1].split(" (run there")[0]
    assert shlex.split(pasted) == ["amdflash", "resume", run, "--board", f"sim:{board}", "--yes"]
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
    assert remote == local
    lines = cli("fleet", "runs", "--from", central, "--status", "interrupted").out.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{'hosta':16} {run}"), lines
    assert f"interrupted (fixed by {fix})" in lines[0]
    assert lines == [f"{'hosta':16} {line}" for line in cli("runs", "--status", "interrupted").out.splitlines()]
    resumes = cli("fleet", "runs", "--from", central, "--command", "resume", "--format", "json").out
    assert [r["run_id"] for r in json.loads(resumes)] == [fix]
