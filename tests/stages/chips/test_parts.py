"""The emulated parts beside the GD25LQ16E (W25Q16DW/FW/JW, MX25U1635F, the fictional SFDP-only
parts), driven one chip-select at a time as the ROM_SW engine drives them.

Expected values are the parts' facts as docs/flash-chip.md lists them, written out here —
never taken from the model's own tables or helpers.
"""
from __future__ import annotations

import struct
from typing import Callable, Iterator

import pytest

from amdflash.stages.drivers.flash import chips as table
from amdflash.stages.sim import Board, create_board
from amdflash.stages.sim.catalog import all_parts
from tests.stages.sim.test_gd25 import a3, program, read, sr, tx, wren, write_status

KiB, MiB = 1024, 1024 * 1024
FLASH = 2 * MiB


@pytest.fixture
def open_board(make_board) -> Iterator[Callable[..., Board]]:
    """open_board(chip, profile=None, **create options) -> an open Board on blank flash ('ideal')."""
    boards: list[Board] = []

    def open_(chip: str, profile: str | None = None, **options) -> Board:
        options.setdefault("content", "blank")
        options.setdefault("transport", "ideal")
        b = Board(make_board(chip=chip, **options), profile=profile)
        boards.append(b)
        return b

    yield open_
    for b in boards:
        b.close()


# -- identification -----------------------------------------------------------------------

IDS = [
    # (part, 9Fh, 90h pair, ABh)
    ("W25Q16DW", bytes.fromhex("ef6015"), bytes.fromhex("ef14"), 0x14),
    ("W25Q16FW", bytes.fromhex("ef6015"), bytes.fromhex("ef14"), 0x14),
    ("W25Q16JW", bytes.fromhex("ef6015"), bytes.fromhex("ef14"), 0x14),
    ("MX25U1635F", bytes.fromhex("c22535"), bytes.fromhex("c235"), 0x35),
    ("UNKNOWN", bytes.fromhex("e55115"), bytes.fromhex("e514"), 0x14),
]


@pytest.mark.parametrize("chip, jedec, pair, device", IDS, ids=[i[0] for i in IDS])
def test_identification_bytes(open_board, chip, jedec, pair, device):
    b = open_board(chip)
    assert tx(b, 0x9F, rx=7) == jedec * 2 + jedec[:1]
    assert tx(b, 0x90, 0, 0, 0, rx=4) == pair * 2
    assert tx(b, 0x90, 0, 0, 1, rx=2) == pair[::-1]
    assert tx(b, 0xAB, 0, 0, 0, rx=2) == bytes((device, device))


def test_w25q16dw_unique_id_is_eight_bytes_after_four_dummies(open_board):
    b = open_board("W25Q16DW")
    uid = bytes.fromhex(b.config["unique_id"])[:8]
    assert tx(b, 0x4B, 0, 0, 0, 0, rx=10) == uid + uid[:2]
    assert tx(b, 0x4B, 0, 0, 0, rx=9) == b"\xff" + uid     # the fourth dummy as the first RX byte


def test_mx25u1635f_has_no_4bh_unique_id_and_no_sr2_or_cr(open_board):
    b = open_board("MX25U1635F")
    assert tx(b, 0x4B, 0, 0, 0, 0, rx=16) == b"\xff" * 16
    assert tx(b, 0x15, rx=2) == b"\xff\xff"
    assert sr(b, 0x2B) == 0x01                                # SCUR: FLDO, the factory locked the ESN


# -- status registers -----------------------------------------------------------------------

STATUS_WRITES = [
    # (part, 01h data bytes, register read opcode -> value read back)
    ("W25Q16DW", (0xFC, 0xFF), {0x05: 0xFC, 0x35: 0x43 | 0x3C}),    # SRP1 QE CMP writable, LB0..3 one-time
    ("MX25U1635F", (0xFF,), {0x05: 0xFC}),                          # BP0..3, QE, SRWD
    ("UNKNOWN", (0xBC,), {0x05: 0xBC}),
]


@pytest.mark.parametrize("chip, data, expected", STATUS_WRITES, ids=[s[0] for s in STATUS_WRITES])
def test_status_write_changes_only_the_writable_bits(open_board, chip, data, expected):
    b = open_board(chip)
    write_status(b, *data)
    for op, value in expected.items():
        assert sr(b, op) == value, f"{op:02x}h"


def test_mx25u1635f_ignores_a_two_byte_status_write(open_board):
    b = open_board("MX25U1635F")
    write_status(b, 0x0C, 0x00)
    assert sr(b) & 0xFC == 0x00


