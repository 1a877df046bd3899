"""The SMUIO ROM_SW engine: a software-driven SPI master (docs/rom-sw.md).

Behaviour modelled, inconvenient parts included:

* A write to ROM_SW_CNTL starts a transaction, whatever the value: CNTL = 0 is a valid
  opcode-only transaction (WREN's control word is 0). This is an assumption — inferred
  from that, and from flashrom's driver for the same engine on older Radeons, which has no
  other trigger — not a documented fact. The reference client's "clear" writes of 0
  therefore re-send the current opcode alone; the chip ignores most such fragments.
* The wire: the opcode (COMMAND b7:0), then COMMAND_SIZE bytes taken from COMMAND b31:8
  most significant first, then TX data read from the window as big-endian dwords; or, with
  RETURN_DATA_ENABLE, DATA_SIZE bytes clocked back in.
* The RX quirk: when an RX transaction completes, the data window receives the capture
  of the *preceding* RX transaction; this transaction's bytes are held until the next.
* The flash sees nothing unless the SPI pads are released (GPIOPAD bits 0x780 clear in
  MASK, A and EN) and PAGE_MIRROR_CNTL has ENABLE and USAGE set: RX is then all 0xFF.
* Gated board (after an autonomous PSP boot): a started transaction never completes,
  STATUS reads 0x04000800; writing 0 to STATUS still clears it.
* Faults: stall-after=N (no completion after N transactions), read-flip=P.
"""
from __future__ import annotations

import random
from typing import TYPE_CHECKING

from amdflash.stages.navi31 import regs as R

if TYPE_CHECKING:
    from amdflash.stages.transport.sim.board import Board

CAPTURE_SIZE = 0x100
_MIRROR_NEEDED = 0x06000000  # PAGE_MIRROR_CNTL: ENABLE (b25) and USAGE (b27:26) = 1


class RomSwEngine:
    def __init__(self, board: "Board"):
        self.board = board
        region = board.files.region("engine")
        self.capture = region[0:CAPTURE_SIZE]
        self.no_raw_rom = bool(board.variant.get("no_raw_rom"))
        self.gated = bool(board.variant.get("gated"))
        if self.no_raw_rom:
            # The whole SMUIO ROM block is absent: reads float high, writes vanish.
            for off in range(R.ROM_CNTL, R.ROM_SW_DATA + R.ROM_SW_DATA_SIZE, 4):
                board.on_read(off, _all_ones)
                board.on_write(off, self._ignore_write(off))
        else:
            board.on_write(R.ROM_SW_CNTL, self._start)

    def _ignore_write(self, offset: int):
        def hook(_value: int) -> None:
            self.board.set32(offset, 0xFFFFFFFF)
        return hook

    def _start(self, cntl: int) -> None:
        board = self.board
        from amdflash.stages.transport.sim.board import F_ENGINE_TXNS

        if self.gated:
            board.set32(R.ROM_SW_STATUS, R.ROM_SW_GATED_STATUS)
            return
        board.fault_state[F_ENGINE_TXNS] += 1
        stall = board.faults.stall_after
        if stall is not None and board.fault_state[F_ENGINE_TXNS] > stall:
            return  # the engine has stopped: STATUS keeps whatever it held, bit 0 never sets

        command = board.get32(R.ROM_SW_COMMAND)
        data_size = min(cntl & 0xFFFF, R.ROM_SW_DATA_SIZE)
        command_bytes = ((cntl >> 16) & 0x7) + 1
        receiving = bool(cntl & R.ROM_SW_RETURN_DATA_ENABLE)

        out = bytearray((command & 0xFF,))
        for i in range(command_bytes - 1):
            shift = 24 - 8 * i
            out.append((command >> shift) & 0xFF if shift >= 8 else 0)
        if not receiving and data_size:
            window = board.regs[R.ROM_SW_DATA:R.ROM_SW_DATA + ((data_size + 3) & ~3)]
            for i in range(0, len(window), 4):
                out += window[i:i + 4][::-1]  # big-endian dwords: MSB first on the wire
            del out[command_bytes + data_size:]
        rx_len = data_size if receiving else 0

        if self._pads_released():
            rx = board.chip.transaction(bytes(out), rx_len)
        else:
            rx = b"\xff" * rx_len
        if receiving and board.faults.read_flip:
            rx = self._flip(rx)

        wire = len(out) + rx_len
        prescale = (board.get32(R.ROM_CNTL) >> 24) & 0xF
        board.count("spi_transactions")
        board.count("spi_bytes", wire)
        spi_time = board.cost.spi_transaction(wire, prescale)
        board.count("spi_seconds", spi_time)
        board.clock.advance(spi_time)

        if receiving:
            board.regs[R.ROM_SW_DATA:R.ROM_SW_DATA + CAPTURE_SIZE] = self.capture
            self.capture[0:rx_len] = rx
        board.set32(R.ROM_SW_STATUS, board.get32(R.ROM_SW_STATUS) | R.ROM_SW_DONE)

    def _pads_released(self) -> bool:
        b = self.board
        pads = b.get32(R.GPIOPAD_MASK) | b.get32(R.GPIOPAD_A) | b.get32(R.GPIOPAD_EN)
        mirror = b.get32(R.PAGE_MIRROR_CNTL)
        return not pads & R.SPI_PAD_BITS and mirror & _MIRROR_NEEDED == _MIRROR_NEEDED

    def _flip(self, rx: bytes) -> bytes:
        """Transient bit flips, drawn from a stream seeded by the board, so runs repeat."""
        from amdflash.stages.transport.sim.board import F_FLIP_DRAWS

        board = self.board
        draw = board.fault_state[F_FLIP_DRAWS]
        board.fault_state[F_FLIP_DRAWS] = draw + 1
        rng = random.Random(f"{board.seed}:read-flip:{draw}")
        p = board.faults.read_flip
        out = bytearray(rx)
        for i in range(len(out)):
            if rng.random() < p:
                out[i] ^= 1 << rng.randrange(8)
        return bytes(out)

    def close(self) -> None:
        self.capture.release()


def _all_ones() -> int:
    return 0xFFFFFFFF
