"""The emulated board's persistent state: a directory of memory-mapped files.

A real board keeps its flash and its register state while the host process that drives
it crashes. Mapping the state files shared means every store lands in the page cache at
once, so a host killed at any instant leaves the board exactly as it was at that
instant, and the next process continues from there.

    board.json   configuration (variant, profile, seed, faults, identity)
    flash.bin    the 2 MiB SPI NOR array
    regs.bin     BAR5, 1 MiB of registers
    state.bin    counters, chip status/OTP bits, engine capture, mailbox and fault state
"""
from __future__ import annotations

import errno
import json
import mmap
import os
import stat
from pathlib import Path

from amdflash.stages.drivers.flash.geometry import FLASH_SIZE
from amdflash.stages.files import LinkInPath, create_new, open_dir, write_new

BAR5_SIZE = 0x100000
STATE_SIZE = 0x4000
STATE_MAGIC = b"AMDFSIM1"

# state.bin regions: (offset, size). Each model owns its region and lays it out itself.
REGIONS: dict[str, tuple[int, int]] = {
    "header": (0x0000, 0x40),
    "counters": (0x0040, 0x1C0),    # 56 doubles
    "faults": (0x0200, 0x100),      # 32 signed 64-bit counters
    "engine": (0x0300, 0x200),      # ROM_SW capture buffer and engine flags
    "aperture": (0x0500, 0x100),
    "chip": (0x0600, 0x200),        # status registers, WEL/busy/power state
    "psp": (0x0800, 0x800),
    "otp": (0x1000, 0x1000),        # security registers
    "spare": (0x2000, 0x2000),
}

# Slots of the persistent fault-state region (signed 64-bit each).
F_WRITES = 0          # register write accesses since the board was created
F_KILL_FIRED = 1      # kill-after-writes has fired (one-shot)
F_USB_TRANSFERS = 2   # USB transfers, for usb-disconnect-after
F_ENGINE_TXNS = 3     # ROM_SW transactions, for stall-after
F_FLIP_DRAWS = 4      # read-flip random draws consumed
F_USB_FIRED = 5       # usb-disconnect-after has fired (one-shot)
F_SILENT_DRAWS = 6    # silent-rx random draws consumed
F_STALE_DRAWS = 7     # stale-done random draws consumed
F_BUSY_LEFT = 8       # busy-read: transactions the chip is still busy for
F_BUSY_FIRED = 9      # busy-read has fired (one-shot)
F_WEAK_FIRED = 10     # weak-bit has fired (one-shot)

COUNTER_NAMES = (
    "modelled_seconds",
    "control_transfers",
    "bulk_transfers",
    "bulk_bytes",
    "tlps",
    "config_accesses",
    "reg_reads",
    "reg_writes",
    "spi_transactions",
    "spi_bytes",
    "spi_seconds",
    "flash_busy_seconds",
    "sleep_seconds",
    "protocol_violations",
    "unobserved_completions",
    "ignored_while_busy",      # commands the busy chip did not hear (it answers only status, suspend, reset)
)
C = {name: i for i, name in enumerate(COUNTER_NAMES)}


FILE_MODE = 0o644     # the board's files, as before (the umask narrows it)


class BoardFileError(ValueError):
    """A board file that is a link or not a regular file: never opened through (another user
    may have planted it, pointing at a file of the user running amdflash)."""


