"""Issue 27 item 6: a run's end is told again wherever the run is shown later.

A flash killed while it writes (kill-after-writes: the host dies, nothing is printed) is
then looked at the way a reviewer would: `report` in text, JSON and HTML says what the flash
holds, which backup holds what and the command that puts it back, and the next step — and
that step, pasted from the report into a shell elsewhere, finishes the flash. Once a resume
has fixed it, every view (report, `runs`, datasette's canned queries) says so."""
from __future__ import annotations

import html
import json
import re
import shlex
import sqlite3
from pathlib import Path

import pytest
from amdflash.stages.sim import create_board
from amdflash.stages.sim.synth import PART_KEY

from tests.pipeline.cli import test_original_across_runs as across
from tests.pipeline.engine.conftest import flash_content
from tests.support import cli

killed = across.killed        # the fixture: a board whose flash was killed while writing units
printed = across.printed

METADATA = Path(__file__).resolve().parents[3] / "store" / "datasette_metadata.json"


def shell(*words: object, cwd: Path) -> cli.Result:
    """amdflash run from `cwd` with no AMDFLASH_DB: only what the command line says reaches
    the audit database."""
    return cli.run("--no-progress", *words, cwd=cwd, env={"AMDFLASH_DB": None})


def pasted(command: str, cwd: Path) -> cli.Result:
    """A command exactly as a report printed it, split as a shell would, run from `cwd`."""
    words = shlex.split(command)
    assert words[0] == "amdflash", command
    return shell(*words[1:], cwd=cwd)


def field(page: str, name: str) -> str:
    """The text of an HTML report's element data-field=NAME (tags dropped, entities decoded)."""
    found = re.search(rf'data-field="{name}"[^>]*>(.*?)</td>', page, re.DOTALL)
    assert found, (name, page[:2000])
    return html.unescape(re.sub(r"<[^>]+>", "", found.group(1)))


def canned(db: Path, name: str, **params: str) -> list[dict]:
    """A datasette canned query, run as datasette runs it (read-only, every parameter given)."""
    sql = json.loads(METADATA.read_text())["databases"]["audit"]["queries"][name]["sql"]
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(sql, {"status": "", "board": "", "run_id": "", **params})]
    finally:
        conn.close()


@pytest.mark.slow
def test_a_killed_flash_reports_its_state_backup_and_a_next_step_that_works_pasted(killed, isolated, image, tmp_path):
    board, run, backup = killed["board"], killed["run"], str(killed["backup"])
    db = isolated / "audit.sqlite"
    here, elsewhere = tmp_path, tmp_path / "elsewhere"
    elsewhere.mkdir()
    # The report's own --db, relative to where it is run: its commands carry it, absolute.
    text = shell("--db", db.name, "report", run, cwd=here)
    assert text.returncode == 0, text.stderr
    rep = json.loads(shell("--db", db.name, "report", run, "--format", "json", cwd=here).stdout)
    page = shell("--db", db.name, "report", run, "--format", "html", cwd=here).stdout
    end = rep["outcome"]
    assert end["state"].startswith("the flash is partly written: ") and "units erased" in end["state"], end
    assert end["backup"]["path"] == backup and end["backup"]["run_id"] == run
    assert end["backup"]["content"] == "the board's original content" and end["fixed_by"] is None
    assert rep["fixed_by"] is None
    step = end["next_step"]
    assert step.startswith(end["state"] + ". To finish the flash: "), step
    resume = printed(step, "To finish the flash: ")
    assert shlex.split(resume) == ["amdflash", "--db", str(db), "resume", "--board", f"sim:{board}", "--yes", "--", run]
    # The text and the HTML page say the same, in the same words.
    lines = text.stdout.splitlines()
    assert f"state      {end['state']}" in lines, text.stdout
    assert f"next       {step}" in lines, text.stdout
    assert any(x.startswith(f"backup     backup of the board's original content: {backup} (run {run}); to put it "
                            f"back: {end['backup']['put_back']}") for x in lines), text.stdout
    assert field(page, "flash_state") == end["state"]
    assert field(page, "next_step") == step
    assert backup in field(page, "backup") and end["backup"]["put_back"] in field(page, "backup")
    # Nothing was written by looking; the next step, pasted elsewhere, finishes the flash.
    assert flash_content(board) == killed["half"]
    done = pasted(resume, elsewhere)
    assert done.returncode == 0, done.stderr
    assert flash_content(board) == image.read_bytes()


