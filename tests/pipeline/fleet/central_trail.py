"""Helpers for the central-record tests: a central database per test, host trails made by the
ordinary writer (signed with a host key of the test's own), and counts to compare."""
from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path
from typing import Any

from amdflash.store import schema
from amdflash.store.writer.sealer import ChainWriter, Signer
from amdflash.store.schema import PHYSICAL


def new_database(postgres: Any) -> str:
    """A fresh database in the session's throwaway cluster; its URL."""
    name = "central_" + uuid.uuid4().hex[:12]
    postgres.psql(f"CREATE DATABASE {name}")
    return postgres.dsn.replace("/postgres?", f"/{name}?")


def psql(url: str, sql: str, role: str | None = None) -> str:
    """SQL in the database `url` names (as `role` when given, with SET ROLE)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as pg:
        if role:
            pg.execute(f"SET ROLE {role}")
        cur = pg.execute(sql)
        if cur.description is None:
            return ""
        return "\n".join("|".join("" if v is None else str(v) for v in row) for row in cur.fetchall())


def central_counts(url: str) -> dict[str, int]:
    out = {}
    for table in ("checkpoints", "blobs", *PHYSICAL):
        out[table] = int(psql(url, f"SELECT count(*) FROM amdflash.{table}"))
    return out


def local_counts(db: Path) -> dict[str, int]:
    conn = sqlite3.connect(db)
    try:
        out = {"checkpoints": conn.execute("SELECT count(*) FROM checkpoints").fetchone()[0]}
        for table in PHYSICAL:
            out[table] = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        return out
    finally:
        conn.close()


def synthetic_runs(db: Path, key: Path, count: int, host: str = "hosta") -> None:
    """`count` short runs (runs, boards, run_status rows) written and sealed by the ordinary
    audit writer, as many info runs would leave them: a trail of many runs in seconds."""
    conn = schema.connect(str(db))
    conn.execute("BEGIN")
    if schema.version(conn) == 0:
        schema.create(conn)
    conn.execute("COMMIT")
    w = ChainWriter(conn, Signer.load(key), None, seal_seconds=1e9)
    try:
        for i in range(count):
            run_id = f"20260101T{i // 3600 % 24:02d}{i // 60 % 60:02d}{i % 60:02d}-{uuid.uuid4().hex[:8]}"
            at = f"2026-01-01T00:00:{i % 60:02d}.{i:06d}+00:00"
            spec = f"sim:/line/{host}/board{i % 8}"
            w.add(("runs", run_id, "info", "{}", "root", None, host, None, "0.1.0", None, None, None, None, spec,
                   None, at))
            w.add(("boards", run_id, spec, "sim", 1, f"SER{i % 8}", None, 0x1002, 0x744C, "c86015",
                   "GigaDevice GD25LQ16E", f"{i % 8:032x}", 0, 0, 0, "none", None, "{}", at))
            w.add(("run_status", run_id, "succeeded", None, None, "{}", at))
            if i % 50 == 49:
                w.commit(False)
        w.commit(False)
    finally:
        w.close()
