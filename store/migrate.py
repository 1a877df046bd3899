"""Upgrading an audit database of schema version 1 (one hash per row, one row per register
write, no signatures) to version 2, in place — only by its owner's explicit `amdflash audit
upgrade`, never as a side effect of opening it: a version-1 file needs no key to forge (edit
a row, recompute the chain), so signing it on open would vouch for whatever it says.

Version 1 chained every row with `hash = sha256(prev_hash || canonical row)`; that chain is
verified first, and a database whose chain is broken is not touched (it is evidence as it
is). Then, in one transaction, every row is moved to the compact tables under the seq it
already had — register writes regrouped into ROM_SW transaction rows exactly as they would
be recorded today, TX data and backed-up units into content-addressed blobs, `boards.detail`
from Python text to JSON, clocks to microseconds — and every run is sealed with an UNSIGNED
checkpoint of kind "migrated" (store.chain.LEGACY): its rows stay "recorded by an older
amdflash, unsigned" in every view. The first signed checkpoint (kind "migration") comes
after them and says where the legacy part ends: the version-1 chain head (seq, hash) the
rows came from, the legacy seq range and row count. Then the file is vacuumed.
"""
from __future__ import annotations

import ast
import hashlib
import heapq
import json
import sqlite3
import struct
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from amdflash.store import schema
from amdflash.store.chain import GENESIS, LEGACY, Checkpoint
from amdflash.store.verify import reader_uri
from amdflash.store.writer.assembler import Assembler
from amdflash.store.writer import database
from amdflash.store.writer.database import default_anchor
from amdflash.store.writer.sealer import ChainWriter, Signer, now_iso, sign_and_insert

V1_TABLES: dict[str, tuple[str, ...]] = {
    "runs": ("run_id", "command", "arguments", "operator", "host", "tool_version", "image_path", "image_sha256",
             "board_spec", "resumes_run_id", "at"),
    "run_status": ("run_id", "status", "detail", "result_sha256", "summary", "at"),
    "boards": ("run_id", "spec", "kind", "bridge_serial", "pci_address", "vendor_id", "device_id", "jedec", "chip",
               "unique_id", "sr1", "sr2", "sr3", "protection", "sfdp", "detail", "at"),
    "stages": ("run_id", "stage", "event", "detail", "at"),
    "register_writes": ("run_id", "n", "offset", "value", "data", "clock"),
    "spi_transactions": ("run_id", "n", "opcode", "address", "address_bytes", "tx_len", "rx_len", "clock"),
    "register_snapshots": ("run_id", "label", "registers", "clock"),
    "backup_units": ("run_id", "address", "size", "sha256", "data"),
    "backups": ("run_id", "sha256", "size", "path", "at"),
    "units": ("run_id", "address", "size", "state", "action", "wanted_sha256", "detail", "clock"),
    "verifies": ("run_id", "address", "size", "ok", "attempt", "expected_sha256", "actual_sha256",
                 "mismatch_address", "flash_byte", "image_byte", "clock"),
    "errors": ("run_id", "stage", "message", "address", "at"),
}
V1_GENESIS = "0" * 64
_DOUBLE = struct.Struct(">d")
# The most one version-1 value may hold, in bytes (text as UTF-8). The largest value version 1
# recorded is a backed-up 4 KiB unit; its texts (arguments, register snapshots, details) are a
# few hundred bytes. Neither schema has a limit of its own, but every legacy value is hashed,
# copied and (boards.detail) parsed whole: a value no amdflash wrote, put there by whoever
# could write the unsigned file, is refused by name rather than loaded (a 100 kB detail ran
# Python's parser out of memory).
LEGACY_VALUE_LIMIT = 64 * 1024


LEGACY_NOTE = ("rows up to v1_head_seq were recorded by an older amdflash, unsigned; their version-1 chain "
               "verified at this upgrade, and nothing signs them")


class MigrationRefused(schema.SchemaError):
    pass


def _v1_field(value: Any) -> bytes:
    if value is None:
        return b"n"
    if type(value) is int:
        return b"i%d" % value
    if type(value) is float:
        return b"f" + _DOUBLE.pack(value).hex().encode()
    if type(value) is str:
        text = value.encode()
        return b"s%d:%s" % (len(text), text)
    return b"b" + bytes(value).hex().encode()


def _v1_rows(conn: sqlite3.Connection, prefix: str) -> Iterator[tuple[int, str, tuple]]:
    def table(name: str) -> Iterator[tuple[int, str, tuple]]:
        for row in conn.execute(f"SELECT seq, {', '.join(V1_TABLES[name])}, hash FROM {prefix}{name} ORDER BY seq"):
            yield row[0], name, row
    return heapq.merge(*(table(t) for t in V1_TABLES), key=lambda x: x[0])


