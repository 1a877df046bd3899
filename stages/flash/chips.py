"""The chip table: everything the driver needs to know about a SPI NOR part, as data.

A new part is a new entry; the driver reads sizes, opcodes and timings from here.
Timings are (typical, maximum) seconds: the driver first waits about the typical time and
gives up after the maximum.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EraseType:
    size: int
    opcode: int
    typical: float
    maximum: float


@dataclass(frozen=True)
class ChipInfo:
    name: str
    jedec: bytes                      # manufacturer, memory type, capacity
    size: int
    page_size: int
    erase_types: tuple[EraseType, ...]  # ascending size; the smallest is the erase unit
    chip_erase: EraseType
    page_program: tuple[float, float]
    status_write: tuple[float, float]
    voltage: str
    protection: str = "bp-tb-sec-cmp"   # decoder in stages.flash.protection

    @property
    def unit(self) -> int:
        """The erase unit: the smallest erase size, the granularity of planning and audit."""
        return self.erase_types[0].size

    def erase_type(self, size: int) -> EraseType:
        for e in self.erase_types:
            if e.size == size:
                return e
        raise ValueError(f"{self.name} has no {size // 1024} KiB erase")


# GD25LQ16E: only "4 KiB erase max 300 ms" is confirmed publicly; the rest are the GD25LQ
# family's usual figures (docs/flash-chip.md), assumed.
GD25LQ16E = ChipInfo(
    name="GigaDevice GD25LQ16E",
    jedec=bytes((0xC8, 0x60, 0x15)),
    size=0x200000,
    page_size=0x100,
    erase_types=(
        EraseType(0x1000, 0x20, 0.050, 0.300),
        EraseType(0x8000, 0x52, 0.150, 1.0),
        EraseType(0x10000, 0xD8, 0.250, 1.2),
    ),
    chip_erase=EraseType(0x200000, 0xC7, 8.0, 20.0),
    page_program=(0.0005, 0.0024),
    status_write=(0.005, 0.030),
    voltage="1.8 V",
)

CHIPS: tuple[ChipInfo, ...] = (GD25LQ16E,)


def match_jedec(capture: bytes) -> ChipInfo | None:
    """The chip whose JEDEC id appears in an RDID capture.

    The ROM_SW capture of RDID is not aligned to the first byte on every board, so (as the
    validated client does) the id may sit anywhere in the captured bytes, or wrap around
    their end.
    """
    wrapped = capture + capture[:2]
    for chip in CHIPS:
        if chip.jedec in wrapped:
            return chip
    return None
