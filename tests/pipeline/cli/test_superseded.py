"""Issue 40 item 4: a report's next step stays true later.

A flash killed while it writes, then a `flash --start-over` or a `restore-original` of the
same board: the killed run's report (text, JSON, HTML) went on saying "To finish the flash:
amdflash resume …", which, pasted, was refused (another run wrote the board since), and `runs`
showed plain `interrupted`. Every view now says which run superseded it, offers no resume, and
every command it still prints works when pasted. Only a run that speaks for itself — its own
rows, sealed and signed by the key that signed the flash — supersedes one: rows INSERTed, or
sealed with a key added to the database, never hide an unfinished flash."""
from __future__ import annotations

import json
import re
import signal
import sqlite3
from pathlib import Path

import pytest
from amdflash.stages.sim import Board
from amdflash.stages.sim.synth import PART_KEY

from tests.pipeline.cli import test_original_across_runs as across
from tests.pipeline.cli.test_run_end import field, pasted
from tests.pipeline.engine.conftest import flash_content
from tests.store.test_outside_rows import _recorded, _seal_with_a_key_of_their_own

killed = across.killed        # the fixture: a board whose flash was killed while writing units


def _runs(amdflash) -> dict[str, dict]:
    return {r["run_id"]: r for r in json.loads(amdflash("runs", "--json").out)}


def _commands(text: str) -> list[str]:
    """Every command a report prints (each up to the end of its clause; each carries --db, the
    test's database not being the default one)."""
    return [c.strip() for c in re.findall(r"(amdflash --db [^;)\n]*)", text)]


def _says_superseded(amdflash, run: str, by: str, pages: Path) -> str:
    """Assert every view says `run` was superseded by `by`, with no step to resume it; returns
    the report's text."""
    listed = _runs(amdflash)
    assert (listed[run]["status"], listed[run]["superseded_by"], listed[run]["fixed_by"]) == ("interrupted", by, None)
    assert listed[by]["superseded_by"] is None
    [line] = [x for x in amdflash("runs").out.splitlines() if x.startswith(run)]
    assert f" interrupted (superseded by {by}) " in line, line
    rep = json.loads(amdflash("report", run, "--json").out)
    end = rep["outcome"]
    assert rep["superseded_by"] == by and end["superseded_by"] == by and end["next_step"] is None, end
    assert rep["fixed_by"] is None and end["fixed_by"] is None
    text = amdflash("report", run).out
    assert f"next       none: superseded by {by}" in text and " resume " not in text, text
    assert f"superseded {by} wrote this board since" in text, text
    assert f"state      {end['state']} (when the run ended)" in text, text
    page_file = pages / f"{run}.html"
    assert amdflash("report", run, "--format", "html", "-o", page_file, "--overwrite").code == 0
    page = page_file.read_text()
    assert field(page, "superseded_by") == by and 'data-field="next_step"' not in page and " resume " not in page
    return text


@pytest.mark.slow
def test_a_start_over_supersedes_the_killed_flash_in_every_view(amdflash, killed, isolated, image, tmp_path):
    board, run = killed["board"], killed["run"]
    spec = f"sim:{board}"
    before = json.loads(amdflash("report", run, "--json").out)["outcome"]["next_step"]
    assert "To finish the flash: " in before      # until then, the resume is the way
    over = amdflash("--no-progress", "flash", image, "--yes", "--expect-part", PART_KEY, "--board", spec,
                    "--start-over")
    assert over.code == 0, over.err
    new = list(_runs(amdflash))[-1]
    pages = tmp_path / "pages"
    pages.mkdir()
    text = _says_superseded(amdflash, run, new, pages)
    # The resume the report printed before is refused now; what the report prints now is not.
    assert pasted(across.printed(before, "To finish the flash: "), tmp_path).returncode == 2
    steps = _commands(text)
    assert steps and all("--start-over" in s or "restore-original" in s for s in steps), steps
    for step in steps:
        done = pasted(step, tmp_path)
        assert done.returncode == 0, (step, done.stderr)
    assert flash_content(board) == killed["first"]          # the killed flash's backup, put back


@pytest.mark.slow
def test_restore_original_supersedes_the_killed_flash(amdflash, killed, isolated, tmp_path):
    board, run = killed["board"], killed["run"]
    back = amdflash("--no-progress", "restore-original", "--board", f"sim:{board}", "--yes")
    assert back.code == 0, back.err
    assert flash_content(board) == killed["first"]
    restore = list(_runs(amdflash))[-1]
    pages = tmp_path / "pages"
    pages.mkdir()
    _says_superseded(amdflash, run, restore, pages)


@pytest.mark.slow
def test_a_start_over_killed_too_supersedes_the_first_and_its_own_resume_works(amdflash, killed, isolated,
                                                                               image, tmp_path):
    """The start-over is killed while it writes in turn: the first flash is superseded by it,
    and the start-over's own report offers the resume that finishes it — which works pasted."""
    board, run = killed["board"], killed["run"]
    spec = f"sim:{board}"
    other = tmp_path / "other.bin"           # every unit differs: the start-over writes them all
    other.write_bytes(bytes(b ^ 0x5A for b in image.read_bytes()))
    # The killed flash's own writes are mostly its backup's: past as many again, this one writes units.
    backup_writes = across.reference_writes(tmp_path, image, killed["first"])
    with Board(board) as b:
        kill_at = int(b.stats()["reg_writes"]) + backup_writes * 3 // 2
    assert amdflash("sim", "fault", board, "--clear", f"kill-after-writes={kill_at}").code == 0
    p = across.cli_process("flash", other, "--yes", "--force", "--board", spec, "--start-over")
    assert p.returncode == -signal.SIGKILL, p.stderr
    assert amdflash("sim", "fault", board, "--clear").code == 0
    assert flash_content(board) not in (killed["half"], other.read_bytes())
    second = list(_runs(amdflash))[-1]
    assert second != run
    pages = tmp_path / "pages"
    pages.mkdir()
    _says_superseded(amdflash, run, second, pages)
    step = json.loads(amdflash("report", second, "--json").out)["outcome"]["next_step"]
    resume = across.printed(step, "To finish the flash: ")
    assert resume.split()[3] == "resume" and resume.split()[-2:] == ["--", second], resume
    done = pasted(resume, tmp_path)
    assert done.returncode == 0, done.stderr
    assert flash_content(board) == other.read_bytes()


