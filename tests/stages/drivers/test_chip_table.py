"""The driver over each emulated part: identification by the chip table or by SFDP alone,
only the opcodes a part takes, its unique-ID method, protection layout and CMP handling."""
from __future__ import annotations

import os
import struct

import pytest

from amdflash.stages.drivers.flash import chips
from tests.support.flash_sectors import flash_sectors
from amdflash.stages.drivers.flash.sfdp import parse_bfpt
from amdflash.stages.drivers.flash.spinor import FlashError, ProtectedError

MiB2 = 0x200000

TABLE = [
    # (emulated part, table entry, status opcodes read, unique-ID bytes of the board's ID)
    ("GD25LQ16E", chips.GD25LQ16E, {0x05, 0x35, 0x15}, 16),
    ("W25Q16DW", chips.W25Q16DW, {0x05, 0x35}, 8),
    ("W25Q16FW", chips.W25Q16FW, {0x05, 0x35, 0x15}, 8),
    ("W25Q16JW", chips.W25Q16JW, {0x05, 0x35, 0x15}, 8),
    ("MX25U1635F", chips.MX25U1635F, {0x05, 0x2B}, 16),
]


def status_reads(o) -> set[int]:  # noqa: ANN001
    """Status-register opcodes sent (05h also polls WIP while the engine opens)."""
    return {op for op, _, _, rx in o.ops if op in (0x05, 0x35, 0x15, 0x2B, 0x3F) and rx}


@pytest.mark.parametrize("part, entry, reads, uid_len", TABLE, ids=[t[0] for t in TABLE])
def test_identify_by_the_chip_table(open_board, part, entry, reads, uid_len):
    o = open_board(chip=part, transport="ideal")
    with o.engine:
        ident = o.nor.identify()
    assert ident.chip is entry and ident.chip.source == "table"
    assert status_reads(o) == reads
    assert ident.unique_id == bytes.fromhex(o.board.config["unique_id"])[:uid_len]
    assert ident.sfdp is not None and ident.sfdp.size == MiB2
    assert ident.protection.known and not ident.protection.length


def test_the_mx25u1635f_never_hears_35h_15h_or_4bh(open_board):
    """35h would switch it to QPI for good; 15h and 4Bh it does not have."""
    o = open_board(chip="MX25U1635F", transport="ideal", content=os.urandom(MiB2))
    with o.engine:
        ident = o.nor.identify()
        o.nor.read(0, 0x1000)
    assert not {0x35, 0x15, 0x4B} & {op for op, *_ in o.ops}
    assert ident.sfdp.revision == (1, 0) and ident.sfdp.page_size is None and ident.sfdp.tables == (0xFF00, 0xFFC2)


def test_the_mx25u1635f_serial_number_is_read_in_secured_otp_mode_and_left(open_board):
    image = os.urandom(MiB2)
    o = open_board(chip="MX25U1635F", transport="ideal", content=image)
    o.board.chip.transaction(b"\xb1", 0)            # a run died inside secured-OTP mode
    with o.engine:
        ident = o.nor.identify()
        assert o.nor.read(0, 64) == image[:64]      # the array, not the OTP
    assert ident.unique_id == bytes.fromhex(o.board.config["unique_id"])
    ops = [op for op, *_ in o.ops]
    assert ops.index(0xC1) < ops.index(0xB1) < len(ops) - 1 - ops[::-1].index(0xC1)


def test_a_part_known_only_from_its_sfdp(open_board):
    o = open_board(chip="UNKNOWN", transport="ideal")
    with o.engine:
        ident = o.nor.identify()
    chip = ident.chip
    assert chip.source == "sfdp" and chip.jedec == bytes.fromhex("e55115") and "e5 51 15" in chip.name
    assert [(e.size, e.opcode) for e in chip.erase_types] == [(0x1000, 0x20), (0x10000, 0xD8)]
    assert [(e.typical, e.maximum) for e in chip.erase_types] == [pytest.approx((0.048, 0.288)),
                                                                   pytest.approx((0.384, 2.304))]
    assert chip.page_size == 256 and chip.page_program == pytest.approx((0.64e-3, 3.84e-3))
    assert chip.protection is None and not ident.protection.known and ident.unique_id == b""
    assert status_reads(o) == {0x05}                # QER = 010b: QE is in SR1, no SR2 to read
    assert ident.qe is True and chip.write_gaps() == []
    assert not {0x35, 0x15, 0x4B} & {op for op, *_ in o.ops}


@pytest.mark.parametrize("part, revision", [("W25Q16DW", (1, 0)), ("W25Q16FW", (1, 5)), ("W25Q16JW", (1, 6))])
def test_one_jedec_id_three_parts_told_apart_by_the_bfpt_revision(open_board, part, revision):
    """EF 60 15 is the W25Q16DW, FW or JW: ufprog's w25q16xw_fixup_model reads the BFPT minor."""
    o = open_board(chip=part, transport="ideal")
    with o.engine:
        ident = o.nor.identify()
    assert ident.jedec_capture[:3] == bytes.fromhex("ef6015")
    assert ident.chip.name == f"Winbond {part}" and ident.sfdp.bfpt_revision == revision


