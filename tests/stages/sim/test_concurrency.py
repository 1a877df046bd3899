"""The board's clock: ROM_SW transactions and flash busy time run beside the transport.

A transaction starts when its CNTL write lands and ends its SPI time later; STATUS shows
done only then; touching COMMAND, CNTL or the data window before is a protocol violation
(raised on a strict board, counted and spoiling the transaction on a lenient one).
"""
from __future__ import annotations

import struct
import subprocess
import sys

import pytest

from amdflash.stages.drivers.navi31 import regs as R
from amdflash.stages.sim import Board
from amdflash.stages.sim.cost import ASM24, spi_seconds
from amdflash.stages.sim.romsw import ProtocolViolation
from tests.stages.sim.test_board import r32, release_pads, w32
from tests.support import cli

PRESCALE = 8
READ_256 = spi_seconds(4 + 256, PRESCALE)          # 188.2 µs


def start_read(b: Board, address: int = 0, count: int = 256) -> float:
    """Set up and start a 256-byte array read with raw (instant) register writes; its start time."""
    release_pads(b)
    w32(b, R.ROM_CNTL, 0x18000008)                   # prescale 8
    w32(b, R.ROM_SW_STATUS, 0)
    w32(b, R.ROM_SW_COMMAND, address << 8 | 0x03)
    w32(b, R.ROM_SW_CNTL, 3 << 16 | R.ROM_SW_RETURN_DATA_ENABLE | count)
    return b.clock.now()


def test_status_shows_done_only_after_the_spi_time(make_board):
    with Board(make_board()) as b:
        start_read(b)
        b.clock.sleep(READ_256 - 1e-9)
        assert r32(b, R.ROM_SW_STATUS) == 0
        b.clock.sleep(2e-9)
        assert r32(b, R.ROM_SW_STATUS) == R.ROM_SW_DONE


def test_a_streamed_read_right_after_a_single_tlp_cntl_write_lands_before_a_long_read_ends(make_board):
    """The landing rule in action: on asm24 the read lands 100 µs after it starts, so it sees
    a 256-byte read still running; 88 µs later it would not."""
    with Board(make_board()) as b:
        release_pads(b)
        b.trace = []
        b.tlp_write32(R.ROM_CNTL, 0x18000008)
        b.tlp_write32(R.ROM_SW_COMMAND, 0x03)
        b.tlp_write32(R.ROM_SW_CNTL, 3 << 16 | R.ROM_SW_RETURN_DATA_ENABLE | 256)
        started = b.trace[-1][4]                     # when the CNTL write landed
        assert b.stream_read(R.ROM_SW_STATUS, 4) == bytes(4)
        assert b.trace[-1][4] - started == pytest.approx(ASM24.control)
        b.clock.sleep(READ_256 - ASM24.control - (b.clock.now() - started) + 1e-7)
        # Now the same read lands after the end: done, and reading the window is fine.
        block = b.stream_read(R.ROM_SW_STATUS, 12 + 256)
        assert block[0] & 1
        assert b.stats()["protocol_violations"] == 0


@pytest.mark.parametrize("touch", ["write COMMAND", "write CNTL", "write window", "read window"])
def test_touching_the_engine_in_flight_raises_on_a_strict_board(make_board, touch):
    with Board(make_board()) as b:
        start_read(b)
        b.clock.sleep(READ_256 / 2)
        with pytest.raises(ProtocolViolation, match=r"protocol violation: .* while a ROM_SW transaction \(opcode 0x03"):
            if touch == "write COMMAND":
                w32(b, R.ROM_SW_COMMAND, 0x05)
            elif touch == "write CNTL":
                w32(b, R.ROM_SW_CNTL, 0)
            elif touch == "write window":
                b.reg_write(R.ROM_SW_DATA + 0x40, bytes(8))
            else:
                b.reg_read(R.ROM_SW_DATA, 4)
        assert b.stats()["protocol_violations"] == 1


