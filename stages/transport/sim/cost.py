"""The cost model of docs/cost-model.md: what each transport operation charges, in seconds.

Every figure quoted by the project is measured on this yardstick, so the numbers are
fixed here and change only through an issue.
"""
from __future__ import annotations

from dataclasses import dataclass

SPI_REFCLK_HZ = 100e6
SPI_TRANSACTION_OVERHEAD = 1e-6


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

    # BAR access as a whole, for the direct (non-USB-backend) frontends.
    def stream_read(self, size: int) -> float:
        if self.usb:
            return self.control + self.bulk + size * self.read_byte
        return ((size + 3) >> 2) * self.pcie_read_dword

    def stream_write(self, size: int) -> float:
        if self.usb:
            return self.control + self.bulk + size * self.write_byte
        return ((size + 3) >> 2) * self.pcie_write_dword

    def tlp_read32(self) -> float:
        # Mode 0: the TLP goes out in a control OUT, the completion comes back in a control IN.
        return 2 * self.control if self.usb else self.pcie_read_dword

    def tlp_write32(self) -> float:
        # Posted: one control OUT, no completion to fetch.
        return self.control if self.usb else self.pcie_write_dword

    def spi_transaction(self, wire_bytes: int, prescale: int) -> float:
        if not self.physical:
            return 0.0
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
