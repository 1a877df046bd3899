"""BAR5 over native PCIe on Linux: the sysfs `resource5` mapping and `config` file.

A device with a kernel driver bound (amdgpu) is never touched unless the operator asks for
the driver to be unbound: two masters on one register file would corrupt each other's
ROM_SW transactions. MMIO is accessed only as aligned 32-bit loads and stores through a
memoryview of format 'I' (a byte-wise copy of a register range would issue byte reads,
which the SMUIO registers do not promise to support). Needs root for `resource5` and for
config space beyond the first 64 bytes.
"""
from __future__ import annotations

import mmap
import os
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

from amdflash.stages.transport.base import BoardIdentity, TransportError, WallClock
from amdflash.stages.transport.lock import BoardBusy

SYSFS_PCI_DEVICES = Path("/sys/bus/pci/devices")
NAVI31 = (0x1002, 0x744C)
BAR5_SIZE = 0x100000
UNBIND_HELP = ("unbind the kernel driver from the PCI device before use (writes the device address "
               "to the driver's sysfs 'unbind' file)")


class DriverBound(BoardBusy):
    """A kernel driver owns the device: the board is busy, and nothing was touched."""

    def __init__(self, address: str, driver: str, unbind_file: Path):
        RuntimeError.__init__(
            self, f"board busy (kernel driver {driver} is bound to {address}): refusing to touch the device. "
                  f"--unbind-driver would write '{address}' to {unbind_file}, detaching {driver} from it "
                  "(the display and any compute work on this GPU stop)")
        self.pid = None
        self.driver = driver


class DriverStillBound(BoardBusy):
    """Writing `unbind` did not detach the driver: refused, the device untouched."""

    def __init__(self, address: str, driver: str, unbind_file: Path):
        RuntimeError.__init__(
            self, f"board busy: kernel driver {driver} is still bound to {address} after writing "
                  f"'{address}' to {unbind_file}; refusing to touch the device")
        self.pid = None
        self.driver = driver


def write_unbind(unbind_file: Path, address: str) -> None:
    """Ask the kernel to detach the driver bound to `address`."""
    unbind_file.write_text(address)


@dataclass(frozen=True)
class PciDevice:
    address: str                 # DDDD:BB:DD.F
    path: Path
    vendor_id: int
    device_id: int
    driver: str | None

    @property
    def spec(self) -> str:
        return f"pci:{self.address}"


def _hex_file(path: Path) -> int:
    return int(path.read_text().strip(), 16)


def _driver(path: Path) -> str | None:
    link = path / "driver"
    return os.path.basename(os.readlink(link)) if link.is_symlink() else None


def find_devices(root: str | os.PathLike[str] = SYSFS_PCI_DEVICES) -> list[PciDevice]:
    """Navi31 functions (1002:744C) under a sysfs devices directory, by address."""
    root = Path(root)
    found: list[PciDevice] = []
    try:
        entries = sorted(root.iterdir())
    except FileNotFoundError:
        return []
    for entry in entries:
        try:
            ids = (_hex_file(entry / "vendor"), _hex_file(entry / "device"))
        except (OSError, ValueError):
            continue
        if ids == NAVI31:
            found.append(PciDevice(entry.name, entry, *ids, _driver(entry)))
    return found


def normalise_address(text: str) -> str:
    """Accept BB:DD.F for domain 0, as lspci prints it."""
    return text if text.count(":") == 2 else f"0000:{text}"


