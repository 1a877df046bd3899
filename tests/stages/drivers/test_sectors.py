"""Sector-range flashing through the drivers: content, skipping, CMP permission, faults."""
from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.flash_sectors import SectorVerifyError, flash_sectors
from amdflash.stages.drivers.flash.spinor import ProtectedError

MiB2, UNIT = 0x200000, 0x1000
FIRST = 100          # the sectors the property test works on
COUNT = 6


def unit_variant(kind: str, current: bytes, rnd: bytes) -> bytes:
    if kind == "equal":
        return current
    if kind == "clear-bits":                       # only 1 -> 0 changes: programmable without erase
        return bytes(c & r for c, r in zip(current, rnd))
    if kind == "some-pages":                       # a few pages differ arbitrarily
        out = bytearray(current)
        out[0x300:0x500] = rnd[0x300:0x500]
        return bytes(out)
    return rnd                                     # all different


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kinds=st.lists(st.sampled_from(["equal", "clear-bits", "some-pages", "random"]), min_size=COUNT, max_size=COUNT),
       seed=st.integers(0, 2**32 - 1))
def test_flash_then_dump_returns_the_target_and_matching_units_are_untouched(open_board, kinds, seed):
    import random

    rng = random.Random(seed)
    current = bytearray(rng.randbytes(MiB2))
    target = bytearray(current)
    for i, kind in enumerate(kinds):
        a = (FIRST + i) * UNIT
        target[a:a + UNIT] = unit_variant(kind, bytes(current[a:a + UNIT]), rng.randbytes(UNIT))
    o = open_board(content=bytes(current), profile="ideal")
    with o.engine:
        o.nor.identify()
        results = flash_sectors(o.nor, bytes(target), FIRST, COUNT)
    assert bytes(o.board.files.flash) == bytes(target)
    touched = {a - a % UNIT for _, a in o.writes_to_flash()}
    for i, kind in enumerate(kinds):
        a = (FIRST + i) * UNIT
        if kind == "equal":
            assert results[i].action == "skip"
        if current[a:a + UNIT] == target[a:a + UNIT]:
            assert a not in touched and results[i].action == "skip"
        if kind == "clear-bits" and current[a:a + UNIT] != target[a:a + UNIT]:
            assert results[i].action == "program"
            assert (0x20, a) not in o.writes_to_flash()


def test_stuck_bit_fails_verify_naming_the_address_and_both_bytes(open_board):
    image = bytearray(os.urandom(MiB2))
    image[0x5123] = 0x00
    o = open_board(content="blank", faults=["stuck-bit=0x5123:4"], profile="ideal")
    with o.engine:
        o.nor.identify()
        with pytest.raises(SectorVerifyError) as e:
            flash_sectors(o.nor, bytes(image), 5, 1)
    assert e.value.address == 0x5123
    assert (e.value.flash_byte, e.value.image_byte) == (0x10, 0x00)
    assert "0x005123" in str(e.value) and "flash=10 image=00" in str(e.value)


def test_cmp_needs_permission_and_is_cleared_only_with_it(open_board):
    image = os.urandom(MiB2)
    o = open_board(content="blank", cmp=True, profile="ideal")
    with o.engine:
        o.nor.identify()
        with pytest.raises(ProtectedError, match="CMP"):
            flash_sectors(o.nor, image, 0, 1)
        assert o.writes_to_flash() == []
        flash_sectors(o.nor, image, 0, 1, clear_cmp=True)
        assert not o.nor.status(0x35) & 0x40
    assert bytes(o.board.files.flash[:UNIT]) == image[:UNIT]


def test_block_protection_is_refused_before_any_write(open_board):
    o = open_board(content="blank", bp=1, profile="ideal")   # top 64 KiB
    with o.engine:
        o.nor.identify()
        with pytest.raises(ProtectedError):
            flash_sectors(o.nor, os.urandom(MiB2), 500, 12)
    assert o.writes_to_flash() == []


def test_invalid_ranges_are_refused(open_board):
    o = open_board(profile="ideal")
    with o.engine:
        o.nor.identify()
        for start, count in ((512, 1), (0, 0), (500, 13), (-1, 1)):
            with pytest.raises(ValueError):
                flash_sectors(o.nor, bytes(MiB2), start, count)
        with pytest.raises(ValueError):
            flash_sectors(o.nor, bytes(100), 0, 1)