def test_the_newest_bfpt_of_major_1_is_read_as_linux_reads_it(open_board):
    """UNKNOWN-2BFPT lists a 1.0 table (no times) first and a 1.6 one after it."""
    o = open_board(chip="UNKNOWN-2BFPT", transport="ideal")
    with o.engine:
        ident = o.nor.identify()
    assert ident.sfdp.bfpt_revision == (1, 6) and ident.sfdp.bfpt_dwords == 16
    assert ident.sfdp.tables == (0xFF00, 0xFF00)
    assert ident.chip.write_gaps() == [] and ident.chip.page_size == 256


def test_an_sfdp_of_another_major_revision_is_not_read(open_board):
    o = open_board(chip="UNKNOWN-SFDP2", transport="ideal")
    with o.engine, pytest.raises(FlashError, match=r"no known chip and no SFDP \(SFDP revision 2\.0: only major"):
        o.nor.identify()
    assert not o.writes_to_flash()


def test_wps_on_the_w25q16jw_makes_every_address_protected(open_board):
    o = open_board(chip="W25Q16JW", transport="ideal")
    for out in (b"\x06", b"\x11\x64"):                  # WPS=1 (SR3 bit 2)
        o.board.chip.transaction(out, 0)
    with o.engine:
        ident = o.nor.identify()
        assert ident.protection.individual == "WPS" and "individual block locks" in ident.protection.describe()
        with pytest.raises(ProtectedError, match="98h"):
            o.nor.check_writable(0x1000, 0x1000)
    assert not o.writes_to_flash()


def test_clear_cmp_on_the_w25q16jw_writes_sr2_alone_with_31h(open_board):
    o = open_board(chip="W25Q16JW", transport="ideal")
    chip = o.board.chip
    for out in (b"\x06", b"\x31\x42"):                   # QE and CMP set
        chip.transaction(out, 0)
    with o.engine:
        o.nor.identify()
        assert o.nor.clear_cmp()
        assert o.nor.status(0x35) == 0x02
    assert [(op, tx) for op, _, tx, rx in o.ops if op in (0x01, 0x31, 0x11)] == [(0x31, 1)]


def test_a_w25q16dw_taken_for_an_fw_has_cmp_cleared_with_01h_once_31h_left_it_set(open_board):
    """The FW/JW are written with 31h (ufprog), the DW with a two-byte 01h only (the kernel
    writes every EF 60 15 part so): a DW identified as an FW ignores 31h, and the driver,
    reading CMP back, tries 01h rather than stopping a board it can write."""
    o = open_board(chip="W25Q16DW", transport="ideal")
    chip = o.board.chip
    for out in (b"\x06", b"\x01\x00\x42"):              # QE and CMP set
        chip.transaction(out, 0)
    with o.engine:
        o.nor.identify()
        o.nor.chip = chips.W25Q16FW                      # what an SFDP saying 1.5 would have picked
        assert o.nor.clear_cmp()
        assert o.nor.status(0x35) == 0x02                # CMP clear, QE kept
    assert [(op, tx) for op, _, tx, rx in o.ops if op in (0x01, 0x31, 0x11)] == [(0x31, 1), (0x01, 2)]
    assert o.nor.cmp_attempts == ["31h 02: SR2=0x42, CMP still set", "01h 00 02: SR2=0x02, CMP clear"]


def test_a_revision_1_0_table_lacks_what_a_write_needs(open_board):
    o = open_board(chip="UNKNOWN-SFDP10", transport="ideal")
    with o.engine:
        chip = o.nor.identify().chip
    assert chip.write_gaps() == ["no page size", "no page-program time", "no erase times"]


def test_flash_sectors_refuses_a_part_without_a_protection_layout(open_board):
    o = open_board(chip="UNKNOWN", transport="ideal")
    with o.engine, pytest.raises(ProtectedError, match="protection layout is unknown"):
        o.nor.identify()
        flash_sectors(o.nor, bytes(MiB2), 0, 1)
    assert not o.writes_to_flash()


@pytest.mark.parametrize("part", ["W25Q16DW", "MX25U1635F"])
def test_flash_sectors_on_each_part_with_its_busy_times(open_board, part):
    image = os.urandom(MiB2)
    o = open_board(chip=part, content=bytes(MiB2))       # asm24: the part's busy times on the clock
    with o.engine:
        o.nor.identify()
        results = flash_sectors(o.nor, image, 16, 4)
    assert [r.action for r in results] == ["erase"] * 4
    assert o.board.files.flash[0x10000:0x14000] == image[0x10000:0x14000]
    typical_4k = chips.CHIPS[[c.jedec for c in chips.CHIPS].index(o.nor.chip.jedec)].erase_types[0].typical
    assert o.board.stats()["flash_busy_seconds"] >= 4 * typical_4k


