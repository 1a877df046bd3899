"""Whether a run's status, as `runs` lists it, is vouched for by a signature: at the cost of
one span per run, never of the run's rows.

The status `runs` shows comes from the run's newest run_status row. It counts as verified when
that row lies in a span a checkpoint of the run seals, that checkpoint's hash follows from its
fields and the checkpoint before it and its signature verifies, and the span's rows — every
table's, rebuilt by SQLite in one grouped query per table for all runs at once — hash to the
head the checkpoint signed. A status relabelled by an UPDATE (the trigger dropped first), a
status row INSERTed after the run's last checkpoint, or a row DELETEd from that span: none
rebuilds, so the status is shown as not verified. What it does not check is the rest of the
run (`audit verify --run` does) nor who signed (`--key`): the keys are those the database
records.
"""
from __future__ import annotations

import sqlite3

from amdflash.store.chain import LEGACY, Broken, Checkpoint, KeyCheck, check_checkpoint_chain, load_checkpoints
from amdflash.store.chain import run_genesis, segment_head
from amdflash.store.schema import PHYSICAL
from amdflash.store import verify
from amdflash.store.verify import BULK, RUN_KINDS, _base, _grouped, _hash_before, _Helper, _load_segments

_KINDS = ", ".join(f"'{k}'" for k in RUN_KINDS)


def _span(conn: sqlite3.Connection, key: int, status_seq: int) -> tuple[Checkpoint, Checkpoint | None] | None:
    """The run's checkpoint whose span holds `status_seq`, and the run's checkpoint before it."""
    found = load_checkpoints(conn, f"WHERE c.run = ? AND c.kind IN ({_KINDS}) AND c.last_seq >= ? "
                                   "AND c.id = (SELECT min(x.id) FROM checkpoints x WHERE x.run = ? "
                                   f"AND x.kind IN ({_KINDS}) AND x.last_seq >= ?)",
                             (key, status_seq, key, status_seq))
    if not found:
        return None
    cp = found[0]
    before = load_checkpoints(conn, f"WHERE c.id = (SELECT max(x.id) FROM checkpoints x WHERE x.run = ? "
                                    f"AND x.kind IN ({_KINDS}) AND x.id < ?)", (key, cp.id))
    return cp, (before[0] if before else None)


def sealed_statuses(conn: sqlite3.Connection, runs: list[tuple[str, int, int]]) -> dict[int, bool | None]:
    """For each (run_id, key, seq of its status row), by run key: True when that row is sealed
    and its span verifies (module docstring); False when a checkpoint's span holds it but does
    not verify (changed since it was sealed); None when no checkpoint of the run seals it (not
    yet: a live run's first rows; or never: added after the run's last seal). Call inside the
    caller's snapshot."""
    through, base, _ = _base(load_checkpoints(conn, "WHERE c.kind = 'archive'"))
    check = KeyCheck()
    result: dict[int, bool | None] = {}
    spans: list[tuple[int, int, str, int, int]] = []          # (segment id, run key, run_id, lo, hi)
    expected: dict[int, tuple[int, bytes, bytes | None, int]] = {}   # segment -> key, prev head, head, rows
    for run_id, key, status_seq in runs:
        result[key] = None
        found = _span(conn, key, status_seq)
        if found is None:
            continue
        cp, before = found
        if cp.kind == LEGACY or cp.head is None or cp.last_seq is None:
            continue                    # unsigned by design (an older amdflash's): never verified
        result[key] = False
        try:
            check_checkpoint_chain([cp], _hash_before(conn, cp.id, through, base), check)
        except Broken:
            continue
        lo = before.last_seq + 1 if before is not None and before.last_seq is not None else key
        prev = before.head if before is not None and before.head is not None else run_genesis(run_id)
        if status_seq < lo:
            continue                    # before the run's own first row: outside every span it sealed
        rows = (cp.rows or 0) - ((before.rows or 0) if before is not None else 0)
        spans.append((len(spans) + 1, key, run_id, lo, cp.last_seq))
        expected[len(spans)] = (key, prev, cp.head, rows)
    if not spans:
        return result
    # As audit verify does: from many spans on, a second connection hashes half of the bulk
    # table in a thread of its own (SQLite builds the text without the interpreter lock).
    path = conn.execute("PRAGMA database_list").fetchone()[2]
    half = len(spans) // 2 if path and len(spans) >= verify.PARALLEL_SEGMENTS else len(spans)
    helper = _Helper(path, spans[half:]) if half < len(spans) else None
    _load_segments(conn, spans)
    try:
        digests: dict[int, dict[str, bytes]] = {}
        counts: dict[int, int] = {}
        for table in PHYSICAL:
            if table == BULK and helper is not None:
                hashed = _grouped(conn, table, spans[half - 1][0]) + helper.result()
            else:
                hashed = _grouped(conn, table)
            for ident, n, digest in hashed:
                digests.setdefault(ident, {})[table] = digest
                counts[ident] = counts.get(ident, 0) + n
    finally:
        conn.execute("DELETE FROM _segments")
    for ident, (key, prev, head, rows) in expected.items():
        result[key] = segment_head(prev, digests.get(ident, {})) == head and counts.get(ident, 0) == rows
    return result