@pytest.mark.parametrize("chip, sr2_after", [("W25Q16DW", 0x00), ("GD25LQ16E", 0x42)])
def test_a_one_byte_status_write_clears_qe_and_cmp_on_the_w25q16dw_only(open_board, chip, sr2_after):
    b = open_board(chip)
    write_status(b, 0x00, 0x42)                 # QE and CMP
    assert sr(b, 0x35) == 0x42
    write_status(b, 0x00)                       # CS# rises after one data byte
    assert sr(b, 0x35) == sr2_after


@pytest.mark.parametrize("chip, opcode", [("MX25U1635F", 0x35), ("W25Q16DW", 0x38)])
def test_the_qpi_enable_leaves_the_engine_nothing_it_can_reach(open_board, chip, opcode):
    """35h reads SR2 on the GD25LQ16E and W25Q16DW; on the MX25U1635F it enables QPI."""
    b = open_board(chip, content=bytes(FLASH))
    tx(b, opcode)
    assert tx(b, 0x9F, rx=3) == b"\xff" * 3
    assert sr(b) == 0xFF and read(b, 0, 4) == b"\xff" * 4
    tx(b, 0x66)
    tx(b, 0x99)                                  # a single-line reset is noise to it too
    assert tx(b, 0x9F, rx=3) == b"\xff" * 3
    assert b.chip.aperture_read(0, 4) == b"\xff" * 4
    assert not b.chip.psp_update(0, bytes(16))


# -- block protection -----------------------------------------------------------------------

def top(n: int) -> frozenset[int]:
    return frozenset(range(32 - n, 32))


def bottom(n: int) -> frozenset[int]:
    return frozenset(range(n))


# MX25U1635F: BP3..BP0 -> protected 64 KiB blocks (ufprog's mx25x_wpr_type2_4bp_tb0;
# BP = 8 assumed "all" like its neighbours).
MX_BLOCKS = {0: frozenset(), 1: top(1), 2: top(2), 3: top(4), 4: top(8), 5: top(16),
             6: top(32), 7: top(32), 8: top(32), 9: top(32),
             10: bottom(16), 11: bottom(24), 12: bottom(28), 13: bottom(30), 14: bottom(31), 15: top(32)}


def test_mx25u1635f_protection_follows_its_table(open_board):
    b = open_board("MX25U1635F")
    for bp, protected in MX_BLOCKS.items():
        write_status(b, bp << 2)
        assert sr(b) == bp << 2
        for block in range(32):
            program(b, block * 0x10000 + bp * 0x100, b"\x00")
        got = frozenset(blk for blk in range(32) if read(b, blk * 0x10000 + bp * 0x100, 1) == b"\xff")
        assert got == protected, f"BP={bp}"


def test_w25q16dw_protection_is_bp_tb_sec_cmp(open_board):
    b = open_board("W25Q16DW")
    write_status(b, 1 << 2 | 1 << 5, 0x00)      # BP=1, TB=1: the bottom 64 KiB
    program(b, 0x0000, b"\x00")
    program(b, 0x10000, b"\x00")
    assert read(b, 0x0000, 1) == b"\xff" and read(b, 0x10000, 1) == b"\x00"
    write_status(b, 1 << 2 | 1 << 5, 0x40)      # ... complemented: all but the bottom 64 KiB
    program(b, 0x0100, b"\x00")
    program(b, 0x20000, b"\x00")
    assert read(b, 0x0100, 1) == b"\x00" and read(b, 0x20000, 1) == b"\xff"


# -- OTP ------------------------------------------------------------------------------------

def test_mx25u1635f_secured_otp_holds_the_serial_number(open_board):
    b = open_board("MX25U1635F", content=bytes(FLASH))
    uid = bytes.fromhex(b.config["unique_id"])
    tx(b, 0xB1)
    assert read(b, 0, 16) == uid and read(b, 0x10, 16) == b"\xff" * 16
    assert read(b, 0x1FF, 2) == b"\xff" + uid[:1]             # addresses wrap inside the 512 bytes
    program(b, 0x00, bytes(32))                              # the ESN is locked; the rest is not
    assert read(b, 0, 32) == uid + bytes(16)
    wren(b)
    tx(b, 0x20, 0, 0, 0)                                     # no erase in secured-OTP mode
    assert sr(b) & 0x02 == 0
    tx(b, 0xC1)
    assert read(b, 0, 16) == bytes(16)                       # the array again, unchanged
    tx(b, 0xB1)
    tx(b, 0x66)
    tx(b, 0x99)                                              # a reset leaves the mode too
    assert read(b, 0, 4) == bytes(4)


