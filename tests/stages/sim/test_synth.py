"""The synthetic IFWI: §6 structure, valid checksums, seeded content, labels, damage()."""
from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amdflash.stages.image import ifwi
from amdflash.stages.sim import synth
from amdflash.stages.sim.synth import damage, damage_regions, synthetic_ifwi


def u32(data: bytes, offset: int) -> int:
    return struct.unpack_from("<I", data, offset)[0]


@pytest.fixture(scope="module")
def image() -> bytes:
    return synthetic_ifwi(7)


def test_size_and_magic(image):
    assert len(image) == 0x200000
    assert ifwi.check_image(image) == []


def test_every_item_resolves_through_the_driver_resolver(image):
    sizes = {}
    for item in ifwi.ITEMS:
        offset, payload = ifwi.resolve_item(image, item)
        ifwi.check_stream_payload(payload)  # every item is streamable as it stands
        sizes[item] = len(payload)
    assert sizes[0x01] == 0x54 and sizes[0x06] == sizes[0x07] == 0x20
    assert 0x8000 <= sizes[0x08] <= 0x20000  # modest: ~1.4 ms per dword over USB


def test_efs(image):
    assert image[:4] == b"\xaa\x55\xaa\x55"
    assert u32(image, 0x14) == 0x2000 and u32(image, 0x2C) == 0x3000


@pytest.mark.parametrize("offset", [0x2000, 0x3000])
def test_psp_directories_and_their_checksums(image, offset):
    stored, computed = ifwi.psp_directory_checksum(image, offset)
    assert stored == computed
    count = u32(image, offset + 8)
    entries = [struct.unpack_from("<IIQ", image, offset + 0x10 + 0x10 * i) for i in range(count)]
    assert (0x13C, 0x20, 0x12000) in entries and (0x13D, 0x20, 0x13000) in entries
    for _, size, location in entries:
        assert image[location:location + size] != b"\xff" * size


def test_ish_slots_point_at_two_different_partitions(image):
    a, b = image[0x12000:0x12020], image[0x13000:0x13020]
    assert u32(a, 0x14) == 0x13C and u32(b, 0x14) == 0x13D
    for header in (a, b):
        assert u32(header, 0) == ifwi.fletcher32(header[4:])
    (a_at, a_size), (b_at, b_size) = (u32(a, 0x10), u32(a, 0x18)), (u32(b, 0x10), u32(b, 0x18))
    assert a_size == b_size and a_at + a_size <= b_at
    payload_a, payload_b = image[a_at:a_at + a_size], image[b_at:b_at + b_size]
    assert payload_a != payload_b  # B holds an older revision, so that an update shows
    assert ifwi.resolve_item(image, 0x08) == (a_at, payload_a)


def test_sgn_table_has_each_type_once_in_seeded_order(image):
    table = u32(image, 0x1000)
    assert image[table:table + 4] == b"$SGN"
    count = u32(image, table + 8)
    orders = set()
    for seed in range(6):
        img = synthetic_ifwi(seed)
        types = [u32(img, table + 0x10 + 0x10 * i) for i in range(count)]
        assert sorted(types) == list(range(1, 8))
        orders.add(tuple(types))
    assert len(orders) > 1


def test_vbios_part_inside_partition_a(image):
    at, size = u32(image, 0x12010), u32(image, 0x12018)
    payload = image[at:at + size]
    assert payload[:4] == b"$PSP"   # the L2 directory fwupd expects
    assert u32(payload, 4) == ifwi.fletcher32(payload[8:0x10 + 0x10 * u32(payload, 8)])
    fw_id, vbios_size, location = struct.unpack_from("<IIQ", payload, 0x10)
    assert fw_id == 0x01            # fwupd's id for the ATOM/CSM image
    rom = payload[location:location + vbios_size]
    assert at + location == u32(image, 0x1201C)   # the slot header points at it too
    assert rom[:2] == b"\x55\xaa" and rom[2] * 512 == vbios_size
    assert rom[0x1E:0x21] == b"IBM"
    assert sum(rom) % 256 == 0
    strings = rom[struct.unpack_from("<H", rom, 0x6E)[0]:][:0x100]
    assert rom[0x2F] == 4
    assert strings.startswith(b"SYNTH-0001-102\0SYNTHETIC\0PCI_EXPRESS\0GDDR6\0\r\n" + synth.LABEL + b"\0")
    rom_header = struct.unpack_from("<H", rom, 0x48)[0]
    assert rom[rom_header + 4:rom_header + 8] == b"ATOM"
    assert struct.unpack_from("<HH", rom, rom_header + 0x18) == synth.SUBSYSTEM
    pcir = struct.unpack_from("<H", rom, 0x18)[0]
    assert rom[pcir:pcir + 4] == b"PCIR" and struct.unpack_from("<HH", rom, pcir + 4) == (0x1002, 0x744C)


