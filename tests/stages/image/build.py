"""Hand-built ATOM images and IFWIs for the parser tests, field by field at explicit offsets.

Built here, not by the synthetic generator, so that the parser is checked against the
public field positions rather than against the generator's own idea of them.
"""
from __future__ import annotations

import struct

ROM_SIZE = 0x1000
STRINGS = 0x90
ROM_HEADER = 0x300
PCIR_AT = 0x380


def atom_rom(strings: tuple[bytes, ...] = (b"113-TESTPART-042", b"NAVI31", b"PCI_EXPRESS", b"GDDR6"),
             name: bytes = b"TEST BOARD MODEL  ", version: bytes | None = b"022.001.002.008.000001",
             date: bytes = b"03/27/23 09:41:00\0", subsystem: tuple[int, int] = (0x1DA2, 0xE471),
             pci: tuple[int, int] | None = (0x1002, 0x744C), ati_magic: bool = True) -> bytearray:
    rom = bytearray(ROM_SIZE)
    rom[0:3] = b"\x55\xaa" + bytes([ROM_SIZE // 512])
    struct.pack_into("<H", rom, 0x18, PCIR_AT if pci else 0)
    rom[0x1E:0x21] = b"IBM"
    rom[0x2F] = len(strings)
    if ati_magic:
        rom[0x30:0x3A] = b" 761295520"
    struct.pack_into("<H", rom, 0x48, ROM_HEADER)
    rom[0x50:0x50 + len(date)] = date
    struct.pack_into("<H", rom, 0x6E, STRINGS)
    text = b"".join(s + b"\0" for s in strings) + b"\r\n" + name + b"\0"
    if version is not None:
        text += b"ATOMBIOSBK-AMD VER" + version + b"\0"
    rom[STRINGS:STRINGS + len(text)] = text
    header = bytearray(0x28)
    struct.pack_into("<HBB4s", header, 0, 0x28, 2, 2, b"ATOM")
    struct.pack_into("<HH", header, 0x18, *subsystem)
    rom[ROM_HEADER:ROM_HEADER + 0x28] = header
    if pci:
        rom[PCIR_AT:PCIR_AT + 8] = b"PCIR" + struct.pack("<HH", *pci)
    return rom


def u32(value: int) -> bytes:
    return struct.pack("<I", value)


def slot_header(partition_fw_id: int, location: int, size: int, csm: int, priority: int = 1,
                retries: int = 0) -> bytes:
    return struct.pack("<IIIBHBIIII", 0, priority, retries, 0xFF, partition_fw_id, 0xFF, location, 0, size, csm)


def directory(entries: list[tuple[int, int, int]]) -> bytes:
    body = u32(len(entries)) + u32(0) + b"".join(struct.pack("<IIQ", *e) for e in entries)
    return b"$PSP" + u32(0) + body


def ifwi(size: int = 0x80000, a_part: bytes = b"113-TESTPART-042", b_part: bytes = b"113-TESTPART-041",
         l1_extra: list[tuple[int, int, int]] | None = None) -> bytearray:
    """EFS → L1 at 0x3000 → ISH_A at 0x8000, ISH_B at 0x9000 → partitions at 0x10000 and 0x40000,
    each an L2 directory with the ATOM image 0x2000 into the partition."""
    image = bytearray(b"\xff" * size)
    image[0:4] = b"\xaa\x55\xaa\x55"
    image[0x14:0x18] = u32(0x3000)
    entries = [(0x13C, 0x20, 0x8000), (0x13D, 0x20, 0x9000)] + (l1_extra or [])
    d = directory(entries)
    image[0x3000:0x3000 + len(d)] = d
    for ish, fw_id, at, part in ((0x8000, 0x14D, 0x10000, a_part), (0x9000, 0x14E, 0x40000, b_part)):
        image[ish:ish + 0x20] = slot_header(fw_id, at, 0x20000, at + 0x2000, priority=1 if fw_id == 0x14D else 0)
        l2 = directory([(0x01, ROM_SIZE, 0x2000)])
        image[at:at + len(l2)] = l2
        image[at + 0x2000:at + 0x2000 + ROM_SIZE] = atom_rom(strings=(part, b"NAVI31", b"PCI_EXPRESS", b"GDDR6"))
    return image
