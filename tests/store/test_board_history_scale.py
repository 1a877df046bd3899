"""Issue 42: a board's history costs what a new board's does, however often the line flashed it.

`board_history` (store.originals: what `info`, `flash`, `resume` and `restore-original` ask of
a board) verified every earlier flash of the board whole, so each flash of a board cost all
the flashes before it again. Now only the board's original and its newest flash are verified
whole; every flash in between is checked only where its answer lies (store.sealed_facts:
its runs row, the boards row naming the board, its end, each segment rebuilt against the head
its checkpoint signed). The trail: one emulated board, one whole flash (its original), then
small range flashes of one sector each, in this process (fast).

The tamper tests edit a run with sqlite3 (the append-only triggers dropped and put back) and
check that the edited fact is never taken: they pass before the change too (it verified every
run whole) and guard the cheap check against taking any edited fact on faith.
"""
from __future__ import annotations

import random
import sqlite3
from dataclasses import dataclass
from pathlib import Path

import pytest

from amdflash.pipeline.cli.main import main
from amdflash.stages.sim import create_board
from amdflash.stages.sim.synth import PART_KEY, synthetic_ifwi
from tests.support import cli

SECTOR = 256               # the one sector each range flash writes
FEW, MANY = 2, 6           # range flashes after the whole one


def amdflash(db: Path, *args: object) -> int:
    return main(["-q", "--db", str(db), *map(str, args)])


@dataclass
class Line:
    root: Path
    board: Path
    other: Path                  # a second board, flashed once
    image: Path
    few: Path                    # the trail after the whole flash and FEW range flashes
    many: Path                   # ... and MANY
    runs: list[str]              # the board's flash runs in `many`, oldest first
    refused: str                 # a flash of the board refused (wrong part): it wrote nothing
    info_run: str                # an info run of the board
    other_run: str               # the other board's flash


def _copy(src: Path, dst: Path) -> Path:
    a, b = sqlite3.connect(src), sqlite3.connect(dst)
    a.backup(b)
    a.close()
    b.close()
    return dst


def _runs(db: Path, command: str) -> list[str]:
    con = sqlite3.connect(db)
    try:
        return [r for (r,) in con.execute("SELECT run_id FROM runs WHERE command = ? ORDER BY seq", (command,))]
    finally:
        con.close()


@pytest.fixture(scope="module")
def line(tmp_path_factory: pytest.TempPathFactory) -> Line:
    root = tmp_path_factory.mktemp("history")
    db = root / "audit.sqlite"
    base = synthetic_ifwi(1234)
    image = root / "image.bin"
    image.write_bytes(base)
    first = bytearray(base)
    first[0:0x1000] = bytes(0x1000)            # the whole flash has a unit to write
    board = create_board(root / "board", content=bytes(first), transport="ideal", seed=3)
    other = create_board(root / "other", content=bytes(first), transport="ideal", seed=4)
    spec = f"sim:{board}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AMDFLASH_LOCK_DIR", str(root / "locks"))
        mp.delenv("AMDFLASH_DB", raising=False)
        # --reads 1: the backup read once (the slow part of a whole flash of the emulator)
        assert amdflash(db, "flash", image, "--yes", "--reads", 1, "--expect-part", PART_KEY, "--board", spec) == 0
        assert amdflash(db, "flash", image, "--yes", "--expect-part", "NOT-THIS-PART", "--board", spec) == 2
        assert amdflash(db, "flash", image, "--yes", "--force", "--start-sector", SECTOR, "--sector-count", 1,
                        "--board", f"sim:{other}") == 0
        assert amdflash(db, "info", "--board", spec) == 0
        few = root / "few.sqlite"
        for n in range(MANY):
            data = bytearray(base)
            data[SECTOR * 0x1000:(SECTOR + 1) * 0x1000] = random.Random(n).randbytes(0x1000)
            ranged = root / f"range{n}.bin"
            ranged.write_bytes(data)
            assert amdflash(db, "flash", ranged, "--yes", "--force", "--start-sector", SECTOR, "--sector-count", 1,
                            "--board", spec) == 0
            if n + 1 == FEW:
                _copy(db, few)
    flashes = _runs(db, "flash")
    return Line(root, board, other, image, few, db, [flashes[0], *flashes[3:]], flashes[1],
                _runs(db, "info")[0], flashes[2])


