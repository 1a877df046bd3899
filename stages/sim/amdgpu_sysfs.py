"""An emulated amdgpu sysfs tree: a directory the amdgpu transport is pointed at, and a model
of the kernel driver and PSP behind its attributes. SYNTHETIC: no AMD driver or firmware inside.

    ROOT/devices/DDDD:BB:DD.F/   vendor, device, class, driver -> ROOT/drivers/amdgpu,
                                 psp_vbflash, psp_vbflash_status, vbios_version, rom,
                                 drm/card1/, drm/renderD128/
    ROOT/dev/dri/card1, renderD128   plain files: the INFO ioctl fails on them (ENOTTY), so the
                                 transport falls back to the sysfs files, as on a kernel without it
    ROOT/debug/dri/1/psp_spirom_dump the whole flash, when `spirom_dump` is on
    ROOT/flash.bin               the emulated SPI flash behind it all
    ROOT/kernel.json, kernel-state.bin, kernel-buffer.bin   the driver model's set-up and state

The attributes are answered by `EmulatedKernel`, an `AttributeIo` the transport is given (in
tests directly, or through AMDFLASH_SIM_AMDGPU=ROOT in any process): every open, write and
read of psp_vbflash and psp_vbflash_status is the driver's handler, synchronously, with its
errors. Its state lives in the tree, so every process (and every test handle) sees one kernel.
It models what the kernel source says (drivers/gpu/drm/amd/amdgpu/amdgpu_psp.c,
psp_v13_0.c, fs/kernfs/file.c), inconvenient parts included:

* a write reaches the driver at most a page (4 KiB) at a time; it clears `vbflash_done`,
  fails with ENOMEM — freeing the buffer and zeroing the size — when the size it finds
  already exceeds the limit (3 MiB, or 16 MiB since commit 667b96134c9e: `limit`), copies
  its bytes at the file offset and ADDS their count to the size, whoever wrote before and
  however many opens ago. A copy reaching past the buffer's end is what would corrupt kernel
  memory: the model counts it (`heap_overflows`), as it counts a trigger that copies more than
  the buffer holds (`heap_overreads`), and tests require both to stay 0. kvmalloc does not
  zero: a new buffer holds what the last one held;
* a read is the trigger: EINVAL with nothing staged; else the PSP must be ready (100 ms, then
  ETIME with nothing handed over), is handed exactly the staged size — stale bytes included —
  `vbflash_done` is set, and the read blocks until the PSP answers or PSP_SPIROM_UPDATE_TIMEOUT
  (60 s) passes: EIO when it answered a failure code, ETIME when it did not answer (it may
  still finish later). The buffer is freed whatever happened. The time passes on the tree's
  virtual clock, which is the transport's: 60 s of waiting take no wall time;
* the status reads 0 while `vbflash_done` is clear, 1 while the PSP works, then its answer;
* a reboot (`reboot()`) empties the buffer, clears `vbflash_done` and gives a new boot id.

What the modelled PSP does with an image is this project's assumption (no public source for
the firmware): it checks that the image's partition A can be found (status 0x80000001 if not),
writes that partition's payload over the board's inactive partition (the lower boot priority),
points the slot header's ATOM location at the new payload's image, and swaps the two boot
priorities so that the written partition boots next. The running VBIOS (`rom`,
`vbios_version`) changes only at `reboot()`. The model reads those structures with its own
small walker, not the driver's parser, so that the two check each other. Outcomes can be
forced: "success", "error" (the PSP answers `error_status`), "stuck" (it never answers),
"not_ready" (its mailbox is not ready: the driver never hands anything over); `busy` is how
long the PSP works (over 60 s, the trigger gives up first).
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import struct
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from amdflash.stages.sim import synth

# The kernel's names (its own, not the transport's: the model never imports the driver side).
VBFLASH, VBFLASH_STATUS = "psp_vbflash", "psp_vbflash_status"
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")

_ENTRY = struct.Struct("<IIQ")
PSP_REJECTED = 0x80000001       # the modelled PSP's answer to an image without a partition A (ours)
ADDRESS = "0000:03:00.0"
MiB = 1024 * 1024
PAGE = 4096                      # kernfs hands a write over at most a page at a time
SLACK = 64 * 1024                # buffer file bytes past the limit (a copy there is counted, not lost)
READY_WAIT = 0.1                 # psp_wait_for: adev->usec_timeout (100 ms) before -ETIME
UPDATE_TIMEOUT = 60.0            # PSP_SPIROM_UPDATE_TIMEOUT, psp_v13_0.h
MBOX_READY = 0x80000000
UPDATE_FLASH_IMAGE = 0x4         # C2PMSG_CMD_SPI_UPDATE_FLASH_IMAGE: the mailbox reads cmd << 16 while busy


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
    outcome: str = "success"            # success | error | stuck | not_ready
    busy_seconds: float = 0.3
    error_status: int = 0x80000005


@dataclass
class KernelState:
    """What the driver and the PSP hold between calls (kernel-state.bin in the tree, a fixed
    record read and written in place: every handle on the tree sees one kernel)."""

    now: float = 0.0                     # the tree's virtual clock
    sleeps: int = 0
    boot_id: str = ""
    allocated: bool = False              # vbflash_tmp_buf
    image_size: int = 0                  # vbflash_image_size
    done: bool = False                   # vbflash_done
    mailbox: int = MBOX_READY            # MP0 C2PMSG_115
    busy_until: float | None = None      # the PSP works on an update until then (None: idle)
    answer: int = 0                      # ... and then answers this
    updates: int = 0                     # updates the PSP carried out
    heap_overflows: int = 0
    heap_overreads: int = 0

    _RECORD = struct.Struct("<dQ36s?Q?IdIIII")

    def pack(self) -> bytes:
        busy = float("nan") if self.busy_until is None else self.busy_until
        return self._RECORD.pack(self.now, self.sleeps, self.boot_id.encode(), self.allocated, self.image_size,
                                 self.done, self.mailbox, busy, self.answer, self.updates, self.heap_overflows,
                                 self.heap_overreads)

    @classmethod
    def unpack(cls, raw: bytes) -> KernelState:
        now, sleeps, boot, allocated, size, done, mailbox, busy, answer, updates, over, overread = \
            cls._RECORD.unpack(raw)
        return cls(now, sleeps, boot.decode(), allocated, size, done, mailbox, None if busy != busy else busy,
                   answer, updates, over, overread)


class KernelClock:
    """The tree's virtual clock: sleeps pass in the tree's time and let the PSP finish."""

    def __init__(self, kernel: EmulatedKernel):
        self.kernel = kernel

    def now(self) -> float:
        return self.kernel.state().now

    def sleep(self, seconds: float) -> None:
        with self.kernel.changing() as st:
            st.now += max(seconds, 0.0)
            st.sleeps += 1
        self.kernel.settle()

    @property
    def sleeps(self) -> int:
        return self.kernel.state().sleeps


_FD_BASE = 1 << 20


class EmulatedKernel:
    """The amdgpu driver's psp_vbflash attributes (and the boot id), as an `AttributeIo`."""

    def __init__(self, root: Path):
        self.root = Path(root)
        config = json.loads((self.root / "kernel.json").read_text())
        self.device = self.root / "devices" / config["address"]
        self.limit: int = config["limit"]
        self.psp = Psp(**config["psp"])
        self.clock = KernelClock(self)
        self._fds: dict[int, list[Any]] = {}      # fd -> [attribute, read position]
        self._next = _FD_BASE
        self._paths = {self.device / VBFLASH: "vbflash", self.device / VBFLASH_STATUS: "status", BOOT_ID: "boot_id"}
        self._state_fd = os.open(self.root / "kernel-state.bin", os.O_RDWR | os.O_CLOEXEC)
        self._buffer_fd: int | None = None

    # -- state in the tree ------------------------------------------------------------------
    def state(self) -> KernelState:
        return KernelState.unpack(os.pread(self._state_fd, KernelState._RECORD.size, 0))

    def _save(self, st: KernelState) -> None:
        os.pwrite(self._state_fd, st.pack(), 0)

    class _Changing:
        def __init__(self, kernel: EmulatedKernel):
            self.kernel = kernel

        def __enter__(self) -> KernelState:
            self.st = self.kernel.state()
            return self.st

        def __exit__(self, *exc: object) -> None:
            if exc[0] is None:
                self.kernel._save(self.st)

    def changing(self) -> EmulatedKernel._Changing:
        return EmulatedKernel._Changing(self)

    def _buffer(self, offset: int, data: bytes | None = None, size: int = 0) -> bytes:
        if self._buffer_fd is None:
            self._buffer_fd = os.open(self.root / "kernel-buffer.bin", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        if data is None:
            return os.pread(self._buffer_fd, size, offset).ljust(size, b"\0")
        os.pwrite(self._buffer_fd, data[:max(0, self.limit + SLACK - offset)], offset)
        return b""

    def __del__(self) -> None:
        for fd in (getattr(self, "_state_fd", None), getattr(self, "_buffer_fd", None)):
            if fd is not None:
                os.close(fd)

    def handed_over(self) -> list[str]:
        """"size sha256" of every image the driver handed to the PSP."""
        path = self.root / "kernel-handed-over.log"
        return path.read_text().splitlines() if path.exists() else []

    # -- AttributeIo ------------------------------------------------------------------------
    def open(self, path: Path, flags: int) -> int:
        kind = self._paths.get(Path(path))
        if kind is None:
            return os.open(path, flags | os.O_CLOEXEC)
        fd, self._next = self._next, self._next + 1
        self._fds[fd] = [kind, 0]
        return fd

    def close(self, fd: int) -> None:
        if fd >= _FD_BASE:
            del self._fds[fd]
        else:
            os.close(fd)

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        if fd < _FD_BASE:
            return os.pwrite(fd, data, offset)
        if self._fds[fd][0] != "vbflash":
            raise OSError(errno.EACCES, os.strerror(errno.EACCES))
        count = min(len(data), PAGE)
        if not count:
            return 0
        with self.changing() as st:
            st.done = False
            if st.image_size > self.limit:               # "Safeguard against memory drain"
                st.allocated, st.image_size = False, 0
                raise_after = OSError(errno.ENOMEM, os.strerror(errno.ENOMEM))
            else:
                raise_after = None
                st.allocated = True
                if offset + count > self.limit:
                    st.heap_overflows += 1
                self._buffer(offset, bytes(data[:count]))
                st.image_size += count
        if raise_after is not None:
            raise raise_after
        return count

    def read(self, fd: int, count: int) -> bytes:
        if fd < _FD_BASE:
            return os.read(fd, count)
        entry = self._fds[fd]
        kind, pos = entry
        if kind == "vbflash":
            return self._trigger()
        self.settle()
        st = self.state()
        if kind == "boot_id":
            text = st.boot_id + "\n"
        elif not st.done:
            text = "0x0\n"
        elif not st.mailbox & MBOX_READY:
            text = "0x1\n"
        else:
            text = f"{st.mailbox:#x}\n"
        data = text.encode()[pos:pos + count]
        entry[1] = pos + len(data)
        return data

    # -- the driver's trigger and the PSP ---------------------------------------------------
    def _trigger(self) -> bytes:
        st = self.state()
        if st.image_size == 0:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        size = st.image_size
        image = self._buffer(0, size=size)
        with self.changing() as st:
            if size > self.limit:
                st.heap_overreads += 1
            if self.psp.outcome == "not_ready":
                st.now += READY_WAIT
                st.allocated, st.image_size = False, 0
                error = errno.ETIME
            else:
                st.done = True
                with open(self.root / "kernel-handed-over.log", "a") as log:
                    log.write(f"{size:#x} {hashlib.sha256(image).hexdigest()}\n")
                st.mailbox = UPDATE_FLASH_IMAGE << 16
                busy = float("inf") if self.psp.outcome == "stuck" else self.psp.busy_seconds
                st.busy_until = st.now + busy
                st.answer = self._answer(image) if self.psp.outcome != "stuck" else 0
                wait = min(busy, UPDATE_TIMEOUT)
                st.now += wait
                error = 0
        (self.root / "kernel-psp-image.bin").write_bytes(image)
        self.settle()
        with self.changing() as st:
            st.allocated, st.image_size = False, 0          # rel_buf: freed whatever happened
            mailbox = st.mailbox
        if error:
            raise OSError(error, os.strerror(error))
        if not mailbox & MBOX_READY:
            raise OSError(errno.ETIME, os.strerror(errno.ETIME))
        if mailbox & 0xFFFF:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return b""

    def _answer(self, image: bytes) -> int:
        if self.psp.outcome == "error":
            return self.psp.error_status
        try:
            _partition_a(image)
        except ValueError:
            return PSP_REJECTED
        return MBOX_READY

    def settle(self) -> None:
        """Let the PSP finish an update whose time has come."""
        st = self.state()
        if st.busy_until is None or st.now < st.busy_until:
            return
        image = (self.root / "kernel-psp-image.bin").read_bytes()
        with self.changing() as st:
            st.busy_until = None
            st.mailbox = st.answer
            if st.answer == MBOX_READY:
                st.updates += 1
        if st.answer == MBOX_READY:
            _update(self.root / "flash.bin", image)
            EmulatedAmdgpu.dump(self.root)

    def reboot(self) -> None:
        with self.changing() as st:
            st.allocated, st.image_size, st.done = False, 0, False
            st.busy_until, st.mailbox = None, MBOX_READY
            st.boot_id = str(uuid.uuid4())


def _partition_a(image: bytes) -> Slot:
    source = next((x for x in slots(image) if x.partition_fw_id == synth.PARTITION_A_FW_ID), None)
    if source is None or source.location + source.size > len(image):
        raise ValueError("no partition A in the image")
    return source


def _update(flash_path: Path, image: bytes) -> None:
    """The modelled PSP's update: the image's partition A over the board's inactive partition."""
    source = _partition_a(image)
    payload = image[source.location:source.location + source.size]
    flash = bytearray(flash_path.read_bytes())
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
    flash_path.write_bytes(bytes(flash))


class EmulatedAmdgpu:
    """The tree, its kernel's set-up, and what tests look at."""

    def __init__(self, root: str | os.PathLike[str], flash: bytes | None = None, *, address: str = ADDRESS,
                 psp: Psp | None = None, vbios_version_file: bool = True, spirom_dump: bool = False,
                 with_vbflash: bool = True, driver: str = "amdgpu", limit: int = 16 * MiB):
        self.root = Path(root)
        self.address = address
        self.device = self.root / "devices" / address
        self.dev_dri = self.root / "dev" / "dri"
        self.debugfs_dri = self.root / "debug" / "dri"
        self.flash_path = self.root / "flash.bin"
        self.vbios_version_file = vbios_version_file
        self.with_vbflash = with_vbflash
        self._build(flash if flash is not None else synth.synthetic_ifwi(1), driver)
        (self.root / "kernel.json").write_text(json.dumps(
            {"address": address, "limit": limit, "psp": asdict(psp or Psp()), "spirom_dump": spirom_dump}))
        (self.root / "kernel-state.bin").write_bytes(KernelState(boot_id=str(uuid.uuid4())).pack())
        self.reboot()

    # -- the tree ----------------------------------------------------------------------------
    @property
    def env(self) -> dict[str, str]:
        return {"AMDFLASH_SYSFS_PCI": str(self.root / "devices"), "AMDFLASH_DEV_DRI": str(self.dev_dri),
                "AMDFLASH_DEBUGFS_DRI": str(self.debugfs_dri), "AMDFLASH_SIM_AMDGPU": str(self.root)}

    @property
    def spec(self) -> str:
        return f"amdgpu:{self.address}"

    def kernel(self) -> EmulatedKernel:
        return EmulatedKernel(self.root)

    @property
    def state(self) -> KernelState:
        return self.kernel().state()

    @property
    def updates(self) -> int:
        return self.state.updates

    @property
    def handed_over(self) -> list[str]:
        """"size sha256" of every image the driver handed to the PSP."""
        return self.kernel().handed_over()

    @property
    def flash(self) -> bytes:
        self.kernel().settle()
        return self.flash_path.read_bytes()

    def stage_leftover(self, data: bytes) -> None:
        """What an interrupted run (or another program) leaves: `data` written to psp_vbflash
        from offset 0 through the driver, never triggered."""
        kernel = self.kernel()
        fd = kernel.open(self.device / VBFLASH, os.O_WRONLY)
        try:
            for at in range(0, len(data), PAGE):
                kernel.pwrite(fd, data[at:at + PAGE], at)
        finally:
            kernel.close(fd)

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
            # Present for the transport to find; their contents are the kernel model's.
            (d / VBFLASH).write_bytes(b"")
            (d / VBFLASH_STATUS).write_bytes(b"")
        self.flash_path.write_bytes(flash)

    def reboot(self) -> None:
        """The board starts again: the running VBIOS is the boot partition's ATOM image, and the
        driver's staging buffer is gone."""
        self.kernel().reboot()
        rom, part = running_vbios(self.flash_path.read_bytes())
        (self.device / "rom").write_bytes(rom)
        if self.vbios_version_file:
            (self.device / "vbios_version").write_text(part + "\n")
        self.dump(self.root)

    @staticmethod
    def dump(root: Path) -> None:
        """debugfs psp_spirom_dump: the flash as the PSP reads it, when the tree offers it."""
        if json.loads((root / "kernel.json").read_text()).get("spirom_dump"):
            (root / "debug" / "dri" / "1").mkdir(parents=True, exist_ok=True)
            (root / "debug" / "dri" / "1" / "psp_spirom_dump").write_bytes((root / "flash.bin").read_bytes())

    def close(self) -> None:
        """Nothing stays open."""