def oversized(conn: sqlite3.Connection, path: str, prefix: str = "v1_") -> None:
    """MigrationRefused naming the first value (by seq) over LEGACY_VALUE_LIMIT bytes: its
    table, seq, column and size. Measured by SQLite, one value at a time; none is handed to
    Python whole. `prefix` as verify_v1's."""
    found: tuple[int, str, str, int] | None = None
    for table, columns in V1_TABLES.items():
        names = (*columns, "hash")
        sizes = ", ".join(f'coalesce(length(CAST("{c}" AS BLOB)), 0) AS "{c}"' for c in names)
        over = " OR ".join(f'"{c}" > {LEGACY_VALUE_LIMIT}' for c in names)
        row = conn.execute(f"SELECT * FROM (SELECT seq, {sizes} FROM {prefix}{table}) "
                           f"WHERE {over} ORDER BY seq LIMIT 1").fetchone()
        if row is not None and (found is None or row[0] < found[0]):
            column, size = next((c, n) for c, n in zip(names, row[1:], strict=True) if n > LEGACY_VALUE_LIMIT)
            found = (row[0], table, column, size)
    if found is not None:
        seq, table, column, size = found
        raise MigrationRefused(f"cannot upgrade {path}: {table} seq {seq}, column {column}, holds {size} bytes, "
                               f"more than the {LEGACY_VALUE_LIMIT} one value may hold; nothing was changed")


def verify_v1(conn: sqlite3.Connection, prefix: str = "v1_") -> tuple[int, str]:
    """(head seq, head hash) of an intact version-1 chain; MigrationRefused naming the first bad row.
    `prefix`: of the version-1 tables' names (renamed "v1_..." during the upgrade; "" when a
    version-1 file is read as it is, read-only)."""
    prev, expected = V1_GENESIS, 1
    for seq, table, row in _v1_rows(conn, prefix):
        if seq != expected:
            raise MigrationRefused(f"its version-1 chain is broken: {table} seq {seq}, expected {expected}")
        canonical = b"|".join([table.encode(), b"%d" % seq, *map(_v1_field, row[1:-1])])
        digest = hashlib.sha256(prev.encode() + canonical).hexdigest()
        if digest != row[-1]:
            raise MigrationRefused(f"its version-1 chain is broken: {table} seq {seq} does not match its hash")
        prev, expected = digest, expected + 1
    head = conn.execute(f"SELECT seq, hash FROM {prefix}chain_head WHERE id = 1").fetchone()
    if head is not None and (head[0], head[1]) != (expected - 1, prev):
        raise MigrationRefused("its version-1 chain head does not match the last row (rows removed from the end)")
    return expected - 1, prev


def _detail_json(text: str | None) -> tuple[str | None, int]:
    """Version 1 kept `boards.detail` as Python text (repr of a dict): JSON now, and `emulated`."""
    if text is None:
        return None, 0
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, RecursionError, MemoryError):
        # Nested past what the parser takes (a few thousand unary signs): no detail amdflash
        # wrote, and kept as text like any other. Within LEGACY_VALUE_LIMIT the MemoryError is
        # the parser's own stack, not the machine's.
        return json.dumps({"text": text}), 0
    return json.dumps(value, sort_keys=True, default=str), int(bool(isinstance(value, dict) and value.get("emulated")))


