"""The driver-side IFWI resolver and checks (docs/psp-mailbox.md), on hand-built images.

The images here are built by the test itself, field by field, so the resolver is checked
against explicit offsets rather than against the synthetic generator's own idea of them.
"""
from __future__ import annotations

import struct

import pytest

from amdflash.stages.image.ifwi import (
                                        FLASH_SIZE, ITEMS, IfwiError, check_image, check_stream_payload, fletcher32, psp_directory_checksum,
                                        resolve_item,
                                        )

SGN_TABLE = 0x8000


def u32(value: int) -> bytes:
    return struct.pack("<I", value)


def put_directory(image: bytearray, offset: int, entries: int) -> None:
    body = u32(entries) + u32(0)
    body += b"".join(struct.pack("<IIQ", 0x40 + i, 0x100, 0x50000 + i * 0x100) for i in range(entries))
    image[offset:offset + 8 + len(body)] = b"$PSP" + u32(fletcher32(body)) + body


def put_sgn(image: bytearray, types: list[int]) -> None:
    table = b"$SGN" + u32(0) + u32(len(types)) + u32(0)
    for sign_type in types:
        at, size = 0x9000 + 0x100 * sign_type, 0x10 * sign_type
        table += struct.pack("<IIII", sign_type, 0, size, at)
        image[at:at + size] = bytes([sign_type]) * size
    image[SGN_TABLE:SGN_TABLE + len(table)] = table
    image[0x1000:0x1004] = u32(SGN_TABLE)


def build_image() -> bytearray:
    image = bytearray(b"\xff" * FLASH_SIZE)
    image[0:0x54] = b"\xaa\x55\xaa\x55" + bytes(range(4, 0x54))
    put_directory(image, 0x2000, 2)
    put_directory(image, 0x3000, 1)
    put_sgn(image, [7, 6, 5, 4, 3, 2, 1])  # reversed: the type, not the position, must decide
    image[0x10000:0x11000] = b"\x04" * 0x1000
    image[0x11000:0x12000] = b"\x05" * 0x1000
    image[0x12000:0x12020] = bytes(0x10) + u32(0x40000) + u32(0x13C) + u32(0x2000) + u32(0)
    image[0x13000:0x13020] = bytes(0x10) + u32(0x60000) + u32(0x13D) + u32(0x2000) + u32(0)
    image[0x40000:0x42000] = b"\x08" * 0x2000
    image[0x1F0000:0x1F0100] = b"\x89" * 0x100
    return image


@pytest.fixture
def image() -> bytearray:
    return build_image()


@pytest.mark.parametrize("item, offset, size", [
    (0x01, 0x0, 0x54), (0x02, 0x2000, 0x30), (0x03, 0x3000, 0x20), (0x04, 0x10000, 0x1000),
    (0x05, 0x11000, 0x1000), (0x06, 0x12000, 0x20), (0x07, 0x13000, 0x20), (0x08, 0x40000, 0x2000),
    (0x80, 0x1000, 4), (0x81, SGN_TABLE, 0x80), (0x89, 0x1F0000, 0x100),
])
def test_items_resolve_to_the_table_offsets(image, item, offset, size):
    got_offset, payload = resolve_item(bytes(image), item)
    assert (got_offset, len(payload)) == (offset, size)
    assert payload == bytes(image[offset:offset + size])


@pytest.mark.parametrize("sign_type", range(1, 8))
def test_signature_items_are_found_by_type(image, sign_type):
    offset, payload = resolve_item(bytes(image), 0x81 + sign_type)
    assert offset == 0x9000 + 0x100 * sign_type
    assert payload == bytes([sign_type]) * (0x10 * sign_type)


def test_every_listed_item_resolves(image):
    assert len(ITEMS) == 18
    for item in ITEMS:
        resolve_item(bytes(image), item)


@pytest.mark.parametrize("item", [0x00, 0x09, 0x10, 0x7F, 0x8A, 0xFF])
def test_unknown_item(image, item):
    with pytest.raises(IfwiError, match=f"item {item:#x} is not in the item table"):
        resolve_item(bytes(image), item)


@pytest.mark.parametrize("item, offset", [(0x02, 0x2000), (0x03, 0x3000)])
def test_bad_psp_cookie(image, item, offset):
    image[offset:offset + 4] = b"$PL2"
    with pytest.raises(IfwiError, match=rf"no \$PSP directory at {offset:#x}"):
        resolve_item(bytes(image), item)


def test_psp_directory_count_beyond_image(image):
    image[0x3008:0x300C] = u32(0x20000)
    with pytest.raises(IfwiError, match="extends beyond"):
        resolve_item(bytes(image), 0x03)


