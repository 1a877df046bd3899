"""The single audit writer and the per-run recorders that feed it.

One writer owns the SQLite connection, and it lives in a process of its own: hashing,
signing and inserting tens of thousands of rows would otherwise compete with device I/O
for the interpreter lock. Producers hand it rows through a pipe, each row a frame of its
own (length, then the row in `marshal` form); when the writer falls behind the pipe fills
and producers block — backpressure — and nothing is ever dropped.

The writer outlives its host: if the host process dies, even in the middle of handing
over a row, the writer commits every complete row it received, drops the torn one, seals
what it committed and exits cleanly.

Rows are inserted as they arrive inside an open transaction, committed at every unit
boundary (boundaries read together share one commit), every `group_rows` rows or
`group_seconds`, and at every barrier. Commits run
with `synchronous=NORMAL` (a committed row survives the death of any process); a barrier
also fsyncs the WAL (it survives a power loss). `Recorder.durable()` is that barrier: a
unit's intent is made durable before anything destructive touches the unit. A commit also
seals the runs written to with signed checkpoints (store.chain) when it is a barrier, when
a run ended, or when `seal_rows` rows or `seal_seconds` have passed since the last seal.
"""
from __future__ import annotations

import atexit
import datetime as dt
import hashlib
import itertools
import json
import marshal
import multiprocessing
import multiprocessing.connection
import os
import select
import shlex
import signal
import socket
import sqlite3
import struct
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from amdflash.store import chain, keys
from amdflash.store.schema import (
    DEFAULT_SHAPE,
    LOGICAL,
    MAX_SHAPE,
    PHYSICAL,
    ROM_SW_CNTL,
    ROM_SW_COMMAND,
    ROM_SW_DATA,
    ROM_SW_RETURN_DATA_ENABLE,
    ROM_SW_STATUS,
    SCHEMA_VERSION,
    TERMINAL,
    SchemaError,
    connect,
    create,
    version,
)

UNIT = 0x1000

# The ROM_SW engine's registers as one block: CNTL, STATUS, COMMAND, a reserved dword, then
# the 256-byte data window.
_WINDOW = 0x100
_ENGINE, _ENGINE_END = ROM_SW_CNTL, ROM_SW_DATA + _WINDOW
_ENGINE_SIZE = _ENGINE_END - _ENGINE
_CNTL_END = ROM_SW_CNTL + 4
_COMMAND_AT, _DATA_AT = ROM_SW_COMMAND - _ENGINE, ROM_SW_DATA - _ENGINE
_ZERO = bytes(4)


class AuditFailure(RuntimeError):
    """The audit trail could not be written: no further hardware write may be issued."""


# Free space the trail keeps for itself on the database's file system: below STOP_FREE the
# writer stops the job (every later barrier fails, so nothing destructive starts) while the
# room left still takes the run's end; a run does not start below START_FREE.
STOP_FREE = 4 << 20
START_FREE = 8 << 20


def free_bytes(path: str) -> int:
    """Bytes free to this user on the file system that holds `path` (its directory)."""
    st = os.statvfs(os.path.dirname(os.path.abspath(path)))
    return st.f_bavail * st.f_frsize


def low_space(path: str, free: int, need: int) -> str:
    return (f"audit database {path}: the file system has {free / (1 << 20):.1f} MiB free, and the trail "
            f"keeps {need >> 20} MiB free so that a run can always record its end; free some space")


class StoreUnavailable(RuntimeError):
    """The database cannot be opened or written: refuse before touching a board."""


def _row_id(cursor: sqlite3.Cursor) -> int:
    """The rowid the INSERT just run on `cursor` gave its row."""
    rowid = cursor.lastrowid
    if rowid is None:
        raise SchemaError("an INSERT reported no row id")
    return rowid


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def micros(seconds: float) -> int:
    return round(seconds * 1_000_000)


# -- the pipe: one frame per row ----------------------------------------------------------------

_LEN = struct.Struct("<I")


def frame(message: tuple) -> bytes:
    data = marshal.dumps(message)
    return _LEN.pack(len(data)) + data


