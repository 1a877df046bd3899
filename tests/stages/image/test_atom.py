"""The ATOM VBIOS parser on hand-built images: every field at its public offset, every refusal."""
from __future__ import annotations

import struct

import pytest

from amdflash.stages.image.atom import AtomError, BytesSource, UnitSource, parse_atom, part_key, part_version, same_part
from tests.stages.image.build import PCIR_AT, ROM_HEADER, STRINGS, atom_rom


def parse(rom: bytes, base: int = 0):  # noqa: ANN201
    return parse_atom(BytesSource(bytes(rom)), base)


def test_every_field_at_its_offset():
    atom = parse(atom_rom())
    assert atom.part_number == "113-TESTPART-042"
    assert (atom.asic, atom.pci_type, atom.memory_type) == ("NAVI31", "PCI_EXPRESS", "GDDR6")
    assert atom.model_name == "TEST BOARD MODEL"            # trailing blanks stripped, as amdgpu does
    assert atom.version == "022.001.002.008.000001"
    assert atom.date == "2023/03/27 09:41"
    assert (atom.vendor_id, atom.device_id) == (0x1002, 0x744C)
    assert (atom.subsystem_vendor_id, atom.subsystem_id) == (0x1DA2, 0xE471)
    assert atom.rom_header == ROM_HEADER and atom.size == 0x1000 and atom.ati_magic
    assert atom.key == "113-TESTPA" and atom.pn_version == "042"
    assert atom.notes == ()


def test_an_image_inside_a_larger_source():
    data = b"\xff" * 0x5000 + bytes(atom_rom()) + b"\xff" * 0x100
    atom = parse(data, 0x5000)
    assert atom.offset == 0x5000 and atom.part_number == "113-TESTPART-042"


def test_fewer_strings_and_no_version_or_pci_data():
    atom = parse(atom_rom(strings=(b"113-ONLY-001",), version=None, pci=None, ati_magic=False))
    assert atom.part_number == "113-ONLY-001" and atom.asic is None and atom.memory_type is None
    assert atom.version is None and atom.vendor_id is None and not atom.ati_magic
    assert any("PCIR" in note for note in atom.notes)


def test_a_long_string_is_cut_at_31_characters_as_fwupd_reads_it():
    long = b"X" * 40
    atom = parse(atom_rom(strings=(long, b"ASIC")))
    assert atom.part_number == "X" * 31
    # fwupd moves on by the length it read plus one: it lands inside the long string.
    assert atom.asic == "X" * 8


def test_non_printable_characters_read_as_dots():
    assert parse(atom_rom(strings=(b"113-\x01BAD-\x7f01",))).part_number == "113-.BAD-.01"


def test_an_unparseable_date_is_left_out():
    assert parse(atom_rom(date=b"xx/yy/zz 00:00:00\0")).date is None


@pytest.mark.parametrize("change, message", [
    (lambda r: r.__setitem__(slice(0, 2), b"\xff\xff"), r"no option ROM at 0x0: it starts ff ff"),
    (lambda r: r.__setitem__(slice(0x1E, 0x21), b"XYZ"), r"lacks the 'IBM' mark"),
    (lambda r: r.__setitem__(slice(ROM_HEADER + 4, ROM_HEADER + 8), b"MOTA"), r"no ATOM ROM header at 0x300"),
    (lambda r: r.__setitem__(0x2F, 0), r"declares no strings"),
    (lambda r: r.__setitem__(0x2F, 5), r"declares 5 strings"),
    (lambda r: struct.pack_into("<H", r, 0x6E, 0), r"has no string pointer"),
    (lambda r: r.__setitem__(STRINGS, 0), r"part number string .* is empty"),
    (lambda r: (struct.pack_into("<H", r, 0x6E, 0x1F0), r.__setitem__(2, 1)),
     r"strings at \+0x1f0 extend beyond the image's declared 0x200 bytes"),
    (lambda r: struct.pack_into("<H", r, 0x48, 0xFFF0), r"ATOM ROM header .* lies beyond"),
])
def test_refusals_name_what_is_wrong(change, message):
    rom = atom_rom()
    change(rom)
    with pytest.raises(AtomError, match=message):
        parse(rom)


def test_a_truncated_source_is_an_error_not_a_crash():
    rom = bytes(atom_rom())
    for cut in (0, 1, 0x40, 0x73, STRINGS + 4, ROM_HEADER + 2):
        with pytest.raises(AtomError):
            parse(rom[:cut])


def test_pcir_pointing_at_something_else_is_a_note():
    rom = atom_rom()
    rom[PCIR_AT:PCIR_AT + 4] = b"NOPE"
    atom = parse(rom)
    assert atom.vendor_id is None and "PCIR" in atom.notes[0]


def test_part_key_and_version_as_fwupd_derives_them():
    assert part_key("113-D7040100-114") == "113-D70401"
    assert part_version("113-D7040100-114") == "114"
    assert part_version("NODASHES") is None
    assert same_part("113-D7040100-114", "113-D7040100-102")       # one board, two versions
    assert not same_part("113-D7040100-114", "113-D7060100-114")


def test_unit_source_reads_each_unit_once():
    data = bytes(range(256)) * 64          # 16 KiB
    reads: list[tuple[int, int]] = []

    def read_unit(address: int, size: int) -> bytes:
        reads.append((address, size))
        return data[address:address + size]

    src = UnitSource(read_unit, len(data), unit=0x1000)
    assert src.read(0xFF0, 0x20) == data[0xFF0:0x1010]       # spans two units
    assert src.read(0x1008, 4) == data[0x1008:0x100C]          # cached
    assert src.read(0x3FFC, 0x10) == data[0x3FFC:]             # clipped at the end
    assert src.read(0x4000, 4) == b"" and src.read(-4, 4) == b""
    assert reads == [(0x0, 0x1000), (0x1000, 0x1000), (0x3000, 0x1000)]
