"""The SMUIO ROM_SW engine: a software-driven SPI master, on the board's clock (docs/rom-sw.md).

Behaviour modelled, inconvenient parts included:

* A write to ROM_SW_CNTL starts a transaction, whatever the value: CNTL = 0 is a valid
  opcode-only transaction (WREN's control word is 0). This is an assumption — inferred
  from that, and from flashrom's driver for the same engine on older Radeons, which has no
  other trigger — not a documented fact. The reference client's "clear" writes of 0
  therefore re-send the current opcode alone; the chip ignores most such fragments.
* Time: a transaction starts when its CNTL write lands and runs for its SPI time
  (1 µs + 8 clocks a byte at 100 MHz / (prescale + 1)) while the host goes on. Only then
  does the chip act on the bytes, the RX capture move, and ROM_SW_STATUS bit 0 (done)
  set. The engine does not clear a done bit left from an earlier transaction: the host
  writes 0 to STATUS for that (as the reference client does before every transaction).
* Protocol violations: writing ROM_SW_COMMAND, ROM_SW_CNTL or the data window, or reading
  the data window, while a transaction is in flight. The board counts each one and
  spoils the transaction: the chip receives nothing (TX bytes not sent) and an RX
  transaction captures garbage. A strict board (the default) raises instead: nothing a
  driver can do by mistake goes unnoticed. Reading CNTL or COMMAND, and anything done to
  STATUS, is not a violation: the reference client reads CNTL back at once to flush its
  posted write, while the transaction runs, and that worked on hardware.
* Unobserved completions (a diagnostic, not a violation): touching COMMAND, CNTL or the
  window after a transaction ended but before any read of STATUS since its end. A driver
  that relies on timing alone instead of seeing the done bit shows up here.
* The wire: the opcode (COMMAND b7:0), then COMMAND_SIZE bytes taken from COMMAND b31:8
  most significant first, then TX data read from the window as big-endian dwords; or, with
  RETURN_DATA_ENABLE, DATA_SIZE bytes clocked back in.
* The RX quirk: when an RX transaction completes, the data window receives the capture
  of the *preceding* RX transaction; this transaction's bytes are held until the next.
* The flash sees nothing unless the SPI pads are released (GPIOPAD bits 0x780 clear in
  MASK, A and EN) and PAGE_MIRROR_CNTL has ENABLE and USAGE set when the transaction
  starts: RX is then all 0xFF.
* Gated board (after an autonomous PSP boot): a started transaction never runs, STATUS
  reads 0x04000800; writing 0 to STATUS still clears it.
* Faults: stall-after=N (the engine stops: nothing runs, bit 0 never sets), read-flip=P;
  silent-rx=P (an RX transaction ends, done bit and all, without having run: the chip hears
  nothing, the capture buffer and the window keep what they held — what a driver sees when a
  transaction's start was lost and the done bit it reads is one left over); stale-done=P (a
  write of 0 to STATUS is lost, so the done bit of the transaction before stays set);
  busy-read=ADDR:N (the first array read of that unit finds the chip busy for N transactions:
  it ignores them, reads come back all 0xFF, status reads show WIP). Each draws from a stream
  seeded by the board, so runs repeat.
"""
from __future__ import annotations

import random
import struct
from typing import TYPE_CHECKING

from amdflash.stages.drivers.navi31 import regs as R
from amdflash.stages.sim.state import (F_BUSY_FIRED, F_BUSY_LEFT, F_ENGINE_TXNS, F_FLIP_DRAWS,
                                       F_SILENT_DRAWS, F_STALE_DRAWS, C)

if TYPE_CHECKING:
    from amdflash.stages.sim.board import Board

CAPTURE_SIZE = 0x100
BLOCK_START = R.ROM_SW_CNTL                                 # CNTL, STATUS, COMMAND, reserved,
BLOCK_END = R.ROM_SW_DATA + R.ROM_SW_DATA_SIZE              # then the 256-byte data window
_MIRROR_NEEDED = 0x06000000  # PAGE_MIRROR_CNTL: ENABLE (b25) and USAGE (b27:26) = 1