def test_w25q16dw_security_registers(open_board):
    b = open_board("W25Q16DW")
    for number in range(4):
        wren(b)
        tx(b, 0x42, *a3(number << 12 | 0x10), bytes((number, number)))
        assert tx(b, 0x48, *a3(number << 12 | 0x10), 0, rx=3) == bytes((number, number, 0xFF))
    assert tx(b, 0x48, *a3(0x4000), 0, rx=2) == b"\xff\xff"
    write_status(b, 0x00, 0x04)                              # LB0
    wren(b)
    tx(b, 0x44, *a3(0x0000))
    wren(b)
    tx(b, 0x44, *a3(0x1000))
    assert tx(b, 0x48, *a3(0x0010), 0, rx=1) == b"\x00"      # register 0 locked for ever
    assert tx(b, 0x48, *a3(0x1010), 0, rx=1) == b"\xff"
    write_status(b, 0x00, 0x00)
    assert sr(b, 0x35) & 0x04


@pytest.mark.parametrize("chip", ["W25Q16FW", "W25Q16JW"])
def test_w25q16fw_jw_have_three_security_registers_and_no_lb0(open_board, chip):
    """ufprog w25q_otp_3 (index 1..3, 256 bytes) and w25q_sr2: SR2 bit 2 is reserved."""
    b = open_board(chip)
    for number in (1, 2, 3):
        wren(b)
        tx(b, 0x42, *a3(number << 12 | 0x10), bytes((number,)))
        assert tx(b, 0x48, *a3(number << 12 | 0x10), 0, rx=2) == bytes((number, 0xFF))
    wren(b)
    tx(b, 0x42, *a3(0x0010), b"\x00")                      # there is no register 0
    assert tx(b, 0x48, *a3(0x0010), 0, rx=1) == b"\xff" and not sr(b) & 0x02
    write_status(b, 0x04, op=0x31)                          # bit 2: reserved, not LB0
    assert sr(b, 0x35) == 0x00
    write_status(b, 0x08, op=0x31)                          # LB1, for ever
    write_status(b, 0x00, op=0x31)
    assert sr(b, 0x35) == 0x08


@pytest.mark.parametrize("chip", ["W25Q16FW", "W25Q16JW"])
def test_w25q16fw_jw_write_sr2_and_sr3_on_their_own(open_board, chip):
    b = open_board(chip)
    assert (sr(b, 0x35), sr(b, 0x15)) == (0x00, 0x60)
    write_status(b, 0x42, op=0x31)                          # QE, CMP with 31h alone
    assert sr(b, 0x35) == 0x42 and sr(b) == 0x00
    write_status(b, 0xFF, op=0x11)                          # SR3: WPS, DRV, HOLD/RST writable
    assert sr(b, 0x15) == 0xE4
    write_status(b, 0x00)                                   # a one-byte 01h leaves SR2 alone here
    assert sr(b, 0x35) == 0x42


@pytest.mark.parametrize("chip, qpi", [("W25Q16FW", True), ("W25Q16JW", False)])
def test_the_fw_has_the_dws_qpi_the_jw_has_none(open_board, chip, qpi):
    b = open_board(chip)
    tx(b, 0x38)
    assert (tx(b, 0x9F, rx=3) == b"\xff" * 3) == qpi


# -- individual block locks (WPS / WPSEL) and the chip's own fail flags -----------------------

def test_w25q16jw_wps_replaces_bp_by_block_locks_set_at_power_up(open_board):
    b = open_board("W25Q16JW")
    program(b, 0x1000, b"\x00")
    assert read(b, 0x1000, 1) == b"\x00"                   # BP=0, WPS=0: writable
    write_status(b, 0x64, op=0x11)                          # WPS=1
    program(b, 0x2000, b"\x00")
    assert read(b, 0x2000, 1) == b"\xff" and not sr(b) & 0x02    # every lock is set: refused
    wren(b)
    tx(b, 0x98)                                             # global block unlock
    program(b, 0x2000, b"\x00")
    assert read(b, 0x2000, 1) == b"\x00"
    wren(b)
    tx(b, 0x7E)                                             # global block lock
    wren(b)
    tx(b, 0x20, *a3(0x2000))
    assert read(b, 0x2000, 1) == b"\x00"
    tx(b, 0x66)
    tx(b, 0x99)                                             # a reset sets every lock again
    write_status(b, 0x60, op=0x11)                          # WPS=0: the BP bits decide again
    program(b, 0x3000, b"\x00")
    assert read(b, 0x3000, 1) == b"\x00"


