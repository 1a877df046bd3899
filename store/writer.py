"""The single audit writer and the per-run recorders that feed it.

One writer owns the SQLite connection, and it lives in a process of its own: hashing and
inserting hundreds of thousands of rows would otherwise compete with device I/O for the
interpreter lock, while in a second process it runs truly beside it. Producers hand it
batches through a pipe; when the writer falls behind the pipe fills and producers block
— backpressure — and nothing is ever dropped. Rows are chained (store.chain) in the order
they reach the writer, inside the transaction that inserts them, with the chain head read
under the write lock so that several amdflash processes share one chain. If the host
process dies, the writer still commits every batch it was handed before it exits.

`Recorder.durable()` is the write-ahead barrier: it returns only when everything recorded
before it is committed. The erase stage calls it between recording a unit's intent and
erasing the unit.
"""
from __future__ import annotations

import atexit
import itertools
import multiprocessing
import multiprocessing.connection
import os
import signal
import sqlite3
import threading
import time
import weakref
from typing import Any

from amdflash.store import chain
from amdflash.store.schema import AUDIT_TABLES, SchemaError, connect, ensure

Row = tuple[str, "dict[str, Any] | tuple[Any, ...]"]

_STOP = None


class AuditFailure(RuntimeError):
    """The audit trail could not be written: no further hardware write may be issued."""


class StoreUnavailable(RuntimeError):
    """The database cannot be opened or written: refuse before touching a board."""


_INSERTS = {
    table: f"INSERT INTO {table} (seq, {', '.join(cols)}, hash) VALUES (?, {', '.join('?' * len(cols))}, ?)"
    for table, cols in AUDIT_TABLES.items()
}


def _start_method() -> str:
    # fork is cheapest and safe while this process runs a single thread (the CLI opens the
    # writer before anything else starts); otherwise forkserver avoids forking live threads.
    return "fork" if threading.active_count() == 1 else "forkserver"


# Writers started and not yet closed. The writer process ignores SIGINT and SIGTERM (it must
# outlive the host's Ctrl-C to write what it was handed), so if the host leaves without closing
# one (a Ctrl-C landing between start and the caller's cleanup), multiprocessing's own exit
# handler would wait for it forever. This handler, registered after multiprocessing's and so
# run before it, tells each one to finish.
_STARTED: "weakref.WeakSet[AuditWriter]" = weakref.WeakSet()


@atexit.register
def _close_started() -> None:
    for writer in list(_STARTED):
        writer.close()


class AuditWriter:
    def __init__(self, path: str, group_rows: int = 4000, group_seconds: float = 0.25,
                 max_pages: int | None = None):
        self.path = path
        self.group_rows = group_rows
        self.group_seconds = group_seconds
        self.max_pages = max_pages      # cap the database size (SQLite max_page_count)
        self.failed: str | None = None
        self._process: multiprocessing.process.BaseProcess | None = None
        self._send: multiprocessing.connection.Connection | None = None
        self._send_lock = threading.Lock()
        self._barriers: dict[int, threading.Event] = {}
        self._ids = itertools.count(1)
        self._reader: threading.Thread | None = None

    # -- lifetime -------------------------------------------------------------------------
    def open(self) -> "AuditWriter":
        """Create the schema and prove the database writable (else StoreUnavailable), then
        start the writer process."""
        try:
            conn = connect(self.path)
            try:
                ensure(conn)
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("ROLLBACK")
            finally:
                conn.close()
        except (sqlite3.Error, OSError, SchemaError) as e:
            raise StoreUnavailable(f"audit database {self.path} is not writable: {e}") from None
        method = _start_method()
        ctx = multiprocessing.get_context(method)
        rows_rx, self._send = ctx.Pipe(duplex=False)
        status_rx, status_tx = ctx.Pipe(duplex=False)
        # A forked child inherits this side's pipe ends too; it must close them, or it would
        # never see end-of-file when this process dies.
        inherited = (self._send.fileno(), status_rx.fileno()) if method == "fork" else ()
        self._process = ctx.Process(
            target=_writer_main, name="amdflash-audit-writer", daemon=True,
            args=(self.path, rows_rx, status_tx, self.group_rows, self.group_seconds, self.max_pages,
                  os.getpid(), inherited))
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
            with self._send_lock:
                assert self._send is not None
                self._send.send(_STOP)
        except OSError:
            pass   # the writer is already gone; its status reader has said why
        self._process.join()
        if self._reader is not None:    # None: interrupted before it was started
            self._reader.join()
        self._send.close()
        self._process = None

    # -- producers ------------------------------------------------------------------------
    def submit(self, rows: list[Row]) -> None:
        self._check()
        self._post(rows)   # blocks while the pipe is full: backpressure

    def barrier(self, timeout: float = 120.0) -> None:
        self._check()
        ident = next(self._ids)
        done = self._barriers[ident] = threading.Event()
        self._post(("barrier", ident))
        if not done.wait(timeout):
            raise AuditFailure(f"audit writer did not commit within {timeout:g} s")
        self._barriers.pop(ident, None)
        self._check()

    def _post(self, message: object) -> None:
        assert self._send is not None, "AuditWriter used before open()"
        try:
            with self._send_lock:
                self._send.send(message)
        except OSError as e:
            self._fail(f"audit writer process is gone ({e})")
            self._check()

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
            elif kind == "closed":
                closed = True
                break
        status.close()