def open_board_file(path: Path, flags: int = os.O_RDWR, dir_fd: int | None = None) -> int:
    """A descriptor of the regular file at `path`, never through a symbolic link (O_NOFOLLOW);
    with `dir_fd` (the board's directory, open_dir), the file of that name in it (`path` names
    it in messages)."""
    try:
        fd = os.open(path if dir_fd is None else path.name, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                     dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise BoardFileError(f"{path} is a symbolic link: an emulated board's files are never "
                                 "opened through a link") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise BoardFileError(f"{path} is not a regular file")
    os.set_blocking(fd, True)
    return fd


def open_board_dir(path: str | os.PathLike[str]) -> int:
    """The board's directory, opened once: `path` resolved once (a link to a board directory is
    that board, as its lock says), then reached with no link followed (files.open_dir). Every
    file of the board is opened relative to it, so a directory swapped for a link meanwhile by
    whoever owns its parent is never where they are read or written."""
    try:
        return open_dir(os.path.realpath(path), readable=False)     # what opening its files by path needed
    except LinkInPath as e:
        if e.link:
            raise BoardFileError(f"{path}: {e}") from None
        raise FileNotFoundError(f"{path} is not an emulated board (not a directory); "
                                "create one with 'amdflash sim create'") from None
    except (FileNotFoundError, NotADirectoryError):
        raise FileNotFoundError(f"{path} is not an emulated board (no board.json); "
                                "create one with 'amdflash sim create'") from None


class BoardFiles:
    """Opens the files of one board directory and maps them."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self._fds: list[int] = []
        self._dir = open_board_dir(self.path)
        try:
            self._open()
        except BaseException:
            self._close_fds()
            raise

    def _open(self) -> None:
        config_file = self.path / "board.json"
        try:
            fd = open_board_file(config_file, os.O_RDONLY, self._dir)
        except FileNotFoundError:
            raise FileNotFoundError(f"{self.path} is not an emulated board (no board.json); "
                                    "create one with 'amdflash sim create'") from None
        with os.fdopen(fd, "rb") as f:
            self.config: dict = json.loads(f.read())
        self.flash = self._map("flash.bin", FLASH_SIZE)
        self.regs = self._map("regs.bin", BAR5_SIZE)
        self.state = self._map("state.bin", STATE_SIZE)
        if bytes(self.state[0:8]) != STATE_MAGIC:
            raise ValueError(f"{self.path}/state.bin is not an emulated board state file")

    def _map(self, name: str, size: int) -> mmap.mmap:
        fd = open_board_file(self.path / name, dir_fd=self._dir)
        if os.fstat(fd).st_size != size:
            os.close(fd)
            raise ValueError(f"{self.path / name} has the wrong size (expected {size:#x} bytes)")
        self._fds.append(fd)
        return mmap.mmap(fd, size)

    def region(self, name: str) -> memoryview:
        offset, size = REGIONS[name]
        return memoryview(self.state)[offset:offset + size]

    def save_config(self) -> None:
        # A new file renamed over board.json: a link planted at either name is replaced, never followed.
        write_new(self.path / "board.json", json.dumps(self.config, indent=2, sort_keys=True), FILE_MODE,
                  dir_fd=self._dir)

    def close(self) -> None:
        for m in (self.flash, self.regs, self.state):
            try:
                m.flush()
                m.close()
            except (BufferError, ValueError):
                # A memoryview onto the map is still alive somewhere; the map closes with it.
                pass
        self._close_fds()

    def _close_fds(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()
        if self._dir >= 0:
            os.close(self._dir)
            self._dir = -1


def create_files(path: Path, config: dict, flash: bytes, regs: bytes, regions: dict[str, bytes] | None = None,
                 dir_fd: int | None = None) -> None:
    """Write the files of a fresh board into the directory `path` (made by the caller, and
    with `dir_fd` opened by it: the files go into that directory, whatever `path` names by
    now); board.json last. Each is created new (O_EXCL | O_NOFOLLOW): a name someone took
    meanwhile — a link to another file, say — fails the creation instead of being written
    through. `regions`: initial content of state.bin regions (by name), the rest zero."""
    if dir_fd is None:
        fd = open_board_dir(path)
        try:
            create_files(path, config, flash, regs, regions, fd)
        finally:
            os.close(fd)
        return
    if len(flash) != FLASH_SIZE or len(regs) != BAR5_SIZE:
        raise ValueError("internal: wrong flash or register image size")
    state = bytearray(STATE_SIZE)
    state[0:8] = STATE_MAGIC
    for name, data in (regions or {}).items():
        offset, size = REGIONS[name]
        state[offset:offset + min(size, len(data))] = data[:size]
    for name, data in (("flash.bin", flash), ("regs.bin", regs), ("state.bin", bytes(state)),
                       ("board.json", json.dumps(config, indent=2, sort_keys=True).encode())):
        try:
            fd = create_new(Path(name), FILE_MODE, dir_fd)
        except FileExistsError:
            raise FileExistsError(f"{path / name} appeared while the board was being created "
                                  "(another user writes to this directory?): not written through") from None
        with os.fdopen(fd, "wb") as f:
            f.write(data)
