"""The emulated SPI NOR flash: one model, driven by a part description (parts.py).

The board's part is named in board.json ("chip", default GD25LQ16E); what differs between
parts — identification bytes, status registers, block protection, erase opcodes and busy
times, security registers, unique ID, SFDP, modes the engine cannot leave — is data in the
part's module (gd25.py, w25q16dw.py, w25q16fw_jw.py, mx25u1635f.py, unknown_part.py,
docs/flash-chip.md).

One `transaction()` is one chip-select assertion: `out` is shifted in (opcode, address,
TX data), then `rx_len` bytes are clocked out. SPI is full duplex, so the model counts
clocks: a command has a header (opcode, address, dummy bytes); every byte clocked after
the header carries data, whether the host was sending TX bytes or receiving at the time.

Modelling decisions (the datasheets leave them open, or the model has to pick one):

* Bus: while the chip does not drive SO (dummy cycles, unknown opcodes, commands that
  return nothing, deep power-down, busy) the host reads 0xFF, as a pulled-up line shows.
* Incomplete or over-long commands: a command whose CS# rises early is ignored; so is a
  command that acts at CS# rise (program, erase, status writes, write enable/disable,
  mode changes, reset, suspend/resume) when CS# rises later than its last byte (extra TX
  bytes or RX clocks). Address bytes of a read must come from `out`: we cannot know what
  the engine drives on SI while it receives, so a read without its full address returns
  0xFF and does nothing. Dummy bytes are don't-care, so they may be TX bytes or the first
  RX clocks.
* Page program keeps only the last 256 bytes it was sent, each at its column modulo 256
  (the page wraps); data ANDs into the array. More than 256 bytes: the earlier ones are
  discarded, as the datasheets document.
* WEL-gated commands the chip refuses (target protected by the block-protect bits, status
  register locked, security register locked, conflicting with a suspended operation)
  clear WEL and change nothing. Block erases are refused whole if any byte of the block
  is protected; chip erase is refused if anything is protected.
* Block protection decodes as the part's description says (parts.BlockProtection): by
  flashrom's generic SPI25 rule, or by the part's own table. For the SPI25 rule that
  includes SEC=1 with BP=6, which the rule caps at 32 KiB while GigaDevice's 16 Mbit
  tables list BP2..BP1 = 11 as "everything".
* Time: a transaction happens at the moment its CS# rises (the engine passes that
  moment, the end of its SPI time, as `now`); the aperture and the PSP act at the board's
  present time. Busy: the part's typical times on the board's clock; content changes at
  command time and the chip reports WIP (and WEL) until the time has passed. While busy
  only status-register reads, suspend and reset (66h, 99h) are heard. On the 'ideal'
  profile everything completes at once. Security-register program/erase take their own
  figures (the page-program/4 KiB-erase times). Volatile status writes (after 50h) take
  effect at once with no busy time. Deep power-down entry/exit, suspend latency and reset
  recovery are not modelled (0 s).
* Read-back: 9Fh repeats the JEDEC id; 90h repeats its two-byte pair (manufacturer,
  device, or the other way round with address bit 0 set); ABh repeats the device byte;
  status reads repeat the register; 4Bh repeats the unique ID; SFDP reads 0xFF beyond the
  table; 03h/0Bh wrap at the end of the array.
* Status registers: the chip works from a volatile copy (what the read opcodes return); a
  normal write updates it and the non-volatile copy, a write after 50h (on parts that have
  it) only the volatile one; the 50h enable stays armed until a status write uses it or
  06h/04h/reset cancels it (the engine re-sends opcodes and polls status in between, so
  "the very next command" would never survive). 01h with fewer data bytes than registers
  it can write changes only those it was given — except the bits a part's datasheet says
  a one-byte 01h clears. One-time-programmable bits (lock bits), once 1, stay 1 for ever;
  volatile writes do not touch them.
* Status-register lock: where the part has SRP1, WP# is assumed high (inactive): SRP1=0 →
  writable (SRP0 alone only acts with WP# low); SRP1=1 (power-supply lock-down, or for
  good with SRP0=1) → locked, and the board is never power-cycled, so it stays locked (a
  software reset reloads the non-volatile copy, which keeps a non-volatile lock). A part
  whose only lock is SRWD with WP# is never locked here.
* OTP: security registers as the part's description places them (erased to 0xFF, not
  covered by block protection, only by their lock bits). Macronix-style secured OTP: a
  mode entered with B1h and left with C1h in which 03h/0Bh read and 02h programs the OTP
  area (addresses wrap inside it); erases are refused; its first 16 bytes are the
  factory serial number, locked by the factory-lock bit.
* QPI: a part that has a single-line opcode switching it to 4-line commands (35h on the
  MX25U1635F, 38h on the W25Q16DW) takes it; from then on the ROM_SW engine's
  single-line commands are noise to it: nothing is heard, everything reads 0xFF, and
  nothing the engine can send brings it back (the board is never power-cycled).
* Suspend is accepted during a block erase or a page program, not during chip erase,
  status or security-register writes, and not while already suspended. It sets the
  part's suspend status bit, drops WIP and clears WEL. While erase-suspended the chip reads
  everything (the suspended block reads as its new content — real silicon reads
  undefined data there) and programs outside the suspended block; erases, status writes,
  security-register writes and (while program-suspended) programs are refused. Resume
  continues the remaining busy time.
* Reset (66h immediately followed by 99h; any other command in between disarms it):
  reloads the status registers from the non-volatile copy (WEL, suspend bits and volatile
  values lost), disarms 50h, leaves secured OTP, abandons a suspended operation, and
  aborts a running one (datasheets warn the data may then be corrupt; here the content
  change, already applied at command time, stays: the model does not invent a partial
  state).
* The PSP's controller (`psp_update`) is refused — False, nothing written, WEL clear — if
  any covered 4 KiB sector is protected, in deep power-down, in QPI or secured-OTP mode, or
  while an operation is suspended. Otherwise it returns True even when faults spoil the
  result (it does not verify), queues behind a running operation and keeps the chip busy
  for one 4 KiB erase per sector plus one page program per page that is not all 0xFF.
* Deep power-down (B9h): only ABh is heard, which releases it (ABh's ID bytes are clocked
  out in either state); the aperture reads 0xFF; the PSP's controller cannot write.
* Individual block locks (parts with WPS/WPSEL, parts.IndividualLocks): while the select bit
  is set the BP bits are ignored and a program or erase touching a locked sector is refused
  like a BP-protected one; the locks are one volatile bit per 4 KiB sector, all set when the
  part is made (its power-up) and by a reset; 98h / 7Eh after a write enable clear / set them
  all. Individual lock and unlock commands (36h/39h) and the lock read (3Dh/3Ch) are not
  modelled (amdflash never sends them). Macronix's WPSEL (68h, after a write enable) sets
  the select bit for good.
* Fail flags (Macronix P_FAIL/E_FAIL in SCUR): each page program (erase) sets its flag when
  the chip refused it (protected, locked, suspended) or could not do it (a stuck bit it could
  not program, an erase-fail sector), and clears it otherwise; a reset clears both.
* Faults: stuck bits read 1 whatever the array holds (so programming cannot clear them and
  erasing leaves them 1); erase-fail sectors keep their content through any erase;
  slow-busy=F makes every program, erase and status write take F times its typical time
  (capped at the datasheet maximum), as a slower part within specification does.
* State: everything lives in the board's "chip" region, so a new host process finds the
  chip exactly as the last one left it (the board stays powered). The security registers
  and secured OTP are the "otp" region, formatted the first time a chip is opened.
"""
from __future__ import annotations

