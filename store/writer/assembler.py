"""Register writes become audit rows: the Assembler follows the ROM_SW engine's registers
and records each SPI transaction as one `log_spi` row (with the writes that set it up, as
shape letters), and any other write as a `log_writes` row."""
from __future__ import annotations

from typing import Any

from amdflash.store.schema import (
    DEFAULT_SHAPE,
    MAX_SHAPE,
    ROM_SW_CNTL,
    ROM_SW_COMMAND,
    ROM_SW_DATA,
    ROM_SW_RETURN_DATA_ENABLE,
    ROM_SW_STATUS,
)
from amdflash.store.writer.sealer import micros

# The ROM_SW engine's registers as one block: CNTL, STATUS, COMMAND, a reserved dword, then
# the 256-byte data window.
_WINDOW = 0x100
_ENGINE, _ENGINE_END = ROM_SW_CNTL, ROM_SW_DATA + _WINDOW
_ENGINE_SIZE = _ENGINE_END - _ENGINE
_CNTL_END = ROM_SW_CNTL + 4
_COMMAND_AT, _DATA_AT = ROM_SW_COMMAND - _ENGINE, ROM_SW_DATA - _ENGINE
_ZERO = bytes(4)


class Assembler:
    """Turns register writes into rows, from the ROM_SW engine's registers as the board sees
    them, whatever shape the writes take.

    It follows COMMAND, CNTL and the data window through every register write and every
    block write that overlaps them. A write to ROM_SW_CNTL starts a transaction: then one
    `log_spi` row records it — COMMAND and CNTL as the engine held them, the TX bytes it
    sends (from the window), the clock of its start — together with the writes that set it
    up since the transaction before it, as shape letters (store.schema.SHAPE_LETTERS), so
    that the `register_writes` view re-creates exactly those writes, in order. A
    transaction repeated at once with no data joins the row of the first. A write that no
    letter describes (outside the engine, or not what the row's values re-create) is a
    `log_writes` row of its own, and so is every write before it since the last transaction.

    `emit(row, seq)` receives each row in order with the seq of its first write (when the
    writes came with one: a migration keeps the seqs an older trail gave them).
    `started(command, cntl, clock)` is told of every transaction as it starts."""

    def __init__(self, run_id: str, emit: Any, started: Any = None) -> None:
        self.run_id = run_id
        self.emit = emit
        self.started = started
        self.regs = bytearray(_ENGINE_SIZE)        # the engine's block, CNTL to the end of the window ...
        self.known = bytearray(_ENGINE_SIZE)       # ... and which of its bytes this trail knows (1)
        self.pending: list[tuple[int, int | None, bytes | None, float, int | None]] = []
        self.held: list[Any] | None = None         # the last transaction row, while it may repeat
        self.held_seq: int | None = None

    def know(self, offset: int, value: int) -> None:
        """A register value read from the board (a snapshot): what a later row may rely on."""
        if _ENGINE <= offset and offset + 4 <= _ENGINE_END:
            at = offset - _ENGINE
            self.regs[at:at + 4] = (value & 0xFFFFFFFF).to_bytes(4, "little")
            self.known[at:at + 4] = b"\x01\x01\x01\x01"

    def write(self, offset: int, value: int | None, data: bytes | None, clock: float, seq: int | None = None) -> None:
        w = (offset, value, data, clock, seq)
        size = 4 if value is not None else len(data or b"")
        if offset >= _ENGINE_END or offset + size <= _ENGINE:
            self._raw(self.pending)          # not the engine's: order is kept, raw
            self.pending = []
            self._raw([w])
            return
        if offset < _CNTL_END and offset + size > ROM_SW_CNTL:
            self._start(w)
            return
        self._apply(offset, value, data)
        pending = self.pending
        pending.append(w)
        if len(pending) >= MAX_SHAPE:        # more than one row could describe: the oldest is raw
            self._raw(pending[:1])
            del pending[0]

    def _apply(self, offset: int, value: int | None, data: bytes | None) -> None:
        raw = (value & 0xFFFFFFFF).to_bytes(4, "little") if value is not None else bytes(data or b"")
        lo, hi = max(offset, _ENGINE), min(offset + len(raw), _ENGINE_END)
        if lo < hi:
            self.regs[lo - _ENGINE:hi - _ENGINE] = raw[lo - offset:hi - offset]
            self.known[lo - _ENGINE:hi - _ENGINE] = b"\x01" * (hi - lo)

    def _dword(self, at: int) -> int | None:
        if self.known[at:at + 4] != b"\x01\x01\x01\x01":
            return None
        return int.from_bytes(self.regs[at:at + 4], "little")

    def _start(self, w: tuple) -> None:
        """A write that reaches ROM_SW_CNTL: the transaction it starts, and the writes before it."""
        offset, value, data, clock, seq = w
        if value is not None and offset == ROM_SW_CNTL:
            letter = "N"
        elif value is None and offset == ROM_SW_CNTL and len(data or b"") == 4:
            letter = "n"
        else:
            letter = ""          # a block that reaches CNTL and more: recorded raw, the transaction too
        command = self._dword(_COMMAND_AT)
        if letter:
            self._apply(offset, value, data)
        else:
            self._apply(offset, None, bytes(data or b"")[:_CNTL_END - offset])
        cntl = self._dword(0) or 0
        tx = None
        if not cntl & ROM_SW_RETURN_DATA_ENABLE and cntl & 0xFFFF:
            span = (min(cntl & 0xFFFF, _WINDOW) + 3) & ~3
            if self.known[_DATA_AT:_DATA_AT + span].count(0) == 0:
                tx = bytes(self.regs[_DATA_AT:_DATA_AT + span])
        described, data_written, reserved, shape = self._shape(command) if letter else (0, None, None, "")
        pending = self.pending
        raw, kept = pending[:len(pending) - described], pending[len(pending) - described:]
        self.pending = []
        if not letter:
            raw = raw + kept + [w]
            kept = []
            self._apply(offset, None, data)         # the rest of the block lands after the start
        shape += letter
        start = micros(clock)
        first = kept[0] if kept else w
        lead = start - micros(first[3])
        self._raw(raw)
        if cntl & ROM_SW_RETURN_DATA_ENABLE:       # the capture lands in the window when it ends
            self.known[_DATA_AT:] = bytes(_WINDOW)
        if self.started is not None:
            self.started(command, cntl, clock)
        held = self.held
        if not raw and held is not None and held[10] is None and held[4] is None and held[5] is None \
                and held[6] is None and tx is None and data_written is None and reserved is None \
                and held[2] == command and held[3] == cntl and len(held[7]) + len(shape) <= MAX_SHAPE:
            held[7] += shape                       # the same transaction again at once: one row
            held[10] = start - held[8]
            return
        self.release()
        self.held = ["spi", self.run_id, command, cntl, tx, data_written, reserved, shape, start, lead or None, None]
        self.held_seq = first[4]

    def _shape(self, command: int | None) -> tuple[int, bytes | None, int | None, str]:
        """How many of the pending writes (the last ones) shape letters describe, with the
        row's data and reserved dword they need: (count, data, reserved, letters)."""
        word = command.to_bytes(4, "little") if command is not None else None
        data: bytes | None = None
        reserved: int | None = None
        letters: list[str] = []
        for offset, value, block, _, _ in reversed(self.pending):
            letter = None
            if value is not None:
                if offset == ROM_SW_STATUS and value == 0:
                    letter = "S"
                elif offset == ROM_SW_COMMAND and value == command:
                    letter = "C"
            elif block is not None:
                if offset == ROM_SW_STATUS and block == _ZERO:
                    letter = "s"
                elif offset == ROM_SW_STATUS and word is not None and len(block) == 8 and block[4:] == word \
                        and block[:4] == _ZERO:
                    letter = "H"
                elif offset == ROM_SW_STATUS and word is not None and len(block) >= 12 and block[:4] == _ZERO \
                        and block[4:8] == word and (data is None or block[12:] == data) \
                        and (reserved is None or int.from_bytes(block[8:12], "little") == reserved):
                    letter, data, reserved = "B", bytes(block[12:]), int.from_bytes(block[8:12], "little")
                elif offset == ROM_SW_COMMAND and word is not None and block == word:
                    letter = "c"
                elif offset == ROM_SW_DATA and (data is None or block == data):
                    letter, data = "D", bytes(block)
            if letter is None:
                break
            letters.append(letter)
        return len(letters), data, reserved, "".join(reversed(letters))

    def _raw(self, writes: list) -> None:
        if not writes:
            return
        self.release()
        for offset, value, data, clock, seq in writes:
            self.emit(("write", self.run_id, offset, value, None if data is None else bytes(data), micros(clock)), seq)

    def release(self) -> None:
        """Hand on the held transaction row: something else comes after it."""
        held = self.held
        if held is not None:
            if held[7] == DEFAULT_SHAPE:
                held[7] = None
            self.emit(tuple(held), self.held_seq)
            self.held = None

    def finish(self) -> None:
        """The end of the writes: writes after the last transaction are recorded one by one."""
        self._raw(self.pending)
        self.pending = []
        self.release()
