"""The SPI NOR command set over the ROM_SW engine: identify, read, erase, program, protect.

Busy handling follows the chip table: the first wait is about the typical time of the
operation, and the end of a busy period is seen in a status read before anything else goes
to the chip. A wait ends on that evidence, not on a guessed number: the limit is the part's
datasheet maximum times BUSY_MARGIN (most maxima in the table are recalled family figures,
and a chip within its real datasheet must not be stopped mid-flash), raised for a board
whose hardware report measured it slower (`busy_limits`). A chip still busy at the limit is
polled on until it finishes (up to GIVE_UP) and then reported as slower than its datasheet
with its measured time: the operation is over, so the unit is whole and `resume` finishes it.

* an erase or status write waits about its typical time, then reads status until WIP
  clears;
* page programs are timed (a fast path, see navi31/fastpaths.py): the next page's write
  enable goes out when the typical program time has passed, with the page's data loaded
  into the window meanwhile; the read-back of every written unit checks them. What comes
  after the last page sees its end: a read chain starts with a status read (its result
  arrives with the first array read, so it costs one transaction, not a primed pair), and
  anything else reads status until WIP clears. On a board where programming is checked
  instead, a write enable is followed by a status read showing WEL=1 and WIP=0 — which
  proves both that the previous page finished and that the next may start.
"""
from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from typing import Literal

from amdflash.stages.drivers.flash import chips, protection, sfdp
from amdflash.stages.drivers.flash.protection import Protection
from amdflash.stages.drivers.flash.chips import ChipInfo, match_jedec
from amdflash.stages.drivers.navi31.romsw import Request, RomSw

# Opcodes (JEDEC standard, as every part in the table takes them; docs/flash-chip.md).
READ, PP = 0x03, 0x02
RDSR1 = 0x05
WRSR, WREN, WRDI = 0x01, 0x06, 0x04
RDID, RDSFDP, RDUID = 0x9F, 0x5A, 0x4B

MAX_CHUNK = 0x100
POLL_INTERVAL = 100e-6
BUSY_MARGIN = 2.0      # the limit: twice the datasheet maximum (see the module docstring)
GIVE_UP = 40.0         # seconds past which a busy chip is not waited for (Linux's generic SPI NOR wait)


class FlashError(RuntimeError):
    pass


class FlashTimeout(FlashError, TimeoutError):
    pass


class ChipTooSlow(FlashTimeout):
    """An operation finished, but later than the part's datasheet allows (with the margin)."""

    def __init__(self, message: str, took: float, limit: float):
        super().__init__(message)
        self.took, self.limit = took, limit


class ProtectedError(FlashError):
    """A write would touch an area the chip protects (and would silently ignore)."""


@dataclass(frozen=True)
class FlashIdentity:
    jedec_capture: bytes
    chip: ChipInfo
    registers: tuple[int, ...]          # the chip's status registers, in its table's order
    sfdp: sfdp.Sfdp | None
    sfdp_error: str | None
    unique_id: bytes                    # empty when the part has none amdflash can read
    protection: protection.Protection

    @property
    def sr1(self) -> int:
        return self.registers[0]

    @property
    def sr2(self) -> int | None:
        return self.registers[1] if len(self.registers) > 1 else None

    @property
    def sr3(self) -> int | None:
        return self.registers[2] if len(self.registers) > 2 else None

    @property
    def cmp(self) -> bool:
        return self.protection.cmp

    @property
    def qe(self) -> bool | None:
        bit = self.chip.qe
        return None if bit is None else bool(self.registers[bit[0]] >> bit[1] & 1)

    def describe_registers(self) -> str:
        return " ".join(f"{r.name}={v:02x}" for r, v in zip(self.chip.registers, self.registers))


@dataclass(frozen=True)
class _Busy:
    """A page program whose end has not been seen yet."""

    ends: float          # about when it ends (typical time after its SPI time)
    deadline: float      # its limit (datasheet maximum with the margin): still busy then, too slow
    what: str
    started: float = 0.0
    maximum: float = 0.0


