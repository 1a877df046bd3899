"""The walk EFS → L1 → ISH → partition → ATOM image, on hand-built IFWIs."""
from __future__ import annotations

import struct

import pytest

from amdflash.stages.image.atom import BytesSource
from amdflash.stages.image.part_check import flash_part
from amdflash.stages.image.partitions import LayoutError, read_layout
from tests.stages.image.build import directory, ifwi, slot_header, u32


def layout(image: bytes):  # noqa: ANN201
    return read_layout(BytesSource(bytes(image)))


def test_both_partitions_and_the_image_part_number():
    lay = layout(ifwi())
    a, b = lay.slot("ISH_A"), lay.slot("ISH_B")
    assert (a.partition, a.location, a.size, a.csm_at, a.priority) == ("A", 0x10000, 0x20000, 0x12000, 1)
    assert (b.partition, b.location, b.csm_at, b.priority) == ("B", 0x40000, 0x42000, 0)
    assert a.atom.part_number == "113-TESTPART-042" and b.atom.part_number == "113-TESTPART-041"
    assert a.l2_entries == 1 and lay.notes == ()
    assert lay.image_vbios().part_number == "113-TESTPART-042"   # ISH_A → partition A, as fwupd


def test_the_part_number_comes_from_ish_a_even_when_listed_second():
    image = ifwi()
    d = directory([(0x13D, 0x20, 0x9000), (0x13C, 0x20, 0x8000)])
    image[0x3000:0x3000 + len(d)] = d
    assert layout(image).image_vbios().part_number == "113-TESTPART-042"


def test_other_l1_entries_are_skipped_with_a_note():
    lay = layout(ifwi(l1_extra=[(0x40, 0x1000, 0x5000)]))
    assert [s.ish for s in lay.slots] == ["ISH_A", "ISH_B"]
    assert "fw id 0x40" in lay.notes[0] and "fwupd refuses" in lay.notes[0]


def test_ish_a_naming_partition_b_gives_no_image_part_number():
    image = ifwi()
    image[0x8000:0x8020] = slot_header(0x14E, 0x10000, 0x20000, 0x12000)
    with pytest.raises(LayoutError, match="names partition fw id 0x14e, not partition A"):
        layout(image).image_vbios()


def test_unknown_partition_fw_id_is_that_slots_problem():
    image = ifwi()
    image[0x9000:0x9020] = slot_header(0x777, 0x40000, 0x20000, 0x42000)
    lay = layout(image)
    assert lay.slot("ISH_B").atom is None and "0x777" in lay.slot("ISH_B").problem
    assert lay.image_vbios().part_number == "113-TESTPART-042"


@pytest.mark.parametrize("offset, value, message", [
    (0x0, b"\xff\xff\xff\xff", "no IFWI: the EFS at 0 starts ff ff ff ff"),
    (0x14, u32(0x7FFFF0), "the L1 \\$PSP directory .* lies beyond"),
    (0x3000, b"$BHD", "no \\$PSP directory at 0x3000"),
    (0x3008, u32(1000), "claims 1000 entries"),
    (0x3008, u32(0), "has no image slot header"),
])
def test_structural_refusals(offset, value, message):
    image = ifwi()
    image[offset:offset + len(value)] = value
    with pytest.raises(LayoutError, match=message):
        layout(image)


@pytest.mark.parametrize("offset, value, message", [
    (0x10000, b"$PL2", "does not start with a \\$PSP directory"),
    (0x10008, u32(0x4000), "claims 16384 entries, more than"),
    (0x12000, b"\xff\xff", "no option ROM at 0x12000"),
    (0x801C, u32(0x7FFFFF00), "lies beyond"),
])
def test_a_broken_partition_a_is_named(offset, value, message):
    image = ifwi()
    image[offset:offset + len(value)] = value
    lay = layout(image)
    assert lay.slot("ISH_B").atom is not None          # the other partition still reads
    with pytest.raises(LayoutError, match=f"partition A .*{message}"):
        lay.image_vbios()


def test_a_damaged_board_falls_back_to_partition_b():
    image = ifwi()
    image[0x12000:0x13000] = b"\xff" * 0x1000
    board = flash_part(BytesSource(bytes(image)))
    assert board.state == "found" and board.part_number == "113-TESTPART-041"
    assert board.detail.startswith("partition B, as partition A cannot be read:")


def test_board_states():
    assert flash_part(BytesSource(b"\xff" * 0x80000)).state == "blank"
    bad = ifwi()
    bad[0x12000:0x13000] = bytes(0x1000)
    bad[0x42000:0x43000] = bytes(0x1000)
    board = flash_part(BytesSource(bytes(bad)))
    assert board.state == "unreadable" and "partition A" in board.detail
    zeros = flash_part(BytesSource(bytes(0x80000)))
    assert zeros.state == "unreadable" and "EFS" in zeros.detail


def test_describe_names_each_partition():
    text = "\n".join(layout(ifwi()).describe())
    assert "ISH_A at 0x8000: partition A at 0x10000" in text and "113-TESTPART-041" in text


def test_slot_header_fields_are_where_fwupd_reads_them():
    raw = slot_header(0x14D, 0x1234, 0x5678, 0x9ABC, priority=7, retries=3)
    assert len(raw) == 0x20
    assert struct.unpack_from("<H", raw, 0xD)[0] == 0x14D
    assert struct.unpack_from("<IIII", raw, 0x10) == (0x1234, 0, 0x5678, 0x9ABC)
    assert struct.unpack_from("<II", raw, 4) == (7, 3)
