"""Block protection decoding: which addresses the chip silently refuses to change.

BP/TB/SEC/CMP per flashrom's spi25 decoder, derived for a 2 MiB part (docs/flash-chip.md).
Knowing the protected range lets a write be refused up front with a clear message,
instead of the chip ignoring it and only a read-back noticing.
"""
from __future__ import annotations

from dataclasses import dataclass

SR1_WIP, SR1_WEL = 0x01, 0x02
SR2_QE, SR2_CMP = 0x02, 0x40
SR2_LB = 0x38


@dataclass(frozen=True)
class Protection:
    bp: int
    tb: bool
    sec: bool
    cmp: bool
    start: int      # protected range [start, start + length)
    length: int

    @property
    def end(self) -> int:
        return self.start + self.length

    def overlaps(self, address: int, size: int) -> bool:
        return self.length > 0 and address < self.end and self.start < address + size

    def describe(self) -> str:
        bits = f"BP={self.bp} TB={int(self.tb)} SEC={int(self.sec)} CMP={int(self.cmp)}"
        if not self.length:
            return f"{bits}: nothing protected"
        return f"{bits}: {self.start:#08x}-{self.end - 1:#08x} protected ({self.length // 1024} KiB)"


def decode(sr1: int, sr2: int, size: int = 0x200000) -> Protection:
    bp = (sr1 >> 2) & 0x7
    tb = bool(sr1 & 0x20)
    sec = bool(sr1 & 0x40)
    cmp = bool(sr2 & SR2_CMP)
    if bp == 0:
        length = 0
    elif bp == 7:
        length = size
    elif sec:
        length = min(0x1000 << (bp - 1), 0x8000)
    else:
        length = min(0x10000 << (bp - 1), size)
    start = 0 if tb else size - length
    if cmp:
        # The complement of [start, start+length): one contiguous range on the other side.
        start, length = (length, size - length) if tb else (0, size - length)
    return Protection(bp, tb, sec, cmp, start if length else 0, length)
