"""IFWI images on the driver side: item resolution for the PSP stream, and pre-write checks.

`resolve_item` implements the item table of docs/psp-mailbox.md exactly as the hardware-validated
reference resolves it: the bytes the PSP boot firmware receives for each item it requests.
It adds no structural rule of its own (a stricter resolver could refuse a real image that
the firmware accepts); it only turns every way the table can fail into an `IfwiError` that
names the item, the offset and what was found there.

This module knows nothing about the emulated board. Its Fletcher-32 is deliberately its own
implementation, independent of the emulator's, so that each checks the other in the tests.
"""
from __future__ import annotations

import struct
from itertools import accumulate

from amdflash.stages.drivers.flash.geometry import FLASH_SIZE

EFS_MAGIC = b"\xaa\x55\xaa\x55"
PSP_COOKIE = b"$PSP"
SGN_MAGIC = b"$SGN"
MAX_STREAM_SIZE = 0xFFFFFF  # START_TRANSFER carries the size in 24 bits

PSP_DIRECTORY = {0x02: 0x2000, 0x03: 0x3000}
FIXED_ITEMS = {  # item: (offset, size)
    0x01: (0x0000, 0x54),      # EFS
    0x04: (0x10000, 0x1000),
    0x05: (0x11000, 0x1000),
    0x06: (0x12000, 0x20),     # ISH A
    0x07: (0x13000, 0x20),     # ISH B
    0x80: (0x1000, 4),         # pointer to the $SGN table
    0x89: (0x1F0000, 0x100),
}
SGN_POINTER = 0x1000
SGN_ENTRIES = 0x10          # entries start after the 16-byte table header
SGN_ENTRY = struct.Struct("<IIII")  # type, (unknown), size, offset
SGN_ITEMS = range(0x82, 0x89)  # item − 0x81 is the $SGN type, 1..7
ISH_A = 0x12000
ISH_LOCATION, ISH_SIZE = 0x10, 0x18
PARTITION_PAYLOAD = 0x08

ITEMS: tuple[int, ...] = (0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, *range(0x80, 0x8A))

_U32 = struct.Struct("<I")


class IfwiError(ValueError):
    """An image that cannot supply what the PSP asks for, or may not be streamed or written."""


def fletcher32(data: bytes) -> int:
    """Fletcher-32 as AMD PSP directories carry it (the algorithm coreboot's amdfwtool and
    PSPTool implement): little-endian 16-bit words, both sums start at 0xFFFF and are reduced
    with end-around carry. That is the textbook Fletcher-32 modulo 65535, except that a sum
    which is 0 modulo 65535 reads 0xFFFF (ones' complement never yields zero from a non-zero
    start)."""
    if len(data) % 2:
        raise ValueError("Fletcher-32 runs over 16-bit words: the data length must be even")
    words = struct.unpack(f"<{len(data) // 2}H", data)
    low = sum(words) % 0xFFFF or 0xFFFF
    high = sum(accumulate(words)) % 0xFFFF or 0xFFFF
    return high << 16 | low


def psp_directory_checksum(image: bytes, offset: int) -> tuple[int, int]:
    """(stored, computed) checksum of the `$PSP` directory at `offset`: the sum covers the
    header after the checksum field (entry count, reserved) and every entry."""
    _, payload = _psp_directory(image, offset, f"$PSP directory at {offset:#x}")
    return _u32(image, offset + 4, "the $PSP checksum"), fletcher32(payload[8:])


def resolve_item(image: bytes, item: int) -> tuple[int, bytes]:
    """(offset, payload) the PSP receives for `item`, per the §5 table."""
    if item in FIXED_ITEMS:
        offset, size = FIXED_ITEMS[item]
        return offset, _slice(image, f"item {item:#x}", offset, size)
    if item in PSP_DIRECTORY:
        return _psp_directory(image, PSP_DIRECTORY[item], f"item {item:#x}")
    if item == 0x81:
        table = _sgn_table(image, item)
        count = _u32(image, table + 8, "the $SGN entry count")
        return table, _slice(image, f"item {item:#x}", table, (count + 1) * 0x10)
    if item in SGN_ITEMS:
        return _sgn_entry(image, item)
    if item == PARTITION_PAYLOAD:
        # The first ISH names the payload; the PSP, not the host, picks the partition it writes.
        offset = _u32(image, ISH_A + ISH_LOCATION, "ISH A's location")
        size = _u32(image, ISH_A + ISH_SIZE, "ISH A's size")
        return offset, _slice(image, f"item {item:#x}", offset, size)
    known = "0x01..0x08, 0x80..0x89"
    raise IfwiError(f"IFWI item {item:#x} is not in the item table ({known}): cannot resolve it")


