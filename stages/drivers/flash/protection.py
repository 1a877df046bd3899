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

Where credible sources read the same bits differently (docs/flash-chip.md, "Where the
sources disagree"), a layout lists every reading (`Reading`, each naming its source); the
first is the one the part is modelled on. A write is refused when ANY reading calls its
target protected: amdflash takes the larger protected range, since a chip that follows
the other reading would silently ignore the write and only the read-back would notice.

A part amdflash only knows from its SFDP has no layout: JESD216's tables do not say
where block-protect bits are. Its protection is `UNKNOWN`, and nothing that needs it
(refusing a protected target, clearing CMP) can be done for it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from collections.abc import Sequence

from amdflash.stages.drivers.flash.geometry import FLASH_SIZE

SR1_WIP, SR1_WEL = 0x01, 0x02
# SR2 bits of the GD25LQ16E and W25Q16DW (the layout `decode` reads).
SR2_QE, SR2_CMP = 0x02, 0x40
SR2_LB = 0x38

Bit = tuple[int, int]           # (index in the part's status registers, bit number)
Side = Literal["top", "bottom"]


@dataclass(frozen=True)
class Range:
    """What one source's reading of the bits protects: [start, start + length)."""

    source: str
    start: int
    length: int

    def overlaps(self, address: int, size: int) -> bool:
        return self.length > 0 and address < self.start + self.length and self.start < address + size

    def describe(self) -> str:
        if not self.length:
            return "nothing"
        return f"{self.start:#08x}-{self.start + self.length - 1:#08x} ({self.length // 1024} KiB)"


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
    # Other sources' readings of the same bits where they differ from this one (start,
    # length): a target any of them calls protected is refused as protected.
    others: tuple[Range, ...] = ()
    source: str = ""       # the source of start/length's reading, named when others differ

    @property
    def end(self) -> int:
        return self.start + self.length

    def overlaps(self, address: int, size: int) -> bool:
        own = self.length > 0 and address < self.end and self.start < address + size
        return own or any(r.overlaps(address, size) for r in self.others)

    def readings(self) -> tuple[Range, ...]:
        """Every source's reading, this one first."""
        return (Range(self.source, self.start, self.length), *self.others)

    def describe(self) -> str:
        if not self.known:
            return "unknown: the part's SFDP tables do not describe its block-protection bits"
        if self.individual:
            return (f"{self.bits}: individual block locks in force (the BP bits are ignored; every block has "
                    "its own lock, which amdflash neither reads nor changes): any address may be protected")
        if self.others:
            readings = "; ".join(f"{r.describe()} by {r.source}" for r in self.readings())
            return (f"{self.bits}: read more than one way — {readings}; amdflash takes every one of these "
                    "ranges as protected")
        if not self.length:
            return f"{self.bits}: nothing protected"
        return f"{self.bits}: {self.start:#08x}-{self.end - 1:#08x} protected ({self.length // 1024} KiB)"


UNKNOWN = Protection(0, False, False, False, 0, 0, known=False)


Rule = Literal["spi25", "spi25-bp11-all", "table"]


@dataclass(frozen=True)
class Reading:
    """One source's rule for the bits: "spi25" flashrom's decode_range_spi25 (ufprog's
    wpr_3bp_tb_sec_cmp gives the same ranges for 3 BP bits); "spi25-bp11-all" the same, except
    that BP2..BP1 = 11 protects everything whatever SEC says (the Winbond/GigaDevice datasheet
    tables); "table" the layout's per-BP table. `tb` forces the TB value for a part whose TB
    bit amdflash does not read (the MX25U1632F/1633F keep it in a one-time configuration bit)."""

    source: str
    rule: Rule
    tb: bool | None = None


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
    # ignored and every block has its own lock bit instead. flashrom's writeprotect.c gives up
    # on that state only when the bit cannot be written back (Macronix's one-time WPSEL), not on
    # Winbond's writable WPS. amdflash does not read those locks: the protection is then "any".
    wps: Bit | None = None
    wps_name: str = "WPS"
    # Bits of the WPS register that read 0 on every part that has the register: one set means
    # no part drove the line (a W25Q16DW has no SR3: 15h reads 0xFF), so there is no WPS to
    # honour. Only for a layout that covers parts with and without the register.
    wps_reserved: int = 0
    # Every source's reading, the one the part is modelled on first (() : "table" if the
    # layout has a table, else "spi25", from flashrom).
    readings: tuple[Reading, ...] = ()

    def status_locked(self, regs: Sequence[int]) -> bool:
        """The status registers cannot be written by software (SRP1 set)."""
        return self.srp1 is not None and bool(regs[self.srp1[0]] >> self.srp1[1] & 1)

    @property
    def scheme(self) -> str:
        return "table" if self.table is not None else "spi25"

    def decode(self, regs: Sequence[int], size: int = FLASH_SIZE) -> Protection:
        def on(bit: Bit | None) -> bool:
            return bit is not None and bool(regs[bit[0]] >> bit[1] & 1)

        bp = sum(1 << i for i, bit in enumerate(self.bp) if on(bit))
        tb, sec, cmp = on(self.tb), on(self.sec), on(self.cmp)
        names = [f"BP={bp}"] + [f"{name}={int(value)}" for name, bit, value in
                                (("TB", self.tb, tb), ("SEC", self.sec, sec), ("CMP", self.cmp, cmp))
                                if bit is not None]
        if self.status_locked(regs):
            names.append("SRP1=1 (status registers locked)")
        if self.wps is not None and regs[self.wps[0]] & self.wps_reserved:
            names.append(f"no {self.wps_name} (its register reads {regs[self.wps[0]]:#04x}, reserved bits set: "
                         "the part has none)")
        elif on(self.wps):
            names.append(f"{self.wps_name}=1")
            return Protection(bp, tb, sec, cmp, 0, size, " ".join(names), individual=self.wps_name)
        ranges = [self.reading_range(r, bp, tb, sec, cmp, size) for r in self.all_readings()]
        first = ranges[0]
        others = tuple(r for r in ranges[1:] if (r.start, r.length) != (first.start, first.length))
        return Protection(bp, tb, sec, cmp, first.start, first.length, " ".join(names), others=others,
                          source=first.source)

    def all_readings(self) -> tuple[Reading, ...]:
        return self.readings or (Reading("flashrom", "table" if self.table is not None else "spi25"),)

    def reading_range(self, reading: Reading, bp: int, tb: bool, sec: bool, cmp: bool, size: int) -> Range:
        """What `reading` says BP/TB/SEC/CMP protect."""
        if reading.tb is not None:
            tb = reading.tb
        if reading.rule == "table":
            assert self.table is not None
            side, length = self.table[bp]
            start = 0 if side == "bottom" else size - length
            return Range(reading.source, start if length else 0, length)
        top = (1 << len(self.bp)) - 1
        if bp == 0:
            length = 0
        elif bp == top or (reading.rule == "spi25-bp11-all" and bp >> (len(self.bp) - 2) == 0b11):
            length = size
        elif sec:
            length = min(0x1000 << (bp - 1), 0x8000)
        else:
            length = min(0x10000 << (bp - 1), size)
        start = 0 if tb else size - length
        if cmp:
            # The complement of [start, start+length): one contiguous range on the other side.
            start, length = (length, size - length) if tb else (0, size - length)
        return Range(reading.source, start if length else 0, length)

    def probe_setting(self, regs: Sequence[int], address: int, size: int = FLASH_SIZE
                      ) -> tuple[int, tuple[str, ...], tuple[str, ...]] | None:
        """A value of the first status register (its BP/TB/SEC bits changed, CMP and the rest
        as read) under which the readings disagree about the 4 KiB at `address`: (value,
        sources calling it protected, sources calling it writable), or None if there is none.
        Writing a byte there under that setting and reading it back tells which the chip follows."""
        bits = [b for b in (*self.bp, self.tb, self.sec) if b is not None and b[0] == 0]
        base = regs[0] & ~sum(1 << b for _, b in bits)
        for combo in range(1, 1 << len(bits)):
            value = base | sum(1 << b for i, (_, b) in enumerate(bits) if combo >> i & 1)
            decoded = self.decode((value, *regs[1:]), size)
            protected = tuple(r.source for r in decoded.readings() if r.overlaps(address, 0x1000))
            writable = tuple(r.source for r in decoded.readings() if not r.overlaps(address, 0x1000))
            if protected and writable:
                return value, protected, writable
        return None

    def without_cmp(self, regs: Sequence[int]) -> list[int]:
        """The registers as they read once CMP is cleared."""
        out = list(regs)
        if self.cmp is not None:
            out[self.cmp[0]] &= ~(1 << self.cmp[1])
        return out


# The BP/TB/SEC/CMP parts' readings. flashrom (decode_range_spi25) and ufprog
# (wpr_3bp_tb_sec_cmp) agree on all 64 settings; the Winbond/GigaDevice datasheet tables (as
# recalled: no datasheet text reached here) differ at SEC=1, BP=6: everything, where both
# programs say 32 KiB (and so, with CMP=1, nothing rather than all but 32 KiB).
SPI25_READINGS = (
    Reading("flashrom decode_range_spi25 and ufprog wpr_3bp_tb_sec_cmp", "spi25"),
    Reading("the Winbond/GigaDevice datasheet tables (recalled)", "spi25-bp11-all"),
)

# BP2..BP0 in SR1 bits 2..4, TB bit 5, SEC bit 6, CMP in SR2 bit 6, SRP1 in SR2 bit 0
# (GD25LQ16E, W25Q16DW).
BP_TB_SEC_CMP = ProtectionLayout(bp=((0, 2), (0, 3), (0, 4)), tb=(0, 5), sec=(0, 6), cmp=(1, 6), srp1=(1, 0),
                                 readings=SPI25_READINGS)


def decode(sr1: int, sr2: int, size: int = FLASH_SIZE) -> Protection:
    """SR1/SR2 of a BP/TB/SEC/CMP part (the GD25LQ16E's layout) decoded."""
    return BP_TB_SEC_CMP.decode((sr1, sr2), size)