def test_mx25u1635f_wpsel_is_one_time_and_overrides_bp(open_board):
    b = open_board("MX25U1635F")
    tx(b, 0x68)                                             # without a write enable: nothing
    assert sr(b, 0x2B) == 0x01
    wren(b)
    tx(b, 0x68)
    assert sr(b, 0x2B) == 0x81 and not sr(b) & 0x02         # WPSEL, WEL cleared
    program(b, 0x0000, b"\x00")
    assert read(b, 0x0000, 1) == b"\xff"                   # BP=0, yet locked
    assert sr(b, 0x2B) & 0x20                               # P_FAIL: the chip says so
    tx(b, 0x66)
    tx(b, 0x99)
    assert sr(b, 0x2B) == 0x81                              # WPSEL stays; a reset clears the flags
    wren(b)
    tx(b, 0x98)
    program(b, 0x0000, b"\x00")
    assert read(b, 0x0000, 1) == b"\x00" and not sr(b, 0x2B) & 0x20


def test_mx25u1635f_reports_failed_programs_and_erases_in_scur(open_board):
    b = open_board("MX25U1635F", faults=["stuck-bit=0x10:3", "erase-fail=2"])
    program(b, 0x10, b"\x00")                              # bit 3 cannot be programmed
    assert sr(b, 0x2B) == 0x21                              # FLDO, P_FAIL
    program(b, 0x20, b"\x00")
    assert sr(b, 0x2B) == 0x01                              # the next good program clears it
    wren(b)
    tx(b, 0x20, *a3(0x2000))
    assert sr(b, 0x2B) == 0x41                              # E_FAIL
    wren(b)
    tx(b, 0x20, *a3(0x3000))
    assert sr(b, 0x2B) == 0x01
    write_status(b, 1 << 2)                                 # BP=1: the top 64 KiB
    wren(b)
    tx(b, 0x20, *a3(0x1F0000))
    assert sr(b, 0x2B) == 0x41                              # refused: also a failure


# -- busy times, suspend ----------------------------------------------------------------------

BUSY = [("W25Q16DW", 45e-3), ("MX25U1635F", 35e-3), ("UNKNOWN", 48e-3)]    # typical 4 KiB erase


@pytest.mark.parametrize("chip, seconds", BUSY, ids=[b[0] for b in BUSY])
def test_a_4k_erase_is_busy_for_the_parts_typical_time(open_board, chip, seconds):
    b = open_board(chip, transport="asm24")
    wren(b)
    tx(b, 0x20, 0, 0x10, 0)
    start = b.clock.now()
    b.clock.sleep(seconds * 0.99)
    assert sr(b) & 0x01
    b.clock.sleep(seconds * 0.02)
    assert not sr(b) & 0x01
    assert b.clock.now() - start >= seconds


def test_mx25u1635f_suspends_with_b0h_and_shows_it_in_scur(open_board):
    b = open_board("MX25U1635F", transport="asm24", content=bytes(FLASH))
    wren(b)
    tx(b, 0x20, 0, 0x10, 0)
    tx(b, 0x75)                                 # not this part's suspend
    assert sr(b) & 0x01
    tx(b, 0xB0)
    assert not sr(b) & 0x01 and sr(b, 0x2B) & 0x08          # ESB
    tx(b, 0x30)
    assert sr(b) & 0x01 and not sr(b, 0x2B) & 0x08


# -- SFDP -----------------------------------------------------------------------------------

def sfdp(b: Board, address: int, size: int) -> bytes:
    return tx(b, 0x5A, *a3(address), 0, rx=size)


SFDP_FACTS = [
    # (part, revision, parameter headers, BFPT dwords, erase types (exponent, opcode))
    ("W25Q16DW", (1, 0), 1, 9, [(12, 0x20), (15, 0x52), (16, 0xD8)]),
    ("W25Q16FW", (1, 5), 1, 16, [(12, 0x20), (15, 0x52), (16, 0xD8)]),
    ("W25Q16JW", (1, 6), 1, 16, [(12, 0x20), (15, 0x52), (16, 0xD8)]),
    ("MX25U1635F", (1, 0), 2, 9, [(12, 0x20), (15, 0x52), (16, 0xD8)]),
    ("UNKNOWN", (1, 6), 1, 16, [(12, 0x20), (16, 0xD8)]),
    ("UNKNOWN-SFDP10", (1, 0), 1, 9, [(12, 0x20), (16, 0xD8)]),
]


