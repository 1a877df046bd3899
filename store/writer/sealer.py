"""The sealer: appends rows to the hash chains of their runs inside one open transaction,
stores their bytes once as content-addressed blobs, and seals the runs written to with signed
checkpoints (store.chain), the newest also appended to the anchor file. The host key that signs
them and this host's row in `hosts` are the Signer's."""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import socket
import sqlite3
import time
from pathlib import Path
from typing import Any

from amdflash.store import chain, keys
from amdflash.store.schema import LOGICAL, PHYSICAL, TERMINAL, SchemaError


END_ALONE = 16      # rows of a run's last span above which its end is sealed on its own


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
        if table == "run_status" and message[2] in TERMINAL and not self.kind:
            self._seal_before_end(run_id)
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

    def _seal_before_end(self, run_id: str) -> None:
        """A run's rows so far get a checkpoint of their own just before its end status row, so
        that its final checkpoint seals its end alone: whoever checks what a run's status is
        worth (`runs`, a board's history) rebuilds a span of a few rows, not the last second
        of a flash's SPI log (about 1,150 rows). One checkpoint more per run, in the same
        transaction as the end."""
        run = self.runs.get(run_id)
        if run is not None and run.segment_rows > END_ALONE:
            self._flush_inserts()
            self._seal(anchored=False)    # the anchor takes the end's checkpoint, at the commit

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

    def _seal(self, anchored: bool = True) -> chain.Checkpoint | None:
        """A signed checkpoint for every run written to since its last one. `anchored`: the
        newest says where it is appended (the commit appends it to the anchor file)."""
        conn = self.conn
        head = conn.execute("SELECT checkpoint, hash FROM chain_head WHERE id = 1").fetchone()
        ident, prev = head[0], head[1] or chain.GENESIS
        newest = None
        last = len(self.dirty) - 1
        detail = self.anchor_detail if anchored else None
        for i, run in enumerate(self.dirty.values()):
            digests = {t: h.digest() for t, h in run.hashers.items()}
            run.head = chain.segment_head(run.head, digests)
            run.rows += run.segment_rows
            run.hashers, run.segment_rows = {}, 0
            ident += 1
            kind = self.kind or ("final" if run.ended else "commit")
            cp = chain.Checkpoint(ident, kind, run.run_id, run.rows, run.last_seq, run.head, self.signer.public,
                                  now_iso(), detail if i == last else None, run=run.key, host=self.host)
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
