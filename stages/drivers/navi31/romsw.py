"""Driver for the SMUIO ROM_SW engine: raw SPI transactions through BAR5 (docs/rom-sw.md).

The engine is configured once per open (SPI pads released, page-mirror usage, prescaler)
and every changed register is restored at close, on every path. The reference client
instead saves and restores around each transaction; `restore_each=True` does that too.

Facts of the silicon that shape every transaction:

* A write to ROM_SW_CNTL *starts* a transaction, whatever its value. This is an inference,
  not a documented fact: a bare opcode such as WREN has control word 0, and flashrom's
  driver for the same engine on older Radeons starts every transaction by writing CNTL,
  with no other trigger. The reference client's CNTL = 0 "clears" would then each be an
  opcode-only transaction; the validated sequence keeps them (and waits for them), the
  fast one leaves them out.
* The transaction runs for its SPI time after the CNTL write reaches the board, while the
  host goes on. Until its done bit has been seen, nothing may touch COMMAND, CNTL or the
  data window: on hardware that spoils the transaction. So every transaction ends with a
  read that shows STATUS bit 0 set, before anything else is sent. When that read also
  fetches the window (STATUS first), it is sent no earlier than a bound of the
  transaction's end built from safe bounds only: the CNTL write reached the board no later
  than its call returned (the time is taken then), a read reaches the board no earlier
  than it is sent, and the SPI time is at most 1 µs + 8 clocks a byte at
  100 MHz / (prescale + 1), with a margin for the engine's clock. A slower link or a
  delayed host only makes that read later, never early. The link's latency is never
  credited: a latency measured at open is no bound (the host may be delayed while it is
  measured, the link may be faster later). A read that still finds the transaction
  running (the engine slower than its bound) says so, since STATUS comes first in it: the
  driver waits for the done bit, takes the spoiled data again and, on this board, reads
  STATUS on its own before the window from then on.
* The RX quirk: the data window holds the capture of the *preceding* RX transaction.
  Primed reads issue each transaction twice and keep the second result (the validated
  behaviour). Chained reads let each transaction deliver its predecessor's capture, and a
  chain ends with one more transaction: for array reads (03h) that is the read of the next
  chunk, kept in the capture buffer, so that a chain which goes on where the last one
  ended (a dump, unit after unit) starts without it. Any other transaction drops it.

* Where a read came from. A read that returns the bytes it was expected to return confirms
  itself only if it provably came from the chip in answer to its request (stages/confirm.py):
  the window also holds what the host put there (the TX data of the page just programmed,
  data preloaded for the next one) and earlier captures, and an RX transaction that did not
  run — its CNTL write lost, a done bit left over from the transaction before — leaves the
  window as it was. The proof is by construction, from the window's content, in chained
  mode (`read_chain_proven`): the driver knows what the window held before each RX
  transaction (it read it after the transaction before — what it wrote there does not
  count, a write can be lost), and a transaction that did not run leaves that content in
  place exactly (a capture moves into the window only when an RX transaction completes;
  nothing else writes it during a chain). So a transaction *moved* the window when what it
  left there differs from what the driver knew before it (in any byte it knew), and then
  it ran: its request reached the chip and its capture replaced the whole capture buffer.
  A delivery — the capture of the transaction before, brought in by this one — is proven
  when both moved: the capture is then this request's bytes from the chip, not the host's
  TX data and not an older capture.
  Content that repeats from one chunk to the next, which would leave the window unchanged,
  proves nothing (and is confirmed by agreeing reads); so is the first read of a chain
  whose window the driver has not seen, which is why such chains read the whole window
  after their first transaction. Primed reads prove nothing: each pair captures the same
  address twice, so a pair whose first half did not run looks like one that did.

How much of this is sent the validated way and how much the fast way is `self.fast`
(see fastpaths.py): every fast path is checked on the board at open, and a board where one
disagrees with the validated sequence keeps that one off.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, replace
from typing import Literal
from collections.abc import Callable, Generator, Iterable

from amdflash.stages.drivers.navi31 import fastpaths
from amdflash.stages.drivers.navi31 import regs as R
from amdflash.stages.drivers.navi31.fastpaths import VALIDATED, FastPaths, Finding
from amdflash.stages.drivers.navi31.request import Request
from amdflash.stages.transport.base import Bar5

MAX_DATA = R.ROM_SW_DATA_SIZE
_STATUS_TO_WINDOW = R.ROM_SW_DATA - R.ROM_SW_STATUS  # 12 bytes: STATUS, COMMAND, reserved
_RESERVED = R.ROM_SW_COMMAND + 4                     # the dword between COMMAND and the window
_WRDI, _READ = 0x04, 0x03

SPI_REFCLK_HZ = 100e6
SPI_OVERHEAD = 1e-6           # per transaction, besides the clocks (an assumption)
SPI_MARGIN = 1.02             # the engine's clock may run a little slower than nominal ...
SPI_SLACK = 2e-6              # ... and start a little later
CLEAR_BOUND = 1e-3            # a CNTL = 0 clear shows done by then, or it started nothing
SPOILED_RETRIES = 3
STATUS_CLEARS = 3             # writes of 0 to STATUS before it counts as not clearing
CAPTURE = MAX_DATA            # the window a capture replaces (the whole of it)

RxMode = Literal["primed", "chained"]


class RomSwError(RuntimeError):
    pass


class RomSwTimeout(RomSwError, TimeoutError):
    pass


class _FoundRunning(Exception):
    """A read of STATUS and the window found the transaction still running: what it read is
    void, and on hardware the transaction is spoiled."""


@dataclass(frozen=True)
class RomSwOptions:
    prescale: int = 8                 # SCK = 100 MHz / (prescale + 1)
    restore_each: bool = False        # save/configure/restore around every transaction
    rx_mode: RxMode = "chained"       # chained (self-checked at open) or primed
    timeout: float = 2.0              # per transaction, on the transport clock
    poll_interval: float = 50e-6
    fast: FastPaths | None = None     # the fast paths wanted; None: all of them
    self_check: bool = True           # check them at open (False: use `fast` as given)

    def __post_init__(self) -> None:
        if not 0 <= self.prescale <= 15:
            raise ValueError("prescale must be 0..15")
        if self.rx_mode not in ("primed", "chained"):
            raise ValueError("rx_mode must be 'primed' or 'chained'")

    def wanted(self) -> FastPaths:
        if self.fast is not None:
            return self.fast
        return FastPaths(chained=self.rx_mode == "chained")


class RomSw:
    def __init__(self, bar: Bar5, options: RomSwOptions | None = None):
        self.bar = bar
        self.options = options or RomSwOptions()
        self.fast = VALIDATED                 # until open() has checked the fast paths
        self.findings: list[Finding] = []
        # Told of every fast path given up after open (the self-check's verdicts are in findings).
        self.on_finding: Callable[[Finding], None] | None = None
        self.saved: dict[int, int] = {}       # as found before the current configuration
        self.originals: dict[int, int] = {}   # as found before the first configuration
        self._open = False
        self._engine_answers = True   # false after a timeout: nothing more may be started
        self.transactions = 0
        self.completions = 0          # transactions whose done bit this driver has seen
        self.found_running = 0        # reads of STATUS and window that found one still running
        self.last_end = 0.0           # latest time the last transaction's SPI time can end
        self._unobserved: float | None = None   # deadline of a transaction whose end is unseen
        # Told of every transaction started: (opcode, address, address_bytes, tx_len, rx_len).
        self.observer: Callable[[int, int, int, int, int], None] | None = None
        self._pending: Request | None = None  # a read whose capture waits in the capture buffer
        self._command: int | None = None      # ROM_SW_COMMAND as last written
        self._window: bytes | None = None     # what the data window holds, when this driver knows
        self._reserved = 0
        # Provenance of reads (module docstring): the window's first bytes as this driver last
        # read them (b"": not known), whether the last transaction was an RX one that moved
        # the window, and whether the current chain reads whole windows to prove its reads.
        self._seen = b""
        self._moved = False
        self._proven = False        # the last delivery is proven to come from the chip
        self._proving = False

    # -- lifetime -------------------------------------------------------------------------
    def open(self) -> RomSw:
        if self._open:
            return self
        self._open = True
        self._seen, self._moved = b"", False     # another process may have used the engine
        try:
            if not self.options.restore_each:
                self._configure()
                self._check_status_clears()
            self._reserved = self._r32(_RESERVED)
            wanted = self.options.wanted()
            if self.options.self_check:
                self.findings = fastpaths.check(self, wanted)
            else:
                self.fast = wanted
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
        self._pending = None
        if self.originals:
            self._restore(self.originals, disable_writes=not self.options.restore_each)

    def forget(self) -> None:
        """Another user of the engine's registers (the hardware report's timing probes)
        wrote COMMAND and the window and ran transactions: what this driver believed they
        hold is unknown from here, and the next chain starts without a capture waiting."""
        self._pending, self._command, self._window = None, None, None
        self._seen, self._moved, self._proven = b"", False, False

    def __enter__(self) -> RomSw:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _configure(self) -> None:
        saved = {reg: self._r32(reg) for reg in R.ROM_SW_SAVED}
        saved[R.ROM_SW_COMMAND] = self._r32(R.ROM_SW_COMMAND)
        self.saved = saved
        self._command = saved[R.ROM_SW_COMMAND]
        if not self.originals:
            # What close() puts back; a resumed job may replace these with the values the
            # board held before an earlier, killed run changed them.
            self.originals = dict(saved)
        pads = ~R.SPI_PAD_BITS & 0xFFFFFFFF
        self._w32(R.GPIOPAD_MASK, saved[R.GPIOPAD_MASK] & pads)
        self._w32(R.GPIOPAD_A, saved[R.GPIOPAD_A] & pads)
        self._w32(R.GPIOPAD_EN, saved[R.GPIOPAD_EN] & pads)
        mirror = saved[R.PAGE_MIRROR_CNTL]
        self._w32(R.PAGE_MIRROR_CNTL, (mirror & 0xF1FFFFFF) | R.PAGE_MIRROR_USAGE_SPI)
        cntl = (saved[R.ROM_CNTL] & 0xE0FFFFFF) | 1 << 28 | self.options.prescale << 24
        self._w32(R.ROM_CNTL, (cntl & ~0xF) | 8)

    def _check_status_clears(self) -> None:
        # A write can be lost on the way (the done bit then stays set): write it again a few
        # times before calling the engine unusable.
        for _ in range(STATUS_CLEARS):
            self._w32(R.ROM_SW_STATUS, 0)
            status = self._r32(R.ROM_SW_STATUS)
            if status == 0:
                return
        raise RomSwError(f"ROM_SW_STATUS did not clear (reads {status:#010x} after {STATUS_CLEARS} writes of 0); "
                         "the ROM_SW engine is not usable on this board")

    def _restore(self, values: dict[int, int], disable_writes: bool) -> None:
        try:
            self._settle()
        except Exception:
            pass
        if disable_writes and self._engine_answers:
            # Leave the chip write-disabled: the last CNTL write is a bare WRDI.
            try:
                self._run(_WRDI, 0, 0, b"", 0)
            except Exception:
                pass
        first_error: Exception | None = None
        writes = [(R.ROM_SW_STATUS, 0), (R.ROM_SW_COMMAND, values[R.ROM_SW_COMMAND])]
        writes += [(reg, values[reg]) for reg in
                   (R.ROM_CNTL, R.PAGE_MIRROR_CNTL, R.GPIOPAD_A, R.GPIOPAD_EN, R.GPIOPAD_MASK)]
        for reg, value in writes:
            try:
                self._w32(reg, value)
            except Exception as e:
                first_error = first_error or e
        self._command = values[R.ROM_SW_COMMAND]
        if first_error is not None:
            raise first_error

    # -- registers ------------------------------------------------------------------------
    def _r32(self, offset: int) -> int:
        if self.fast.single_tlp:
            return self.bar.read32(offset)
        return int.from_bytes(self.bar.read_block(offset, 4), "little")

    def _w32(self, offset: int, value: int) -> None:
        if self.fast.single_tlp:
            self.bar.write32(offset, value)
        else:
            self.bar.write_block(offset, (value & 0xFFFFFFFF).to_bytes(4, "little"))

    # -- transactions ---------------------------------------------------------------------
    def command(self, opcode: int, address: int = 0, address_bytes: int = 0, tx: bytes = b"",
                preload: bytes | None = None, start_after: float | None = None) -> None:
        """A transaction that sends opcode, address and TX data, and waits for completion.

        `preload`: data loaded into the window with this transaction's registers, for the
        transmit transaction after it (only when `self.fast.preload`). `start_after`: the
        CNTL write is not sent before this time on the transport clock.
        """
        self._transaction(opcode, address, address_bytes, tx, 0, preload=preload, start_after=start_after)

    def read(self, opcode: int, address: int = 0, address_bytes: int = 0, count: int = 1) -> bytes:
        """A fresh RX capture of one request."""
        return b"".join(self.read_chain([Request(opcode, address, address_bytes, count)]))

    def read_chain(self, requests: Iterable[Request], start_after: float | None = None) -> Generator[bytes, None, None]:
        """Results of a series of RX transactions, in order, in the configured RX mode.

        A chain must run to its end without other transactions in between: in chained
        mode each window holds the previous RX capture, whoever caused it. `start_after`:
        the first transaction does not start before then (its registers are loaded before).
        """
        for data, _ in self._chain(requests, start_after, proving=False):
            yield data

    def read_chain_proven(self, requests: Iterable[Request],
                          start_after: float | None = None) -> Generator[tuple[bytes, bool], None, None]:
        """As `read_chain`, each result with whether it provably came from the chip in answer
        to its request (the module docstring). Only chained reads can be proven; a chain that
        starts without a capture proven waiting reads the whole window after each of its
        transactions that delivers less, so that its first reads can be proven too."""
        return self._chain(requests, start_after, proving=self.proves_reads)

    @property
    def proves_reads(self) -> bool:
        """Whether reads can be proven to come from the chip (chained RX only)."""
        return self.fast.chained

    def _chain(self, requests: Iterable[Request], start_after: float | None,
               proving: bool) -> Generator[tuple[bytes, bool], None, None]:
        if not self.fast.chained:
            for r in requests:
                # Prime with at least 2 bytes, as the validated client does; keep the second.
                self._transaction(r.opcode, r.address, r.address_bytes, b"", max(2, r.count),
                                  start_after=start_after)
                start_after = None
                yield self._deliver(r, r), False
            return
        pending, self._pending = self._pending, None
        previous: Request | None = None
        self._proving = proving
        try:
            for r in requests:
                if previous is None and r == pending:
                    previous = r            # its capture is already waiting
                    continue
                window = self._deliver(r, previous, start_after)
                start_after = None
                if previous is not None:
                    yield window, self._proven
                previous = r
            if previous is not None:
                # One more transaction brings the last capture into the window: for an array
                # read, the read of the chunk after it, which the next chain may start with.
                follow = _following(previous)
                window = self._deliver(follow or previous, previous)
                self._pending = follow
                yield window, self._proven
        finally:
            self._proving = False

    def raw(self, opcode: int, address: int = 0, address_bytes: int = 0, count: int = 0) -> bytes:
        """One RX transaction returning the window as is (the *previous* capture)."""
        try:
            return self._transaction(opcode, address, address_bytes, b"", count, deliver=count)
        except _FoundRunning:
            self._give_up_combined_read()
            raise RomSwError("the window was read before the transaction ended; read again") from None

    def _deliver(self, request: Request, previous: Request | None, start_after: float | None = None) -> bytes:
        """Issue `request`; return the capture of `previous` that its completion brings into
        the window. A read that found the transaction still running is taken again."""
        deliver = previous.count if previous is not None else 0
        for _ in range(SPOILED_RETRIES):
            try:
                return self._transaction(request.opcode, request.address, request.address_bytes, b"",
                                         max(2, request.count), deliver=deliver, start_after=start_after)
            except _FoundRunning:
                self._give_up_combined_read()
                if previous is not None:
                    # Both captures may be spoiled: take the previous one again first (it then
                    # proves itself, or not, like any other).
                    self._transaction(previous.opcode, previous.address, previous.address_bytes, b"",
                                      max(2, previous.count))
        raise RomSwError("reads keep finding ROM_SW transactions still running; check the transport")

    def _transaction(self, opcode: int, address: int, address_bytes: int, tx: bytes, rx_count: int,
                     deliver: int = 0, preload: bytes | None = None, start_after: float | None = None) -> bytes:
        if not self._open:
            raise RomSwError("ROM_SW engine used before open()")
        if not self._engine_answers:
            raise RomSwError("ROM_SW engine stopped answering earlier; reopen after checking the board")
        if self.options.restore_each:
            self._configure()
            try:
                self._check_status_clears()
                return self._run(opcode, address, address_bytes, tx, rx_count, deliver, preload, start_after)
            finally:
                self._restore(self.saved, disable_writes=False)
        return self._run(opcode, address, address_bytes, tx, rx_count, deliver, preload, start_after)

    def _run(self, opcode: int, address: int, address_bytes: int, tx: bytes, rx_count: int,
             deliver: int = 0, preload: bytes | None = None, start_after: float | None = None) -> bytes:
        if tx and rx_count:
            raise ValueError("ROM_SW cannot send and receive data in one transaction")
        if not 0 <= address_bytes <= 3:
            raise ValueError("address_bytes must be 0..3")
        count = len(tx) or rx_count
        if count > MAX_DATA or len(preload or b"") > MAX_DATA:
            raise ValueError(f"ROM_SW transfers at most {MAX_DATA} data bytes, not {count}")
        self._pending = None
        self._settle()
        fast = self.fast
        if not fast.no_cntl_clears:
            self._clear()
        # COMMAND b31:8 are sent most significant first, as many as the command size asks.
        command = (address & (0xFFFFFF >> 8 * (3 - address_bytes))) << (8 * (3 - address_bytes) + 8) | (opcode & 0xFF)
        data = _window_bytes(tx) if tx else b""
        if preload is not None and fast.preload and not tx:
            data = _window_bytes(preload)
        if data and data == self._window:
            data = b""                                  # already loaded (a preload)
        self._load(command, data)
        captured = self._moved      # the transaction before this one ran, and captured what this one brings in
        seen = self._seen
        self._moved = self._proven = False
        if rx_count:
            self._window = None                         # the capture lands in the window
            self._seen = b""
        control = address_bytes << 16 | (R.ROM_SW_RETURN_DATA_ENABLE if rx_count else 0) | count
        clock = self.bar.clock
        if start_after is not None:
            clock.sleep(start_after - clock.now())
        self._unobserved = clock.now() + self.options.timeout   # before the write: it may not return
        self._w32(R.ROM_SW_CNTL, control)
        # Taken after the write has returned: the transaction started no later than this.
        sent = clock.now()
        self._unobserved = sent + self.options.timeout
        wire = 1 + address_bytes + count
        self.last_end = sent + self.spi_estimate(wire)
        self.transactions += 1
        if self.observer:
            self.observer(opcode, address, address_bytes, len(tx), rx_count)
        window = CAPTURE if rx_count and self._proving else 0
        got = self._observe(sent, wire, deliver, window)
        if rx_count and got:
            # What this transaction left in the window, against what the driver knew was there.
            n = min(len(got), len(seen))
            self._moved = n > 0 and got[:n] != seen[:n]
            self._proven = captured and self._moved
            self._seen = got
        return got[:deliver]

    def _load(self, command: int, data: bytes) -> None:
        """Clear STATUS, set COMMAND, load window data."""
        if data:
            # What the window holds is what this driver reads there, not what it wrote: a
            # write lost on the way must not make a later read look as if it changed the window.
            self._seen = b""
        fast = self.fast
        if fast.streamed_command and (data or not fast.single_tlp):
            head = struct.pack("<III", 0, command, self._reserved) if data else struct.pack("<II", 0, command)
            self.bar.write_block(R.ROM_SW_STATUS, head + data)
        else:
            self._w32(R.ROM_SW_STATUS, 0)
            if command != self._command or not fast.streamed_command:
                self._w32(R.ROM_SW_COMMAND, command)
            if data:
                self.bar.write_block(R.ROM_SW_DATA, data)
        self._command = command
        if data:
            self._window = data

    def _clear(self) -> None:
        """The reference client's CNTL = 0 clear: an opcode-only transaction of whatever
        COMMAND holds (or nothing, if CNTL writes start nothing). Waited for, bounded: a
        one-byte transaction is over long before CLEAR_BOUND after the write returned, so
        if no done bit shows by then, the write started nothing."""
        clock = self.bar.clock
        self._w32(R.ROM_SW_STATUS, 0)
        self._w32(R.ROM_SW_CNTL, 0)
        bound = clock.now() + CLEAR_BOUND
        while not self._r32(R.ROM_SW_STATUS) & R.ROM_SW_DONE and clock.now() < bound:
            clock.sleep(self.options.poll_interval)
        self._check_status_clears()

    def _observe(self, sent: float, wire: int, deliver: int, window: int = 0) -> bytes:
        """Wait for the transaction to end and see its done bit; return the window's first
        bytes: the `deliver` bytes asked for rounded up to dwords, or `window` bytes if more.

        `sent`: the time taken when the CNTL write had returned. The first read goes out
        when the transaction must have ended (see the module docstring): reading the window
        with STATUS, in one read, is then reading it after the end.
        """
        clock, fast = self.bar.clock, self.fast
        deadline = sent + self.options.timeout
        clock.sleep(sent + self.spi_estimate(wire) - clock.now())
        span = max((deliver + 3) & ~3, window)
        if span and fast.combined_read:
            block = self.bar.read_block(R.ROM_SW_STATUS, _STATUS_TO_WINDOW + span)
            status = int.from_bytes(block[:4], "little")
            if status & R.ROM_SW_DONE:
                self._seen_done()
                return block[_STATUS_TO_WINDOW:_STATUS_TO_WINDOW + span]
            self.found_running += 1
            self._await_done(deadline)
            raise _FoundRunning
        self._await_done(deadline)
        return self.bar.read_block(R.ROM_SW_DATA, span) if span else b""

    def _settle(self) -> None:
        """See the end of a transaction left unobserved (an exception between its CNTL write
        and its done bit, such as Ctrl-C in a wait) before anything touches the engine."""
        if self._unobserved is not None and self._engine_answers:
            self._await_done(self._unobserved)

    def _seen_done(self) -> None:
        self.completions += 1
        self._unobserved = None

    def _await_done(self, deadline: float) -> None:
        clock = self.bar.clock
        while True:
            status = self._r32(R.ROM_SW_STATUS)
            if status & R.ROM_SW_DONE:
                self._seen_done()
                return
            if clock.now() >= deadline:
                self._engine_answers = False
                # Gating stops the engine from the first transaction; one that stops after
                # answering is hung (the engine, the link or the board), not gated.
                why = (f"the engine stopped answering after {self.completions} completed transactions"
                       if self.completions else "the engine may be gated after SOS boot")
                raise RomSwTimeout(f"ROM_SW transaction timed out after {self.options.timeout:g} s "
                                   f"(ROM_SW_STATUS={status:#010x}); {why}")
            clock.sleep(self.options.poll_interval)

    def spi_estimate(self, wire_bytes: int, margin: bool = True) -> float:
        """The SPI time of a transaction of `wire_bytes`, with a margin (an upper estimate)."""
        t = SPI_OVERHEAD + 8 * wire_bytes * (self.options.prescale + 1) / SPI_REFCLK_HZ
        return t * SPI_MARGIN + SPI_SLACK if margin else t

    def _give_up_combined_read(self) -> None:
        self.give_up("combined_read", "a read of STATUS and the window found a transaction still running "
                                      "after its SPI time's bound: STATUS is now read on its own first")

    def give_up(self, name: str, detail: str) -> None:
        """Turn a fast path off for the rest of this board's job (found wanting at run time)."""
        if getattr(self.fast, name):
            self.fast = replace(self.fast, **{name: False})
            self._found(Finding(fastpaths.label(name), False, detail))

    def _found(self, finding: Finding) -> None:
        self.findings.append(finding)
        if self.on_finding:
            self.on_finding(finding)

    # -- probes for the self-check --------------------------------------------------------
    def probe_window_retention(self, pattern: bytes) -> bytes:
        """Load `pattern` with a transmit-only transaction (WRDI); what the window holds after."""
        self._transaction(_WRDI, 0, 0, b"", 0, preload=pattern)
        self._window = None
        window = self.bar.read_block(R.ROM_SW_DATA, (len(pattern) + 3) & ~3)
        self._seen = window
        return _window_bytes(window)[:len(pattern)]       # back in wire order (the swap is its own inverse)


def _following(request: Request) -> Request | None:
    """The array read after `request` (to keep in the capture buffer), if it is one."""
    if request.opcode != _READ or request.address_bytes != 3:
        return None
    nxt = request.address + request.count
    return Request(_READ, nxt, 3, request.count) if nxt + request.count <= 0x1000000 else None


def _window_bytes(tx: bytes) -> bytes:
    """TX data as the window takes it: big-endian dwords (the first byte on the wire is a
    dword's most significant byte), a short last dword zero-padded."""
    padded = tx + bytes(-len(tx) % 4)
    words = struct.unpack(f">{len(padded) // 4}I", padded)
    return struct.pack(f"<{len(words)}I", *words)
