"""An emulated amdgpu sysfs tree: a directory the amdgpu transport is pointed at, and a model
of the kernel driver and PSP behind its files. SYNTHETIC: no AMD driver or firmware inside.

    ROOT/devices/DDDD:BB:DD.F/   vendor, device, class, driver -> ROOT/drivers/amdgpu,
                                 psp_vbflash, psp_vbflash_status, vbios_version, rom,
                                 drm/card1/, drm/renderD128/
    ROOT/dev/dri/card1, renderD128   plain files: the INFO ioctl fails on them (ENOTTY), so the
                                 transport falls back to the sysfs files, as on a kernel without it
    ROOT/debug/dri/1/psp_spirom_dump the whole flash, when `spirom_dump` is on
    ROOT/flash.bin               the emulated SPI flash behind it all

The transport talks to plain files, so the model watches them with inotify and answers as
the driver does: a write to psp_vbflash stages an image (status 0x0); a read of it hands the
image to the PSP (status 0x1 while busy, then the PSP's answer). A read at the end of a plain
file reads nothing and is invisible to inotify, so only a read that returns data triggers
here; the driver triggers on any read, and the transport reads from the start of a fresh open.
The driver on some PSP versions blocks that read until the PSP is done; this model answers at
once and reports 0x1 meanwhile (as the v14 PSP path and fwupd's poll allow for).

What the modelled PSP does is this project's assumption (no public source for the firmware):
it checks that the image's partition A can be found (status 0x80000001 if not), writes that
partition's payload over the board's inactive partition (the lower boot priority), points the
slot header's ATOM location at the new payload's image, and swaps the two boot priorities so
that the written partition boots next. The running VBIOS (`rom`, `vbios_version`) changes only
at `reboot()`. The model reads those structures with its own small walker, not the driver's
parser, so that the two check each other. Outcomes can be forced for tests: "success",
"error" (the PSP answers `error_status`), "stuck" (busy forever), "ignored" (the driver never
starts the PSP).

Two ways to run the kernel side: `service(now)` from the transport's clock (`VirtualClock`:
each poll's sleep advances virtual time and lets the model act, so a 150 s timeout takes no
wall time), or `running()`, a thread reacting in wall time (for a CLI in another process).
"""
from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import select
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Iterator

from amdflash.stages.transport.sim import synth

IN_ACCESS, IN_MODIFY = 0x1, 0x2
_EVENT = struct.Struct("iIII")
_ENTRY = struct.Struct("<IIQ")
PSP_REJECTED = 0x80000001       # the modelled PSP's answer to an image without a partition A (ours)
ADDRESS = "0000:03:00.0"


class Inotify:
    """The few inotify calls the model needs, through libc (Linux only)."""

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")

    def watch(self, path: Path, mask: int) -> int:
        wd = self._libc.inotify_add_watch(self.fd, os.fsencode(path), mask)
        if wd < 0:
            raise OSError(ctypes.get_errno(), f"inotify_add_watch {path} failed")
        return wd

    def events(self, timeout: float = 0.0) -> list[int]:
        """Masks of the events queued (waiting up to `timeout` seconds for the first)."""
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return []
        try:
            data = os.read(self.fd, 65536)
        except BlockingIOError:
            return []
        masks, at = [], 0
        while at + _EVENT.size <= len(data):
            _, mask, _, length = _EVENT.unpack_from(data, at)
            masks.append(mask)
            at += _EVENT.size + length
        return masks

    def close(self) -> None:
        os.close(self.fd)


@dataclass(frozen=True)
class Slot:
    """An image slot header, as this model reads it (its own reading, not the driver's parser)."""

    at: int
    partition_fw_id: int
    priority: int
    location: int
    size: int
    csm: int


