"""The per-run API the stages record through: a Recorder buffers one run's rows in order and
hands them to the writer process in batches; `durable()` is the write-ahead barrier before
anything destructive. NullWriter keeps nothing (the baseline a benchmark measures against)."""
from __future__ import annotations

import json
import threading
from typing import Any

from amdflash.store.schema import LOGICAL, ROM_SW_RETURN_DATA_ENABLE
from amdflash.store.writer.assembler import Assembler
from amdflash.stages.drivers.flash.geometry import UNIT
from amdflash.store.writer.process import AuditFailure, AuditWriter


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
