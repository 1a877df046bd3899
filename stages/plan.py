"""Stage: diff what was read against the image, unit by unit, and stream the work.

The planner holds at most one largest-erase block (64 KiB) of units: enough to choose the
quickest set of aligned erases for it (flash/planning.py). A unit that an erase takes in
although it did not need one ("sacrificed": already equal, or programmable without erase)
is then written and verified like any erased unit; the plan's counts still say what each
unit needed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from amdflash.stages.device import Device
from amdflash.stages.drivers.flash.planning import Erase, PlanCosts, UnitPlan, apply_cover, cover, plan_unit
from amdflash.stages.snapshot import UnitRead

if TYPE_CHECKING:      # annotations only: the stream classes are anyio's (anyio.abc loads ~10 modules)
    from anyio.abc import ObjectReceiveStream, ObjectSendStream


@dataclass
class WorkItem:
    """One destructive step and the units it concerns: an erase, or program-only units."""

    erase: Erase | None
    units: list[UnitPlan] = field(default_factory=list)

    @property
    def address(self) -> int:
        return self.erase.address if self.erase else self.units[0].address


@dataclass
class PlanSummary:
    counts: dict[str, int] = field(default_factory=lambda: {"skip": 0, "program": 0, "erase": 0})
    erases: dict[int, int] = field(default_factory=dict)   # erase size -> count
    written: set[int] = field(default_factory=set)          # units that needed any write
    sacrificed: int = 0                                     # units erased only because it was quicker


async def plan(dev: Device, image: bytes, erase_sizes: list[int], page_size: int,
               reads: ObjectReceiveStream[UnitRead], out: ObjectSendStream[WorkItem],
               summary: PlanSummary, costs: PlanCosts | None = None) -> None:
    block_size = max(erase_sizes)
    block: list[UnitPlan] = []
    async with reads, out:
        async for read in reads:
            if block and block[0].address // block_size != read.address // block_size:
                await _emit(dev, block, erase_sizes, page_size, out, summary, costs)
                block = []
            wanted = image[read.address:read.address + len(read.data)]
            block.append(plan_unit(read.address, read.data, wanted, page_size))
        if block:
            await _emit(dev, block, erase_sizes, page_size, out, summary, costs)


async def _emit(dev: Device, block: list[UnitPlan], erase_sizes: list[int], page_size: int,
                out: ObjectSendStream[WorkItem], summary: PlanSummary, costs: PlanCosts | None) -> None:
    erases = cover(block, erase_sizes, costs)
    planned = apply_cover(block, erases, page_size)
    for need, unit in zip(block, planned):
        _record(dev, need.action, unit, summary)
    items: list[WorkItem] = []
    for erase in erases:
        summary.erases[erase.size] = summary.erases.get(erase.size, 0) + 1
        items.append(WorkItem(erase, [u for u in planned
                                      if erase.address <= u.address < erase.address + erase.size]))
    items += [WorkItem(None, [u]) for u in planned if u.action == "program"]
    for item in sorted(items, key=lambda i: i.address):
        await out.send(item)


def _record(dev: Device, needed: str, unit: UnitPlan, summary: PlanSummary) -> None:
    summary.counts[needed] += 1
    if needed != "skip":
        summary.written.add(unit.address)
    detail = f"{len(unit.pages)} pages"
    if unit.sacrificed:
        summary.sacrificed += 1
        detail += (f" (needed {'no write' if needed == 'skip' else 'programming only'}; "
                   "erased with the units around it, which is quicker)")
    dev.recorder.add("units", address=unit.address, size=unit.size, state="planned", action=unit.label,
                     wanted_sha256=None, detail=detail, clock=dev.clock.now())
    if unit.action == "skip":
        # Reading it equal to the image is its verification.
        dev.recorder.add("verifies", address=unit.address, size=unit.size, ok=1, attempt=0,
                         expected_sha256=None, actual_sha256=None, mismatch_address=None,
                         flash_byte=None, image_byte=None, clock=dev.clock.now())
        dev.recorder.add("units", address=unit.address, size=unit.size, state="verified",
                         action="skip", wanted_sha256=None, detail="already equal",
                         clock=dev.clock.now())
