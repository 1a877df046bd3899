"""A few facts of an ended run, checked at the cost of the rows that hold them.

A board's history (store.originals) asks of every earlier flash of the board whether it
wrote the board: its runs row (command, spec), the boards row that names the board, and its
end (the terminal run_status row). Verifying each such run whole (store.verify.verify_run)
made a board's `info` and `flash` cost every earlier flash of it again: quadratic over a
board's life on a line. Here a run sealed as ended is checked only where those facts lie:

* its segments (store.chain) that hold them — the first (its runs row), the one holding the
  boards row naming the board, and the last (its end: the writer seals a run's end with the
  row that records it, so the final checkpoint's segment holds the terminal status row and
  nothing of the run comes after it) — each rebuilt from its rows and compared with the head
  its checkpoint signed. The head of the checkpoint before a segment is an input, not a
  verified value: a wrong one cannot rebuild the signed head (SHA-256), so rows that do are
  exactly the rows that checkpoint sealed, whatever else was changed;
* those checkpoints' hashes, links and signatures, under the same keys a full check accepts
  (a board command's: this host's own, store.verify.acting_for);
* the run's rows outside its span (a second runs row, a row before its first, a row after
  its final checkpoint), found through the per-run indexes, as verify_run finds them.

Nothing is remembered between calls: a row edited at any time is caught here if the fact
rests on it, and by `audit verify` wherever it is. What this does not check — a changed row
in another segment of the run, a blob's bytes — no fact used here rests on; the views that
show or act on the whole run (`report`, `replay`, `resume`, the backup a resume keeps, an
unfinished flash's units) still verify it whole (store.run_rows.open_run). Anything this
cannot vouch for cheaply (a run not ended, a legacy run, a segment that does not rebuild, a
checkpoint that does not hold) returns None: the caller verifies the run whole, which names
the problem or refuses it, exactly as before.
"""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from amdflash.store.chain import (
    Broken,
    Checkpoint,
    KeyCheck,
    check_checkpoint_chain,
    load_checkpoints,
    run_genesis,
    segment_head,
)
from amdflash.store.schema import PHYSICAL, PLAIN, TERMINAL
from amdflash.store.verify import (
    INDEXED,
    _acting_key,
    _base,
    _grouped,
    _hash_before,
    _load_segments,
    _outside_before,
    check_schema,
    run_key,
)


@dataclass(frozen=True)
class Ended:
    """What an ended run's own checked rows say (see the module's words)."""
    run_id: str
    key: int                      # the seq of its runs row
    command: str
    board_spec: str
    status: str                   # its terminal status
    board: tuple[str, str] | None  # (unique_id, chip) of its checked boards row naming the board asked about
    segments: int                 # segments rebuilt (of `of` in the run)
    of: int
    rows: int                     # rows hashed


