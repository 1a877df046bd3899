"""The emulated board's register file, ROM_SW engine, aperture, cost model and persistence."""
from __future__ import annotations

import hashlib
import os
import struct
import subprocess
import sys

import pytest

from amdflash.stages.drivers.navi31 import regs as R
from amdflash.stages.sim import Board, open_bar
from amdflash.stages.sim.cost import ASM24, PCIE

PADS_AND_MIRROR = ((R.GPIOPAD_MASK, 0), (R.GPIOPAD_A, 0), (R.GPIOPAD_EN, 0), (R.PAGE_MIRROR_CNTL, 0x06000000))


def w32(board: Board, off: int, value: int) -> None:
    board.reg_write(off, struct.pack("<I", value))


def r32(board: Board, off: int) -> int:
    return struct.unpack("<I", board.reg_read(off, 4))[0]


def release_pads(board: Board) -> None:
    for off, value in PADS_AND_MIRROR:
        w32(board, off, value)


def txn(board: Board, opcode: int, address: int | None = None, tx: bytes = b"", rx: int = 0) -> bytes:
    """One ROM_SW transaction through the registers, as a minimal driver does it."""
    w32(board, R.ROM_SW_STATUS, 0)
    w32(board, R.ROM_SW_COMMAND, ((address or 0) & 0xFFFFFF) << 8 | opcode)
    padded = tx + bytes(-len(tx) % 4)
    for i in range(0, len(padded), 4):
        w32(board, R.ROM_SW_DATA + i, int.from_bytes(padded[i:i + 4], "big"))
    ncmd = 4 if address is not None else 1
    w32(board, R.ROM_SW_CNTL, (ncmd - 1) << 16 | (R.ROM_SW_RETURN_DATA_ENABLE if rx else 0) | (rx or len(tx)))
    wait_done(board)
    return board.reg_read(R.ROM_SW_DATA, 256)[:rx]


def wait_done(board: Board, limit: float = 2e-3) -> bool:
    """Time passes on the board's clock until STATUS shows done (or `limit` seconds went by)."""
    deadline = board.clock.now() + limit
    while not r32(board, R.ROM_SW_STATUS) & R.ROM_SW_DONE:
        if board.clock.now() >= deadline:
            return False
        board.clock.sleep(10e-6)
    return True


# -- register file ---------------------------------------------------------------------------

def test_plain_registers_read_back_what_was_written_byte_addressable(board):
    board.reg_write(0x1000, b"\x11\x22\x33\x44")
    board.reg_write(0x1001, b"\xAA")
    assert board.reg_read(0x1000, 4) == b"\x11\xAA\x33\x44"
    assert r32(board, 0x1000) == 0x4433AA11
    board.reg_write(0xFFFFC, b"\x01\x02\x03\x04")
    assert board.reg_read(0xFFFFE, 2) == b"\x03\x04"
    with pytest.raises(ValueError):
        board.reg_read(0xFFFFE, 4)


def test_power_on_values(board):
    assert r32(board, R.ROM_CNTL) == 0x0A000002
    assert r32(board, R.GPIOPAD_MASK) & R.SPI_PAD_BITS == R.SPI_PAD_BITS


# -- ROM_SW engine ---------------------------------------------------------------------------

def test_flash_sees_nothing_until_pads_released_and_mirror_usage_set(make_board):
    with Board(make_board()) as b:
        txn(b, 0x9F, rx=4)
        assert txn(b, 0x9F, rx=4) == b"\xff" * 4
        release_pads(b)
        w32(b, R.PAGE_MIRROR_CNTL, 0)  # pads free but mirror usage clear: still nothing
        txn(b, 0x9F, rx=4)
        assert txn(b, 0x9F, rx=4) == b"\xff" * 4
        release_pads(b)
        txn(b, 0x9F, rx=4)
        assert txn(b, 0x9F, rx=4)[:3] == b"\xc8\x60\x15"


