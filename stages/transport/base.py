"""The transport interface: everything the drivers above may ask of a board.

A driver sees a `Bar5` (32-bit register read/write, block read/write) and its `Clock`,
and never learns whether a USB bridge, a sysfs mapping or the emulated board is behind
it. A transport may also offer `diagnostics() -> dict[str, int]`: counts of what went
wrong while it was open, which the run records (the emulated board counts ROM_SW protocol
violations there). Timeouts are measured on the transport's clock so that an emulated board's virtual
time and a real board's wall time are treated alike.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


class TransportError(RuntimeError):
    """A failure of the path to the board (USB, PCIe, mapping), naming the operation."""


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on this transport's clock (monotonic)."""
        ...

    def sleep(self, seconds: float) -> None:
        """Let `seconds` pass on this clock."""
        ...


class WallClock:
    """Real time, for real hardware."""

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


@dataclass
class BoardIdentity:
    """What the transport itself knows about the board it reaches."""

    spec: str                      # e.g. usb:1a2b3c4d, pci:0000:03:00.0, sim:/tmp/board
    kind: str                      # usb | pci | sim
    serial: str | None = None      # bridge serial (USB) or board serial (sim)
    pci_address: str | None = None
    vendor_id: int | None = None
    device_id: int | None = None
    extra: dict[str, object] = field(default_factory=dict)


@runtime_checkable
class Bar5(Protocol):
    """BAR5 of one Navi31 GPU. Offsets are byte offsets; registers are 32-bit LE."""

    # Read-only members: an implementation may hold a more specific clock (WallClock, SimClock).
    @property
    def clock(self) -> Clock: ...

    @property
    def identity(self) -> BoardIdentity: ...

    def read32(self, offset: int) -> int: ...

    def write32(self, offset: int, value: int) -> None: ...

    def read_block(self, offset: int, size: int) -> bytes:
        """Read `size` bytes (dword multiple) at ascending addresses in one access."""
        ...

    def write_block(self, offset: int, data: bytes) -> None:
        """Write dwords at ascending addresses in one access."""
        ...

    def close(self) -> None: ...