def test_clear_cmp_on_the_w25q16dw_writes_both_registers_and_keeps_qe(open_board):
    o = open_board(chip="W25Q16DW", transport="ideal")
    chip = o.board.chip
    for out in (b"\x06", b"\x01\x00\x42"):              # QE and CMP set
        chip.transaction(out, 0)
    with o.engine:
        o.nor.identify()
        assert o.nor.clear_cmp()
        assert o.nor.status(0x35) == 0x02
    assert [(tx, rx) for op, _, tx, rx in o.ops if op == 0x01] == [(2, 0)]


def test_the_mx25u1635f_has_no_cmp_to_clear_and_its_protection_is_its_table(open_board):
    """BP=10: the bottom 1 MiB by ufprog's table, everything by flashrom's rule: both are named
    and the larger is refused."""
    o = open_board(chip="MX25U1635F", transport="ideal", bp=10)
    with o.engine:
        ident = o.nor.identify()
        assert (ident.protection.start, ident.protection.length) == (0, 0x100000)
        assert "0x000000-0x0fffff (1024 KiB) by ufprog" in ident.protection.describe()
        assert "0x000000-0x1fffff (2048 KiB) by flashrom" in ident.protection.describe()
        for address in (0xFF000, 0x100000):
            with pytest.raises(ProtectedError):
                o.nor.check_writable(address, 0x1000)
        with pytest.raises(ProtectedError, match="no known CMP"):
            o.nor.clear_cmp()
    assert not o.writes_to_flash()


def bits(*fields: tuple[int, int, int]) -> int:
    word = 0
    for lsb, width, value in fields:
        word |= value << lsb
    return word


def test_bfpt_times_page_size_and_qer_decode_as_jesd216_says():
    dw = [0xFFFFFFFF] * 16
    dw[0] = bits((0, 2, 0b01), (8, 8, 0x20), (17, 2, 0b01))               # 4K erase 20h, 3 or 4 address bytes
    dw[1] = 32 * 1024 * 1024 - 1                                            # 32 Mbit
    dw[7] = bits((0, 8, 12), (8, 8, 0x20), (16, 8, 16), (24, 8, 0xD8))
    dw[8] = 0
    dw[9] = bits((0, 4, 3), (4, 5, 4), (9, 2, 0b01), (11, 5, 1), (16, 2, 0b10))   # 5 x 16 ms, 2 x 128 ms, max 8x
    dw[10] = bits((0, 4, 1), (4, 4, 9), (8, 5, 5), (13, 1, 1), (24, 5, 2), (29, 2, 0b10))  # page 512, 6 x 64 µs, 12 s
    dw[14] = bits((20, 3, 0b101))
    table = parse_bfpt((1, 6), struct.pack("<16I", *dw))
    assert table.size == 4 * 1024 * 1024 and table.address_bytes == "3 or 4" and table.erase_4k == 0x20
    assert table.erase_types == ((0x1000, 0x20), (0x10000, 0xD8))
    assert table.erase_times == (pytest.approx((0.080, 0.640)), pytest.approx((0.256, 2.048)))
    assert table.page_size == 512 and table.page_program == pytest.approx((384e-6, 1536e-6))
    assert table.chip_erase == pytest.approx((12.0, 96.0))
    assert table.qe == "SR2 bit 1" and table.sr2_read == 0x35


def test_a_part_that_takes_4_byte_addresses_only_cannot_be_written_through_rom_sw():
    dw = [0xFFFFFFFF] * 16
    dw[0] = bits((0, 2, 0b01), (8, 8, 0x20), (17, 2, 0b10))
    dw[1] = 16 * 1024 * 1024 - 1
    dw[7] = bits((0, 8, 12), (8, 8, 0x20), (16, 8, 16), (24, 8, 0xD8))
    dw[8] = 0
    dw[9] = bits((0, 4, 2), (4, 5, 2), (9, 2, 0b01), (11, 5, 2), (16, 2, 0b10))
    dw[10] = bits((0, 4, 2), (4, 4, 8), (8, 5, 7), (13, 1, 1), (24, 5, 1), (29, 2, 0b10))
    chip = chips.from_sfdp(parse_bfpt((1, 6), struct.pack("<16I", *dw)), bytes.fromhex("e55315ff"))
    assert chip.address_bytes == "4" and chip.name.startswith("unknown part (JEDEC e5 53 15")
    assert chip.write_gaps() == ["it takes 4-byte addresses only (the ROM_SW engine sends at most 3)"]


@pytest.mark.parametrize("part", ["GD25LQ16E", "W25Q16FW", "W25Q16JW"])
def test_an_emulated_sfdp_names_35h_exactly_when_the_chip_answers_35h_with_sr2(open_board, part):
    """Linux's sfdp.c reads QER 100b as "SR2 has no read instruction" (SNOR_F_NO_READ_CR): a
    table saying so of a part that answers 35h contradicts the part."""
    o = open_board(chip=part, transport="ideal")
    chip = o.board.chip
    for out in (b"\x06", b"\x01\x00\x02"):              # QE set: SR2 = 02h
        chip.transaction(out, 0)
    with o.engine:
        ident = o.nor.identify()
        assert ident.sfdp is not None and ident.sfdp.sr2_read == 0x35
        assert o.nor.status(0x35) == 0x02