def check_image(image: bytes) -> list[str]:
    """Problems that make `image` unfit to be written as a Navi31 IFWI (empty list: none)."""
    problems = []
    if len(image) != FLASH_SIZE:
        problems.append(f"image is {len(image):#x} bytes, a Navi31 IFWI is exactly {FLASH_SIZE:#x}")
    if bytes(image[:4]) != EFS_MAGIC:
        found = bytes(image[:4]).hex().upper() or "nothing"
        problems.append(f"image does not start with the IFWI magic AA55AA55 (found {found})")
    return problems


def check_stream_payload(payload: bytes) -> None:
    """Refuse a payload the mailbox cannot carry: DATA_TRANSFER moves whole dwords and
    START_TRANSFER announces the size in 24 bits."""
    if not payload:
        raise IfwiError("payload is empty: there is nothing to stream")
    if len(payload) > MAX_STREAM_SIZE:
        raise IfwiError(f"payload is {len(payload):#x} bytes, more than the mailbox's 24-bit size field "
                        f"({MAX_STREAM_SIZE:#x})")
    if len(payload) % 4:
        raise IfwiError(f"payload is {len(payload):#x} bytes, not a multiple of 4 (DATA_TRANSFER sends dwords)")


# -- helpers ---------------------------------------------------------------------------------

def _u32(image: bytes, offset: int, what: str) -> int:
    if offset + 4 > len(image):
        raise IfwiError(f"{what} at {offset:#x} lies beyond the {len(image):#x}-byte image")
    return _U32.unpack_from(image, offset)[0]


def _slice(image: bytes, what: str, offset: int, size: int) -> bytes:
    if offset + size > len(image):
        raise IfwiError(f"{what} ({size:#x} bytes at {offset:#x}) extends beyond the {len(image):#x}-byte image")
    return bytes(image[offset:offset + size])


def _psp_directory(image: bytes, offset: int, what: str) -> tuple[int, bytes]:
    cookie = bytes(image[offset:offset + 4])
    if cookie != PSP_COOKIE:
        raise IfwiError(f"{what}: no $PSP directory at {offset:#x} (cookie reads {cookie!r}, expected b'$PSP')")
    count = _u32(image, offset + 8, "the $PSP entry count")
    return offset, _slice(image, what, offset, (count + 1) * 0x10)


def _sgn_table(image: bytes, item: int) -> int:
    table = _u32(image, SGN_POINTER, "the $SGN table pointer")
    if table + SGN_ENTRIES > len(image):
        raise IfwiError(f"item {item:#x}: the $SGN pointer at {SGN_POINTER:#x} ({table:#x}) points beyond the image")
    magic = bytes(image[table:table + 4])
    if magic != SGN_MAGIC:
        raise IfwiError(
            f"item {item:#x}: no $SGN table at {table:#x} (pointer at {SGN_POINTER:#x}; magic reads {magic!r})")
    return table


def _sgn_entry(image: bytes, item: int) -> tuple[int, bytes]:
    table = _sgn_table(image, item)
    wanted = item - 0x81
    count = _u32(image, table + 8, "the $SGN entry count")
    end = table + SGN_ENTRIES + count * SGN_ENTRY.size
    if end > len(image):
        raise IfwiError(f"item {item:#x}: the $SGN table at {table:#x} claims {count} entries, beyond the image")
    matches = [entry for entry in SGN_ENTRY.iter_unpack(image[table + SGN_ENTRIES:end]) if entry[0] == wanted]
    if len(matches) != 1:
        problem = "has no entry" if not matches else f"has {len(matches)} entries"
        raise IfwiError(
            f"item {item:#x}: the $SGN table at {table:#x} {problem} of type {wanted}; exactly one is required")
    _, _, size, offset = matches[0]
    return offset, _slice(image, f"item {item:#x}", offset, size)
