"""Planning: what each unit needs, and the quickest erases to cover them, against brute force."""
from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amdflash.stages.drivers.flash.planning import Erase, PlanCosts, UnitPlan, apply_cover, cover, plan_unit, unit_action

UNIT, SIZES = 0x1000, (0x1000, 0x8000, 0x10000)


def unit(address: int, action: str) -> UnitPlan:
    return UnitPlan(address, UNIT, action, (), b"")  # type: ignore[arg-type]


# A small geometry for brute force: units of 1, erases of 1, 2 and 4 units, blocks of 4.
SMALL_UNIT, SMALL_SIZES = 0x100, (0x100, 0x200, 0x400)
PAGES_PER_UNIT = 1


def small_costs(busy: tuple[float, float, float], page: float, unit_read: float) -> PlanCosts:
    return PlanCosts(dict(zip(SMALL_SIZES, busy)), page, unit_read)


def brute_force(units: list[UnitPlan], costs: PlanCosts) -> float:
    """The least time over every set of aligned erases that covers the units needing one and
    no unit outside the job (overlapping erases included)."""
    present = {u.address: u for u in units}
    candidates = []
    for size in SMALL_SIZES:
        for base in range(0, 2 * 0x400, size):
            covered = range(base, base + size, SMALL_UNIT)
            if all(a in present for a in covered):
                candidates.append((base, size))
    best = float("inf")
    for chosen in itertools.product((False, True), repeat=len(candidates)):
        erases = [c for c, on in zip(candidates, chosen) if on]
        erased = {a for base, size in erases for a in range(base, base + size, SMALL_UNIT)}
        if any(u.action == "erase" and u.address not in erased for u in units):
            continue
        t = sum(costs.erase[size] for _, size in erases)
        for u in units:
            if u.address in erased:
                t += PAGES_PER_UNIT * costs.page + costs.unit_read
            elif u.action == "program":
                t += len(u.pages) * costs.page + costs.unit_read
        best = min(best, t)
    return best


def cost_of(units: list[UnitPlan], erases: list, costs: PlanCosts) -> float:
    erased = {a for e in erases for a in range(e.address, e.address + e.size, SMALL_UNIT)}
    t = sum(costs.erase[e.size] for e in erases)
    for u in units:
        if u.address in erased:
            t += PAGES_PER_UNIT * costs.page + costs.unit_read
        elif u.action == "program":
            t += len(u.pages) * costs.page + costs.unit_read
    return t


@settings(max_examples=300, deadline=None)
@given(actions=st.lists(st.sampled_from(["skip", "program", "erase", None]), min_size=8, max_size=8),
       busy=st.tuples(*(st.floats(0.001, 1.0) for _ in range(3))),
       page=st.floats(0.0, 0.1), unit_read=st.floats(0.0, 0.1))
@pytest.mark.slow   # a long scenario: CI runs it (pytest -m slow)
def test_cover_is_the_quickest_against_brute_force(actions, busy, page, unit_read):
    # Two blocks of four units; None = the unit is not part of the job.
    costs = small_costs(busy, page, unit_read)
    units = [UnitPlan(i * SMALL_UNIT, SMALL_UNIT, a, (i * SMALL_UNIT,) if a == "program" else (), b"")  # type: ignore[arg-type]
             for i, a in enumerate(actions) if a is not None]
    erases = cover(units, SMALL_SIZES, costs)
    erased = {a for e in erases for a in range(e.address, e.address + e.size, SMALL_UNIT)}
    present = {u.address for u in units}
    assert all(u.address in erased for u in units if u.action == "erase")   # every unit that needs one
    assert erased <= present                                                 # nothing outside the job
    assert len(erased) == sum(e.size // SMALL_UNIT for e in erases)          # no overlaps
    for e in erases:
        assert e.address % e.size == 0 and e.size in SMALL_SIZES
    assert cost_of(units, erases, costs) == pytest.approx(brute_force(units, costs), rel=1e-9, abs=1e-12)


def test_one_large_erase_beats_many_small_ones_even_over_equal_units():
    # 15 units need an erase, one in the middle is already equal: erasing the whole 64 KiB
    # and programming that unit again is quicker than 4K and 32K erases around it.
    units = [unit(i * UNIT, "skip" if i == 5 else "erase") for i in range(16)]
    assert cover(units, SIZES) == [Erase(0, 0x10000)]
    planned = apply_cover([UnitPlan(u.address, UNIT, u.action, (), b"\x00" * UNIT) for u in units], [Erase(0, 0x10000)])
    sacrificed = planned[5]
    assert sacrificed.action == "erase" and sacrificed.sacrificed and len(sacrificed.pages) == 16


def test_a_lone_unit_gets_a_small_erase_and_programmable_units_are_not_erased():
    units = [unit(i * UNIT, "program" if i < 8 else "skip") for i in range(16)]
    units[9] = unit(9 * UNIT, "erase")
    assert cover(units, SIZES) == [Erase(9 * UNIT, UNIT)]


def test_a_range_edge_is_never_crossed():
    # The job covers units 4..15 of the block only: no erase may take in units 0..3.
    units = [unit(i * UNIT, "erase") for i in range(4, 16)]
    erases = cover(units, SIZES)
    assert min(e.address for e in erases) >= 4 * UNIT
    assert sorted(a for e in erases for a in range(e.address, e.address + e.size, UNIT)) == [u.address for u in units]


@given(current=st.binary(min_size=16, max_size=16), wanted=st.binary(min_size=16, max_size=16))
def test_unit_action_matches_the_bit_rules(current, wanted):
    action = unit_action(current, wanted)
    if current == wanted:
        assert action == "skip"
    elif all(c & w == w for c, w in zip(current, wanted)):
        assert action == "program"
    else:
        assert action == "erase"


def test_plan_unit_lists_the_pages_to_program():
    page = 0x100
    current = bytearray(b"\xff" * UNIT)
    wanted = bytearray(current)
    wanted[0x200:0x210] = bytes(16)                              # one page needs bits cleared
    p = plan_unit(0x5000, bytes(current), bytes(wanted), page)
    assert p.action == "program" and p.pages == (0x5200,)
    current[0x300] = 0x00                                        # a 0 where the image has 1: erase
    p = plan_unit(0x5000, bytes(current), bytes(wanted), page)
    assert p.action == "erase" and p.pages == (0x5200,)          # after erase only non-FF pages
