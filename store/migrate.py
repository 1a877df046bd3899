"""Upgrading an audit database of schema version 1 (one hash per row, one row per register
write) to version 2, in place, on open.

Version 1 chained every row with `hash = sha256(prev_hash || canonical row)`; that chain is
verified first, and a database whose chain is broken is not touched (it is evidence as it
is). Then, in one transaction, every row is moved to the compact tables under the seq it
already had — register writes regrouped into ROM_SW transaction rows exactly as they would
be recorded today, TX data and backed-up units into content-addressed blobs, `boards.detail`
from Python text to JSON, clocks to microseconds — and every run is sealed with a signed
checkpoint of kind "migrated". A last checkpoint (kind "migration") records the version-1
chain head the rows came from. Then the file is vacuumed: the old tables' pages are freed.
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
from amdflash.store import writer
from amdflash.store.writer import Assembler, ChainWriter, Signer, default_anchor, now_iso, sign_and_insert

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


def _v1_rows(conn: sqlite3.Connection) -> Iterator[tuple[int, str, tuple]]:
    def table(name: str) -> Iterator[tuple[int, str, tuple]]:
        for row in conn.execute(f"SELECT seq, {', '.join(V1_TABLES[name])}, hash FROM v1_{name} ORDER BY seq"):
            yield row[0], name, row
    return heapq.merge(*(table(t) for t in V1_TABLES), key=lambda x: x[0])


def verify_v1(conn: sqlite3.Connection) -> tuple[int, str]:
    """(head seq, head hash) of an intact version-1 chain; MigrationRefused naming the first bad row."""
    prev, expected = V1_GENESIS, 1
    for seq, table, row in _v1_rows(conn):
        if seq != expected:
            raise MigrationRefused(f"its version-1 chain is broken: {table} seq {seq}, expected {expected}")
        canonical = b"|".join([table.encode(), b"%d" % seq, *map(_v1_field, row[1:-1])])
        digest = hashlib.sha256(prev.encode() + canonical).hexdigest()
        if digest != row[-1]:
            raise MigrationRefused(f"its version-1 chain is broken: {table} seq {seq} does not match its hash")
        prev, expected = digest, expected + 1
    head = conn.execute("SELECT seq, hash FROM v1_chain_head WHERE id = 1").fetchone()
    if head is not None and (head[0], head[1]) != (expected - 1, prev):
        raise MigrationRefused("its version-1 chain head does not match the last row (rows removed from the end)")
    return expected - 1, prev


def _detail_json(text: str | None) -> tuple[str | None, int]:
    """Version 1 kept `boards.detail` as Python text (repr of a dict): JSON now, and `emulated`."""
    if text is None:
        return None, 0
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return json.dumps({"text": text}), 0
    return json.dumps(value, sort_keys=True, default=str), int(bool(isinstance(value, dict) and value.get("emulated")))


def migrate(conn: sqlite3.Connection, path: str, signer: Signer) -> None:
    """Migrate the database behind `conn` from version 1 to version 2 (see the module doc)."""
    print(f"amdflash: upgrading audit database {path} to schema version {schema.SCHEMA_VERSION} "
          "(once; this can take a while on a large trail)", file=sys.stderr)
    conn.execute("BEGIN IMMEDIATE")
    try:
        if schema.version(conn) != 1:      # another process migrated it meanwhile
            conn.execute("ROLLBACK")
            return
        for (trigger,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
            conn.execute(f"DROP TRIGGER {trigger}")
        for table in (*V1_TABLES, "meta", "chain_head"):
            conn.execute(f"ALTER TABLE {table} RENAME TO v1_{table}")
        head_seq, head_hash = verify_v1(conn)
        schema.create(conn)
        writer = ChainWriter(conn, signer, None)
        writer.kind = "migrated"
        _copy(conn, writer)
        writer._flush_inserts()
        writer._seal()
        ident, prev = conn.execute("SELECT checkpoint, hash FROM chain_head WHERE id = 1").fetchone()
        from amdflash.store.chain import GENESIS, Checkpoint

        cp = Checkpoint(ident + 1, "migration", None, None, head_seq, None, signer.public, now_iso(),
                        json.dumps({"from_schema": 1, "v1_head_seq": head_seq, "v1_head_hash": head_hash}))
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


def prepare(path: str, key_path: Path) -> None:
    """Create the schema, or migrate an older one (signing with the host key at `key_path`),
    or refuse a database that is not ours; proves it writable (else StoreUnavailable)."""
    writer.prepare(path, upgrade=lambda conn: migrate(conn, path, Signer.load(key_path)))