def slots(flash: bytes) -> list[Slot]:
    """The ISH slots the L1 directory lists; ValueError when the walk breaks."""
    try:
        if flash[:4] != synth.EFS_MAGIC:
            raise ValueError("no EFS")
        directory = struct.unpack_from("<I", flash, synth.EFS_PSP_DIRECTORY)[0]
        if flash[directory:directory + 4] != b"$PSP":
            raise ValueError("no L1 directory")
        found = []
        for i in range(min(struct.unpack_from("<I", flash, directory + 8)[0], 16)):
            fw_id, _, at = _ENTRY.unpack_from(flash, directory + 0x10 + i * _ENTRY.size)
            if fw_id in (synth.ISH_A_FW_ID, synth.ISH_B_FW_ID):
                h = flash[at:at + synth.ISH_BYTES]
                found.append(Slot(at, struct.unpack_from("<H", h, synth.ISH_PARTITION_FW_ID)[0],
                                  *struct.unpack_from("<I", h, synth.ISH_PRIORITY),
                                  *struct.unpack_from("<I", h, synth.ISH_LOCATION),
                                  *struct.unpack_from("<I", h, synth.ISH_SIZE),
                                  *struct.unpack_from("<I", h, synth.ISH_CSM)))
        return found
    except struct.error:
        raise ValueError("the walk left the image") from None


def running_vbios(flash: bytes) -> tuple[bytes, str]:
    """(ATOM image, part number) of the partition with the highest boot priority, or empty."""
    try:
        boot = max(slots(flash), key=lambda slot: slot.priority)
    except ValueError:
        return b"", ""
    rom = flash[boot.csm:boot.csm + 0x74]
    if len(rom) < 0x74 or rom[:2] != b"\x55\xaa":
        return b"", ""
    strings = boot.csm + struct.unpack_from("<H", rom, 0x6E)[0]
    part = flash[strings:strings + 64].split(b"\0")[0].decode("ascii", "replace")
    return flash[boot.csm:boot.csm + rom[2] * 512], part


@dataclass
class Psp:
    outcome: str = "success"            # success | error | stuck | ignored
    busy_seconds: float = 0.3
    error_status: int = 0x80000005