import hashlib
import struct
from typing import TYPE_CHECKING
from collections.abc import Callable

from amdflash.stages.sim import command_log
from amdflash.stages.drivers.flash.geometry import FLASH_SIZE, PAGE, SECTOR
from amdflash.stages.sim.parts import Bit, PartSpec
from amdflash.stages.sim.state import F_WEAK_FIRED
from amdflash.stages.sim.catalog import part as find_part

if TYPE_CHECKING:
    from amdflash.stages.sim.board import Board

WIP, WEL = 0x01, 0x02                 # register 0 of every part
PSP_UPDATE = 0xFF                     # busy kind of a PSP-controller update (not an opcode)

# Chip region layout (0x200 bytes). The magic predates the other parts: it marks a region
# laid out this way, whatever the part.
MAGIC = b"GD25"
LAYOUT_VERSION = 1
_VERSION, _OTP_READY = 4, 5
_REG, _NV = 8, 12                     # volatile copies (what the chip acts on), non-volatile ones
_FLAGS = 16
_BUSY_KIND = 17                       # opcode of the operation in progress, 0 = idle
_SUSPENDED_KIND = 18
_DOUBLES = slice(0x18, 0x28)          # busy_until, suspended_remaining
_WORDS = slice(0x28, 0x38)            # busy range lo/hi, suspended range lo/hi
_BUSY_UNTIL, _SUSPENDED_REMAINING = 0, 1
_BUSY_LO, _BUSY_HI, _SUSPENDED_LO, _SUSPENDED_HI = 0, 1, 2, 3
_LOCKS = slice(0x40, 0x80)            # individual block locks: one bit per 4 KiB sector
CHIP_REGION_SIZE = 0x200

F_DEEP_POWER_DOWN = 0x01
F_VOLATILE_ARMED = 0x02
F_RESET_ARMED = 0x04
F_QPI = 0x08
F_SECURED_OTP = 0x10
_UNREACHABLE = F_DEEP_POWER_DOWN | F_QPI

_FF256 = b"\xff" * PAGE


def _ff(n: int) -> bytes:
    return b"\xff" * n


def _repeat(pattern: bytes, phase: int, n: int) -> bytes:
    """`n` bytes of an endlessly repeated `pattern`, starting `phase` bytes into it."""
    if n <= 0:
        return b""
    reps = (phase % len(pattern) + n) // len(pattern) + 1
    start = phase % len(pattern)
    return (pattern * reps)[start:start + n]


