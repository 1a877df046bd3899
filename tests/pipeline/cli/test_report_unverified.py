"""Issue 44 item 2: a run that does not verify is shown, marked.

A failed flash on an emulated board, then edited as an insider with the file would: the
append-only triggers dropped (and put back), one verify row's flash byte changed to hide the
mismatch, the error row deleted, the final status relabelled 'succeeded'. `report` (text,
JSON, HTML) refused the whole run and named one span, never the row; `replay` likewise. Now
the report shows what the run's signed checkpoints still vouch for, marks the rest, names
every failing span (seq range, checkpoint, tables) and exits 1; given an export made before
the edit, it names each row that differs, column and both values. Nothing that acts on the
hardware reads a run that way: `replay` still refuses, naming the spans."""
from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.pipeline.engine.conftest import image  # noqa: F401 - the image fixture


@dataclass
class Tampered:
    run_id: str
    db: Path
    export: Path                 # `audit export --run` made before the edit
    verify_seq: int              # the verify row whose flash byte was changed
    was: int                     # its flash byte before
    error_seq: int               # the error row deleted
    error_message: str
    status_seq: int              # the status row relabelled 'succeeded'
    spans: dict[int, tuple[int, int, int]]     # edited seq -> (checkpoint id, first seq, last seq) of its span


def _edit(db: Path, sql: str, *args: object, trigger: str) -> None:
    """One change as an insider makes it: the append-only trigger dropped, then put back as it was."""
    con = sqlite3.connect(db)
    definition = con.execute("SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = ?",
                             [trigger]).fetchone()[0]
    con.execute(f"DROP TRIGGER {trigger}")
    con.execute(sql, args)
    con.execute(definition)
    con.commit()
    con.close()


def _span(con: sqlite3.Connection, key: int, seq: int) -> tuple[int, int, int]:
    """(checkpoint id, first seq, last seq) of the segment holding `seq`."""
    cps = con.execute("SELECT id, last_seq FROM checkpoints WHERE run = ? ORDER BY id", [key]).fetchall()
    first = key
    for ident, last in cps:
        if seq <= last:
            return ident, first, last
        first = last + 1
    raise AssertionError(f"seq {seq} is after the run's last checkpoint")


@pytest.fixture
def tampered(amdflash, make_board, image, tmp_path) -> Tampered:  # noqa: F811
    img = image.read_bytes()
    stuck = next(a for a in range(0x2000, 0x4000) if img[a] == 0x00)
    board = make_board(content="blank", transport="ideal", faults=[f"stuck-bit={stuck:#x}:7"])
    assert amdflash("flash", image, "--yes", "--force", "--sector-count", "4", "--board", f"sim:{board}").code == 1
    run_id = json.loads(amdflash("runs", "--format", "json").out)[-1]["run_id"]
    export = tmp_path / "run.jsonl"
    assert amdflash("audit", "export", "--run", run_id, "-o", export).code == 0
    db = tmp_path / "audit.sqlite"
    con = sqlite3.connect(db)
    key = con.execute("SELECT seq FROM runs WHERE run_id = ?", [run_id]).fetchone()[0]
    verify_seq, was, should = con.execute("SELECT seq, flash_byte, image_byte FROM log_verifies WHERE run = ? "
                                          "AND ok = 0 ORDER BY seq LIMIT 1", [key]).fetchone()
    error_seq, message = con.execute("SELECT seq, message FROM errors WHERE run_id = ?", [run_id]).fetchone()
    status_seq = con.execute("SELECT max(seq) FROM run_status WHERE run_id = ?", [run_id]).fetchone()[0]
    spans = {s: _span(con, key, s) for s in (verify_seq, error_seq, status_seq)}
    con.close()
    _edit(db, "UPDATE log_verifies SET flash_byte = ? WHERE seq = ?", should, verify_seq,
          trigger="log_verifies_no_update")
    _edit(db, "DELETE FROM errors WHERE seq = ?", error_seq, trigger="errors_no_delete")
    _edit(db, "UPDATE run_status SET status = 'succeeded', detail = NULL WHERE seq = ?", status_seq,
          trigger="run_status_no_update")
    return Tampered(run_id, db, export, verify_seq, was, error_seq, message, status_seq, spans)


