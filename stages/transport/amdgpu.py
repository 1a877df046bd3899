"""A healthy board through the amdgpu kernel driver: the PSP writes the IFWI (`psp_vbflash`).

This transport has no BAR5: the kernel driver owns the device, and amdflash only uses what
the driver exposes under the device's sysfs directory and its DRM node.

What the driver does (amdgpu_psp.c `amdgpu_psp_vbflash_write/_read/_status`, psp_v13_0.c
`psp_v13_0_update_spirom`) and how fwupd's amd-gpu plugin uses it:
* `psp_vbflash` (binary attribute). A write stores its bytes at the file offset in a kernel
  buffer of AMD_VBIOS_FILE_MAX_SIZE_B (3 MiB; 16 MiB since commit 667b96134c9e, 2025, taken
  into the stable kernels) and ADDS their count to `vbflash_image_size`, across opens: only
  a trigger read or an overflow resets it, so bytes another process (or an interrupted run)
  staged stay in front of the next image's size. The overflow check runs before the copy:
  a write finding the size already over the limit frees the buffer, zeroes the size and
  fails with ENOMEM; the write that crosses the limit is still taken (and the offset is not
  checked at all: a write past the buffer's end would corrupt kernel memory, so amdflash
  never writes beyond the limit). Writes arrive at most a page (4 KiB) at a time (kernfs).
  A read is the trigger: with nothing staged it fails with EINVAL; otherwise the driver hands
  `vbflash_image_size` bytes to the PSP and waits for it — up to PSP_SPIROM_UPDATE_TIMEOUT,
  60 s (-ETIME after that; -EIO when the PSP answers a failure code) — and frees the buffer
  whatever happened. fwupd writes the whole image, then reads once.
* `psp_vbflash_status` reads "0x%x": 0 until the PSP was handed an image since the last
  write (`vbflash_done`), 1 while it works (the response register's bit 31 clear), then the
  PSP's response register; 0x80000000 is success, bit 31 with a non-zero low half a
  failure. fwupd polls it every 100 ms, at most 1,500 times. A non-zero status therefore
  also proves that nothing was written since the last trigger, which freed the buffer.
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

Staging therefore never trusts the buffer to be empty: amdflash never triggers bytes it did
not stage itself. A status other than 0 proves it empty; otherwise (nothing since boot, or a
staging someone left — amdflash's trail may name the run) it is cleared first, by the
kernel's own overflow rule: 4 KiB of zeros written at offset 0 (so the copy never leaves the
buffer) until the kernel answers ENOMEM and frees it. The same writes, from an empty buffer,
measure the running kernel's limit (accepted bytes less the last page), which an image over
3 MiB needs before it is written.

Where things live is configurable for tests (an emulated tree): the sysfs devices directory
(AMDFLASH_SYSFS_PCI, shared with the PCI transport), the DRM device nodes (AMDFLASH_DEV_DRI,
default /dev/dri) and the DRM debugfs directory (AMDFLASH_DEBUGFS_DRI, default
/sys/kernel/debug/dri). The sysfs attributes are reached through an `AttributeIo` (the
operating system's calls by default); `AMDFLASH_SIM_AMDGPU=TREE` puts an emulated kernel
behind them, announced like the emulated USB bridges, and its virtual clock becomes the
transport's: a 60 s trigger or a 150 s poll takes no wall time. That kernel is built by the
`Emulators` the caller hands `attribute_io` (transport/emulated.py; stages/open_transport.py
hands the one in stages/sim/amdgpu_sysfs.py): this module never imports the emulator.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from collections.abc import Callable

from amdflash.stages.image.atom import AtomError, BytesSource, parse_atom
from amdflash.stages.transport.base import BoardIdentity, Clock, TransportError, WallClock
from amdflash.stages.transport.emulated import ENV_SIM_AMDGPU, NO_EMULATORS, Emulators
from amdflash.stages.transport.pci import PciDevice, find_devices

ENV_DEV_DRI = "AMDFLASH_DEV_DRI"
ENV_DEBUGFS_DRI = "AMDFLASH_DEBUGFS_DRI"
DRIVER = "amdgpu"
VBFLASH, VBFLASH_STATUS = "psp_vbflash", "psp_vbflash_status"
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
MiB = 1024 * 1024
MIN_KERNEL_LIMIT = 3 * MiB               # AMD_VBIOS_FILE_MAX_SIZE_B before 667b96134c9e
MAX_KERNEL_LIMIT = 16 * MiB              # ... and since
PAGE = 4096                              # what one write reaches the driver with (kernfs: a page)
CLEAR_BOUND = 64 * MiB                   # writes that never end in ENOMEM: give up, do not guess
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


class AttributeIo(Protocol):
    """The system calls the transport makes on sysfs attributes."""

    def open(self, path: Path, flags: int) -> int: ...
    def pwrite(self, fd: int, data: bytes, offset: int) -> int: ...
    def read(self, fd: int, count: int) -> bytes: ...
    def close(self, fd: int) -> None: ...


class OsAttributeIo:
    """The operating system's own calls: what a real kernel answers."""

    def open(self, path: Path, flags: int) -> int:
        return os.open(path, flags | os.O_CLOEXEC)

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        return os.pwrite(fd, data, offset)

    def read(self, fd: int, count: int) -> bytes:
        return os.read(fd, count)

    def close(self, fd: int) -> None:
        os.close(fd)


