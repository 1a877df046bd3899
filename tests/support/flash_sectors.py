"""Sector-range flashing, unit by unit, as the validated client does it — but skipping
what already matches: for each 4 KiB sector, read it, then (only if needed) erase,
program and immediately read it back.

This is the driver-level routine (one board, no pipeline, no audit) the tests use to check
the drivers and the emulator below the stages; the product's stages do the same work with
planning across units, streaming and an audit trail (it lived in stages/drivers/flash/ while
nothing but the tests called it).
"""
from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable

from amdflash.stages.drivers.flash.planning import plan_unit
from amdflash.stages.drivers.flash.spinor import FlashError, ProtectedError, SpiNor


class SectorVerifyError(FlashError):
    def __init__(self, address: int, flash_byte: int, image_byte: int):
        super().__init__(f"verify mismatch at {address:#08x}: flash={flash_byte:02x} image={image_byte:02x}")
        self.address, self.flash_byte, self.image_byte = address, flash_byte, image_byte


@dataclass(frozen=True)
class SectorResult:
    address: int
    action: str          # skip | program | erase


def flash_sectors(nor: SpiNor, image: bytes, start_sector: int = 0, sector_count: int | None = None,
                  clear_cmp: bool = False,
                  on_sector: Callable[[SectorResult], None] | None = None) -> list[SectorResult]:
    chip = nor.chip
    if chip is None:
        nor.identify()
        chip = nor.chip
    assert chip is not None
    unit = chip.unit
    total = chip.size // unit
    if len(image) != chip.size:
        raise ValueError(f"image must be exactly {chip.size:#x} bytes")
    count = total - start_sector if sector_count is None else sector_count
    if not 0 <= start_sector < total or not 1 <= count <= total - start_sector:
        raise ValueError(f"invalid sector range: start {start_sector}, count {count} (of {total})")
    lo, size = start_sector * unit, count * unit
    page_size = chip.page_size
    if page_size is None:
        raise FlashError(f"{chip.name}: no page size is known")

    # Every check before the first write.
    layout = chip.protection
    if layout is None:
        raise ProtectedError(f"{chip.name}: its protection layout is unknown, so a protected target could "
                             "not be refused up front")
    regs = nor.registers()
    current = layout.decode(regs, chip.size)
    after = layout.decode(layout.without_cmp(regs), chip.size) if clear_cmp else current
    if current.overlaps(lo, size) and current.cmp and not clear_cmp:
        raise ProtectedError(f"CMP is set ({current.describe()}); clearing it needs explicit permission")
    nor.check_writable(lo, size, after)
    if current.cmp and clear_cmp:
        nor.clear_cmp()

    results = []
    for address in range(lo, lo + size, unit):
        wanted = image[address:address + unit]
        plan = plan_unit(address, nor.read(address, unit), wanted, page_size)
        if plan.action == "erase":
            nor.erase(address, unit)
        nor.program_pages(address, wanted, plan.pages)
        if plan.action != "skip":
            got = nor.read(address, unit)
            if got != wanted:
                i = next(i for i, (a, b) in enumerate(zip(got, wanted)) if a != b)
                raise SectorVerifyError(address + i, got[i], wanted[i])
        result = SectorResult(address, plan.action)
        results.append(result)
        if on_sector:
            on_sector(result)
    return results
