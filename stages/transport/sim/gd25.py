"""GigaDevice GD25LQ16E SPI NOR flash model (HARDWARE.md §7).

One `transaction()` is one chip-select assertion: `out` is shifted in (opcode, address,
TX data), then `rx_len` bytes are clocked out. SPI is full duplex, so the model counts
clocks: a command has a header (opcode, address, dummy bytes); every byte clocked after
the header carries data, whether the host was sending TX bytes or receiving at the time.

Modelling decisions (the datasheet leaves them open, or the model has to pick one):

* Bus: while the chip does not drive SO (dummy cycles, unknown opcodes, commands that
  return nothing, deep power-down, busy) the host reads 0xFF, as a pulled-up line shows.
* Incomplete or over-long commands: a command whose CS# rises early is ignored; so is a
  command that acts at CS# rise (program, erase, status writes, 06/04/50/B9/66/99/75/7A)
  when CS# rises later than its last byte (extra TX bytes or RX clocks). Address bytes of
  a read must come from `out`: we cannot know what the engine drives on SI while it
  receives, so a read without its full address returns 0xFF and does nothing. Dummy
  bytes are don't-care, so they may be TX bytes or the first RX clocks.
* Page program keeps only the last 256 bytes it was sent, each at its column modulo 256
  (the page wraps); data ANDs into the array. More than 256 bytes: the earlier ones are
  discarded, as GigaDevice documents.
* WEL-gated commands the chip refuses (target protected by BP/TB/SEC/CMP, status register
  locked by SRP, security register locked by LB, conflicting with a suspended operation)
  clear WEL and change nothing. 20h/52h/D8h are refused whole if any byte of the block is
  protected; chip erase is refused if anything is protected.
* The protection decoder is §7's, cell for cell — including SEC=1 with BP=6, which §7
  caps at 32 KiB while GigaDevice's 16 Mbit tables list BP2..BP1 = 11 as "everything".
* Busy: the typical times of §7 on the virtual clock; content changes at command time and
  the chip reports WIP (and WEL) until the time has passed. While busy only 05/35/15 and
  75 are heard. On the 'ideal' profile everything completes at once. Security-register
  program/erase take the page-program/4 KiB-erase times. Volatile status writes (after
  50h) take effect at once with no busy time. Deep power-down entry/exit (tDP, tRES1),
  suspend latency and reset recovery are not modelled (0 s).
* Read-back: 9Fh repeats C8 60 15; 90h repeats its two-byte pair (C8 14, or 14 C8 with
  address bit 0 set); ABh repeats 14; 05/35/15 repeat the register; 4Bh repeats the
  16-byte unique ID; SFDP reads 0xFF beyond the table; 03h/0Bh wrap at the end of the array.
* Status registers: the chip works from a volatile copy (what 05/35/15 return); a normal
  write updates it and the non-volatile copy, a write after 50h only the volatile one; the
  50h enable stays armed until a status write uses it or 06h/04h/reset cancels it (the
  engine re-sends opcodes and polls status in between, so "the very next command" would
  never survive). 01h with one data byte writes SR1 only, SR2 is unchanged. SR3 has two
  writable bits, DRV0/DRV1 (bits 5, 6); the rest reads 0. A fresh chip has SR1=SR2=SR3=0
  apart from `sim create --bp/--cmp`: QE=0 (an ordering option without factory-set QE).
* SRP: WP# is assumed high (inactive). SRP1=0 → writable (SRP0 alone only acts with WP#
  low). SRP1=1, SRP0=0 is the power-supply lock-down: the register is locked until a power
  cycle, and the board is never power-cycled, so it stays locked (a software reset reloads
  the non-volatile copy, which keeps a non-volatile lock). SRP1=1, SRP0=1 locks for good.
* OTP: three 512-byte security registers at 0x001000/0x002000/0x003000 (A15..A12 select
  1..3, A8..A0 the byte, A11..A9 don't care; other addresses read 0xFF and are not
  written), as the GD25LQ16E/GD25LE16C parameters of vendor security-register drivers
  give them. They erase to 0xFF and are not covered by BP/CMP, only by LB1..LB3 (SR2
  bits 3..5), which are one-time programmable: a 1 written by a non-volatile 01h/31h
  stays 1 for ever; volatile writes do not touch them.
* Suspend (75h) is accepted during a 4K/32K/64K erase or a page program, not during chip
  erase, status or security-register writes, and not while already suspended. It sets
  SUS1 (erase) or SUS2 (program) in SR2, drops WIP and clears WEL. While erase-suspended
  the chip reads everything (the suspended block reads as its new content — real silicon
  reads undefined data there) and programs outside the suspended block; erases, status
  writes, security-register writes and (while program-suspended) programs are refused.
  7Ah resumes the remaining busy time.
* Reset (66h immediately followed by 99h; any other command in between disarms it):
  reloads the status registers from the non-volatile copy (WEL, SUS bits and volatile
  values lost), disarms 50h, abandons a suspended operation (its content change, already
  applied, stays) and is ignored while busy, like everything else.
* The PSP's controller (`psp_update`) is refused — False, nothing written, WEL clear — if
  any covered 4 KiB sector is protected, in deep power-down, or while an operation is
  suspended. Otherwise it returns True even when faults spoil the result (it does not
  verify), queues behind a running operation and keeps the chip busy for one 4 KiB erase
  per sector plus one page program per page that is not all 0xFF.
* Deep power-down (B9h): only ABh is heard, which releases it (ABh's ID bytes are clocked
  out in either state); the aperture reads 0xFF; the PSP's controller cannot write.
* Faults: stuck bits read 1 whatever the array holds (so programming cannot clear them and
  erasing leaves them 1); erase-fail sectors keep their content through any erase.
* State: everything lives in the board's "chip" region, so a new host process finds the
  chip exactly as the last one left it (the board stays powered). The security
  registers are the "otp" region, formatted to 0xFF the first time a chip is opened.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from amdflash.stages.transport.sim import command_log
from amdflash.stages.transport.sim.sfdp_table import SFDP_TABLE

if TYPE_CHECKING:
    from amdflash.stages.transport.sim.board import Board

FLASH_SIZE = 0x200000
PAGE_SIZE = 0x100
SECTOR_SIZE = 0x1000

MANUFACTURER_ID = 0xC8
DEVICE_ID = 0x14
JEDEC_ID = bytes((0xC8, 0x60, 0x15))

# SR1
WIP, WEL, BP_MASK, TB, SEC, SRP0 = 0x01, 0x02, 0x1C, 0x20, 0x40, 0x80
# SR2
SRP1, QE, SUS2, LB_MASK, CMP, SUS1 = 0x01, 0x02, 0x04, 0x38, 0x40, 0x80
SR1_WRITABLE = 0xFC
SR2_WRITABLE = SRP1 | QE | CMP        # LB bits are handled apart: they only ever set
SR3_WRITABLE = 0x60                   # DRV0, DRV1

# Typical busy times of HARDWARE.md §7, in seconds, by the opcode that starts them.
BUSY_SECONDS: dict[int, float] = {
    0x02: 0.5e-3, 0x20: 50e-3, 0x52: 150e-3, 0xD8: 250e-3, 0x60: 8.0, 0xC7: 8.0,
    0x01: 5e-3, 0x31: 5e-3, 0x11: 5e-3, 0x42: 0.5e-3, 0x44: 50e-3,
}
ERASE_SIZES: dict[int, int] = {0x20: 0x1000, 0x52: 0x8000, 0xD8: 0x10000}
SUSPENDABLE = {0x02: SUS2, 0x20: SUS1, 0x52: SUS1, 0xD8: SUS1}
PSP_UPDATE = 0xFF                     # busy kind of a PSP-controller update (not an opcode)

SECURITY_REGISTERS = 3
SECURITY_REGISTER_SIZE = 0x200

# Chip region layout (0x200 bytes).
MAGIC = b"GD25"
LAYOUT_VERSION = 1
_VERSION, _OTP_READY = 4, 5
_SR1, _SR2, _SR3 = 8, 9, 10           # volatile copy: what the chip acts on
_NV1, _NV2, _NV3 = 12, 13, 14         # non-volatile copy
_FLAGS = 16
_BUSY_KIND = 17                       # opcode of the operation in progress, 0 = idle
_SUSPENDED_KIND = 18
_DOUBLES = slice(0x18, 0x28)          # busy_until, suspended_remaining
_WORDS = slice(0x28, 0x38)            # busy range lo/hi, suspended range lo/hi
_BUSY_UNTIL, _SUSPENDED_REMAINING = 0, 1
_BUSY_LO, _BUSY_HI, _SUSPENDED_LO, _SUSPENDED_HI = 0, 1, 2, 3
CHIP_REGION_SIZE = 0x200

F_DEEP_POWER_DOWN = 0x01
F_VOLATILE_ARMED = 0x02
F_RESET_ARMED = 0x04

_FF256 = b"\xff" * PAGE_SIZE


def _ff(n: int) -> bytes:
    return b"\xff" * n


def _repeat(pattern: bytes, phase: int, n: int) -> bytes:
    """`n` bytes of an endlessly repeated `pattern`, starting `phase` bytes into it."""
    if n <= 0:
        return b""
    reps = (phase % len(pattern) + n) // len(pattern) + 1
    start = phase % len(pattern)
    return (pattern * reps)[start:start + n]


def protected_range(sr1: int, sr2: int) -> tuple[int, int]:
    """[start, end) protected by BP2..0, TB, SEC and CMP (flashrom's spi25 decoder, 2 MiB)."""
    bp = (sr1 & BP_MASK) >> 2
    if bp == 0:
        length = 0
    elif bp == 7:
        length = FLASH_SIZE
    elif sr1 & SEC:
        length = min(0x1000 << (bp - 1), 0x8000)
    else:
        length = min(0x10000 << (bp - 1), FLASH_SIZE)
    start = 0 if sr1 & TB else FLASH_SIZE - length
    if sr2 & CMP:
        # The complement of a range anchored at one end is anchored at the other end.
        start, length = (length, FLASH_SIZE - length) if start == 0 else (0, FLASH_SIZE - length)
    return start, start + length


class Gd25Chip:
    def __init__(self, board: "Board"):
        self.board = board
        self.flash = board.files.flash
        self._clock = board.clock
        self._physical = board.cost.physical
        self._state = board.files.region("chip")
        self._times = self._state[_DOUBLES].cast("d")
        self._ranges = self._state[_WORDS].cast("I")
        self._otp = board.files.region("otp")
        self._unique_id = _unique_id(board.config.get("unique_id"))
        stuck: dict[int, int] = {}
        for address, bit in board.faults.stuck_bits:
            stuck[address] = stuck.get(address, 0) | 1 << bit
        self._stuck = sorted(stuck.items())
        self._erase_fail = set(board.faults.erase_fail)
        if bytes(self._state[0:4]) != MAGIC:
            # A board made before this model existed: a fresh chip with all bits clear.
            self._state[0:CHIP_REGION_SIZE] = self.initial_state(cmp=False, bp=0)
        if not self._state[_OTP_READY]:
            self._otp[0:SECURITY_REGISTERS * SECURITY_REGISTER_SIZE] = \
                _ff(SECURITY_REGISTERS * SECURITY_REGISTER_SIZE)
            self._state[_OTP_READY] = 1
        self._handlers: dict[int, Callable[[bytes, int], bytes]] = {
            0x03: self._read, 0x0B: self._fast_read,
            0x02: self._page_program,
            0x20: self._block_erase, 0x52: self._block_erase, 0xD8: self._block_erase,
            0x60: self._chip_erase, 0xC7: self._chip_erase,
            0x05: self._read_status, 0x35: self._read_status, 0x15: self._read_status,
            0x01: self._write_status, 0x31: self._write_status, 0x11: self._write_status,
            0x06: self._write_enable, 0x04: self._write_disable,
            0x50: self._volatile_enable,
            0x9F: self._read_jedec, 0x90: self._read_manufacturer_device,
            0xAB: self._release_power_down, 0xB9: self._deep_power_down,
            0x4B: self._read_unique_id, 0x5A: self._read_sfdp,
            0x48: self._read_security, 0x42: self._program_security,
            0x44: self._erase_security,
            0x66: self._reset_enable,   # 99h acts only when armed: see transaction()
            0x75: self._suspend, 0x7A: self._resume,
        }

    # -- the wire --------------------------------------------------------------------------
    def transaction(self, out: bytes, rx_len: int) -> bytes:
        if not out:
            return _ff(rx_len)
        op = out[0]
        if op in command_log.LOGGED:
            command_log.record(self.board.path, out)
        state = self._state
        if state[_BUSY_KIND]:
            now = self._clock.now()
            if now < self._times[_BUSY_UNTIL]:
                if op in (0x05, 0x35, 0x15):
                    return self._read_status(out, rx_len)
                if op == 0x75:
                    return self._suspend(out, rx_len)
                return _ff(rx_len)
            self._finish_operation()
        flags = state[_FLAGS]
        if flags:
            if flags & F_DEEP_POWER_DOWN:
                return self._release_power_down(out, rx_len) if op == 0xAB else _ff(rx_len)
            if flags & F_RESET_ARMED and op != 0x66:
                state[_FLAGS] = flags & ~F_RESET_ARMED
                if op == 0x99:
                    return self._reset(out, rx_len)
        if op == 0x03 and len(out) == 4:
            # The hot path: the engine reads the array 256 bytes at a time.
            address = out[1] << 16 | out[2] << 8 | out[3]
            if not self._stuck and address + rx_len <= FLASH_SIZE:
                return self.flash[address:address + rx_len]
        handler = self._handlers.get(op)
        return handler(out, rx_len) if handler else _ff(rx_len)

    def aperture_read(self, address: int, size: int) -> bytes:
        state = self._state
        if state[_BUSY_KIND] or state[_FLAGS]:
            if state[_BUSY_KIND]:
                if self._clock.now() < self._times[_BUSY_UNTIL]:
                    return _ff(size)
                self._finish_operation()
            flags = state[_FLAGS]
            if flags & F_DEEP_POWER_DOWN:
                return _ff(size)
            # The SMUIO controller's read is a command on the wire: it disarms a reset.
            state[_FLAGS] = flags & ~F_RESET_ARMED
        if not self._stuck and address + size <= FLASH_SIZE:
            return self.flash[address:address + size]
        return self._array(address, size)

    def psp_update(self, address: int, data: bytes) -> bool:
        """The PSP's own controller: erase the covering sectors, program them back merged."""
        if not data:
            return True
        end = address + len(data)
        if address < 0 or end > FLASH_SIZE:
            return False
        state = self._state
        now = self._clock.now()
        if state[_BUSY_KIND] and now >= self._times[_BUSY_UNTIL]:
            self._finish_operation()
        if state[_FLAGS] & F_DEEP_POWER_DOWN or state[_SR2] & (SUS1 | SUS2):
            return False
        lo, hi = address & ~(SECTOR_SIZE - 1), (end + SECTOR_SIZE - 1) & ~(SECTOR_SIZE - 1)
        if self._protected(lo, hi):
            state[_SR1] &= ~WEL
            return False
        merged = bytearray(self._array(lo, hi - lo))
        merged[address - lo:end - lo] = data
        seconds = 0.0
        for sector in range(lo, hi, SECTOR_SIZE):
            self._erase(sector, sector + SECTOR_SIZE)
            seconds += BUSY_SECONDS[0x20]
            for page in range(sector, sector + SECTOR_SIZE, PAGE_SIZE):
                content = bytes(merged[page - lo:page - lo + PAGE_SIZE])
                if content != _FF256:
                    self._program_page(page, content)
                    seconds += BUSY_SECONDS[0x02]
        state[_SR1] &= ~WEL
        if self._physical:
            # The PSP's controller polls WIP too: its work queues behind a running operation.
            start = max(now, self._times[_BUSY_UNTIL]) if state[_BUSY_KIND] else now
            self._times[_BUSY_UNTIL] = start + seconds
            state[_BUSY_KIND] = PSP_UPDATE
            self.board.count("flash_busy_seconds", seconds)
        return True

    @staticmethod
    def initial_state(cmp: bool, bp: int) -> bytes:
        if not 0 <= bp <= 7:
            raise ValueError("bp must be 0..7 (BP2..BP0)")
        region = bytearray(CHIP_REGION_SIZE)
        region[0:4] = MAGIC
        region[_VERSION] = LAYOUT_VERSION
        region[_SR1] = region[_NV1] = bp << 2
        region[_SR2] = region[_NV2] = CMP if cmp else 0
        return bytes(region)

    def close(self) -> None:
        for view in (self._times, self._ranges, self._state, self._otp):
            view.release()

    # -- state helpers ---------------------------------------------------------------------
    def _finish_operation(self) -> None:
        self._state[_BUSY_KIND] = 0
        self._state[_SR1] &= ~WEL

    def _start_operation(self, kind: int, lo: int = 0, hi: int = 0) -> None:
        """WEL stays set while the chip is busy and clears when the operation completes."""
        if not self._physical:
            self._state[_SR1] &= ~WEL
            return
        seconds = BUSY_SECONDS[kind]
        self._times[_BUSY_UNTIL] = self._clock.now() + seconds
        self._ranges[_BUSY_LO], self._ranges[_BUSY_HI] = lo, hi
        self._state[_BUSY_KIND] = kind
        self.board.count("flash_busy_seconds", seconds)

    def _refuse(self) -> bytes:
        self._state[_SR1] &= ~WEL
        return b""

    def _protected(self, lo: int, hi: int) -> bool:
        start, end = protected_range(self._state[_SR1], self._state[_SR2])
        return start < end and lo < end and start < hi

    def _array(self, address: int, size: int) -> bytes:
        """The array as the chip reads it: wrapping at the top, stuck bits showing 1."""
        address %= FLASH_SIZE
        if address + size <= FLASH_SIZE:
            data = self.flash[address:address + size]
        else:
            out = bytearray()
            while len(out) < size:
                take = min(size - len(out), FLASH_SIZE - address)
                out += self.flash[address:address + take]
                address = (address + take) % FLASH_SIZE
            data = bytes(out)
            address = (address - size) % FLASH_SIZE
        if not self._stuck:
            return data
        patched = bytearray(data)
        for stuck_address, mask in self._stuck:
            offset = (stuck_address - address) % FLASH_SIZE
            if offset < size:
                patched[offset] |= mask
                while offset + FLASH_SIZE < size:
                    offset += FLASH_SIZE
                    patched[offset] |= mask
        return bytes(patched)

    def _program_page(self, page: int, latch: bytes) -> None:
        old = self.flash[page:page + PAGE_SIZE]
        new = int.from_bytes(old, "big") & int.from_bytes(latch, "big")
        self.flash[page:page + PAGE_SIZE] = new.to_bytes(PAGE_SIZE, "big")

    def _erase(self, lo: int, hi: int) -> None:
        fail = self._erase_fail
        if not fail:
            self.flash[lo:hi] = _ff(hi - lo)
            return
        for sector in range(lo, hi, SECTOR_SIZE):
            if sector // SECTOR_SIZE not in fail:
                self.flash[sector:sector + SECTOR_SIZE] = _ff(SECTOR_SIZE)

    def _suspended(self) -> int:
        return self._state[_SR2] & (SUS1 | SUS2)

    # -- reads -----------------------------------------------------------------------------
    @staticmethod
    def _lead(n_out: int, header: int, rx_len: int) -> tuple[int, int]:
        """(RX bytes still inside the header, data bytes already clocked during TX)."""
        if n_out < header:
            lead = min(header - n_out, rx_len)
            return lead, 0
        return 0, n_out - header

    def _read_from(self, out: bytes, rx_len: int, header: int) -> bytes:
        if len(out) < 4:
            return _ff(rx_len)
        lead, skip = self._lead(len(out), header, rx_len)
        address = (out[1] << 16 | out[2] << 8 | out[3]) + skip
        return _ff(lead) + self._array(address, rx_len - lead)

    def _read(self, out: bytes, rx_len: int) -> bytes:
        return self._read_from(out, rx_len, 4)

    def _fast_read(self, out: bytes, rx_len: int) -> bytes:
        return self._read_from(out, rx_len, 5)

    def _read_status(self, out: bytes, rx_len: int) -> bytes:
        op = out[0]
        state = self._state
        if op == 0x05:
            value = state[_SR1]
            if state[_BUSY_KIND] and self._clock.now() < self._times[_BUSY_UNTIL]:
                value |= WIP
        else:
            value = state[_SR2] if op == 0x35 else state[_SR3]
        return bytes((value,)) * rx_len

    def _pattern(self, out: bytes, rx_len: int, header: int, pattern: bytes) -> bytes:
        lead, skip = self._lead(len(out), header, rx_len)
        return _ff(lead) + _repeat(pattern, skip, rx_len - lead)

    def _read_jedec(self, out: bytes, rx_len: int) -> bytes:
        return self._pattern(out, rx_len, 1, JEDEC_ID)

    def _read_manufacturer_device(self, out: bytes, rx_len: int) -> bytes:
        if len(out) < 4:
            return _ff(rx_len)
        pair = bytes((DEVICE_ID, MANUFACTURER_ID)) if out[3] & 1 else bytes((MANUFACTURER_ID, DEVICE_ID))
        return self._pattern(out, rx_len, 4, pair)

    def _read_unique_id(self, out: bytes, rx_len: int) -> bytes:
        return self._pattern(out, rx_len, 5, self._unique_id)

    def _read_sfdp(self, out: bytes, rx_len: int) -> bytes:
        if len(out) < 4:
            return _ff(rx_len)
        lead, skip = self._lead(len(out), 5, rx_len)
        address = (out[1] << 16 | out[2] << 8 | out[3]) + skip
        data = SFDP_TABLE[address:address + rx_len - lead]
        return _ff(lead) + data + _ff(rx_len - lead - len(data))

    # -- identification and power ----------------------------------------------------------
    def _release_power_down(self, out: bytes, rx_len: int) -> bytes:
        # Release happens at CS# rise, whether or not the ID was clocked out.
        self._state[_FLAGS] &= ~F_DEEP_POWER_DOWN
        return self._pattern(out, rx_len, 4, bytes((DEVICE_ID,)))

    def _deep_power_down(self, out: bytes, rx_len: int) -> bytes:
        if len(out) == 1 and not rx_len:
            self._state[_FLAGS] |= F_DEEP_POWER_DOWN
        return _ff(rx_len)

    # -- write enable, status writes -------------------------------------------------------
    def _write_enable(self, out: bytes, rx_len: int) -> bytes:
        if len(out) == 1 and not rx_len:
            self._state[_SR1] |= WEL
            self._state[_FLAGS] &= ~F_VOLATILE_ARMED
        return _ff(rx_len)

    def _write_disable(self, out: bytes, rx_len: int) -> bytes:
        if len(out) == 1 and not rx_len:
            self._state[_SR1] &= ~WEL
            self._state[_FLAGS] &= ~F_VOLATILE_ARMED
        return _ff(rx_len)

    def _volatile_enable(self, out: bytes, rx_len: int) -> bytes:
        if len(out) == 1 and not rx_len:
            self._state[_FLAGS] |= F_VOLATILE_ARMED
        return _ff(rx_len)

    def _write_status(self, out: bytes, rx_len: int) -> bytes:
        op, n = out[0], len(out)
        if rx_len or not (n == 2 or (op == 0x01 and n == 3)):
            return _ff(rx_len)
        state = self._state
        volatile = bool(state[_FLAGS] & F_VOLATILE_ARMED)
        if not volatile and not state[_SR1] & WEL:
            return b""
        state[_FLAGS] &= ~F_VOLATILE_ARMED
        if self._suspended() or state[_SR2] & SRP1:
            return self._refuse()
        if op == 0x01:
            self._set_register(_SR1, _NV1, out[1], SR1_WRITABLE, volatile)
            if n == 3:
                self._set_sr2(out[2], volatile)
        elif op == 0x31:
            self._set_sr2(out[1], volatile)
        else:
            self._set_register(_SR3, _NV3, out[1], SR3_WRITABLE, volatile)
        if not volatile:
            self._start_operation(op)
        return b""

    def _set_register(self, active: int, nonvolatile: int, value: int, writable: int,
                      volatile: bool) -> None:
        state = self._state
        state[active] = (state[active] & ~writable) | (value & writable)
        if not volatile:
            state[nonvolatile] = (state[nonvolatile] & ~writable) | (value & writable)

    def _set_sr2(self, value: int, volatile: bool) -> None:
        self._set_register(_SR2, _NV2, value, SR2_WRITABLE, volatile)
        if not volatile:
            # One-time programmable: a lock bit, once 1, is 1 for ever.
            self._state[_SR2] |= value & LB_MASK
            self._state[_NV2] |= value & LB_MASK

    # -- program and erase -----------------------------------------------------------------
    def _page_program(self, out: bytes, rx_len: int) -> bytes:
        if len(out) < 5 or rx_len:
            return _ff(rx_len)
        state = self._state
        if not state[_SR1] & WEL:
            return b""
        address = out[1] << 16 | out[2] << 8 | out[3]
        page = address & ~(PAGE_SIZE - 1)
        if state[_SR2] & SUS2 or self._protected(page, page + PAGE_SIZE) or (
                state[_SR2] & SUS1
                and self._ranges[_SUSPENDED_LO] <= page < self._ranges[_SUSPENDED_HI]):
            return self._refuse()
        self._program_page(page, _latch(address & 0xFF, out[4:]))
        self._start_operation(0x02, page, page + PAGE_SIZE)
        return b""

    def _block_erase(self, out: bytes, rx_len: int) -> bytes:
        if len(out) != 4 or rx_len:
            return _ff(rx_len)
        if not self._state[_SR1] & WEL:
            return b""
        op = out[0]
        size = ERASE_SIZES[op]
        lo = (out[1] << 16 | out[2] << 8 | out[3]) & ~(size - 1)
        if self._suspended() or self._protected(lo, lo + size):
            return self._refuse()
        self._erase(lo, lo + size)
        self._start_operation(op, lo, lo + size)
        return b""

    def _chip_erase(self, out: bytes, rx_len: int) -> bytes:
        if len(out) != 1 or rx_len:
            return _ff(rx_len)
        if not self._state[_SR1] & WEL:
            return b""
        if self._suspended() or self._protected(0, FLASH_SIZE):
            return self._refuse()
        self._erase(0, FLASH_SIZE)
        self._start_operation(out[0], 0, FLASH_SIZE)
        return b""

    # -- security registers ----------------------------------------------------------------
    def _security_register(self, address: int) -> int:
        """Register number 1..3 for a security-register address, 0 if it names none."""
        number = address >> 12
        return number if 1 <= number <= SECURITY_REGISTERS else 0

    def _read_security(self, out: bytes, rx_len: int) -> bytes:
        if len(out) < 4:
            return _ff(rx_len)
        lead, skip = self._lead(len(out), 5, rx_len)
        address = out[1] << 16 | out[2] << 8 | out[3]
        number = self._security_register(address)
        if not number:
            return _ff(rx_len)
        base = (number - 1) * SECURITY_REGISTER_SIZE
        register = bytes(self._otp[base:base + SECURITY_REGISTER_SIZE])
        return _ff(lead) + _repeat(register, (address & 0x1FF) + skip, rx_len - lead)

    def _security_target(self, out: bytes) -> tuple[int, int] | None:
        """(register number, address) of a security-register write the chip may perform."""
        state = self._state
        address = out[1] << 16 | out[2] << 8 | out[3]
        number = self._security_register(address)
        if not number or self._suspended() or state[_SR2] & _lock_bit(number):
            return None
        return number, address

    def _program_security(self, out: bytes, rx_len: int) -> bytes:
        if len(out) < 5 or rx_len:
            return _ff(rx_len)
        if not self._state[_SR1] & WEL:
            return b""
        target = self._security_target(out)
        if target is None:
            return self._refuse()
        number, address = target
        page = (number - 1) * SECURITY_REGISTER_SIZE + (address & 0x100)
        latch = _latch(address & 0xFF, out[4:])
        old = self._otp[page:page + PAGE_SIZE]
        new = int.from_bytes(old, "big") & int.from_bytes(latch, "big")
        self._otp[page:page + PAGE_SIZE] = new.to_bytes(PAGE_SIZE, "big")
        self._start_operation(0x42)
        return b""

    def _erase_security(self, out: bytes, rx_len: int) -> bytes:
        if len(out) != 4 or rx_len:
            return _ff(rx_len)
        if not self._state[_SR1] & WEL:
            return b""
        target = self._security_target(out)
        if target is None:
            return self._refuse()
        base = (target[0] - 1) * SECURITY_REGISTER_SIZE
        self._otp[base:base + SECURITY_REGISTER_SIZE] = _ff(SECURITY_REGISTER_SIZE)
        self._start_operation(0x44)
        return b""

    # -- reset, suspend, resume ------------------------------------------------------------
    def _reset_enable(self, out: bytes, rx_len: int) -> bytes:
        if len(out) == 1 and not rx_len:
            self._state[_FLAGS] |= F_RESET_ARMED
        return _ff(rx_len)

    def _reset(self, out: bytes, rx_len: int) -> bytes:
        """Reached only with the reset armed (transaction() disarms it on the way)."""
        if len(out) != 1 or rx_len:
            return _ff(rx_len)
        state = self._state
        state[_SR1], state[_SR2], state[_SR3] = state[_NV1], state[_NV2], state[_NV3]
        state[_FLAGS] &= ~(F_VOLATILE_ARMED | F_RESET_ARMED)
        if state[_SUSPENDED_KIND]:
            self.board.count("flash_busy_seconds", -self._times[_SUSPENDED_REMAINING])
            state[_SUSPENDED_KIND] = 0
        return b""

    def _suspend(self, out: bytes, rx_len: int) -> bytes:
        if len(out) != 1 or rx_len:
            return _ff(rx_len)
        state = self._state
        kind = state[_BUSY_KIND]
        now = self._clock.now()
        if kind not in SUSPENDABLE or now >= self._times[_BUSY_UNTIL] or self._suspended():
            return b""
        self._times[_SUSPENDED_REMAINING] = self._times[_BUSY_UNTIL] - now
        self._ranges[_SUSPENDED_LO] = self._ranges[_BUSY_LO]
        self._ranges[_SUSPENDED_HI] = self._ranges[_BUSY_HI]
        state[_SUSPENDED_KIND] = kind
        state[_BUSY_KIND] = 0
        state[_SR2] |= SUSPENDABLE[kind]
        state[_SR1] &= ~WEL
        return b""

    def _resume(self, out: bytes, rx_len: int) -> bytes:
        if len(out) != 1 or rx_len:
            return _ff(rx_len)
        state = self._state
        kind = state[_SUSPENDED_KIND]
        if not kind:
            return b""
        self._times[_BUSY_UNTIL] = self._clock.now() + self._times[_SUSPENDED_REMAINING]
        self._ranges[_BUSY_LO] = self._ranges[_SUSPENDED_LO]
        self._ranges[_BUSY_HI] = self._ranges[_SUSPENDED_HI]
        state[_BUSY_KIND] = kind
        state[_SUSPENDED_KIND] = 0
        state[_SR2] &= ~(SUS1 | SUS2)
        return b""


def _lock_bit(number: int) -> int:
    """SR2 bit of LB1..LB3, the OTP lock of security register 1..3."""
    return 0x04 << number


def _latch(column: int, data: bytes) -> bytes:
    """The 256-byte page latch after shifting `data` in from `column`: 0xFF where unsent."""
    if len(data) > PAGE_SIZE:
        column = (column + len(data) - PAGE_SIZE) & 0xFF
        data = data[-PAGE_SIZE:]
    latch = bytearray(_FF256)
    first = data[:PAGE_SIZE - column]
    latch[column:column + len(first)] = first
    rest = data[len(first):]
    latch[0:len(rest)] = rest
    return bytes(latch)


def _unique_id(text: object) -> bytes:
    try:
        value = bytes.fromhex(str(text))
    except ValueError:
        value = b""
    # A board without a factory ID shows what an unprogrammed OTP cell reads.
    return value if len(value) == 16 else _ff(16)
