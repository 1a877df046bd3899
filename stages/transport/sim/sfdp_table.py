"""The emulated GD25LQ16E's SFDP table (JESD216B, revision 1.6), built field by field.

No dump of the real part's table is public (docs/flash-chip.md), so every field below is an
assumption except the ones §7 fixes: the "SFDP" signature, revision 1.6, the BFPT
parameter id 0xFF00, density (dword 2), the three erase types (dwords 8/9) and the page
size (dword 11). The rest describes what the GD25LQ family's datasheets describe, chosen so
that the table agrees with itself and with the model in gd25.py:

* fast-read modes 1-1-2 (3Bh), 1-2-2 (BBh), 1-1-4 (6Bh), 1-4-4 (EBh) are advertised
  because the silicon has them; the model does not implement them because the ROM_SW
  engine drives a single data line. 2-2-2, 4-4-4 (QPI) and 0-4-4 are not advertised;
* erase/program times encode the typical column of §7 as closely as the JESD216 units
  allow (4 KiB: 48 ms, 32 KiB: 144 ms, 64 KiB: 256 ms, page: 512 µs, chip: 8 s) with a
  max multiplier of 6 (4 KiB max = 288 ms, within the confirmed 300 ms);
* QER = 100b: QE is SR2 bit 1, written by 01h with two data bytes; a one-byte 01h leaves
  SR2 alone — exactly how the model treats a one-byte 01h;
* suspend/resume (75h/7Ah), deep power-down (B9h/ABh), reset (66h + 99h) and the
  50h volatile status-register enable are advertised as the model implements them.

Byte order: every dword is little-endian, as JESD216 lays tables out.
"""
from __future__ import annotations

import struct

SFDP_REVISION = (1, 6)      # (major, minor)
BFPT_ADDRESS = 0x30
BFPT_DWORDS = 16


def _bits(*fields: tuple[int, int, int]) -> int:
    """Assemble a dword from (lsb, width, value) fields; unlisted bits stay 1 (reserved)."""
    dword = 0xFFFFFFFF
    for lsb, width, value in fields:
        if value >> width:
            raise ValueError(f"field at bit {lsb} does not fit in {width} bits: {value:#x}")
        mask = ((1 << width) - 1) << lsb
        dword = (dword & ~mask) | (value << lsb)
    return dword


def _erase_time(typical_count: int, unit: int) -> int:
    """JESD216B erase time field: 5-bit count (value − 1) and 2-bit unit (1/16/128/1000 ms)."""
    return (typical_count - 1) | unit << 5


_MS16 = 0b01  # erase time unit 16 ms