def test_rx_window_shows_the_previous_rx_transaction(make_board):
    with Board(make_board(content=bytes(range(256)) * 0x2000)) as b:
        release_pads(b)
        txn(b, 0x03, 0x000, rx=8)                 # capture A (window: whatever came before)
        first = txn(b, 0x03, 0x010, rx=8)         # window shows A
        assert first == bytes(range(0, 8))
        txn(b, 0x06)                              # a TX transaction does not disturb the capture
        second = txn(b, 0x03, 0x020, rx=8)
        assert second == bytes(range(0x10, 0x18))


def test_done_bit_and_status_clear(board):
    release_pads(board)
    txn(board, 0x05, rx=2)
    assert r32(board, R.ROM_SW_STATUS) & 1
    w32(board, R.ROM_SW_STATUS, 0)
    assert r32(board, R.ROM_SW_STATUS) == 0


def test_gated_engine_never_completes_but_status_clears(make_board):
    with Board(make_board(gated=True)) as b:
        release_pads(b)
        w32(b, R.ROM_SW_STATUS, 0)
        assert r32(b, R.ROM_SW_STATUS) == 0
        w32(b, R.ROM_SW_COMMAND, 0x9F)
        w32(b, R.ROM_SW_CNTL, R.ROM_SW_RETURN_DATA_ENABLE | 4)
        for _ in range(5):
            assert r32(b, R.ROM_SW_STATUS) == R.ROM_SW_GATED_STATUS
        w32(b, R.ROM_SW_STATUS, 0)
        assert r32(b, R.ROM_SW_STATUS) == 0
        assert b.stats()["spi_transactions"] == 0


def test_cntl_write_of_zero_starts_an_opcode_only_transaction(board):
    release_pads(board)
    w32(board, R.ROM_SW_COMMAND, 0x06)
    w32(board, R.ROM_SW_CNTL, 0)
    assert board.stats()["spi_transactions"] == 1
    assert wait_done(board)
    assert board.chip.transaction(b"\x05", 1) == b"\x02"          # the opcode reached the chip: WEL


def test_stall_fault_stops_completions_after_n_transactions(make_board):
    with Board(make_board(faults=["stall-after=3"])) as b:
        release_pads(b)
        for _ in range(3):
            txn(b, 0x05, rx=2)
            assert r32(b, R.ROM_SW_STATUS) & 1
        txn(b, 0x05, rx=2)
        assert not r32(b, R.ROM_SW_STATUS) & 1


def test_read_flip_fault_is_transient_and_deterministic(make_board):
    image = bytes(0x200000)
    captures = []
    for _ in range(2):
        with Board(make_board(content=image, seed=7, faults=["read-flip=0.05"], name=f"f{len(captures)}")) as b:
            release_pads(b)
            txn(b, 0x03, 0, rx=256)
            captures.append([txn(b, 0x03, 0, rx=256) for _ in range(4)])
    assert captures[0] == captures[1]                       # same seed, same flips
    flat = captures[0]
    assert any(c != bytes(256) for c in flat)               # flips happen
    assert len(set(flat)) > 1                               # and they are transient
    assert bytes(0x200000) == image


def test_one_256_byte_rx_transaction_runs_its_spi_time_on_the_board_clock(make_board):
    with Board(make_board()) as b:
        release_pads(b)
        w32(b, R.ROM_CNTL, 0x18000008)                                  # prescale 8, the driver default
        w32(b, R.ROM_SW_COMMAND, 0 << 8 | 0x03)
        start = b.clock.now()
        w32(b, R.ROM_SW_CNTL, 3 << 16 | R.ROM_SW_RETURN_DATA_ENABLE | 256)
        spi = 1e-6 + 8 * 260 * 9 / 100e6
        assert b.clock.now() == start                                   # the host is not held up
        b.clock.sleep(spi * 0.999)
        assert not r32(b, R.ROM_SW_STATUS) & 1                          # still on the wire
        b.clock.sleep(spi * 0.002)
        assert r32(b, R.ROM_SW_STATUS) & 1
        stats = b.stats()
        assert stats["spi_transactions"] == 1 and stats["spi_bytes"] == 260
        assert stats["spi_seconds"] == pytest.approx(spi, rel=1e-12)


