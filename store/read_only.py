"""Opening an audit database so that reading it changes no byte of it, and creates nothing.

A reviewer reads a copy they were handed; root reads another user's trail; an operator lists
runs while a flash records. SQLite opening a WAL database read-only (`mode=ro`) still creates
`-wal` and `-shm` beside it when they are missing, and writes read marks into a `-shm` whose
WAL holds frames. So the way in depends on what is beside the file:

* a connection has it open now (a lock on the database or its `-shm`: /proc/locks) — through
  its `-wal` and `-shm`, as every reader of a live WAL database must, to see what was
  committed; the writer changes those files anyway;
* nobody has it open and its WAL holds nothing (no `-wal`, or an empty one) — `immutable=1`:
  the main file holds every committed row, and SQLite reads it without locks, creating and
  changing nothing;
* nobody has it open but its `-wal` holds frames (a writer killed before it checkpointed, or
  a copy taken with its `-wal`) — a private copy of the database and its `-wal`, read in a
  directory only this process can open and removed when the connection closes. `immutable`
  would ignore the WAL's rows, and `mode=ro` would create or change the `-shm`.

What `immutable` cannot see: a writer that starts while the read is under way. Its rows are
not in the snapshot read (as for any reader), and should it checkpoint into the main file
before the read ends, a long read may fail with an SQLite error; it is never silently wrong
about rows it read (every row a verdict counts is hashed against its signed checkpoint).
"""
from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
import weakref
from pathlib import Path

from amdflash.stages.files import readonly_uri

PROC_LOCKS = "/proc/locks"


def _inode(path: str) -> str | None:
    """The file's inode number, as the last part of /proc/locks' MAJOR:MINOR:INODE. Only the
    inode is compared: on btrfs the device a stat names is not the one /proc/locks shows, and
    another file's lock with the same number only makes the reader take the cautious way."""
    try:
        return str(os.stat(path).st_ino)
    except OSError:
        return None


def open_elsewhere(path: str) -> bool:
    """Whether some SQLite connection (of any process, this one included) has the database open
    now: a WAL connection holds a lock on the database file and on its -shm while open.
    /proc/locks is read, never a file descriptor of the database opened and closed here: closing
    one would drop the POSIX locks this process's own connections hold on it. Where /proc/locks
    cannot be read, a database with a -shm is taken as open (the cautious way)."""
    ids = {i for i in (_inode(path), _inode(f"{path}-shm")) if i}
    try:
        with open(PROC_LOCKS, encoding="ascii", errors="replace") as f:
            table = f.read()
    except OSError:
        return os.path.exists(f"{path}-shm")
    for line in table.splitlines():
        fields = line.split()
        if "->" in fields:          # a waiter, not a holder
            continue
        if any(field.count(":") == 2 and field.rsplit(":", 1)[1] in ids for field in fields):
            return True
    return False


def _wal_frames(path: str) -> bool:
    try:
        return os.path.getsize(f"{path}-wal") > 0
    except OSError:
        return False


def reader_uri(path: str) -> str:
    """The SQLite URI a reader opens `path` with (module docstring), for the cases that need no
    copy: through the live -wal/-shm, or immutable."""
    uri = readonly_uri(path)
    if open_elsewhere(path) or _wal_frames(path):
        return uri
    return uri + "&immutable=1"


def needs_copy(path: str) -> bool:
    """A WAL with frames that no connection holds: reading it in place would create or change
    its -shm."""
    return _wal_frames(path) and not open_elsewhere(path)


def connect_reader(path: str) -> sqlite3.Connection:
    """A read-only connection, autocommit like schema.connect, that writes nothing beside
    `path` (module docstring)."""
    if not needs_copy(path):
        return sqlite3.connect(reader_uri(path), uri=True, timeout=30.0, isolation_level=None,
                               check_same_thread=False)
    try:
        return _private_copy(path)
    except OSError as e:
        # As SQLite's own errors are: every reader of the trail already says those in one line.
        raise sqlite3.OperationalError(f"its -wal holds rows nobody has open, and the private copy they are read "
                                       f"through could not be made in {tempfile.gettempdir()} ({e.strerror or e}); "
                                       "set TMPDIR to a directory with room") from None


def _private_copy(path: str) -> sqlite3.Connection:
    """The database and its -wal copied into a new 0700 directory and opened there (the -shm
    SQLite makes is made there); the directory goes when the connection is closed or dropped."""
    place = tempfile.mkdtemp(prefix="amdflash-read-")
    try:
        copy = os.path.join(place, Path(path).name or "audit.sqlite")
        # Copied WAL first: a frame appended between the two copies would otherwise name a page
        # the copied main file does not hold yet (the copy is what nobody is writing: needs_copy).
        shutil.copyfile(f"{path}-wal", f"{copy}-wal")
        shutil.copyfile(path, copy)
        conn = sqlite3.connect(readonly_uri(copy), uri=True, timeout=30.0, isolation_level=None,
                               check_same_thread=False, factory=_CopyConnection)
    except BaseException:
        shutil.rmtree(place, ignore_errors=True)
        raise
    conn.place, conn.original = place, os.path.abspath(path)
    weakref.finalize(conn, shutil.rmtree, place, True)     # also if it is dropped unclosed
    return conn


class _CopyConnection(sqlite3.Connection):
    """A connection to a private copy: closing it removes the copy."""

    place = ""
    original = ""       # the database it is a copy of

    def close(self) -> None:
        super().close()
        if self.place:
            shutil.rmtree(self.place, ignore_errors=True)


def source_path(conn: sqlite3.Connection) -> str | None:
    """The database file a connection reads, as the operator named it: for a private copy, the
    database it is a copy of — what a printed command names, and where the trail's neighbours
    (its anchor, its transparency log, backups/) are — never the copy, which is gone once
    read. None for a database in memory."""
    original = getattr(conn, "original", "")
    if original:
        return str(original)
    rows = [r for r in conn.execute("PRAGMA database_list") if r[1] == "main" and r[2]]
    return str(rows[0][2]) if rows else None