class FrameReader:
    """Splits a byte stream into complete frames; an incomplete tail waits for more bytes."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple]:
        buf = self.buffer
        buf += data
        out, pos, end = [], 0, len(buf)
        while end - pos >= 4:
            (size,) = _LEN.unpack_from(buf, pos)
            if end - pos - 4 < size:
                break
            out.append(marshal.loads(bytes(buf[pos + 4:pos + 4 + size])))
            pos += 4 + size
        del buf[:pos]
        return out


# -- opening a database -------------------------------------------------------------------------

def needs_upgrade(path: str, found: int) -> str:
    """Why a database of an older schema is not used, and the one command that upgrades it."""
    return (f"audit database {path} was written by an older amdflash (schema version {found}: a hash chain, "
            "no signatures); no command upgrades it as a side effect of using it. Its owner upgrades it, "
            f"once, with: amdflash --db {shlex.quote(path)} audit upgrade")


def prepare(path: str, upgrade: Callable[[sqlite3.Connection], None] | None = None) -> None:
    """Create the schema, or upgrade an older one with `upgrade` (only `audit upgrade` hands
    one down, store.migrate.upgrade: the migration is built on this module, so this module
    does not import it), or refuse a database that is not ours or that needs an upgrade and
    got none. Proves the database writable (else StoreUnavailable)."""
    try:
        if upgrade is None and os.path.isfile(path) and os.path.getsize(path):
            # Looked at read-only first: opening it for writing would already change an older
            # database (its journal mode), which only `audit upgrade` may.
            probe = connect(path, readonly=True)
            try:
                found = version(probe)
            finally:
                probe.close()
            if found is not None and 0 < found < SCHEMA_VERSION:
                raise SchemaError(needs_upgrade(path, found))
        conn = connect(path)
        try:
            found = version(conn)
            if found is None:
                raise SchemaError(f"{path} is an SQLite database of another application (no amdflash schema); "
                                  "refusing to add tables to it")
            if found == 0:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    if version(conn) == 0:   # another process may have created it meanwhile
                        create(conn)
                    conn.execute("COMMIT")
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
            elif found < SCHEMA_VERSION:
                if upgrade is None:
                    raise SchemaError(needs_upgrade(path, found))
                upgrade(conn)
            elif found > SCHEMA_VERSION:
                raise SchemaError(f"audit database {path} has schema version {found}; this amdflash understands "
                                  f"{SCHEMA_VERSION} (upgrade amdflash)")
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
        finally:
            conn.close()
    except SchemaError:
        raise
    except (sqlite3.Error, OSError) as e:
        raise StoreUnavailable(f"audit database {path} is not writable: {e}") from None


def _start_method() -> str:
    # fork is cheapest and safe while this process runs a single thread (the CLI opens the
    # writer before anything else starts); otherwise forkserver avoids forking live threads.
    return "fork" if threading.active_count() == 1 else "forkserver"


# Writers started and not yet closed. The writer process ignores SIGINT and SIGTERM (it must
# outlive the host's Ctrl-C to write what it was handed), so if the host leaves without closing
# one (a Ctrl-C landing between start and the caller's cleanup), multiprocessing's own exit
# handler would wait for it forever. This handler, registered after multiprocessing's and so
# run before it, tells each one to finish.
_STARTED: weakref.WeakSet[AuditWriter] = weakref.WeakSet()


@atexit.register
def _close_started() -> None:
    for writer in list(_STARTED):
        writer.close()


class AuditWriter:
    def __init__(self, path: str, key_path: Path | str | None = None, anchor: Path | str | None = None,
                 group_rows: int = 4000, group_seconds: float = 0.25, max_pages: int | None = None):
        self.path = path
        self.key_path = Path(key_path) if key_path else Path(path).with_name("host_key.pem")
        self.anchor = Path(anchor) if anchor else default_anchor(path)
        self.group_rows = group_rows
        self.group_seconds = group_seconds
        self.max_pages = max_pages      # cap the database size (SQLite max_page_count)
        self.failed: str | None = None
        self.low: str | None = None     # the file system is nearly full: the job must stop
        self._process: multiprocessing.process.BaseProcess | None = None
        self._send_fd: int | None = None
        self._send_lock = threading.Lock()
        self._barriers: dict[int, threading.Event] = {}
        self._ids = itertools.count(1)
        self._reader: threading.Thread | None = None

    # -- lifetime -------------------------------------------------------------------------
    def open(self) -> AuditWriter:
        """Create or migrate the schema, load (or create) the host key, prove the database
        writable (else StoreUnavailable), then start the writer process."""
        try:
            Signer.load(self.key_path)
        except (OSError, keys.KeyError_) as e:
            raise StoreUnavailable(f"host key {self.key_path}: {e}") from None
        try:
            prepare(self.path)
        except SchemaError as e:
            raise StoreUnavailable(str(e)) from None
        method = _start_method()
        ctx = multiprocessing.get_context("fork") if method == "fork" else multiprocessing.get_context("forkserver")
        rows_r, rows_w = os.pipe()
        _widen(rows_w)
        rows_rx = multiprocessing.connection.Connection(rows_r, writable=False)
        status_rx, status_tx = ctx.Pipe(duplex=False)
        self._send_fd = rows_w
        # A forked child inherits this side's pipe ends too; it must close them, or it would
        # never see end-of-file when this process dies.
        inherited = (rows_w, status_rx.fileno()) if method == "fork" else ()
        self._process = ctx.Process(
            target=_writer_main, name="amdflash-audit-writer", daemon=True,
            args=(self.path, str(self.key_path), str(self.anchor), rows_rx, status_tx, self.group_rows,
                  self.group_seconds, self.max_pages, os.getpid(), inherited))
        self._process.start()
        _STARTED.add(self)
        rows_rx.close()
        status_tx.close()
        self._reader = threading.Thread(target=self._read_status, args=(status_rx,), name="audit-status",
                                        daemon=True)
        self._reader.start()
        return self

    def close(self) -> None:
        if self._process is None:
            return
        _STARTED.discard(self)
        try:
            self._write(frame(("!stop",)))
        except OSError:
            pass   # the writer is already gone; its status reader has said why
        self._process.join()
        if self._reader is not None:    # None: interrupted before it was started
            self._reader.join()
        assert self._send_fd is not None
        os.close(self._send_fd)
        self._process = None

    # -- producers ------------------------------------------------------------------------
    def submit(self, rows: list[tuple]) -> None:
        self._check()
        self._post(b"".join(map(frame, rows)))   # blocks while the pipe is full: backpressure

    def commit_soon(self) -> None:
        """Ask for a commit of everything handed over so far, without waiting for it."""
        if not self.failed:
            self._post(frame(("!commit",)))

    def barrier(self, timeout: float = 120.0) -> None:
        """Return once everything handed over so far is committed and fsynced."""
        self._check()
        ident = next(self._ids)
        done = self._barriers[ident] = threading.Event()
        self._post(frame(("!barrier", ident)))
        if not done.wait(timeout):
            raise AuditFailure(f"audit writer did not commit within {timeout:g} s")
        self._barriers.pop(ident, None)
        self._check()
        if self.low:
            # Everything so far is durable; what follows must not be started.
            raise AuditFailure(self.low)

    def _post(self, data: bytes) -> None:
        assert self._send_fd is not None, "AuditWriter used before open()"
        try:
            self._write(data)
        except OSError as e:
            self._fail(f"audit writer process is gone ({e})")
            self._check()

    def _write(self, data: bytes) -> None:
        with self._send_lock:
            view = memoryview(data)
            while view:
                view = view[os.write(self._send_fd, view):]   # type: ignore[arg-type]

    def _check(self) -> None:
        if self.failed:
            raise AuditFailure(f"audit trail write failed: {self.failed}")

    def _fail(self, message: str) -> None:
        self.failed = self.failed or message
        for event in list(self._barriers.values()):
            event.set()

    def _read_status(self, status: multiprocessing.connection.Connection) -> None:
        closed = False
        while True:
            try:
                kind, value = status.recv()
            except (EOFError, OSError):
                if not closed:   # the writer died without saying goodbye: nothing more is recorded
                    self._fail("audit writer process exited unexpectedly")
                break
            if kind == "done":
                event = self._barriers.get(value)
                if event:
                    event.set()
            elif kind == "failed":
                self._fail(value)
            elif kind == "low":
                self.low = value
            elif kind == "closed":
                closed = True
                break
        status.close()


def _widen(fd: int) -> None:
    """Give the pipe room for a few units' rows, so that a producer rarely waits for the writer
    (Linux: F_SETPIPE_SZ; elsewhere the default stays)."""
    import fcntl

    try:
        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
    except OSError:
        pass


def default_anchor(db_path: str) -> Path:
    """The anchor file: beside the database unless AMDFLASH_ANCHOR names another place."""
    return Path(os.environ.get("AMDFLASH_ANCHOR") or db_path + ".anchor")


# -- the writer process ---------------------------------------------------------------------------

def _writer_main(path: str, key_path: str, anchor: str, rows: multiprocessing.connection.Connection,
                 status: multiprocessing.connection.Connection, group_rows: int, group_seconds: float,
                 max_pages: int | None, host_pid: int, inherited: tuple[int, ...]) -> None:
    """Insert rows as they arrive, commit and seal in groups, answer barriers, and keep
    everything complete when the host dies."""
    # Ctrl-C and SIGTERM are for the host process, which stops at a safe point and then
    # tells the writer to finish; the writer must not die with half its queue unwritten.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for fd in inherited:
        os.close(fd)
    fd = rows.fileno()
    failed: str | None = None
    try:
        store = ChainWriter(connect(path), Signer.load(Path(key_path)), Path(anchor), max_pages)
    except Exception as e:  # tell the host why, then stop
        _tell(status, ("failed", f"{type(e).__name__}: {e}"))
        _tell(status, ("closed", None))
        return
    reader = FrameReader()
    waiting: list[int] = []

    low = False

    def settle(durable: bool) -> None:
        """Commit what is open and release the barriers waiting for it."""
        nonlocal failed, low
        if not low and not failed:
            try:
                free = free_bytes(path)
            except OSError:
                free = STOP_FREE
            if free < STOP_FREE:
                low = True      # said once; rows still go in (the run's end among them)
                _tell(status, ("low", low_space(path, free, STOP_FREE)))
        if not failed:
            try:
                store.commit(durable)
            except Exception as e:  # any failure stops the job, with its reason
                failed = f"audit database {path}: {type(e).__name__}: {e}"
                _tell(status, ("failed", failed))
        for ident in waiting:
            _tell(status, ("done", ident))
        waiting.clear()

    stop = False
    while not stop:
        # Wake up in time to commit an open group when it comes of age.
        timeout = max(0.0, group_seconds - (time.monotonic() - store.opened)) if store.open_rows else 1.0
        ready, _, _ = select.select([fd], [], [], timeout)
        messages: list[tuple] = []
        if ready:
            try:
                data = os.read(fd, 1 << 20)
            except OSError:
                data = b""
            if data:
                messages = reader.feed(data)
            else:
                stop = True   # the host is gone (or closed): what is torn in the buffer is dropped
        elif not store.open_rows and not _alive(host_pid):
            stop = True       # belt and braces: the host is gone even if the pipe is not
        # Commits asked for in what was read together are done once, after all of it: a writer
        # that fell behind catches up with one commit, not one per unit. A barrier commits at once.
        commit = False
        for message in messages:
            tag = message[0]
            if tag == "!stop":
                stop = True
                break
            if tag == "!barrier":
                waiting.append(message[1])
                settle(durable=True)
                commit = False
            elif tag == "!commit":
                commit = True
            elif not failed:
                try:
                    store.add(message)
                except Exception as e:
                    failed = f"{type(e).__name__}: {e}"
                    _tell(status, ("failed", failed))
                    store.abandon()
        if commit or store.open_rows and (store.open_rows >= group_rows
                                          or time.monotonic() - store.opened >= group_seconds):
            settle(durable=False)
    settle(durable=True)
    _tell(status, ("closed", None))
    store.close()


def _tell(status: multiprocessing.connection.Connection, message: tuple[str, object]) -> None:
    try:
        status.send(message)
    except OSError:
        pass   # the host is gone; the rows are committed all the same


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Signer:
    """The host key, and this host's row in `hosts`."""

    def __init__(self, key: Any, path: Path):
        self.key = key
        self.path = path
        self.public = keys.public_bytes(key)

    @classmethod
    def load(cls, path: Path) -> Signer:
        return cls(keys.load_or_create(path), path)

    def sign(self, message: bytes) -> bytes:
        return self.key.sign(message)

    def host_id(self, conn: sqlite3.Connection) -> int:
        """This host's id in `hosts` (inside the caller's write transaction)."""
        row = conn.execute("SELECT id FROM hosts WHERE public_key = ?", (self.public,)).fetchone()
        if row:
            return row[0]
        cur = conn.execute("INSERT INTO hosts (public_key, hostname, machine_id, first_seen) VALUES (?, ?, ?, ?)",
                           (self.public, socket.gethostname(), machine_id(), now_iso()))
        return _row_id(cur)


