"""Issue 44 item 2, the central record as the second copy: a run edited on its host after it
was pushed is reported marked (tests/pipeline/cli/test_report_unverified.py), and
`report RUN --against central` (or the record's URL) names the row that changed, column and
both values, from the record's copy of the run, which verifies under the host's signatures."""
from __future__ import annotations

import json
import sqlite3

import pytest

from tests.pipeline.cli.test_report_unverified import _edit
from tests.pipeline.fleet.test_central import enroll, make_central, push

psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed (pip install '.[test]' brings it)")


@pytest.fixture
def central(postgres) -> str:
    return make_central(postgres)


def test_the_central_record_names_the_row_that_changed(cli, make_board, image, db, central, tmp_path, monkeypatch):
    img = image.read_bytes()
    stuck = next(a for a in range(0x2000, 0x4000) if img[a] == 0x00)
    board = make_board(content="blank", transport="ideal", faults=[f"stuck-bit={stuck:#x}:7"])
    assert cli("flash", image, "--yes", "--force", "--sector-count", "4", "--board", f"sim:{board}").code == 1
    run_id = json.loads(cli("runs", "--format", "json").out)[-1]["run_id"]
    enroll(cli, central, tmp_path)
    assert push(cli, central)[0].code == 0
    con = sqlite3.connect(db)
    seq, was, should = con.execute("SELECT v.seq, v.flash_byte, v.image_byte FROM log_verifies v JOIN runs r "
                                   "ON r.seq = v.run WHERE r.run_id = ? AND v.ok = 0 ORDER BY v.seq LIMIT 1",
                                   [run_id]).fetchone()
    con.close()
    _edit(db, "UPDATE log_verifies SET flash_byte = ? WHERE seq = ?", should, seq, trigger="log_verifies_no_update")
    said = f"differs  verifies seq {seq} column flash_byte: the trail says {should}, the copy {was}"
    r = cli("report", run_id, "--against", central)
    assert r.code == 1 and said in r.out, (r.code, r.out, r.err)
    assert "copy       the central record at " in r.out and "its copy of the run verifies" in r.out, r.out
    monkeypatch.setenv("AMDFLASH_CENTRAL", central)
    r = cli("report", run_id, "--against", "central", "--format", "json")
    found = [d for s in json.loads(r.out)["unverified"]["spans"] for d in s["differences"]]
    assert r.code == 1 and found == [{"table": "verifies", "seq": seq, "change": "changed", "column": "flash_byte",
                                      "trail": should, "copy": was}], found