def test_slot_headers_name_partitions_as_fwupd_reads_them(image):
    for header, partition_fw_id, partition in ((0x12000, 0x14D, 0x20000), (0x13000, 0x14E, 0x100000)):
        assert struct.unpack_from("<H", image, header + 0xD)[0] == partition_fw_id
        assert u32(image, header + 0x10) == partition
        assert u32(image, header + 0x1C) == partition + synth.VBIOS_OFFSET


def test_part_key_names_the_board_family():
    other = synthetic_ifwi(7, part_key="SYNTH-0002")
    assert b"SYNTH-0002-102\0" in other and b"SYNTH-0001" not in other
    assert synth.part_number(2) == "SYNTH-0001-102"


def test_labelled_synthetic_and_never_an_amd_image(image):
    assert image.count(synth.LABEL) >= 5  # sector 0, both payloads, both VBIOS parts, metadata
    assert synth.LABEL in image[:0x1000] and synth.LABEL in image[0x1EF000:0x1F0000]
    assert b" 761295520" not in image  # the ATOM magic a real AMD VBIOS carries


def test_metadata_and_region_89(image):
    meta = synth.read_metadata(image)
    assert meta is not None and meta.active == 0 and meta.updates == 0
    b_at, b_size = u32(image, 0x13010), u32(image, 0x13018)
    assert meta.b_checksum == ifwi.fletcher32(image[b_at:b_at + b_size])
    assert image[0x1F0000:0x1F0100] != b"\xff" * 0x100


def test_erased_gaps_like_a_real_flash(image):
    blank = b"\xff" * 0x1000
    assert image[0x6000:0x10000] == b"\xff" * 0xA000
    for cookie in (0x30000, 0x110000):  # no partition was ever updated
        assert image[cookie:cookie + 0x1000] == blank
    assert image[0x1F1000:] == b"\xff" * 0xF000
    assert image.count(0xFF) > 0.85 * len(image)
    assert image[:0x100000] != image[0x100000:]  # a dump's mirror check must not trip


def test_seeds():
    one, again, two = synthetic_ifwi(1), synthetic_ifwi(1), synthetic_ifwi(2)
    assert one == again
    assert one != two
    for item in (0x04, 0x05, 0x08, 0x89):
        assert ifwi.resolve_item(one, item)[1] != ifwi.resolve_item(two, item)[1]
    for item in (0x01, 0x02, 0x06, 0x07):  # structure does not depend on the seed
        assert ifwi.resolve_item(one, item) == ifwi.resolve_item(two, item)


@given(st.binary(max_size=4000).map(lambda b: b[:len(b) & ~1]))
@settings(max_examples=200, deadline=None, database=None)
def test_emulator_and_driver_fletcher32_agree(data):
    assert synth.fletcher32(data) == ifwi.fletcher32(data)


# -- damage ----------------------------------------------------------------------------------

def changed_bytes(a: bytes, b: bytes) -> list[int]:
    out = []
    for sector in range(0, len(a), 0x1000):
        if a[sector:sector + 0x1000] != b[sector:sector + 0x1000]:
            out += [i for i in range(sector, sector + 0x1000) if a[i] != b[i]]
    return out


@pytest.mark.parametrize("seed, regions", [(0, 3), (1, 3), (2, 1), (3, 6)])
def test_damage_changes_only_the_chosen_regions(image, seed, regions):
    chosen = damage_regions(image, seed, regions)
    assert len(chosen) == regions
    assert len({r.offset & ~0xFFF for r in chosen}) == regions
    damaged = damage(image, seed, regions)
    assert len(damaged) == len(image)
    changes = changed_bytes(image, damaged)
    inside = lambda at, r: r.offset <= at < r.offset + r.size  # noqa: E731
    assert all(any(inside(at, r) for r in chosen) for at in changes)
    for region in chosen:
        assert any(inside(at, region) for at in changes)
        span = damaged[region.offset:region.offset + region.size]
        if region.kind == "erased":
            assert region.size == 0x1000 and span == b"\xff" * 0x1000
        else:
            assert all(x != y for x, y in zip(span, image[region.offset:region.offset + region.size]))


def test_damage_is_seeded(image):
    assert damage(image, 4) == damage(image, 4)
    assert damage(image, 4) != damage(image, 5)
    assert damage(image, 4) != image