def _key(line: Line):
    from amdflash.store.originals import BoardKey

    con = sqlite3.connect(line.many)
    try:
        uid, chip = con.execute("SELECT unique_id, chip FROM boards WHERE run_id = ? AND chip IS NOT NULL",
                                (line.runs[0],)).fetchone()
    finally:
        con.close()
    return BoardKey(uid, chip, f"sim:{line.board}")


def _whole_verifies(monkeypatch: pytest.MonkeyPatch, path: Path, line: Line):
    """(board_history of the board in the trail at `path`, the runs it verified whole)."""
    from amdflash.store import run_rows
    from amdflash.store.originals import board_history

    verified: list[str] = []
    real = run_rows.verify_run

    def counting(conn, run_id, keyfiles=None):
        verified.append(run_id)
        return real(conn, run_id, keyfiles)

    monkeypatch.setattr(run_rows, "verify_run", counting)
    history = board_history(str(path), _key(line))
    monkeypatch.undo()
    return history, verified


def test_a_boards_history_verifies_as_many_runs_whole_after_many_flashes_as_after_few(line, monkeypatch):
    """The cost that does not depend on the machine: the runs verified whole (each O(its
    rows)) are the same few — the original and the newest flash — after 2 or 6 flashes since."""
    few, verified_few = _whole_verifies(monkeypatch, line.few, line)
    many, verified_many = _whole_verifies(monkeypatch, line.many, line)
    assert len(few.writes) == 1 + FEW and many.writes == tuple(line.runs), many.writes
    assert len(verified_many) == len(verified_few), (verified_few, verified_many)
    assert set(verified_many) <= {line.runs[0], line.runs[-1]}, verified_many


def test_each_flash_in_between_is_checked_only_where_its_answer_lies(line):
    """A flash between the original and the newest is answered from at most three of its
    segments (its runs row, the boards row naming the board, its end), fewer rows than it holds."""
    from amdflash.store.queries import open_readonly
    from amdflash.store.sealed_facts import SealedFacts
    from amdflash.store.verify import snapshot, verify_run

    key = _key(line)
    db = open_readonly(str(line.many))
    try:
        with snapshot(db.conn):
            facts = SealedFacts(db.conn)
            for run in line.runs[1:-1]:
                ended = facts.ended(run, (key.unique_id, key.chip))
                assert ended is not None and ended.status == "succeeded" and ended.command == "flash", run
                assert ended.segments <= 3
                whole = verify_run(db.conn, run)
                assert ended.segments < ended.of and ended.rows < whole.rows, (ended, whole.rows)
    finally:
        db.conn.close()


# -- tampered runs: the edited fact is never taken -----------------------------------------------

def _tampered(line: Line, tmp_path: Path, *statements: tuple[str, tuple]) -> Path:
    from amdflash.store.schema import add_triggers, drop_triggers

    db = _copy(line.many, tmp_path / "tampered.sqlite")
    con = sqlite3.connect(db)
    drop_triggers(con)
    for sql, args in statements:
        assert con.execute(sql, args).rowcount >= 1, sql
    add_triggers(con)
    con.commit()
    con.close()
    return db


def _info(line: Line, db: Path) -> str:
    r = cli.run("--no-progress", "--db", db, "info", "--board", f"sim:{line.board}")
    assert r.code == 0, r.err
    return r.out


def _written_since(line: Line, count: int) -> str:
    return f"written since by {count} flash runs, the last {line.runs[-1]}\n"