def _forge_a_start_over(db: Path, run: str, forged: str, at: str) -> None:
    """Rows INSERTed without the key: a flash of the killed run's board that succeeded since."""
    runs_row, board_row = _recorded(db, "runs", run), _recorded(db, "boards", run)
    con = sqlite3.connect(db)
    for table, row in (("runs", {**runs_row, "run_id": forged, "at": at}),
                       ("boards", {**board_row, "run_id": forged, "at": at}),
                       ("run_status", {"run_id": forged, "status": "succeeded", "summary": "{}", "at": at})):
        con.execute(f"INSERT INTO {table} ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", list(row.values()))
    con.commit()
    con.close()


@pytest.mark.slow
def test_a_forged_later_flash_never_supersedes_the_killed_one(amdflash, killed, isolated, tmp_path):
    """A later flash of the board that "succeeded", INSERTed without the key, and another sealed
    with a key of the forger's own added to the database (every signature in the file then
    verifies): neither makes the killed flash look superseded, in any view — it is still told as
    partly written. Resuming it is refused over them (they may have written), so its report says
    so and offers the put-back instead, which works pasted."""
    board, run = killed["board"], killed["run"]
    db = isolated / "audit.sqlite"
    at = "2099-12-31T23:59:59+00:00"
    _forge_a_start_over(db, run, "20991231T235959-0badc0de", at)
    con = sqlite3.connect(db)
    after = con.execute("SELECT seq FROM chain_head").fetchone()[0] + 100
    con.close()
    sealed = "20991231T235959-5ea1ed00"
    _seal_with_a_key_of_their_own(db, sealed, [
        ("runs", {**_recorded(db, "runs", run), "run_id": sealed, "at": at}),
        ("boards", {**_recorded(db, "boards", run), "run_id": sealed, "at": at}),
        ("run_status", {"run_id": sealed, "status": "running", "at": at}),
        ("run_status", {"run_id": sealed, "status": "succeeded", "summary": "{}", "at": at})], after, at)
    assert amdflash("audit", "verify", "--run", sealed).code == 0      # consistent, under the key it added
    listed = _runs(amdflash)
    assert listed[run]["superseded_by"] is None and listed[run]["status"] == "interrupted", listed[run]
    rep = json.loads(amdflash("report", run, "--json").out)
    end = rep["outcome"]
    assert rep["superseded_by"] is None and end["superseded_by"] is None
    assert end["resume_blocked_by"] in ("20991231T235959-0badc0de", sealed), end
    assert end["next_step"].startswith(end["state"] + ". A later run, "), end
    assert end["state"].startswith("the flash is partly written"), end
    text = amdflash("report", run).out
    assert "superseded" not in text and f"next       {end['next_step']}" in text, text
    resumed = amdflash("--no-progress", "resume", run, "--board", f"sim:{board}", "--yes")
    assert resumed.code in (1, 2) and "does not verify" in resumed.err, resumed.err   # as the step says
    steps = _commands(end["next_step"])
    assert steps, end["next_step"]
    for step in steps:
        done = pasted(step, tmp_path)
        assert done.returncode == 0, (step, done.stderr)
    assert flash_content(board) == killed["first"]


def test_a_failed_flash_started_over_is_superseded_too(amdflash, make_board, image, tmp_path):
    """A flash that failed verify (a stuck bit) after writing: its resume is the step until a
    start-over writes the board; then `runs` and its report say which run superseded it."""
    img = image.read_bytes()
    stuck = next(a for a in range(0x2000, 0x4000) if img[a] == 0x00)
    board = make_board(content="blank", transport="ideal", faults=[f"stuck-bit={stuck:#x}:7"])
    spec = f"sim:{board}"
    assert amdflash("--no-progress", *_flash_args(image, spec)).code == 1
    failed = list(_runs(amdflash))[-1]
    assert "finish the flash: " in json.loads(amdflash("report", failed, "--json").out)["outcome"]["next_step"]
    assert amdflash("sim", "fault", board, "--clear").code == 0
    over = amdflash("--no-progress", *_flash_args(image, spec), "--start-over")
    assert over.code == 0, over.err
    new = list(_runs(amdflash))[-1]
    listed = _runs(amdflash)[failed]
    assert (listed["status"], listed["superseded_by"]) == ("failed", new), listed
    end = json.loads(amdflash("report", failed, "--json").out)["outcome"]
    assert end["superseded_by"] == new and end["next_step"] is None, end
    text = amdflash("report", failed).out
    assert f"next       none: superseded by {new}" in text and " resume " not in text, text


def _flash_args(image: Path, spec: str) -> tuple[object, ...]:
    return ("flash", image, "--yes", "--expect-part", PART_KEY, "--sector-count", "8", "--board", spec)
