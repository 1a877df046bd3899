"""Stage: make each unit's intent durable, then erase (or pass program-only units on).

The intent rows and the barrier come first: if the host dies after this point the audit
trail shows the unit as begun but not verified, and `resume` redoes it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import anyio

from amdflash.stages.device import Device
from amdflash.stages.drivers.flash.planning import Erase, UnitPlan
from amdflash.stages.plan import WorkItem

if TYPE_CHECKING:      # annotations only: the stream classes are anyio's (anyio.abc loads ~10 modules)
    from anyio.abc import ObjectReceiveStream, ObjectSendStream


def record_intent(dev: Device, units: list[UnitPlan], erase: Erase | None, detail: str = "",
                  durable: bool = True) -> None:
    what = f"erase {erase.size // 1024}K@{erase.address:#08x}" if erase else "program without erase"
    for u in units:
        dev.recorder.add("units", address=u.address, size=u.size, state="intent", action=u.label,
                         wanted_sha256=None, detail=(detail + " " + what).strip(), clock=dev.clock.now())
    if durable:
        dev.recorder.durable()


def erase_now(dev: Device, erase: Erase) -> None:
    assert dev.nor is not None
    dev.nor.erase(erase.address, erase.size)


async def erase_stage(dev: Device, work: ObjectReceiveStream[WorkItem], out: ObjectSendStream[UnitPlan],
                      total_units: int) -> bool:
    """Returns True if it stopped early because the operator asked to stop."""
    done = 0
    stopped = False
    async with work, out:
        async for item in work:
            if stopped or dev.stop:
                stopped = True   # a safe point: nothing of this item was touched; drain the rest
                continue
            # The barrier waits outside the board's slot: other stages use the board meanwhile.
            record_intent(dev, item.units, item.erase, durable=False)
            await anyio.to_thread.run_sync(dev.recorder.durable)
            if item.erase is not None:
                await dev.call(erase_now, dev, item.erase, at=("erase", item.erase.address))
                for u in item.units:
                    dev.recorder.add("units", address=u.address, size=u.size, state="erased", action=u.label,
                                     wanted_sha256=None, detail=f"{item.erase.size // 1024}K erase",
                                     clock=dev.clock.now())
            for u in item.units:
                done += 1
                dev.progress("erase", done, total_units)
                await out.send(u)
    return stopped