def test_info_counts_every_flash_since_the_original(line, tmp_path):
    assert _written_since(line, MANY) in _info(line, _copy(line.many, tmp_path / "copy.sqlite"))


def test_a_refused_flash_whose_status_row_was_edited_to_succeeded_is_not_counted(line, tmp_path):
    db = _tampered(line, tmp_path, ("UPDATE run_status SET status = 'succeeded' WHERE run_id = ? AND "
                                    "status = 'refused'", (line.refused,)))
    assert _written_since(line, MANY) in _info(line, db)


def test_an_info_run_edited_into_a_flash_is_not_counted(line, tmp_path):
    db = _tampered(line, tmp_path, ("UPDATE runs SET command = 'flash' WHERE run_id = ?", (line.info_run,)))
    assert _written_since(line, MANY) in _info(line, db)


def test_another_boards_flash_edited_to_name_this_board_is_not_counted(line, tmp_path):
    key = _key(line)
    db = _tampered(line, tmp_path, ("UPDATE boards SET unique_id = ?, chip = ? WHERE run_id = ?",
                                    (key.unique_id, key.chip, line.other_run)))
    assert _written_since(line, MANY) in _info(line, db)


def test_a_flash_whose_end_was_edited_is_not_counted(line, tmp_path):
    """A flash in between whose end says something else now (its final segment no longer
    rebuilds its signed head): verified whole, it does not verify, so it is not counted."""
    middle = line.runs[2]
    db = _tampered(line, tmp_path, ("UPDATE run_status SET detail = 'edited' WHERE run_id = ? AND status = 'succeeded'",
                                    (middle,)))
    assert _written_since(line, MANY - 1) in _info(line, db)


def test_a_row_added_after_a_flashs_final_checkpoint_is_not_counted(line, tmp_path):
    middle = line.runs[2]
    db = _tampered(line, tmp_path, ("INSERT INTO stages (seq, run_id, stage, event, detail, at) SELECT "
                                    "(SELECT max(seq) FROM runs) + 100000, ?, 'erase', 'start', '', ''", (middle,)))
    assert _written_since(line, MANY - 1) in _info(line, db)


def test_a_flash_given_a_second_runs_row_is_not_counted(line, tmp_path):
    """A runs row INSERTed with a flash's id (a row outside every span its checkpoints seal):
    the flash does not verify, as `audit verify --run` says, and is not counted."""
    middle = line.runs[2]
    db = _tampered(line, tmp_path, ("INSERT INTO runs (seq, run_id, command, arguments, operator, host, board_spec, "
                                    "at) SELECT (SELECT max(seq) FROM runs) + 100000, run_id, command, arguments, "
                                    "operator, host, board_spec, at FROM runs WHERE run_id = ?", (middle,)))
    assert _written_since(line, MANY - 1) in _info(line, db)


def test_the_newest_flash_whose_end_was_edited_is_named_as_not_verifying(line, tmp_path):
    """The newest flash still speaks only when it verifies whole: its edited end neither hides
    it nor makes it finished — the board's history names it as one whose record does not
    verify (what `flash` refuses over and `info` names; `info` itself stops at it earlier)."""
    from amdflash.store.originals import board_history

    newest = line.runs[-1]
    db = _tampered(line, tmp_path, ("UPDATE run_status SET status = 'interrupted' WHERE run_id = ? AND "
                                    "status = 'succeeded'", (newest,)))
    gone = board_history(str(db), _key(line)).unfinished
    assert gone is not None and gone.run_id == newest and gone.written is None, gone


def test_an_edited_backup_row_of_the_original_is_never_named_as_the_original(line, tmp_path):
    first = line.runs[0]
    db = _tampered(line, tmp_path, ("UPDATE backups SET path = '/tmp/elsewhere.bin' WHERE run_id = ?", (first,)))
    out = _info(line, db)
    assert "/tmp/elsewhere.bin" not in out and f"(run {first}," not in out, out