def migrate(conn: sqlite3.Connection, path: str, signer: Signer) -> Checkpoint | None:
    """Migrate the database behind `conn` from version 1 to version 2 (see the module doc);
    the signed "migration" checkpoint it ends with (None: another process migrated it)."""
    print(f"amdflash: upgrading audit database {path} to schema version {schema.SCHEMA_VERSION} "
          "(once; this can take a while on a large trail)", file=sys.stderr)
    conn.execute("BEGIN IMMEDIATE")
    try:
        if schema.version(conn) != 1:      # another process migrated it meanwhile
            conn.execute("ROLLBACK")
            return None
        for (trigger,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
            conn.execute(f"DROP TRIGGER {trigger}")
        for table in (*V1_TABLES, "meta", "chain_head"):
            conn.execute(f"ALTER TABLE {table} RENAME TO v1_{table}")
        oversized(conn, path)         # again, under the lock: changed since upgrade() looked?
        head_seq, head_hash = verify_v1(conn)
        schema.create(conn)
        writer = ChainWriter(conn, signer, None)
        writer.kind = LEGACY         # sealed, chained, never signed
        _copy(conn, writer)
        writer._flush_inserts()
        writer._seal()
        ident, prev = conn.execute("SELECT checkpoint, hash FROM chain_head WHERE id = 1").fetchone()
        legacy_rows = sum(run.rows for run in writer.runs.values())
        # The first signed checkpoint: it vouches only for what follows it, and says where
        # the unsigned, legacy part ends (checked by store.verify.legacy_part).
        cp = Checkpoint(ident + 1, "migration", None, None, head_seq, None, signer.public, now_iso(),
                        json.dumps({"from_schema": 1, "v1_head_seq": head_seq, "v1_head_hash": head_hash,
                                    "legacy_seq": [1, head_seq], "legacy_rows": legacy_rows,
                                    "legacy_checkpoints": ident, "legacy": LEGACY_NOTE}))
        sign_and_insert(conn, signer, cp, prev or GENESIS)
        conn.execute("UPDATE chain_head SET seq = ?, checkpoint = ?, hash = ? WHERE id = 1",
                     (max(head_seq, writer.seq), cp.id, cp.hash))
        for table in (*V1_TABLES, "meta", "chain_head"):
            conn.execute(f"DROP TABLE v1_{table}")
        conn.execute("COMMIT")
        ChainWriter(conn, signer, default_anchor(path))._write_anchor(cp)
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("VACUUM")
    return cp


def _copy(conn: sqlite3.Connection, writer: ChainWriter) -> None:
    """Every version-1 row into the version-2 tables, under its own seq, table by table."""
    order = ["runs", *(t for t in V1_TABLES if t not in ("runs", "register_writes", "spi_transactions"))]
    for table in order:
        columns = V1_TABLES[table]
        logical = schema.LOGICAL[table]
        for row in conn.execute(f"SELECT seq, {', '.join(columns)} FROM v1_{table} ORDER BY seq").fetchall():
            values = dict(zip(columns, row[1:], strict=True))
            if table == "boards":
                values["detail"], values["emulated"] = _detail_json(values["detail"])
            if table == "backup_units":
                values["data"] = bytes(values["data"]) if values["data"] is not None else None
            record = (table, values["run_id"], *(values.get(c) for c in logical.names if c != "run_id"))
            writer.add(record, seq=row[0])
    # Register writes become transaction rows exactly as the recorder makes them today; the
    # version-1 spi_transactions rows said the same again and are not kept.
    assemblers: dict[str, Assembler] = {}

    def emit(row: tuple, seq: int | None) -> None:
        writer.add(row, seq=seq)

    for seq, run_id, offset, value, data, clock in conn.execute(
            "SELECT seq, run_id, offset, value, data, clock FROM v1_register_writes ORDER BY seq"):
        assembler = assemblers.get(run_id)
        if assembler is None:
            assembler = assemblers[run_id] = Assembler(run_id, emit)
        assembler.write(offset, value, None if data is None else bytes(data), clock, seq)
    for assembler in assemblers.values():
        assembler.finish()


def prepare(path: str, key_path: Path | None = None) -> None:
    """Create the schema, or refuse a database that is not ours or is of an older schema
    (store.writer.database.prepare: nothing upgrades as a side effect; `key_path` is not used)."""
    database.prepare(path)


def upgrade(path: str, key_path: Path) -> Checkpoint | None:
    """`audit upgrade`: migrate the version-1 database at `path` (its owner's, checked by the
    caller), signing the migration checkpoint with the host key at `key_path`. A value over
    LEGACY_VALUE_LIMIT is refused first, read-only: before the file is opened for writing
    (which would change its journal mode) or the key is made."""
    conn = sqlite3.connect(reader_uri(path), uri=True, timeout=30.0, isolation_level=None)
    try:
        if schema.version(conn) == 1:
            oversized(conn, path, "")
    finally:
        conn.close()
    done: Checkpoint | None = None

    def run(conn: sqlite3.Connection) -> None:
        nonlocal done
        done = migrate(conn, path, Signer.load(key_path))

    database.prepare(path, upgrade=run)
    return done


def read_legacy(path: str) -> tuple[int, str, int]:
    """A version-1 file read as it is, read-only: (head seq, head hash, runs) of its intact
    chain (MigrationRefused naming the first bad row). Nothing in it is signed."""
    conn = sqlite3.connect(reader_uri(path), uri=True, timeout=30.0, isolation_level=None)
    try:
        conn.execute("BEGIN")
        head_seq, head_hash = verify_v1(conn, "")
        runs = conn.execute("SELECT count(DISTINCT run_id) FROM runs").fetchone()[0]
        conn.execute("COMMIT")
        return head_seq, head_hash, runs
    finally:
        conn.close()
