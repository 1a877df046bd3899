"""Stage: diff what was read against the image, unit by unit, and stream the work.

The planner holds at most one largest-erase block (64 KiB) of units: enough to choose the
largest aligned erase that covers only units needing one.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from anyio.abc import ObjectReceiveStream, ObjectSendStream

from amdflash.stages.device import Device
from amdflash.stages.flash.planning import Erase, UnitPlan, cover, plan_unit
from amdflash.stages.snapshot import UnitRead


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


async def plan(dev: Device, image: bytes, erase_sizes: list[int], page_size: int,
               reads: ObjectReceiveStream[UnitRead], out: ObjectSendStream[WorkItem],
               summary: PlanSummary) -> None:
    block_size = max(erase_sizes)
    block: list[UnitPlan] = []
    async with reads, out:
        async for read in reads:
            if block and block[0].address // block_size != read.address // block_size:
                await _emit(dev, block, erase_sizes, out, summary)
                block = []
            wanted = image[read.address:read.address + len(read.data)]
            unit = plan_unit(read.address, read.data, wanted, page_size)
            summary.counts[unit.action] += 1
            if unit.action != "skip":
                summary.written.add(unit.address)
            dev.recorder.add("units", address=unit.address, size=unit.size, state="planned",
                             action=unit.label, wanted_sha256=None, detail=f"{len(unit.pages)} pages",
                             clock=dev.clock.now())
            if unit.action == "skip":
                # Reading it equal to the image is its verification.
                dev.recorder.add("verifies", address=unit.address, size=unit.size, ok=1, attempt=0,
                                 expected_sha256=None, actual_sha256=None, mismatch_address=None,
                                 flash_byte=None, image_byte=None, clock=dev.clock.now())
                dev.recorder.add("units", address=unit.address, size=unit.size, state="verified",
                                 action="skip", wanted_sha256=None, detail="already equal",
                                 clock=dev.clock.now())
            block.append(unit)
        if block:
            await _emit(dev, block, erase_sizes, out, summary)


async def _emit(dev: Device, block: list[UnitPlan], erase_sizes: list[int],
                out: ObjectSendStream[WorkItem], summary: PlanSummary) -> None:
    items: list[WorkItem] = []
    for erase in cover(block, erase_sizes):
        summary.erases[erase.size] = summary.erases.get(erase.size, 0) + 1
        items.append(WorkItem(erase, [u for u in block
                                      if erase.address <= u.address < erase.address + erase.size]))
    items += [WorkItem(None, [u]) for u in block if u.action == "program"]
    for item in sorted(items, key=lambda i: i.address):
        await out.send(item)