# Engine region (after the capture buffer): the transaction in flight, if any.
_T = struct.Struct("<ddI")          # started at, ends at, CNTL value
_U32 = struct.Struct("<I")
_PADS = struct.Struct("<4I")
assert (R.GPIOPAD_A, R.GPIOPAD_EN) == (R.GPIOPAD_MASK + 4, R.GPIOPAD_MASK + 12)
_T_AT = CAPTURE_SIZE
_FLAGS_AT = CAPTURE_SIZE + _T.size
IN_FLIGHT, SPOILED, PADS_OPEN, UNOBSERVED, SILENT = 0x1, 0x2, 0x4, 0x8, 0x10
_ARRAY_READS = (0x03, 0x0B)
_STATUS_READS = (0x05, 0x35, 0x15)
_WIP = 0x01
_SPI_TRANSACTIONS, _SPI_BYTES, _SPI_SECONDS = C["spi_transactions"], C["spi_bytes"], C["spi_seconds"]


class ProtocolViolation(RuntimeError):
    """A driver touched the engine while a transaction was in flight (strict boards)."""


class RomSwEngine:
    def __init__(self, board: Board):
        self.board = board
        region = board.files.region("engine")
        self.capture = region[0:CAPTURE_SIZE]
        self._state = region[_T_AT:_FLAGS_AT + 1]
        self.no_raw_rom = bool(board.variant.get("no_raw_rom"))
        self.gated = bool(board.variant.get("gated"))
        self._regs = board.regs

        self._f_txns = F_ENGINE_TXNS
        self._stall_after = board.faults.stall_after
        if self.no_raw_rom:
            # The whole SMUIO ROM block is absent: reads float high, writes vanish.
            for off in range(R.ROM_CNTL, BLOCK_END, 4):
                board.on_read(off, _all_ones)
                board.on_write(off, self._ignore_write(off))

    @property
    def wired(self) -> bool:
        """Whether the board routes the ROM_SW block through `read`/`write`."""
        return not self.no_raw_rom

    def _ignore_write(self, offset: int):
        def hook(_value: int) -> None:
            self.board.set32(offset, 0xFFFFFFFF)
        return hook

    # -- the in-flight transaction ---------------------------------------------------------
    def _flight(self) -> tuple[float, float, int]:
        return _T.unpack_from(self._state, 0)

    def settle(self, now: float) -> None:
        """Complete the transaction in flight if its time has passed by `now`."""
        if self._state[-1] & IN_FLIGHT:
            ends = _T.unpack_from(self._state, 0)[1]
            if now >= ends:
                self._complete(ends)

    def reset(self) -> None:
        """Power-on: nothing in flight, an empty capture."""
        self._state[-1] = 0
        self.capture[:] = bytes(CAPTURE_SIZE)

    # -- register access (the board routes every access to the block here) -----------------
    def read(self, offset: int, size: int) -> bytes:
        now = self.board.clock.now()
        if self._state[-1] & IN_FLIGHT:
            self.settle(now)
        flags = self._state[-1]
        if (flags & UNOBSERVED and offset <= R.ROM_SW_STATUS < offset + size
                and _U32.unpack_from(self._regs, R.ROM_SW_STATUS)[0] & R.ROM_SW_DONE):
            # The done bit is read (STATUS first, in ascending order). A STATUS the host cleared
            # before reading it observes nothing: the completion stays unobserved.
            self._state[-1] = flags = flags & ~UNOBSERVED
        if offset + size > R.ROM_SW_DATA:
            if flags & IN_FLIGHT:
                self._violation("the data window was read", now)
            elif flags & UNOBSERVED:
                self._unobserved()
        return bytes(self._regs[offset:offset + size])

    def write(self, offset: int, data: bytes) -> None:
        """Bytes landing in the block at one instant, taken in ascending address order."""
        now = self.board.clock.now()
        state = self._state
        if state[-1] & IN_FLIGHT:
            self.settle(now)
        regs = self._regs
        if offset == R.ROM_SW_CNTL and len(data) == 4 and not state[-1] & (IN_FLIGHT | UNOBSERVED):
            regs[offset:offset + 4] = data              # the common case: a CNTL write that starts one
            self._start(_U32.unpack_from(data)[0], now)
            return
        end = offset + len(data)
        # The control dwords one by one: a CNTL write starts a transaction that the
        # dwords after it in the same access already find running.
        pos = offset
        while pos < end and pos < R.ROM_SW_DATA:
            base = pos & ~3
            stop = min(base + 4, end)
            if base in (R.ROM_SW_COMMAND, R.ROM_SW_CNTL):
                if self._state[-1] & IN_FLIGHT:
                    self._violation(f"{'ROM_SW_CNTL' if base == R.ROM_SW_CNTL else 'ROM_SW_COMMAND'} was written", now)
                elif self._state[-1] & UNOBSERVED:
                    self._unobserved()
            elif base == R.ROM_SW_STATUS and self._clear_lost(data[pos - offset:stop - offset]):
                pos = stop
                continue
            regs[pos:stop] = data[pos - offset:stop - offset]
            if base == R.ROM_SW_CNTL and not self._state[-1] & IN_FLIGHT:
                self._start(_U32.unpack_from(regs, R.ROM_SW_CNTL)[0], now)
            pos = stop
        if pos < end:
            if self._state[-1] & IN_FLIGHT:
                self._violation("the data window was written", now)
            elif self._state[-1] & UNOBSERVED:
                self._unobserved()
            regs[pos:end] = data[pos - offset:]

    def _clear_lost(self, written: bytes) -> bool:
        """stale-done: whether this write, which would clear the done bit, is lost."""
        board = self.board
        p = board.faults.stale_done
        if not p or len(written) != 4 or _U32.unpack(written)[0] & R.ROM_SW_DONE \
                or not board.get32(R.ROM_SW_STATUS) & R.ROM_SW_DONE:
            return False
        return self._draw(F_STALE_DRAWS, "stale-done") < p

    def _draw(self, slot: int, name: str) -> float:
        """The next number of the fault `name`'s stream, seeded by the board (runs repeat)."""
        board = self.board
        draw = board.fault_state[slot]
        board.fault_state[slot] = draw + 1
        return random.Random(f"{board.seed}:{name}:{draw}").random()

    def _unobserved(self) -> None:
        self.board.count("unobserved_completions")
        self._state[-1] &= ~UNOBSERVED

    def _violation(self, what: str, now: float) -> None:
        board = self.board
        started, ends, cntl = self._flight()
        opcode = board.get32(R.ROM_SW_COMMAND) & 0xFF
        board.count("protocol_violations")
        self._state[-1] |= SPOILED
        message = (f"protocol violation: {what} at {now * 1e6:.1f} µs while a ROM_SW transaction "
                   f"(opcode {opcode:#04x}, CNTL {cntl:#010x}) was in flight from {started * 1e6:.1f} µs "
                   f"to {ends * 1e6:.1f} µs; the transaction is spoiled")
        if board.strict:
            raise ProtocolViolation(message)

    # -- a transaction ---------------------------------------------------------------------
    def _start(self, cntl: int, now: float) -> None:
        board = self.board
        if self.gated:
            board.set32(R.ROM_SW_STATUS, R.ROM_SW_GATED_STATUS)
            return
        fault_state = board.fault_state
        fault_state[self._f_txns] += 1
        stall = self._stall_after
        if stall is not None and fault_state[self._f_txns] > stall:
            return  # the engine has stopped: STATUS keeps whatever it held, bit 0 never sets

        wire = ((cntl >> 16) & 0x7) + 1 + min(cntl & 0xFFFF, R.ROM_SW_DATA_SIZE)
        prescale = (_U32.unpack_from(self._regs, R.ROM_CNTL)[0] >> 24) & 0xF
        spi_time = board.cost.spi_transaction(wire, prescale)
        counters = board.counters
        counters[_SPI_TRANSACTIONS] += 1
        counters[_SPI_BYTES] += wire
        counters[_SPI_SECONDS] += spi_time
        flags = IN_FLIGHT | (PADS_OPEN if self._pads_released() else 0)
        if cntl & R.ROM_SW_RETURN_DATA_ENABLE and board.faults.silent_rx \
                and self._draw(F_SILENT_DRAWS, "silent-rx") < board.faults.silent_rx:
            flags |= SILENT
        _T.pack_into(self._state, 0, now, now + spi_time, cntl)
        self._state[-1] = flags
        if spi_time <= 0:
            self._complete(now)

    def _complete(self, ends: float) -> None:
        board = self.board
        flags = self._state[-1]
        self._state[-1] = UNOBSERVED
        cntl = _T.unpack_from(self._state, 0)[2]
        data_size = min(cntl & 0xFFFF, R.ROM_SW_DATA_SIZE)
        receiving = bool(cntl & R.ROM_SW_RETURN_DATA_ENABLE)
        rx_len = data_size if receiving else 0
        if flags & SILENT:
            # Done, and nothing else: no command reached the chip, no capture moved.
            regs = self._regs
            _U32.pack_into(regs, R.ROM_SW_STATUS, _U32.unpack_from(regs, R.ROM_SW_STATUS)[0] | R.ROM_SW_DONE)
            return
        if flags & SPOILED:
            # The chip saw an aborted command (nothing it acts on); the capture is noise.
            rx = self._noise(rx_len)
        else:
            out = self._wire_out(cntl, data_size, receiving)
            # The pads must be the engine's for the whole transfer: taken back while it runs
            # (a restore sent too early), the chip never hears a complete command.
            pads = flags & PADS_OPEN and self._pads_released()
            rx = self._chip(out, rx_len, ends) if pads else b"\xff" * rx_len
            if receiving and board.faults.read_flip:
                rx = self._flip(rx)
        regs = self._regs
        if receiving:
            regs[R.ROM_SW_DATA:R.ROM_SW_DATA + CAPTURE_SIZE] = self.capture
            self.capture[0:rx_len] = rx
        _U32.pack_into(regs, R.ROM_SW_STATUS, _U32.unpack_from(regs, R.ROM_SW_STATUS)[0] | R.ROM_SW_DONE)

    def _chip(self, out: bytes, rx_len: int, ends: float) -> bytes:
        """The chip's answer to one transaction; busy-read may find it busy."""
        board = self.board
        busy = board.faults.busy_read
        if busy is not None:
            state = board.fault_state
            if not state[F_BUSY_FIRED] and out[0] in _ARRAY_READS and len(out) >= 4:
                first = int.from_bytes(out[1:4], "big")
                if first < busy[0] + 0x1000 and busy[0] < first + max(rx_len, 1):
                    state[F_BUSY_FIRED], state[F_BUSY_LEFT] = 1, busy[1]
            if state[F_BUSY_LEFT] > 0:
                state[F_BUSY_LEFT] -= 1
                if out[0] in _STATUS_READS:
                    rx = board.chip.transaction(out, rx_len, ends)
                    return bytes(b | _WIP for b in rx) if out[0] == 0x05 else rx
                board.count("ignored_while_busy")
                return b"\xff" * rx_len
        return board.chip.transaction(out, rx_len, ends)

    def _wire_out(self, cntl: int, data_size: int, receiving: bool) -> bytes:
        command = self.board.get32(R.ROM_SW_COMMAND)
        command_bytes = ((cntl >> 16) & 0x7) + 1
        out = bytearray((command & 0xFF,))
        for i in range(command_bytes - 1):
            shift = 24 - 8 * i
            out.append((command >> shift) & 0xFF if shift >= 8 else 0)
        if not receiving and data_size:
            window = self._regs[R.ROM_SW_DATA:R.ROM_SW_DATA + ((data_size + 3) & ~3)]
            for i in range(0, len(window), 4):
                out += window[i:i + 4][::-1]  # big-endian dwords: MSB first on the wire
            del out[command_bytes + data_size:]
        return bytes(out)

    def _pads_released(self) -> bool:
        regs = self._regs
        mask, a, _, en = _PADS.unpack_from(regs, R.GPIOPAD_MASK)      # MASK, A, (unused), EN
        mirror = _U32.unpack_from(regs, R.PAGE_MIRROR_CNTL)[0]
        return not (mask | a | en) & R.SPI_PAD_BITS and mirror & _MIRROR_NEEDED == _MIRROR_NEEDED

    def _noise(self, n: int) -> bytes:

        board = self.board
        draw = board.fault_state[F_FLIP_DRAWS]
        board.fault_state[F_FLIP_DRAWS] = draw + 1
        return random.Random(f"{board.seed}:spoiled:{draw}").randbytes(n)

    def _flip(self, rx: bytes) -> bytes:
        """Transient bit flips, drawn from a stream seeded by the board, so runs repeat."""

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
        self._state.release()


def _all_ones() -> int:
    return 0xFFFFFFFF
