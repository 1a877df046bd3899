"""The writer process and its handle in the host.

One writer owns the SQLite connection, and it lives in a process of its own: hashing,
signing and inserting tens of thousands of rows would otherwise compete with device I/O
for the interpreter lock. Producers hand it rows through a pipe (store.writer.frames); when
the writer falls behind the pipe fills and producers block — backpressure — and nothing is
ever dropped.

The writer outlives its host: if the host process dies, even in the middle of handing
over a row, the writer commits every complete row it received, drops the torn one, seals
what it committed and exits cleanly.

Rows are inserted as they arrive inside an open transaction, committed at every unit
boundary (boundaries read together share one commit), every `group_rows` rows or
`group_seconds`, and at every barrier. Commits run
with `synchronous=NORMAL` (a committed row survives the death of any process); a barrier
also fsyncs the WAL (it survives a power loss). `Recorder.durable()` is that barrier: a
unit's intent is made durable before anything destructive touches the unit. A commit also
seals the runs written to with signed checkpoints (store.writer.sealer) when it is a barrier,
when a run ended, or when `seal_rows` rows or `seal_seconds` have passed since the last seal.
"""
from __future__ import annotations

import atexit
import itertools
import multiprocessing
import multiprocessing.connection
import os
import sqlite3
import select
import signal
import threading
import time
import weakref
from pathlib import Path

from amdflash.store import keys
from amdflash.store.schema import SchemaError, connect
from amdflash.store.writer.database import STOP_FREE, StoreUnavailable, default_anchor, free_bytes, low_space, prepare
from amdflash.store.writer.frames import FrameReader, frame
from amdflash.store.writer.sealer import ChainWriter, Signer


class AuditFailure(RuntimeError):
    """The audit trail could not be written: no further hardware write may be issued."""


class SpaceLow(AuditFailure):
    """The trail's file system is nearly full: everything handed over so far is committed and
    fsynced, but nothing more may be started (a run's end, once handed over, is on record)."""


# -- the host's handle on the writer ------------------------------------------------------------

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
        # The connection that prepared the database, when its opener keeps it for the command to
        # read the trail through during the run (pipeline.engine.auditdb.run_trail).
        self.kept: sqlite3.Connection | None = None

    # -- lifetime -------------------------------------------------------------------------
    def open(self, prepared: bool = False) -> AuditWriter:
        """Create or migrate the schema, load (or create) the host key, prove the database
        writable (else StoreUnavailable), then start the writer process. `prepared`: the
        caller has just done the first and third (pipeline.engine.auditdb.open_writer)."""
        try:
            Signer.load(self.key_path)
        except (OSError, keys.KeyError_) as e:
            raise StoreUnavailable(f"host key {self.key_path}: {e}") from None
        try:
            if not prepared:
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
        reader = threading.Thread(target=self._read_status, args=(status_rx,), name="audit-status", daemon=True)
        reader.start()
        # Kept once started: a Ctrl-C that lands inside start() (it waits for the thread to run)
        # leaves it None, and close() does not join a thread that may never have started
        # (join() raises then: a traceback from the exit handler, under load).
        self._reader = reader
        return self

    def close(self) -> None:
        if self.kept is not None:       # not taken by the command: closed before the writer's
            self.kept.close()
            self.kept = None
        if self._process is None:
            return
        _STARTED.discard(self)
        try:
            self._write(frame(("!stop",)))
        except OSError:
            pass   # the writer is already gone; its status reader has said why
        self._process.join()
        if self._reader is not None:    # None: interrupted before it was started (a daemon: it ends at EOF)
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
            raise SpaceLow(self.low)

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