@pytest.mark.parametrize("chip, revision, headers, dwords, erases", SFDP_FACTS, ids=[s[0] for s in SFDP_FACTS])
def test_sfdp_header_density_and_erase_types(open_board, chip, revision, headers, dwords, erases):
    b = open_board(chip)
    head = sfdp(b, 0, 8 + 8 * headers)
    assert head[:4] == b"SFDP" and (head[5], head[4]) == revision and head[6] == headers - 1
    bfpt_header = head[8:16]
    assert (bfpt_header[0], bfpt_header[7]) == (0x00, 0xFF) and bfpt_header[3] == dwords
    assert (bfpt_header[2], bfpt_header[1]) == revision     # ufprog tells the W25Q16xW by this
    pointer = int.from_bytes(bfpt_header[4:7], "little")
    dw = struct.unpack(f"<{dwords}I", sfdp(b, pointer, 4 * dwords))
    assert dw[1] == 16 * MiB - 1
    found = [(h & 0xFF, h >> 8) for w in dw[7:9] for h in (w & 0xFFFF, w >> 16) if h & 0xFF]
    assert found == erases
    if headers > 1:
        assert head[16] == 0xC2                             # Macronix's vendor table follows


def test_the_unknown_parts_sfdp_times_are_its_busy_times(open_board):
    b = open_board("UNKNOWN")
    dw = struct.unpack("<16I", sfdp(b, 0x30, 64))
    # dword 10: multiplier N=2 (max 6x), erase type 1 = 3 x 16 ms, type 2 = 24 x 16 ms.
    assert dw[9] & 0xF == 2
    assert (dw[9] >> 4 & 0x7F) == (3 - 1) | 0b01 << 5 and (dw[9] >> 11 & 0x7F) == (24 - 1) | 0b01 << 5
    # dword 11: page 2^8, program 10 x 64 µs, chip erase 3 x 4 s.
    assert dw[10] >> 4 & 0xF == 8 and dw[10] >> 8 & 0x3F == (10 - 1) | 1 << 5
    assert dw[10] >> 24 & 0x7F == (3 - 1) | 0b10 << 5
    assert dw[14] >> 20 & 0x7 == 0b010                       # QE is SR1 bit 6
    assert sr(b) == 0x40                                     # ... and set at the factory


# -- the emulated parts and the driver's table agree -------------------------------------------

@pytest.mark.parametrize("name, info", [("GD25LQ16E", table.GD25LQ16E), ("W25Q16DW", table.W25Q16DW),
                                        ("W25Q16FW", table.W25Q16FW), ("W25Q16JW", table.W25Q16JW),
                                        ("MX25U1635F", table.MX25U1635F)], ids=lambda v: getattr(v, "name", v))
def test_the_chip_table_describes_the_emulated_part(name, info):
    part = all_parts()[name]
    assert info.jedec == part.jedec
    assert {e.opcode: e.size for e in info.erase_types} == dict(part.erases)
    for e in info.erase_types:
        assert (e.typical, e.maximum) == part.busy[e.opcode]
    assert info.page_program == part.busy[0x02]
    assert info.status_write == part.busy[0x01]
    assert [r.read for r in info.registers] == [r.read for r in part.registers]


# -- sim create ----------------------------------------------------------------------------

@pytest.mark.parametrize("options, message", [
    ({"chip": "W25Q32"}, "unknown emulated chip"),
    ({"chip": "MX25U1635F", "cmp": True}, "no CMP bit"),
    ({"chip": "GD25LQ16E", "bp": 8}, "0..7"),
])
def test_sim_create_refuses_what_the_part_cannot_be(tmp_path, options, message):
    with pytest.raises(ValueError, match=message):
        create_board(tmp_path / "b", **options)
    assert not (tmp_path / "b" / "board.json").exists()


def test_sim_create_sets_all_four_bp_bits_of_the_mx25u1635f(tmp_path):
    with Board(create_board(tmp_path / "b", chip="MX25U1635F", bp=10, transport="ideal")) as b:
        assert sr(b) == 10 << 2 and b.config["chip"] == "MX25U1635F"


@pytest.mark.parametrize("chip, model", [("W25Q16DW", 0xEF6015), ("MX25U1635F", 0xC22535)])
def test_the_psp_reports_the_boards_flash_part(make_board, chip, model):
    from tests.stages.sim.test_psp import SPI_GET_MODEL_ID, Mailbox

    with Board(make_board(chip=chip)) as b:
        assert Mailbox(b).command(SPI_GET_MODEL_ID) == (0, model)