class SealedFacts:
    """Checks on one connection, inside the caller's snapshot (store.verify.snapshot): the
    schema and the archive base are read once for all the runs asked about."""

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn
        self._ready: bool | None = None
        self._through, self._base_hash = 0, b""
        self.keys = KeyCheck(None, _acting_key())
        self.rows_hashed = 0          # what the checks cost, for the tests and the bench

    def _prepare(self) -> bool:
        if self._ready is None:
            try:
                check_schema(self.conn)     # the views and triggers are amdflash's (as verify_run checks)
                self._through, self._base_hash, _ = _base(load_checkpoints(self.conn, "WHERE c.kind = 'archive'"))
                self._ready = True
            except Broken:
                self._ready = False
        return self._ready

    def ended(self, run_id: str, board: tuple[str, str] | None = None) -> Ended | None:
        """The run's command, spec and terminal status, and (`board`: (unique_id, chip)) its
        first boards row naming that board, each from a segment that rebuilds its signed head;
        None where that cannot be shown this way (the caller then verifies the run whole)."""
        try:
            return self._ended(run_id, board) if self._prepare() else None
        except Broken:
            return None

    def _ended(self, run_id: str, board: tuple[str, str] | None) -> Ended | None:
        conn = self.conn
        key = run_key(conn, run_id)
        checkpoints = load_checkpoints(conn, "WHERE c.run = ?", (key,))
        if not checkpoints or checkpoints[-1].kind != "final" or any(c.kind not in ("commit", "final")
                                                                     for c in checkpoints):
            return None            # not sealed as ended, or legacy rows: only the whole check speaks for it
        bounds: list[tuple[int, int]] = []
        lo = key
        for cp in checkpoints:
            if not isinstance(cp.last_seq, int) or cp.last_seq < lo:
                return None
            bounds.append((lo, cp.last_seq))
            lo = cp.last_seq + 1
        sealed = bounds[-1][1]
        _outside_before(conn, run_id, key)          # a second runs row, a row before its first
        self._nothing_after(run_id, key, sealed)    # a row after its final checkpoint
        wanted = {0, len(checkpoints) - 1}
        found_board: tuple[str, str] | None = None
        if board is not None:
            row = conn.execute("SELECT min(seq) FROM boards WHERE run_id = ? AND seq BETWEEN ? AND ? "
                               "AND unique_id = ? AND chip = ?", (run_id, key, sealed, *board)).fetchone()
            if row[0] is None:
                return None
            wanted.add(next(k for k, (a, b) in enumerate(bounds) if a <= row[0] <= b))
            found_board = board
        rows = self._rebuild(run_id, key, checkpoints, bounds, sorted(wanted))
        if rows is None:
            return None
        # The facts, read only from the rows just checked.
        own = conn.execute("SELECT command, board_spec FROM runs WHERE seq = ? AND run_id = ?",
                           (key, run_id)).fetchone()
        last_lo, last_hi = bounds[-1]
        end = conn.execute("SELECT status FROM run_status WHERE run_id = ? AND seq BETWEEN ? AND ? "
                           "ORDER BY seq DESC LIMIT 1", (run_id, last_lo, last_hi)).fetchone()
        if own is None or end is None or end[0] not in TERMINAL:
            return None            # the writer seals an end with its row: a final segment without one is odd
        return Ended(run_id, key, str(own[0]), str(own[1] or ""), str(end[0]), found_board, len(wanted),
                     len(checkpoints), rows)

    def _nothing_after(self, run_id: str, key: int, sealed: int) -> None:
        for table in PHYSICAL:
            if table not in INDEXED:
                continue           # the bulk log has no run index: left to the whole check, as verify_run does
            column, value = ("run_id", run_id) if table in PLAIN else ("run", key)
            if self.conn.execute(f"SELECT 1 FROM {table} WHERE {column} = ? AND seq > ? LIMIT 1",
                                 (value, sealed)).fetchone():
                raise Broken(f"run {run_id}: a row after its final checkpoint")

    def _rebuild(self, run_id: str, key: int, checkpoints: list[Checkpoint], bounds: list[tuple[int, int]],
                 wanted: list[int]) -> int | None:
        """Rows hashed if each wanted segment rebuilds the head its checkpoint signed, else None."""
        conn = self.conn
        for k in wanted:
            cp = checkpoints[k]
            check_checkpoint_chain([cp], _hash_before(conn, cp.id, self._through, self._base_hash), self.keys)
        _load_segments(conn, [(k + 1, key, run_id, *bounds[k]) for k in wanted])
        digests: dict[int, dict[str, bytes]] = {}
        counts: dict[int, int] = {}
        try:
            for table in PHYSICAL:
                for ident, n, digest in _grouped(conn, table):
                    digests.setdefault(ident - 1, {})[table] = digest
                    counts[ident - 1] = counts.get(ident - 1, 0) + n
        finally:
            conn.execute("DELETE FROM _segments")
        for k in wanted:
            prev = checkpoints[k - 1] if k else None
            head = segment_head(run_genesis(run_id) if prev is None else (prev.head or b""), digests.get(k, {}))
            sealed_rows = (checkpoints[k].rows or 0) - ((prev.rows or 0) if prev is not None else 0)
            if head != checkpoints[k].head or counts.get(k, 0) != sealed_rows:
                return None
        hashed = sum(counts.values())
        self.rows_hashed += hashed
        return hashed
