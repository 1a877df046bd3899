"""Planning: what each unit needs and which erases cover them, against brute force."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from amdflash.stages.flash.planning import UnitPlan, cover, plan_unit, unit_action

UNIT, SIZES = 0x1000, (0x1000, 0x8000, 0x10000)


def unit(address: int, action: str) -> UnitPlan:
    return UnitPlan(address, UNIT, action, (), b"")  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(actions=st.lists(st.sampled_from(["skip", "program", "erase", None]), min_size=32, max_size=32))
def test_cover_erases_exactly_the_units_that_need_it_with_the_largest_aligned_erases(actions):
    # Two 64K blocks; None = the unit is not part of the job.
    units = [unit(i * UNIT, a) for i, a in enumerate(actions) if a is not None]
    needs = {u.address for u in units if u.action == "erase"}
    erases = cover(units, SIZES)
    covered = [a for e in erases for a in range(e.address, e.address + e.size, UNIT)]
    assert sorted(covered) == sorted(needs)                     # every needy unit once, nothing else
    for e in erases:
        assert e.address % e.size == 0 and e.size in SIZES
        # Largest: the next larger aligned erase around it would take in a unit that does not need one.
        for bigger in (s for s in SIZES if s > e.size):
            base = e.address - e.address % bigger
            assert not all(a in needs for a in range(base, base + bigger, UNIT))


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
