"""The SPI NOR command set over the ROM_SW engine: identify, read, erase, program, protect.

Busy handling follows the chip table: the first wait is about the typical time of the
operation, the give-up point its datasheet maximum, and the end of a busy period is seen
in a status read before anything else goes to the chip:

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
from typing import Callable, Iterable, Iterator, Sequence

from amdflash.stages.flash import protection, sfdp
from amdflash.stages.flash.chips import ChipInfo, EraseType, match_jedec
from amdflash.stages.navi31.romsw import Request, RomSw

# Opcodes (JEDEC standard; GD25LQ16E per docs/flash-chip.md).
READ, PP = 0x03, 0x02
RDSR1, RDSR2, RDSR3 = 0x05, 0x35, 0x15
WRSR, WREN, WRDI = 0x01, 0x06, 0x04
RDID, RDSFDP, RDUID = 0x9F, 0x5A, 0x4B

MAX_CHUNK = 0x100
POLL_INTERVAL = 100e-6


class FlashError(RuntimeError):
    pass


class FlashTimeout(FlashError, TimeoutError):
    pass


class ProtectedError(FlashError):
    """A write would touch an area the chip protects (and would silently ignore)."""


@dataclass(frozen=True)
class FlashIdentity:
    jedec_capture: bytes
    chip: ChipInfo
    sr1: int
    sr2: int
    sr3: int
    sfdp: sfdp.Sfdp | None
    sfdp_error: str | None
    unique_id: bytes
    protection: protection.Protection

    @property
    def cmp(self) -> bool:
        return bool(self.sr2 & protection.SR2_CMP)


@dataclass(frozen=True)
class _Busy:
    """A page program whose end has not been seen yet."""

    ends: float          # about when it ends (typical time after its SPI time)
    deadline: float      # its datasheet maximum: still busy then, the chip has failed
    what: str


class SpiNor:
    def __init__(self, spi: RomSw, chip: ChipInfo | None = None):
        self.spi = spi
        self.chip = chip
        self.clock = spi.bar.clock
        self._busy: _Busy | None = None

    # -- identification ---------------------------------------------------------------------
    def rdid(self) -> bytes:
        return self.spi.read(RDID, count=4)

    def identify(self) -> FlashIdentity:
        self._idle()
        capture = self.rdid()
        chip = match_jedec(capture)
        if chip is None:
            raise FlashError(f"unexpected JEDEC capture {capture.hex(' ')}: no known chip "
                             "(expected GD25LQ16E C8 60 15); is the flash powered and the pad setup right?")
        self.chip = chip
        sr1, sr2, sr3 = self.status(RDSR1), self.status(RDSR2), self.status(RDSR3)
        table, error = None, None
        try:
            table = self.read_sfdp()
        except sfdp.SfdpError as e:
            error = str(e)
        uid = self.spi.read(RDUID, 0, 3, 17)[1:]  # one dummy byte leads the 16 ID bytes
        return FlashIdentity(capture, chip, sr1, sr2, sr3, table, error, uid,
                             protection.decode(sr1, sr2, chip.size))

    def read_sfdp(self) -> sfdp.Sfdp:
        # 5Ah sends one dummy byte after the address; it arrives as the first RX byte.
        header = self.spi.read(RDSFDP, 0, 3, 17)[1:]
        revision, pointer, length = sfdp.parse_header(header)
        if not 9 <= length <= 63:
            raise sfdp.SfdpError(f"basic flash parameter table length {length} dwords is implausible")
        bfpt = self.spi.read(RDSFDP, pointer, 3, length * 4 + 1)[1:]
        return sfdp.parse_bfpt(revision, bfpt)

    # -- status -----------------------------------------------------------------------------
    def status(self, opcode: int = RDSR1) -> int:
        return self.spi.read(opcode, count=1)[0]

    def protection(self) -> protection.Protection:
        return protection.decode(self.status(RDSR1), self.status(RDSR2), self._chip().size)

    def write_enable(self) -> None:
        self._idle()
        self.spi.command(WREN)
        sr1 = self.status()
        if not sr1 & protection.SR1_WEL or sr1 & protection.SR1_WIP:
            raise FlashError(f"write enable failed (SR1={sr1:#04x})")

    def wait_ready(self, typical: float, maximum: float, what: str, started: float | None = None) -> int:
        """Wait for WIP to clear: first about `typical`, then poll until `maximum`."""
        clock = self.clock
        started = clock.now() if started is None else started
        remaining = typical - (clock.now() - started)
        if remaining > 0:
            clock.sleep(remaining)
        interval = max(typical / 20, 100e-6)
        while True:
            sr1 = self.status()
            if not sr1 & protection.SR1_WIP:
                return sr1
            if clock.now() - started > maximum:
                raise FlashTimeout(f"flash still busy {clock.now() - started:.3f} s after {what} "
                                   f"(datasheet maximum {maximum:g} s, SR1={sr1:#04x})")
            clock.sleep(interval)

    # -- protection -------------------------------------------------------------------------
    def check_writable(self, address: int, size: int, prot: protection.Protection | None = None) -> None:
        prot = prot or self.protection()
        if prot.overlaps(address, size):
            hint = " (SR2.CMP is set: clearing it needs explicit permission, --clear-cmp)" if prot.cmp else ""
            raise ProtectedError(f"refusing to write {address:#08x}-{address + size - 1:#08x}: "
                                 f"the chip protects it, {prot.describe()}{hint}")

    def clear_cmp(self) -> bool:
        """Clear SR2.CMP, preserving every other protection and QE bit. False if already clear."""
        self._idle()
        sr1, sr2 = self.status(RDSR1), self.status(RDSR2)
        if not sr2 & protection.SR2_CMP:
            return False
        self.write_enable()
        # WIP and WEL are not writable; LB bits are written back as read, so nothing is locked.
        self.spi.command(WRSR, tx=bytes((sr1 & 0xFC, sr2 & ~protection.SR2_CMP & 0xFF)))
        typical, maximum = self._chip().status_write
        self.wait_ready(typical, maximum, "write status", self.spi.last_end)
        new_sr2 = self.status(RDSR2)
        if new_sr2 & protection.SR2_CMP:
            raise FlashError(f"SR2.CMP did not clear (SR2={new_sr2:#04x}); the status register may be locked (SRP)")
        return True

    # -- array operations -------------------------------------------------------------------
    def read(self, address: int, count: int) -> bytes:
        return b"".join(self.read_chunks(address, count))

    def read_chunks(self, address: int, count: int) -> Iterator[bytes]:
        self._check_range(address, count)
        requests = [Request(READ, a, 3, min(MAX_CHUNK, address + count - a))
                    for a in range(address, address + count, MAX_CHUNK)]
        if self._busy is None:
            return self.spi.read_chain(requests)
        return self._read_after_busy(requests)

    def _read_after_busy(self, requests: Iterable[Request]) -> Iterator[bytes]:
        """A read chain led by a status read, which shows the chip idle before the array reads."""
        busy, self._busy = self._busy, None
        assert busy is not None
        clock = self.clock
        start_after: float | None = busy.ends
        while True:
            chain = self.spi.read_chain([Request(RDSR1, count=1), *requests], start_after)
            start_after = None
            sr1 = next(chain)[0]
            if not sr1 & protection.SR1_WIP:
                yield from chain
                return
            chain.close()          # the array reads behind it found the chip busy
            if clock.now() > busy.deadline:
                raise FlashTimeout(f"flash still busy after {busy.what} past its datasheet maximum (SR1={sr1:#04x})")
            clock.sleep(POLL_INTERVAL)

    def _idle(self) -> None:
        """See the end of a page program still running before anything else goes to the chip."""
        busy, self._busy = self._busy, None
        if busy is None:
            return
        clock = self.clock
        clock.sleep(busy.ends - clock.now())
        while True:
            sr1 = self.status()
            if not sr1 & protection.SR1_WIP:
                return
            if clock.now() > busy.deadline:
                raise FlashTimeout(f"flash still busy after {busy.what} past its datasheet maximum (SR1={sr1:#04x})")
            clock.sleep(POLL_INTERVAL)

    def erase(self, address: int, size: int) -> None:
        etype = self._chip().erase_type(size)
        if address % size:
            raise ValueError(f"{size // 1024} KiB erase at {address:#x} is not aligned")
        self._check_range(address, size)
        self.write_enable()
        self.spi.command(etype.opcode, address, 3)
        # Timed from the end of the command on the wire: the chip went busy then.
        self.wait_ready(etype.typical, etype.maximum, f"{size // 1024} KiB erase at {address:#08x}",
                        self.spi.last_end)

    def chip_erase(self) -> None:
        """Erase the whole array (refused up front if anything is protected)."""
        chip = self._chip()
        self.check_writable(0, chip.size)
        self.write_enable()
        self.spi.command(chip.chip_erase.opcode)
        self.wait_ready(chip.chip_erase.typical, chip.chip_erase.maximum, "chip erase", self.spi.last_end)

    def program(self, address: int, data: bytes, on_page: Callable[[int], None] | None = None) -> int:
        """Program `data` (whole, aligned pages); all-0xFF pages are skipped. Returns pages written."""
        page_size = self._chip().page_size
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
        chip = self._chip()
        page_size = chip.page_size
        self._check_range(base, len(data))
        for page in pages:
            offset = page - base
            if page % page_size or not 0 <= offset <= len(data) - page_size:
                raise ValueError(f"page {page:#x} is not an aligned page inside {base:#x}+{len(data):#x}")
        if self.spi.fast.timed_pages:
            self._program_timed(base, data, pages, on_page)
        else:
            self._program_checked(base, data, pages, on_page)
        return len(pages)

    def _program_timed(self, base: int, data: bytes, pages: Sequence[int],
                       on_page: Callable[[int], None] | None) -> None:
        typical, maximum = self._chip().page_program
        page_size = self._chip().page_size
        spi = self.spi
        for page in pages:
            chunk = data[page - base:page - base + page_size]
            busy, self._busy = self._busy, None
            # The write enable goes out when the previous page should be done; its data is
            # loaded into the window meanwhile.
            spi.command(WREN, preload=chunk, start_after=busy.ends if busy else None)
            spi.command(PP, page, 3, chunk)
            self._busy = _Busy(spi.last_end + typical, spi.last_end + maximum, f"page program at {page:#08x}")
            if on_page:
                on_page(page)

    def _program_checked(self, base: int, data: bytes, pages: Sequence[int],
                         on_page: Callable[[int], None] | None) -> None:
        typical, maximum = self._chip().page_program
        page_size = self._chip().page_size
        self._idle()
        pending: float | None = None   # end of a page whose completion is not yet seen
        for page in pages:
            self._enable_after(pending, maximum)
            self.spi.command(PP, page, 3, data[page - base:page - base + page_size])
            pending = self.spi.last_end
            if on_page:
                on_page(page)
        if pending is not None:
            self.wait_ready(typical, maximum, "page program", pending)

    def check_programming(self, reason: str) -> None:
        """Program with a status read after every write enable from now on (a page may have
        been dropped: a write enable sent while the chip was still busy is ignored)."""
        self.spi.give_up("timed_pages", reason)

    def program_page(self, address: int, data: bytes) -> None:
        page_size = self._chip().page_size
        if not data or (address % page_size) + len(data) > page_size:
            raise ValueError(f"page program of {len(data)} bytes at {address:#x} crosses a page boundary")
        self._check_range(address, len(data))
        self.write_enable()
        self.spi.command(PP, address, 3, data)
        typical, maximum = self._chip().page_program
        self.wait_ready(typical, maximum, f"page program at {address:#08x}", self.spi.last_end)

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
            if busy_since is not None and clock.now() - busy_since > maximum:
                raise FlashTimeout(f"flash still busy {clock.now() - busy_since:.4f} s after a page program "
                                   f"(datasheet maximum {maximum:g} s, SR1={sr1:#04x})")
            clock.sleep(POLL_INTERVAL)

    def _chip(self) -> ChipInfo:
        if self.chip is None:
            raise FlashError("flash not identified yet")
        return self.chip

    def _check_range(self, address: int, size: int) -> None:
        total = self._chip().size
        if address < 0 or size < 0 or address + size > total:
            raise ValueError(f"range {address:#x}+{size:#x} is outside the {total // 1024} KiB flash")

    def erase_plan_types(self) -> tuple[EraseType, ...]:
        return self._chip().erase_types
