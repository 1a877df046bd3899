"""The parsers never crash on junk: only their own errors, whatever the bytes."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amdflash.pipeline.cli.image import image_report
from amdflash.stages.image.atom import AtomError, BytesSource, parse_atom
from amdflash.stages.image.part_check import flash_part, image_part
from amdflash.stages.image.partitions import LayoutError, read_layout
from amdflash.stages.sim.synth import synthetic_ifwi
from tests.stages.image.build import atom_rom, ifwi

SYNTHETIC = synthetic_ifwi(5)
HAND_BUILT = bytes(ifwi())
ROM = bytes(atom_rom())
# Where the walk reads in the synthetic image: mutations there exercise every branch.
HOT = [0x0, 0x14, 0x2000, 0x2008, 0x2010, 0x12000, 0x1200D, 0x12010, 0x1201C, 0x13000, 0x20000, 0x21000,
       0x2102F, 0x21048, 0x2106E, 0x21080, 0x21200, 0x21240, 0x100000, 0x101000]
FUZZ = settings(max_examples=250, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


def survives(data: bytes) -> None:
    try:
        read_layout(BytesSource(data)).image_vbios()
    except LayoutError:
        pass
    flash_part(BytesSource(data))
    image_part(data)
    image_report(data)


@FUZZ
@given(st.binary(max_size=0x400))
def test_atom_parser_on_random_bytes(data):
    for base in (0, 1, len(data) // 2):
        try:
            parse_atom(BytesSource(data), base)
        except AtomError:
            pass


@FUZZ
@given(st.lists(st.tuples(st.integers(0, len(ROM) - 1), st.binary(min_size=1, max_size=8)), max_size=12))
def test_atom_parser_on_a_mutated_rom(edits):
    rom = bytearray(ROM)
    for at, value in edits:
        rom[at:at + len(value)] = value
    try:
        atom = parse_atom(BytesSource(bytes(rom)))
        assert len(atom.part_number) <= 31
    except AtomError:
        pass


@FUZZ
@given(st.binary(max_size=0x2000))
def test_layout_on_random_bytes(data):
    survives(data)
    survives(b"\xaa\x55\xaa\x55" + data)


@FUZZ
@given(st.sampled_from([SYNTHETIC, HAND_BUILT]),
       st.lists(st.tuples(st.sampled_from(HOT), st.integers(0, 0x80), st.binary(min_size=1, max_size=8)),
                min_size=1, max_size=6))
def test_layout_on_mutated_images(base, edits):
    image = bytearray(base)
    for hot, delta, value in edits:
        at = min(hot + delta, len(image) - len(value))
        image[at:at + len(value)] = value
    survives(bytes(image))
