"""JESD216 SFDP: the geometry a chip reports about itself."""
from __future__ import annotations

import struct
from dataclasses import dataclass


class SfdpError(ValueError):
    pass


@dataclass(frozen=True)
class Sfdp:
    revision: tuple[int, int]
    size: int                                # bytes
    erase_types: tuple[tuple[int, int], ...]  # (size, opcode), ascending
    page_size: int | None

    def describe(self) -> str:
        erases = ", ".join(f"{s // 1024}K:{op:02X}h" for s, op in self.erase_types)
        page = f", page {self.page_size} B" if self.page_size else ""
        return f"SFDP {self.revision[0]}.{self.revision[1]}: {self.size // 1024} KiB, erase {erases}{page}"


def parse_header(header: bytes) -> tuple[tuple[int, int], int, int]:
    """(revision, BFPT pointer, BFPT length in dwords) from the first 16 bytes."""
    if len(header) < 16 or header[:4] != b"SFDP":
        raise SfdpError(f"no SFDP signature (got {header[:4].hex() or 'nothing'})")
    minor, major = header[4], header[5]
    param_id = header[8] | header[15] << 8
    if param_id != 0xFF00:
        raise SfdpError(f"first parameter header is {param_id:#06x}, not the basic flash parameter table")
    length = header[11]
    pointer = int.from_bytes(header[12:15], "little")
    return (major, minor), pointer, length


def parse_bfpt(revision: tuple[int, int], bfpt: bytes) -> Sfdp:
    if len(bfpt) < 36:
        raise SfdpError("basic flash parameter table shorter than 9 dwords")
    dwords = struct.unpack(f"<{len(bfpt) // 4}I", bfpt[: len(bfpt) // 4 * 4])
    density = dwords[1]
    size = (1 << (density & 0x7FFFFFFF)) // 8 if density & 0x80000000 else (density + 1) // 8
    erases = []
    for word in dwords[7:9]:
        for half in (word & 0xFFFF, word >> 16):
            exponent, opcode = half & 0xFF, half >> 8
            if exponent:
                erases.append((1 << exponent, opcode))
    page = 1 << ((dwords[10] >> 4) & 0xF) if len(dwords) >= 11 else None
    return Sfdp(revision, size, tuple(sorted(erases)), page)
