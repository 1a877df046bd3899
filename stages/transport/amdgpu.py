"""A healthy board through the amdgpu kernel driver: the PSP writes the IFWI (`psp_vbflash`).

This transport has no BAR5: the kernel driver owns the device, and amdflash only uses what
the driver exposes under the device's sysfs directory and its DRM node.

What the driver does (amdgpu_psp.c, psp_v13_0.c) and how fwupd's amd-gpu plugin uses it:
* `psp_vbflash` (binary attribute): writes collect the image in a kernel buffer (at most
  3 MiB); a read hands the buffer to the PSP ("update SPI ROM") and returns no data, or the
  error of that hand-over. fwupd writes the whole image, then reads once to trigger.
* `psp_vbflash_status` reads "0x%x": 0 until the PSP has the image, 1 while it works (the
  response register's bit 31 clear), then the PSP's response register; 0x80000000 is
  success, bit 31 with a non-zero low half is a failure the driver itself logs as such.
  fwupd polls it every 100 ms, at most 1,500 times.
* The PSP picks the partition it writes (the inactive one, per fwupd's plugin notes), and the
  board runs the new firmware after a reboot: this is not a byte-identical rewrite.
* The running VBIOS: `DRM_IOCTL_AMDGPU_INFO` with query AMDGPU_INFO_VBIOS (0x1B), sub-query
  AMDGPU_INFO_VBIOS_INFO (3) fills `struct drm_amdgpu_info_vbios` {name[64], vbios_pn[64],
  version, pad, vbios_ver_str[32], date[32]}; the sysfs `vbios_version` attribute prints the
  same part number; the PCI `rom` file holds the VBIOS itself (the PCI core refuses reads
  until "1" is written to it).
* A proposed debugfs file `psp_spirom_dump` (amd-gfx, 2025) returns the whole SPI ROM as
  the PSP reads it; when present it lets `verify` compare partitions. Not found in a mainline
  release here: used only when it exists.

Where things live is configurable for tests (an emulated tree): the sysfs devices directory
(AMDFLASH_SYSFS_PCI, shared with the PCI transport), the DRM device nodes (AMDFLASH_DEV_DRI,
default /dev/dri) and the DRM debugfs directory (AMDFLASH_DEBUGFS_DRI, default
/sys/kernel/debug/dri). The status poll runs on an injectable clock.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Callable

from amdflash.stages.atom import AtomError, BytesSource, parse_atom
from amdflash.stages.transport.base import BoardIdentity, Clock, TransportError, WallClock
from amdflash.stages.transport.pci import PciDevice, find_devices

ENV_DEV_DRI = "AMDFLASH_DEV_DRI"
ENV_DEBUGFS_DRI = "AMDFLASH_DEBUGFS_DRI"
DRIVER = "amdgpu"
VBFLASH, VBFLASH_STATUS = "psp_vbflash", "psp_vbflash_status"
MAX_IMAGE = 3 * 1024 * 1024              # the driver's buffer
SUCCESS, NOT_STARTED, IN_PROGRESS = 0x80000000, 0x0, 0x1
READY = 0x80000000
MAX_POLLS, POLL_INTERVAL = 1500, 0.1
SPIROM_DUMP = "psp_spirom_dump"

# DRM_IOW(DRM_COMMAND_BASE + DRM_AMDGPU_INFO, struct drm_amdgpu_info): 'd', 0x45, 32 bytes.
DRM_IOCTL_AMDGPU_INFO = 1 << 30 | 32 << 16 | ord("d") << 8 | 0x40 + 0x05
AMDGPU_INFO_VBIOS, AMDGPU_INFO_VBIOS_INFO = 0x1B, 0x3
INFO_REQUEST = struct.Struct("<QII II 8x")       # return pointer, size, query, vbios type, offset
VBIOS_INFO = struct.Struct("<64s64sII32s32s")     # name, vbios_pn, version, pad, vbios_ver_str, date

Ioctl = Callable[[int, int, Any], Any]


class VbflashError(TransportError):
    """The PSP update through amdgpu failed: the kernel refused, the PSP answered an error, or no answer came."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class AmdgpuDevice:
    pci: PciDevice

    @property
    def address(self) -> str:
        return self.pci.address

    @property
    def path(self) -> Path:
        return self.pci.path

    @property
    def spec(self) -> str:
        return f"amdgpu:{self.address}"

    @property
    def can_flash(self) -> bool:
        return (self.path / VBFLASH).exists() and (self.path / VBFLASH_STATUS).exists()


def find_amdgpu(root: str | os.PathLike[str]) -> list[AmdgpuDevice]:
    """Navi31 functions with the amdgpu driver bound, by address."""
    return [AmdgpuDevice(d) for d in find_devices(root) if d.driver == DRIVER]


