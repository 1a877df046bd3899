"""ROM aperture dump: the whole flash through ROM_INDEX / ROM_DATA (docs/aperture.md).

Done exactly as the hardware-validated client does it, including its byte-swapped
ROM_CNTL / ROM_INDEX encoding (amdgpu writes plain offsets; the validated path wins).
ROM_DATA is read one dword per access: a block read would walk the MMIO address
instead of re-reading the data port.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from collections.abc import Callable

from amdflash.stages.drivers.flash.geometry import FLASH_SIZE
from amdflash.stages.drivers.navi31 import regs as R
from amdflash.stages.transport.base import Bar5

INDEX_PAGE = 0x10000
IFWI_MAGIC = b"\xaa\x55\xaa\x55"


class ApertureError(RuntimeError):
    pass


class RawUnavailable(ApertureError):
    """The raw controller is not there: found by one register read, before anything is written."""


def bswap32(value: int) -> int:
    return int.from_bytes((value & 0xFFFFFFFF).to_bytes(4, "little"), "big")


@dataclass(frozen=True)
class ApertureDump:
    data: bytes
    sha256: str


def dump(bar: Bar5, on_page: Callable[[int, int], None] | None = None) -> ApertureDump:
    """Read the 2 MiB flash; refuse a dump that is not a raw image. `on_page(done, total)`."""
    original_cntl = bar.read32(R.ROM_CNTL)
    original_index = bar.read32(R.ROM_INDEX)
    if original_cntl == R.ROM_CNTL_RAW_UNAVAILABLE:
        raise RawUnavailable("raw SMUIO ROM controller is unavailable (ROM_CNTL reads 0xFFFFFFFF); "
                            "the SOC15 function-ROM aperture is not a raw SPI mapping and is never used instead")
    out = bytearray()
    try:
        bar.write32(R.ROM_CNTL, bswap32(original_cntl | R.ROM_CNTL_AUTO_INCREMENT))
        for page in range(0, FLASH_SIZE, INDEX_PAGE):
            bar.write32(R.ROM_INDEX, bswap32(page >> 8))
            for _ in range(INDEX_PAGE // 4):
                out += bar.read32(R.ROM_DATA).to_bytes(4, "little")
            if on_page:
                on_page(page + INDEX_PAGE, FLASH_SIZE)
    finally:
        bar.write32(R.ROM_INDEX, bswap32(original_index))
        bar.write32(R.ROM_CNTL, bswap32(original_cntl))
    data = bytes(out)
    check_raw_dump(data)
    return ApertureDump(data, hashlib.sha256(data).hexdigest())


def check_raw_dump(data: bytes) -> None:
    if len(data) != FLASH_SIZE or data[:4] != IFWI_MAGIC:
        raise ApertureError(f"not a raw flash dump: size {len(data):#x}, magic {data[:4].hex() or 'none'} "
                            f"(expected {FLASH_SIZE:#x} bytes starting AA55AA55)")
    if data[:FLASH_SIZE // 2] == data[FLASH_SIZE // 2:]:
        raise ApertureError("the ROM aperture shows identical 1 MiB halves (a mirrored aperture, "
                            "not the raw 2 MiB flash); refusing to write the dump")
