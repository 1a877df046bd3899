"""Driver for the SMUIO ROM_SW engine: raw SPI transactions through BAR5 (docs/rom-sw.md).

The engine is configured once per open (SPI pads released, page-mirror usage, prescaler)
and every changed register is restored at close, on every path. The reference client
instead saves and restores around each transaction; `restore_each=True` does that too.

Two facts of the silicon shape the transaction sequence:

* A write to ROM_SW_CNTL *starts* a transaction, whatever its value. This is an inference,
  not a documented fact: a bare opcode such as WREN has control word 0, and flashrom's
  driver for the same engine on older Radeons starts every transaction by writing CNTL,
  with no other trigger. So this driver never writes CNTL as a "clear" (the reference
  client's 0 writes would then re-send its opcode alone): it clears the done bit in
  ROM_SW_STATUS, sets COMMAND, loads TX data, then writes CNTL exactly once.
* The RX quirk: the data window holds the capture of the *preceding* RX transaction.
  `read()` primes (issues the transaction twice, keeps the second capture — the validated
  behaviour). `read_chain()` in chained mode lets each transaction deliver its
  predecessor's data and adds one trailing transaction: half the transactions, but not
  yet validated on hardware, so it is opt-in.

PCIe orders a read behind earlier posted writes, so the status poll itself flushes the
CNTL write; the reference's extra CNTL read-back is not needed. Status and data window
are fetched in one streamed read (STATUS, COMMAND, the dword before the window, the
window): ascending TLPs mean the window is read only after STATUS was seen.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Literal

from amdflash.stages.navi31 import regs as R
from amdflash.stages.transport.base import Bar5

MAX_DATA = R.ROM_SW_DATA_SIZE
_STATUS_TO_WINDOW = R.ROM_SW_DATA - R.ROM_SW_STATUS  # 12 bytes: STATUS, COMMAND, reserved
_WRDI = 0x04

RxMode = Literal["primed", "chained"]


class RomSwError(RuntimeError):
    pass


class RomSwTimeout(RomSwError, TimeoutError):
    pass


@dataclass(frozen=True)
class RomSwOptions:
    prescale: int = 8                 # SCK = 100 MHz / (prescale + 1)
    restore_each: bool = False        # save/configure/restore around every transaction
    rx_mode: RxMode = "primed"
    timeout: float = 2.0              # per transaction, on the transport clock
    poll_interval: float = 50e-6

    def __post_init__(self) -> None:
        if not 0 <= self.prescale <= 15:
            raise ValueError("prescale must be 0..15")
        if self.rx_mode not in ("primed", "chained"):
            raise ValueError("rx_mode must be 'primed' or 'chained'")


@dataclass(frozen=True)
class Request:
    """One RX transaction: opcode, address (sent as address_bytes MSB first), byte count."""

    opcode: int
    address: int = 0
    address_bytes: int = 0
    count: int = 1


class RomSw:
    def __init__(self, bar: Bar5, options: RomSwOptions | None = None):
        self.bar = bar
        self.options = options or RomSwOptions()
        self.saved: dict[int, int] = {}       # as found before the current configuration
        self.originals: dict[int, int] = {}   # as found before the first configuration
        self._open = False
        self._engine_answers = True   # false after a timeout: nothing more may be started
        self.transactions = 0
        # Told of every transaction started: (opcode, address, address_bytes, tx_len, rx_len).
        self.observer: Callable[[int, int, int, int, int], None] | None = None

    # -- lifetime -------------------------------------------------------------------------
    def open(self) -> "RomSw":
        if self._open:
            return self
        self._open = True
        if not self.options.restore_each:
            try:
                self._configure()
                self._check_status_clears()
            except BaseException:
                self.close()
                raise
        return self

    def close(self) -> None:
        """Restore every register this driver changed. Safe to call more than once.

        Every register is written back even if one write fails; the first failure is raised
        after the rest were tried.
        """
        if not self._open:
            return
        self._open = False
        if self.originals:
            self._restore(self.originals, disable_writes=not self.options.restore_each)

    def __enter__(self) -> "RomSw":
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _configure(self) -> None:
        bar = self.bar
        saved = {reg: bar.read32(reg) for reg in R.ROM_SW_SAVED}
        saved[R.ROM_SW_COMMAND] = bar.read32(R.ROM_SW_COMMAND)
        self.saved = saved
        if not self.originals:
            # What close() puts back; a resumed job may replace these with the values the
            # board held before an earlier, killed run changed them.
            self.originals = dict(saved)
        pads = ~R.SPI_PAD_BITS & 0xFFFFFFFF
        bar.write32(R.GPIOPAD_MASK, saved[R.GPIOPAD_MASK] & pads)
        bar.write32(R.GPIOPAD_A, saved[R.GPIOPAD_A] & pads)
        bar.write32(R.GPIOPAD_EN, saved[R.GPIOPAD_EN] & pads)
        mirror = saved[R.PAGE_MIRROR_CNTL]
        bar.write32(R.PAGE_MIRROR_CNTL, (mirror & 0xF1FFFFFF) | R.PAGE_MIRROR_USAGE_SPI)
        cntl = (saved[R.ROM_CNTL] & 0xE0FFFFFF) | 1 << 28 | self.options.prescale << 24
        bar.write32(R.ROM_CNTL, (cntl & ~0xF) | 8)

    def _check_status_clears(self) -> None:
        self.bar.write32(R.ROM_SW_STATUS, 0)
        status = self.bar.read32(R.ROM_SW_STATUS)
        if status != 0:
            raise RomSwError(f"ROM_SW_STATUS did not clear (reads {status:#010x}); "
                             "the ROM_SW engine is not usable on this board")

    def _restore(self, values: dict[int, int], disable_writes: bool) -> None:
        bar = self.bar
        if disable_writes and self._engine_answers:
            # Leave the chip write-disabled: the last CNTL write is a bare WRDI.
            try:
                self._run(_WRDI, 0, 0, b"", 0)
            except Exception:  # noqa: BLE001 - a failing engine must not stop the restore
                pass
        first_error: Exception | None = None
        writes = [(R.ROM_SW_STATUS, 0), (R.ROM_SW_COMMAND, values[R.ROM_SW_COMMAND])]
        writes += [(reg, values[reg]) for reg in
                   (R.ROM_CNTL, R.PAGE_MIRROR_CNTL, R.GPIOPAD_A, R.GPIOPAD_EN, R.GPIOPAD_MASK)]
        for reg, value in writes:
            try:
                bar.write32(reg, value)
            except Exception as e:  # noqa: BLE001 - try every register, report the first failure
                first_error = first_error or e
        if first_error is not None:
            raise first_error

    # -- transactions ---------------------------------------------------------------------
    def command(self, opcode: int, address: int = 0, address_bytes: int = 0, tx: bytes = b"") -> None:
        """A transaction that sends opcode, address and TX data, and waits for completion."""
        self._transaction(opcode, address, address_bytes, tx, 0, fetch=False)

    def read(self, opcode: int, address: int = 0, address_bytes: int = 0, count: int = 1) -> bytes:
        """A fresh RX capture: prime with an identical transaction, keep the second."""
        self._transaction(opcode, address, address_bytes, b"", max(2, count), fetch=False)
        return self._transaction(opcode, address, address_bytes, b"", count, fetch=True)

    def read_chain(self, requests: Iterable[Request]) -> Iterator[bytes]:
        """Results of a series of RX transactions, in order, in the configured RX mode.

        A chain must run to its end without other RX transactions in between: in chained
        mode each window holds the previous RX capture, whoever caused it.
        """
        if self.options.rx_mode == "primed":
            for r in requests:
                yield self.read(r.opcode, r.address, r.address_bytes, r.count)
            return
        previous: Request | None = None
        for r in requests:
            window = self._transaction(r.opcode, r.address, r.address_bytes, b"", r.count,
                                       fetch=previous is not None)
            if previous is not None:
                yield window[:previous.count]
            previous = r
        if previous is not None:
            # The trailing transaction exists only to push the last capture into the window.
            window = self._transaction(previous.opcode, previous.address, previous.address_bytes,
                                       b"", previous.count, fetch=True)
            yield window[:previous.count]

    def raw(self, opcode: int, address: int = 0, address_bytes: int = 0, count: int = 0) -> bytes:
        """One RX transaction returning the window as is (the *previous* capture)."""
        return self._transaction(opcode, address, address_bytes, b"", count, fetch=True)

    def _transaction(self, opcode: int, address: int, address_bytes: int, tx: bytes,
                     rx_count: int, fetch: bool) -> bytes:
        if not self._open:
            raise RomSwError("ROM_SW engine used before open()")
        if not self._engine_answers:
            raise RomSwError("ROM_SW engine stopped answering earlier; reopen after checking the board")
        if self.options.restore_each:
            self._configure()
            try:
                self._check_status_clears()
                return self._run(opcode, address, address_bytes, tx, rx_count, fetch)
            finally:
                self._restore_each()
        return self._run(opcode, address, address_bytes, tx, rx_count, fetch)

    def _restore_each(self) -> None:
        self._restore(self.saved, disable_writes=False)

    def _run(self, opcode: int, address: int, address_bytes: int, tx: bytes, rx_count: int,
             fetch: bool = True) -> bytes:
        if tx and rx_count:
            raise ValueError("ROM_SW cannot send and receive data in one transaction")
        if not 0 <= address_bytes <= 3:
            raise ValueError("address_bytes must be 0..3")
        count = len(tx) or rx_count
        if count > MAX_DATA:
            raise ValueError(f"ROM_SW transfers at most {MAX_DATA} data bytes, not {count}")
        bar = self.bar
        bar.write32(R.ROM_SW_STATUS, 0)
        # COMMAND b31:8 are sent most significant first, as many as the command size asks.
        bar.write32(R.ROM_SW_COMMAND, (address & (0xFFFFFF >> 8 * (3 - address_bytes)))
                    << (8 * (3 - address_bytes) + 8) | (opcode & 0xFF))
        if tx:
            padded = tx + bytes(-len(tx) % 4)
            words = struct.unpack(f">{len(padded) // 4}I", padded)
            bar.write_block(R.ROM_SW_DATA, struct.pack(f"<{len(words)}I", *words))
        control = address_bytes << 16 | (R.ROM_SW_RETURN_DATA_ENABLE if rx_count else 0) | count
        bar.write32(R.ROM_SW_CNTL, control)
        self.transactions += 1
        if self.observer:
            self.observer(opcode, address, address_bytes, len(tx), rx_count)
        window_bytes = (rx_count + 3) & ~3 if fetch and rx_count else 0
        return self._wait_done(window_bytes)[:rx_count]

    def _wait_done(self, window_bytes: int) -> bytes:
        bar, clock = self.bar, self.bar.clock
        deadline = clock.now() + self.options.timeout
        while True:
            if window_bytes:
                block = bar.read_block(R.ROM_SW_STATUS, _STATUS_TO_WINDOW + window_bytes)
                status = int.from_bytes(block[:4], "little")
            else:
                block, status = b"", bar.read32(R.ROM_SW_STATUS)
            if status & R.ROM_SW_DONE:
                return block[_STATUS_TO_WINDOW:]
            if clock.now() >= deadline:
                self._engine_answers = False
                raise RomSwTimeout(
                    f"ROM_SW transaction timed out after {self.options.timeout:g} s "
                    f"(ROM_SW_STATUS={status:#010x}); the engine may be gated after SOS boot")
            clock.sleep(self.options.poll_interval)
