"""The rows of an export, read in batches and written as SQLite makes them.

`audit export` spent its time in Python, one value at a time (4.7 million calls of the JSON
encoder and one blob query per reference for 101 flashes). Here SQLite writes each row
record's JSON text itself, exactly as json.dumps(..., separators=(",", ":")) would (ints,
NULL, printable-ASCII text, blobs as {"hex": ...}, references as {"sha256": ...}); a row
holding anything else (non-ASCII or control characters in text, a REAL, a reference to a
missing blob) gets the marker PYTHON in its text and is written by the Python encoder
instead: the same text json.dumps writes.

Rows are read with fetchmany and yielded one at a time: nothing holds more than a batch.
A selection of runs is read run by run (each by its seq span, which costs that run), each
run's query opened only once the merged stream reaches its first seq, so a year of runs
never holds a year of open statements.
"""
from __future__ import annotations

import heapq
import json
import sqlite3
from collections.abc import Callable, Iterator
from typing import Any

from amdflash.store.schema import PHYSICAL, PLAIN, RUN_END_SQL

BATCH = 2048
# Marks a value SQLite does not write (a control character never appears raw in JSON text).
PYTHON = "\x01"


def _column_sql(column: str, kind: str) -> str:
    """The JSON text of one value, or PYTHON when the Python encoder must write the row."""
    c = f"p.{column}"
    if kind == "ref":
        return (f"CASE WHEN {c} IS NULL THEN 'null' WHEN b_{column}.sha256 IS NOT NULL THEN "
                f"'{{\"sha256\":\"' || lower(hex(b_{column}.sha256)) || '\"}}' ELSE char(1) END")
    # Text as it is only when it is printable ASCII: json_quote then escapes as Python does.
    return (f"CASE typeof({c}) WHEN 'integer' THEN {c} WHEN 'null' THEN 'null' "
            f"WHEN 'text' THEN iif({c} GLOB '*[^ -~]*', char(1), json_quote({c})) "
            f"WHEN 'blob' THEN '{{\"hex\":\"' || lower(hex({c})) || '\"}}' ELSE char(1) END")


MAX_REFS = max(sum(k == "ref" for _, k in columns) for columns in PHYSICAL.values())
assert MAX_REFS == 2, "store.export._write_rows unpacks two blob ids per row"


def row_sql(table: str) -> str:
    """SELECT seq, run (key or run_id), the row record's JSON text (PYTHON in it where Python
    must write it), the table, then the blob id of each reference column (NULL-padded to
    MAX_REFS), FROM {table} p (a WHERE clause may follow)."""
    columns = PHYSICAL[table]
    template = (f'{{"record":"row","table":"{table}","seq":%d,"values":{{'
                + ",".join(f'"{c}":%s' for c, _ in columns) + "}}")
    refs = [c for c, k in columns if k == "ref"]
    joins = "".join(f" LEFT JOIN blobs b_{c} ON b_{c}.id = p.{c}" for c in refs)
    run = "p.run_id" if table in PLAIN else "p.run"
    values = ", ".join(_column_sql(c, k) for c, k in columns)
    ref_ids = "".join(f", p.{c}" for c in refs) + ", NULL" * (MAX_REFS - len(refs))
    return f"SELECT p.seq, {run}, printf('{template}', p.seq, {values}), '{table}'{ref_ids} FROM {table} p{joins}"


_ROW_SQL = {t: row_sql(t) for t in PHYSICAL}
# Every table's rows in one statement, in seq order: SQLite merges the tables' rowid order
# (MERGE (UNION ALL), no sort), which Python would do a row at a time.
_ALL_SQL = " UNION ALL ".join(_ROW_SQL.values()) + " ORDER BY 1"
# One run's rows: from its runs row on (plain tables, by their run_id index), or within its
# seq span (the bulk tables, which carry no run index: a span costs that run).
_RUN_SQL = " UNION ALL ".join(
    _ROW_SQL[t] + (" WHERE p.run_id = :id AND p.seq >= :key" if t in PLAIN else
                   " WHERE p.seq BETWEEN :key AND :end AND +p.run = :key") for t in PHYSICAL) + " ORDER BY 1"


