"""Where the sources read the block-protect bits differently, amdflash takes the larger range.

Each source's reading is written here as data, in the sources' own terms (lengths per BP
value, the end TB picks, CMP the complement), for every setting of every layout: 64 for the
BP2..0/TB/SEC/CMP parts, 16 for the 4-BP Macronix parts. The driver's decoding must call a
4 KiB sector protected exactly when at least one source does. End to end, a write into a
range only one source protects is refused before anything is written.
"""
from __future__ import annotations

import itertools

import pytest

from amdflash.stages.drivers.flash import chips
from amdflash.stages.sim import Board
from amdflash.stages.sim.synth import PART_KEY
from tests.pipeline.engine.conftest import flash_content

KiB, MiB2, SECTOR = 1024, 0x200000, 0x1000

# flashrom decode_range_spi25 and ufprog wpr_3bp_tb_sec_cmp, 16 Mbit: protected bytes per BP.
SPI25_BLOCKS = (0, 64 * KiB, 128 * KiB, 256 * KiB, 512 * KiB, 1024 * KiB, MiB2, MiB2)      # SEC=0
SPI25_SECTORS = (0, 4 * KiB, 8 * KiB, 16 * KiB, 32 * KiB, 32 * KiB, 32 * KiB, MiB2)      # SEC=1
# The Winbond/GigaDevice datasheet tables: BP2..BP1 = 11 is everything, whatever SEC says.
DATASHEET_SECTORS = (0, 4 * KiB, 8 * KiB, 16 * KiB, 32 * KiB, 32 * KiB, MiB2, MiB2)

# MX25U1635F, ufprog mx25x_wpr_type2_4bp_tb0 (BP=8 is missing there; taken as everything).
MX_UFPROG = (("top", 0), ("top", 64 * KiB), ("top", 128 * KiB), ("top", 256 * KiB), ("top", 512 * KiB),
             ("top", 1024 * KiB), ("top", MiB2), ("top", MiB2), ("top", MiB2), ("top", MiB2),
             ("bottom", 1024 * KiB), ("bottom", 1536 * KiB), ("bottom", 1792 * KiB), ("bottom", 1920 * KiB),
             ("bottom", 1984 * KiB), ("top", MiB2))
# flashrom decode_range_spi25 with four BP bits (its MX25L1635E/MX25L1633E entries), 16 Mbit.
MX_FLASHROM = (0, 64 * KiB, 128 * KiB, 256 * KiB, 512 * KiB, 1024 * KiB) + (MiB2,) * 10


def sectors(side: str, length: int) -> set[int]:
    start = 0 if side == "bottom" else MiB2 - length
    return set(range(start, start + length, SECTOR))


def anchored(length: int, tb: bool, cmp: bool) -> set[int]:
    """A range of `length` at the end TB picks; CMP=1 protects the rest instead."""
    protected = sectors("bottom" if tb else "top", length)
    return set(range(0, MiB2, SECTOR)) - protected if cmp else protected


def driver_protects(entry: chips.ChipInfo, regs: tuple[int, ...]) -> set[int]:
    layout = entry.protection
    assert layout is not None
    decoded = layout.decode(regs, MiB2)
    return {a for a in range(0, MiB2, SECTOR) if decoded.overlaps(a, SECTOR)}


SETTINGS_64 = list(itertools.product(range(8), (False, True), (False, True), (False, True)))


@pytest.mark.parametrize("entry", [chips.GD25LQ16E, chips.W25Q16DW, chips.W25Q16FW], ids=lambda c: c.name)
def test_bp_tb_sec_cmp_protects_the_union_of_the_sources_readings_in_all_64_settings(entry):
    for bp, tb, sec, cmp in SETTINGS_64:
        sr1 = bp << 2 | tb << 5 | sec << 6
        regs = (sr1, cmp << 6, 0x60)[:len(entry.registers)]
        programs = anchored((SPI25_SECTORS if sec else SPI25_BLOCKS)[bp], tb, cmp)
        datasheet = anchored((DATASHEET_SECTORS if sec else SPI25_BLOCKS)[bp], tb, cmp)
        assert driver_protects(entry, regs) == programs | datasheet, (bp, tb, sec, cmp)


