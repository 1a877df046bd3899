"""One batch of a push on the wire: the blobs the central database lacks, the batch's
checkpoints and the rows they seal, each table one COPY (binary), streamed from SQLite.

Before (issue 42), every row of the batch was read into memory first, in seq order (a sort
of the whole batch), and only then sent: the database sat idle while SQLite read, and the
client while the database inserted. Now each table's rows go out as SQLite yields them, a
few thousand at a time, in the order of the spans (one range scan per span, no sort: the
database's checks order what they hash themselves), so the database inserts one part while
the next is read; the blobs are looked up once per batch (which the database holds: one
query), their bytes streamed the same way. What is sent is what the batch's checkpoints seal,
as SQLite holds it — the database verifies every row, blob and signature itself — and the
statements per batch are as many whatever its size: COPY per table, not per row.
"""
from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from typing import Any

from amdflash.store.central.schema import NS, PG_TYPES, quoted
from amdflash.store.schema import PHYSICAL, PLAIN

FETCH = 4096          # rows read from SQLite at a time


def _stream(cursor: sqlite3.Cursor) -> Iterator[tuple]:
    while part := cursor.fetchmany(FETCH):
        yield from part


def _span_rows(table: str) -> str:
    """FROM clause: the table's rows within the spans of `_push` (span by span, each a range of seq)."""
    on = ("p.run_id = s.run_id AND p.seq BETWEEN s.lo AND s.hi" if table in PLAIN
          else "p.seq BETWEEN s.lo AND s.hi AND +p.run = s.run")
    # CROSS JOIN: SQLite keeps _push as the outer loop (spans in checkpoint order).
    return f"FROM _push s CROSS JOIN {table} p ON {on}"


def row_sql(table: str, host_id: int) -> str:
    """The table's rows as the central table takes them: host id, seq, columns, blob
    references replaced by their blobs' SHA-256 (SQLite does the joins)."""
    columns = PHYSICAL[table]
    names = ", ".join(f"b_{c}.sha256" if k == "ref" else f"p.{c}" for c, k in columns)
    joins = "".join(f" LEFT JOIN blobs b_{c} ON b_{c}.id = p.{c}" for c, k in columns if k == "ref")
    return f"SELECT {int(host_id)}, p.seq, {names} {_span_rows(table)}{joins}"


def _first_seq(span: tuple) -> int:
    return int(span[2] or 0)


def _referenced_sql() -> str:
    return " UNION ".join(f"SELECT p.{c} AS id {_span_rows(t)}" for t, cols in PHYSICAL.items()
                          for c, k in cols if k == "ref")


def send_batch(local: sqlite3.Connection, cur: Any, host_id: int, spans: list[tuple], checkpoint_rows: list[tuple],
               report: Any) -> None:
    """Send one batch in the open transaction of `cur` (a psycopg cursor): `spans` are the
    (run key, run_id, first seq, last seq) its checkpoints seal, `checkpoint_rows` the rows of
    the central checkpoints table. The caller commits (or rolls back)."""
    from psycopg.types.string import BytesBinaryDumper   # (psycopg only where central is used)

    # bytea by psycopg's C dumper (set_types would pick dbapi20's, in Python: a call per value).
    cur.adapters.register_dumper(None, BytesBinaryDumper)
    local.execute("CREATE TEMP TABLE IF NOT EXISTS _push (run INTEGER, run_id TEXT, lo INTEGER, hi INTEGER)")
    local.execute("CREATE TEMP TABLE IF NOT EXISTS _push_blobs (id INTEGER PRIMARY KEY)")
    local.execute("DELETE FROM _push")
    local.execute("DELETE FROM _push_blobs")
    ordered: list[tuple] = sorted(spans, key=_first_seq)
    local.executemany("INSERT INTO _push VALUES (?, ?, ?, ?)", ordered)
    local.execute(f"INSERT INTO _push_blobs SELECT id FROM ({_referenced_sql()}) WHERE id IS NOT NULL")
    # Blobs first: the rows' statement checks find every blob they name already stored.
    send_blobs(local, cur, host_id, report)
    with cur.copy(f"COPY {NS}.checkpoints (host_id, id, kind, run, run_id, rows, last_seq, head, at, detail, "
                  "hash, sig, pushed_in, pushed_by) FROM STDIN") as copy:
        for c in checkpoint_rows:
            copy.write_row(c)
    for table, columns in PHYSICAL.items():
        found = local.execute(row_sql(table, host_id))
        first = found.fetchmany(FETCH)
        if not first:
            continue
        names = ", ".join(quoted(c) for c, _ in columns)
        sent = 0
        with cur.copy(f"COPY {NS}.{table} (host_id, seq, {names}) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(["int4", "int8", *(PG_TYPES[k] for _, k in columns)])
            part = first
            while part:
                for r in part:
                    copy.write_row(r)
                sent += len(part)
                part = found.fetchmany(FETCH)
        report.rows += sent
        report.by_table[table] = report.by_table.get(table, 0) + sent


def send_blobs(local: sqlite3.Connection, cur: Any, host_id: int, report: Any) -> None:
    """The blobs the batch's rows name (`_push_blobs`) that the database lacks for the host."""
    named = [bytes(s) for (s,) in local.execute("SELECT b.sha256 FROM _push_blobs r JOIN blobs b ON b.id = r.id")]
    have = {bytes(s) for (s,) in cur.execute(f"SELECT sha256 FROM {NS}.own_blobs WHERE host_id = %s AND "
                                             "sha256 = ANY(%b)", (host_id, named))} if named else set()
    if len(have) < len(named):
        with cur.copy(f"COPY {NS}.blobs (host_id, sha256, data) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(["int4", "bytea", "bytea"])
            for sha, data in _stream(local.execute("SELECT b.sha256, b.data FROM _push_blobs r "
                                                   "JOIN blobs b ON b.id = r.id")):
                if bytes(sha) not in have:
                    copy.write_row((host_id, sha, data))
                    report.blobs += 1
                    report.blob_bytes += len(data)