def test_status_cntl_and_command_reads_in_flight_are_allowed(make_board):
    with Board(make_board()) as b:
        start_read(b)
        r32(b, R.ROM_SW_CNTL)                        # the reference client's posted-write flush
        r32(b, R.ROM_SW_COMMAND)
        w32(b, R.ROM_SW_STATUS, 0)
        assert r32(b, R.ROM_SW_STATUS) == 0
        assert b.stats()["protocol_violations"] == 0


def test_a_cntl_write_and_a_command_write_in_one_stream_violate(make_board):
    """Dwords of one streamed write land in ascending order at one instant: a COMMAND after the
    CNTL that starts a transaction already finds it running."""
    with Board(make_board()) as b:
        release_pads(b)
        w32(b, R.ROM_SW_COMMAND, 0x9F)
        with pytest.raises(ProtocolViolation, match="ROM_SW_COMMAND was written"):
            b.stream_write(R.ROM_SW_CNTL, struct.pack("<III", R.ROM_SW_RETURN_DATA_ENABLE | 4, 0, 0x05))


def test_a_lenient_board_counts_violations_and_spoils_the_transaction(make_board):
    image = bytes(range(256)) * 0x2000
    with Board(make_board(content=image, strict=False)) as b:
        start_read(b, 0x100)
        w32(b, R.ROM_SW_COMMAND, 0x03)               # in flight: counted, not raised
        b.clock.sleep(READ_256)
        # The spoiled capture is garbage: the next RX transaction brings it into the window.
        w32(b, R.ROM_SW_STATUS, 0)
        w32(b, R.ROM_SW_COMMAND, 0x100 << 8 | 0x03)
        w32(b, R.ROM_SW_CNTL, 3 << 16 | R.ROM_SW_RETURN_DATA_ENABLE | 256)
        b.clock.sleep(READ_256)
        assert r32(b, R.ROM_SW_STATUS) & 1
        assert b.reg_read(R.ROM_SW_DATA, 256) != image[0x100:0x200]
        assert b.stats()["protocol_violations"] == 1


def test_a_spoiled_transmit_transaction_never_reaches_the_chip(make_board):
    with Board(make_board(strict=False)) as b:
        release_pads(b)
        w32(b, R.ROM_SW_COMMAND, 0x06)               # WREN
        w32(b, R.ROM_SW_CNTL, 0)
        w32(b, R.ROM_SW_DATA, 0)                     # at once: in flight
        b.clock.sleep(1e-3)
        assert r32(b, R.ROM_SW_STATUS) & 1           # the engine still reports done ...
        assert b.chip.transaction(b"\x05", 1) == b"\x00"    # ... but WEL was never set


def test_done_bit_left_set_is_not_cleared_by_the_next_start(make_board):
    """The engine sets done; only the host clears it. A driver that skips the clear sees a
    stale done bit, and what it then touches is a violation."""
    with Board(make_board()) as b:
        start_read(b)
        b.clock.sleep(READ_256)
        assert r32(b, R.ROM_SW_STATUS) & 1
        w32(b, R.ROM_SW_CNTL, 3 << 16 | R.ROM_SW_RETURN_DATA_ENABLE | 256)   # no STATUS clear
        assert r32(b, R.ROM_SW_STATUS) & 1
        with pytest.raises(ProtocolViolation):
            b.reg_read(R.ROM_SW_DATA, 4)


def test_touching_the_engine_before_reading_status_counts_an_unobserved_completion(make_board):
    with Board(make_board()) as b:
        start_read(b)
        b.clock.sleep(READ_256)
        b.reg_read(R.ROM_SW_DATA, 4)                 # ended, but its done bit was never read
        assert b.stats()["unobserved_completions"] == 1
        start_read(b)
        b.clock.sleep(READ_256)
        assert b.reg_read(R.ROM_SW_STATUS, 12 + 256)[0] & 1     # STATUS first in the same read: seen
        assert b.stats()["unobserved_completions"] == 1
        assert b.stats()["protocol_violations"] == 0