def _writer_main(path: str, rows: multiprocessing.connection.Connection,
                 status: multiprocessing.connection.Connection, group_rows: int, group_seconds: float,
                 max_pages: int | None, host_pid: int, inherited: tuple[int, ...]) -> None:
    """The writer process: chain and insert rows as they arrive, commit in groups, answer
    barriers.

    Rows are hashed and inserted as soon as they arrive, inside a transaction that stays
    open until the group is full or old enough; a barrier then costs one COMMIT, not the
    work on a whole backlog.
    """
    # Ctrl-C and SIGTERM are for the host process, which stops at a safe point and then
    # tells the writer to finish; the writer must not die with half its queue unwritten.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for fd in inherited:
        os.close(fd)
    chain_writer = _ChainWriter(connect(path), max_pages)
    waiting: list[int] = []
    failed: str | None = None

    def settle() -> None:
        """Commit what is open and release the barriers waiting for it."""
        nonlocal failed
        if not failed:
            try:
                chain_writer.commit()
            except Exception as e:  # noqa: BLE001 - any failure stops the job, with its reason
                failed = f"{type(e).__name__}: {e}"
                _tell(status, ("failed", failed))
        for ident in waiting:
            _tell(status, ("done", ident))
        waiting.clear()

    while True:
        message: object = ()
        if rows.poll(group_seconds if chain_writer.open_rows else 1.0):
            try:
                message = rows.recv()
            except EOFError:
                message = _STOP   # the host died: keep what it handed over
        elif not _alive(host_pid):
            message = _STOP       # belt and braces: the host is gone even if the pipe is not
        if message is _STOP:
            settle()
            _tell(status, ("closed", None))
            chain_writer.close()
            return
        if isinstance(message, tuple) and message and message[0] == "barrier":
            waiting.append(message[1])
            settle()
        elif isinstance(message, list) and not failed:
            try:
                chain_writer.add(message)
            except Exception as e:  # noqa: BLE001
                failed = f"{type(e).__name__}: {e}"
                _tell(status, ("failed", failed))
                chain_writer.abandon()
        if chain_writer.open_rows and (chain_writer.open_rows >= group_rows
                                        or time.monotonic() - chain_writer.opened >= group_seconds):
            settle()


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


