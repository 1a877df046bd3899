"""Stage: program the pages each unit needs (all-0xFF pages after an erase are skipped)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from amdflash.stages.device import Device
from amdflash.stages.drivers.flash.planning import UnitPlan

if TYPE_CHECKING:      # annotations only: the stream classes are anyio's (anyio.abc loads ~10 modules)
    from anyio.abc import ObjectReceiveStream, ObjectSendStream


def program_unit(dev: Device, unit: UnitPlan, pages: tuple[int, ...] | None = None) -> int:
    """Program the unit's planned pages, or — a retry after its read-back differed — `pages`.

    A retry means a page may have been dropped, which timed page programming cannot rule
    out by itself: from then on this board's pages are programmed checked.
    """
    assert dev.nor is not None
    if pages is not None:
        dev.nor.check_programming(f"the unit at {unit.address:#08x} differed on read-back")
    return dev.nor.program_pages(unit.address, unit.wanted, unit.pages if pages is None else pages)


async def program_stage(dev: Device, units: ObjectReceiveStream[UnitPlan], out: ObjectSendStream[UnitPlan],
                        total_units: int) -> None:
    done = 0
    async with units, out:
        async for unit in units:
            pages = await dev.call(program_unit, dev, unit, at=("program", unit.address))
            dev.recorder.add("units", address=unit.address, size=unit.size, state="programmed",
                             action=unit.label, wanted_sha256=None, detail=f"{pages} pages",
                             clock=dev.clock.now())
            done += 1
            dev.progress("program", done, total_units)
            await out.send(unit)