def machine_id() -> str | None:
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text:
            return text
    return None


class _Run:
    """The chain state of one run this writer appends to."""

    __slots__ = ("run_id", "key", "head", "rows", "last_seq", "hashers", "segment_rows", "ended")

    def __init__(self, run_id: str, key: int, head: bytes, rows: int, last_seq: int):
        self.run_id, self.key, self.head, self.rows, self.last_seq = run_id, key, head, rows, last_seq
        self.hashers: dict[str, Any] = {}
        self.segment_rows = 0
        self.ended = False


# Per logical table: how a recorded value becomes a stored one.
def _int(v: Any) -> int | None:
    return None if v is None else int(v)


def _text(v: Any) -> str | None:
    return None if v is None else str(v)


def _clock(v: Any) -> int | None:
    return None if v is None else micros(float(v))


def _sha(v: Any) -> bytes | None:
    return None if v is None else bytes.fromhex(v)


_CONVERT = {"int": _int, "text": _text, "clock": _clock, "sha": _sha, "data": None}
_INSERT = {table: f"INSERT INTO {table} (seq, {', '.join(c for c, _ in cols)}) VALUES "
                  f"(?, {', '.join('?' * len(cols))})" for table, cols in PHYSICAL.items()}


class ChainWriter:
    """Appends rows inside one open transaction at a time; seals the runs it wrote to with
    signed checkpoints (at least every `seal_rows` rows and `seal_seconds`)."""

    def __init__(self, conn: sqlite3.Connection, signer: Signer, anchor: Path | None, max_pages: int | None = None,
                 seal_rows: int = 4096, seal_seconds: float = 1.0):
        self.conn = conn
        self.signer = signer
        self.anchor = anchor
        # Signed into the newest checkpoint of every seal (the one appended to the anchor): the
        # database itself then remembers that it is anchored, and where (store.verify.check_anchor).
        self.anchor_detail = json.dumps({"anchor": os.path.abspath(anchor)}) if anchor is not None else None
        if not conn.in_transaction:
            # A commit survives the death of any process; barriers fsync the WAL themselves.
            conn.execute("PRAGMA synchronous=NORMAL")
        if max_pages:
            conn.execute(f"PRAGMA max_page_count = {int(max_pages)}")
        self.wal = conn.execute("PRAGMA database_list").fetchone()[2] + "-wal"
        self.open_rows = 0
        self.opened = 0.0
        self.seq = 0
        self.runs: dict[str, _Run] = {}
        self.dirty: dict[str, _Run] = {}
        self.pending: dict[str, list[tuple]] = {}
        self.blob_ids: dict[bytes, int] = {}
        self.host = 0
        self.kind: str | None = None     # a migration seals with its own checkpoint kind
        self.seal_rows, self.seal_seconds = seal_rows, seal_seconds
        self.unsealed = 0                # rows appended since the last seal
        self.sealed_at = time.monotonic()
        self._converters = {
            t.name: (t.physical, t.plain, tuple(_CONVERT[k] for c, k in t.columns if c != "run_id"),
                     tuple(i for i, (c, k) in enumerate(x for x in t.columns if x[0] != "run_id") if k == "data"))
            for t in LOGICAL.values()}

    # -- rows -----------------------------------------------------------------------------
    def _begin(self) -> None:
        if not self.conn.in_transaction:   # a migration runs inside its own transaction
            self.conn.execute("BEGIN IMMEDIATE")
        # Read under the write lock: another amdflash process may have appended meanwhile.
        self.seq = self.conn.execute("SELECT seq FROM chain_head WHERE id = 1").fetchone()[0]
        self.host = self.signer.host_id(self.conn)
        self.opened = time.monotonic()

    def add(self, message: tuple, seq: int | None = None) -> None:
        """Append one row; `seq` only when a migration keeps the seq an older trail gave it."""
        if not self.open_rows:
            self._begin()
        self.open_rows += 1
        table, run_id = message[0], message[1]
        if seq is None:
            self.seq += 1
            seq = self.seq
        else:
            self.seq = max(self.seq, seq)
        if table == "spi":
            # ("spi", run_id, command, cntl, tx, data, reserved, shape, clock, lead, again)
            tx, data = message[4], message[5]
            tx_ref, tx_sha = self._blob(tx) if tx is not None else (None, None)
            if data is None:
                data_ref, data_sha = None, None
            elif data == tx:
                data_ref, data_sha = tx_ref, tx_sha
            else:
                data_ref, data_sha = self._blob(data)
            run = self._run(run_id)
            rest = message[6:]
            self._append("log_spi", run, seq, (run.key, message[2], message[3], tx_ref, data_ref, *rest),
                         (run.key, message[2], message[3], tx_sha, data_sha, *rest))
            return
        if table == "write":
            data = message[4]
            ref, sha = self._blob(data) if data is not None else (None, None)
            run = self._run(run_id)
            values = (run.key, message[2], message[3], ref, message[5])
            self._append("log_writes", run, seq, values, (run.key, message[2], message[3], sha, message[5]))
            return
        physical, plain, converters, data_columns = self._converters[table]
        stored: list[Any] = [conv(v) if conv else v for conv, v in zip(converters, message[2:], strict=True)]
        chained = list(stored)
        for i in data_columns:
            if stored[i] is not None:
                stored[i], chained[i] = self._blob(bytes(stored[i]))
        if table == "runs":
            run = _Run(run_id, seq, chain.run_genesis(run_id), 0, 0)
            self.runs[run_id] = run
        else:
            run = self._run(run_id)
        if plain:
            row = (run_id, *stored)
            self._append(physical, run, seq, row, (run_id, *chained))
        else:
            self._append(physical, run, seq, (run.key, *stored), (run.key, *chained))
        if table == "run_status" and message[2] in TERMINAL:
            run.ended = True

    def _append(self, table: str, run: _Run, seq: int, values: tuple, chained: tuple) -> None:
        self.pending.setdefault(table, []).append((seq, *values))
        hasher = run.hashers.get(table)
        if hasher is None:
            hasher = run.hashers[table] = hashlib.sha256()
        hasher.update(chain.canonical(table, seq, chained))
        run.segment_rows += 1
        run.last_seq = max(run.last_seq, seq)
        self.unsealed += 1
        self.dirty[run.run_id] = run
        if len(self.pending[table]) >= 2048:
            self._flush_inserts()

    def _run(self, run_id: str) -> _Run:
        run = self.runs.get(run_id)
        if run is None:
            run = self.runs[run_id] = self._load_run(run_id)
        return run

    def _load_run(self, run_id: str) -> _Run:
        """A run recorded earlier (by this or another process): continue its chain."""
        row = self.conn.execute("SELECT seq FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if row is None:
            raise RuntimeError(f"a row of run {run_id!r}, which has no runs row")
        last = self.conn.execute("SELECT rows, last_seq, head FROM checkpoints WHERE run = ? ORDER BY id DESC LIMIT 1",
                                 (row[0],)).fetchone()
        if last is None:
            return _Run(run_id, row[0], chain.run_genesis(run_id), 0, row[0])
        return _Run(run_id, row[0], last[2], last[0], last[1])

    def _blob(self, data: bytes) -> tuple[int, bytes]:
        """(id, sha256) of the stored copy of `data`: content-addressed, stored once."""
        sha = hashlib.sha256(data).digest()
        known = self.blob_ids.get(sha)
        if known is not None:
            return known, sha
        row = self.conn.execute("SELECT id FROM blobs WHERE substr(sha256, 1, 8) = ? AND sha256 = ?",
                                (sha[:8], sha)).fetchone()
        ident = row[0] if row else _row_id(self.conn.execute("INSERT INTO blobs (sha256, data) VALUES (?, ?)",
                                                             (sha, data)))
        self.blob_ids[sha] = ident
        return ident, sha

    def _flush_inserts(self) -> None:
        for table, rows in self.pending.items():
            if rows:
                self.conn.executemany(_INSERT[table], rows)
        self.pending = {}

    # -- commits --------------------------------------------------------------------------
    def commit(self, durable: bool) -> None:
        """Commit what is open. A durable commit (a barrier, the end) also fsyncs the WAL. The
        runs written to are sealed when the commit is durable, when a run ended, or when
        `seal_rows` rows or `seal_seconds` have passed since the last seal."""
        if not self.open_rows:
            if not (durable and self.dirty):
                if durable:
                    self._sync_wal()
                return
            # Rows committed earlier but not sealed yet: a durable commit (the last one, when
            # the host has died) seals them in a transaction of its own.
            self._begin()
        conn = self.conn
        seal = durable or any(r.ended for r in self.dirty.values()) or self.unsealed >= self.seal_rows \
            or time.monotonic() - self.sealed_at >= self.seal_seconds
        try:
            self._flush_inserts()
            newest = self._seal() if seal else None
            if newest is None:
                conn.execute("UPDATE chain_head SET seq = ? WHERE id = 1", (self.seq,))
            conn.execute("COMMIT")
        except BaseException:
            self.abandon()
            raise
        self.open_rows = 0
        if durable:
            self._sync_wal()
        if newest is not None:
            self._write_anchor(newest)

    def _seal(self) -> chain.Checkpoint | None:
        """A signed checkpoint for every run written to since its last one."""
        conn = self.conn
        head = conn.execute("SELECT checkpoint, hash FROM chain_head WHERE id = 1").fetchone()
        ident, prev = head[0], head[1] or chain.GENESIS
        newest = None
        last = len(self.dirty) - 1
        for i, run in enumerate(self.dirty.values()):
            digests = {t: h.digest() for t, h in run.hashers.items()}
            run.head = chain.segment_head(run.head, digests)
            run.rows += run.segment_rows
            run.hashers, run.segment_rows = {}, 0
            ident += 1
            kind = self.kind or ("final" if run.ended else "commit")
            cp = chain.Checkpoint(ident, kind, run.run_id, run.rows, run.last_seq, run.head, self.signer.public,
                                  now_iso(), self.anchor_detail if i == last else None, run=run.key, host=self.host)
            sign_and_insert(conn, self.signer, cp, prev)
            prev, newest = cp.hash, cp
        self.dirty = {}
        self.unsealed, self.sealed_at = 0, time.monotonic()
        conn.execute("UPDATE chain_head SET seq = ?, checkpoint = ?, hash = ? WHERE id = 1", (self.seq, ident, prev))
        return newest

    def _sync_wal(self) -> None:
        try:
            fd = os.open(self.wal, os.O_RDONLY)
        except FileNotFoundError:
            return   # checkpointed into the database file, which SQLite synced
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)

    def _write_anchor(self, cp: chain.Checkpoint) -> None:
        if self.anchor is None:
            return
        line = json.dumps({"checkpoint": cp.id, "hash": cp.hash.hex(), "sig": cp.sig.hex(),
                           "key": keys.fingerprint(cp.public_key), "at": cp.at}, separators=(",", ":")) + "\n"
        try:
            fd = os.open(self.anchor, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
        except OSError:
            pass   # the anchor is a second witness; the database itself is committed

    def abandon(self) -> None:
        if self.conn.in_transaction:   # SQLite may already have rolled back (e.g. disk full)
            self.conn.execute("ROLLBACK")
        self.open_rows = 0
        self.pending = {}
        # The chain state of the runs is unknown now: reload from the database on next use.
        self.runs, self.dirty, self.blob_ids = {}, {}, {}

    def close(self) -> None:
        self.abandon()
        self.conn.close()


def sign_and_insert(conn: sqlite3.Connection, signer: Signer, cp: chain.Checkpoint, prev: bytes) -> None:
    """Insert `cp` chained after `prev`, signed; a legacy checkpoint (chain.LEGACY: rows an
    older, unsigning amdflash recorded) is chained but never signed: no key vouches for them."""
    cp.hash = cp.digest(prev)
    cp.sig = b"" if cp.kind == chain.LEGACY else signer.sign(cp.hash)
    if cp.host is None:
        cp.host = signer.host_id(conn)
    conn.execute("INSERT INTO checkpoints (id, kind, run, run_id, rows, last_seq, head, host, at, detail, hash, sig) "
                 "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                 (cp.id, cp.kind, cp.run, cp.run_id, cp.rows, cp.last_seq, cp.head, cp.host, cp.at, cp.detail,
                  cp.hash, cp.sig))