def python_row(conn: sqlite3.Connection, table: str, seq: int) -> str:
    """The row record's JSON text, by the Python encoder (for what SQLite does not write)."""
    columns = PHYSICAL[table]
    row = conn.execute(f"SELECT {', '.join(c for c, _ in columns)} FROM {table} WHERE seq = ?", (seq,)).fetchone()
    values: dict[str, Any] = {}
    for (column, kind), value in zip(columns, row, strict=True):
        if kind == "ref" and value is not None:
            found = conn.execute("SELECT sha256 FROM blobs WHERE id = ?", (value,)).fetchone()
            if found is None:
                raise ValueError(f"{table} seq {seq}: column {column} refers to blob {value}, which the database "
                                 "does not hold")
            value = {"sha256": bytes(found[0]).hex()}
        elif isinstance(value, (bytes, bytearray, memoryview)):
            value = {"hex": bytes(value).hex()}
        values[column] = value
    return json.dumps({"record": "row", "table": table, "seq": seq, "values": values}, separators=(",", ":"))


def _batches(cursor: sqlite3.Cursor) -> Iterator[tuple]:
    while rows := cursor.fetchmany(BATCH):
        yield from rows


def _lazy_merge(starts: list[tuple[int, Callable[[], Iterator[tuple]]]]) -> Iterator[tuple]:
    """Merge, by seq (each row's first field), streams that each begin at or after their start
    (sorted by start): a stream is opened only when the merge reaches its start."""
    heap: list[tuple[int, int, tuple, Iterator[tuple]]] = []
    i = 0
    while True:
        while i < len(starts) and (not heap or starts[i][0] <= heap[0][0]):
            stream = starts[i][1]()
            first = next(stream, None)
            if first is not None:
                heapq.heappush(heap, (first[0], i, first, stream))
            i += 1
        if not heap:
            return
        _, n, row, stream = heap[0]
        if len(heap) == 1:
            # One stream (runs one after another, the usual trail): no heap per row.
            limit = starts[i][0] if i < len(starts) else None
            yield row
            for row in stream:
                if limit is not None and row[0] >= limit:
                    heap[0] = (row[0], n, row, stream)
                    break
                yield row
            else:
                heap.clear()
            continue
        yield row
        nxt = next(stream, None)
        if nxt is None:
            heapq.heappop(heap)
        else:
            heapq.heapreplace(heap, (nxt[0], n, nxt, stream))


def run_spans(conn: sqlite3.Connection, keys: list[int]) -> dict[int, int]:
    """run key -> the last seq of its span (its final checkpoint, else the chain's head)."""
    spans: dict[int, int] = {}
    for start in range(0, len(keys), 500):
        part = keys[start:start + 500]
        spans.update(conn.execute(f"SELECT r.seq, {RUN_END_SQL} FROM runs r WHERE r.seq IN "
                                  f"({','.join('?' * len(part))})", part).fetchall())
    return spans


def rows(conn: sqlite3.Connection, runs: list[tuple[int, str]] | None) -> Iterator[tuple]:
    """(seq, run, text, table, blob ids...) of every physical row in seq order: all of them, or
    those of `runs` ((key, run_id)), each run read by its own statement."""
    if runs is None:
        return _batches(conn.execute(_ALL_SQL))
    ordered = sorted(runs)
    ends = run_spans(conn, [k for k, _ in ordered])
    def opener(key: int, run_id: str) -> Callable[[], Iterator[tuple]]:
        return lambda: _batches(conn.execute(_RUN_SQL, {"id": run_id, "key": key, "end": ends[key]}))

    return _lazy_merge([(key, opener(key, run_id)) for key, run_id in ordered])
