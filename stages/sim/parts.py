"""Emulated SPI NOR parts as data: what the model in nor.py needs to behave like one part.

A part is a `PartSpec`: its identification bytes, status registers (where each bit is, which
a status write may change, which only ever set), how its block protection decodes, its
erase opcodes and busy times, its security registers and unique ID, the commands that put
it into a mode the ROM_SW engine cannot leave (QPI) and its SFDP table. Each part's module
(gd25.py, w25q16dw.py, w25q16fw_jw.py, mx25u1635f.py, unknown_part.py) gives the facts and their sources,
and says which figures are assumed.

`sim create --chip NAME` picks one; a board remembers it in board.json ("chip").
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal
from collections.abc import Mapping

from amdflash.stages.drivers.flash.geometry import FLASH_SIZE

Bit = tuple[int, int]          # (status register index, bit number)



@dataclass(frozen=True)
class Register:
    """One status register as the chip holds it (a volatile copy and a non-volatile one)."""

    name: str
    read: int                  # the opcode that reads it
    writable: int = 0          # bits a status write changes
    otp: int = 0               # bits a non-volatile status write can only set, never clear
    initial: int = 0           # as the part leaves the factory


@dataclass(frozen=True)
class BlockProtection:
    """Where the block-protect bits are and which range each setting protects.

    Without `table`, the bits decode as flashrom's generic SPI25 decoder does: BP = 0
    protects nothing, all ones everything, otherwise 64 KiB × 2^(BP−1) (4 KiB × 2^(BP−1),
    at most 32 KiB, with SEC=1), at the top unless TB=1; CMP=1 protects the complement.
    With `table`, one (side, bytes) entry per BP value, as a datasheet's table lists them.
    """

    bp: tuple[Bit, ...]                                     # least significant first
    tb: Bit | None = None
    sec: Bit | None = None
    cmp: Bit | None = None
    table: tuple[tuple[Literal["top", "bottom"], int], ...] | None = None
    # Write-protection selection (Winbond SR3 WPS, Macronix SCUR WPSEL): when set, the BP bits
    # are ignored and the part's individual block locks decide (IndividualLocks).
    select: Bit | None = None
    # Which source's reading the chip follows where they differ (docs/flash-chip.md): "" as
    # above; "spi25" flashrom's formula even where the part has a table; "spi25-bp11-all" the
    # formula with BP2..BP1 = 11 protecting everything whatever SEC says (the datasheet tables).
    # A calibrated board follows what its hardware report's protection probe found.
    follows: Literal["", "spi25", "spi25-bp11-all"] = ""

    def value(self, regs: list[int]) -> int:
        return sum(1 << i for i, (r, b) in enumerate(self.bp) if regs[r] >> b & 1)

    def range(self, regs: list[int]) -> tuple[int, int]:
        """[start, end) the chip refuses to change."""
        bp = self.value(regs)
        if self.table is not None and not self.follows:
            side, length = self.table[bp]
            return (0, length) if side == "bottom" else (FLASH_SIZE - length, FLASH_SIZE)
        on = lambda bit: bit is not None and bool(regs[bit[0]] >> bit[1] & 1)  # noqa: E731
        top = (1 << len(self.bp)) - 1
        if bp == 0:
            length = 0
        elif bp == top or (self.follows == "spi25-bp11-all" and bp >> (len(self.bp) - 2) == 0b11):
            length = FLASH_SIZE
        elif on(self.sec):
            length = min(0x1000 << (bp - 1), 0x8000)
        else:
            length = min(0x10000 << (bp - 1), FLASH_SIZE)
        bottom = on(self.tb)
        if on(self.cmp):
            # The complement of a range anchored at one end is anchored at the other.
            length, bottom = FLASH_SIZE - length, not bottom
        return (0, length) if bottom else (FLASH_SIZE - length, FLASH_SIZE)

    def bits(self) -> dict[str, Bit]:
        named = {f"BP{i}": b for i, b in enumerate(self.bp)}
        for name in ("tb", "sec", "cmp"):
            bit = getattr(self, name)
            if bit is not None:
                named[name.upper()] = bit
        return named


@dataclass(frozen=True)
class Suspend:
    suspend: int               # opcode
    resume: int
    erase_bit: Bit             # status bit set while an erase is suspended
    program_bit: Bit           # ... while a page program is


@dataclass(frozen=True)
class SecurityRegisters:
    """OTP registers at address 0x1000 × n (n = first .. first+count−1), `size` bytes each,
    read/programmed/erased with 48h/42h/44h; register n is locked for ever by lock[n − first]."""

    first: int
    count: int
    size: int
    lock: tuple[Bit, ...]


@dataclass(frozen=True)
class SecuredOtp:
    """Macronix-style secured OTP: a mode (entered with `enter`, left with `exit`) in which
    reads and programs address an OTP area instead of the array; its first `esn` bytes are a
    factory serial number, locked when the security register's factory-lock bit is set."""

    enter: int
    exit: int
    size: int
    esn: int
    factory_lock: Bit          # FLDO: the factory locked (and filled) the ESN
    user_lock: Bit             # LDSO: the whole area is locked


