"""The audit database schema (versioned), created with sqlite-utils.

Every audit table carries `seq` (one sequence over all audit tables, the order of the
hash chain) and `hash`. Rows are never changed: triggers refuse UPDATE and DELETE, and a
state change is a new row.
"""
from __future__ import annotations

import sqlite3

import sqlite_utils

SCHEMA_VERSION = 1

# table -> columns (besides seq and hash), in the order they are shown.
AUDIT_TABLES: dict[str, dict[str, type]] = {
    "runs": {
        "run_id": str, "command": str, "arguments": str, "operator": str, "host": str,
        "tool_version": str, "image_path": str, "image_sha256": str, "board_spec": str,
        "resumes_run_id": str, "at": str,
    },
    "run_status": {"run_id": str, "status": str, "detail": str, "result_sha256": str, "summary": str, "at": str},
    "boards": {
        "run_id": str, "spec": str, "kind": str, "bridge_serial": str, "pci_address": str,
        "vendor_id": int, "device_id": int, "jedec": str, "chip": str, "unique_id": str,
        "sr1": int, "sr2": int, "sr3": int, "protection": str, "sfdp": str, "detail": str, "at": str,
    },
    "stages": {"run_id": str, "stage": str, "event": str, "detail": str, "at": str},
    "register_writes": {
        "run_id": str, "n": int, "offset": int, "value": int, "data": bytes, "clock": float,
    },
    "spi_transactions": {
        "run_id": str, "n": int, "opcode": int, "address": int, "address_bytes": int,
        "tx_len": int, "rx_len": int, "clock": float,
    },
    "register_snapshots": {"run_id": str, "label": str, "registers": str, "clock": float},
    "backup_units": {"run_id": str, "address": int, "size": int, "sha256": str, "data": bytes},
    "backups": {"run_id": str, "sha256": str, "size": int, "path": str, "at": str},
    "units": {
        "run_id": str, "address": int, "size": int, "state": str, "action": str,
        "wanted_sha256": str, "detail": str, "clock": float,
    },
    "verifies": {
        "run_id": str, "address": int, "size": int, "ok": int, "attempt": int,
        "expected_sha256": str, "actual_sha256": str, "mismatch_address": int,
        "flash_byte": int, "image_byte": int, "clock": float,
    },
    "errors": {"run_id": str, "stage": str, "message": str, "address": int, "at": str},
    "read_disagreements": {
        "run_id": str, "address": int, "size": int, "purpose": str, "reads": int, "differing": int,
        "detail": str, "resolved": int, "clock": float,
    },
}

INDEXES = {
    "runs": [["run_id"]],
    "run_status": [["run_id"]],
    "boards": [["run_id"]],
    "stages": [["run_id"]],
    # register_writes and spi_transactions carry no index: they are the bulk of the trail, and
    # a run's rows are found by seq range (between its runs row and its last status row).
    "register_snapshots": [["run_id"]],
    "backup_units": [["run_id", "address"]],
    "backups": [["run_id"]],
    "units": [["run_id", "address"]],
    "verifies": [["run_id", "address"]],
    "errors": [["run_id"]],
}


class SchemaError(RuntimeError):
    pass


def connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=30.0, check_same_thread=False, isolation_level=None)
    # WAL lets readers (reports, datasette) run beside the writer. synchronous=FULL makes
    # every commit fsync the WAL: a committed intent survives a crash of the host or of
    # its power, which is what write-ahead intent before an erase relies on.
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA foreign_keys=ON")
    return conn


def ensure(conn: sqlite3.Connection) -> None:
    """Create the schema if missing; refuse a database of another schema version."""
    db = sqlite_utils.Database(conn)
    conn.execute("BEGIN IMMEDIATE")
    try:
        tables = db.table_names()
        if tables and "meta" not in tables:   # another program's database: never add to it
            raise SchemaError(f"not an amdflash audit database (it holds tables {', '.join(tables[:5])})")
        if "meta" not in tables:
            db["meta"].create({"key": str, "value": str}, pk="key")
            db["meta"].insert({"key": "schema_version", "value": str(SCHEMA_VERSION)})
            db["chain_head"].create({"id": int, "seq": int, "hash": str}, pk="id")
            db["chain_head"].insert({"id": 1, "seq": 0, "hash": GENESIS})
            for table, columns in AUDIT_TABLES.items():
                db[table].create({"seq": int, **columns, "hash": str}, pk="seq")
                for index in INDEXES.get(table, []):
                    db[table].create_index(index)
                for op in ("UPDATE", "DELETE"):
                    conn.execute(
                        f"CREATE TRIGGER {table}_no_{op.lower()} BEFORE {op} ON {table} "
                        f"BEGIN SELECT RAISE(ABORT, 'audit rows are append-only ({table})'); END")
        else:
            row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            version = int(row[0]) if row else None
            if version != SCHEMA_VERSION:
                raise SchemaError(f"audit database has schema version {version}, this amdflash "
                                  f"understands {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


GENESIS = "0" * 64