def test_charged_accesses_land_when_the_cost_model_says(make_board):
    """asm24: a single-TLP access lands after its control transfer, a streamed read after
    the arming control transfer, a streamed write after the bulk OUT's fixed latency."""
    with Board(make_board()) as b:
        b.trace = []
        b.tlp_write32(0x1000, 1)
        b.tlp_read32(0x1000)
        b.stream_write(0x1000, bytes(64))
        b.stream_read(0x1000, 64)
        c, k = ASM24.control, ASM24.bulk
        expected = [("write32", c, c), ("read32", c, 2 * c), ("stream write", c + k, c + k + 64 / 3.6e6),
                    ("stream read", c, c + k + 64 / 1.8e6)]
        for (kind, offset, size, start, landed, end), (want, lands, total) in zip(b.trace, expected):
            assert kind == want
            assert landed - start == pytest.approx(lands, rel=1e-9)
            assert end - start == pytest.approx(total, rel=1e-9)
    with Board(make_board(), profile="pcie") as b:
        b.trace = []
        b.stream_read(0x1000, 64)
        (_, _, _, start, landed, end), = b.trace
        assert landed == start and end - start == pytest.approx(16 * PCIE.pcie_read_dword)


def test_pcie_and_ideal_profiles(make_board):
    path = make_board()
    with Board(path, profile="pcie") as b:
        t = b.clock.now()
        b.stream_read(R.ROM_SW_DATA, 256)
        b.tlp_write32(R.ROM_SW_STATUS, 0)
        assert b.clock.now() - t == pytest.approx(64 * PCIE.pcie_read_dword + PCIE.pcie_write_dword)
    with Board(path, profile="ideal") as b:
        t = b.clock.now()
        release_pads(b)
        txn(b, 0x03, 0, rx=256)
        b.stream_read(R.ROM_SW_DATA, 256)
        assert b.clock.now() == t


# -- ROM aperture ----------------------------------------------------------------------------

def aperture_read(board: Board, address: int, dwords: int) -> bytes:
    cntl = r32(board, R.ROM_CNTL)
    w32(board, R.ROM_CNTL, int.from_bytes(((cntl | 1 << 29) & 0xFFFFFFFF).to_bytes(4, "little"), "big"))
    w32(board, R.ROM_INDEX, int.from_bytes((address >> 8).to_bytes(4, "little"), "big"))
    return b"".join(board.reg_read(R.ROM_DATA, 4) for _ in range(dwords))


def test_aperture_reads_with_byte_swapped_encoding_and_auto_increment(make_board):
    image = os.urandom(0x200000)
    with Board(make_board(content=image)) as b:
        assert aperture_read(b, 0x30000, 8) == image[0x30000:0x30020]
        assert aperture_read(b, 0x1F0000, 4) == image[0x1F0000:0x1F0010]
        # Without auto-increment the data port keeps returning the same dword.
        w32(b, R.ROM_CNTL, 0)
        w32(b, R.ROM_INDEX, int.from_bytes((0x100).to_bytes(4, "little"), "big"))
        assert {b.reg_read(R.ROM_DATA, 4) for _ in range(3)} == {image[0x10000:0x10004]}


def test_mirrored_aperture_wraps_at_one_mib(make_board):
    image = os.urandom(0x200000)
    with Board(make_board(content=image, mirrored_rom=True)) as b:
        assert aperture_read(b, 0x110000, 4) == image[0x10000:0x10010]


def test_no_raw_rom_reads_all_ones_and_ignores_writes(make_board):
    with Board(make_board(no_raw_rom=True)) as b:
        assert r32(b, R.ROM_CNTL) == 0xFFFFFFFF
        w32(b, R.ROM_SW_STATUS, 0)
        assert r32(b, R.ROM_SW_STATUS) == 0xFFFFFFFF
        assert r32(b, R.ROM_DATA) == 0xFFFFFFFF


