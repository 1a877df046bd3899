"""One process per board: an advisory lock keyed by bridge serial, PCI address or sim path.

The lock is an flock on a small file holding the owner's pid; the kernel drops it when
the process dies, however it dies, so a crashed job never leaves a board locked.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import tempfile
from pathlib import Path


class BoardBusy(RuntimeError):
    def __init__(self, key: str, pid: int | None):
        owner = f"pid {pid}" if pid else "another process"
        super().__init__(f"board busy ({owner}): {key} is in use")
        self.pid = pid


def lock_dir() -> Path:
    base = os.environ.get("AMDFLASH_LOCK_DIR") or os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    path = Path(base) / f"amdflash-locks-{os.getuid()}"
    path.mkdir(parents=True, exist_ok=True)
    return path


class BoardLock:
    def __init__(self, key: str):
        self.key = key
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in key)[:60]
        digest = hashlib.sha1(key.encode()).hexdigest()[:12]
        self.path = lock_dir() / f"{safe}-{digest}.lock"
        self._fd: int | None = None

    def acquire(self) -> BoardLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise BoardBusy(self.key, self._owner()) from None
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def _owner(self) -> int | None:
        try:
            return int(self.path.read_text().strip() or 0) or None
        except (OSError, ValueError):
            return None

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
