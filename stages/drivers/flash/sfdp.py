"""JESD216 SFDP: what a chip reports about itself.

The SFDP area starts with the "SFDP" signature, a revision and the number of parameter
headers; each header names a table (id, revision, length in dwords, 24-bit pointer). The
basic flash parameter table (BFPT, id FF00h) is the one every JESD216 part has. What it
gives, by revision (JESD216 1.0: nine dwords; JESD216A 1.5 and B 1.6: sixteen):

* dword 1: address bytes (3, 3 or 4, 4), the 4 KiB erase opcode, write granularity,
  whether block-protect bits are volatile;
* dword 2: density;
* dwords 8-9: up to four erase types (size, opcode);
* 1.5+: dword 10 the erase types' typical times and the multiplier to their maximum,
  dword 11 page size, page-program and chip-erase times, dword 15 the quad-enable
  requirement (QER: where QE is, and so whether SR2 can be read with 35h), dword 16 how
  status register 1 is written.

It says nothing about where block-protect bits are or how they decode.

Which table is read follows Linux (drivers/mtd/spi-nor/sfdp.c, spi_nor_parse_sfdp): the
SFDP header's major revision must be 1 (JESD216) and the first parameter header must be a
BFPT of major revision 1, else the area is rejected; then, of every parameter header that
names a BFPT of major revision 1, the one with the highest minor revision wins (on a tie,
the longer table). A part may list an old 1.0 BFPT first and a 1.6 one after it (the
W25Q16FW/JW are told apart from the W25Q16DW by exactly that revision).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

BFPT_ID = 0xFF00
ERASE_UNITS = (1e-3, 16e-3, 128e-3, 1.0)
PROGRAM_UNITS = (8e-6, 64e-6)
CHIP_ERASE_UNITS = (16e-3, 256e-3, 4.0, 64.0)
ADDRESS_BYTES = {0b00: "3", 0b01: "3 or 4", 0b10: "4"}
# QER (dword 15 bits 22:20) -> (where QE is, opcode that reads the register holding it).
QER = {
    0b000: ("none", None), 0b001: ("SR2 bit 1", None), 0b010: ("SR1 bit 6", 0x05),
    0b011: ("SR2 bit 7", 0x3F), 0b100: ("SR2 bit 1", None), 0b101: ("SR2 bit 1", 0x35),
    0b110: ("SR2 bit 1", 0x35),
}


class SfdpError(ValueError):
    pass


@dataclass(frozen=True)
class ParameterHeader:
    id: int
    revision: tuple[int, int]
    dwords: int
    pointer: int


@dataclass(frozen=True)
class Sfdp:
    revision: tuple[int, int]
    size: int                                         # bytes
    erase_types: tuple[tuple[int, int], ...]           # (size, opcode), ascending
    page_size: int | None
    bfpt_revision: tuple[int, int] = (1, 0)
    bfpt_dwords: int = 9
    erase_times: tuple[tuple[float, float] | None, ...] = ()   # (typical, maximum), as erase_types
    page_program: tuple[float, float] | None = None
    chip_erase: tuple[float, float] | None = None
    address_bytes: str = "3"
    erase_4k: int | None = None
    qer: int | None = None
    tables: tuple[int, ...] = field(default=())        # ids of every parameter table

    @property
    def qe(self) -> str | None:
        return QER.get(self.qer, ("reserved", None))[0] if self.qer is not None else None

    @property
    def sr2_read(self) -> int | None:
        """The opcode that reads the register holding QE, when the tables name one besides 05h."""
        opcode = QER.get(self.qer, ("", None))[1] if self.qer is not None else None
        return opcode if opcode not in (None, 0x05) else None

    def describe(self) -> str:
        erases = ", ".join(f"{s // 1024}K:{op:02X}h" for s, op in self.erase_types)
        page = f", page {self.page_size} B" if self.page_size else ""
        return (f"SFDP {self.revision[0]}.{self.revision[1]}: {self.size // 1024} KiB, erase {erases}{page}, "
                f"{self.address_bytes}-byte addresses")

    def facts(self) -> dict[str, object]:
        """Everything parsed, as JSON-friendly values (recorded with a run)."""
        return {
            "revision": f"{self.revision[0]}.{self.revision[1]}",
            "bfpt": f"{self.bfpt_revision[0]}.{self.bfpt_revision[1]} ({self.bfpt_dwords} dwords)",
            "tables": [f"{t:04X}h" for t in self.tables],
            "size": self.size, "page_size": self.page_size, "address_bytes": self.address_bytes,
            "erase_types": [{"size": s, "opcode": f"{op:02X}h",
                             "typical_s": t[0] if t else None, "maximum_s": t[1] if t else None}
                            for (s, op), t in zip(self.erase_types, self.erase_times or [None] * 4)],
            "page_program_s": list(self.page_program) if self.page_program else None,
            "chip_erase_s": list(self.chip_erase) if self.chip_erase else None,
            "quad_enable": self.qe,
        }


JESD216_MAJOR = 1


def parse_header(header: bytes) -> tuple[int, int]:
    """The SFDP revision (major, minor) from the first 16 bytes, checked as Linux checks it:
    the signature, major revision 1, and a first parameter header naming a BFPT of major 1."""
    if len(header) < 16 or header[:4] != b"SFDP":
        raise SfdpError(f"no SFDP signature (got {header[:4].hex() or 'nothing'})")
    minor, major = header[4], header[5]
    if major != JESD216_MAJOR:
        raise SfdpError(f"SFDP revision {major}.{minor}: only major revision {JESD216_MAJOR} (JESD216) is "
                        "understood, as in Linux")
    first = parameter_headers(header)[0]
    if first.id != BFPT_ID:
        raise SfdpError(f"first parameter header is {first.id:#06x}, not the basic flash parameter table")
    if first.revision[0] != JESD216_MAJOR:
        raise SfdpError(f"the first basic flash parameter table has revision {first.revision[0]}."
                        f"{first.revision[1]}: only major revision {JESD216_MAJOR} is understood, as in Linux")
    return major, minor


def best_bfpt(headers: list[ParameterHeader]) -> ParameterHeader:
    """The BFPT to read: the first header, replaced by any later BFPT header of major revision 1
    with a higher minor revision, or the same minor and more dwords (Linux's rule)."""
    best = headers[0]
    for h in headers[1:]:
        if h.id == BFPT_ID and h.revision[0] == JESD216_MAJOR and (
                h.revision[1] > best.revision[1] or (h.revision[1] == best.revision[1] and h.dwords > best.dwords)):
            best = h
    return best


def parameter_headers(area: bytes) -> list[ParameterHeader]:
    """Every parameter header of an SFDP area's first bytes (8 + 8 per header)."""
    count = area[6] + 1
    headers = []
    for i in range(count):
        h = area[8 + 8 * i:16 + 8 * i]
        if len(h) < 8:
            break
        headers.append(ParameterHeader(h[0] | h[7] << 8, (h[2], h[1]), h[3], int.from_bytes(h[4:7], "little")))
    return headers


def _time(count_and_unit: int, count_bits: int, units: tuple[float, ...]) -> float:
    count = (count_and_unit & ((1 << count_bits) - 1)) + 1
    return count * units[count_and_unit >> count_bits]


def parse_bfpt(revision: tuple[int, int], bfpt: bytes, bfpt_revision: tuple[int, int] | None = None,
               tables: tuple[int, ...] = (BFPT_ID,)) -> Sfdp:
    if len(bfpt) < 36:
        raise SfdpError("basic flash parameter table shorter than 9 dwords")
    dw = struct.unpack(f"<{len(bfpt) // 4}I", bfpt[: len(bfpt) // 4 * 4])
    density = dw[1]
    size = (1 << (density & 0x7FFFFFFF)) // 8 if density & 0x80000000 else (density + 1) // 8
    erases = []
    for word in dw[7:9]:
        for half in (word & 0xFFFF, word >> 16):
            exponent, opcode = half & 0xFF, half >> 8
            erases.append((1 << exponent, opcode) if exponent else None)
    times: list[tuple[float, float] | None] = [None] * 4
    page = page_program = chip_erase = qer = None
    if len(dw) >= 11:
        multiplier = 2 * ((dw[9] & 0xF) + 1)
        for i in range(4):
            field_ = dw[9] >> (4 + 7 * i) & 0x7F
            if erases[i] is not None:
                typical = _time(field_, 5, ERASE_UNITS)
                times[i] = (typical, typical * multiplier)
        page = 1 << (dw[10] >> 4 & 0xF)
        program = _time(dw[10] >> 8 & 0x3F, 5, PROGRAM_UNITS)
        page_program = (program, program * 2 * ((dw[10] & 0xF) + 1))
        chip = _time(dw[10] >> 24 & 0x7F, 5, CHIP_ERASE_UNITS)
        chip_erase = (chip, chip * multiplier)     # erase times share dword 10's multiplier
    if len(dw) >= 15:
        qer = dw[14] >> 20 & 0x7
    ordered = sorted((e, t) for e, t in zip(erases, times) if e is not None)
    has_times = len(dw) >= 11
    return Sfdp(revision, size, tuple(e for e, _ in ordered), page, bfpt_revision or revision, len(dw),
                tuple(t for _, t in ordered) if has_times else (), page_program, chip_erase,
                ADDRESS_BYTES.get(dw[0] >> 17 & 0x3, "reserved"),
                dw[0] >> 8 & 0xFF if dw[0] & 0x3 == 0b01 else None, qer, tables)
