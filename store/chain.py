"""The hash chain over every audit row: hash = sha256(prev_hash || canonical row).

The canonical form is defined independently of Python, so an archived export can be
checked with any language's SHA-256:

    canonical = table "|" seq "|" field "|" field ...   (columns in schema order, UTF-8)
    field     = "n"                                   NULL
              | "i" decimal                           INTEGER
              | "f" 16 lowercase hex digits           REAL, IEEE-754 binary64, big-endian
              | "s" byte length ":" text              TEXT (length of its UTF-8 encoding)
              | "b" lowercase hex                     BLOB
    hash      = lowercase hex of sha256(ascii(prev_hash) || canonical); the first prev_hash
                is 64 zeros.
"""
from __future__ import annotations

import hashlib
import heapq
import sqlite3
import struct
from dataclasses import dataclass
from typing import Any, Iterator

from amdflash.store.schema import AUDIT_TABLES, GENESIS


def _bytes(value: Any) -> bytes:
    return bytes(value)


_CONVERT = {int: int, float: float, str: str, bytes: _bytes}
# Per table: column names and the conversion that makes a value what SQLite will give back
# (a REAL column returns 0.0 for 0, a TEXT column '5' for 5), so that a row hashes the same
# when it is written and when it is read back for verification.
_COLUMNS = {table: tuple(cols) for table, cols in AUDIT_TABLES.items()}
_CONVERTERS = {table: tuple(_CONVERT[t] for t in cols.values()) for table, cols in AUDIT_TABLES.items()}


def normalise(table: str, row: dict[str, Any]) -> tuple[Any, ...]:
    """The row's recorded values in column order, as SQLite stores and returns them."""
    get = row.get
    out = []
    for column, convert in zip(_COLUMNS[table], _CONVERTERS[table]):
        value = get(column)
        if value is not None:
            if isinstance(value, bool):
                value = int(value)
            value = convert(value)
        out.append(value)
    return tuple(out)


_DOUBLE = struct.Struct(">d")


def _field(value: Any) -> bytes:
    if value is None:
        return b"n"
    kind = type(value)
    if kind is int:
        return b"i%d" % value
    if kind is float:
        return b"f" + _DOUBLE.pack(value).hex().encode()
    if kind is str:
        text = value.encode()
        return b"s%d:%s" % (len(text), text)
    if kind is bytes:
        return b"b" + value.hex().encode()
    raise TypeError(f"cannot chain a {kind.__name__} value")


def canonical(table: str, seq: int, values: tuple[Any, ...]) -> bytes:
    return b"|".join([table.encode(), b"%d" % seq, *map(_field, values)])


def link(prev_hash: str, table: str, seq: int, values: tuple[Any, ...]) -> str:
    return hashlib.sha256(prev_hash.encode() + canonical(table, seq, values)).hexdigest()


@dataclass
class ChainReport:
    ok: bool
    rows: int
    head_seq: int
    head_hash: str
    first_bad: str | None = None   # "table seq N: reason"

    def describe(self) -> str:
        if self.ok:
            return f"audit chain intact: {self.rows} rows, head seq {self.head_seq} hash {self.head_hash[:16]}…"
        return f"audit chain BROKEN at {self.first_bad} (checked {self.rows} rows before it)"


def iter_rows(conn: sqlite3.Connection) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """Every audit row, in seq order across all tables."""
    conn.row_factory = sqlite3.Row

    def table_rows(table: str) -> Iterator[tuple[int, str, dict[str, Any]]]:
        for r in conn.execute(f"SELECT * FROM {table} ORDER BY seq"):
            d = dict(r)
            yield d["seq"], table, d

    try:
        yield from heapq.merge(*(table_rows(t) for t in AUDIT_TABLES), key=lambda x: x[0])
    finally:
        conn.row_factory = None


def verify(conn: sqlite3.Connection) -> ChainReport:
    prev, expected_seq, count = GENESIS, 1, 0
    for seq, table, row in iter_rows(conn):
        if seq != expected_seq:
            return ChainReport(False, count, expected_seq - 1, prev,
                               f"{table} seq {seq}: expected seq {expected_seq} (a row is missing)")
        digest = link(prev, table, seq, tuple(row[c] for c in _COLUMNS[table]))
        if row["hash"] != digest:
            return ChainReport(False, count, seq - 1, prev,
                               f"{table} seq {seq}: stored hash does not match its content")
        prev, expected_seq, count = digest, expected_seq + 1, count + 1
    head = conn.execute("SELECT seq, hash FROM chain_head WHERE id = 1").fetchone()
    if head is not None and (head[0] != expected_seq - 1 or head[1] != prev):
        return ChainReport(False, count, expected_seq - 1, prev,
                           f"chain head: recorded seq {head[0]} does not match the last row {expected_seq - 1} "
                           "(rows were removed from the end)")
    return ChainReport(True, count, expected_seq - 1, prev)
