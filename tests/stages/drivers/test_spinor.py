"""The SPI NOR command set over the ROM_SW engine, against the emulated GD25LQ16E."""
from __future__ import annotations

import os

import pytest

from amdflash.stages.drivers.flash import protection
from amdflash.stages.drivers.flash.chips import GD25LQ16E, match_jedec
from amdflash.stages.drivers.flash.spinor import FlashError, FlashTimeout, ProtectedError

MiB2 = 0x200000


def test_identify_reads_jedec_status_sfdp_and_unique_id(open_board, make_board):
    path = make_board(cmp=True, bp=0)
    o = open_board(path)
    with o.engine:
        ident = o.nor.identify()
    assert ident.chip is GD25LQ16E
    assert bytes((0xC8, 0x60, 0x15)) in ident.jedec_capture + ident.jedec_capture[:2]
    assert ident.cmp and ident.sr2 & 0x40
    assert ident.protection.length == MiB2        # CMP=1 with BP=0: everything
    assert ident.sfdp is not None
    assert ident.sfdp.size == MiB2
    assert ident.sfdp.erase_types == ((0x1000, 0x20), (0x8000, 0x52), (0x10000, 0xD8))
    assert ident.sfdp.page_size == 256
    assert ident.unique_id.hex() == o.board.config["unique_id"]


def test_unique_ids_differ_between_boards(open_board):
    ids = []
    for _ in range(2):
        o = open_board()
        with o.engine:
            ids.append(o.nor.identify().unique_id)
    assert ids[0] != ids[1]


@pytest.mark.parametrize("capture,found", [
    (bytes.fromhex("c86015c8"), True), (bytes.fromhex("15c86015"), True),
    (bytes.fromhex("6015ffc8"), True), (bytes.fromhex("6015c860"), False), (bytes.fromhex("ffffffff"), False), (bytes.fromhex("c8601400"), False),
])
def test_jedec_matching_accepts_the_id_anywhere_or_wrapped(capture, found):
    assert (match_jedec(capture) is GD25LQ16E) == found


def test_read_any_range(open_board):
    image = os.urandom(MiB2)
    o = open_board(content=image)
    with o.engine:
        o.nor.identify()
        assert o.nor.read(0x1234, 0x345) == image[0x1234:0x1234 + 0x345]
        assert o.nor.read(MiB2 - 3, 3) == image[-3:]
        with pytest.raises(ValueError):
            o.nor.read(MiB2 - 3, 4)


@pytest.mark.parametrize("size", [0x1000, 0x8000, 0x10000])
def test_erase_sizes_erase_exactly_the_aligned_block(open_board, size):
    image = bytes(MiB2)
    o = open_board(content=image)
    with o.engine:
        o.nor.identify()
        o.nor.erase(0x40000, size)
    flash = bytes(o.board.files.flash)
    assert flash[0x40000:0x40000 + size] == b"\xff" * size
    assert flash[:0x40000] == bytes(0x40000)
    assert flash[0x40000 + size:] == bytes(MiB2 - 0x40000 - size)


def test_erase_waits_about_the_typical_time(open_board):
    o = open_board(content=bytes(MiB2))
    with o.engine:
        o.nor.identify()
        start = o.bar.clock.now()
        o.ops.clear()
        o.nor.erase(0x10000, 0x10000)
        elapsed = o.bar.clock.now() - start
    assert 0.250 <= elapsed < 0.270                        # 250 ms typical plus a poll or two
    polls = sum(1 for op, *_ in o.ops if op == 0x05)
    assert polls <= 6                                      # WEL check + at most two primed polls


def test_busy_timeout_names_the_operation(open_board):
    o = open_board(content=bytes(MiB2))
    with o.engine:
        o.nor.identify()
        o.nor.write_enable()
        o.engine.command(0xD8, 0, 3)
        with pytest.raises(FlashTimeout, match="64K erase"):
            o.nor.wait_ready(0.0, 0.01, "64K erase")


def test_program_skips_erased_pages_and_checks_page_boundaries(open_board):
    o = open_board(content="blank")
    data = bytearray(b"\xff" * 0x1000)
    data[0x100:0x200] = os.urandom(0x100)
    data[0xF00:0x1000] = os.urandom(0x100)
    with o.engine:
        o.nor.identify()
        o.ops.clear()
        assert o.nor.program(0x3000, bytes(data)) == 2
        assert [a for op, a in o.writes_to_flash() if op == 0x02] == [0x3100, 0x3F00]
        with pytest.raises(ValueError):
            o.nor.program_page(0x30F0, bytes(0x20))       # crosses a page boundary
        with pytest.raises(ValueError):
            o.nor.program(0x3010, bytes(0x100))           # not page aligned
    assert bytes(o.board.files.flash[0x3000:0x4000]) == bytes(data)