class PciBar5:
    """BAR5 of one Navi31 reached through sysfs."""

    def __init__(self, device: PciDevice, unbind_driver: bool = False, announce=print):
        if sys.byteorder != "little":
            raise TransportError("native PCIe access assumes a little-endian host (the registers are little-endian)")
        self.device = device
        self.clock = WallClock()
        self._enabled_here = False
        self._config_fd: int | None = None
        self._map: mmap.mmap | None = None
        self.mmio: memoryview | None = None
        self._closed = False
        try:
            self._release_from_driver(unbind_driver, announce)
            self._enable()
            self._config_fd = self._open(device.path / "config", os.O_RDONLY, "config space")
            ids = self.config_read(0, 4)
            if (ids & 0xFFFF, ids >> 16) != (device.vendor_id, device.device_id):
                raise TransportError(f"{device.address}: config space reads {ids & 0xFFFF:04x}:{ids >> 16:04x}, "
                                     f"sysfs says {device.vendor_id:04x}:{device.device_id:04x}")
            self._map_bar5()
        except BaseException:
            self.close()
            raise
        self.identity = BoardIdentity(
            spec=device.spec, kind="pci", pci_address=device.address, vendor_id=device.vendor_id,
            device_id=device.device_id, extra={"sysfs": str(device.path), "unbound_driver": device.driver
                                               if unbind_driver else None},
        )

    # -- opening --------------------------------------------------------------------------
    def _release_from_driver(self, unbind: bool, announce) -> None:
        dev = self.device
        driver = _driver(dev.path)
        if driver is None:
            return
        unbind_file = dev.path / "driver" / "unbind"
        if not unbind:
            raise DriverBound(dev.address, driver, unbind_file)
        announce(f"unbinding kernel driver {driver} from {dev.address} (writing to {unbind_file})")
        try:
            write_unbind(unbind_file, dev.address)
        except OSError as e:
            raise TransportError(f"{dev.address}: unbinding {driver} via {unbind_file} failed: {e.strerror} "
                                 "(needs root)") from None
        # The kernel detaches the driver before the write returns. If the link is still
        # there, something else owns the device: touching it now would make two masters.
        still = _driver(dev.path)
        if still is not None:
            raise DriverStillBound(dev.address, still, unbind_file)

    def _enable(self) -> None:
        enable = self.device.path / "enable"
        try:
            if enable.read_text().strip() == "0":
                enable.write_text("1")
                self._enabled_here = True
        except OSError as e:
            raise TransportError(f"{self.device.address}: enabling the device via {enable} failed: "
                                 f"{e.strerror} (needs root)") from None

    def _open(self, path: Path, flags: int, what: str) -> int:
        try:
            return os.open(path, flags | os.O_CLOEXEC)
        except OSError as e:
            raise TransportError(f"{self.device.address}: opening {what} ({path}) failed: {e.strerror}"
                                 f"{' (needs root)' if e.errno in (1, 13) else ''}") from None

    def _map_bar5(self) -> None:
        path = self.device.path / "resource5"
        fd = self._open(path, os.O_RDWR | os.O_SYNC, "BAR5")
        try:
            size = os.fstat(fd).st_size
            if size < BAR5_SIZE:
                raise TransportError(f"{self.device.address}: BAR5 ({path}) is {size:#x} bytes, "
                                     f"expected the {BAR5_SIZE:#x}-byte register aperture")
            self._map = mmap.mmap(fd, BAR5_SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as e:
            raise TransportError(f"{self.device.address}: mapping BAR5 failed: {e.strerror}") from None
        finally:
            os.close(fd)
        self.mmio = memoryview(self._map).cast("I")

    # -- config space ---------------------------------------------------------------------
    def config_read(self, offset: int, size: int = 4) -> int:
        if size not in (1, 2, 4) or offset % size:
            raise ValueError(f"config read {offset:#x}/{size}: naturally aligned 1, 2 or 4 bytes only")
        assert self._config_fd is not None
        raw = os.pread(self._config_fd, size, offset)
        if len(raw) != size:
            raise TransportError(f"{self.device.address}: config read {offset:#x} returned {len(raw)} bytes "
                                 "(beyond 64 bytes needs root)")
        return int.from_bytes(raw, "little")

    # -- Bar5 -----------------------------------------------------------------------------
    def _index(self, offset: int, size: int) -> int:
        if offset & 3 or size & 3 or offset < 0 or size < 0 or offset + size > BAR5_SIZE:
            raise ValueError(f"BAR5 access {offset:#x}+{size:#x}: dword-aligned and inside the 1 MiB "
                             "aperture only")
        if self.mmio is None:
            raise TransportError(f"{self.device.address}: BAR5 used after close")
        return offset >> 2

    def read32(self, offset: int) -> int:
        return self.mmio[self._index(offset, 4)]  # type: ignore[index]

    def write32(self, offset: int, value: int) -> None:
        self.mmio[self._index(offset, 4)] = value & 0xFFFFFFFF  # type: ignore[index]

    def read_block(self, offset: int, size: int) -> bytes:
        first = self._index(offset, size)
        mmio = self.mmio
        assert mmio is not None
        # One load per dword, in ascending order: never a slice copy of MMIO.
        return struct.pack(f"<{size >> 2}I", *[mmio[i] for i in range(first, first + (size >> 2))])

    def write_block(self, offset: int, data: bytes) -> None:
        first = self._index(offset, len(data))
        mmio = self.mmio
        assert mmio is not None
        for i, value in enumerate(struct.unpack(f"<{len(data) >> 2}I", data)):
            mmio[first + i] = value

    def close(self) -> None:
        """Unmap, and disable the device again if this transport enabled it. Never raises."""
        if self._closed:
            return
        self._closed = True
        for step in (self._unmap, self._close_config, self._disable):
            try:
                step()
            except (OSError, BufferError, ValueError):
                pass

    def _unmap(self) -> None:
        if self.mmio is not None:
            mmio, self.mmio = self.mmio, None
            mmio.release()
        if self._map is not None:
            mapping, self._map = self._map, None
            mapping.close()

    def _close_config(self) -> None:
        if self._config_fd is not None:
            fd, self._config_fd = self._config_fd, None
            os.close(fd)

    def _disable(self) -> None:
        if self._enabled_here:
            self._enabled_here = False
            (self.device.path / "enable").write_text("0")