def _named(t: Tampered, text: str) -> None:
    """Every failing span is named: its seq range and checkpoint."""
    for ident, first, last in t.spans.values():
        assert f"seq {first}..{last} (checkpoint #{ident})" in text, text


def test_text_report_shows_what_the_checkpoints_vouch_for_and_marks_the_rest(amdflash, tampered):
    r = amdflash("report", tampered.run_id)
    assert r.code == 1, r.err
    lines = r.out.splitlines()
    # The relabelled status is not shown as the run's: it is named as what the trail says, unvouched.
    assert lines[0].startswith(f"run        {tampered.run_id}  (flash, succeeded (not verified)"), lines[0]
    assert "(flash, succeeded)" not in r.out
    assert "status     NOT VERIFIED: the trail says 'succeeded'" in r.out, r.out
    # What the checkpoints still vouch for is shown: the board, the image, units.
    assert "board      sim:" in r.out and "chip GigaDevice" in r.out and "units      " in r.out, r.out
    assert "vouched    only rows seq " in r.out and "chain      BROKEN" in r.out, r.out
    _named(tampered, r.out)
    verify_span = next(line for line in lines if line.startswith("failing ") and
                       f"checkpoint #{tampered.spans[tampered.verify_seq][0]})" in line)
    assert "verifies" in verify_span, verify_span
    # Without a copy, it says what would name the row.
    assert f"amdflash report {tampered.run_id} --against FILE" in r.out, r.out
    # ... and on stderr, one line: it does not verify, what is shown, the failing spans.
    [said] = r.err_lines
    assert said.startswith(f"error: run {tampered.run_id} does not verify: ") and "the rest marked" in said, said
    _named(tampered, said)


def test_json_report_marks_the_status_and_names_the_spans(amdflash, tampered):
    r = amdflash("report", tampered.run_id, "--format", "json")
    assert r.code == 1, r.err
    rep = json.loads(r.out)
    assert rep["status"] == "succeeded (not verified)" and rep["recorded_status"] == "succeeded"
    assert rep["status_verified"] is False
    assert rep["chain"]["ok"] is False and rep["board"]["chip"], rep["chain"]
    u = rep["unverified"]
    spans = {(s["checkpoint"], s["first_seq"], s["last_seq"]) for s in u["spans"]}
    assert set(tampered.spans.values()) <= spans, (spans, tampered.spans)
    # No edited row lies in what is vouched for, and so none is in the report's facts.
    for seq in tampered.spans:
        assert not any(lo <= seq <= hi for lo, hi in u["vouched"]), (seq, u["vouched"])
    assert u["vouched"] and u["copy"] is None and "--against FILE" in u["next"]
    assert [s for s in u["spans"] if s["checkpoint"] == tampered.spans[tampered.verify_seq][0]][0]["tables"]["verifies"]


def test_html_report_is_shown_marked_and_written_to_a_file_only_when_asked(amdflash, tampered, tmp_path):
    r = amdflash("report", tampered.run_id, "--format", "html")
    assert r.code == 1 and 'data-field="unverified"' in r.out, r.err
    assert r.out.count('data-field="failing-span"') >= len(set(tampered.spans.values()))
    assert 'data-field="status-badge">succeeded (not verified)<' in r.out and 'badge bad' in r.out
    assert 'data-field="status-unverified"' in r.out
    # A file travels without the exit status: written only with --unverified.
    page = tmp_path / "page.html"
    refused = amdflash("report", tampered.run_id, "--format", "html", "-o", page)
    assert refused.code == 1 and not page.exists() and "--unverified" in refused.err, refused.err
    for ident, first, last in tampered.spans.values():
        assert f"seq {first}..{last}, checkpoint #{ident}" in refused.err, refused.err
    written = amdflash("report", tampered.run_id, "--format", "html", "-o", page, "--unverified")
    assert written.code == 1 and 'data-field="unverified"' in page.read_text()
    pages = tmp_path / "pages"
    pages.mkdir()
    assert amdflash("report", tampered.run_id, "--pages", pages, "--unverified").code == 1
    assert 'data-field="unverified"' in (pages / f"{tampered.run_id}.html").read_text()


