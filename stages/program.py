"""Stage: program the pages each unit needs (all-0xFF pages after an erase are skipped)."""
from __future__ import annotations

from anyio.abc import ObjectReceiveStream, ObjectSendStream

from stages.device import Device
from stages.flash.planning import UnitPlan


def program_unit(dev: Device, unit: UnitPlan, pages: tuple[int, ...] | None = None) -> int:
    """Program the unit's pages (or `pages`); consecutive pages are programmed in one pass."""
    assert dev.nor is not None
    nor = dev.nor
    todo = unit.pages if pages is None else pages
    if not todo:
        return 0
    page_size = nor.chip.page_size if nor.chip else 0x100
    written = 0
    run_start = prev = todo[0]
    for page in (*todo[1:], None):
        if page is not None and page == prev + page_size:
            prev = page
            continue
        offset = run_start - unit.address
        written += nor.program(run_start, unit.wanted[offset:offset + prev + page_size - run_start])
        if page is not None:
            run_start = prev = page
    return written


async def program_stage(dev: Device, units: ObjectReceiveStream[UnitPlan], out: ObjectSendStream[UnitPlan],
                        total_units: int) -> None:
    done = 0
    async with units, out:
        async for unit in units:
            pages = await dev.call(program_unit, dev, unit)
            dev.recorder.add("units", address=unit.address, size=unit.size, state="programmed",
                             action=unit.label, wanted_sha256=None, detail=f"{pages} pages",
                             clock=dev.clock.now())
            done += 1
            dev.progress("program", done, total_units)
            await out.send(unit)