# -- producers -------------------------------------------------------------------------------------

class Assembler:
    """Turns register writes into rows, from the ROM_SW engine's registers as the board sees
    them, whatever shape the writes take.

    It follows COMMAND, CNTL and the data window through every register write and every
    block write that overlaps them. A write to ROM_SW_CNTL starts a transaction: then one
    `log_spi` row records it — COMMAND and CNTL as the engine held them, the TX bytes it
    sends (from the window), the clock of its start — together with the writes that set it
    up since the transaction before it, as shape letters (store.schema.SHAPE_LETTERS), so
    that the `register_writes` view re-creates exactly those writes, in order. A
    transaction repeated at once with no data joins the row of the first. A write that no
    letter describes (outside the engine, or not what the row's values re-create) is a
    `log_writes` row of its own, and so is every write before it since the last transaction.

    `emit(row, seq)` receives each row in order with the seq of its first write (when the
    writes came with one: a migration keeps the seqs an older trail gave them).
    `started(command, cntl, clock)` is told of every transaction as it starts."""

    def __init__(self, run_id: str, emit: Any, started: Any = None) -> None:
        self.run_id = run_id
        self.emit = emit
        self.started = started
        self.regs = bytearray(_ENGINE_SIZE)        # the engine's block, CNTL to the end of the window ...
        self.known = bytearray(_ENGINE_SIZE)       # ... and which of its bytes this trail knows (1)
        self.pending: list[tuple[int, int | None, bytes | None, float, int | None]] = []
        self.held: list[Any] | None = None         # the last transaction row, while it may repeat
        self.held_seq: int | None = None

    def know(self, offset: int, value: int) -> None:
        """A register value read from the board (a snapshot): what a later row may rely on."""
        if _ENGINE <= offset and offset + 4 <= _ENGINE_END:
            at = offset - _ENGINE
            self.regs[at:at + 4] = (value & 0xFFFFFFFF).to_bytes(4, "little")
            self.known[at:at + 4] = b"\x01\x01\x01\x01"

    def write(self, offset: int, value: int | None, data: bytes | None, clock: float, seq: int | None = None) -> None:
        w = (offset, value, data, clock, seq)
        size = 4 if value is not None else len(data or b"")
        if offset >= _ENGINE_END or offset + size <= _ENGINE:
            self._raw(self.pending)          # not the engine's: order is kept, raw
            self.pending = []
            self._raw([w])
            return
        if offset < _CNTL_END and offset + size > ROM_SW_CNTL:
            self._start(w)
            return
        self._apply(offset, value, data)
        pending = self.pending
        pending.append(w)
        if len(pending) >= MAX_SHAPE:        # more than one row could describe: the oldest is raw
            self._raw(pending[:1])
            del pending[0]

    def _apply(self, offset: int, value: int | None, data: bytes | None) -> None:
        raw = (value & 0xFFFFFFFF).to_bytes(4, "little") if value is not None else bytes(data or b"")
        lo, hi = max(offset, _ENGINE), min(offset + len(raw), _ENGINE_END)
        if lo < hi:
            self.regs[lo - _ENGINE:hi - _ENGINE] = raw[lo - offset:hi - offset]
            self.known[lo - _ENGINE:hi - _ENGINE] = b"\x01" * (hi - lo)

    def _dword(self, at: int) -> int | None:
        if self.known[at:at + 4] != b"\x01\x01\x01\x01":
            return None
        return int.from_bytes(self.regs[at:at + 4], "little")

    def _start(self, w: tuple) -> None:
        """A write that reaches ROM_SW_CNTL: the transaction it starts, and the writes before it."""
        offset, value, data, clock, seq = w
        if value is not None and offset == ROM_SW_CNTL:
            letter = "N"
        elif value is None and offset == ROM_SW_CNTL and len(data or b"") == 4:
            letter = "n"
        else:
            letter = ""          # a block that reaches CNTL and more: recorded raw, the transaction too
        command = self._dword(_COMMAND_AT)
        if letter:
            self._apply(offset, value, data)
        else:
            self._apply(offset, None, bytes(data or b"")[:_CNTL_END - offset])
        cntl = self._dword(0) or 0
        tx = None
        if not cntl & ROM_SW_RETURN_DATA_ENABLE and cntl & 0xFFFF:
            span = (min(cntl & 0xFFFF, _WINDOW) + 3) & ~3
            if self.known[_DATA_AT:_DATA_AT + span].count(0) == 0:
                tx = bytes(self.regs[_DATA_AT:_DATA_AT + span])
        described, data_written, reserved, shape = self._shape(command) if letter else (0, None, None, "")
        pending = self.pending
        raw, kept = pending[:len(pending) - described], pending[len(pending) - described:]
        self.pending = []
        if not letter:
            raw = raw + kept + [w]
            kept = []
            self._apply(offset, None, data)         # the rest of the block lands after the start
        shape += letter
        start = micros(clock)
        first = kept[0] if kept else w
        lead = start - micros(first[3])
        self._raw(raw)
        if cntl & ROM_SW_RETURN_DATA_ENABLE:       # the capture lands in the window when it ends
            self.known[_DATA_AT:] = bytes(_WINDOW)
        if self.started is not None:
            self.started(command, cntl, clock)
        held = self.held
        if not raw and held is not None and held[10] is None and held[4] is None and held[5] is None \
                and held[6] is None and tx is None and data_written is None and reserved is None \
                and held[2] == command and held[3] == cntl and len(held[7]) + len(shape) <= MAX_SHAPE:
            held[7] += shape                       # the same transaction again at once: one row
            held[10] = start - held[8]
            return
        self.release()
        self.held = ["spi", self.run_id, command, cntl, tx, data_written, reserved, shape, start, lead or None, None]
        self.held_seq = first[4]

    def _shape(self, command: int | None) -> tuple[int, bytes | None, int | None, str]:
        """How many of the pending writes (the last ones) shape letters describe, with the
        row's data and reserved dword they need: (count, data, reserved, letters)."""
        word = command.to_bytes(4, "little") if command is not None else None
        data: bytes | None = None
        reserved: int | None = None
        letters: list[str] = []
        for offset, value, block, _, _ in reversed(self.pending):
            letter = None
            if value is not None:
                if offset == ROM_SW_STATUS and value == 0:
                    letter = "S"
                elif offset == ROM_SW_COMMAND and value == command:
                    letter = "C"
            elif block is not None:
                if offset == ROM_SW_STATUS and block == _ZERO:
                    letter = "s"
                elif offset == ROM_SW_STATUS and word is not None and len(block) == 8 and block[4:] == word \
                        and block[:4] == _ZERO:
                    letter = "H"
                elif offset == ROM_SW_STATUS and word is not None and len(block) >= 12 and block[:4] == _ZERO \
                        and block[4:8] == word and (data is None or block[12:] == data) \
                        and (reserved is None or int.from_bytes(block[8:12], "little") == reserved):
                    letter, data, reserved = "B", bytes(block[12:]), int.from_bytes(block[8:12], "little")
                elif offset == ROM_SW_COMMAND and word is not None and block == word:
                    letter = "c"
                elif offset == ROM_SW_DATA and (data is None or block == data):
                    letter, data = "D", bytes(block)
            if letter is None:
                break
            letters.append(letter)
        return len(letters), data, reserved, "".join(reversed(letters))

    def _raw(self, writes: list) -> None:
        if not writes:
            return
        self.release()
        for offset, value, data, clock, seq in writes:
            self.emit(("write", self.run_id, offset, value, None if data is None else bytes(data), micros(clock)), seq)

    def release(self) -> None:
        """Hand on the held transaction row: something else comes after it."""
        held = self.held
        if held is not None:
            if held[7] == DEFAULT_SHAPE:
                held[7] = None
            self.emit(tuple(held), self.held_seq)
            self.held = None

    def finish(self) -> None:
        """The end of the writes: writes after the last transaction are recorded one by one."""
        self._raw(self.pending)
        self.pending = []
        self.release()


