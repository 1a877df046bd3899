"""Recorded runs for the review tools, made once per session: flashing is the slow part.

Every run goes through the CLI in this process, on emulated boards on the ideal profile,
into one audit database — as an operator's runs would.
"""
from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path

import pytest

from amdflash.pipeline.cli.main import main
from amdflash.stages.sim import create_board
from amdflash.stages.sim.synth import PART_KEY, synthetic_ifwi

UNIT = 0x1000
ERASED_BLOCK = 0x100000      # a 64 KiB block that needs an erase (board holds zeros there)
PROGRAM_UNIT = 0x21000       # a unit that needs only programming (board holds 0xFF there)
STUCK_UNIT = 0x22000         # the unit whose stuck bit fails verify
STUCK_WORK = 0x30000         # the stuck board differs from the image from here to its end: work the
                             # stages still have queued when the stuck unit fails
PROTECTED_UNIT = 0x3000      # the unit the sector-range run on a BP-protected board erases


@dataclass
class Recorded:
    db: Path
    image: Path
    image_bytes: bytes
    boards: dict[str, Path]
    runs: dict[str, str]          # scenario -> run id
    stuck_address: int
    killed_db: Path               # the clean run as a host that lost power mid-erase leaves it


def amdflash(db: Path, *args: object) -> int:
    return main(["-q", "--db", str(db), *map(str, args)])


def _last_run_id(db: Path) -> str:
    from amdflash.store.queries import open_readonly, runs

    store = open_readonly(str(db))
    try:
        return runs(store)[-1]["run_id"]
    finally:
        store.conn.close()


def _board(root: Path, name: str, content: bytes, **options) -> Path:  # noqa: ANN003
    return create_board(root / name, content=content, transport="ideal", seed=len(name), **options)


@pytest.fixture(scope="session")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    root = tmp_path_factory.mktemp("review")
    db = root / "audit.sqlite"
    image_bytes = synthetic_ifwi(1234)
    image = root / "image.bin"
    image.write_bytes(image_bytes)
    # A path an HTML page must escape.
    odd_image = root / "img <b>&\"q\".bin"
    odd_image.write_bytes(image_bytes)

    clean = bytearray(image_bytes)
    clean[ERASED_BLOCK:ERASED_BLOCK + 0x10000] = bytes(0x10000)
    clean[PROGRAM_UNIT:PROGRAM_UNIT + UNIT] = b"\xff" * UNIT
    stuck = bytearray(image_bytes)
    stuck[STUCK_UNIT:STUCK_UNIT + UNIT] = bytes(UNIT)
    stuck[STUCK_WORK:] = bytes(len(stuck) - STUCK_WORK)
    stuck_address = next(a for a in range(STUCK_UNIT, STUCK_UNIT + UNIT) if not image_bytes[a] & 1)
    protected = bytearray(image_bytes)
    protected[PROTECTED_UNIT:PROTECTED_UNIT + UNIT] = bytes(UNIT)

    boards = {
        "clean": _board(root, "clean", bytes(clean), cmp=True),
        "stuck": _board(root, "stuck", bytes(stuck), faults=[f"stuck-bit={stuck_address:#x}:0"]),
        "protected": _board(root, "protected", bytes(protected), bp=1),
    }
    runs: dict[str, str] = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AMDFLASH_LOCK_DIR", str(root / "locks"))
        mp.delenv("AMDFLASH_DB", raising=False)
        assert amdflash(db, "flash", image, "--yes", "--clear-cmp", "--expect-part", PART_KEY,
                        "--board", f"sim:{boards['clean']}") == 0
        runs["clean"] = _last_run_id(db)
        assert amdflash(db, "flash", image, "--yes", "--expect-part", PART_KEY,
                        "--board", f"sim:{boards['stuck']}") == 1
        runs["stuck"] = _last_run_id(db)
        assert amdflash(db, "flash", odd_image, "--yes", "--start-sector", 0, "--sector-count", 16,
                        "--expect-part", PART_KEY, "--board", f"sim:{boards['protected']}") == 0
        runs["protected"] = _last_run_id(db)
        assert amdflash(db, "info", "--board", f"sim:{boards['clean']}") == 0
        runs["info"] = _last_run_id(db)
    killed = root / "killed.sqlite"
    power_loss_copy(db, killed, _mid_erase_seq(db, runs["clean"]))
    return Recorded(db, image, image_bytes, boards, runs, stuck_address, killed)


def _mid_erase_seq(db: Path, run_id: str) -> int:
    """The seq of the 'programmed' row of the 4th unit of the erased block: some units verified, some not."""
    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT seq FROM units WHERE run_id = ? AND address = ? AND state = 'programmed'",
                           [run_id, ERASED_BLOCK + 3 * UNIT]).fetchone()[0]
    finally:
        con.close()


def power_loss_copy(src: Path, dst: Path, last_seq: int) -> None:
    """The database as a host that lost power after committing row `last_seq` leaves it: every
    row up to it, the checkpoints sealed by then; rows after the last of those are unsealed."""
    from amdflash.store.schema import PHYSICAL, add_triggers, drop_triggers

    source, copy = sqlite3.connect(src), sqlite3.connect(dst)
    source.backup(copy)
    source.close()
    drop_triggers(copy)
    for table in PHYSICAL:
        copy.execute(f"DELETE FROM {table} WHERE seq > ?", [last_seq])
    copy.execute("DELETE FROM checkpoints WHERE last_seq > ?", [last_seq])
    copy.execute("UPDATE chain_head SET seq = ?, checkpoint = (SELECT max(id) FROM checkpoints), "
                 "hash = (SELECT hash FROM checkpoints ORDER BY id DESC LIMIT 1) WHERE id = 1", [last_seq])
    add_triggers(copy)
    copy.commit()
    copy.close()


def board_config(path: Path) -> dict:
    return json.loads((path / "board.json").read_text())
