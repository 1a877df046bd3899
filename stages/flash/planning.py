"""What each erase unit needs, and which erases cover them (pure functions, no I/O).

* a unit whose content already equals the image is skipped;
* a unit that only needs bits cleared (1 -> 0) is programmed without erasing, and only its
  differing pages are programmed;
* otherwise it is erased, with the largest aligned erase that covers only units needing
  an erase; after an erase, all-0xFF pages are not programmed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

Action = Literal["skip", "program", "erase"]


@dataclass(frozen=True)
class UnitPlan:
    address: int
    size: int
    action: Action
    pages: tuple[int, ...]        # absolute addresses of the pages to program
    wanted: bytes

    @property
    def label(self) -> str:
        return {"skip": "skip", "program": "program", "erase": "erase+program"}[self.action]


@dataclass(frozen=True)
class Erase:
    address: int
    size: int


def unit_action(current: bytes, wanted: bytes) -> Action:
    if current == wanted:
        return "skip"
    # Programming can only clear bits: possible without erase iff wanted has no 1 where current has 0.
    c = int.from_bytes(current, "big")
    w = int.from_bytes(wanted, "big")
    return "program" if c & w == w else "erase"


def plan_unit(address: int, current: bytes, wanted: bytes, page_size: int) -> UnitPlan:
    action = unit_action(current, wanted)
    if action == "skip":
        pages: tuple[int, ...] = ()
    elif action == "program":
        pages = tuple(address + o for o in range(0, len(wanted), page_size)
                      if current[o:o + page_size] != wanted[o:o + page_size])
    else:
        blank = b"\xff" * page_size
        pages = tuple(address + o for o in range(0, len(wanted), page_size)
                      if wanted[o:o + page_size] != blank)
    return UnitPlan(address, len(wanted), action, pages, wanted)


def cover(units: Sequence[UnitPlan], erase_sizes: Sequence[int]) -> list[Erase]:
    """Erases for the units of one largest-erase block: the largest aligned erase whose
    every unit needs erasing, recursively smaller elsewhere."""
    needs = {u.address for u in units if u.action == "erase"}
    if not needs:
        return []
    unit = min(erase_sizes)
    sizes = sorted(erase_sizes, reverse=True)
    erases: list[Erase] = []

    def fill(base: int, level: int) -> None:
        size = sizes[level]
        for start in range(base, base + (sizes[level - 1] if level else size), size):
            covered = range(start, start + size, unit)
            if not any(a in needs for a in covered):
                continue
            if all(a in needs for a in covered):
                erases.append(Erase(start, size))
            else:
                fill(start, level + 1)

    block = sizes[0]
    for base in sorted({a - a % block for a in needs}):
        fill(base, 0)
    return erases