@dataclass(frozen=True)
class IndividualLocks:
    """Per-block locks, in force while the protection's `select` bit is set: one volatile lock
    per 4 KiB sector here (the parts lock 64 KiB blocks and the 4 KiB sectors of the top and
    bottom blocks: every lock covers whole sectors). All are set at power-up and by a reset;
    `global_unlock`/`global_lock` (98h/7Eh, after a write enable) clear or set them all.
    `select_opcode` is the command that sets the select bit for good (Macronix WPSEL, 68h),
    None where a status write sets it (Winbond WPS in SR3)."""

    global_unlock: int = 0x98
    global_lock: int = 0x7E
    select_opcode: int | None = None


@dataclass(frozen=True)
class PartSpec:
    name: str                                  # the `sim create --chip` name
    description: str
    jedec: bytes                               # 9Fh answer (manufacturer, type, capacity)
    device_id: int                             # 90h / ABh device byte
    registers: tuple[Register, ...]            # [0] is read by 05h and holds WIP/WEL
    status_writes: Mapping[int, tuple[int, ...]]   # opcode -> registers it writes, in byte order
    protection: BlockProtection
    erases: Mapping[int, int]                  # block-erase opcode -> bytes
    busy: Mapping[int, tuple[float, float]]    # opcode -> (typical, maximum) seconds
    sfdp: bytes
    chip_erases: tuple[int, ...] = (0x60, 0xC7)
    # Status-register lock: SRP1 (with SRP0) as GigaDevice and Winbond have it; None when the
    # only lock is SRWD with WP#, which the board keeps high (inactive).
    lock_bit: Bit | None = None
    one_byte_clears: int = 0                   # register-1 bits a one-byte 01h clears
    volatile_enable: bool = False              # 50h arms a volatile status write
    suspend: Suspend | None = None
    security: SecurityRegisters | None = None
    unique_id: int = 0                         # bytes 4Bh returns (after 4 bytes of address/dummy)
    secured_otp: SecuredOtp | None = None
    qpi_enter: int | None = None               # opcode that switches the part to 4-line commands
    individual_locks: IndividualLocks | None = None
    # (program-failed bit, erase-failed bit) the part sets itself (Macronix P_FAIL, E_FAIL in
    # SCUR): each program (erase) leaves its flag set when it failed or was refused, clear otherwise.
    fail_flags: tuple[Bit, Bit] | None = None
    notes: tuple[str, ...] = field(default=())
    # A calibrated part whose busy times varied from operation to operation on the real chip:
    # opcode -> (stdev, least, most) seconds around the typical figure (calibration.py).
    busy_spread: Mapping[int, tuple[float, float, float]] = field(default_factory=dict)
    # Registers amdflash's driver never reads (so a hardware report has no value for them).
    unread_registers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if len(self.registers) > 4:
            raise ValueError("the chip region holds at most four status registers")

    @property
    def register_by_opcode(self) -> dict[int, int]:
        return {r.read: i for i, r in enumerate(self.registers)}