class _ChainWriter:
    """Appends chained rows to the database inside one open transaction at a time."""

    def __init__(self, conn: sqlite3.Connection, max_pages: int | None):
        self.conn = conn
        if max_pages:
            conn.execute(f"PRAGMA max_page_count = {int(max_pages)}")
        self.open_rows = 0
        self.opened = 0.0
        self.seq = 0
        self.prev = ""

    def add(self, rows: list[Row]) -> None:
        conn = self.conn
        if not self.open_rows:
            conn.execute("BEGIN IMMEDIATE")
            # Read under the write lock: another amdflash process may have extended the chain.
            self.seq, self.prev = conn.execute("SELECT seq, hash FROM chain_head WHERE id = 1").fetchone()
            self.opened = time.monotonic()
        seq, prev = self.seq, self.prev
        by_table: dict[str, list[tuple]] = {}
        link, normalise = chain.link, chain.normalise
        for table, row in rows:
            seq += 1
            # The bulk tables arrive as ready tuples (see Recorder.register_write).
            values = row if type(row) is tuple else normalise(table, row)
            prev = link(prev, table, seq, values)
            by_table.setdefault(table, []).append((seq, *values, prev))
        for table, values in by_table.items():
            conn.executemany(_INSERTS[table], values)
        self.seq, self.prev = seq, prev
        self.open_rows += len(rows)

    def commit(self) -> None:
        if not self.open_rows:
            return
        try:
            self.conn.execute("UPDATE chain_head SET seq = ?, hash = ? WHERE id = 1", (self.seq, self.prev))
            self.conn.execute("COMMIT")
        except BaseException:
            self.abandon()
            raise
        self.open_rows = 0

    def abandon(self) -> None:
        if self.conn.in_transaction:   # SQLite may already have rolled back (e.g. disk full)
            self.conn.execute("ROLLBACK")
        self.open_rows = 0

    def close(self) -> None:
        self.abandon()
        self.conn.close()


class Recorder:
    """Records of one run, buffered in order and handed to the writer in batches."""

    def __init__(self, writer: "AuditWriter | NullWriter", run_id: str, batch_rows: int = 512):
        self.writer = writer
        self.run_id = run_id
        self.batch_rows = batch_rows
        self._buffer: list[Row] = []
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self.register_writes = 0
        self.spi_transactions = 0

    @property
    def failed(self) -> str | None:
        return self.writer.failed

    def add(self, table: str, **row: Any) -> None:
        row["run_id"] = self.run_id
        self._append((table, row))

    # The two bulk records are built as tuples in column order, already of the stored types
    # (schema.AUDIT_TABLES), which spares the writer normalising tens of thousands of rows.
    def register_write(self, offset: int, value: int | None, data: bytes | None, clock: float) -> None:
        self.register_writes += 1
        self._append(("register_writes", (self.run_id, self.register_writes, int(offset),
                                          None if value is None else int(value), data, float(clock))))

    def spi_transaction(self, opcode: int, address: int, address_bytes: int, tx_len: int, rx_len: int,
                        clock: float) -> None:
        self.spi_transactions += 1
        self._append(("spi_transactions", (self.run_id, self.spi_transactions, int(opcode), int(address),
                                           int(address_bytes), int(tx_len), int(rx_len), float(clock))))

    def _append(self, record: Row) -> None:
        with self._lock:
            self._buffer.append(record)
            full = len(self._buffer) >= self.batch_rows
        if full:
            self.flush()

    def flush(self) -> None:
        # Taking the batch and handing it over happen under one lock, so batches reach the
        # writer (and the chain) in the order their rows were recorded.
        with self._flush_lock:
            with self._lock:
                batch, self._buffer = self._buffer, []
            if batch and not self.writer.failed:
                # Once the trail is down, rows have nowhere to go; the failure itself is what
                # counts (it stops every further hardware write), so recording never raises here.
                try:
                    self.writer.submit(batch)
                except AuditFailure:
                    pass

    def durable(self) -> None:
        """Return once every row recorded so far is committed (write-ahead barrier)."""
        self.flush()
        self.writer.barrier()


class NullWriter:
    """A writer that keeps nothing: the baseline for measuring what the audit costs."""

    failed: str | None = None
    rows_written = 0

    def open(self) -> "NullWriter":
        return self

    def close(self) -> None:
        pass

    def submit(self, rows: list[Row]) -> None:
        self.rows_written += len(rows)

    def barrier(self, timeout: float = 0.0) -> None:
        pass
