"""Before any job touches a board: put back what an earlier run left changed, then take the
registers as found.

The board is matched by what the transport knows before anything is written (bridge or
emulated-board serial, else the PCI address): the flash unique ID cannot be read without
configuring the ROM_SW engine, which changes the very registers being put back. Once the
job has identified the flash, `jobs.identify` cross-checks the unique ID against the one
the stranded run recorded and warns if they differ.
"""
from __future__ import annotations

import anyio

from amdflash.stages.device import Device
from amdflash.stages.restore import LedgerBar, put_back
from amdflash.stages.snapshot import record_stage, snapshot_registers
from amdflash.store.reading import TrailSource
from amdflash.store.stranded import board_key, find_stranded


async def settle_registers(dev: Device, trail: TrailSource) -> list[str]:
    """`trail`: the command's (store.reading.Trail), read before the first register write.
    Returns lines for the operator. Raises if the registers could not be put back: the
    job must not run on a board left in another run's state."""
    dev.bar = LedgerBar(dev.bar)
    key = board_key(dev.identity.spec, dev.identity.serial)
    record_stage(dev, "registers", "start", key)
    stranded = await anyio.to_thread.run_sync(find_stranded, trail, key, dev.recorder.run_id)
    notes: list[str] = []
    if stranded is not None:
        dev.registers_truth = stranded.registers
        dev.stranded = stranded
        notes = await dev.call(put_back, dev, stranded.run_id, stranded.registers,
                               f"a {stranded.command} run; {stranded.outcome}")
    dev.registers_truth = await dev.call(snapshot_registers, dev, "before")
    record_stage(dev, "registers", "end", "as found" if stranded is None
                 else f"as found, after dealing with what run {stranded.run_id} left")
    return notes