def test_a_transaction_in_flight_survives_the_host_process(make_board):
    """The board keeps its time and its running transaction in its state files."""
    path = make_board()
    with Board(path) as b:
        start_read(b)
    code = (f"from amdflash.stages.sim import Board\n"
            f"b = Board({str(path)!r})\n"
            f"print(int.from_bytes(b.reg_read({R.ROM_SW_STATUS}, 4), 'little'))\n"
            f"b.clock.sleep({READ_256})\n"
            f"print(int.from_bytes(b.reg_read({R.ROM_SW_STATUS}, 4), 'little'))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["0", "1"]


def test_the_chip_hears_only_status_suspend_and_reset_while_busy(make_board):
    with Board(make_board(content=bytes(0x200000))) as b:
        chip = b.chip
        chip.transaction(b"\x06", 0)
        chip.transaction(b"\x20\x00\x00\x00", 0)     # 4 KiB erase: 50 ms busy
        assert chip.transaction(b"\x05", 1) == b"\x03"
        assert chip.transaction(b"\x9f", 3) == b"\xff" * 3
        assert chip.transaction(b"\x03\x00\x10\x00", 4) == b"\xff" * 4
        assert chip.transaction(b"\x35", 1) == b"\x00"
        chip.transaction(b"\x75", 0)                 # suspend is heard
        assert chip.transaction(b"\x35", 1) == b"\x80"
        assert chip.transaction(b"\x9f", 3) == b"\xc8\x60\x15"


def test_strict_is_the_default_and_sim_create_can_make_a_lenient_board(make_board, tmp_path):
    assert Board(make_board()).strict
    path = tmp_path / "lenient"
    p = cli.run("sim", "create", path, "--lenient")
    assert p.returncode == 0 and "lenient" in p.stdout
    assert not Board(path).strict
    stats = cli.run("sim", "stats", path).stdout
    assert '"protocol_violations": 0' in stats and '"unobserved_completions": 0' in stats


def test_a_status_cleared_before_it_was_read_observes_nothing(make_board):
    """Writing 0 to STATUS and reading the 0 back is not seeing the done bit: a driver that
    clears STATUS without polling for done after a transaction is counted."""
    with Board(make_board()) as b:
        start_read(b)
        b.clock.sleep(READ_256)
        w32(b, R.ROM_SW_STATUS, 0)                    # done erased unseen
        assert r32(b, R.ROM_SW_STATUS) == 0
        w32(b, R.ROM_SW_COMMAND, 0x05)
        assert b.stats()["unobserved_completions"] == 1


def test_pads_taken_back_while_a_read_runs_leave_the_chip_unheard(make_board):
    """The pads must stay the engine's for the whole transfer: a restore that lands mid-way
    leaves a capture of all ones, as if the pads had never been released."""
    with Board(make_board(content=bytes(0x200000))) as b:
        start_read(b)
        b.clock.sleep(READ_256 / 2)
        w32(b, R.GPIOPAD_MASK, R.SPI_PAD_BITS)       # taken back mid-transfer
        b.clock.sleep(READ_256)
        assert r32(b, R.ROM_SW_STATUS) & R.ROM_SW_DONE
        start_read(b, 0x100)                          # pads released again: the next read is heard
        b.clock.sleep(READ_256)
        block = b.reg_read(R.ROM_SW_STATUS, 12 + 256)  # the window shows the first read's capture
        assert block[0] & R.ROM_SW_DONE and block[12:] == b"\xff" * 256
        start_read(b, 0x200)
        b.clock.sleep(READ_256)
        block = b.reg_read(R.ROM_SW_STATUS, 12 + 256)
        assert block[12:] == bytes(256)                # the second read, heard in full
        assert b.stats()["protocol_violations"] == 0