class SpiNor:
    def __init__(self, spi: RomSw, chip: ChipInfo | None = None):
        self.spi = spi
        self.chip = chip
        self.clock = spi.bar.clock
        self._busy: _Busy | None = None
        self.cmp_attempts: list[str] = []   # the last clear_cmp's writes and read-backs
        # opcode -> seconds a hardware report of this board measured at most: raises the limit.
        self.busy_limits: dict[int, float] = {}

    def limit(self, opcode: int | None, maximum: float) -> float:
        """How long an operation may stay busy before the chip counts as slower than its datasheet."""
        measured = self.busy_limits.get(opcode, 0.0) if opcode is not None else 0.0
        return max(maximum, measured) * BUSY_MARGIN

    def _too_slow(self, what: str, took: float, maximum: float, opcode: int | None) -> ChipTooSlow:
        limit = self.limit(opcode, maximum)
        raised = (f", raised by this board's hardware report to {self.busy_limits[opcode]:g} s × {BUSY_MARGIN:g}"
                  if opcode in self.busy_limits and self.busy_limits[opcode] > maximum else "")
        name = self.chip.name if self.chip else "part"
        return ChipTooSlow(f"the chip is slower than its datasheet: the {what} took {took:.3f} s, over amdflash's "
                           f"limit of {limit:g} s (the {name}'s datasheet maximum {maximum:g} s × {BUSY_MARGIN:g}"
                           f"{raised}); it finished, so the unit is whole and resume finishes the flash; "
                           "`amdflash hardware-report --scratch-sector N --yes` measures this board's times",
                           took, limit)

    # -- identification ---------------------------------------------------------------------
    def rdid(self) -> bytes:
        return self.spi.read(RDID, count=4)

    def identify(self) -> FlashIdentity:
        """JEDEC id, SFDP, status registers, unique ID and protection.

        Only opcodes the part is known to take are sent: a table part's own register reads
        (35h, which reads SR2 on most parts, switches the MX25U1635F to QPI); for a part
        known only from its SFDP, 05h and whatever its quad-enable field says reads SR2.
        """
        self._idle()
        capture = self.rdid()
        chip = match_jedec(capture)
        if chip is not None and chip.unique_id and chip.unique_id.kind == "secured-otp":
            # Leave secured-OTP mode, in case a run died inside it (harmless outside it).
            self.spi.command(chip.unique_id.exit)
        table, error = None, None
        try:
            table = self.read_sfdp()
        except sfdp.SfdpError as e:
            error = str(e)
        if chip is not None:
            chip = chips.identify_part(capture, table)     # W25Q16DW/FW/JW: by the BFPT revision
        if chip is None:
            if table is None:
                raise FlashError(f"unexpected JEDEC capture {capture.hex(' ')}: no known chip and no SFDP ({error}); "
                                 "is the flash powered and the pad setup right?")
            chip = chips.from_sfdp(table, capture)
        self.chip = chip
        regs = tuple(self.status(r.read) for r in chip.registers)
        uid = self._unique_id(chip, regs)
        prot = chip.protection.decode(regs, chip.size) if chip.protection else protection.UNKNOWN
        return FlashIdentity(capture, chip, regs, table, error, uid, prot)

    def _unique_id(self, chip: ChipInfo, regs: tuple[int, ...]) -> bytes:
        method = chip.unique_id
        if method is None:
            return b""
        if method.kind == "4Bh":
            # Four bytes of address or dummy follow the opcode; the last arrives as the first RX byte.
            return self.spi.read(RDUID, 0, 3, method.length + 1)[1:]
        if not self.status(method.security_register) & method.factory_lock:
            return b""      # the factory wrote no serial number
        self.spi.command(method.enter)
        try:
            return self.spi.read(READ, 0, 3, method.length)
        finally:
            self.spi.command(method.exit)

    def read_sfdp(self) -> sfdp.Sfdp:
        # 5Ah sends one dummy byte after the address; it arrives as the first RX byte.
        header = self.spi.read(RDSFDP, 0, 3, 17)[1:]
        revision = sfdp.parse_header(header)
        if header[6]:
            header = self.spi.read(RDSFDP, 0, 3, 17 + 8 * header[6])[1:]
        headers = sfdp.parameter_headers(header)
        chosen = sfdp.best_bfpt(headers)
        if not 9 <= chosen.dwords <= 63:
            raise sfdp.SfdpError(f"basic flash parameter table length {chosen.dwords} dwords is implausible")
        bfpt = self.spi.read(RDSFDP, chosen.pointer, 3, chosen.dwords * 4 + 1)[1:]
        return sfdp.parse_bfpt(revision, bfpt, chosen.revision, tuple(h.id for h in headers))

    # -- status -----------------------------------------------------------------------------
    def status(self, opcode: int = RDSR1) -> int:
        return self.spi.read(opcode, count=1)[0]

    def registers(self) -> tuple[int, ...]:
        return tuple(self.status(r.read) for r in self._chip().registers)

    def protection(self) -> protection.Protection:
        chip = self._chip()
        if chip.protection is None:
            return protection.UNKNOWN
        return chip.protection.decode(self.registers(), chip.size)

    def write_enable(self) -> None:
        self._idle()
        self.spi.command(WREN)
        # A status read that did not run (its transaction ended without reaching the chip) leaves
        # an older capture in the window: one bad reading is not evidence, three in a row are.
        seen = []
        for _ in range(3):
            sr1 = self.status()
            if sr1 & protection.SR1_WEL and not sr1 & protection.SR1_WIP:
                return
            seen.append(f"{sr1:#04x}")
        raise FlashError(f"write enable failed (SR1={', '.join(seen)})")

    def wait_ready(self, typical: float, maximum: float, what: str, started: float | None = None,
                   opcode: int | None = None) -> int:
        """Wait for WIP to clear: first about `typical`, then poll. Past the limit (the datasheet
        `maximum` with the margin) polling goes on, ever sparser, to measure how slow the chip
        is: finished, it is reported as too slow (ChipTooSlow); still busy after GIVE_UP, as stuck."""
        clock = self.clock
        started = clock.now() if started is None else started
        remaining = typical - (clock.now() - started)
        if remaining > 0:
            clock.sleep(remaining)
        limit = self.limit(opcode, maximum)
        give_up = max(GIVE_UP, 2 * limit)
        interval = max(typical / 20, 100e-6)
        # Only a status read *sent* past the limit that still shows WIP is evidence of a slow chip:
        # a host preempted between reads (or a slow link) ends its wait late, not the chip.
        busy_past_limit = False
        while True:
            asked = clock.now()
            sr1 = self.status()
            took = clock.now() - started
            if not sr1 & protection.SR1_WIP:
                if busy_past_limit:
                    raise self._too_slow(what, took, maximum, opcode)
                return sr1
            busy_past_limit = busy_past_limit or asked - started > limit
            if took > give_up:
                raise FlashTimeout(f"flash still busy {took:.3f} s after {what} (datasheet maximum {maximum:g} s, "
                                   f"amdflash's limit {limit:g} s, SR1={sr1:#04x}): the chip does not finish")
            clock.sleep(interval if took <= limit else max(interval, took / 20))

    def write_status(self, values: bytes) -> None:
        """01h with `values` (the registers from the first on), waited out. Only the hardware
        report's protection probe changes protection bits, and puts them back."""
        chip = self._chip()
        if chip.status_write is None:
            raise FlashError(f"no status-write time is known for the {chip.name}")
        self.write_enable()
        self.spi.command(WRSR, tx=values)
        self.wait_ready(*chip.status_write, "write status", self.spi.last_end, WRSR)

    # -- protection -------------------------------------------------------------------------
    def check_writable(self, address: int, size: int, prot: Protection | None = None) -> None:
        prot = prot or self.protection()
        if prot.overlaps(address, size):
            hint = " (SR2.CMP is set: clearing it needs explicit permission, --clear-cmp)" if prot.cmp else ""
            if prot.individual:
                hint = (f" ({prot.individual} selects per-block locks; amdflash never changes protection: unlock "
                        "the blocks with the part's global block unlock, 98h, using another programmer)")
            who = "a reading of its protection bits protects it" if prot.others else "the chip protects it"
            raise ProtectedError(f"refusing to write {address:#08x}-{address + size - 1:#08x}: "
                                 f"{who}, {prot.describe()}{hint}")

    def clear_cmp(self) -> bool:
        """Clear CMP, preserving every other protection and QE bit. False if already clear.

        Two ways to write CMP's register: 01h with the registers from the first up to CMP's
        (SR1, SR2: a one-byte 01h clears CMP and QE on some parts, W25Q16DW, so all are
        written), or its own opcode (31h: SR2 alone, the FW/JW per ufprog). Which one a part
        takes is known only as well as its identification (the kernel writes every EF 60 15
        part with a two-byte 01h): on a part identified for 31h, a CMP still set after it is
        retried with 01h. Each attempt and its read-back is kept in `cmp_attempts` for the trail.
        """
        chip = self._chip()
        layout = chip.protection
        if layout is None or layout.cmp is None or chip.status_write is None:
            raise ProtectedError(f"{chip.name}: no known CMP bit to clear")
        self._idle()
        index, bit = layout.cmp
        register = chip.registers[index]
        regs = [self.status(r.read) for r in chip.registers[:index + 1]]
        self.cmp_attempts = []
        if not regs[index] >> bit & 1:
            return False
        # WIP and WEL are not writable; lock bits are written back as read, so nothing is locked.
        cleared = layout.without_cmp([regs[0] & 0xFC, *regs[1:]])
        methods: list[tuple[int, bytes]] = [(WRSR, bytes(cleared))]
        if chip.status_write_method == "own" and register.write is not None:
            methods.insert(0, (register.write, bytes((cleared[index],))))     # the register alone (31h)
        typical, maximum = chip.status_write
        for opcode, data in methods:
            self.write_enable()
            self.spi.command(opcode, tx=data)
            self.wait_ready(typical, maximum, "write status", self.spi.last_end, WRSR)
            now = self.status(register.read)
            done = not now >> bit & 1
            self.cmp_attempts.append(f"{opcode:02X}h {data.hex(' ')}: {register.name}={now:#04x}, "
                                     f"CMP {'clear' if done else 'still set'}")
            if done:
                return True
        raise FlashError(f"CMP did not clear ({register.name}={now:#04x} after "
                         f"{' then '.join(f'{op:02X}h' for op, _ in methods)}); the status register may be "
                         "locked (SRP)")

    # -- array operations -------------------------------------------------------------------
    def read(self, address: int, count: int) -> bytes:
        return b"".join(self.read_chunks(address, count))

    def read_chunks(self, address: int, count: int) -> Iterator[bytes]:
        self._check_range(address, count)
        return self.read_ranges((a, min(MAX_CHUNK, address + count - a))
                                for a in range(address, address + count, MAX_CHUNK))

    def read_ranges(self, ranges: Iterable[tuple[int, int]]) -> Iterator[bytes]:
        """The bytes of each (address, size ≤ one window) as one read chain. Like every access
        to the array, it waits for a page program still running: a busy chip ignores a read
        and the line shows 0xFF, which a fast link would otherwise take for the content."""
        return (data for data, _ in self._read_ranges(ranges, proving=False))

    def read_ranges_proven(self, ranges: Iterable[tuple[int, int]]) -> Iterator[tuple[bytes, bool]]:
        """As `read_ranges`, each with whether it provably came from the chip (RomSw.read_chain_proven)."""
        return self._read_ranges(ranges, proving=True)

    def _read_ranges(self, ranges: Iterable[tuple[int, int]], proving: bool) -> Iterator[tuple[bytes, bool]]:
        requests = []
        for address, size in ranges:
            if not 0 < size <= MAX_CHUNK:
                raise ValueError(f"a chained read takes 1..{MAX_CHUNK} bytes, not {size}")
            self._check_range(address, size)
            requests.append(Request(READ, address, 3, size))
        if self._busy is None:
            return self._chain(requests, None, proving)
        return self._read_after_busy(requests, proving)

    def _chain(self, requests: list[Request], start_after: float | None,
               proving: bool) -> Generator[tuple[bytes, bool], None, None]:
        if proving:
            return self.spi.read_chain_proven(requests, start_after)
        return ((data, False) for data in self.spi.read_chain(requests, start_after))

    def _read_after_busy(self, requests: list[Request], proving: bool) -> Iterator[tuple[bytes, bool]]:
        """A read chain led by a status read, which shows the chip idle before the array reads."""
        busy, self._busy = self._busy, None
        assert busy is not None
        clock = self.clock
        start_after: float | None = busy.ends
        while True:
            chain = self._chain([Request(RDSR1, count=1), *requests], start_after, proving)
            start_after = None
            sr1 = next(chain)[0][0]
            if not sr1 & protection.SR1_WIP:
                yield from chain
                return
            chain.close()          # the array reads behind it found the chip busy
            if clock.now() > busy.deadline:
                self._busy = busy
                self._idle()       # polls on, to report the chip too slow with its time (or stuck)
                yield from self._chain(requests, None, proving)
                return
            clock.sleep(POLL_INTERVAL)

    def _idle(self) -> None:
        """See the end of a page program still running before anything else goes to the chip."""
        busy, self._busy = self._busy, None
        if busy is None:
            return
        clock = self.clock
        clock.sleep(busy.ends - clock.now())
        busy_past_limit = False     # as in wait_ready: a read sent past the limit still saw WIP
        while True:
            asked = clock.now()
            sr1 = self.status()
            took = clock.now() - busy.started
            if not sr1 & protection.SR1_WIP:
                if busy_past_limit:
                    raise self._too_slow(busy.what, took, busy.maximum, PP)
                return
            busy_past_limit = busy_past_limit or asked > busy.deadline
            if took > max(GIVE_UP, 2 * (busy.deadline - busy.started)):
                raise FlashTimeout(f"flash still busy {took:.3f} s after {busy.what} (datasheet maximum "
                                   f"{busy.maximum:g} s, SR1={sr1:#04x}): the chip does not finish")
            clock.sleep(POLL_INTERVAL if clock.now() <= busy.deadline else max(POLL_INTERVAL, took / 20))

    def erase(self, address: int, size: int) -> None:
        etype = self._chip().erase_type(size)
        if etype.typical is None or etype.maximum is None:
            raise FlashError(f"no {size // 1024} KiB erase time is known for the {self._chip().name}")
        if address % size:
            raise ValueError(f"{size // 1024} KiB erase at {address:#x} is not aligned")
        self._check_range(address, size)
        self.write_enable()
        self.spi.command(etype.opcode, address, 3)
        # Timed from the end of the command on the wire: the chip went busy then.
        what = f"{size // 1024} KiB erase at {address:#08x}"
        self.wait_ready(etype.typical, etype.maximum, what, self.spi.last_end, etype.opcode)
        self._check_fail_flag("erase", what)

    def _check_fail_flag(self, kind: Literal["program", "erase"], what: str) -> None:
        """On parts that report failed programs and erases themselves (Macronix SCUR
        P_FAIL/E_FAIL), read the flag once the operation has ended: a set flag fails the
        operation at once, naming it, rather than leaving it to the read-back."""
        chip = self._chip()
        flags = chip.fail_flags
        if flags is None:
            return
        register = chip.registers[flags.register]
        value = self.status(register.read)
        bit = flags.program if kind == "program" else flags.erase
        if value >> bit & 1:
            name = "P_FAIL" if kind == "program" else "E_FAIL"
            raise FlashError(f"the chip reports that the {what} failed ({register.name}={value:#04x}: {name} set)")

    def chip_erase(self) -> None:
        """Erase the whole array (refused up front if anything is protected)."""
        chip = self._chip()
        if chip.chip_erase is None or chip.chip_erase.typical is None or chip.chip_erase.maximum is None:
            raise FlashError(f"no chip-erase command and time are known for the {chip.name}")
        if chip.protection is None:
            raise ProtectedError(f"{chip.name}: its protection layout is unknown")
        self.check_writable(0, chip.size)
        self.write_enable()
        self.spi.command(chip.chip_erase.opcode)
        self.wait_ready(chip.chip_erase.typical, chip.chip_erase.maximum, "chip erase", self.spi.last_end,
                        chip.chip_erase.opcode)
        self._check_fail_flag("erase", "chip erase")

    def program(self, address: int, data: bytes, on_page: Callable[[int], None] | None = None) -> int:
        """Program `data` (whole, aligned pages); all-0xFF pages are skipped. Returns pages written."""
        page_size = self._programming()[0]
        if address % page_size or len(data) % page_size:
            raise ValueError("program() takes whole, aligned pages")
        erased = b"\xff" * page_size
        pages = [address + o for o in range(0, len(data), page_size) if data[o:o + page_size] != erased]
        return self.program_pages(address, data, pages, on_page)

    def program_pages(self, base: int, data: bytes, pages: Sequence[int],
                      on_page: Callable[[int], None] | None = None) -> int:
        """Program the listed pages (absolute addresses) from `data`, which starts at `base`.

        Timed (the default fast path): returns with the last page still programming; the next
        operation on the chip sees its end. Checked: returns when the last page has ended.
        """
        page_size = self._programming()[0]
        self._check_range(base, len(data))
        for page in pages:
            offset = page - base
            if page % page_size or not 0 <= offset <= len(data) - page_size:
                raise ValueError(f"page {page:#x} is not an aligned page inside {base:#x}+{len(data):#x}")
        if self.spi.fast.timed_pages:
            self._program_timed(base, data, pages, on_page)
        else:
            self._program_checked(base, data, pages, on_page)
        if pages and self._chip().fail_flags is not None:
            # The flag describes the last page programmed: see its end, then read it.
            self._idle()
            self._check_fail_flag("program", f"page program at {pages[-1]:#08x}")
        return len(pages)

    def _program_timed(self, base: int, data: bytes, pages: Sequence[int],
                       on_page: Callable[[int], None] | None) -> None:
        page_size, typical, maximum = self._programming()
        spi = self.spi
        for page in pages:
            chunk = data[page - base:page - base + page_size]
            busy, self._busy = self._busy, None
            # The write enable goes out when the previous page should be done; its data is
            # loaded into the window meanwhile.
            spi.command(WREN, preload=chunk, start_after=busy.ends if busy else None)
            spi.command(PP, page, 3, chunk)
            self._busy = _Busy(spi.last_end + typical, spi.last_end + self.limit(PP, maximum),
                               f"page program at {page:#08x}", spi.last_end, maximum)
            if on_page:
                on_page(page)

    def _program_checked(self, base: int, data: bytes, pages: Sequence[int],
                         on_page: Callable[[int], None] | None) -> None:
        page_size, typical, maximum = self._programming()
        self._idle()
        pending: float | None = None   # end of a page whose completion is not yet seen
        for page in pages:
            self._enable_after(pending, maximum)
            self.spi.command(PP, page, 3, data[page - base:page - base + page_size])
            pending = self.spi.last_end
            if on_page:
                on_page(page)
        if pending is not None:
            self.wait_ready(typical, maximum, "page program", pending, PP)

    def check_programming(self, reason: str) -> None:
        """Program with a status read after every write enable from now on (a page may have
        been dropped: a write enable sent while the chip was still busy is ignored)."""
        self.spi.give_up("timed_pages", reason)

    def program_page(self, address: int, data: bytes) -> None:
        page_size, typical, maximum = self._programming()
        if not data or (address % page_size) + len(data) > page_size:
            raise ValueError(f"page program of {len(data)} bytes at {address:#x} crosses a page boundary")
        self._check_range(address, len(data))
        self.write_enable()
        self.spi.command(PP, address, 3, data)
        self.wait_ready(typical, maximum, f"page program at {address:#08x}", self.spi.last_end, PP)
        self._check_fail_flag("program", f"page program at {address:#08x}")

    def _enable_after(self, busy_since: float | None, maximum: float) -> None:
        """WREN that also waits out the previous page program (see module docstring)."""
        clock = self.clock
        landed_idle = False
        while True:
            self.spi.command(WREN)
            sr1 = self.status()
            if sr1 & protection.SR1_WEL and not sr1 & protection.SR1_WIP:
                return
            if not sr1 & protection.SR1_WIP:
                if landed_idle or busy_since is None:
                    raise FlashError(f"write enable failed (SR1={sr1:#04x})")
                landed_idle = True   # the WREN arrived while busy; the chip is idle now
                continue
            if busy_since is not None and clock.now() - busy_since > self.limit(PP, maximum):
                # Past the limit: see the end (or that there is none) and report the chip too slow.
                self.wait_ready(0.0, maximum, "page program", busy_since, PP)
            clock.sleep(POLL_INTERVAL)

    def _programming(self) -> tuple[int, float, float]:
        """(page size, typical, maximum page-program time), or why the part cannot be programmed."""
        chip = self._chip()
        if not chip.page_size or not chip.page_program:
            raise FlashError(f"no page size and page-program time are known for the {chip.name}")
        return chip.page_size, *chip.page_program

    def _chip(self) -> ChipInfo:
        if self.chip is None:
            raise FlashError("flash not identified yet")
        return self.chip

    def _check_range(self, address: int, size: int) -> None:
        total = self._chip().size
        if address < 0 or size < 0 or address + size > total:
            raise ValueError(f"range {address:#x}+{size:#x} is outside the {total // 1024} KiB flash")