def test_an_export_made_before_names_each_row_that_differs(amdflash, tampered):
    t = tampered
    r = amdflash("report", t.run_id, "--against", t.export)
    assert r.code == 1, r.err
    assert f"differs  verifies seq {t.verify_seq} column flash_byte: the trail says " in r.out, r.out
    assert f"the copy {t.was}" in r.out and "copy       " in r.out and "an export that verifies" in r.out
    assert f"errors seq {t.error_seq}: removed from the trail; the copy holds" in r.out and t.error_message in r.out
    assert f'run_status seq {t.status_seq} column status: the trail says "succeeded", the copy "failed"' in r.out
    rep = json.loads(amdflash("report", t.run_id, "--json", "--against", t.export).out)
    found = [(d["table"], d["seq"], d.get("column"), d["trail"], d["copy"])
             for s in rep["unverified"]["spans"] for d in s["differences"]]
    assert ("verifies", t.verify_seq, "flash_byte", found[0][3], t.was) in found, found
    assert ("run_status", t.status_seq, "status", "succeeded", "failed") in found, found
    assert any(f[:2] == ("errors", t.error_seq) and f[3] is None for f in found), found


def test_a_copy_that_is_not_an_export_is_refused(amdflash, tampered, tmp_path):
    bad = tmp_path / "not-an-export.jsonl"
    bad.write_text("hello\n")
    r = amdflash("report", tampered.run_id, "--against", bad)
    assert r.code == 2 and "not an amdflash export" in r.err and not r.out, (r.code, r.err)


def test_replay_still_refuses_and_names_the_failing_spans(amdflash, tampered):
    r = amdflash("replay", tampered.run_id)
    assert r.code == 1 and not r.out, (r.code, r.out)
    for ident, first, last in tampered.spans.values():
        assert f"seq {first}..{last}, checkpoint #{ident}" in r.err, r.err
    assert "--against EXPORT" in r.err


def test_a_deleted_end_leaves_no_earlier_status_shown_as_the_runs(amdflash, make_board, image):  # noqa: F811
    """The run's end row DELETEd: its newest status row left is an earlier one, vouched for, but
    a failing span after it may have held a newer one: the status is 'not verified'."""
    img = image.read_bytes()
    stuck = next(a for a in range(0x2000, 0x4000) if img[a] == 0x00)
    board = make_board(content="blank", transport="ideal", faults=[f"stuck-bit={stuck:#x}:7"])
    assert amdflash("flash", image, "--yes", "--force", "--sector-count", "4", "--board", f"sim:{board}").code == 1
    run_id = json.loads(amdflash("runs", "--format", "json").out)[-1]["run_id"]
    db = Path(os.environ["AMDFLASH_DB"])
    con = sqlite3.connect(db)
    end = con.execute("SELECT max(seq) FROM run_status WHERE run_id = ?", [run_id]).fetchone()[0]
    con.close()
    _edit(db, "DELETE FROM run_status WHERE seq = ?", end, trigger="run_status_no_delete")
    r = amdflash("report", run_id, "--json")
    rep = json.loads(r.out)
    assert r.code == 1 and rep["status"].endswith("(not verified)") and rep["ended"] is None, rep["status"]
    assert rep["status_verified"] is False and rep["recorded_status"] != "failed", rep["recorded_status"]
    assert rep["unverified"]["spans"], rep["unverified"]
    # ... and a resume, which acts on the board, still refuses the run whole.
    resumed = amdflash("resume", run_id, "--board", f"sim:{board}", "--yes")
    assert resumed.code != 0 and "does not verify" in resumed.err, (resumed.code, resumed.err)


def test_a_copy_that_is_no_file_is_refused_before_anything_is_read(amdflash, tampered, tmp_path):
    for given in (tmp_path / "missing.jsonl", tmp_path):
        r = amdflash("report", tampered.run_id, "--against", given)
        assert r.code == 2 and "--against" in r.err and not r.out, (given, r.code, r.err)