def attribute_io(emulators: Emulators = NO_EMULATORS) -> AttributeIo:
    """The operating system's calls, or — only when AMDFLASH_SIM_AMDGPU names an emulated tree —
    that tree's emulated kernel, built by `emulators` (it says so on stderr, as the emulated
    USB bridges do). With the variable set and no emulated kernel handed in, it refuses: the
    operator chose an emulator, so the real system calls are not used in its place."""
    tree = os.environ.get(ENV_SIM_AMDGPU)
    if not tree:
        return OsAttributeIo()
    if emulators.kernel_io is None:
        raise TransportError(f"{ENV_SIM_AMDGPU} is set, but this caller was handed no emulated kernel "
                             "(boards are opened through amdflash.stages.open_transport)")
    if tree not in _ANNOUNCED:
        _ANNOUNCED.add(tree)
        print(f"{ENV_SIM_AMDGPU} is set: the amdgpu driver is an EMULATED kernel ({tree}), not hardware",
              file=sys.stderr)
    return emulators.kernel_io(Path(tree))


_ANNOUNCED: set[str] = set()


class _UnsetClock(WallClock):
    """Marks an AmdgpuBoard built without a clock: it takes its attribute I/O's, else wall time."""


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
    clock: Clock = field(default_factory=_UnsetClock)
    ioctl: Ioctl = fcntl.ioctl
    io: AttributeIo = field(default_factory=attribute_io)
    dev_dri: Path = field(default_factory=lambda: Path(os.environ.get(ENV_DEV_DRI) or "/dev/dri"))
    debugfs_dri: Path = field(default_factory=lambda: Path(os.environ.get(ENV_DEBUGFS_DRI)
                                                            or "/sys/kernel/debug/dri"))

    def __post_init__(self) -> None:
        if isinstance(self.clock, _UnsetClock):
            self.clock = getattr(self.io, "clock", None) or WallClock()
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
    def boot_id(self) -> str | None:
        """This boot's id: a staging in the kernel's buffer does not outlive a reboot."""
        try:
            return self._read_attr(BOOT_ID).decode(errors="replace").strip() or None
        except OSError:
            return None

    def clear_staging(self) -> int:
        """Empty the driver's staging buffer without triggering anything: write one page of
        zeros at offset 0 (the copy stays inside the buffer) until the kernel, finding its
        accumulated size over the limit, frees the buffer and answers ENOMEM. Returns the bytes
        it accepted first; raises when it never refuses (then it holds what was written)."""
        path = self.device.path / VBFLASH
        zeros = bytes(PAGE)
        accepted = 0
        fd = self._open(path, os.O_WRONLY)
        try:
            while accepted <= CLEAR_BOUND:
                try:
                    n = self.io.pwrite(fd, zeros, 0)
                except OSError as e:
                    if e.errno == errno.ENOMEM:
                        return accepted
                    raise VbflashError(f"clearing {path} failed after {accepted:#x} bytes: {e.strerror}") from None
                if n <= 0:
                    raise VbflashError(f"clearing {path}: the driver took no bytes after {accepted:#x}")
                accepted += n
        finally:
            self.io.close(fd)
        raise VbflashError(f"{path} took {accepted:#x} bytes without the ENOMEM its overflow rule gives at "
                           f"{MAX_KERNEL_LIMIT:#x}: this kernel's psp_vbflash is not the one amdflash knows, and its "
                           "buffer now holds zeros; do not read psp_vbflash; reboot to empty it")

    def kernel_limit(self) -> int:
        """AMD_VBIOS_FILE_MAX_SIZE_B of the running kernel, measured: from an emptied buffer the
        kernel takes pages until the size exceeds its limit, then refuses the next one."""
        self.clear_staging()
        return self.clear_staging() - PAGE

    def stage_image(self, image: bytes) -> None:
        """Hand the image to the driver's buffer (not yet to the PSP), a page at a time at
        ascending offsets. The buffer must be empty (cleared, or proved empty by the status):
        the driver adds every write to what it holds."""
        path = self.device.path / VBFLASH
        if len(image) > MAX_KERNEL_LIMIT:
            raise VbflashError(f"image is {len(image):#x} bytes; no amdgpu driver takes more than "
                               f"{MAX_KERNEL_LIMIT:#x} through {VBFLASH}")
        if len(image) > MIN_KERNEL_LIMIT:
            limit = self.kernel_limit()
            if len(image) > limit:
                raise VbflashError(f"image is {len(image):#x} bytes; this kernel's {VBFLASH} takes at most {limit:#x} "
                                   f"(AMD_VBIOS_FILE_MAX_SIZE_B: 3 MiB before Linux commit 667b96134c9e, 16 MiB "
                                   "since)")
        fd = self._open(path, os.O_WRONLY)
        done = 0
        try:
            view = memoryview(image)
            while done < len(image):
                n = self.io.pwrite(fd, bytes(view[done:done + PAGE]), done)
                if n <= 0:
                    raise VbflashError(f"writing the image to {path}: the driver took no bytes at {done:#x}")
                done += n
        except OSError as e:
            if e.errno == errno.ENOMEM:
                raise VbflashError(f"the driver refused the image at {done:#x} of {len(image):#x} bytes (ENOMEM: "
                                   f"its buffer already held more than its limit, 3 MiB before Linux commit "
                                   "667b96134c9e and 16 MiB since); it freed what was staged") from None
            raise VbflashError(f"writing the image to {path} failed after {done:#x} bytes: {e.strerror}") from None
        finally:
            self.io.close(fd)

    def trigger(self) -> OSError | None:
        """Read `psp_vbflash` once: the driver hands the staged image to the PSP and waits for it
        (up to 60 s). Its error, if any, is returned, not raised: `wait_for_psp` says what it means."""
        path = self.device.path / VBFLASH
        try:
            fd = self._open(path, os.O_RDONLY)
            try:
                self.io.read(fd, 1)
            finally:
                self.io.close(fd)
        except OSError as e:
            return e
        return None

    def _open(self, path: Path, flags: int) -> int:
        try:
            return self.io.open(path, flags)
        except OSError as e:
            raise VbflashError(f"cannot open {path}: {e.strerror}") from None

    def _read_attr(self, path: Path) -> bytes:
        fd = self.io.open(path, os.O_RDONLY)
        try:
            return self.io.read(fd, 4096)
        finally:
            self.io.close(fd)

    def read_status(self) -> int:
        path = self.device.path / VBFLASH_STATUS
        try:
            text = self._read_attr(path).decode(errors="replace").strip()
        except OSError as e:
            raise VbflashError(f"cannot read {path}: {e.strerror}") from None
        try:
            return int(text, 0)
        except ValueError:
            raise VbflashError(f"{path} reads {text!r}, not a number") from None

    def wait_for_psp(self, trigger_error: OSError | None = None,
                     observe: Callable[[int, int], None] = lambda polls, status: None) -> tuple[int, int]:
        """Poll the status as fwupd does (now, then every 100 ms, at most 1,500 reads) until the
        PSP reports success. (status, polls); `observe(polls, status)` hears every change.

        The trigger's error decides first: EINVAL (the driver had nothing staged) and EIO (the
        PSP answered a failure, which the status then shows) end it at once; ETIME (the driver
        stopped waiting after 60 s) leaves the PSP working, so the status is polled on."""
        if trigger_error is not None and trigger_error.errno == errno.EINVAL:
            raise VbflashError(f"the driver had nothing staged to hand to the PSP: reading {VBFLASH} failed with "
                               "EINVAL; nothing was flashed")
        if trigger_error is not None and trigger_error.errno == errno.EIO:
            status = self.read_status()
            raise VbflashError(f"the PSP reported failure: reading {VBFLASH} failed with EIO and {VBFLASH_STATUS} is "
                               f"{status:#010x} (status code {status & 0xFFFF:#06x})", status)
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
