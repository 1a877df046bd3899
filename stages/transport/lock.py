"""One process per physical board, whoever runs it and however it is named.

The lock is an flock on the object that *is* the board, where there is one: the USB device
node of the bridge (/dev/bus/usb/BBB/DDD), the PCI device's sysfs directory, the emulated
board's directory. The kernel keys an flock on the inode, so every user and every spec that
reaches the board — usb:0 and usb:SERIAL, pci: and amdgpu:, a sim: path through a symlink,
the emulated bridge that AMDFLASH_SIM_USB puts in front of a sim board — takes the same lock.
The object is opened read-only and never written: nothing a local user can place in our way
makes a root run write anywhere. The kernel drops the lock when the process dies, however it
dies, so a crashed job never leaves a board locked. Who holds it is read from /proc/locks.

Only where there is no such object is a lock file used, in a directory that must be ours:
root's is /run/lock/amdflash (root-owned, 0755, shared by the machine), another user's is a
0700 directory of their own under $XDG_RUNTIME_DIR or the temp dir. The directory is checked
with lstat (a directory, not a link, the expected owner, writable by nobody else) and the
file opened O_NOFOLLOW, never truncated: a link or a file planted there is refused.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import stat
import tempfile
from pathlib import Path

ENV_LOCK_DIR = "AMDFLASH_LOCK_DIR"
SYSTEM_LOCK_DIR = Path("/run/lock/amdflash")


class BoardBusy(RuntimeError):
    def __init__(self, key: str, pid: int | None):
        owner = f"pid {pid}" if pid else "another process"
        super().__init__(f"board busy ({owner}): {key} is in use")
        self.pid = pid


class LockUnsafe(RuntimeError):
    """The lock's place is not what it must be (another owner, a link, open to others)."""


def _own_dir(path: Path, owner: int, mode: int) -> Path:
    """`path` as a directory owned by `owner` that nobody else may write, made if missing."""
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        pass
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(path, mode)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise LockUnsafe(f"lock directory {path} is not a directory (a link or a file is there): refusing to use it")
    if st.st_uid != owner:
        raise LockUnsafe(f"lock directory {path} belongs to uid {st.st_uid}, not {owner}: refusing to use it "
                         "(someone else made it; remove it)")
    if st.st_mode & 0o022:
        raise LockUnsafe(f"lock directory {path} is writable by others (mode {st.st_mode & 0o777:o}): "
                         "refusing to use it")
    return path


def lock_dir() -> Path:
    """Where lock files go for boards with no object of their own to lock."""
    uid = os.getuid()
    given = os.environ.get(ENV_LOCK_DIR)
    if given:
        return _own_dir(Path(given), uid, 0o700)
    if uid == 0:
        return _own_dir(SYSTEM_LOCK_DIR, 0, 0o755)
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    return _own_dir(Path(base) / f"amdflash-locks-{uid}", uid, 0o700)


def holder(fd: int) -> int | None:
    """The pid holding an flock on the file open at `fd` (from /proc/locks), if it can be told."""
    st = os.fstat(fd)
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            for line in f:
                fields = line.split()
                # "1: FLOCK  ADVISORY  WRITE 1234 fe:00:260072 0 EOF"; blocked waiters show "->".
                if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == inode and fields[4].isdigit():
                    return int(fields[4])
    except OSError:
        pass
    return None


class BoardLock:
    """The lock of one board: `key` names it in messages; `resource` is the object that is
    the board (None: a lock file named after the key)."""

    def __init__(self, key: str, resource: str | os.PathLike[str] | None = None):
        self.key = key
        self.resource = Path(resource) if resource is not None else None
        self._fd: int | None = None

    @property
    def path(self) -> Path:
        if self.resource is not None:
            return self.resource
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.key)[:60]
        digest = hashlib.sha256(self.key.encode("utf-8", "surrogateescape")).hexdigest()[:16]
        return lock_dir() / f"{safe}-{digest}.lock"

    def _open(self) -> int:
        flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK
        if self.resource is not None:
            # The board's own object, by its real path: a device node, a sysfs or board directory.
            try:
                return os.open(os.path.realpath(self.resource), flags)
            except FileNotFoundError:
                self.resource = None       # gone (or never there, e.g. no /dev/bus/usb): a lock file
        path = self.path
        try:
            fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise LockUnsafe(f"lock file {path} is a symbolic link: refusing to follow it") from None
            raise
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_nlink != 1:
            os.close(fd)
            raise LockUnsafe(f"lock file {path} is not a plain file of ours: refusing to use it")
        return fd

    def acquire(self) -> BoardLock:
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            pid = holder(fd)
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise BoardBusy(self.key, pid) from None
            raise
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> BoardLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def sim_key(path: str | os.PathLike[str]) -> str:
    return f"sim:{Path(path).resolve()}"


def sim_lock(path: str | os.PathLike[str]) -> BoardLock:
    """The lock of an emulated board: its directory, however it is reached."""
    return BoardLock(sim_key(path), Path(path).resolve())