class EmulatedAmdgpu:
    def __init__(self, root: str | os.PathLike[str], flash: bytes | None = None, *, address: str = ADDRESS,
                 psp: Psp | None = None, vbios_version_file: bool = True, spirom_dump: bool = False,
                 with_vbflash: bool = True, driver: str = "amdgpu"):
        self.root = Path(root)
        self.address = address
        self.psp = psp or Psp()
        self.device = self.root / "devices" / address
        self.dev_dri = self.root / "dev" / "dri"
        self.debugfs_dri = self.root / "debug" / "dri"
        self.flash_path = self.root / "flash.bin"
        self.vbios_version_file = vbios_version_file
        self.spirom_dump = spirom_dump
        self.with_vbflash = with_vbflash
        self.updates = 0
        self.statuses: list[str] = []
        self._busy_until: float | None = None
        self._image: bytes | None = None
        self._lock = threading.Lock()
        self._build(flash if flash is not None else synth.synthetic_ifwi(1), driver)
        self._inotify = Inotify() if with_vbflash else None
        if self._inotify:
            self._inotify.watch(self.device / "psp_vbflash", IN_ACCESS | IN_MODIFY)

    # -- the tree ----------------------------------------------------------------------------
    @property
    def env(self) -> dict[str, str]:
        return {"AMDFLASH_SYSFS_PCI": str(self.root / "devices"), "AMDFLASH_DEV_DRI": str(self.dev_dri),
                "AMDFLASH_DEBUGFS_DRI": str(self.debugfs_dri)}

    @property
    def spec(self) -> str:
        return f"amdgpu:{self.address}"

    @property
    def flash(self) -> bytes:
        return self.flash_path.read_bytes()

    def _build(self, flash: bytes, driver: str) -> None:
        d = self.device
        (d / "drm" / "card1").mkdir(parents=True)
        (d / "drm" / "renderD128").mkdir()
        for name, text in (("vendor", "0x1002"), ("device", "0x744c"), ("class", "0x030000"), ("enable", "1")):
            (d / name).write_text(text + "\n")
        drivers = self.root / "drivers" / driver
        drivers.mkdir(parents=True)
        (d / "driver").symlink_to(drivers)
        self.dev_dri.mkdir(parents=True)
        for node in ("card1", "renderD128"):
            (self.dev_dri / node).write_bytes(b"")
        if self.with_vbflash:
            (d / "psp_vbflash").write_bytes(b"")
            self._status(0)
        self.flash_path.write_bytes(flash)
        self.reboot()

    def _status(self, value: int) -> None:
        text = f"{value:#x}\n"
        self.statuses.append(text.strip())
        tmp = self.device / ".psp_vbflash_status.tmp"
        tmp.write_text(text)
        os.replace(tmp, self.device / "psp_vbflash_status")

    def reboot(self) -> None:
        """The board starts again: the running VBIOS is the boot partition's ATOM image."""
        rom, part = running_vbios(self.flash)
        (self.device / "rom").write_bytes(rom)
        if self.vbios_version_file:
            (self.device / "vbios_version").write_text(part + "\n")
        self._dump()

    def _dump(self) -> None:
        if self.spirom_dump:
            (self.debugfs_dri / "1").mkdir(parents=True, exist_ok=True)
            (self.debugfs_dri / "1" / "psp_spirom_dump").write_bytes(self.flash)

    # -- the kernel side ---------------------------------------------------------------------
    def service(self, now: float) -> None:
        """React to what happened to psp_vbflash since the last call, and let the PSP work."""
        if self._inotify is None:
            return
        with self._lock:
            for mask in self._inotify.events():
                size = (self.device / "psp_vbflash").stat().st_size
                if mask & IN_MODIFY and size:
                    self._busy_until = None
                    self._status(0)          # a write: vbflash_done = false
                elif mask & IN_ACCESS and size:
                    self._trigger(now)
            if self._busy_until is not None and now >= self._busy_until:
                self._busy_until = None
                self._finish()

    def _trigger(self, now: float) -> None:
        path = self.device / "psp_vbflash"
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            self._image = bytes(m)       # mapped, not read: no inotify event of our own
        os.truncate(path, 0)             # the driver frees its buffer
        if self.psp.outcome == "ignored":
            return
        self._status(1)
        self._busy_until = float("inf") if self.psp.outcome == "stuck" else now + self.psp.busy_seconds

    def _finish(self) -> None:
        if self.psp.outcome == "error":
            self._status(self.psp.error_status)
            return
        assert self._image is not None
        try:
            self._update(self._image)
        except ValueError:
            self._status(PSP_REJECTED)
            return
        self.updates += 1
        self._status(0x80000000)

    def _update(self, image: bytes) -> None:
        source = next((x for x in slots(image) if x.partition_fw_id == synth.PARTITION_A_FW_ID), None)
        if source is None or source.location + source.size > len(image):
            raise ValueError("no partition A in the image")
        payload = image[source.location:source.location + source.size]
        flash = bytearray(self.flash)
        board = slots(bytes(flash))
        target = min(board, key=lambda x: x.priority)     # the inactive partition
        other = max(board, key=lambda x: x.priority)
        if len(payload) > target.size:
            raise ValueError("payload larger than the inactive partition")
        flash[target.location:target.location + len(payload)] = payload
        changes = {target.at: {synth.ISH_CSM: target.location + source.csm - source.location,
                               synth.ISH_PRIORITY: other.priority}}
        if other.at != target.at:
            changes[other.at] = {synth.ISH_PRIORITY: target.priority}
        for at, fields in changes.items():
            header = bytearray(flash[at:at + synth.ISH_BYTES])
            for offset, value in fields.items():
                struct.pack_into("<I", header, offset, value)
            struct.pack_into("<I", header, synth.ISH_CHECKSUM, synth.ish_checksum(header))
            flash[at:at + synth.ISH_BYTES] = header
        self.flash_path.write_bytes(bytes(flash))
        self._dump()

    @contextlib.contextmanager
    def running(self) -> Iterator[EmulatedAmdgpu]:
        """The kernel side in a thread, in wall time, for a transport in another thread or process."""
        stop = threading.Event()

        def loop() -> None:
            while not stop.is_set():
                if self._inotify is not None:
                    select.select([self._inotify.fd], [], [], 0.02)
                self.service(time.monotonic())

        thread = threading.Thread(target=loop, name="emulated-amdgpu", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join(timeout=5)

    def close(self) -> None:
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None


class VirtualClock:
    """A transport clock whose sleeps pass in virtual time and let the emulated kernel act."""

    def __init__(self, kernel: EmulatedAmdgpu | None = None):
        self.kernel = kernel
        self.t = 0.0
        self.sleeps = 0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.t += max(seconds, 0.0)
        if self.kernel is not None:
            self.kernel.service(self.t)