class Recorder:
    """Records of one run, buffered in order and handed to the writer in batches (register
    writes become rows through an Assembler)."""

    def __init__(self, writer: AuditWriter | NullWriter, run_id: str, batch_rows: int = 512,
                 batch_writes: int = 512):
        self.writer = writer
        self.run_id = run_id
        self.batch_rows = batch_rows
        self.batch_writes = batch_writes
        self._handed = 0                        # register writes handed to the writer so far
        self._buffer: list[tuple] = []
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self.register_writes = 0
        self._assembler = Assembler(run_id, lambda row, seq: self._buffer.append(row), self._started)
        self._write = self._assembler.write
        # Told of every ROM_SW transaction as it starts: (opcode, address, address_bytes,
        # tx_len, rx_len, clock); the opcode is None when COMMAND is not known to the trail.
        self.on_transaction: Any = None
        self._intents: set[int] = set()         # units with a recorded intent, not yet durable
        self._authorised: set[int] = set()      # units whose intent is durable

    @property
    def failed(self) -> str | None:
        return self.writer.failed

    def add(self, table: str, **row: Any) -> None:
        spec = LOGICAL[table]
        record = (table, self.run_id, *(row.get(c) for c in spec.names if c != "run_id"))
        boundary = False
        with self._lock:
            self._assembler.release()     # a transaction repeats "at once" only if nothing came between
            self._buffer.append(record)
            if table == "register_snapshots" and row.get("registers"):
                for offset, value in json.loads(row["registers"]).items():
                    self._assembler.know(int(offset, 16), int(value))
            if table == "units":
                state = row.get("state")
                if state == "intent":
                    start, size = int(row["address"]), int(row.get("size") or UNIT)
                    self._intents.update(range(start - start % UNIT, start + size, UNIT))
                boundary = state in ("verified", "failed")
            full = len(self._buffer) >= self.batch_rows
        if boundary:
            # A unit is done: hand its rows over and have them committed now.
            self.flush()
            try:
                self.writer.commit_soon()
            except AuditFailure:
                pass
        elif full:
            self.flush()

    def register_write(self, offset: int, value: int | None, data: bytes | None, clock: float) -> None:
        with self._lock:
            self.register_writes += 1
            self._write(offset, value, data, clock)
            # Bound what a host that dies now takes with it: at most `batch_writes` register
            # writes (and `batch_rows` rows) not yet handed to the writer.
            if self.register_writes - self._handed < self.batch_writes and len(self._buffer) < self.batch_rows:
                return
        self.flush()

    def _started(self, command: int | None, cntl: int, clock: float) -> None:
        tap = self.on_transaction
        if tap is not None:
            size, rx = cntl & 0xFFFF, bool(cntl & ROM_SW_RETURN_DATA_ENABLE)
            sent = (cntl >> 16) & 3          # address bytes sent after the opcode (as the view decodes them)
            opcode = address = None
            if command is not None:
                opcode = command & 0xFF
                address = (command >> (8 + 8 * (3 - sent))) & (0xFFFFFF >> (8 * (3 - sent)))
            tap(opcode, address, (cntl >> 16) & 7, 0 if rx else size, size if rx else 0, clock)

    def covers(self, start: int, size: int) -> bool:
        """Whether a durable unit intent covers every unit of [start, start + size)."""
        with self._lock:
            return all(a in self._authorised for a in range(start - start % UNIT, start + max(size, 1), UNIT))

    def flush(self) -> None:
        # Taking the batch and handing it over happen under one lock, so batches reach the
        # writer (and the chain) in the order their rows were recorded.
        with self._flush_lock:
            with self._lock:
                self._assembler.release()
                batch, self._buffer = self._buffer, []
                self._handed = self.register_writes
            if batch and not self.writer.failed:
                # Once the trail is down, rows have nowhere to go; the failure itself is what
                # counts (it stops every further hardware write), so recording never raises here.
                try:
                    self.writer.submit(batch)
                except AuditFailure:
                    pass

    def durable(self) -> None:
        """Return once every row recorded so far is committed and fsynced (write-ahead barrier);
        the unit intents among them then cover destructive commands (see `covers`)."""
        with self._lock:
            intents = set(self._intents)
        self.flush()
        self.writer.barrier()
        with self._lock:
            self._authorised |= intents
            self._intents -= intents


class NullWriter:
    """A writer that keeps nothing: the baseline for measuring what the audit costs."""

    failed: str | None = None
    rows_written = 0

    def open(self) -> NullWriter:
        return self

    def close(self) -> None:
        pass

    def submit(self, rows: list[tuple]) -> None:
        self.rows_written += len(rows)

    def commit_soon(self) -> None:
        pass

    def barrier(self, timeout: float = 0.0) -> None:
        pass