# -- persistence -----------------------------------------------------------------------------

def _run(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60)


def test_state_persists_across_processes(make_board):
    path = make_board()
    code = ("import sys, struct\nfrom amdflash.stages.sim import open_bar\n"
            "bar = open_bar(sys.argv[1])\nbar.write(0x2000, struct.pack('<I', 0xCAFEF00D))\n"
            "bar.close()\n")
    assert _run(code, str(path)).returncode == 0
    with Board(path) as b:
        assert r32(b, 0x2000) == 0xCAFEF00D
        assert b.stats()["reg_writes"] == 1
        assert b.clock.now() == pytest.approx(ASM24.control + ASM24.bulk + 4 / 3.6e6)


def test_kill_after_writes_kills_the_host_and_the_board_keeps_what_it_had(make_board):
    path = make_board(faults=["kill-after-writes=5"])
    code = ("import sys, struct\nfrom amdflash.stages.sim import open_bar\n"
            "bar = open_bar(sys.argv[1])\n"
            "for i in range(10): bar.write(0x3000 + 4 * i, struct.pack('<I', i + 1))\n"
            "print('survived')\n")
    result = _run(code, str(path))
    assert result.returncode == -9 and "survived" not in result.stdout
    with Board(path) as b:
        assert [r32(b, 0x3000 + 4 * i) for i in range(6)] == [1, 2, 3, 4, 0, 0]
    # One-shot: the next process runs to the end.
    result = _run(code, str(path))
    assert result.returncode == 0 and "survived" in result.stdout


def test_open_bar_matches_the_conformance_contract(make_board):
    bar = open_bar(make_board(), "pcie")
    try:
        bar.write(0x4000, b"\x01\x02\x03\x04\x05\x06\x07\x08")
        assert bar.read(0x4004, 4) == b"\x05\x06\x07\x08"
        assert bar.board.cost.name == "pcie"
    finally:
        bar.close()


def test_board_files_differ_per_seed_and_serials_are_distinct(make_board):
    a, b = make_board(seed=1), make_board(seed=2)
    ha = hashlib.sha256((a / "flash.bin").read_bytes()).digest()
    hb = hashlib.sha256((b / "flash.bin").read_bytes()).digest()
    assert ha != hb
    with Board(a) as ba, Board(b) as bb:
        assert ba.config["serial"] != bb.config["serial"]
        assert ba.config["unique_id"] != bb.config["unique_id"]


def test_real_time_board_follows_wall_time_and_charges_are_slept(make_board):
    import time

    with Board(make_board(transport="pcie", realtime_scale=1.0)) as b:
        t0 = b.clock.now()
        time.sleep(0.05)                          # the host waits on its own clock
        assert b.clock.now() - t0 >= 0.05          # ... and time passed on the board too
        start = time.perf_counter()
        b.clock.sleep(0.05)                        # a charge is slept in wall time
        assert time.perf_counter() - start >= 0.045
    with Board(make_board(transport="pcie")) as b:  # virtual time: wall time does not count
        t0 = b.clock.now()
        time.sleep(0.02)
        assert b.clock.now() == t0


def test_the_aperture_sees_a_page_program_that_ended_unwatched(make_board):
    """The board's clock runs whichever path the host reads: a page program whose time has
    passed is in the flash when the aperture reads it, though no one touched ROM_SW since."""
    with Board(make_board(content=b"\xff" * 0x200000)) as b:
        release_pads(b)
        txn(b, 0x06)
        w32(b, R.ROM_SW_STATUS, 0)                    # a page program of zeros at 0, then hands off
        w32(b, R.ROM_SW_COMMAND, 0x02)
        b.reg_write(R.ROM_SW_DATA, bytes(256))
        w32(b, R.ROM_SW_CNTL, 3 << 16 | 256)
        b.clock.sleep(5e-3)                           # its SPI time and the page's busy time
        assert aperture_read(b, 0, 4) == bytes(16)
