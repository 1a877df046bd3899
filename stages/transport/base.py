"""The transport interface: everything the drivers above may ask of a board.

A driver sees a `Bar5` (32-bit register read/write, block read/write) and its `Clock`,
and never learns whether a USB bridge, a sysfs mapping or the emulated board is behind
it. A transport may also offer `diagnostics() -> dict[str, int]`: counts of what went
wrong while it was open, which the run records (the emulated board counts ROM_SW protocol
violations there). Timeouts are measured on the transport's clock so that an emulated board's virtual
time and a real board's wall time are treated alike.

A board is driven one of two ways, its `Capability`: "bar5", its registers (ROM_SW, the
aperture, the PSP mailbox) through a USB bridge, PCIe or the emulator; or "amdgpu", the
kernel driver's PSP update (transport/amdgpu.py), with no BAR5 at all. What opens a board
(transport/discovery.py; stages/open_transport.py for sim:) decides it once and declares
it in what it returns, a `ThroughBar5` or a `ThroughAmdgpu`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from amdflash.stages.transport.amdgpu import AmdgpuBoard


Capability = Literal["bar5", "amdgpu"]


class TransportError(RuntimeError):
    """A failure of the path to the board (USB, PCIe, mapping), naming the operation."""


class NoBoardFound(TransportError):
    """The spec names no board that is there: nothing was sent to any board (a refusal).
    (Here rather than in discovery.py, so that the runner knows it without importing every
    transport: pyusb, PCI, amdgpu.)"""


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


@dataclass(frozen=True)
class ThroughBar5:
    """A board opened for its registers: capability "bar5"."""

    bar: Bar5
    capability: Literal["bar5"] = "bar5"

    @property
    def identity(self) -> BoardIdentity:
        return self.bar.identity

    def close(self) -> None:
        self.bar.close()


@dataclass(frozen=True)
class ThroughAmdgpu:
    """A board opened through the amdgpu driver: capability "amdgpu" (the PSP update, no BAR5)."""

    board: AmdgpuBoard
    capability: Literal["amdgpu"] = "amdgpu"

    @property
    def identity(self) -> BoardIdentity:
        return self.board.identity

    def close(self) -> None:
        self.board.close()


# What opening a board gives: its `capability` says which, so nothing above asks the type.
OpenBoard = ThroughBar5 | ThroughAmdgpu
