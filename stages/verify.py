"""Stage: read back every written unit, compare, retry a bounded number of times.

A unit counts as done only when its read-back equals the image. The read-back is
confirmed (stages.snapshot.read_unit): a passing verify rests on chunks that read back
exactly the data written — proven to come from the chip, and of content no fault produces
(stages.confirm) — and on agreeing reads for the rest; a mismatch is a real one, not a
noisy read. Each verified unit's `units` row says which (its detail). A mismatch is retried (4 KiB erase, program,
read back); after the last attempt the run fails naming the first differing address and
both byte values.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from amdflash.stages.confirm import Expectation
from amdflash.stages.device import Device
from amdflash.stages.erase import record_intent
from amdflash.stages.drivers.flash.planning import Erase, UnitPlan, plan_unit
from amdflash.stages.program import program_unit
from amdflash.stages.snapshot import confirmation_note, read_checks, read_unit

if TYPE_CHECKING:      # annotations only: the stream classes are anyio's (anyio.abc loads ~10 modules)
    from anyio.abc import ObjectReceiveStream


class VerifyError(RuntimeError):
    def __init__(self, address: int, flash_byte: int, image_byte: int, attempts: int):
        super().__init__(f"verify failed at {address:#08x}: flash={flash_byte:02x} image={image_byte:02x} "
                         f"(after {attempts} attempt{'s' if attempts != 1 else ''})")
        self.address, self.flash_byte, self.image_byte = address, flash_byte, image_byte


@dataclass(frozen=True)
class Mismatch:
    address: int
    flash_byte: int
    image_byte: int


def first_mismatch(base: int, got: bytes, wanted: bytes) -> Mismatch | None:
    if got == wanted:
        return None
    i = next(i for i, (a, b) in enumerate(zip(got, wanted)) if a != b)
    return Mismatch(base + i, got[i], wanted[i])


def record_verify(dev: Device, unit_address: int, size: int, got: bytes, wanted: bytes,
                  attempt: int) -> Mismatch | None:
    mm = first_mismatch(unit_address, got, wanted)
    dev.recorder.add("verifies", address=unit_address, size=size, ok=int(mm is None), attempt=attempt,
                     expected_sha256=hashlib.sha256(wanted).hexdigest(),
                     actual_sha256=hashlib.sha256(got).hexdigest(),
                     mismatch_address=mm.address if mm else None,
                     flash_byte=mm.flash_byte if mm else None, image_byte=mm.image_byte if mm else None,
                     clock=dev.clock.now())
    return mm


def verify_unit(dev: Device, unit: UnitPlan, retries: int, reads: int = 1,
                written: Expectation | None = None) -> int:
    """Read back (confirmed: by `reads` agreeing reads, or by matching `written`, the data
    the flash was written with), compare, retry. Returns the attempts used; raises
    VerifyError at the end."""
    attempt = 1
    while True:
        got = read_unit(dev, unit.address, unit.size, reads, "verify", written)
        mm = record_verify(dev, unit.address, unit.size, got, unit.wanted, attempt)
        if mm is None:
            dev.recorder.add("units", address=unit.address, size=unit.size, state="verified", action=unit.label,
                             wanted_sha256=hashlib.sha256(unit.wanted).hexdigest(),
                             detail=f"attempt {attempt}; {confirmation_note(dev, 'verify')}", clock=dev.clock.now())
            return attempt
        if attempt > retries:
            dev.recorder.add("units", address=unit.address, size=unit.size, state="failed", action=unit.label,
                             wanted_sha256=hashlib.sha256(unit.wanted).hexdigest(),
                             detail=f"{mm.address:#08x}: flash={mm.flash_byte:02x} image={mm.image_byte:02x}",
                             clock=dev.clock.now())
            raise VerifyError(mm.address, mm.flash_byte, mm.image_byte, attempt)
        attempt += 1
        erase = Erase(unit.address, unit.size)
        record_intent(dev, [unit], erase, detail=f"retry {attempt - 1}:")
        assert dev.nor is not None and dev.nor.chip is not None
        dev.nor.erase(erase.address, erase.size)
        after_erase = plan_unit(unit.address, b"\xff" * unit.size, unit.wanted, dev.nor.chip.write_facts().page_size)
        program_unit(dev, unit, after_erase.pages)


async def verify_stage(dev: Device, units: ObjectReceiveStream[UnitPlan], total_units: int,
                       retries: int, reads: int = 1, written: Expectation | None = None) -> int:
    """Verify every unit that arrives; returns how many needed a retry. How each read-back
    was confirmed is recorded when the stage ends, however it ends."""
    done = retried = 0
    try:
        async with units:
            async for unit in units:
                attempts = await dev.call(verify_unit, dev, unit, retries, reads, written, at=("verify", unit.address))
                retried += attempts > 1
                done += 1
                dev.progress("verify", done, total_units)
    finally:
        read_checks(dev).record(dev, "verify")
    return retried