@pytest.mark.slow
def test_the_put_back_command_of_a_killed_flashs_report_restores_the_original(killed, isolated, tmp_path):
    board, run = killed["board"], killed["run"]
    page = shell("--db", isolated / "audit.sqlite", "report", run, "--format", "html", cwd=tmp_path).stdout
    put_back = html.unescape(re.sub(r"<[^>]+>", "", re.search(r'<code data-field="put-back"[^>]*>(.*?)</code>',
                                                              page).group(1)))
    assert "--start-over" in shlex.split(put_back), put_back      # the unfinished flash would refuse it otherwise
    done = pasted(put_back, tmp_path)
    assert done.returncode == 0, done.stderr
    assert flash_content(board) == killed["first"]


@pytest.mark.slow
def test_a_killed_flash_fixed_by_a_resume_says_so_in_every_view(amdflash, killed, isolated, tmp_path):
    board, run = killed["board"], killed["run"]
    db = isolated / "audit.sqlite"
    spec = f"sim:{board}"
    # datasette cannot see the process: once a later run opened the board, the run is over.
    assert amdflash("info", "--board", spec).code == 0
    [row] = canned(db, "runs_by_status", status="interrupted")
    assert (row["run_id"], row["fixed_by"]) == (run, None)
    done = amdflash("--no-progress", "resume", run, "--board", spec, "--yes")
    assert done.code == 0, done.err
    fix = json.loads(amdflash("runs", "--json").out)[-1]["run_id"]
    assert fix != run
    # runs: text and JSON, and --status keeps it among the interrupted.
    listed = {r["run_id"]: r for r in json.loads(amdflash("runs", "--json").out)}
    assert (listed[run]["status"], listed[run]["fixed_by"]) == ("interrupted", fix)
    assert listed[fix]["fixed_by"] is None
    out = amdflash("runs", "--status", "interrupted").out.splitlines()
    assert len(out) == 1 and out[0].startswith(run) and f" interrupted (fixed by {fix}) " in out[0], out
    # report: JSON, text (no next step left), HTML (linked only when the page is beside it).
    rep = json.loads(amdflash("report", run, "--json").out)
    assert rep["fixed_by"] == fix and rep["outcome"]["fixed_by"] == fix and rep["outcome"]["next_step"] is None
    text = amdflash("report", run).out
    assert f"next       none: fixed by {fix}" in text and "To finish the flash" not in text, text
    pages = tmp_path / "pages"
    pages.mkdir()
    assert amdflash("report", run, "--format", "html", "-o", pages / f"{run}.html").code == 0
    page = (pages / f"{run}.html").read_text()
    assert field(page, "fixed_by") == fix and "next_step" not in page
    assert f'href="{fix}.html"' not in page                # no page of the resume there yet
    assert amdflash("report", fix, "--format", "html", "-o", pages / f"{fix}.html").code == 0
    assert amdflash("report", run, "--format", "html", "-o", pages / f"{run}.html", "--overwrite").code == 0
    assert f'<a class="mono" href="{fix}.html">{fix}</a>' in (pages / f"{run}.html").read_text()
    # datasette's canned queries: interrupted, fixed by the resume.
    by_status = {r["run_id"]: r for r in canned(db, "runs_by_status")}
    assert (by_status[run]["status"], by_status[run]["fixed_by"]) == ("interrupted", fix)
    assert (by_status[fix]["status"], by_status[fix]["fixed_by"]) == ("succeeded", None)
    history = [(r["run_id"], r["status"], r["fixed_by"]) for r in canned(db, "board_history", board=spec)]
    assert history[0] == (run, "interrupted", fix)
    assert history == [(r["run_id"], r["status"], r["fixed_by"]) for r in listed.values()]