@dataclass(frozen=True)
class VbiosInfo:
    part_number: str
    source: str                       # where it was read
    version: str | None = None
    name: str | None = None
    date: str | None = None
    version_code: int | None = None   # drm_amdgpu_info_vbios.version (the ATOM firmware revision dword)


@dataclass
class AmdgpuBoard:
    """One amdgpu-bound Navi31: the running VBIOS's identity, and the PSP update."""

    device: AmdgpuDevice
    clock: Clock = field(default_factory=WallClock)
    ioctl: Ioctl = fcntl.ioctl
    dev_dri: Path = field(default_factory=lambda: Path(os.environ.get(ENV_DEV_DRI) or "/dev/dri"))
    debugfs_dri: Path = field(default_factory=lambda: Path(os.environ.get(ENV_DEBUGFS_DRI)
                                                            or "/sys/kernel/debug/dri"))

    def __post_init__(self) -> None:
        d = self.device
        if d.pci.driver != DRIVER:
            raise TransportError(f"{d.spec}: the amdgpu driver is not bound to {d.address} "
                                 f"(driver: {d.pci.driver or 'none'}); use pci:{d.address} instead")
        self.identity = BoardIdentity(
            spec=d.spec, kind="amdgpu", pci_address=d.address, vendor_id=d.pci.vendor_id, device_id=d.pci.device_id,
            extra={"sysfs": str(d.path), "driver": DRIVER, "psp_vbflash": d.can_flash})

    # -- the running VBIOS -------------------------------------------------------------------
    def drm_nodes(self) -> list[Path]:
        """The device's DRM nodes: render node first (the INFO ioctl needs no DRM master)."""
        try:
            names = sorted(os.listdir(self.device.path / "drm"))
        except OSError:
            return []
        ordered = [n for n in names if n.startswith("renderD")] + [n for n in names if n.startswith("card")]
        return [self.dev_dri / n for n in ordered]

    def vbios_info(self, allow_rom: bool = True) -> tuple[VbiosInfo | None, list[str]]:
        """The running VBIOS's part number: the INFO ioctl, else sysfs `vbios_version`, else the
        `rom` file (only when `allow_rom`: reading it means enabling it). Notes say what failed."""
        notes: list[str] = []
        for read in (self._from_ioctl, self._from_vbios_version) + ((self._from_rom,) if allow_rom else ()):
            try:
                return read(), notes
            except (OSError, ValueError, TransportError) as e:
                notes.append(str(e))
        return None, notes

    def _from_ioctl(self) -> VbiosInfo:
        nodes = self.drm_nodes()
        if not nodes:
            raise TransportError(f"DRM_IOCTL_AMDGPU_INFO: no DRM node listed under {self.device.path / 'drm'}")
        node = nodes[0]
        buffer = ctypes.create_string_buffer(VBIOS_INFO.size)
        request = bytearray(INFO_REQUEST.pack(ctypes.addressof(buffer), VBIOS_INFO.size, AMDGPU_INFO_VBIOS,
                                              AMDGPU_INFO_VBIOS_INFO, 0))
        try:
            fd = os.open(node, os.O_RDWR | os.O_CLOEXEC)
        except OSError as e:
            raise TransportError(f"DRM_IOCTL_AMDGPU_INFO: cannot open {node}: {e.strerror}") from None
        try:
            self.ioctl(fd, DRM_IOCTL_AMDGPU_INFO, request)
        except OSError as e:
            raise TransportError(f"DRM_IOCTL_AMDGPU_INFO (AMDGPU_INFO_VBIOS) on {node} failed: "
                                 f"{e.strerror or errno.errorcode.get(e.errno or 0, e)}") from None
        finally:
            os.close(fd)
        return decode_vbios_info(buffer.raw, f"DRM_IOCTL_AMDGPU_INFO ({node})")

    def _from_vbios_version(self) -> VbiosInfo:
        path = self.device.path / "vbios_version"
        try:
            text = path.read_text(errors="replace").strip()
        except OSError as e:
            raise TransportError(f"sysfs {path}: {e.strerror}") from None
        if not text:
            raise TransportError(f"sysfs {path} is empty")
        return VbiosInfo(text, f"sysfs {path}")

    def _from_rom(self) -> VbiosInfo:
        rom = self.read_rom()
        try:
            atom = parse_atom(BytesSource(rom))
        except AtomError as e:
            raise TransportError(f"rom file {self.device.path / 'rom'}: {e}") from None
        return VbiosInfo(atom.part_number, f"rom file {self.device.path / 'rom'}", atom.version, atom.model_name,
                         atom.date)

    def read_rom(self) -> bytes:
        """The PCI expansion ROM file. The kernel refuses a read (EINVAL) until "1" is written to
        it; then it is enabled for the read and disabled again after."""
        path = self.device.path / "rom"
        try:
            try:
                return path.read_bytes()
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
            path.write_text("1")
            try:
                return path.read_bytes()
            finally:
                path.write_text("0")
        except OSError as e:
            raise TransportError(f"rom file {path}: {e.strerror}") from None

    def read_spirom(self, size: int) -> tuple[bytes | None, str]:
        """The whole SPI ROM through the debugfs dump, when the driver offers it: (bytes, where) or (None, why not)."""
        minors = [n[4:] for n in (p.name for p in self.drm_nodes()) if n.startswith("card")]
        for name in [*minors, self.device.address]:
            path = self.debugfs_dri / name / SPIROM_DUMP
            if path.exists():
                try:
                    with open(path, "rb") as f:
                        return f.read(size), str(path)
                except OSError as e:
                    return None, f"{path}: {e.strerror}"
        return None, f"no {SPIROM_DUMP} under {self.debugfs_dri} (the driver offers no flash dump)"

    # -- the PSP update ----------------------------------------------------------------------
    def stage_image(self, image: bytes) -> None:
        """Hand the image to the driver's buffer (not yet to the PSP)."""
        if len(image) > MAX_IMAGE:
            raise VbflashError(f"image is {len(image):#x} bytes; the driver takes at most {MAX_IMAGE:#x}")
        path = self.device.path / VBFLASH
        try:
            fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
        except OSError as e:
            raise VbflashError(f"cannot open {path} for writing: {e.strerror}") from None
        try:
            view, done = memoryview(image), 0
            while done < len(image):
                done += os.write(fd, view[done:])
        except OSError as e:
            raise VbflashError(f"writing the image to {path} failed after {done:#x} bytes: {e.strerror}") from None
        finally:
            os.close(fd)

    def trigger(self) -> OSError | None:
        """Read `psp_vbflash` once: the driver hands the image to the PSP. Its error, if any, is
        returned, not raised (fwupd goes on to the status too): the status says what happened."""
        try:
            with open(self.device.path / VBFLASH, "rb", buffering=0) as f:
                f.read(1)
        except OSError as e:
            return e
        return None

    def read_status(self) -> int:
        path = self.device.path / VBFLASH_STATUS
        try:
            text = path.read_text().strip()
        except OSError as e:
            raise VbflashError(f"cannot read {path}: {e.strerror}") from None
        try:
            return int(text, 0)
        except ValueError:
            raise VbflashError(f"{path} reads {text!r}, not a number") from None

    def wait_for_psp(self, trigger_error: OSError | None = None,
                     observe: Callable[[int, int], None] = lambda polls, status: None) -> tuple[int, int]:
        """Poll the status as fwupd does (now, then every 100 ms, at most 1,500 reads) until the
        PSP reports success. (status, polls); `observe(polls, status)` hears every change."""
        last = None
        for poll in range(1, MAX_POLLS + 1):
            if poll > 1:
                self.clock.sleep(POLL_INTERVAL)
            status = self.read_status()
            if status != last:
                observe(poll, status)
                last = status
            if status == SUCCESS:
                return status, poll
            if status & READY and status & 0xFFFF:
                # The PSP has answered, with a failure code: it will not change (fwupd would poll on).
                raise VbflashError(f"the PSP reported failure: {VBFLASH_STATUS} is {status:#010x} "
                                   f"(status code {status & 0xFFFF:#06x}) after {poll} poll(s)", status)
            if status == NOT_STARTED and trigger_error is not None:
                raise VbflashError(f"the driver did not start the update (reading {VBFLASH} failed: "
                                   f"{trigger_error.strerror or trigger_error}) and {VBFLASH_STATUS} reads 0x0",
                                   status)
        assert last is not None
        state = {NOT_STARTED: "the PSP never started", IN_PROGRESS: "the PSP is still busy"}.get(last, "no success")
        raise VbflashError(f"no success from the PSP after {MAX_POLLS} polls ({MAX_POLLS * POLL_INTERVAL:.0f} s on "
                           f"the board's clock): {state}, {VBFLASH_STATUS} reads {last:#x}", last)

    def close(self) -> None:
        """Nothing stays open between calls."""


def decode_vbios_info(raw: bytes, source: str) -> VbiosInfo:
    """`struct drm_amdgpu_info_vbios` (include/uapi/drm/amdgpu_drm.h): name[64], vbios_pn[64],
    version (u32), pad, vbios_ver_str[32], date[32]. Each string ends at its first NUL (the
    kernel leaves whatever followed in the field)."""
    name, pn, version, _, ver, date = VBIOS_INFO.unpack(raw[:VBIOS_INFO.size].ljust(VBIOS_INFO.size, b"\0"))
    part = _cstr(pn)
    if not part:
        raise TransportError(f"{source} returned an empty part number")
    return VbiosInfo(part, source, _cstr(ver) or None, _cstr(name) or None, _cstr(date) or None, version)


def _cstr(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("ascii", "replace").strip()