def test_the_sources_disagree_only_at_sec_1_bp_6_and_both_readings_are_named():
    disagree = []
    for bp, tb, sec, cmp in SETTINGS_64:
        decoded = chips.GD25LQ16E.protection.decode((bp << 2 | tb << 5 | sec << 6, cmp << 6, 0))
        if decoded.others:
            disagree.append((bp, sec))
            text = decoded.describe()
            assert "by flashrom decode_range_spi25" in text and "by the Winbond/GigaDevice datasheet" in text
    assert set(disagree) == {(6, True)} and len(disagree) == 4       # TB and CMP either way


@pytest.mark.parametrize("bp", range(16))
def test_mx25u1635f_protects_the_union_of_ufprogs_table_and_flashroms_rule_in_all_16_settings(bp):
    ufprog = sectors(*MX_UFPROG[bp])
    flashrom = sectors("top", MX_FLASHROM[bp])
    assert driver_protects(chips.MX25U1635F, (bp << 2, 0)) == ufprog | flashrom


@pytest.mark.parametrize("bp", range(16))
def test_mx25u1632f_1633f_whose_one_time_tb_is_not_read_count_both_ends(bp):
    either_end = sectors("top", MX_FLASHROM[bp]) | sectors("bottom", MX_FLASHROM[bp])
    assert driver_protects(chips.MX25U163XF, (bp << 2, 0)) == either_end
    # SFDP unreadable: the 1635F's two readings and the 1632F/1633F's bottom one.
    careful = sectors(*MX_UFPROG[bp]) | either_end
    assert driver_protects(chips.MX25U163X_UNKNOWN, (bp << 2, 0)) == careful


# -- end to end: refused before anything is written --------------------------------------------

def assert_untouched(board) -> None:
    assert flash_content(board) == b"\xff" * MiB2
    with Board(board) as b:
        assert b.stats()["flash_busy_seconds"] == 0


def test_the_mx25u1635f_upper_half_at_bp_10_is_refused_naming_both_readings(cli, make_board, image):
    """ufprog: the bottom 1 MiB; flashrom's rule for the part's siblings: everything."""
    board = make_board(chip="MX25U1635F", content="blank", transport="ideal", bp=10)
    r = cli("flash", image, "--yes", "--expect-part", PART_KEY, "--start-sector", "256", "--board", f"sim:{board}")
    assert r.code == 2, r.err
    assert "by ufprog mx25x_wpr_type2_4bp_tb0" in r.err and "0x000000-0x1fffff (2048 KiB) by flashrom" in r.err
    assert "clear BP3..BP0" in r.err
    assert_untouched(board)


def test_sec_1_bp_6_on_the_gd25lq16e_is_refused_outside_flashroms_32_kib(cli, make_board, image):
    board = make_board(content="blank", transport="ideal", status_registers=(0x58, 0x00, 0x00))
    r = cli("flash", image, "--yes", "--expect-part", PART_KEY, "--sector-count", "16", "--board", f"sim:{board}")
    assert r.code == 2, r.err
    assert "0x1f8000-0x1fffff (32 KiB) by flashrom" in r.err and "(2048 KiB) by the Winbond/GigaDevice" in r.err
    assert "clear BP2..BP0" in r.err
    assert_untouched(board)


def test_an_mx25u1633f_is_told_from_the_mx25u1635f_by_its_sfdp(cli_shown, make_board):
    board = make_board(chip="MX25U1633F", transport="ideal")
    r = cli_shown("info", "--board", f"sim:{board}")
    assert r.code == 0, r.err
    assert "flash       Macronix MX25U1632F/MX25U1633F" in r.out
    assert "the SFDP basic table's revision 1.6 selects this one" in r.out


def test_an_mx25u1633f_with_tb_set_is_refused_at_the_bottom_before_anything_is_written(cli, make_board, image):
    """TB=1 (one-time, in CR) and BP=1: the chip protects the bottom 64 KiB. Taken for the
    MX25U1635F, whose table puts BP=1 at the top, a write there would start and fail."""
    board = make_board(chip="MX25U1633F", content="blank", transport="ideal", status_registers=(0x04, 0x00, 0x08))
    r = cli("flash", image, "--yes", "--expect-part", PART_KEY, "--sector-count", "16", "--board", f"sim:{board}")
    assert r.code == 2, r.err
    assert "0x000000-0x00ffff (64 KiB) by flashrom decode_range_spi25 with TB=1" in r.err
    assert_untouched(board)