def _bfpt() -> list[int]:
    dw = [
        # 1: uniform 4 KiB erase with 20h, write granularity >= 64 B, non-volatile BP bits
        #    (50h selects the volatile copy), 3-byte addressing, 1-1-2/1-2-2/1-4-4/1-1-4.
        _bits((0, 2, 0b01), (2, 1, 1), (3, 1, 0), (4, 1, 0), (8, 8, 0x20),
              (16, 1, 1), (17, 2, 0b00), (19, 1, 0), (20, 1, 1), (21, 1, 1), (22, 1, 1)),
        # 2: density in bits, minus one: 16 Mbit.
        0x00FFFFFF,
        # 3: 1-4-4 EBh (4 dummy + 2 mode clocks), 1-1-4 6Bh (8 dummy clocks).
        _bits((0, 5, 4), (5, 3, 2), (8, 8, 0xEB), (16, 5, 8), (21, 3, 0), (24, 8, 0x6B)),
        # 4: 1-1-2 3Bh (8 dummy clocks), 1-2-2 BBh (2 dummy + 2 mode clocks).
        _bits((0, 5, 8), (5, 3, 0), (8, 8, 0x3B), (16, 5, 2), (21, 3, 2), (24, 8, 0xBB)),
        # 5: neither 2-2-2 nor 4-4-4.
        _bits((0, 1, 0), (4, 1, 0)),
        # 6: 2-2-2 fast read: unsupported, fields zero.
        _bits((16, 16, 0)),
        # 7: 4-4-4 fast read: unsupported, fields zero.
        _bits((16, 16, 0)),
        # 8: erase type 1 = 4 KiB / 20h, type 2 = 32 KiB / 52h.
        _bits((0, 8, 0x0C), (8, 8, 0x20), (16, 8, 0x0F), (24, 8, 0x52)),
        # 9: erase type 3 = 64 KiB / D8h, type 4 unused.
        _bits((0, 8, 0x10), (8, 8, 0xD8), (16, 8, 0x00), (24, 8, 0x00)),
        # 10: erase times: max = 2 × (2 + 1) × typical; 48 ms, 144 ms, 256 ms; type 4 none.
        _bits((0, 4, 2), (4, 7, _erase_time(3, _MS16)), (11, 7, _erase_time(9, _MS16)),
              (18, 7, _erase_time(16, _MS16)), (25, 7, 0)),
        # 11: program max multiplier 6×, page = 2^8 bytes, page program 8 × 64 µs, first
        #     byte 4 × 8 µs, further bytes 3 × 1 µs, chip erase 2 × 4 s.
        _bits((0, 4, 2), (4, 4, 8), (8, 5, 8 - 1), (13, 1, 1), (14, 4, 4 - 1), (18, 1, 1),
              (19, 4, 3 - 1), (23, 1, 0), (24, 5, 2 - 1), (29, 2, 0b10)),
        # 12: suspend/resume supported (bit 31 = 0); during program suspend no erase and no
        #     read of the suspended page; during erase suspend programs outside the
        #     suspended block only; resume-to-suspend 64 µs; suspend latency 30 × 1 µs.
        _bits((0, 4, 0b1100), (4, 4, 0b1110), (9, 4, 0), (13, 5, 30 - 1), (18, 2, 0b01),
              (20, 4, 0), (24, 5, 30 - 1), (29, 2, 0b01), (31, 1, 0)),
        # 13: program resume/suspend, then erase resume/suspend opcodes.
        _bits((0, 8, 0x7A), (8, 8, 0x75), (16, 8, 0x7A), (24, 8, 0x75)),
        # 14: status polling through 05h bit 0; exit deep power-down after 20 × 1 µs with
        #     ABh, enter with B9h; deep power-down supported (bit 31 = 0).
        _bits((2, 1, 1), (3, 1, 0), (8, 5, 20 - 1), (13, 2, 0b01), (15, 8, 0xAB),
              (23, 8, 0xB9), (31, 1, 0)),
        # 15: no 4-4-4 or 0-4-4 mode, QER = 100b, no HOLD/RESET disable.
        _bits((0, 4, 0), (4, 5, 0), (9, 1, 0), (10, 6, 0), (16, 4, 0), (20, 3, 0b100),
              (23, 1, 0)),
        # 16: SR1 non-volatile with a volatile override enabled by 50h; soft reset 66h+99h;
        #     no 4-byte addressing.
        _bits((0, 7, 0b0001000), (8, 6, 0b010000), (14, 10, 0), (24, 8, 0)),
    ]
    if len(dw) != BFPT_DWORDS:
        raise AssertionError("BFPT must have 16 dwords for JESD216B")
    return dw


def build_sfdp() -> bytes:
    major, minor = SFDP_REVISION
    header = b"SFDP" + bytes((minor, major, 0, 0xFF))  # NPH = 0 (one header), legacy SPI
    parameter_header = bytes((0x00, minor, major, BFPT_DWORDS)) \
        + BFPT_ADDRESS.to_bytes(3, "little") + b"\xff"
    table = bytearray(header + parameter_header)
    table += b"\xff" * (BFPT_ADDRESS - len(table))
    table += struct.pack(f"<{BFPT_DWORDS}I", *_bfpt())
    return bytes(table)


SFDP_TABLE: bytes = build_sfdp()
