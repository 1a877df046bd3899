"""Block protection decoding: which addresses the chip silently refuses to change.

Knowing the protected range lets a write be refused up front with a clear message,
instead of the chip ignoring it and only a read-back noticing. Each part's layout
(chips.py) says where its bits are and how they decode (docs/flash-chip.md):

* "spi25": flashrom's generic decoder (writeprotect_ranges.c, decode_range_spi25),
  worked out for 2 MiB: BP = 0 protects nothing, all ones everything, otherwise
  64 KiB × 2^(BP−1) (with SEC=1: 4 KiB × 2^(BP−1), at most 32 KiB), at the top unless
  TB=1; CMP=1 protects the complement instead, so CMP=1 with BP=0 protects everything.
* "table": one (side, bytes) entry per BP value, as the part's datasheet lists them,
  for parts whose ranges follow no formula.

A part amdflash only knows from its SFDP has no layout: JESD216's tables do not say
where block-protect bits are. Its protection is `UNKNOWN`, and nothing that needs it
(refusing a protected target, clearing CMP) can be done for it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from collections.abc import Sequence

SR1_WIP, SR1_WEL = 0x01, 0x02
# SR2 bits of the GD25LQ16E and W25Q16DW (the layout `decode` reads).
SR2_QE, SR2_CMP = 0x02, 0x40
SR2_LB = 0x38

Bit = tuple[int, int]           # (index in the part's status registers, bit number)
Side = Literal["top", "bottom"]


@dataclass(frozen=True)
class Protection:
    bp: int
    tb: bool
    sec: bool
    cmp: bool
    start: int      # protected range [start, start + length)
    length: int
    bits: str = ""  # the part's protection bits as read, e.g. "BP=1 TB=0 SEC=0 CMP=0"
    known: bool = True
    individual: str = ""   # "WPS"/"WPSEL" when per-block locks replace the BP bits

    @property
    def end(self) -> int:
        return self.start + self.length

    def overlaps(self, address: int, size: int) -> bool:
        return self.length > 0 and address < self.end and self.start < address + size

    def describe(self) -> str:
        if not self.known:
            return "unknown: the part's SFDP tables do not describe its block-protection bits"
        if self.individual:
            return (f"{self.bits}: individual block locks in force (the BP bits are ignored; every block has "
                    "its own lock, which amdflash neither reads nor changes): any address may be protected")
        if not self.length:
            return f"{self.bits}: nothing protected"
        return f"{self.bits}: {self.start:#08x}-{self.end - 1:#08x} protected ({self.length // 1024} KiB)"


UNKNOWN = Protection(0, False, False, False, 0, 0, known=False)


@dataclass(frozen=True)
class ProtectionLayout:
    bp: tuple[Bit, ...]                                # least significant first
    tb: Bit | None = None
    sec: Bit | None = None
    cmp: Bit | None = None
    table: tuple[tuple[Side, int], ...] | None = None  # per BP value, for "table" layouts
    # SRP1 (status register protect 1): set, the status registers ignore every write until
    # a power cycle (or for ever, with SRP0), whatever WP# does.
    srp1: Bit | None = None
    # Write-protection selection (Winbond SR3 WPS, Macronix SCUR WPSEL): set, the BP bits are
    # ignored and every block has its own lock bit instead (flashrom's writeprotect.c refuses
    # that state too). amdflash does not read those locks: the protection is then "any".
    wps: Bit | None = None
    wps_name: str = "WPS"

    def status_locked(self, regs: Sequence[int]) -> bool:
        """The status registers cannot be written by software (SRP1 set)."""
        return self.srp1 is not None and bool(regs[self.srp1[0]] >> self.srp1[1] & 1)

    @property
    def scheme(self) -> str:
        return "table" if self.table is not None else "spi25"

    def decode(self, regs: Sequence[int], size: int = 0x200000) -> Protection:
        def on(bit: Bit | None) -> bool:
            return bit is not None and bool(regs[bit[0]] >> bit[1] & 1)

        bp = sum(1 << i for i, bit in enumerate(self.bp) if on(bit))
        tb, sec, cmp = on(self.tb), on(self.sec), on(self.cmp)
        names = [f"BP={bp}"] + [f"{name}={int(value)}" for name, bit, value in
                                (("TB", self.tb, tb), ("SEC", self.sec, sec), ("CMP", self.cmp, cmp))
                                if bit is not None]
        if self.status_locked(regs):
            names.append("SRP1=1 (status registers locked)")
        if on(self.wps):
            names.append(f"{self.wps_name}=1")
            return Protection(bp, tb, sec, cmp, 0, size, " ".join(names), individual=self.wps_name)
        if self.table is not None:
            side, length = self.table[bp]
            start = 0 if side == "bottom" else size - length
            return Protection(bp, tb, sec, cmp, start if length else 0, length, " ".join(names))
        top = (1 << len(self.bp)) - 1
        if bp == 0:
            length = 0
        elif bp == top:
            length = size
        elif sec:
            length = min(0x1000 << (bp - 1), 0x8000)
        else:
            length = min(0x10000 << (bp - 1), size)
        start = 0 if tb else size - length
        if cmp:
            # The complement of [start, start+length): one contiguous range on the other side.
            start, length = (length, size - length) if tb else (0, size - length)
        return Protection(bp, tb, sec, cmp, start if length else 0, length, " ".join(names))

    def without_cmp(self, regs: Sequence[int]) -> list[int]:
        """The registers as they read once CMP is cleared."""
        out = list(regs)
        if self.cmp is not None:
            out[self.cmp[0]] &= ~(1 << self.cmp[1])
        return out


# BP2..BP0 in SR1 bits 2..4, TB bit 5, SEC bit 6, CMP in SR2 bit 6, SRP1 in SR2 bit 0
# (GD25LQ16E, W25Q16DW).
BP_TB_SEC_CMP = ProtectionLayout(bp=((0, 2), (0, 3), (0, 4)), tb=(0, 5), sec=(0, 6), cmp=(1, 6), srp1=(1, 0))


def decode(sr1: int, sr2: int, size: int = 0x200000) -> Protection:
    """SR1/SR2 of a BP/TB/SEC/CMP part (the GD25LQ16E's layout) decoded."""
    return BP_TB_SEC_CMP.decode((sr1, sr2), size)