def varying_busy(typical: float, spread: tuple[float, float, float], seed: int, kind: int, address: int,
                 now: float) -> float:
    """The busy time of one operation of a kind that varies (a calibrated part): a normal draw
    around the typical figure, within the least and most the real chip took. The draw is a
    hash of the board's seed, the operation and the moment it starts, so a run on a virtual
    clock takes the same modelled seconds every time."""
    stdev, least, most = spread
    if stdev <= 0:
        return typical
    digest = hashlib.blake2b(struct.pack("<QIId", seed & (1 << 64) - 1, kind, address, now), digest_size=8).digest()
    u = (int.from_bytes(digest, "little") + 0.5) / 2.0 ** 64
    import statistics     # here: it loads fractions and decimal; only a calibrated part's busy times need it

    return min(most, max(least, statistics.NormalDist(typical, stdev).inv_cdf(u)))


class NorChip:
    def __init__(self, board: Board, spec: PartSpec | None = None):
        from amdflash.stages.sim.calibration import calibrated_part

        # A calibrated board's part has the busy times and SFDP measured on a real one.
        self.part = p = spec or calibrated_part(find_part(board.config.get("chip")), board.config.get("calibration"))
        self.board = board
        self.flash = board.files.flash
        self._clock = board.clock
        self._at: float | None = None      # the time of the transaction being served
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
        self._slow = board.faults.slow_busy
        self._status_reads = p.register_by_opcode
        self._suspendable: dict[int, Bit] = {}
        if p.suspend:
            self._suspendable = {op: p.suspend.erase_bit for op in p.erases}
            self._suspendable[0x02] = p.suspend.program_bit
        self._suspend_op = p.suspend.suspend if p.suspend else None
        self._sector_erase = next(op for op, size in p.erases.items() if size == SECTOR)
        if bytes(self._state[0:4]) != MAGIC:
            # A board made before this model existed: a fresh chip as the factory leaves it.
            self._state[0:CHIP_REGION_SIZE] = self.initial_state(p, cmp=False, bp=0)
        if not self._state[_OTP_READY]:
            self._format_otp()
            self._state[_OTP_READY] = 1
        self._handlers: dict[int, Callable[[bytes, int], bytes]] = {
            0x03: self._read, 0x0B: self._fast_read,
            0x02: self._page_program,
            0x05: self._read_status,
            0x06: self._write_enable, 0x04: self._write_disable,
            0x9F: self._read_jedec, 0x90: self._read_manufacturer_device,
            0xAB: self._release_power_down, 0xB9: self._mode(set_flags=F_DEEP_POWER_DOWN),
            0x5A: self._read_sfdp,
            0x66: self._mode(set_flags=F_RESET_ARMED),   # 99h acts only when armed: see transaction()
        }
        self._handlers.update({op: self._block_erase for op in p.erases})
        self._handlers.update({op: self._chip_erase for op in p.chip_erases})
        self._handlers.update({op: self._read_status for op in self._status_reads})
        self._handlers.update({op: self._write_status for op in p.status_writes})
        if p.volatile_enable:
            self._handlers[0x50] = self._mode(set_flags=F_VOLATILE_ARMED)
        if p.unique_id:
            self._handlers[0x4B] = self._read_unique_id
        if p.security:
            self._handlers.update({0x48: self._read_security, 0x42: self._program_security,
                                   0x44: self._erase_security})
        if p.suspend:
            self._handlers.update({p.suspend.suspend: self._suspend, p.suspend.resume: self._resume})
        if p.qpi_enter is not None:
            self._handlers[p.qpi_enter] = self._mode(set_flags=F_QPI)
        if p.individual_locks:
            locks = p.individual_locks
            self._handlers.update({locks.global_unlock: self._global_locks(0x00),
                                   locks.global_lock: self._global_locks(0xFF)})
            if locks.select_opcode is not None:
                self._handlers[locks.select_opcode] = self._select_individual_locks
        # In secured-OTP mode these go to the OTP area instead.
        self._otp_handlers: dict[int, Callable[[bytes, int], bytes]] = {}
        if p.secured_otp:
            self._handlers.update({p.secured_otp.enter: self._mode(set_flags=F_SECURED_OTP),
                                   p.secured_otp.exit: self._mode(clear_flags=F_SECURED_OTP)})
            self._otp_handlers = {0x03: self._read_otp, 0x0B: self._fast_read_otp, 0x02: self._program_otp}
            self._otp_handlers.update({op: self._refuse_in_otp for op in (*p.erases, *p.chip_erases)})

    # -- the wire --------------------------------------------------------------------------
    def transaction(self, out: bytes, rx_len: int, now: float | None = None) -> bytes:
        """One chip-select cycle, at `now` on the board's clock (default: the present)."""
        self._at = now
        try:
            return self._transaction(out, rx_len)
        finally:
            self._at = None

    def _now(self) -> float:
        return self._clock.now() if self._at is None else self._at

    def _transaction(self, out: bytes, rx_len: int) -> bytes:
        if not out:
            return _ff(rx_len)
        op = out[0]
        if op in command_log.LOGGED:
            # What a logic analyser on the bus would show, whatever the chip then does with it.
            command_log.record(self.board.path, out)
        state = self._state
        if state[_BUSY_KIND]:
            if self._now() < self._times[_BUSY_UNTIL]:
                if op != 0x66 and state[_FLAGS] & F_RESET_ARMED:
                    state[_FLAGS] &= ~F_RESET_ARMED
                    if op == 0x99:
                        return self._reset(out, rx_len)
                if op in self._status_reads:
                    return self._read_status(out, rx_len)
                if op == self._suspend_op:
                    return self._suspend(out, rx_len)
                if op == 0x66:
                    return self._handlers[0x66](out, rx_len)
                self.board.count("ignored_while_busy")
                return _ff(rx_len)
            self._finish_operation()
        flags = state[_FLAGS]
        if flags:
            if flags & _UNREACHABLE:
                if flags & F_QPI:
                    return _ff(rx_len)      # a single-line command is noise to a chip in QPI mode
                return self._release_power_down(out, rx_len) if op == 0xAB else _ff(rx_len)
            if flags & F_RESET_ARMED and op != 0x66:
                state[_FLAGS] = flags & ~F_RESET_ARMED
                if op == 0x99:
                    return self._reset(out, rx_len)
            if flags & F_SECURED_OTP and op in self._otp_handlers:
                return self._otp_handlers[op](out, rx_len)
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
            if flags & _UNREACHABLE:
                return _ff(size)
            # The SMUIO controller's read is a command on the wire: it disarms a reset.
            state[_FLAGS] = flags & ~F_RESET_ARMED
            if flags & F_SECURED_OTP:
                return self._otp_bytes(address, size)
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
        if state[_FLAGS] & (_UNREACHABLE | F_SECURED_OTP) or state[_SUSPENDED_KIND]:
            return False
        lo, hi = address & ~(SECTOR - 1), (end + SECTOR - 1) & ~(SECTOR - 1)
        if self._protected(lo, hi):
            state[_REG] &= ~WEL
            return False
        merged = bytearray(self._array(lo, hi - lo))
        merged[address - lo:end - lo] = data
        seconds = 0.0
        erase_seconds, page_seconds = self.part.busy[self._sector_erase][0], self.part.busy[0x02][0]
        for sector in range(lo, hi, SECTOR):
            self._erase(sector, sector + SECTOR)
            seconds += erase_seconds
            for page in range(sector, sector + SECTOR, PAGE):
                content = bytes(merged[page - lo:page - lo + PAGE])
                if content != _FF256:
                    self._program_page(page, content)
                    seconds += page_seconds
        state[_REG] &= ~WEL
        if self._physical:
            # The PSP's controller polls WIP too: its work queues behind a running operation.
            start = max(now, self._times[_BUSY_UNTIL]) if state[_BUSY_KIND] else now
            self._times[_BUSY_UNTIL] = start + seconds
            state[_BUSY_KIND] = PSP_UPDATE
            self.board.count("flash_busy_seconds", seconds)
        return True

    @staticmethod
    def initial_state(spec: PartSpec, cmp: bool, bp: int) -> bytes:
        """The chip region of a fresh part, with BP (and CMP) set as `sim create` asks."""
        prot = spec.protection
        top = (1 << len(prot.bp)) - 1
        if not 0 <= bp <= top:
            raise ValueError(f"--bp must be 0..{top} (BP{len(prot.bp) - 1}..BP0) on the {spec.name}")
        if cmp and prot.cmp is None:
            raise ValueError(f"the {spec.name} has no CMP bit (--cmp)")
        regs = [r.initial for r in spec.registers]
        for i, (r, b) in enumerate(prot.bp):
            regs[r] = regs[r] & ~(1 << b) | (bp >> i & 1) << b
        if cmp and prot.cmp is not None:
            regs[prot.cmp[0]] |= 1 << prot.cmp[1]
        region = bytearray(CHIP_REGION_SIZE)
        region[0:4] = MAGIC
        region[_VERSION] = LAYOUT_VERSION
        for i, value in enumerate(regs):
            region[_REG + i] = region[_NV + i] = value
        if spec.individual_locks:
            region[_LOCKS] = b"\xff" * (_LOCKS.stop - _LOCKS.start)     # every lock set at power-up
        return bytes(region)

    @staticmethod
    def with_status_registers(spec: PartSpec, state: bytes, values: tuple[int, ...]) -> bytes:
        """A chip region with the status registers (volatile and non-volatile) as a real
        board was found with (`sim create --from-report`)."""
        if len(values) != len(spec.registers) or not all(isinstance(v, int) and 0 <= v <= 0xFF for v in values):
            raise ValueError(f"the {spec.name} has {len(spec.registers)} status registers of one byte each, "
                             f"not {values!r:.80}")
        region = bytearray(state)
        for i, value in enumerate(values):
            # WIP and WEL are states of the moment, not settings: a fresh board is idle.
            region[_REG + i] = region[_NV + i] = value & ~(WIP | WEL) if i == 0 else value
        return bytes(region)

    def _format_otp(self) -> None:
        p = self.part
        if p.security:
            self._otp[0:p.security.count * p.security.size] = _ff(p.security.count * p.security.size)
        if p.secured_otp:
            otp = p.secured_otp
            self._otp[0:otp.size] = _ff(otp.size)
            if self._bit(otp.factory_lock):
                # The factory wrote the serial number and locked it.
                self._otp[0:otp.esn] = self._unique_id[:otp.esn]

    def close(self) -> None:
        for view in (self._times, self._ranges, self._state, self._otp):
            view.release()

    # -- state helpers ---------------------------------------------------------------------
    def _bit(self, bit: Bit) -> bool:
        return bool(self._state[_REG + bit[0]] >> bit[1] & 1)

    def _set_bit(self, bit: Bit, on: bool) -> None:
        index, mask = _REG + bit[0], 1 << bit[1]
        self._state[index] = self._state[index] | mask if on else self._state[index] & ~mask

    def _finish_operation(self) -> None:
        self._state[_BUSY_KIND] = 0
        self._state[_REG] &= ~WEL

    def _start_operation(self, kind: int, lo: int = 0, hi: int = 0) -> None:
        """WEL stays set while the chip is busy and clears when the operation completes."""
        if not self._physical:
            self._state[_REG] &= ~WEL
            return
        # A slow-busy chip takes longer than typical, never longer than the datasheet allows.
        typical, maximum = self.part.busy[kind]
        spread = self.part.busy_spread.get(kind)
        if spread is not None:
            typical = varying_busy(typical, spread, self.board.seed, kind, lo, self._now())
        seconds = min(typical * self._slow, maximum)
        self._times[_BUSY_UNTIL] = self._now() + seconds
        self._ranges[_BUSY_LO], self._ranges[_BUSY_HI] = lo, hi
        self._state[_BUSY_KIND] = kind
        self.board.count("flash_busy_seconds", seconds)

    def _refuse(self) -> bytes:
        self._state[_REG] &= ~WEL
        return b""

    def _registers(self) -> list[int]:
        return [self._state[_REG + i] for i in range(len(self.part.registers))]

    def _protected(self, lo: int, hi: int) -> bool:
        prot, regs = self.part.protection, self._registers()
        if prot.select is not None and regs[prot.select[0]] >> prot.select[1] & 1:
            locks = self._state[_LOCKS]
            return any(locks[s >> 3] >> (s & 7) & 1 for s in range(lo // SECTOR, -(-hi // SECTOR)))
        start, end = prot.range(regs)
        return start < end and lo < end and start < hi

    def _set_fail(self, which: int, failed: bool) -> None:
        """P_FAIL (which=0) or E_FAIL (1), on parts that report failures themselves."""
        if self.part.fail_flags is not None:
            self._set_bit(self.part.fail_flags[which], failed)

    def _global_locks(self, value: int) -> Callable[[bytes, int], bytes]:
        def command(out: bytes, rx_len: int) -> bytes:
            if not self._clean(out, rx_len) or not self._state[_REG] & WEL:
                return _ff(rx_len)
            self._state[_LOCKS] = bytes((value,)) * (_LOCKS.stop - _LOCKS.start)
            self._state[_REG] &= ~WEL
            return b""
        return command

    def _select_individual_locks(self, out: bytes, rx_len: int) -> bytes:
        """Macronix WPSEL: the select bit is one-time programmable, in both copies."""
        select = self.part.protection.select
        if not self._clean(out, rx_len) or not self._state[_REG] & WEL or select is None:
            return _ff(rx_len)
        for base in (_REG, _NV):
            self._state[base + select[0]] |= 1 << select[1]
        self._state[_REG] &= ~WEL
        return b""

    def _locked(self) -> bool:
        lock = self.part.lock_bit
        return lock is not None and self._bit(lock)

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
        weak = self.board.faults.weak_bit
        if weak is not None and page <= weak[0] < page + PAGE and not self.board.fault_state[F_WEAK_FIRED]:
            address, mask = weak[0], 1 << weak[1]
            if not latch[address - page] & mask and self.flash[address] & mask:
                # The weak cell keeps its 1 this once (the program "succeeds"; the array says otherwise).
                self.board.fault_state[F_WEAK_FIRED] = 1
                latch = latch[:address - page] + bytes((latch[address - page] | mask,)) + latch[address - page + 1:]
        old = self.flash[page:page + PAGE]
        new = int.from_bytes(old, "big") & int.from_bytes(latch, "big")
        self.flash[page:page + PAGE] = new.to_bytes(PAGE, "big")

    def _erase(self, lo: int, hi: int) -> None:
        fail = self._erase_fail
        if not fail:
            self.flash[lo:hi] = _ff(hi - lo)
            return
        for sector in range(lo, hi, SECTOR):
            if sector // SECTOR not in fail:
                self.flash[sector:sector + SECTOR] = _ff(SECTOR)

    # -- reads -----------------------------------------------------------------------------
    @staticmethod
    def _lead(n_out: int, header: int, rx_len: int) -> tuple[int, int]:
        """(RX bytes still inside the header, data bytes already clocked during TX)."""
        if n_out < header:
            lead = min(header - n_out, rx_len)
            return lead, 0
        return 0, n_out - header

    def _read_from(self, out: bytes, rx_len: int, header: int,
                   source: Callable[[int, int], bytes] | None = None) -> bytes:
        """A read of the array (or of `source`, e.g. the secured OTP) after a `header`-byte command."""
        if len(out) < 4:
            return _ff(rx_len)
        lead, skip = self._lead(len(out), header, rx_len)
        address = (out[1] << 16 | out[2] << 8 | out[3]) + skip
        return _ff(lead) + (source or self._array)(address, rx_len - lead)

    def _read(self, out: bytes, rx_len: int) -> bytes:
        return self._read_from(out, rx_len, 4)

    def _fast_read(self, out: bytes, rx_len: int) -> bytes:
        return self._read_from(out, rx_len, 5)

    def _read_status(self, out: bytes, rx_len: int) -> bytes:
        index = self._status_reads[out[0]]
        value = self._state[_REG + index]
        if index == 0 and self._state[_BUSY_KIND] and self._now() < self._times[_BUSY_UNTIL]:
            value |= WIP
        return bytes((value,)) * rx_len

    def _pattern(self, out: bytes, rx_len: int, header: int, pattern: bytes) -> bytes:
        lead, skip = self._lead(len(out), header, rx_len)
        return _ff(lead) + _repeat(pattern, skip, rx_len - lead)

    def _read_jedec(self, out: bytes, rx_len: int) -> bytes:
        return self._pattern(out, rx_len, 1, self.part.jedec)

    def _read_manufacturer_device(self, out: bytes, rx_len: int) -> bytes:
        if len(out) < 4:
            return _ff(rx_len)
        maker, device = self.part.jedec[0], self.part.device_id
        pair = bytes((device, maker)) if out[3] & 1 else bytes((maker, device))
        return self._pattern(out, rx_len, 4, pair)

    def _read_unique_id(self, out: bytes, rx_len: int) -> bytes:
        # 4Bh: four bytes of address or dummy after the opcode, then the ID.
        return self._pattern(out, rx_len, 5, self._unique_id[:self.part.unique_id])

    def _read_sfdp(self, out: bytes, rx_len: int) -> bytes:
        if len(out) < 4:
            return _ff(rx_len)
        lead, skip = self._lead(len(out), 5, rx_len)
        address = (out[1] << 16 | out[2] << 8 | out[3]) + skip
        data = self.part.sfdp[address:address + rx_len - lead]
        return _ff(lead) + data + _ff(rx_len - lead - len(data))

    # -- identification, power and modes ---------------------------------------------------
    def _release_power_down(self, out: bytes, rx_len: int) -> bytes:
        # Release happens at CS# rise, whether or not the ID was clocked out.
        self._state[_FLAGS] &= ~F_DEEP_POWER_DOWN
        return self._pattern(out, rx_len, 4, bytes((self.part.device_id,)))

    def _clean(self, out: bytes, rx_len: int) -> bool:
        """A one-byte command whose CS# rose right after its opcode."""
        return len(out) == 1 and not rx_len

    def _mode(self, set_flags: int = 0, clear_flags: int = 0) -> Callable[[bytes, int], bytes]:
        """A one-byte command that enters or leaves a mode (deep power-down, QPI, secured OTP,
        volatile status write, reset armed): it acts only when sent clean."""
        def command(out: bytes, rx_len: int) -> bytes:
            if self._clean(out, rx_len):
                self._state[_FLAGS] = self._state[_FLAGS] & ~clear_flags | set_flags
            return _ff(rx_len)
        return command

    # -- write enable, status writes -------------------------------------------------------
    def _write_enable(self, out: bytes, rx_len: int) -> bytes:
        if self._clean(out, rx_len):
            self._state[_REG] |= WEL
            self._state[_FLAGS] &= ~F_VOLATILE_ARMED
        return _ff(rx_len)

    def _write_disable(self, out: bytes, rx_len: int) -> bytes:
        if self._clean(out, rx_len):
            self._state[_REG] &= ~WEL
            self._state[_FLAGS] &= ~F_VOLATILE_ARMED
        return _ff(rx_len)

    def _write_status(self, out: bytes, rx_len: int) -> bytes:
        op, data = out[0], out[1:]
        targets = self.part.status_writes[op]
        if rx_len or not 1 <= len(data) <= len(targets) or (op != 0x01 and len(data) != len(targets)):
            return _ff(rx_len)
        state = self._state
        volatile = bool(state[_FLAGS] & F_VOLATILE_ARMED)
        if not volatile and not state[_REG] & WEL:
            return b""
        state[_FLAGS] &= ~F_VOLATILE_ARMED
        if state[_SUSPENDED_KIND] or self._locked():
            return self._refuse()
        for index, value in zip(targets, data):
            self._set_register(index, value, volatile)
        if op == 0x01 and len(data) == 1 and self.part.one_byte_clears:
            self._set_register(1, 0, volatile, self.part.one_byte_clears)
        if not volatile:
            self._start_operation(op)
        return b""

    def _set_register(self, index: int, value: int, volatile: bool, only: int | None = None) -> None:
        reg = self.part.registers[index]
        writable = reg.writable if only is None else only
        state = self._state
        copies = (_REG,) if volatile else (_REG, _NV)
        for base in copies:
            state[base + index] = (state[base + index] & ~writable) | (value & writable)
        if not volatile and only is None:
            # One-time programmable: a lock bit, once 1, is 1 for ever.
            for base in copies:
                state[base + index] |= value & reg.otp

    # -- program and erase -----------------------------------------------------------------
    def _page_program(self, out: bytes, rx_len: int) -> bytes:
        if len(out) < 5 or rx_len:
            return _ff(rx_len)
        state = self._state
        if not state[_REG] & WEL:
            return b""
        address = out[1] << 16 | out[2] << 8 | out[3]
        page = address & ~(PAGE - 1)
        suspended = state[_SUSPENDED_KIND]
        if suspended == 0x02 or self._protected(page, page + PAGE) or (
                suspended and self._ranges[_SUSPENDED_LO] <= page < self._ranges[_SUSPENDED_HI]):
            self._set_fail(0, True)
            return self._refuse()
        latch = _latch(address & 0xFF, out[4:])
        self._program_page(page, latch)
        if self.part.fail_flags is not None:
            # A stuck bit the latch wanted at 0 defeats the program's own verify.
            self._set_fail(0, any(page <= a < page + PAGE and ~latch[a - page] & mask
                                  for a, mask in self._stuck))
        self._start_operation(0x02, page, page + PAGE)
        return b""

    def _block_erase(self, out: bytes, rx_len: int) -> bytes:
        if len(out) != 4 or rx_len:
            return _ff(rx_len)
        if not self._state[_REG] & WEL:
            return b""
        op = out[0]
        size = self.part.erases[op]
        lo = (out[1] << 16 | out[2] << 8 | out[3]) & ~(size - 1)
        if self._state[_SUSPENDED_KIND] or self._protected(lo, lo + size):
            self._set_fail(1, True)
            return self._refuse()
        self._erase(lo, lo + size)
        self._set_fail(1, self._erase_failed(lo, lo + size))
        self._start_operation(op, lo, lo + size)
        return b""

    def _erase_failed(self, lo: int, hi: int) -> bool:
        return any(lo <= sector * SECTOR < hi for sector in self._erase_fail)

    def _chip_erase(self, out: bytes, rx_len: int) -> bytes:
        if len(out) != 1 or rx_len:
            return _ff(rx_len)
        if not self._state[_REG] & WEL:
            return b""
        if self._state[_SUSPENDED_KIND] or self._protected(0, FLASH_SIZE):
            self._set_fail(1, True)
            return self._refuse()
        self._erase(0, FLASH_SIZE)
        self._set_fail(1, self._erase_failed(0, FLASH_SIZE))
        self._start_operation(out[0], 0, FLASH_SIZE)
        return b""

    # -- security registers ----------------------------------------------------------------
    def _security_register(self, address: int) -> int | None:
        """Offset of a security register in the OTP region, None if the address names none."""
        sec = self.part.security
        assert sec is not None
        number = address >> 12
        if not sec.first <= number < sec.first + sec.count:
            return None
        return (number - sec.first) * sec.size

    def _read_security(self, out: bytes, rx_len: int) -> bytes:
        if len(out) < 4:
            return _ff(rx_len)
        lead, skip = self._lead(len(out), 5, rx_len)
        address = out[1] << 16 | out[2] << 8 | out[3]
        base = self._security_register(address)
        if base is None:
            return _ff(rx_len)
        size = self.part.security.size  # type: ignore[union-attr]
        register = bytes(self._otp[base:base + size])
        return _ff(lead) + _repeat(register, (address & (size - 1)) + skip, rx_len - lead)

    def _security_target(self, out: bytes) -> tuple[int, int] | None:
        """(OTP-region offset of the register, address) of a write the chip may perform."""
        sec = self.part.security
        assert sec is not None
        address = out[1] << 16 | out[2] << 8 | out[3]
        base = self._security_register(address)
        if base is None or self._state[_SUSPENDED_KIND] or self._bit(sec.lock[base // sec.size]):
            return None
        return base, address

    def _program_security(self, out: bytes, rx_len: int) -> bytes:
        if len(out) < 5 or rx_len:
            return _ff(rx_len)
        if not self._state[_REG] & WEL:
            return b""
        target = self._security_target(out)
        if target is None:
            return self._refuse()
        base, address = target
        size = self.part.security.size  # type: ignore[union-attr]
        page = base + (address & (size - 1) & ~(PAGE - 1))
        self._and_into_otp(page, _latch(address & 0xFF, out[4:]))
        self._start_operation(0x42)
        return b""

    def _erase_security(self, out: bytes, rx_len: int) -> bytes:
        if len(out) != 4 or rx_len:
            return _ff(rx_len)
        if not self._state[_REG] & WEL:
            return b""
        target = self._security_target(out)
        if target is None:
            return self._refuse()
        size = self.part.security.size  # type: ignore[union-attr]
        self._otp[target[0]:target[0] + size] = _ff(size)
        self._start_operation(0x44)
        return b""

    def _and_into_otp(self, offset: int, latch: bytes) -> None:
        old = self._otp[offset:offset + PAGE]
        new = int.from_bytes(old, "big") & int.from_bytes(latch, "big")
        self._otp[offset:offset + PAGE] = new.to_bytes(PAGE, "big")

    # -- secured OTP mode ------------------------------------------------------------------
    def _otp_bytes(self, address: int, size: int) -> bytes:
        area = bytes(self._otp[0:self.part.secured_otp.size])  # type: ignore[union-attr]
        return _repeat(area, address, size)

    def _read_otp(self, out: bytes, rx_len: int) -> bytes:
        return self._read_from(out, rx_len, 4, self._otp_bytes)

    def _fast_read_otp(self, out: bytes, rx_len: int) -> bytes:
        return self._read_from(out, rx_len, 5, self._otp_bytes)

    def _program_otp(self, out: bytes, rx_len: int) -> bytes:
        if len(out) < 5 or rx_len:
            return _ff(rx_len)
        if not self._state[_REG] & WEL:
            return b""
        otp = self.part.secured_otp
        assert otp is not None
        address = (out[1] << 16 | out[2] << 8 | out[3]) % otp.size
        page = address & ~(PAGE - 1)
        latch = bytearray(_latch(address & 0xFF, out[4:]))
        if self._bit(otp.user_lock):
            return self._refuse()
        if self._bit(otp.factory_lock):
            for i in range(max(0, otp.esn - page)):
                latch[i] = 0xFF            # the serial number cannot change
        self._and_into_otp(page, bytes(latch))
        self._start_operation(0x02)
        return b""

    def _refuse_in_otp(self, out: bytes, rx_len: int) -> bytes:
        if rx_len:
            return _ff(rx_len)
        return self._refuse() if self._state[_REG] & WEL else b""

    # -- reset, suspend, resume ------------------------------------------------------------
    def _reset(self, out: bytes, rx_len: int) -> bytes:
        """Reached only with the reset armed (transaction() disarms it on the way)."""
        if len(out) != 1 or rx_len:
            return _ff(rx_len)
        self._reload(F_VOLATILE_ARMED | F_RESET_ARMED | F_SECURED_OTP)
        return b""

    def power_cycle(self) -> None:
        """Power off and on: as a software reset, and every mode ends too (deep power-down,
        QPI, secured OTP, an armed 50h or 66h) — the chip answers as it did when it was new."""
        self._reload(0xFF)

    def _reload(self, flags: int) -> None:
        """Status registers from their non-volatile copies, `flags` cleared, and any operation
        running or suspended abandoned (its change to the array, made at command time, stays)."""
        state = self._state
        for i in range(len(self.part.registers)):
            state[_REG + i] = state[_NV + i]
        state[_FLAGS] &= ~flags
        if self.part.individual_locks:
            state[_LOCKS] = b"\xff" * (_LOCKS.stop - _LOCKS.start)
        if state[_SUSPENDED_KIND]:
            self.board.count("flash_busy_seconds", -self._times[_SUSPENDED_REMAINING])
            state[_SUSPENDED_KIND] = 0
        if state[_BUSY_KIND]:
            remaining = self._times[_BUSY_UNTIL] - self._now()
            if remaining > 0:
                self.board.count("flash_busy_seconds", -remaining)
            state[_BUSY_KIND] = 0

    def _suspend(self, out: bytes, rx_len: int) -> bytes:
        if len(out) != 1 or rx_len:
            return _ff(rx_len)
        state = self._state
        kind = state[_BUSY_KIND]
        now = self._now()
        if kind not in self._suspendable or now >= self._times[_BUSY_UNTIL] or state[_SUSPENDED_KIND]:
            return b""
        self._times[_SUSPENDED_REMAINING] = self._times[_BUSY_UNTIL] - now
        self._ranges[_SUSPENDED_LO] = self._ranges[_BUSY_LO]
        self._ranges[_SUSPENDED_HI] = self._ranges[_BUSY_HI]
        state[_SUSPENDED_KIND] = kind
        state[_BUSY_KIND] = 0
        self._set_bit(self._suspendable[kind], True)
        state[_REG] &= ~WEL
        return b""

    def _resume(self, out: bytes, rx_len: int) -> bytes:
        if len(out) != 1 or rx_len:
            return _ff(rx_len)
        state = self._state
        kind = state[_SUSPENDED_KIND]
        if not kind:
            return b""
        self._times[_BUSY_UNTIL] = self._now() + self._times[_SUSPENDED_REMAINING]
        self._ranges[_BUSY_LO] = self._ranges[_SUSPENDED_LO]
        self._ranges[_BUSY_HI] = self._ranges[_SUSPENDED_HI]
        state[_BUSY_KIND] = kind
        state[_SUSPENDED_KIND] = 0
        self._set_bit(self._suspendable[kind], False)
        return b""


def _latch(column: int, data: bytes) -> bytes:
    """The 256-byte page latch after shifting `data` in from `column`: 0xFF where unsent."""
    if len(data) > PAGE:
        column = (column + len(data) - PAGE) & 0xFF
        data = data[-PAGE:]
    latch = bytearray(_FF256)
    first = data[:PAGE - column]
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
