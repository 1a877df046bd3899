"""What each erase unit needs, and which erases cover them (pure functions, no I/O).

* a unit whose content already equals the image is skipped;
* a unit that only needs bits cleared (1 -> 0) is programmed without erasing, and only its
  differing pages are programmed;
* otherwise it must be erased; after an erase, all-0xFF pages are not programmed.

Which erases, is a question of time, not of count: among all covers by aligned erases
(64 KiB, 32 KiB, 4 KiB) that take in every unit needing one and nothing outside the job,
`cover` picks the one with the least typical busy plus transfer time. A larger erase may
take in units that did not need it — units already equal, or programmable without erase —
when erasing and re-programming them is quicker than the smaller erases around them
(one 64 KiB erase is 250 ms, sixteen 4 KiB erases are 800 ms). A unit taken in that way
is then programmed like any erased unit and verified like any written one.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal
from collections.abc import Mapping, Sequence

from amdflash.stages.drivers.flash.chips import GD25LQ16E, ChipInfo
from amdflash.stages.drivers.flash.geometry import PAGE

Action = Literal["skip", "program", "erase"]


@dataclass(frozen=True)
class UnitPlan:
    address: int
    size: int
    action: Action
    pages: tuple[int, ...]        # absolute addresses of the pages to program
    wanted: bytes
    sacrificed: bool = False      # erased only because a larger erase around it is quicker

    @property
    def label(self) -> str:
        return {"skip": "skip", "program": "program", "erase": "erase+program"}[self.action]


@dataclass(frozen=True)
class Erase:
    address: int
    size: int


@dataclass(frozen=True)
class PlanCosts:
    """Typical seconds of each kind of work, for choosing erases.

    `erase`: one erase of each size, busy time plus its commands; `page`: programming one
    page, busy time plus transfer; `unit_read`: reading one written unit back to verify it.
    """

    erase: Mapping[int, float]
    page: float
    unit_read: float

    @classmethod
    def for_chip(cls, chip: ChipInfo) -> PlanCosts:
        """The chip's typical busy times plus what the USB bridge adds (about 1 ms per erase
        command, 0.7 ms per page and 12 ms per unit read back)."""
        facts = chip.write_facts()
        return cls({size: typical + 1e-3 for size, typical in facts.erase_typical.items()},
                   facts.page_program + 0.7e-3, 12e-3)


DEFAULT_COSTS = PlanCosts.for_chip(GD25LQ16E)     # when the caller gives no costs


def unit_action(current: bytes, wanted: bytes) -> Action:
    if current == wanted:
        return "skip"
    # Programming can only clear bits: possible without erase iff wanted has no 1 where current has 0.
    c = int.from_bytes(current, "big")
    w = int.from_bytes(wanted, "big")
    return "program" if c & w == w else "erase"


def written_pages(address: int, wanted: bytes, page_size: int = PAGE) -> tuple[int, ...]:
    """Pages to program after an erase: those not left all 0xFF."""
    blank = b"\xff" * page_size
    return tuple(address + o for o in range(0, len(wanted), page_size) if wanted[o:o + page_size] != blank)


def plan_unit(address: int, current: bytes, wanted: bytes, page_size: int) -> UnitPlan:
    action = unit_action(current, wanted)
    if action == "skip":
        pages: tuple[int, ...] = ()
    elif action == "program":
        pages = tuple(address + o for o in range(0, len(wanted), page_size)
                      if current[o:o + page_size] != wanted[o:o + page_size])
    else:
        pages = written_pages(address, wanted, page_size)
    return UnitPlan(address, len(wanted), action, pages, wanted)


def _erased_pages(u: UnitPlan) -> int:
    if u.action == "erase":
        return len(u.pages)
    # Only the caller's `wanted` knows; an empty `wanted` (tests that plan by action) counts a full unit.
    if not u.wanted:
        return u.size // PAGE
    return len(written_pages(u.address, u.wanted))


def cover(units: Sequence[UnitPlan], erase_sizes: Sequence[int],
          costs: PlanCosts | None = None) -> list[Erase]:
    """The quickest set of aligned erases for `units` (the job's units of any number of
    largest-erase blocks): every unit needing an erase is covered, no erase reaches a unit
    outside `units`. Ties go to the cover that erases less.

    Erase sizes must each divide the next (as SPI NOR erase sizes do). An exact search over
    the aligned hierarchy: each block is either erased whole or split into the next size.
    """
    costs = costs or DEFAULT_COSTS
    sizes = sorted(erase_sizes)
    by_address = {u.address: u for u in units}
    unit = sizes[0]

    def keep(u: UnitPlan) -> float:
        if u.action == "erase":
            return float("inf")
        if u.action == "skip":
            return 0.0
        return len(u.pages) * costs.page + costs.unit_read

    def erased(u: UnitPlan) -> float:
        return _erased_pages(u) * costs.page + costs.unit_read

    def best(start: int, level: int) -> tuple[float, list[Erase]]:
        size = sizes[level]
        present = [by_address.get(a) for a in range(start, start + size, unit)]
        inside = [u for u in present if u is not None]
        if not inside:
            return 0.0, []
        if level == 0:
            split: tuple[float, list[Erase]] = (keep(inside[0]), [])
        else:
            child = sizes[level - 1]
            total, erases = 0.0, []
            for s in range(start, start + size, child):
                c, e = best(s, level - 1)
                total += c
                erases += e
            split = (total, erases)
        if len(inside) == len(present):
            whole = costs.erase[size] + sum(erased(u) for u in inside)
            if whole < split[0] - 1e-12:
                return whole, [Erase(start, size)]
        return split

    top = sizes[-1]
    result: list[Erase] = []
    for base in sorted({a - a % top for a in by_address}):
        result += best(base, len(sizes) - 1)[1]
    return result


def apply_cover(units: Sequence[UnitPlan], erases: Sequence[Erase], page_size: int = PAGE) -> list[UnitPlan]:
    """The units as the cover leaves them: every unit inside an erase is erased, and programs
    the pages of its image that are not all 0xFF."""
    out = []
    for u in units:
        inside = any(e.address <= u.address < e.address + e.size for e in erases)
        if inside and u.action != "erase":
            u = replace(u, action="erase", pages=written_pages(u.address, u.wanted, page_size), sacrificed=True)
        out.append(u)
    return out