@pytest.mark.parametrize("item", [0x81, 0x82, 0x88])
def test_sgn_pointer_outside_the_image(image, item):
    image[0x1000:0x1004] = u32(0xFFFFFFFF)
    with pytest.raises(IfwiError, match=r"\$SGN pointer .* points beyond the image"):
        resolve_item(bytes(image), item)


@pytest.mark.parametrize("item", [0x81, 0x85])
def test_sgn_pointer_to_something_else(image, item):
    image[0x1000:0x1004] = u32(0x2000)  # a $PSP directory, not a $SGN table
    with pytest.raises(IfwiError, match=r"no \$SGN table at 0x2000"):
        resolve_item(bytes(image), item)


def test_missing_sgn_type(image):
    put_sgn(image, [1, 2, 3, 5, 6, 7])
    with pytest.raises(IfwiError, match="has no entry of type 4"):
        resolve_item(bytes(image), 0x85)
    assert resolve_item(bytes(image), 0x86)[0] == 0x9000 + 0x500


def test_duplicate_sgn_type(image):
    put_sgn(image, [1, 2, 3, 4, 5, 6, 7, 3])
    with pytest.raises(IfwiError, match="has 2 entries of type 3"):
        resolve_item(bytes(image), 0x84)


def test_sgn_count_beyond_image(image):
    image[SGN_TABLE + 8:SGN_TABLE + 12] = u32(0x100000)
    with pytest.raises(IfwiError, match="beyond the image"):
        resolve_item(bytes(image), 0x82)
    with pytest.raises(IfwiError, match="extends beyond"):
        resolve_item(bytes(image), 0x81)


def test_sgn_entry_payload_beyond_image(image):
    entry = SGN_TABLE + 0x10  # the first entry is type 7
    image[entry + 12:entry + 16] = u32(FLASH_SIZE - 0x10)
    with pytest.raises(IfwiError, match="item 0x88 .* extends beyond the 0x200000-byte image"):
        resolve_item(bytes(image), 0x88)


def test_partition_payload_beyond_image(image):
    image[0x12018:0x1201C] = u32(FLASH_SIZE)
    with pytest.raises(IfwiError, match="item 0x8 .* extends beyond"):
        resolve_item(bytes(image), 0x08)


def test_short_image(image):
    short = bytes(image[:0x1F0080])
    with pytest.raises(IfwiError, match="item 0x89 .* extends beyond the 0x1f0080-byte image"):
        resolve_item(short, 0x89)
    with pytest.raises(IfwiError, match="beyond"):
        resolve_item(bytes(image[:0x1002]), 0x80)
    with pytest.raises(IfwiError, match="ISH A's location"):
        resolve_item(bytes(image[:0x12010]), 0x08)


def test_errors_are_value_errors():
    assert issubclass(IfwiError, ValueError)


def test_check_image(image):
    assert check_image(bytes(image)) == []
    assert len(check_image(bytes(image) + b"\xff")) == 1
    image[0:4] = b"\xff\xff\xff\xff"
    problems = check_image(bytes(image))
    assert len(problems) == 1 and "AA55AA55" in problems[0] and "FFFFFFFF" in problems[0]
    both = check_image(bytes(image[:0x100000]))
    assert len(both) == 2 and "0x100000" in both[0]
    assert len(check_image(b"")) == 2


def test_check_stream_payload():
    check_stream_payload(b"\0" * 4)
    check_stream_payload(b"\0" * 0xFFFFFC)
    with pytest.raises(IfwiError, match="empty"):
        check_stream_payload(b"")
    with pytest.raises(IfwiError, match="not a multiple of 4"):
        check_stream_payload(b"\0" * 0x55)
    with pytest.raises(IfwiError, match="24-bit"):
        check_stream_payload(b"\0" * 0x1000000)


@pytest.mark.parametrize("data, expected", [
    # Published Fletcher-32 test vectors (odd lengths zero-padded).
    (b"abcde\0", 0xF04FC729), (b"abcdef", 0x56502D2A), (b"abcdefgh", 0xEBE19591),
    # AMD's variant seeds both sums with 0xFFFF: a zero sum reads 0xFFFF, never 0.
    (b"", 0xFFFFFFFF), (bytes(64), 0xFFFFFFFF),
])
def test_fletcher32(data, expected):
    assert fletcher32(data) == expected


def test_psp_directory_checksum(image):
    stored, computed = psp_directory_checksum(bytes(image), 0x2000)
    assert stored == computed
    image[0x2014] ^= 1  # an entry's size
    stored, computed = psp_directory_checksum(bytes(image), 0x2000)
    assert stored != computed
    image[0x2000] = 0
    with pytest.raises(IfwiError, match=r"no \$PSP directory"):
        psp_directory_checksum(bytes(image), 0x2000)
