"""The pipeline's planning, property-tested end to end: for random current contents and
target images, `amdflash flash` leaves exactly the target, and units that already matched
(or needed programming only) are erased only when an erase around them was the quicker
choice, which the audit trail says (checked from the SPI transactions in the audit trail)."""
from __future__ import annotations

import json
import random
import sqlite3

import pytest
from amdflash.stages.drivers.flash.planning import unit_action
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.pipeline.engine.conftest import flash_content

UNIT, FIRST, COUNT = 0x1000, 32, 16      # one whole 64 KiB block
ERASE = {0x20: 0x1000, 0x52: 0x8000, 0xD8: 0x10000}
KINDS = ["equal", "clear-bits", "some-pages", "random"]


def variant(kind: str, current: bytes, rnd: bytes) -> bytes:
    if kind == "equal":
        return current
    if kind == "clear-bits":
        return bytes(c & r for c, r in zip(current, rnd))
    if kind == "some-pages":
        out = bytearray(current)
        out[0x400:0x600] = rnd[0x400:0x600]
        return bytes(out)
    return rnd


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kinds=st.lists(st.sampled_from(KINDS), min_size=COUNT, max_size=COUNT), seed=st.integers(0, 2**32 - 1))
def test_flash_leaves_the_target_and_never_touches_matching_units(cli, make_board, tmp_path, db, kinds, seed):
    rng = random.Random(seed)
    current = bytearray(rng.randbytes(0x200000))
    current[:4] = b"\xaa\x55\xaa\x55"
    target = bytearray(current)
    for i, kind in enumerate(kinds):
        a = (FIRST + i) * UNIT
        target[a:a + UNIT] = variant(kind, bytes(current[a:a + UNIT]), rng.randbytes(UNIT))
    image = tmp_path / f"target-{seed}.bin"
    image.write_bytes(target)
    board = make_board(content=bytes(current), transport="ideal")
    r = cli("flash", image, "--yes", "--start-sector", FIRST, "--sector-count", COUNT, "--force",
            "--board", f"sim:{board}")
    assert r.code == 0, r.err
    assert flash_content(board) == bytes(target)

    run_id = json.loads(cli("runs", "--format", "json").out)[-1]["run_id"]
    con = sqlite3.connect(db)
    touched: set[int] = set()
    for opcode, address in con.execute("SELECT opcode, address FROM spi_transactions WHERE run_id = ? "
                                       "AND opcode IN (2, 32, 82, 216)", [run_id]):
        size = ERASE.get(opcode, 0x100)
        touched |= set(range(address - address % UNIT, address + size, UNIT))
    matched = {(FIRST + i) * UNIT for i in range(COUNT)
               if current[(FIRST + i) * UNIT:(FIRST + i + 1) * UNIT] == target[(FIRST + i) * UNIT:(FIRST + i + 1) * UNIT]}
    erased: set[int] = set()
    for opcode, address in con.execute("SELECT opcode, address FROM spi_transactions WHERE run_id = ? "
                                       "AND opcode IN (32, 82, 216)", [run_id]):
        erased |= set(range(address, address + ERASE[opcode], UNIT))
    sacrificed = {a for (a,) in con.execute("SELECT address FROM units WHERE run_id = ? AND state = 'planned' "
                                            "AND detail LIKE '%erased with the units around it%'", [run_id])}
    # A matching unit is written only as part of a quicker erase, and the plan says so.
    assert matched & touched <= erased & sacrificed
    # Units that only needed bits cleared were programmed, not erased, unless the same holds.
    for i, kind in enumerate(kinds):
        a = (FIRST + i) * UNIT
        if kind == "clear-bits" and a in erased:
            assert a in sacrificed
    # And every sacrifice lies inside an erase that also took in a unit needing one.
    needing = {(FIRST + i) * UNIT for i, kind in enumerate(kinds) if kind == "random"
               and unit_needs_erase(current, target, (FIRST + i) * UNIT)}
    assert not sacrificed or needing


def unit_needs_erase(current: bytes, target: bytes, address: int) -> bool:
    return unit_action(current[address:address + UNIT], target[address:address + UNIT]) == "erase"
