"""Is the image for this board? The decision table, and `flash` on emulated boards."""
from __future__ import annotations

import json
import os
import sqlite3

import pytest

from amdflash.stages.image.part_check import BoardPart, PartPolicy, decide
from amdflash.stages.sim.synth import PART_KEY, synthetic_ifwi
from tests.pipeline.engine.conftest import cli, cli_shown, db, flash_content  # noqa: F401 - fixtures

FOUND = BoardPart("found", "113-D7040100-114", "partition A")
OTHER = BoardPart("found", "113-D7060100-114", "partition A")
BLANK = BoardPart("blank", detail="the EFS reads all FF (erased)")
UNREADABLE = BoardPart("unreadable", detail="no $PSP directory at 0x2000")
IMAGE = "113-D7040100-102"


@pytest.mark.parametrize("image, board, policy, outcome", [
    (IMAGE, FOUND, PartPolicy(), "same"),                      # the version field may differ
    (IMAGE, OTHER, PartPolicy(), "refused"),
    (IMAGE, OTHER, PartPolicy(force=True), "forced"),
    (IMAGE, OTHER, PartPolicy(expect_part=IMAGE), "refused"),   # --expect-part does not override a mismatch
    (IMAGE, BLANK, PartPolicy(), "refused"),
    (IMAGE, UNREADABLE, PartPolicy(), "refused"),
    (IMAGE, BLANK, PartPolicy(expect_part="113-D70401"), "expected"),
    (IMAGE, UNREADABLE, PartPolicy(expect_part="113-D7040100-999"), "expected"),
    (IMAGE, BLANK, PartPolicy(expect_part="113-D70601"), "refused"),
    (IMAGE, BLANK, PartPolicy(expect_part="113-D70601", force=True), "refused"),
    (IMAGE, UNREADABLE, PartPolicy(force=True), "forced"),
    (None, FOUND, PartPolicy(), "refused"),
    (None, BLANK, PartPolicy(expect_part=IMAGE), "refused"),
    (None, FOUND, PartPolicy(force=True), "forced"),
    (IMAGE, FOUND, PartPolicy(expect_part="113-D70401"), "same"),
])
def test_decision_table(image, board, policy, outcome):
    decision = decide(image, None if image else "no ISH_A", board, policy)
    assert decision.outcome == outcome
    assert (decision.refusal is not None) == (outcome == "refused")
    record = decision.as_json()
    assert record["image_part"] == image and record["board_part"] == board.part_number
    assert record["board_state"] == board.state and record["outcome"] == outcome


def test_refusal_messages_name_both_parts_and_the_way_out():
    assert "113-D7040100-102" in decide(IMAGE, None, OTHER, PartPolicy()).refusal
    assert "113-D7060100-114" in decide(IMAGE, None, OTHER, PartPolicy()).refusal
    assert "--force" in decide(IMAGE, None, OTHER, PartPolicy()).refusal
    assert "--expect-part 113-D70401" in decide(IMAGE, None, BLANK, PartPolicy()).refusal


# -- flash on emulated boards ------------------------------------------------------------------

def stage_rows(db_path, stage: str = "part_number") -> list[tuple[str, dict]]:  # noqa: ANN001
    con = sqlite3.connect(db_path)
    run_id = con.execute("SELECT run_id FROM runs ORDER BY rowid DESC LIMIT 1").fetchone()[0]
    rows = con.execute("SELECT event, detail FROM stages WHERE run_id = ? AND stage = ?", [run_id, stage]).fetchall()
    return [(event, json.loads(detail)) for event, detail in rows]


def writes_of_last_run(db_path) -> int:  # noqa: ANN001
    con = sqlite3.connect(db_path)
    run_id = con.execute("SELECT run_id FROM runs ORDER BY rowid DESC LIMIT 1").fetchone()[0]
    return con.execute("SELECT count(*) FROM spi_transactions WHERE run_id = ? AND opcode IN (2, 32, 82, 216, 199)",
                       [run_id]).fetchone()[0]


RANGE = ("--start-sector", "0", "--sector-count", "16")   # the check is the same for any range: keep runs short


@pytest.fixture
def image_for(tmp_path):  # noqa: ANN201
    def make(key: str = PART_KEY, seed: int = 31) -> str:
        path = tmp_path / f"{key}-{seed}.bin"
        path.write_bytes(synthetic_ifwi(seed, part_key=key))
        return str(path)
    return make


def test_same_part_is_written_and_both_part_numbers_are_on_record(cli, cli_shown, db, make_board, image_for):
    board = make_board(transport="ideal")                 # synthetic content: part SYNTH-0001
    image = image_for()
    r = cli_shown("flash", image, "--yes", *RANGE, "--board", f"sim:{board}")
    assert r.code == 0, r.err
    assert "part number check: same" in r.out
    [(event, detail)] = stage_rows(db)
    assert event == "end" and detail["outcome"] == "same"
    assert detail["image_part"] == "SYNTH-0001-102" and detail["board_part"] == "SYNTH-0001-102"
    assert detail["board_state"] == "found" and detail["board_detail"] == "partition A"


