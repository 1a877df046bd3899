"""The single audit writer and the per-run recorders that feed it.

One writer owns the SQLite connection. It runs in its own thread so that commits (each
one an fsync, see schema.connect) overlap device I/O and never stall the event loop.
Producers hand it batches through a small bounded queue: when it falls behind they
block — backpressure — and nothing is ever dropped. Rows are chained (store.chain) in
the order they reach the writer, inside the same transaction that inserts them, with the
chain head read under the write lock so that several processes share one chain.

`Recorder.durable()` is the write-ahead barrier: it returns only when everything recorded
before it is committed. The erase stage calls it between recording a unit's intent and
erasing the unit.
"""
from __future__ import annotations

import queue
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from store import chain
from store.schema import AUDIT_TABLES, SchemaError, connect, ensure

Row = tuple[str, "dict[str, Any] | tuple[Any, ...]"]

_STOP = object()


class AuditFailure(RuntimeError):
    """The audit trail could not be written: no further hardware write may be issued."""


class StoreUnavailable(RuntimeError):
    """The database cannot be opened or written: refuse before touching a board."""


@dataclass
class _Barrier:
    done: threading.Event = field(default_factory=threading.Event)


_INSERTS = {
    table: (f"INSERT INTO {table} (seq, {', '.join(cols)}, hash) VALUES (?, {', '.join('?' * len(cols))}, ?)",
            tuple(cols))
    for table, cols in AUDIT_TABLES.items()
}


class AuditWriter:
    def __init__(self, path: str, group_rows: int = 4000, group_seconds: float = 0.25, queue_batches: int = 8):
        self.path = path
        self.group_rows = group_rows
        self.group_seconds = group_seconds
        self._queue: queue.Queue = queue.Queue(maxsize=queue_batches)
        self.failed: str | None = None
        self.rows_written = 0
        self._conn: sqlite3.Connection | None = None
        self._thread: threading.Thread | None = None

    # -- lifetime -------------------------------------------------------------------------
    def open(self) -> "AuditWriter":
        """Open, create the schema, and prove the database writable; else StoreUnavailable."""
        try:
            conn = connect(self.path)
            ensure(conn)
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
        except (sqlite3.Error, OSError, SchemaError) as e:
            raise StoreUnavailable(f"audit database {self.path} is not writable: {e}") from None
        self._conn = conn
        self._thread = threading.Thread(target=self._run, name="audit-writer", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread is None:
            return
        self._queue.put(_STOP)
        self._thread.join()
        self._thread = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # -- producers ------------------------------------------------------------------------
    def submit(self, rows: list[Row]) -> None:
        self._check()
        self._queue.put(rows)  # blocks while the writer is behind: backpressure

    def barrier(self, timeout: float = 120.0) -> None:
        self._check()
        b = _Barrier()
        self._queue.put(b)
        if not b.done.wait(timeout):
            raise AuditFailure(f"audit writer did not commit within {timeout:g} s")
        self._check()

    def _check(self) -> None:
        if self.failed:
            raise AuditFailure(f"audit trail write failed: {self.failed}")

    # -- the writer thread ----------------------------------------------------------------
    def _run(self) -> None:
        pending: list[Row] = []
        waiting: list[_Barrier] = []
        oldest = 0.0  # when the oldest uncommitted row arrived
        while True:
            try:
                item = self._queue.get(timeout=self.group_seconds)
            except queue.Empty:
                item = None
            if item is _STOP:
                self._commit(pending, waiting)
                return
            if isinstance(item, _Barrier):
                waiting.append(item)
                self._commit(pending, waiting)
            elif item is not None:
                if not pending:
                    oldest = time.monotonic()
                pending.extend(item)
            if pending and (len(pending) >= self.group_rows or time.monotonic() - oldest >= self.group_seconds):
                self._commit(pending, waiting)

    def _commit(self, pending: list[Row], waiting: list[_Barrier]) -> None:
        if pending and not self.failed:
            try:
                self._insert(pending)
            except Exception as e:  # noqa: BLE001 - any failure stops the job, with its reason
                self.failed = f"{type(e).__name__}: {e}"
        pending.clear()
        for b in waiting:
            b.done.set()
        waiting.clear()

    def _insert(self, rows: list[Row]) -> None:
        conn = self._conn
        assert conn is not None
        conn.execute("BEGIN IMMEDIATE")
        try:
            seq, prev = conn.execute("SELECT seq, hash FROM chain_head WHERE id = 1").fetchone()
            by_table: dict[str, list[tuple]] = {}
            link, normalise = chain.link, chain.normalise
            for table, row in rows:
                seq += 1
                # The bulk tables arrive as ready tuples (see Recorder.register_write).
                values = row if type(row) is tuple else normalise(table, row)
                prev = link(prev, table, seq, values)
                by_table.setdefault(table, []).append((seq, *values, prev))
            for table, values in by_table.items():
                conn.executemany(_INSERTS[table][0], values)
            conn.execute("UPDATE chain_head SET seq = ?, hash = ? WHERE id = 1", (seq, prev))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        self.rows_written += len(rows)


class Recorder:
    """Records of one run, buffered in order and handed to the writer in batches."""

    def __init__(self, writer: "AuditWriter | NullWriter", run_id: str, batch_rows: int = 512):
        self.writer = writer
        self.run_id = run_id
        self.batch_rows = batch_rows
        self._buffer: list[Row] = []
        self._lock = threading.Lock()
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
        with self._lock:
            batch, self._buffer = self._buffer, []
        if batch:
            self.writer.submit(batch)

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
