"""Stage: open the transport named by a board spec, lock the board, audit every write.

This is the one place that opens (and lists) boards, and the only one of them allowed to
import the emulator: it hands the transports the emulated backends (`EMULATORS`), which they
build only when an AMDFLASH_SIM_* variable chooses them. What it opens declares its
capability ("bar5" or "amdgpu", transport/base.py), so nothing above asks the type.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from amdflash.stages.drivers.navi31 import regs as R
from amdflash.stages.terminal import printable
from amdflash.stages.transport.base import Bar5, BoardIdentity, OpenBoard, ThroughBar5
from amdflash.stages.transport.emulated import Emulators
from amdflash.stages.transport.lock import BoardLock, sim_lock

if TYPE_CHECKING:
    from amdflash.stages.transport.amdgpu import AttributeIo


class BoardSpecError(ValueError):
    pass


class AuditFailureError(RuntimeError):
    """The audit trail failed: no further hardware write is issued."""


@dataclass(frozen=True)
class BoardSpec:
    kind: str            # auto | usb | pci | amdgpu | sim
    selector: str = ""   # usb: index or serial; pci, amdgpu: address; sim: path
    unbind_driver: bool = False   # pci: unbind a bound kernel driver instead of refusing

    def __str__(self) -> str:
        return f"{self.kind}:{self.selector}" if self.selector else self.kind


# The board-spec grammar, in one place: what `--board` accepts and what a usage error quotes.
SPEC_GRAMMAR = ("auto | usb | usb:N | usb:SERIAL (8 hex digits) | pci | pci:DDDD:BB:DD.F | pci:BB:DD.F "
                "| amdgpu | amdgpu:DDDD:BB:DD.F | sim:PATH")
_USB_SELECTOR = re.compile(r"[0-9]+|[0-9a-fA-F]{8}")
_PCI_SELECTOR = re.compile(r"(?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-1][0-9a-fA-F]\.[0-7]")


def parse_spec(text: str) -> BoardSpec:
    """A `--board` value as a BoardSpec; BoardSpecError (naming the grammar) if malformed."""
    kind, colon, selector = text.partition(":")

    def bad(why: str) -> BoardSpecError:
        return BoardSpecError(f"board spec {text!r}: {why}; a board spec is {SPEC_GRAMMAR}")

    if kind not in ("auto", "usb", "pci", "amdgpu", "sim"):
        raise bad(f"unknown kind {kind!r}")
    if colon and not selector:
        raise bad(f"nothing after '{kind}:'")
    if kind == "auto" and selector:
        raise bad("'auto' takes no selector")
    if kind == "usb" and selector and not _USB_SELECTOR.fullmatch(selector):
        raise bad("a USB bridge is usb:N (index from 0) or usb:SERIAL (8 hex digits)")
    if kind in ("pci", "amdgpu") and selector and not _PCI_SELECTOR.fullmatch(selector):
        raise bad(f"a PCI device is {kind}:DDDD:BB:DD.F or {kind}:BB:DD.F (as lspci prints it)")
    if kind == "sim":
        if not selector:
            raise bad("'sim' needs the board directory: sim:PATH")
        selector = os.path.abspath(selector)
        _recordable(selector)
    return BoardSpec(kind, selector)


def _recordable(selector: str) -> None:
    """A sim: spec the trail can record: the spec and the board's directory it resolves to (the
    name its run records) are recorded as text, and printed in the steps to paste."""
    real = os.path.realpath(selector)
    for name in dict.fromkeys((selector, real)):
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            what = "the name" if name == selector else f"the board directory it names, {printable(real)},"
            raise BoardSpecError(f"board spec sim:{printable(selector)}: {what} is not valid UTF-8, and the audit "
                                 "trail records a board's spec as text; rename the board directory") from None


def _emulated_usb_backend(paths: list[str]) -> Any:
    from amdflash.stages.sim.usb import SimUsbBackend

    return SimUsbBackend(paths)


def _emulated_kernel(tree: Path) -> AttributeIo:
    from amdflash.stages.sim.amdgpu_sysfs import EmulatedKernel

    return EmulatedKernel(tree)


# The emulated backends the transports are handed; imported only when a variable chooses one.
EMULATORS = Emulators(usb_backend=_emulated_usb_backend, kernel_io=_emulated_kernel)


def open_transport(spec: BoardSpec, announce=print) -> tuple[OpenBoard, BoardLock]:
    """Open and lock the board, declaring which way it is driven. Never falls back to an
    emulator silently."""
    if spec.kind == "sim":
        from amdflash.stages.sim import SimBar5

        # The spec's own path resolved once (a link to a board is that board): the lock and the
        # board's files are both the directory it names now, whose files are then opened
        # relative to it with no link followed (sim/state.py), whatever is swapped in later.
        real = os.path.realpath(spec.selector)
        if not os.path.isfile(os.path.join(real, "board.json")):
            raise BoardSpecError(f"{spec.selector} is not an emulated board (create one with 'amdflash sim create')")
        lock = sim_lock(real).acquire()
        try:
            return ThroughBar5(SimBar5(real)), lock
        except BaseException:
            lock.release()
            raise
    from amdflash.stages.transport import discovery

    return discovery.open_spec(spec, announce, EMULATORS)


def list_boards(announce: Callable[[str], None], probe: Callable[[Bar5], dict[str, Any]]) -> list[dict[str, Any]]:
    """Every USB bridge and native Navi31 (transport/discovery.py), emulated ones included
    when AMDFLASH_SIM_* choose them; `probe(bar)` adds what each board answers."""
    from amdflash.stages.transport import discovery

    return discovery.list_boards(announce, probe, EMULATORS)


# The standard SPI NOR opcodes that change the flash or its status registers, with the
# span they change: a size, 0 for a page program (its TX length), None for status and
# security-register writes, which no unit intent covers.
DESTRUCTIVE: dict[int, int | None] = {
    0x02: 0, 0x20: 0x1000, 0x52: 0x8000, 0xD8: 0x10000, 0x60: 0x200000, 0xC7: 0x200000,
    0x01: None, 0x31: None, 0x11: None, 0x42: None, 0x44: None,
}


_COMMAND, _CNTL = R.ROM_SW_COMMAND, R.ROM_SW_CNTL


class AuditedBar:
    """A Bar5 that records every register write before issuing it.

    Nothing destructive reaches the flash before it is durable in the audit trail: a ROM_SW
    transaction that erases, programs or writes a status register starts (its ROM_SW_CNTL
    write) only once a durable unit intent covers its whole span — the stages make each
    unit's intent durable before its first erase or program — or, if none does, once the
    transaction's own row and every row before it are committed and fsynced here.

    If the audit trail has failed, no further write reaches the hardware; the job then
    fails and restores registers through the raw transport.
    """

    def __init__(self, bar: Bar5, recorder) -> None:
        self.raw = bar
        self.recorder = recorder
        self.clock = bar.clock
        self.identity: BoardIdentity = bar.identity
        self.restoring = False   # set by the restore stage: its writes go out regardless
        # ROM_SW_COMMAND as last written: the opcode a CNTL write starts (None: not written yet
        # by this run, read from the board when first needed).
        self._command: int | None = None

    def _check(self) -> None:
        if self.recorder.failed and not self.restoring:
            raise AuditFailureError(f"audit trail write failed ({self.recorder.failed}); "
                                    "no further hardware write is issued")

    def read32(self, offset: int) -> int:
        return self.raw.read32(offset)

    def read_block(self, offset: int, size: int) -> bytes:
        return self.raw.read_block(offset, size)

    def write32(self, offset: int, value: int) -> None:
        recorder = self.recorder
        if recorder.failed and not self.restoring:
            self._check()
        value &= 0xFFFFFFFF
        recorder.register_write(offset, value, None, self.clock.now())
        if offset == _COMMAND:
            self._command = value
        elif offset == _CNTL:
            self._before_start(value)
        self._send(self.raw.write32, offset, value)

    def _before_start(self, cntl: int | None) -> None:
        """Gate the transaction a CNTL write starts (`cntl` None: the write did not carry the
        whole control word, so the span is not known: only its own durable row will do)."""
        if self._command is None:
            self._command = int.from_bytes(self.raw.read_block(_COMMAND, 4), "little")
        opcode = self._command & 0xFF
        if opcode not in DESTRUCTIVE:
            return
        span = DESTRUCTIVE[opcode]
        covered = False
        if cntl is not None and span is not None:
            address_bytes = (cntl >> 16) & 3
            address = (self._command >> (8 + 8 * (3 - address_bytes))) & (0xFFFFFF >> (8 * (3 - address_bytes)))
            if span == 0:
                span = cntl & 0xFFFF
            covered = self.recorder.covers(address - address % span if span > 0x1000 else address, span)
        if not covered:
            self.recorder.durable()
            self._check()

    def write_block(self, offset: int, data: bytes) -> None:
        self._check()
        self.recorder.register_write(offset, None, bytes(data), self.clock.now())
        end = offset + len(data)
        if offset < _CNTL + 4 and _CNTL < end:
            # A block that reaches ROM_SW_CNTL starts a transaction when that dword lands: the
            # lowest of the engine's registers, so before anything else the block writes there.
            whole = offset <= _CNTL and _CNTL + 4 <= end
            self._before_start(int.from_bytes(data[_CNTL - offset:_CNTL - offset + 4], "little") if whole else None)
        if offset < _COMMAND + 4 and _COMMAND < end:
            # A streamed write that carries ROM_SW_COMMAND (with STATUS and the TX data): the
            # opcode the next CNTL write starts is in it, and the durability gate needs it. A
            # block that covers only part of it keeps the other bytes the board holds.
            if self._command is None and not (offset <= _COMMAND and _COMMAND + 4 <= end):
                self._command = int.from_bytes(self.raw.read_block(_COMMAND, 4), "little")
            word = bytearray((self._command or 0).to_bytes(4, "little"))
            for i in range(max(offset, _COMMAND), min(end, _COMMAND + 4)):
                word[i - _COMMAND] = data[i - offset]
            self._command = int.from_bytes(word, "little")
        self._send(self.raw.write_block, offset, data)

    def _send(self, write: Callable[[int, Any], None], offset: int, payload: Any) -> None:
        """Send a write whose row is on record already (rows are recorded before they are sent).
        If it fails, a row says it never reached the board, so the trail does not count it as
        received; the write's own failure is what propagates."""
        try:
            write(offset, payload)
        except Exception as e:
            with contextlib.suppress(Exception):
                self.recorder.add("stages", stage="transport", event="write failed",
                                  detail=f"the register write to {offset:#07x} just recorded did not reach the "
                                         f"board: {e}", at=dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"))
            raise

    def close(self) -> None:
        self.raw.close()