@pytest.mark.slow
def test_a_failed_flashs_report_repeats_the_next_step_the_run_printed(amdflash, image, tmp_path):
    img = image.read_bytes()
    stuck = next(a for a in range(0x2000, len(img)) if img[a] & 0x01 == 0)
    board = create_board(tmp_path / "board", content="blank", transport="ideal", seed=2,
                         faults=[f"stuck-bit={stuck:#x}:0"])
    db = tmp_path / "elsewhere.sqlite"          # not the environment's: every suggested command names it
    r = amdflash("--no-progress", "--db", db, "flash", image, "--yes", "--expect-part", PART_KEY,
                 "--board", f"sim:{board}")
    assert r.code == 1, r.err
    [said] = [line.strip()[len("next: "):] for line in r.err.splitlines() if line.strip().startswith("next: ")]
    assert "The original content is backup " in said and f"--db {db}" in said, said
    [run] = [x["run_id"] for x in json.loads(amdflash("--db", db, "runs", "--json").out)]
    rep = json.loads(amdflash("--db", db, "report", run, "--json").out)
    assert rep["outcome"]["next_step"] == said
    assert rep["outcome"]["state"].startswith("the flash is partly written: ") and "failed verify" in said
    assert f"next       {said}" in amdflash("--db", db, "report", run).out.splitlines()
    # runs gives the reason: the error, on one line.
    [line] = amdflash("--db", db, "runs").out.splitlines()
    assert line.split()[2] == "failed" and "verify failed at" in line, line
    assert amdflash("--db", db, "runs", "--status", "succeeded").out == ""


def test_runs_filters_by_status_board_since_and_command_and_cuts_a_long_reason(amdflash, image, tmp_path):
    a = create_board(tmp_path / "a", content="blank", transport="ideal", seed=1)
    b = create_board(tmp_path / "b", content="synthetic", transport="ideal", seed=2)
    assert amdflash("info", "--board", f"sim:{a}").code == 0
    refused = amdflash("flash", image, "--yes", "--board", f"sim:{a}")      # a blank board: no part number
    assert refused.code == 2, refused.err
    assert amdflash("info", "--board", f"sim:{b}").code == 0
    listed = json.loads(amdflash("runs", "--json").out)
    assert [(r["command"], r["status"]) for r in listed] == [("info", "succeeded"), ("flash", "refused"),
                                                             ("info", "succeeded")]
    info_a, flash_a, info_b = (r["run_id"] for r in listed)
    reason = listed[1]["reason"]
    assert reason and "blank" in reason and len(reason) > 100 and listed[0]["reason"] is None

    def ids(*options: str) -> list[str]:
        r = amdflash("runs", "--json", *options)
        assert r.code == 0, r.err
        return [x["run_id"] for x in json.loads(r.out)]

    assert ids("--status", "refused") == [flash_a]
    assert ids("--board", f"sim:{a}") == [info_a, flash_a]
    assert ids("--board", listed[2]["unique_id"]) == [info_b]
    assert ids("--command", "info") == [info_a, info_b]
    assert ids("--command", "info", "--board", f"sim:{b}") == [info_b]
    assert ids("--since", listed[2]["started"]) == [info_b]
    assert ids("--since", "2999-01-01") == []
    assert amdflash("runs", "--since", "yesterday").code == 2
    # The text line: the reason on one line, cut with … at 100 characters.
    [line] = amdflash("runs", "--status", "refused").out.splitlines()
    shown = line.split(f"sim:{a}", 1)[1].strip()
    assert shown.endswith("…") and len(shown) <= 100 and reason.startswith(shown[:-1]), line
