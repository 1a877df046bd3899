"""The canonical form of a row is computed twice — by the writer in Python as it chains, by
SQLite when verifying — and the two must agree byte for byte on every value."""
from __future__ import annotations

import hashlib
import sqlite3

from hypothesis import given, settings
from hypothesis import strategies as st

from amdflash.store.chain import canonical, canonical_sql
from amdflash.store.schema import PHYSICAL, create

INTS = st.integers(min_value=-(2 ** 63), max_value=2 ** 63 - 1)
TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)
BLOBS = st.binary(max_size=40)
VALUES = {"int": st.none() | INTS, "text": st.none() | TEXT, "blob": st.none() | BLOBS, "ref": st.none() | BLOBS}


@st.composite
def rows(draw: st.DrawFn) -> tuple[str, list]:
    table = draw(st.sampled_from(sorted(PHYSICAL)))
    return table, [draw(VALUES[kind]) for _, kind in PHYSICAL[table]]


def _database() -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.execute("BEGIN")
    create(conn)
    conn.execute("COMMIT")
    return conn


@settings(max_examples=150, deadline=None)
@given(st.lists(rows(), min_size=1, max_size=8))
def test_python_and_sqlite_agree_on_every_value(batch):
    conn = _database()
    expected = {}
    for seq, (table, values) in enumerate(batch, 1):
        stored, chained = [], []
        for (column, kind), value in zip(PHYSICAL[table], values):
            if kind == "ref" and value is not None:
                sha = hashlib.sha256(value).digest()
                ident = conn.execute("INSERT INTO blobs (sha256, data) VALUES (?, ?)", (sha, value)).lastrowid
                stored.append(ident)
                chained.append(sha)
            else:
                stored.append(value)
                chained.append(value)
        columns = ", ".join(c for c, _ in PHYSICAL[table])
        conn.execute(f"INSERT INTO {table} (seq, {columns}) VALUES (?, {', '.join('?' * len(values))})",
                     (seq, *stored))
        expected[seq] = canonical(table, seq, chained)
    for table in {t for t, _ in batch}:
        for seq, _, text in conn.execute(canonical_sql(table)):
            assert text.encode() == expected[seq], (table, seq)


def test_a_blob_where_a_number_or_text_was_is_a_different_record():
    """Column affinity turns '5' and 5.0 into 5 in an INTEGER column; a BLOB stays a BLOB, and
    must neither look like the number nor stop the verification."""
    conn = _database()
    for seq, value in enumerate((5, b"\x05", "five"), 1):
        conn.execute("INSERT INTO errors (seq, run_id, stage, message, address, at) VALUES (?, 'r', 's', 'm', ?, 'a')",
                     (seq, value))
    texts = [text.split(",", 5)[5] for _, _, text in conn.execute(canonical_sql("errors"))]
    assert texts == ['5,"a"]\n', '["b","05"],"a"]\n', '"five","a"]\n']