def test_write_enable_failure_is_reported(open_board):
    o = open_board(content="blank")
    with o.engine:
        o.nor.identify()
        o.engine.command(0xB9)                           # deep power-down: WREN is ignored
        with pytest.raises(FlashError, match="write enable failed"):
            o.nor.write_enable()
        o.engine.command(0xAB, 0, 3)                     # release


def test_clear_cmp_preserves_every_other_protection_and_qe_bit(open_board):
    o = open_board(content="blank")
    with o.engine:
        o.nor.identify()
        # SR1: BP=3, TB=1 (0x2C); SR2: QE + CMP (0x42)
        o.nor.write_enable()
        o.engine.command(0x01, tx=bytes((0x2C, 0x42)))
        o.nor.wait_ready(0.005, 0.03, "write status")
        assert (o.nor.status(0x05), o.nor.status(0x35)) == (0x2C, 0x42)
        assert o.nor.clear_cmp() is True
        assert (o.nor.status(0x05), o.nor.status(0x35)) == (0x2C, 0x02)
        assert o.nor.clear_cmp() is False                # already clear: nothing written
        o.ops.clear()
        o.nor.clear_cmp()
        assert o.writes_to_flash() == []


# Protected range per (BP, TB, SEC, CMP), written out independently of the decoder.
K = 1024
PROTECTION = [
    (0, 0, 0, 0, None), (7, 0, 0, 0, (0, MiB2)), (1, 0, 0, 0, (MiB2 - 64 * K, MiB2)),
    (2, 0, 0, 0, (MiB2 - 128 * K, MiB2)), (5, 0, 0, 0, (MiB2 - 1024 * K, MiB2)), (6, 0, 0, 0, (0, MiB2)),
    (1, 1, 0, 0, (0, 64 * K)), (3, 1, 0, 0, (0, 256 * K)), (1, 0, 1, 0, (MiB2 - 4 * K, MiB2)),
    (4, 0, 1, 0, (MiB2 - 32 * K, MiB2)), (6, 1, 1, 0, (0, 32 * K)), (2, 1, 1, 0, (0, 8 * K)),
    (0, 0, 0, 1, (0, MiB2)), (7, 0, 0, 1, None), (1, 0, 0, 1, (0, MiB2 - 64 * K)),
    (1, 1, 0, 1, (64 * K, MiB2)), (3, 1, 1, 1, (16 * K, MiB2)), (4, 0, 1, 1, (0, MiB2 - 32 * K)),
]


@pytest.mark.parametrize("bp,tb,sec,cmp,expected", PROTECTION)
def test_protection_decoder(bp, tb, sec, cmp, expected):
    sr1 = bp << 2 | tb << 5 | sec << 6
    p = protection.decode(sr1, cmp << 6)
    assert ((p.start, p.end) if p.length else None) == expected


def test_write_into_protected_area_is_refused_before_anything_is_sent(open_board):
    o = open_board(bp=2)                                  # top 128 KiB protected
    with o.engine:
        o.nor.identify()
        o.ops.clear()
        with pytest.raises(ProtectedError, match="protects"):
            o.nor.check_writable(MiB2 - 0x1000, 0x1000)
        o.nor.check_writable(0, 0x1000)                   # the rest is writable
    assert o.writes_to_flash() == []


def test_the_chip_itself_silently_ignores_protected_writes(open_board):
    """Why the up-front refusal matters: the chip says nothing, only a read-back tells."""
    image = bytes(MiB2)
    o = open_board(content=image, bp=1)
    with o.engine:
        o.nor.identify()
        o.nor.write_enable()
        o.engine.command(0x20, MiB2 - 0x1000, 3)
        o.nor.wait_ready(0.05, 0.3, "erase")
        assert o.nor.read(MiB2 - 0x1000, 16) == bytes(16)


def test_chip_erase_erases_everything_and_is_refused_when_anything_is_protected(open_board):
    o = open_board(content=bytes(MiB2))
    with o.engine:
        o.nor.identify()
        start = o.bar.clock.now()
        o.nor.chip_erase()
        assert 8.0 <= o.bar.clock.now() - start < 8.5
    assert bytes(o.board.files.flash) == b"\xff" * MiB2
    p = open_board(content=bytes(MiB2), bp=1)
    with p.engine:
        p.nor.identify()
        with pytest.raises(ProtectedError):
            p.nor.chip_erase()
    assert p.writes_to_flash() == []


def test_a_status_read_that_did_not_run_is_not_taken_for_a_failed_write_enable(open_board):
    """silent-rx: an RX transaction sometimes ends without reaching the chip and leaves an older
    capture in the window. After WREN, such a stale status (say an erased array's 0xFF, WIP set)
    is no evidence the write enable failed; the chip's own answer is read again."""
    o = open_board(content="blank", faults=["silent-rx=0.15"])
    with o.engine:
        o.nor.identify()
        for _ in range(60):
            o.nor.read(0x1000, 0x10)           # blank: the window holds 0xFF (a silent read keeps older bytes)
            o.nor.write_enable()
            o.engine.command(0x04)                       # WRDI: back to not enabled
