"""The cost model (docs/cost-model.md): what each transport operation charges, in seconds, and when it lands.

Every figure quoted by the project is measured on this yardstick, so the numbers are
fixed here and change only through an issue.

When an access lands (the one statement of the rule; the emulated board and the floor
computation both take it from here): an access observes and changes the board at the
moment its request reaches the board.

* `asm24`: after the fixed latency of the USB transfer that carries the request. A
  single-TLP register access rides in a control transfer and lands when that transfer's
  100 µs have passed (a read's completion then costs a second control transfer). A
  streamed read is armed by a control transfer and the firmware fetches the first chunk
  at once, so it lands after the control transfer; the bulk IN that returns the data
  follows. A streamed write lands when its bulk OUT has taken its fixed latency, after
  the arming control transfer; the payload time follows. Every dword of one streamed
  access lands at the same instant, in ascending address order.
* `pcie`: at once; the per-dword cost follows.
* `ideal`: at once, and nothing costs anything.
"""
from __future__ import annotations

from dataclasses import dataclass

SPI_REFCLK_HZ = 100e6
SPI_TRANSACTION_OVERHEAD = 1e-6


@dataclass(frozen=True)
class Access:
    """The timing of one BAR access: `lands` seconds after the host starts it, the board
    sees it; `total` seconds after the start the host has its answer."""

    lands: float
    total: float


@dataclass(frozen=True)
class CostProfile:
    name: str
    control: float = 0.0          # one USB control transfer
    bulk: float = 0.0             # one USB bulk transfer, before payload
    write_byte: float = 0.0       # streamed MMIO write payload, per byte
    read_byte: float = 0.0        # streamed MMIO read payload, per byte
    pcie_read_dword: float = 0.0  # native PCIe register read
    pcie_write_dword: float = 0.0 # native PCIe posted write
    usb: bool = False             # BAR accesses travel as USB transfers
    physical: bool = True         # SPI bus time and flash busy time are charged
    # The SPI bus: a calibrated board (calibration.py) may have measured other figures.
    spi_overhead: float = 1e-6    # SPI_TRANSACTION_OVERHEAD
    spi_refclk_hz: float = 100e6  # SPI_REFCLK_HZ

    # BAR accesses as a whole, for the direct (non-USB-backend) frontends.
    def stream_read(self, size: int) -> Access:
        if self.usb:
            return Access(self.control, self.control + self.bulk + size * self.read_byte)
        return Access(0.0, ((size + 3) >> 2) * self.pcie_read_dword)

    def stream_write(self, size: int) -> Access:
        if self.usb:
            lands = self.control + self.bulk
            return Access(lands, lands + size * self.write_byte)
        return Access(0.0, ((size + 3) >> 2) * self.pcie_write_dword)

    def tlp_read32(self) -> Access:
        # Mode 0: the TLP goes out in a control OUT, the completion comes back in a control IN.
        if self.usb:
            return Access(self.control, 2 * self.control)
        return Access(0.0, self.pcie_read_dword)

    def tlp_write32(self) -> Access:
        # Posted: one control OUT, no completion to fetch.
        if self.usb:
            return Access(self.control, self.control)
        return Access(0.0, self.pcie_write_dword)

    def spi_transaction(self, wire_bytes: int, prescale: int) -> float:
        if not self.physical:
            return 0.0
        return self.spi_overhead + 8 * wire_bytes * (prescale + 1) / self.spi_refclk_hz


def spi_seconds(wire_bytes: int, prescale: int) -> float:
    """SPI time of one ROM_SW transaction: SCK = 100 MHz / (prescale + 1), 8 clocks a byte."""
    return SPI_TRANSACTION_OVERHEAD + 8 * wire_bytes * (prescale + 1) / SPI_REFCLK_HZ


ASM24 = CostProfile(
    name="asm24", control=100e-6, bulk=100e-6,
    write_byte=1 / 3.6e6, read_byte=1 / 1.8e6, usb=True,
)
PCIE = CostProfile(name="pcie", pcie_read_dword=1e-6, pcie_write_dword=0.1e-6)
IDEAL = CostProfile(name="ideal", physical=False)

PROFILES: dict[str, CostProfile] = {p.name: p for p in (ASM24, PCIE, IDEAL)}


def profile(name: str) -> CostProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown transport profile {name!r} (choose from {', '.join(PROFILES)})") from None
