"""Conformance of the emulated GD25LQ16E (docs/flash-chip.md) and property tests of its array.

The chip is driven one chip-select at a time through `board.chip.transaction(out, rx_len)`,
exactly as the ROM_SW engine drives it; expected values come from tables written here,
never from the model's own helpers.
"""
from __future__ import annotations

import struct
from typing import Callable, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amdflash.stages.drivers.navi31 import regs as R
from amdflash.stages.sim import Board, create_board

KiB, MiB = 1024, 1024 * 1024
FLASH = 2 * MiB
SECTORS = FLASH // (4 * KiB)
JEDEC = b"\xc8\x60\x15"
FF = 0xFF

# SR bits, from the §7 table.
WIP, WEL, SRP0 = 0x01, 0x02, 0x80
SRP1, QE, SUS2, LB1, LB2, LB3, CMP, SUS1 = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80

# Typical busy times of §7.
T_PP, T_4K, T_32K, T_64K, T_CHIP, T_W = 0.5e-3, 50e-3, 150e-3, 250e-3, 8.0, 5e-3

# Protected length by (SEC, BP2..BP0) on a 2 MiB part, as §7 states the flashrom decoder.
# Written out row by row so that the model's arithmetic is checked, not repeated. (The
# (SEC=1, BP=6) row is §7's 32 KiB cap; GigaDevice's table for the 16 Mbit family shows
# "X X 1 1 X = all" there — see the model's docstring.)
PROTECTED_LENGTH: dict[tuple[int, int], int] = {
    (0, 0): 0, (0, 1): 64 * KiB, (0, 2): 128 * KiB, (0, 3): 256 * KiB,
    (0, 4): 512 * KiB, (0, 5): 1 * MiB, (0, 6): 2 * MiB, (0, 7): 2 * MiB,
    (1, 0): 0, (1, 1): 4 * KiB, (1, 2): 8 * KiB, (1, 3): 16 * KiB,
    (1, 4): 32 * KiB, (1, 5): 32 * KiB, (1, 6): 32 * KiB, (1, 7): 2 * MiB,
}


def protected_sectors(bp: int, tb: int, sec: int, cmp: int) -> frozenset[int]:
    count = PROTECTED_LENGTH[sec, bp] // (4 * KiB)
    chosen = set(range(count)) if tb else set(range(SECTORS - count, SECTORS))
    return frozenset(set(range(SECTORS)) - chosen if cmp else chosen)


def sr1_value(bp: int, tb: int = 0, sec: int = 0) -> int:
    return bp << 2 | tb << 5 | sec << 6


# -- driving the chip ---------------------------------------------------------------------

def a3(address: int) -> tuple[int, int, int]:
    return (address >> 16) & 0xFF, (address >> 8) & 0xFF, address & 0xFF


def tx(board: Board, *out: int | bytes, rx: int = 0) -> bytes:
    wire = bytearray()
    for item in out:
        wire += item if isinstance(item, (bytes, bytearray)) else bytes((item,))
    return board.chip.transaction(bytes(wire), rx)


def sr(board: Board, op: int = 0x05) -> int:
    return tx(board, op, rx=1)[0]


def wren(board: Board) -> None:
    tx(board, 0x06)


def read(board: Board, address: int, size: int) -> bytes:
    return tx(board, 0x03, *a3(address), rx=size)


def program(board: Board, address: int, data: bytes) -> None:
    wren(board)
    tx(board, 0x02, *a3(address), data)


def erase(board: Board, op: int, address: int) -> None:
    wren(board)
    tx(board, op, *a3(address))


def write_status(board: Board, *values: int, op: int = 0x01) -> None:
    wren(board)
    tx(board, op, *values)


def settle(board: Board) -> None:
    """Wait (virtual time) until the longest operation is surely over."""
    board.clock.sleep(T_CHIP + 1)


def busy(board: Board) -> bool:
    return bool(sr(board) & WIP)


