"""`amdflash image info`: what an image is for, and why not when it cannot tell."""
from __future__ import annotations

import json

from amdflash.stages.sim.synth import synthetic_ifwi
from tests.stages.image.build import ifwi
from tests.pipeline.engine.conftest import cli, db  # noqa: F401 - fixtures


def test_text_names_the_part_each_partition_and_its_ids(cli, tmp_path):
    path = tmp_path / "img.bin"
    path.write_bytes(synthetic_ifwi(3, part_key="SYNTH-0042"))
    r = cli("image", "info", path)
    assert r.code == 0, r.err
    assert "image is for part SYNTH-0042-102" in r.out
    assert "ISH_A at 0x12000: partition A at 0x20000" in r.out and "ISH_B at 0x13000: partition B" in r.out
    assert "SYNTH-0042-101" in r.out and "1002:744c" in r.out and "5359:0001" in r.out
    assert "ATI magic absent" in r.out                # a synthetic image never passes for an AMD one
    assert "problem" not in r.out


def test_json_report(cli, tmp_path):
    path = tmp_path / "img.bin"
    path.write_bytes(bytes(ifwi(size=0x200000)))
    r = cli("image", "info", path, "--format", "json")
    assert r.code == 0, r.err
    report = json.loads(r.out)
    assert report["part_number"] == "113-TESTPART-042" and report["error"] is None
    a, b = report["partitions"]
    assert (a["ish"], a["partition"], a["atom_at"]) == ("ISH_A", "A", 0x12000)
    assert b["atom"]["part_number"] == "113-TESTPART-041" and b["atom"]["subsystem_vendor_id"] == 0x1DA2


def test_says_why_when_there_is_no_part_number(cli, tmp_path):
    image = bytearray(synthetic_ifwi(3))
    image[0x21000:0x21002] = b"\0\0"
    path = tmp_path / "broken.bin"
    path.write_bytes(image)
    r = cli("image", "info", path)
    assert r.code == 1
    assert "no part number: partition A (ISH_A at 0x12000): no option ROM at 0x21000" in r.out
    assert "SYNTH-0001-101" in r.out                  # partition B still reads
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"hello")
    r = cli("image", "info", junk)
    assert r.code == 1 and "no part number: the EFS" in r.out and "problem" in r.out
    [line] = r.err.splitlines()          # exit 1 says why in one error line, as every failure does
    assert line.startswith("error: image ") and "part number cannot be told: the EFS" in line, r.err


def test_unreadable_file_is_a_refusal(cli, tmp_path):
    r = cli("image", "info", tmp_path / "missing.bin")
    assert r.code == 2 and r.err.startswith("error: cannot read image")


def test_a_plain_vbios_is_described_and_said_not_to_be_an_ifwi(cli, tmp_path):
    """A VBIOS on its own (what a PCI `rom` file or a VBIOS collection holds): the synthetic
    image's partition A ATOM image, cut out of it."""
    from amdflash.stages.image.atom import BytesSource
    from amdflash.stages.image.partitions import read_layout

    image = synthetic_ifwi(3, part_key="SYNTH-0042")
    slot = read_layout(BytesSource(image)).slot("ISH_A")
    path = tmp_path / "vbios.rom"
    path.write_bytes(image[slot.csm_at:slot.csm_at + slot.atom.size])
    r = cli("image", "info", path)
    assert r.code == 1
    assert "plain VBIOS   a PCI option ROM with an ATOM VBIOS, NOT an IFWI" in r.out
    assert "part number   SYNTH-0042-102" in r.out and "PCI id        1002:744c   subsystem 5359:0001" in r.out
    assert "not an IFWI: a plain VBIOS for part SYNTH-0042-102" in r.out
    report = json.loads(cli("image", "info", path, "--format", "json").out)
    assert report["kind"] == "vbios" and report["vbios"]["device_id"] == 0x744C and report["part_number"] is None