def test_another_boards_image_is_refused_before_anything_is_written(cli, db, make_board, image_for):
    board = make_board(transport="ideal")
    before = flash_content(board)
    r = cli("flash", image_for("SYNTH-0002"), "--yes", "--board", f"sim:{board}")
    assert r.code == 2
    assert "SYNTH-0002-102" in r.err and "SYNTH-0001-102" in r.err and "--force" in r.err
    assert flash_content(board) == before and writes_of_last_run(db) == 0
    [(event, detail)] = stage_rows(db)
    assert event == "refuse" and detail["outcome"] == "refused" and detail["board_part"] == "SYNTH-0001-102"


def test_the_check_reads_only_the_regions_the_walk_needs(cli, db, make_board, image_for):
    board = make_board(transport="ideal")
    assert cli("flash", image_for("SYNTH-0002"), "--yes", "--board", f"sim:{board}").code == 2
    con = sqlite3.connect(db)
    run_id = con.execute("SELECT run_id FROM runs ORDER BY rowid DESC LIMIT 1").fetchone()[0]
    units = {a & ~0xFFF for (a,) in con.execute(
        "SELECT address FROM spi_transactions WHERE run_id = ? AND opcode = 3", [run_id])}
    # EFS, L1 directory, both slot headers, each partition's L2 directory and ATOM image.
    needed = {0x0, 0x2000, 0x12000, 0x13000, 0x20000, 0x21000, 0x100000, 0x101000}
    assert needed <= units
    # Chained RX ends each chain with one more transaction, which only pushes the last
    # capture into the window: it may touch the unit after a region, never anything else.
    assert units - needed <= {u + 0x1000 for u in needed}, sorted(units - needed)


def test_force_writes_another_boards_image_and_says_so(cli, db, make_board, image_for):
    board = make_board(transport="ideal")
    image = image_for("SYNTH-0002")
    r = cli("flash", image, "--yes", "--force", *RANGE, "--board", f"sim:{board}")
    assert r.code == 0, r.err
    assert flash_content(board)[:0x10000] == open(image, "rb").read()[:0x10000]
    [(_, detail)] = stage_rows(db)
    assert detail["outcome"] == "forced" and detail["force"] is True


def test_a_blank_board_needs_expect_part_or_force(cli, db, make_board, image_for):
    board = make_board(content="blank", transport="ideal")
    image = image_for()
    r = cli("flash", image, "--yes", "--board", f"sim:{board}")
    assert r.code == 2 and "blank" in r.err and f"--expect-part {PART_KEY}" in r.err
    assert flash_content(board) == b"\xff" * 0x200000
    r = cli("flash", image, "--yes", "--expect-part", "SYNTH-0002", "--board", f"sim:{board}")
    assert r.code == 2 and "does not match the image" in r.err
    assert flash_content(board) == b"\xff" * 0x200000
    r = cli("flash", image, "--yes", "--expect-part", PART_KEY, *RANGE, "--board", f"sim:{board}")
    assert r.code == 0, r.err
    [(_, detail)] = stage_rows(db)
    assert detail["outcome"] == "expected" and detail["board_state"] == "blank"
    assert detail["expect_part"] == PART_KEY and detail["image_part"] == "SYNTH-0001-102"
    assert flash_content(board)[:0x10000] == open(image, "rb").read()[:0x10000]


def test_a_board_damaged_in_partition_a_is_identified_by_partition_b(cli, db, make_board, image_for):
    content = bytearray(synthetic_ifwi(8))
    content[0x21000:0x22000] = b"\xff" * 0x1000            # partition A's ATOM image erased
    board = make_board(content=bytes(content), transport="ideal")
    r = cli("flash", image_for(), "--yes", *RANGE, "--board", f"sim:{board}")
    assert r.code == 0, r.err
    [(_, detail)] = stage_rows(db)
    assert detail["outcome"] == "same" and detail["board_part"] == "SYNTH-0001-101"
    assert detail["board_detail"].startswith("partition B")


def test_an_image_without_a_part_number_needs_force(cli, db, make_board, tmp_path):
    board = make_board(transport="ideal")
    dense = tmp_path / "dense.bin"
    dense.write_bytes(b"\xaa\x55\xaa\x55" + os.urandom(0x200000 - 4))
    r = cli("flash", dense, "--yes", "--board", f"sim:{board}")
    assert r.code == 2 and "part number cannot be read" in r.err
    r = cli("flash", dense, "--yes", "--force", *RANGE, "--board", f"sim:{board}")
    assert r.code == 0, r.err
    [(_, detail)] = stage_rows(db)
    assert detail["outcome"] == "forced" and detail["image_part"] is None
