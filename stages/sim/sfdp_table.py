"""Building an emulated part's SFDP table (JESD216, JESD216A/B layout) field by field.

A part describes its basic flash parameter table (BFPT) as a `Bfpt`; `build_sfdp` lays out
the SFDP header, the parameter headers (the BFPT's, then any vendor table's) and the
tables, every dword little-endian as JESD216 lays them out. Revision 1.0 tables have nine
BFPT dwords (density, erase types, fast reads, no timings, no page size); revision 1.5 and
1.6 tables have sixteen (erase, program and chip-erase times, page size, suspend, deep
power-down, quad-enable and reset methods).

Time fields: JESD216 encodes a typical time as a 5-bit count of a unit (erase: 1 ms,
16 ms, 128 ms or 1 s; page program: 8 µs or 64 µs; chip erase: 16 ms, 256 ms, 4 s or
64 s) and the maximum as 2 × (N + 1) × typical. `encode_time` picks the count and unit
that come nearest the part's typical figure (ties: the finer unit).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

ERASE_UNITS = (1e-3, 16e-3, 128e-3, 1.0)
PROGRAM_UNITS = (8e-6, 64e-6)
CHIP_ERASE_UNITS = (16e-3, 256e-3, 4.0, 64.0)
BFPT_ADDRESS = 0x30


def bits(*fields: tuple[int, int, int]) -> int:
    """Assemble a dword from (lsb, width, value) fields; unlisted bits stay 1 (reserved)."""
    dword = 0xFFFFFFFF
    for lsb, width, value in fields:
        if value >> width:
            raise ValueError(f"field at bit {lsb} does not fit in {width} bits: {value:#x}")
        mask = ((1 << width) - 1) << lsb
        dword = (dword & ~mask) | (value << lsb)
    return dword


def encode_time(seconds: float, units: tuple[float, ...]) -> tuple[int, int]:
    """(count, unit index) nearest `seconds`, count 1..32."""
    best: tuple[float, int, int] | None = None
    for index, unit in enumerate(units):
        count = round(seconds / unit)
        if 1 <= count <= 32:
            error = abs(count * unit - seconds)
            if best is None or error < best[0] - 1e-12:
                best = (error, count, index)
    if best is None:
        raise ValueError(f"{seconds} s cannot be encoded in units {units}")
    return best[1], best[2]


@dataclass(frozen=True)
class Bfpt:
    """The fields of a basic flash parameter table that the emulated parts differ in."""

    revision: tuple[int, int]                        # (major, minor): 1.0, 1.5 or 1.6
    density_bits: int
    erase_types: tuple[tuple[int, int, float], ...]   # (bytes, opcode, typical seconds), up to 4
    # dword 1: the 4 KiB erase opcode (None: no uniform 4 KiB erase), volatile BP bits
    # and which write enable reaches a volatile status register (50h or 06h).
    erase_4k: int | None = 0x20
    volatile_bp: bool = False
    volatile_wren_06: bool = False
    # Fast reads a single-line engine never uses; advertised as the parts have them.
    read_112: bool = True
    read_122: bool = True
    read_144: bool = True
    read_114: bool = True
    read_444: tuple[int, int, int] | None = None      # QPI fast read: (wait states, mode clocks, opcode)
    # Revision 1.5 and later (dwords 10-16).
    erase_max_n: int = 2                             # max = 2 × (N + 1) × typical
    page_exponent: int = 8
    page_program: float = 0.5e-3
    program_max_n: int = 2
    chip_erase: float = 8.0
    suspend: tuple[int, int] | None = (0x75, 0x7A)  # (suspend, resume) opcodes
    deep_power_down: bool = True
    qer: int = 0b100                                 # quad-enable requirement (dword 15 bits 22:20)
    sr1_write: int = 0b0001000                       # dword 16 bits 6:0 (volatile SR1 via 50h)
    soft_reset_66_99: bool = True

    @property
    def dwords(self) -> int:
        return 9 if self.revision < (1, 5) else 16

    def build(self) -> list[int]:
        dw = [self._dword1(), self.density_bits - 1, *self._fast_reads(), self._erase_types(0),
              self._erase_types(2)]
        if self.dwords > 9:
            dw += [self._erase_times(), self._program_times(), *self._tail()]
        if len(dw) != self.dwords:
            raise AssertionError(f"built {len(dw)} BFPT dwords, expected {self.dwords}")
        return dw

    def _dword1(self) -> int:
        return bits((0, 2, 0b01 if self.erase_4k is not None else 0b11), (2, 1, 1),
                    (3, 1, int(self.volatile_bp)), (4, 1, int(self.volatile_wren_06)),
                    (8, 8, 0xFF if self.erase_4k is None else self.erase_4k),
                    (16, 1, int(self.read_112)), (17, 2, 0b00), (19, 1, 0),
                    (20, 1, int(self.read_122)), (21, 1, int(self.read_144)), (22, 1, int(self.read_114)))

    def _fast_reads(self) -> list[int]:
        # 3: 1-4-4 EBh (4 dummy + 2 mode clocks), 1-1-4 6Bh (8 dummy clocks).
        # 4: 1-1-2 3Bh (8 dummy clocks), 1-2-2 BBh (2 dummy + 2 mode clocks).
        # 5-7: no 2-2-2; 4-4-4 (QPI) only where the part has it.
        qpi = bits((16, 16, 0))
        if self.read_444:
            wait, mode, opcode = self.read_444
            qpi = bits((16, 5, wait), (21, 3, mode), (24, 8, opcode))
        return [
            bits((0, 5, 4), (5, 3, 2), (8, 8, 0xEB), (16, 5, 8), (21, 3, 0), (24, 8, 0x6B)),
            bits((0, 5, 8), (5, 3, 0), (8, 8, 0x3B), (16, 5, 2), (21, 3, 2), (24, 8, 0xBB)),
            bits((0, 1, 0), (4, 1, int(self.read_444 is not None))),
            bits((16, 16, 0)),
            qpi,
        ]

    def _erase_types(self, first: int) -> int:
        fields = []
        for k in range(2):
            i = first + k
            exponent, opcode = (0, 0)
            if i < len(self.erase_types):
                size, opcode, _ = self.erase_types[i]
                exponent = size.bit_length() - 1
            fields += [(16 * k, 8, exponent), (16 * k + 8, 8, opcode)]
        return bits(*fields)

    def _erase_times(self) -> int:
        fields = [(0, 4, self.erase_max_n)]
        for i in range(4):
            value = 0
            if i < len(self.erase_types):
                count, unit = encode_time(self.erase_types[i][2], ERASE_UNITS)
                value = (count - 1) | unit << 5
            fields.append((4 + 7 * i, 7, value))
        return bits(*fields)

    def _program_times(self) -> int:
        count, unit = encode_time(self.page_program, PROGRAM_UNITS)
        chip_count, chip_unit = encode_time(self.chip_erase, CHIP_ERASE_UNITS)
        # First byte 4 × 8 µs, further bytes 3 × 1 µs (the engine never programs byte-wise).
        return bits((0, 4, self.program_max_n), (4, 4, self.page_exponent), (8, 5, count - 1), (13, 1, unit),
                    (14, 4, 4 - 1), (18, 1, 1), (19, 4, 3 - 1), (23, 1, 0), (24, 5, chip_count - 1),
                    (29, 2, chip_unit))

    def _tail(self) -> list[int]:
        if self.suspend:
            suspend, resume = self.suspend
            # Supported (bit 31 = 0); during program suspend no erase and no read of the
            # suspended page; during erase suspend programs outside the suspended block only;
            # resume-to-suspend 64 µs; suspend latency 30 × 1 µs.
            d12 = bits((0, 4, 0b1100), (4, 4, 0b1110), (9, 4, 0), (13, 5, 30 - 1), (18, 2, 0b01),
                       (20, 4, 0), (24, 5, 30 - 1), (29, 2, 0b01), (31, 1, 0))
            d13 = bits((0, 8, resume), (8, 8, suspend), (16, 8, resume), (24, 8, suspend))
        else:
            d12, d13 = bits((31, 1, 1)), 0xFFFFFFFF
        # Status polling through 05h bit 0; deep power-down: exit ABh after 20 × 1 µs, enter B9h.
        d14 = bits((2, 1, 1), (3, 1, 0), (8, 5, 20 - 1), (13, 2, 0b01), (15, 8, 0xAB), (23, 8, 0xB9),
                   (31, 1, 0 if self.deep_power_down else 1))
        # No 4-4-4 or 0-4-4 mode, no HOLD/RESET disable.
        d15 = bits((0, 4, 0), (4, 5, 0), (9, 1, 0), (10, 6, 0), (16, 4, 0), (20, 3, self.qer), (23, 1, 0))
        # SR1 write method, soft reset, no 4-byte addressing.
        d16 = bits((0, 7, self.sr1_write), (8, 6, 0b010000 if self.soft_reset_66_99 else 0), (14, 10, 0),
                   (24, 8, 0))
        return [d12, d13, d14, d15, d16]


Table = tuple[int, tuple[int, int], list[int]]      # (parameter id, (major, minor), dwords)


def build_sfdp(bfpt: Bfpt, vendor: tuple[int, int, tuple[int, ...]] | None = None) -> bytes:
    """The SFDP area: header, the BFPT's parameter header (and a vendor table's, given as
    (id, (major, minor) packed as major << 8 | minor, dwords)), then the tables."""
    tables: list[Table] = [(0xFF00, bfpt.revision, bfpt.build())]
    if vendor is not None:
        vendor_id, version, vendor_dwords = vendor
        tables.append((0xFF00 | vendor_id, (version >> 8, version & 0xFF), list(vendor_dwords)))
    return build_area(bfpt.revision, tables)


def build_area(revision: tuple[int, int], tables: list[Table]) -> bytes:
    """An SFDP area of any shape: the header with `revision`, one parameter header per table
    (id LSB at byte 0 and MSB at byte 7, as JESD216 places them), the tables from 0x30 on."""
    major, minor = revision
    area = bytearray(b"SFDP" + bytes((minor, major, len(tables) - 1, 0xFF)))   # legacy SPI access protocol
    address = BFPT_ADDRESS
    for param_id, (t_major, t_minor), dwords in tables:
        area += bytes((param_id & 0xFF, t_minor, t_major, len(dwords))) + address.to_bytes(3, "little") \
            + bytes((param_id >> 8,))
        address += 4 * len(dwords)
    if len(area) > BFPT_ADDRESS:
        raise ValueError("too many parameter headers for tables at 0x30")
    area += b"\xff" * (BFPT_ADDRESS - len(area))
    for _, _, dwords in tables:
        area += struct.pack(f"<{len(dwords)}I", *dwords)
    return bytes(area)