def pattern(seed: int, size: int = FLASH) -> bytes:
    """Reproducible content without a single 0xFF byte, so every erase and program shows."""
    block = bytes((i * 131 + seed * 29 + (i >> 8) * 7) & 0xFE for i in range(4096))
    return block * (size // 4096)


@pytest.fixture
def open_board(make_board) -> Iterator[Callable[..., Board]]:
    """open_board(profile=None, **create options) -> an open Board on blank flash."""
    boards: list[Board] = []

    def open_(profile: str | None = None, **options) -> Board:
        options.setdefault("content", "blank")
        b = Board(make_board(**options), profile=profile)
        boards.append(b)
        return b

    yield open_
    for b in boards:
        b.close()


# -- identification -----------------------------------------------------------------------

ID_CASES = [
    # (out, rx_len, expected RX)
    ((0x9F,), 3, JEDEC),
    ((0x9F,), 7, JEDEC * 2 + JEDEC[:1]),                   # the ID repeats while clocked
    ((0x9F, 0, 0, 0), 2, JEDEC[:2]),                      # TX clocks consumed three ID bytes
    ((0x90, 0, 0, 0), 4, b"\xc8\x14\xc8\x14"),
    ((0x90, 0, 0, 1), 3, b"\x14\xc8\x14"),                # address bit 0 swaps the pair
    ((0x90,), 2, b"\xff\xff"),                            # no address: not executed
    ((0xAB, 0, 0, 0), 3, b"\x14\x14\x14"),
    ((0xAB,), 5, b"\xff\xff\xff\x14\x14"),                # three dummies, then the ID
    ((0x3B, 0, 0, 0), 4, b"\xff" * 4),                    # dual output read: single-line bus sees nothing
    ((0xFF,), 2, b"\xff\xff"),
]


@pytest.mark.parametrize("out, rx_len, expected", ID_CASES)
def test_identification_opcodes(open_board, out, rx_len, expected):
    b = open_board()
    assert tx(b, *out, rx=rx_len) == expected


def test_unique_id_is_the_boards_and_distinct(open_board):
    one, two = open_board(), open_board()
    id_one = tx(one, 0x4B, 0, 0, 0, rx=17)
    id_two = tx(two, 0x4B, 0, 0, 0, rx=17)
    assert id_one[0] == FF                                  # the dummy byte
    assert id_one[1:] == bytes.fromhex(one.config["unique_id"])
    assert id_two[1:] == bytes.fromhex(two.config["unique_id"])
    assert id_one[1:] != id_two[1:]
    assert tx(one, 0x4B, 0, 0, 0, 0, rx=16) == id_one[1:]   # dummy sent as a TX byte


@pytest.mark.parametrize("op", [0x05, 0x35, 0x15])
def test_status_read_repeats_while_clocked(open_board, op):
    b = open_board(cmp=True, bp=5)
    expected = {0x05: 5 << 2, 0x35: CMP, 0x15: 0}[op]
    assert tx(b, op, rx=5) == bytes([expected]) * 5


def test_fresh_board_status_registers(open_board):
    b = open_board()
    assert (sr(b, 0x05), sr(b, 0x35), sr(b, 0x15)) == (0, 0, 0)
    c = open_board(cmp=True, bp=7)
    assert (sr(c, 0x05), sr(c, 0x35), sr(c, 0x15)) == (0x1C, CMP, 0)


# -- reads --------------------------------------------------------------------------------

def test_read_and_fast_read(open_board):
    image = pattern(3)
    b = open_board(content=image)
    assert read(b, 0x12345, 256) == image[0x12345:0x12345 + 256]
    assert read(b, FLASH - 16, 32) == image[-16:] + image[:16]          # wraps at the top
    assert tx(b, 0x0B, *a3(0x100), rx=9) == b"\xff" + image[0x100:0x108]  # dummy first
    assert tx(b, 0x0B, *a3(0x100), 0, rx=8) == image[0x100:0x108]       # dummy as TX
    assert tx(b, 0x03, *a3(0x100), 0, 0, rx=4) == image[0x102:0x106]    # TX clocks read too
    assert tx(b, 0x03, 0x00, 0x01, rx=4) == b"\xff" * 4                 # no full address
    assert read(b, 0, FLASH) == image


def test_aperture_reads_the_array(open_board):
    image = pattern(4)
    b = open_board(content=image)
    assert b.chip.aperture_read(0x1000, 4) == image[0x1000:0x1004]
    assert b.chip.aperture_read(0x1FFFFC, 4) == image[-4:]


# -- write enable -------------------------------------------------------------------------

WEL_CASES = [
    # (transactions as (out, rx_len), WEL afterwards)
    ([((0x06,), 0)], 1),
    ([((0x06,), 0), ((0x04,), 0)], 0),
    ([((0x06,), 0), ((0x06,), 0)], 1),                    # the engine's bare re-send is harmless
    ([((0x06, 0), 0)], 0),                                # CS# rose a byte late
    ([((0x06,), 1)], 0),                                  # ... or after RX clocks
    ([((0x50,), 0)], 0),                                  # 50h never sets WEL
    ([((0x06,), 0), ((0x50,), 0)], 1),
    ([((0x06,), 0), ((0x05,), 2), ((0x9F,), 3), ((0x03, 0, 0, 0), 4)], 1),  # reads keep it
    ([((0x06,), 0), ((0x04, 0), 0)], 1),
]


@pytest.mark.parametrize("sequence, wel", WEL_CASES)
def test_write_enable_latch(open_board, sequence, wel):
    b = open_board()
    for out, rx_len in sequence:
        tx(b, *out, rx=rx_len)
    assert bool(sr(b) & WEL) == bool(wel)


WRITE_OPS = [
    # (name, out) — every command that needs WEL, aimed at something it would change
    ("page program", (0x02, 0x00, 0x10, 0x00, 0x00)),
    ("erase 4K", (0x20, 0x00, 0x10, 0x00)),
    ("erase 32K", (0x52, 0x00, 0x10, 0x00)),
    ("erase 64K", (0xD8, 0x00, 0x10, 0x00)),
    ("chip erase 60", (0x60,)),
    ("chip erase C7", (0xC7,)),
    ("write SR1+SR2", (0x01, 0x08, 0x02)),
    ("write SR2", (0x31, 0x02)),
    ("write SR3", (0x11, 0x60)),
    ("program security", (0x42, 0x00, 0x10, 0x00, 0x00)),
    ("erase security", (0x44, 0x00, 0x10, 0x00)),
]


def chip_snapshot(b: Board) -> tuple:
    return (read(b, 0, FLASH), sr(b, 0x05), sr(b, 0x35), sr(b, 0x15),
            tx(b, 0x48, 0x00, 0x10, 0x00, 0, rx=512))


def prepare_targets(b: Board) -> None:
    """Something for every write op to change: a programmed array and security register."""
    program(b, 0x1000, b"\x5a" * 256)
    settle(b)
    wren(b)
    tx(b, 0x42, 0x00, 0x10, 0x00, b"\xa5" * 16)
    settle(b)
    assert sr(b) == 0 and tx(b, 0x48, 0x00, 0x10, 0x00, rx=2)[1] == 0xA5


@pytest.mark.parametrize("name, out", WRITE_OPS, ids=[n for n, _ in WRITE_OPS])
def test_write_commands_need_wel(open_board, name, out):
    b = open_board(content=pattern(1))
    prepare_targets(b)
    before = chip_snapshot(b)
    tx(b, *out)
    assert not busy(b)
    assert chip_snapshot(b) == before
    # ... and the same command with WEL set does change something.
    wren(b)
    tx(b, *out)
    settle(b)
    assert chip_snapshot(b) != before


@pytest.mark.parametrize("name, out", WRITE_OPS, ids=[n for n, _ in WRITE_OPS])
def test_wel_stays_set_while_busy_and_clears_on_completion(open_board, name, out):
    b = open_board(content=pattern(1))
    wren(b)
    tx(b, *out)
    status = sr(b)
    assert status & WIP and status & WEL
    settle(b)
    assert sr(b) & (WIP | WEL) == 0


MALFORMED = [
    # (out, rx_len): CS# rose early or late — never executed, WEL untouched
    ((0x02,), 0), ((0x02, 0x00, 0x10), 0), ((0x02, 0x00, 0x10, 0x00), 0),
    ((0x02, 0x00, 0x10, 0x00), 4),
    ((0x20,), 0), ((0x20, 0x00, 0x10), 0), ((0x20, 0x00, 0x10, 0x00, 0x00), 0),
    ((0x20, 0x00, 0x10, 0x00), 1),
    ((0x52, 0x00), 0), ((0xD8, 0x00, 0x10, 0x00, 0x00), 0),
    ((0x60, 0x00), 0), ((0xC7,), 1),
    ((0x01,), 0), ((0x01, 0x08, 0x02, 0x00), 0), ((0x01, 0x08), 1),
    ((0x31,), 0), ((0x31, 0x02, 0x00), 0), ((0x11,), 0),
    ((0x42, 0x00, 0x10, 0x00), 0), ((0x44, 0x00, 0x10), 0),
]


@pytest.mark.parametrize("out, rx_len", MALFORMED)
def test_incomplete_or_overlong_commands_are_ignored(open_board, out, rx_len):
    b = open_board(content=pattern(2))
    prepare_targets(b)
    wren(b)
    before = chip_snapshot(b)
    assert tx(b, *out, rx=rx_len) == b"\xff" * rx_len
    assert sr(b) == WEL                                    # not busy, WEL still set
    assert chip_snapshot(b) == before


def test_bare_chip_erase_with_wel_erases(open_board):
    """A bare C7 is a complete command: the engine's 'clear' re-send would really erase."""
    b = open_board(content=pattern(5))
    wren(b)
    tx(b, 0xC7)
    settle(b)
    assert read(b, 0, FLASH) == b"\xff" * FLASH


# -- busy timing --------------------------------------------------------------------------

BUSY_CASES = [
    ("page program", (0x02, 0x00, 0x10, 0x00, 0x00), T_PP),
    ("erase 4K", (0x20, 0x00, 0x10, 0x00), T_4K),
    ("erase 32K", (0x52, 0x00, 0x10, 0x00), T_32K),
    ("erase 64K", (0xD8, 0x00, 0x10, 0x00), T_64K),
    ("chip erase", (0xC7,), T_CHIP),
    ("write status", (0x01, 0x00, 0x00), T_W),
    ("write SR2", (0x31, 0x00), T_W),
    ("write SR3", (0x11, 0x00), T_W),
]


@pytest.mark.parametrize("name, out, seconds", BUSY_CASES, ids=[c[0] for c in BUSY_CASES])
def test_busy_for_the_typical_time_on_the_virtual_clock(open_board, name, out, seconds):
    b = open_board(content=pattern(6))
    counted = b.stats()["flash_busy_seconds"]
    wren(b)
    tx(b, *out)
    assert b.stats()["flash_busy_seconds"] - counted == pytest.approx(seconds)
    assert busy(b)
    # While busy only 05/35/15 (and 75) are heard.
    assert read(b, 0x1000, 4) == b"\xff" * 4
    assert tx(b, 0x9F, rx=3) == b"\xff" * 3
    assert b.chip.aperture_read(0x1000, 4) == b"\xff" * 4
    tx(b, 0x04)                                             # ignored: WEL stays set
    assert sr(b) == WIP | WEL
    assert tx(b, 0x35, rx=2) == b"\x00\x00" and tx(b, 0x15, rx=1) == b"\x00"
    b.clock.sleep(seconds * 0.999)
    assert busy(b)
    b.clock.sleep(seconds * 0.002)
    assert sr(b) == 0
    assert tx(b, 0x9F, rx=3) == JEDEC


def test_ideal_profile_completes_at_once(open_board):
    b = open_board(profile="ideal", content=pattern(7))
    program(b, 0x2000, b"\x00" * 4)
    assert sr(b) == 0
    assert read(b, 0x2000, 4) == b"\x00" * 4
    erase(b, 0xD8, 0)
    assert sr(b) == 0 and read(b, 0, 0x10000) == b"\xff" * 0x10000
    assert b.stats()["flash_busy_seconds"] == 0


# -- program and erase semantics ----------------------------------------------------------

def test_page_program_ands_and_wraps_within_the_page(open_board):
    b = open_board()
    program(b, 0x3000, b"\xf0" * 4)
    settle(b)
    program(b, 0x3000, b"\x3c" * 2)
    settle(b)
    assert read(b, 0x3000, 4) == b"\x30\x30\xf0\xf0"
    program(b, 0x40FE, b"\x01\x02\x03\x04")                  # wraps to 0x4000, not 0x4100
    settle(b)
    assert read(b, 0x40FE, 2) == b"\x01\x02"
    assert read(b, 0x4000, 2) == b"\x03\x04"
    assert read(b, 0x4100, 2) == b"\xff\xff"


@pytest.mark.parametrize("op, size", [(0x20, 4 * KiB), (0x52, 32 * KiB), (0xD8, 64 * KiB)])
def test_erase_aligns_down(open_board, op, size):
    image = pattern(8)
    b = open_board(content=image)
    erase(b, op, 0x10000 + size + 0x123)
    settle(b)
    lo = 0x10000 + size
    expected = image[:lo] + b"\xff" * size + image[lo + size:]
    assert read(b, 0, FLASH) == expected


# -- protection -----------------------------------------------------------------------------

PROTECTION_COMBOS = [(bp, tb, sec, cmp) for bp in range(8) for tb in (0, 1)
                     for sec in (0, 1) for cmp in (0, 1)]


@pytest.mark.parametrize("bp, tb, sec, cmp", PROTECTION_COMBOS)
def test_protection_decoder(open_board, bp, tb, sec, cmp):
    b = open_board(profile="ideal")
    write_status(b, sr1_value(bp, tb, sec), CMP if cmp else 0)
    assert sr(b) == sr1_value(bp, tb, sec) and sr(b, 0x35) == (CMP if cmp else 0)
    expected = protected_sectors(bp, tb, sec, cmp)
    for sector in range(SECTORS):
        base = sector * 4 * KiB
        program(b, base, b"\x00")
        assert not sr(b) & WEL                               # cleared, refused or not
        program(b, base + 4 * KiB - 1, b"\x00")
    flash = read(b, 0, FLASH)
    for sector in range(SECTORS):
        base = sector * 4 * KiB
        kept = (flash[base], flash[base + 4 * KiB - 1]) == (FF, FF)
        assert kept == (sector in expected), f"sector {sector}"


def test_cmp_with_bp0_protects_everything_until_cleared(open_board):
    image = pattern(9)
    b = open_board(cmp=True, content=image)
    for op, address in [(0x20, 0), (0x20, FLASH - 4096), (0xD8, 0x80000), (0xC7, None)]:
        wren(b)
        tx(b, op, *(a3(address) if address is not None else ()))
        assert sr(b) == 0                                     # no busy, WEL cleared
    program(b, 0x1000, b"\x00")
    assert read(b, 0, FLASH) == image
    # The documented way out: WREN, 01h (SR1 & 0xFC, SR2 & ~CMP), wait, re-read SR2.
    wren(b)
    tx(b, 0x01, sr(b) & 0xFC, sr(b, 0x35) & ~CMP & 0xFF)
    while busy(b):
        b.clock.sleep(1e-3)
    assert sr(b, 0x35) & CMP == 0
    erase(b, 0x20, 0)
    settle(b)
    assert read(b, 0, 4096) == b"\xff" * 4096


PARTIAL_ERASES = [
    # (SR1, SR2, erase op, address, erased?) — a whole block is refused if any of it is protected
    (sr1_value(1, sec=1), 0, 0xD8, FLASH - 64 * KiB, False),   # top 4K protected inside
    (sr1_value(1, sec=1), 0, 0x52, FLASH - 32 * KiB, False),
    (sr1_value(1, sec=1), 0, 0x20, FLASH - 8 * KiB, True),     # the sector below is free
    (sr1_value(4, tb=1, sec=1), 0, 0xD8, 0, False),            # bottom 32K
    (sr1_value(4, tb=1, sec=1), 0, 0x52, 32 * KiB, True),
    (sr1_value(1, tb=1, sec=1), CMP, 0x20, 0, True),           # CMP: all but the bottom 4K
    (sr1_value(1, tb=1, sec=1), CMP, 0x20, 4 * KiB, False),
    (sr1_value(1, tb=1, sec=1), CMP, 0x52, 0, False),
]


@pytest.mark.parametrize("sr1, sr2, op, address, erased", PARTIAL_ERASES)
def test_partially_protected_erases_are_refused_whole(open_board, sr1, sr2, op, address, erased):
    image = pattern(10)
    b = open_board(profile="ideal", content=image)
    write_status(b, sr1, sr2)
    erase(b, op, address)
    assert sr(b) & WEL == 0
    size = {0x20: 4 * KiB, 0x52: 32 * KiB, 0xD8: 64 * KiB}[op]
    got = read(b, address, size)
    assert got == (b"\xff" * size if erased else image[address:address + size])


@pytest.mark.parametrize("sr1, sr2, allowed", [
    (0, 0, True), (sr1_value(1), 0, False), (sr1_value(1, sec=1), 0, False),
    (sr1_value(7), CMP, True),                                 # CMP of everything = nothing
    (0, CMP, False),
])
def test_chip_erase_refused_if_anything_is_protected(open_board, sr1, sr2, allowed):
    image = pattern(11)
    b = open_board(profile="ideal", content=image)
    write_status(b, sr1, sr2)
    wren(b)
    tx(b, 0x60)
    assert sr(b) & WEL == 0
    assert read(b, 0, FLASH) == (b"\xff" * FLASH if allowed else image)


# -- status register writes ---------------------------------------------------------------

def test_status_write_masks_read_only_bits(open_board):
    b = open_board(profile="ideal")
    write_status(b, 0xFF, SUS1 | SUS2 | QE)                    # WIP/WEL/SUS are read-only
    assert sr(b) == 0xFC
    assert sr(b, 0x35) == QE
    write_status(b, 0x00)                                      # one byte: SR2 untouched
    assert (sr(b), sr(b, 0x35)) == (0x00, QE)
    write_status(b, CMP, op=0x31)
    assert sr(b, 0x35) == CMP
    write_status(b, 0xFF, op=0x11)
    assert sr(b, 0x15) == 0x60                                 # DRV1/DRV0 only


def test_volatile_status_write(open_board):
    b = open_board(bp=3)
    tx(b, 0x50)
    tx(b, 0x50)                                                # engine re-send
    assert sr(b) == 3 << 2                                     # WEL stays 0
    tx(b, 0x01, 0x00, 0x00)
    assert sr(b) == 0 and not busy(b)                          # no tW, no WEL
    program(b, FLASH - 256, b"\x00")                           # BP now clear: allowed
    settle(b)
    assert read(b, FLASH - 256, 1) == b"\x00"
    # The 50h enable was used up: a second 01h without WEL does nothing.
    tx(b, 0x01, 0x1C)
    assert sr(b) == 0
    # Reset brings back the non-volatile value.
    tx(b, 0x66)
    tx(b, 0x99)
    assert sr(b) == 3 << 2


def test_volatile_enable_is_cancelled_by_wren(open_board):
    b = open_board()
    tx(b, 0x50)
    wren(b)
    tx(b, 0x01, 0x04)                                          # non-volatile: busy tW
    assert busy(b)
    settle(b)
    tx(b, 0x66)
    tx(b, 0x99)
    assert sr(b) == 0x04


SRP_CASES = [
    # (SRP0, SRP1, a later status write accepted?) — WP# assumed high
    (0, 0, True),
    (1, 0, True),            # hardware protection needs WP# low
    (0, 1, False),           # power-supply lock-down: until a power cycle that never comes
    (1, 1, False),           # one-time program
]


@pytest.mark.parametrize("srp0, srp1, accepted", SRP_CASES)
def test_status_register_protection(open_board, srp0, srp1, accepted):
    b = open_board(profile="ideal")
    write_status(b, sr1_value(1) | (SRP0 if srp0 else 0), SRP1 if srp1 else 0)
    for op, values in [(0x01, (sr1_value(2) | (SRP0 if srp0 else 0), SRP1 if srp1 else 0)),
                       (0x31, ((SRP1 if srp1 else 0) | CMP,)), (0x11, (0x20,))]:
        before = (sr(b), sr(b, 0x35), sr(b, 0x15))
        write_status(b, *values, op=op)
        assert sr(b) & WEL == 0
        after = (sr(b), sr(b, 0x35), sr(b, 0x15))
        assert (after != before) == accepted
    # A software reset is no power cycle.
    tx(b, 0x66)
    tx(b, 0x99)
    write_status(b, 0, 0)
    assert (sr(b) == 0) == accepted


def test_volatile_lock_down_is_released_by_reset(open_board):
    b = open_board(profile="ideal")
    tx(b, 0x50)
    tx(b, 0x01, 0x00, SRP1)
    write_status(b, 0x04)
    assert sr(b) == 0
    tx(b, 0x66)
    tx(b, 0x99)
    write_status(b, 0x04)
    assert sr(b) == 0x04


# -- security registers and their OTP lock bits -------------------------------------------

def sec_read(b: Board, number: int, offset: int, size: int) -> bytes:
    return tx(b, 0x48, *a3(number << 12 | offset), rx=size + 1)[1:]


def sec_program(b: Board, number: int, offset: int, data: bytes) -> None:
    wren(b)
    tx(b, 0x42, *a3(number << 12 | offset), data)


def sec_erase(b: Board, number: int) -> None:
    wren(b)
    tx(b, 0x44, *a3(number << 12))


def test_security_registers_program_read_erase(open_board):
    """Three 1 KiB registers (ufprog gd25_otp_3_1k; flashrom GD25LQ16: "OTP: 1024B total")."""
    b = open_board(profile="ideal", cmp=True)                    # array protection is irrelevant
    for number in (1, 2, 3):
        assert sec_read(b, number, 0, 1024) == b"\xff" * 1024
    assert tx(b, 0x48, 0x00, 0x10, 0x00, rx=2)[0] == FF          # dummy byte
    sec_program(b, 1, 0x0FE, b"\x11\x22\x33")                    # wraps inside its 256-byte page
    assert sec_read(b, 1, 0x0FE, 2) == b"\x11\x22"
    assert sec_read(b, 1, 0x000, 1) == b"\x33"
    assert sec_read(b, 1, 0x100, 1) == b"\xff"
    sec_program(b, 1, 0x0FE, b"\xf0")                            # ANDs
    assert sec_read(b, 1, 0x0FE, 1) == b"\x10"
    sec_program(b, 2, 0x1FF, b"\x44")
    sec_program(b, 2, 0x200, b"\x55")                           # the second half: its own bytes
    assert sec_read(b, 2, 0x1FF, 2) == b"\x44\x55"
    assert sec_read(b, 2, 0x000, 1) == b"\xff"
    sec_program(b, 2, 0x3FF, b"\x66")
    assert sec_read(b, 2, 0x3FF, 2) == b"\x66\xff"               # read wraps at 1 KiB
    assert sec_read(b, 2, 0x3FF, 2) == sec_read(b, 2, 0x3FF, 1) + sec_read(b, 2, 0, 1)
    sec_erase(b, 1)
    assert sec_read(b, 1, 0, 1024) == b"\xff" * 1024
    assert sec_read(b, 2, 0x1FF, 2) == b"\x44\x55"
    assert read(b, 0x1000, 1024) == b"\xff" * 1024               # the array is untouched


@pytest.mark.parametrize("address", [0x000000, 0x004000, 0x011000, 0xFF1000])
def test_addresses_outside_the_security_registers(open_board, address):
    b = open_board(profile="ideal")
    assert tx(b, 0x48, *a3(address), 0, rx=4) == b"\xff" * 4
    wren(b)
    tx(b, 0x42, *a3(address), b"\x00" * 4)
    assert sr(b) & WEL == 0
    for number in (1, 2, 3):
        assert sec_read(b, number, 0, 1024) == b"\xff" * 1024


@pytest.mark.parametrize("number, lock, op", [(1, LB1, 0x01), (2, LB2, 0x31), (3, LB3, 0x01)])
def test_lock_bits_make_a_security_register_read_only_for_ever(open_board, number, lock, op):
    b = open_board(profile="ideal")
    sec_program(b, number, 0, b"\x5a")
    write_status(b, *((0, lock) if op == 0x01 else (lock,)), op=op)
    assert sr(b, 0x35) & (LB1 | LB2 | LB3) == lock
    write_status(b, 0, 0)                                        # LB bits never go back to 0
    assert sr(b, 0x35) & lock
    sec_program(b, number, 1, b"\x00")
    assert sr(b) & WEL == 0
    sec_erase(b, number)
    assert sec_read(b, number, 0, 2) == b"\x5a\xff"
    other = number % 3 + 1
    sec_program(b, other, 0, b"\x00")
    assert sec_read(b, other, 0, 1) == b"\x00"
    tx(b, 0x66)
    tx(b, 0x99)
    assert sr(b, 0x35) & lock


def test_volatile_writes_cannot_set_lock_bits(open_board):
    b = open_board(profile="ideal")
    tx(b, 0x50)
    tx(b, 0x31, LB1 | LB2 | LB3)
    assert sr(b, 0x35) == 0
    sec_program(b, 1, 0, b"\x00")
    assert sec_read(b, 1, 0, 1) == b"\x00"


# -- SFDP -----------------------------------------------------------------------------------

def sfdp(b: Board, address: int, size: int) -> bytes:
    got = tx(b, 0x5A, *a3(address), rx=size + 1)
    assert got[0] == FF                                          # the dummy cycle
    return got[1:]


def bfpt_dwords(b: Board) -> list[int]:
    header = sfdp(b, 0, 16)
    length, pointer = header[11], int.from_bytes(header[12:15], "little")
    return list(struct.unpack(f"<{length}I", sfdp(b, pointer, length * 4)))


def test_sfdp_header_and_required_fields(open_board):
    b = open_board()
    header = sfdp(b, 0, 16)
    assert header[0:4] == b"SFDP"
    assert (header[5], header[4]) == (1, 6)                      # revision 1.6
    assert header[6] == 0                                        # one parameter header
    assert header[8] | header[15] << 8 == 0xFF00                 # BFPT id
    assert (header[10], header[9]) == (1, 6)
    assert header[11] == 16                                      # JESD216B BFPT length
    dw = bfpt_dwords(b)
    assert dw[1] == 0x00FFFFFF                                   # 16 Mbit
    assert dw[7] & 0xFFFF == 0x200C and dw[7] >> 16 == 0x520F    # (0x0C, 20h), (0x0F, 52h)
    assert dw[8] & 0xFFFF == 0xD810                              # (0x10, D8h)
    assert dw[8] >> 16 == 0                                      # no fourth erase type
    assert (dw[10] >> 4) & 0xF == 8                              # 256-byte pages
    assert dw[0] & 0x3 == 0b01 and (dw[0] >> 8) & 0xFF == 0x20   # uniform 4 KiB with 20h
    assert (dw[0] >> 17) & 0x3 == 0                              # 3-byte addresses only
    assert dw[12] == 0x757A757A and not dw[11] >> 31             # suspend 75h, resume 7Ah
    assert (dw[13] >> 15) & 0xFF == 0xAB and (dw[13] >> 23) & 0xFF == 0xB9
    assert not dw[13] >> 31                                      # deep power-down supported
    assert (dw[14] >> 20) & 0x7 == 0b101                         # QER: 35h reads SR2, 01h writes both
    assert (dw[15] >> 8) & 0x3F == 0b010000                      # reset 66h + 99h
    assert sfdp(b, 0x30 + 64, 4) == b"\xff" * 4                  # nothing past the table
    assert tx(b, 0x5A, 0, 0, 0, 0, rx=4) == b"SFDP"              # dummy sent as TX


def test_sfdp_erase_types_and_page_size_match_the_chip(open_board):
    """Self-consistency: each advertised erase type erases exactly its size."""
    image = pattern(12)
    b = open_board(profile="ideal", content=image)
    dw = bfpt_dwords(b)
    types = [(dw[7] >> s) & 0xFFFF for s in (0, 16)] + [dw[8] & 0xFFFF]
    base = 0x100000
    for entry in types:
        exponent, opcode = entry & 0xFF, entry >> 8
        size = 1 << exponent
        erase(b, opcode, base + 0x10)
        assert read(b, base, size) == b"\xff" * size
        assert read(b, base + size, 16) == image[base + size:base + size + 16]
        base += 0x20000
    page = 1 << ((dw[10] >> 4) & 0xF)
    program(b, 0x180000 + page - 1, b"\x00\x00")                 # wraps at the page size
    assert read(b, 0x180000, 1) == b"\x00"
    assert read(b, 0x180000 + page, 1) == image[0x180000 + page:0x180000 + page + 1]


# -- deep power-down, reset -----------------------------------------------------------------

def test_deep_power_down_hears_only_release(open_board):
    image = pattern(13)
    b = open_board(content=image)
    tx(b, 0xB9)
    assert tx(b, 0x9F, rx=3) == b"\xff" * 3
    assert tx(b, 0x05, rx=1) == b"\xff"
    assert read(b, 0, 4) == b"\xff" * 4
    assert b.chip.aperture_read(0, 4) == b"\xff" * 4
    assert b.chip.psp_update(0x1000, b"\x00") is False
    tx(b, 0x06)
    tx(b, 0x66)
    tx(b, 0xB9)                                                  # the engine's re-send
    assert tx(b, 0xAB, 0, 0, 0, rx=2) == b"\x14\x14"            # the ID is clocked out too
    assert sr(b) == 0                                            # 06h was not heard
    assert tx(b, 0x9F, rx=3) == JEDEC
    assert read(b, 0x1000, 4) == image[0x1000:0x1004]
    tx(b, 0xB9)
    tx(b, 0xAB)                                                  # bare ABh releases as well
    assert tx(b, 0x9F, rx=3) == JEDEC


def test_deep_power_down_needs_a_clean_command(open_board):
    b = open_board()
    tx(b, 0xB9, 0)
    tx(b, 0xB9, rx=1)
    assert tx(b, 0x9F, rx=3) == JEDEC


RESET_CASES = [
    # (sequence of (out, rx) after WEL and a volatile SR3 value were set, reset happened?)
    ([((0x66,), 0), ((0x99,), 0)], True),
    ([((0x66,), 0), ((0x66,), 0), ((0x99,), 0)], True),          # re-sent 66h stays armed
    ([((0x99,), 0)], False),
    ([((0x66,), 0), ((0x05,), 2), ((0x99,), 0)], False),        # anything in between disarms
    ([((0x66,), 0), ((0x99, 0), 0)], False),
    ([((0x66,), 0), ((0x99,), 0), ((0x99,), 0)], True),
]


@pytest.mark.parametrize("sequence, reset", RESET_CASES)
def test_reset_enable_then_reset(open_board, sequence, reset):
    b = open_board(bp=1)
    tx(b, 0x50)
    tx(b, 0x11, 0x60)                                            # volatile SR3
    wren(b)
    tx(b, 0x50)                                                  # armed again (06h would disarm)
    for out, rx_len in sequence:
        tx(b, *out, rx=rx_len)
    state = (sr(b), sr(b, 0x15))
    assert state == ((1 << 2, 0x00) if reset else (1 << 2 | WEL, 0x60))
    # After a reset the 50h enable is gone: a WEL-less 01h does nothing.
    tx(b, 0x01, 0x00)
    assert (sr(b) & 0x1C == 0) == (not reset)


def test_reset_while_busy_aborts_the_running_operation(open_board):
    b = open_board(content=pattern(15))
    erase(b, 0x20, 0)
    tx(b, 0x66)
    tx(b, 0x05, rx=1)                                            # anything in between disarms it
    tx(b, 0x99)
    assert sr(b) == WIP | WEL
    tx(b, 0x66)
    tx(b, 0x99)                                                  # heard while busy: the erase is abandoned
    assert sr(b) == 0
    assert read(b, 0, 16) == b"\xff" * 16                         # its content change had already happened
    assert b.stats()["flash_busy_seconds"] < T_4K


# -- suspend and resume ---------------------------------------------------------------------

def test_erase_suspend_and_resume(open_board):
    image = pattern(14)
    b = open_board(content=image)
    erase(b, 0x20, 0x5000)
    b.clock.sleep(10e-3)
    tx(b, 0x75)
    assert sr(b) == 0                                            # WIP and WEL dropped
    assert sr(b, 0x35) == SUS1
    assert read(b, 0x9000, 8) == image[0x9000:0x9008]            # reads are allowed
    tx(b, 0x75)                                                  # re-sent: nothing to suspend
    assert sr(b, 0x35) == SUS1
    erase(b, 0x20, 0x9000)                                       # no erase while suspended
    assert sr(b) == 0 and read(b, 0x9000, 8) == image[0x9000:0x9008]
    for op, values in [(0x01, (0x04,)), (0x31, (CMP,))]:
        write_status(b, *values, op=op)
        assert sr(b) == 0 and sr(b, 0x35) == SUS1
    program(b, 0x5100, b"\x00")                                  # inside the suspended sector
    assert sr(b) == 0
    program(b, 0x9000, b"\x00")                                  # elsewhere: allowed
    assert busy(b)
    b.clock.sleep(1e-3)
    assert read(b, 0x9000, 1) == b"\x00" and sr(b, 0x35) == SUS1
    tx(b, 0x7A)
    assert sr(b, 0x35) == 0 and busy(b)
    b.clock.sleep(40e-3 * 0.999)                                 # the remaining 40 ms
    assert busy(b)
    b.clock.sleep(40e-3 * 0.002)
    assert sr(b) == 0
    assert read(b, 0x5000, 4096) == b"\xff" * 4096


def test_program_suspend(open_board):
    b = open_board()
    program(b, 0x100, b"\x00")
    tx(b, 0x75)
    assert sr(b, 0x35) == SUS2 and not busy(b)
    program(b, 0x200, b"\x00")                                   # refused while suspended
    assert sr(b) == 0 and read(b, 0x200, 1) == b"\xff"
    tx(b, 0x7A)
    assert busy(b) and sr(b, 0x35) == 0
    settle(b)
    assert read(b, 0x100, 1) == b"\x00"


@pytest.mark.parametrize("out", [(0xC7,), (0x01, 0x00, 0x00), (0x44, 0x00, 0x10, 0x00)])
def test_suspend_not_accepted_for(open_board, out):
    b = open_board()
    wren(b)
    tx(b, *out)
    tx(b, 0x75)
    assert busy(b) and sr(b, 0x35) & (SUS1 | SUS2) == 0


def test_suspend_when_idle_and_resume_when_not_suspended_do_nothing(open_board):
    b = open_board()
    tx(b, 0x75)
    tx(b, 0x7A)
    assert (sr(b), sr(b, 0x35)) == (0, 0)


def test_reset_abandons_a_suspended_operation(open_board):
    b = open_board()
    counted = b.stats()["flash_busy_seconds"]
    erase(b, 0xD8, 0)
    b.clock.sleep(50e-3)
    tx(b, 0x75)
    tx(b, 0x66)
    tx(b, 0x99)
    assert sr(b, 0x35) == 0
    tx(b, 0x7A)
    assert not busy(b)
    assert b.stats()["flash_busy_seconds"] - counted == pytest.approx(50e-3)


# -- faults ---------------------------------------------------------------------------------

def test_stuck_bit(open_board):
    image = bytearray(pattern(15))
    image[0x1234] = 0x00
    b = open_board(content=bytes(image), faults=["stuck-bit=0x1234:3"])
    assert read(b, 0x1234, 1) == b"\x08"
    assert b.chip.aperture_read(0x1234, 4)[0] == 0x08
    erase(b, 0x20, 0x1000)
    settle(b)
    assert read(b, 0x1000, 4096) == b"\xff" * 4096
    program(b, 0x1200, b"\x00" * 256)
    settle(b)
    assert read(b, 0x1234, 1) == b"\x08"
    assert read(b, 0x1200, 256).count(0) == 255
    assert read(b, FLASH - 4, 8)[4:] == bytes(image[0:4])        # wrapped reads stay right


def test_erase_fail(open_board):
    image = pattern(16)
    b = open_board(profile="ideal", content=image, faults=["erase-fail=5"])
    sector5 = image[0x5000:0x6000]
    erase(b, 0x20, 0x5000)
    assert read(b, 0x5000, 4096) == sector5
    erase(b, 0xD8, 0)
    flash = read(b, 0, 0x10000)
    assert flash[0x5000:0x6000] == sector5
    assert flash[:0x5000] + flash[0x6000:] == b"\xff" * (0x10000 - 0x1000)
    erase(b, 0x52, 0)
    wren(b)
    tx(b, 0xC7)
    assert read(b, 0x5000, 4096) == sector5
    assert read(b, 0x6000, FLASH - 0x6000) == b"\xff" * (FLASH - 0x6000)


# -- persistence ----------------------------------------------------------------------------

def test_state_persists_across_host_processes(make_board):
    path = make_board(content="blank", cmp=True, bp=2)
    b = Board(path)
    write_status(b, sr1_value(2), CMP | LB2)
    settle(b)
    tx(b, 0x50)
    tx(b, 0x11, 0x20)                                            # volatile SR3
    sec_program(b, 3, 7, b"\x42")
    settle(b)
    write_status(b, sr1_value(2), CMP | LB2)                     # busy for tW...
    b.close()                                                    # ...when the host dies
    b = Board(path)
    assert sr(b) == sr1_value(2) | WIP | WEL
    b.clock.sleep(T_W * 1.001)
    assert (sr(b), sr(b, 0x35), sr(b, 0x15)) == (sr1_value(2), CMP | LB2, 0x20)
    assert sec_read(b, 3, 7, 1) == b"\x42"
    tx(b, 0x06)
    tx(b, 0x66)
    tx(b, 0xB9)
    b.close()
    b = Board(path)
    assert tx(b, 0x9F, rx=3) == b"\xff" * 3                       # still powered down
    tx(b, 0xAB)
    assert sr(b) == sr1_value(2) | WEL
    tx(b, 0x50)
    b.close()
    b = Board(path)
    tx(b, 0x01, 0x00, 0x00)                                      # 50h survived the host
    assert (sr(b), sr(b, 0x35)) == (WEL, LB2)
    b.close()


# -- the PSP's own writes ---------------------------------------------------------------------

def test_psp_update_merges_sectors_and_charges_busy_time(open_board):
    image = pattern(17)
    b = open_board(content=image)
    counted = b.stats()["flash_busy_seconds"]
    assert b.chip.psp_update(0x1FF0, b"\x00" * 0x20) is True     # straddles two sectors
    expected = bytearray(image)
    expected[0x1FF0:0x2010] = b"\x00" * 0x20
    assert busy(b)
    seconds = b.stats()["flash_busy_seconds"] - counted
    assert seconds == pytest.approx(2 * T_4K + 32 * T_PP)
    b.clock.sleep(seconds)
    assert not busy(b)
    assert read(b, 0, FLASH) == bytes(expected)


@pytest.mark.parametrize("bp, cmp, address, ok", [
    (7, False, 0x0, False), (0, True, 0x1000, False),
    (1, False, FLASH - 64 * KiB - 2, False),                   # touches the protected top block
    (1, False, FLASH - 64 * KiB - 4096, True),
])
def test_psp_update_honours_protection(open_board, bp, cmp, address, ok):
    image = pattern(18)
    b = open_board(profile="ideal", content=image, bp=bp, cmp=cmp)
    assert b.chip.psp_update(address, b"\x00" * 4) is ok
    expected = image[:address] + b"\x00" * 4 + image[address + 4:] if ok else image
    assert read(b, 0, FLASH) == expected


def test_psp_update_honours_faults(open_board):
    b = open_board(profile="ideal", content=pattern(19),
                   faults=["erase-fail=1", "stuck-bit=0x3000:7"])
    assert b.chip.psp_update(0x1000, b"\xff" * 4)               # erase fails: stays programmed
    assert read(b, 0x1000, 4) == pattern(19)[0x1000:0x1004]
    assert b.chip.psp_update(0x3000, b"\x00")
    assert read(b, 0x3000, 1) == b"\x80"


# -- through the ROM_SW engine --------------------------------------------------------------

def w32(b: Board, offset: int, value: int) -> None:
    b.reg_write(offset, (value & 0xFFFFFFFF).to_bytes(4, "little"))


def engine(b: Board, opcode: int, address: int | None = None, data: bytes = b"", rx: int = 0) -> bytes:
    w32(b, R.ROM_SW_COMMAND, (address or 0) << 8 | opcode)
    padded = data + bytes(-len(data) % 4)
    for i in range(0, len(padded), 4):
        w32(b, R.ROM_SW_DATA + i, int.from_bytes(padded[i:i + 4], "big"))
    command_bytes = 1 if address is None else 4
    w32(b, R.ROM_SW_CNTL, (command_bytes - 1) << 16 | (R.ROM_SW_RETURN_DATA_ENABLE if rx else 0)
        | (rx or len(data)))
    wait_done(b)
    captured = bytes(b.reg_read(R.ROM_SW_DATA, 256))[:rx]
    w32(b, R.ROM_SW_STATUS, 0)
    w32(b, R.ROM_SW_CNTL, 0)                                     # the reference client's clear
    wait_done(b)                                                 # (which is a transaction too)
    w32(b, R.ROM_SW_STATUS, 0)
    return captured


def wait_done(b: Board) -> None:
    """Let the transaction run: time passes on the board's clock until STATUS shows done."""
    while not int.from_bytes(b.reg_read(R.ROM_SW_STATUS, 4), "little") & R.ROM_SW_DONE:
        b.clock.sleep(10e-6)


def test_reference_flow_through_the_engine(make_board):
    with Board(make_board(content="blank", cmp=True)) as b:
        for offset in (R.GPIOPAD_MASK, R.GPIOPAD_A, R.GPIOPAD_EN):
            w32(b, offset, 0)
        w32(b, R.PAGE_MIRROR_CNTL, 0x06000000)
        engine(b, 0x9F, rx=4)
        assert JEDEC in engine(b, 0x9F, rx=4)
        engine(b, 0x35, rx=2)
        assert engine(b, 0x35, rx=1) == bytes([CMP])
        engine(b, 0x06)
        engine(b, 0x01, data=bytes((0x00, 0x00)))
        while True:
            engine(b, 0x05, rx=2)
            if not engine(b, 0x05, rx=1)[0] & WIP:
                break
            b.clock.sleep(1e-3)
        engine(b, 0x06)
        engine(b, 0x02, 0x2000, data=bytes(range(256)))
        b.clock.sleep(T_PP)
        engine(b, 0x03, 0x2000, rx=256)
        assert engine(b, 0x03, 0x2000, rx=256) == bytes(range(256))


# -- properties -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def shared_ideal_board(tmp_path_factory) -> Iterator[Board]:
    path = create_board(tmp_path_factory.mktemp("gd25") / "board", content=pattern(20), seed=99)
    b = Board(path, profile="ideal")
    yield b
    b.close()


def reference_latch(column: int, data: bytes) -> bytes:
    latch = bytearray(b"\xff" * 256)
    for i, value in enumerate(data):
        latch[(column + i) % 256] = value        # later bytes overwrite: the last 256 win
    return bytes(latch)


PROPERTY_SETTINGS = settings(max_examples=40, deadline=None,
                             suppress_health_check=[HealthCheck.function_scoped_fixture])


@PROPERTY_SETTINGS
@given(page=st.integers(0, FLASH // 256 - 1), column=st.integers(0, 255),
       initial=st.binary(min_size=256, max_size=256),
       data=st.binary(min_size=1, max_size=600))
def test_program_ands_and_wraps_within_the_page(shared_ideal_board, page, column, initial, data):
    b = shared_ideal_board
    write_status(b, 0x00, 0x00)
    base = page * 256
    sector = base & ~0xFFF
    erase(b, 0x20, sector)
    program(b, base, initial)
    before = read(b, sector, 4096)
    program(b, base + column, data)
    latch = reference_latch(column, data)
    expected_page = bytes(x & y for x, y in zip(initial, latch))
    after = read(b, sector, 4096)
    offset = base - sector
    assert after[offset:offset + 256] == expected_page
    assert after[:offset] + after[offset + 256:] == before[:offset] + before[offset + 256:]


@PROPERTY_SETTINGS
@given(op=st.sampled_from([0x20, 0x52, 0xD8]), address=st.integers(0, FLASH - 1))
def test_erase_sets_exactly_the_aligned_range(shared_ideal_board, op, address):
    b = shared_ideal_board
    write_status(b, 0x00, 0x00)
    size = {0x20: 0x1000, 0x52: 0x8000, 0xD8: 0x10000}[op]
    before = read(b, 0, FLASH)
    erase(b, op, address)
    lo = address // size * size
    assert read(b, 0, FLASH) == before[:lo] + b"\xff" * size + before[lo + size:]
    # Put random-looking content back so later examples still have something to erase.
    for page in range(lo, lo + size, 256):
        program(b, page, before[page:page + 256])
    assert read(b, lo, size) == before[lo:lo + size]


class ReferenceChip:
    """The simplest possible model of the array, WEL and block protection."""

    def __init__(self) -> None:
        self.flash = bytearray(b"\xff" * FLASH)
        self.wel = False
        self.sr1 = 0
        self.sr2 = 0

    def protected(self, lo: int, hi: int) -> bool:
        sectors = protected_sectors((self.sr1 >> 2) & 7, (self.sr1 >> 5) & 1,
                                    (self.sr1 >> 6) & 1, (self.sr2 >> 6) & 1)
        return any(s in sectors for s in range(lo // 4096, (hi - 1) // 4096 + 1))

    def apply(self, step: tuple) -> None:
        kind = step[0]
        if kind == "wren":
            self.wel = True
        elif kind == "wrdi":
            self.wel = False
        elif kind in ("program", "erase", "chip", "status") and self.wel:
            self.wel = False
            if kind == "program":
                _, address, data = step
                page = address // 256 * 256
                if not self.protected(page, page + 256):
                    latch = reference_latch(address % 256, data)
                    for i in range(256):
                        self.flash[page + i] &= latch[i]
            elif kind == "erase":
                _, op, address = step
                size = {0x20: 0x1000, 0x52: 0x8000, 0xD8: 0x10000}[op]
                lo = address // size * size
                if not self.protected(lo, lo + size):
                    self.flash[lo:lo + size] = b"\xff" * size
            elif kind == "chip":
                if not self.protected(0, FLASH):
                    self.flash[:] = b"\xff" * FLASH
            else:
                _, sr1, sr2 = step
                self.sr1, self.sr2 = sr1 & 0x7C, sr2 & CMP


def perform(b: Board, step: tuple) -> None:
    kind = step[0]
    if kind == "wren":
        tx(b, 0x06)
    elif kind == "wrdi":
        tx(b, 0x04)
    elif kind == "program":
        tx(b, 0x02, *a3(step[1]), step[2])
    elif kind == "erase":
        tx(b, step[1], *a3(step[2]))
    elif kind == "chip":
        tx(b, 0xC7)
    else:
        tx(b, 0x01, step[1], step[2])


hot_address = st.one_of(st.integers(0, 0x20000), st.integers(FLASH - 0x20000, FLASH - 1))
steps = st.one_of(
    st.just(("wren",)), st.just(("wren",)), st.just(("wrdi",)),
    st.tuples(st.just("program"), hot_address, st.binary(min_size=1, max_size=64)),
    st.tuples(st.just("erase"), st.sampled_from([0x20, 0x52, 0xD8]), hot_address),
    st.just(("chip",)),
    st.tuples(st.just("status"), st.integers(0, 0x7F).map(lambda v: v & 0x7C),
              st.sampled_from([0, CMP])),
)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sequence=st.lists(steps, min_size=1, max_size=25))
def test_random_sequences_match_the_reference(shared_ideal_board, sequence):
    b = shared_ideal_board
    tx(b, 0x06)
    tx(b, 0x01, 0x00, 0x00)
    tx(b, 0x06)
    tx(b, 0xC7)
    model = ReferenceChip()
    for step in sequence:
        perform(b, step)
        model.apply(step)
        assert bool(sr(b) & WEL) == model.wel, step
        assert (sr(b) & 0x7C, sr(b, 0x35) & CMP) == (model.sr1, model.sr2), step
    assert read(b, 0, FLASH) == bytes(model.flash)


def test_a_board_names_its_part_and_one_made_before_parts_existed_is_a_gd25lq16e(make_board):
    import json

    path = make_board(content="blank")
    config = json.loads((path / "board.json").read_text())
    assert config["chip"] == "GD25LQ16E"
    del config["chip"]
    (path / "board.json").write_text(json.dumps(config))
    with Board(path) as b:
        assert b.chip.transaction(b"\x9f", 3) == JEDEC
