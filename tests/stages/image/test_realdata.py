"""The ATOM parser and `image info` on real VBIOS images: nine Polaris ROMs from public
repositories, in ../shared/realdata/vbios beside the repository (never copied into it).

The expected values were read out of each ROM by another route than stages/image/atom.py: the
part number is the "113-" string found by searching the ROM's first KiB, the version the
text after the "ATOMBIOSBK-AMD VER" anchor found anywhere, the PCI ids the four bytes after
the "PCIR" signature found by searching, and the subsystem ids the two words at +0x18 of the
ATOM ROM header found by searching for its "ATOM" signature (the occurrence preceded by a
plausible table size, not the "ATOMBIOS" strings). They agree with the file names where the
names carry a part number, and the subsystem vendors are the boards' makers (174B PC
Partner/Sapphire, 1002 AMD, 1462 MSI, 1DA2 Sapphire, 1028 Dell, 1682 XFX).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from amdflash.stages.image.atom import BytesSource, parse_atom
from tests.pipeline.engine.conftest import cli, db  # noqa: F401 - fixtures

ROOT = Path(__file__).resolve().parents[3]


def realdata(*parts: str) -> Path:
    """A path under ../shared/realdata (relative to the repository root); skips the test when
    the real data is not there."""
    path = ROOT.parent / "shared" / "realdata"
    if not path.is_dir():
        pytest.skip(f"real data not present: {path} (the tests that use it are skipped)")
    return path.joinpath(*parts)


# ROM file -> (part number, VBIOS version, PCI vendor, device, subsystem vendor, subsystem id)
ROMS = {
    "RX460_113-C9940104-O09_Micron.rom": ("113-C9940104-O09", "015.050.000.000.000000", 0x1002, 0x67EF, 0x174B, 0xE344),
    "RX470_E387PROA1-RX470-P_N113-WE3874U-M5E.rom":
        ("113-WE3874U.M5E", "015.050.000.001.000000", 0x1002, 0x67DF, 0x174B, 0x387E),
    "RX480_AMD.RX480.8192.160603.rom": ("113-D0090101-100", "015.050.000.000.006785", 0x1002, 0x67DF, 0x1002, 0x0B37),
    "RX480_Sapphire.RX480.8192.160603.rom":
        ("113-D0090101-100", "015.050.000.000.006785", 0x1002, 0x67DF, 0x1002, 0x0B37),
    "RX560_113-C98121-H01_Hynix.rom": ("113-C98121-H01", "015.050.002.001.000000", 0x1002, 0x67FF, 0x1462, 0x8A91),
    "RX580_113-1E3664U-O65_SAM_HYN4.rom": ("113-1E3664U-O65", "015.050.002.001.000000", 0x1002, 0x67DF, 0x1DA2, 0xE366),
    "RX580_DELL_113-D00904RE-103_SAM_HYN2.rom":
        ("113-D00904RE-103", "015.050.000.001.007942", 0x1002, 0x67DF, 0x1028, 0x1701),
    "RX580_XFX.113-58085SHD1-M80.SAM_HYN2.rom":
        ("113-58085SHD1-M80", "015.050.002.001.000000", 0x1002, 0x67DF, 0x1682, 0xC580),
    "blindmisfits_Sapphire.RX570.4096.190114.rom":
        ("113-D00035-L01", "015.050.002.001.000000", 0x1002, 0x67DF, 0x1DA2, 0xE343),
}


@pytest.mark.parametrize("name", sorted(ROMS))
def test_the_atom_parser_reads_each_real_rom(name):
    data = realdata("vbios", name).read_bytes()
    atom = parse_atom(BytesSource(data))
    part, version, vendor, device, sub_vendor, sub_id = ROMS[name]
    assert atom.part_number == part and atom.version == version
    assert (atom.vendor_id, atom.device_id) == (vendor, device)
    assert (atom.subsystem_vendor_id, atom.subsystem_id) == (sub_vendor, sub_id)
    assert atom.ati_magic and atom.notes == ()              # the kernel would load every one of them


def test_the_real_roms_are_all_there():
    found = {p.name for p in realdata("vbios").glob("*.rom")}
    assert found == set(ROMS)


def test_image_info_on_a_real_vbios_says_what_it_is_and_that_it_is_not_an_ifwi(cli):
    path = realdata("vbios", "RX580_DELL_113-D00904RE-103_SAM_HYN2.rom")
    r = cli("image", "info", path)
    assert r.code == 1
    assert "NOT an IFWI" in r.out and "not an IFWI: a plain VBIOS for part 113-D00904RE-103" in r.out
    assert "PCI id        1002:67df   subsystem 1028:1701" in r.out
    assert "VBIOS version 015.050.000.001.007942" in r.out
    report = json.loads(cli("image", "info", path, "--format", "json").out)
    assert report["kind"] == "vbios" and report["part_number"] is None
    assert report["vbios"]["part_number"] == "113-D00904RE-103" and report["vbios"]["subsystem_id"] == 0x1701
