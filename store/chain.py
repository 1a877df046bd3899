"""The hash chain over every audit row: hash = sha256(prev_hash || canonical row)."""
from __future__ import annotations

import hashlib
import heapq
import sqlite3
from dataclasses import dataclass
from typing import Any, Iterator

from store.schema import AUDIT_TABLES, GENESIS


def _field(value: Any) -> str:
    # Typed and length-prefixed, so no two different rows share an encoding.
    if value is None:
        return "n"
    if isinstance(value, bool):
        return f"i{int(value)}"
    if isinstance(value, int):
        return f"i{value}"
    if isinstance(value, float):
        return f"f{value!r}"
    if isinstance(value, str):
        return f"s{len(value)}:{value}"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"b{bytes(value).hex()}"
    raise TypeError(f"cannot record a {type(value).__name__} in the audit trail")


_COLUMNS = {table: ("seq", *cols) for table, cols in AUDIT_TABLES.items()}


def canonical(table: str, row: dict[str, Any]) -> bytes:
    """A byte string that changes whenever any recorded value of the row changes."""
    get = row.get
    return "|".join([table, *[_field(get(c)) for c in _COLUMNS[table]]]).encode()


def link(prev_hash: str, table: str, row: dict[str, Any]) -> str:
    return hashlib.sha256(prev_hash.encode() + canonical(table, row)).hexdigest()


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
        digest = link(prev, table, row)
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
