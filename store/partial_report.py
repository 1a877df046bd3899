"""The report of a run that does not verify: what its signed checkpoints still vouch for, the
rest marked as unverified (store.partial), and, given a second copy of the run, the rows
that differ.

The report object is store.queries' own, read through the vouched rows only (a
store.partial.PartialRows), with these changes: `status` is "STATUS (not verified)" unless the
run's newest status row is vouched for (`recorded_status`: what the trail says now;
`status_verified` False, as `runs` says it); the counts
of register writes and SPI transactions are of vouched rows; `chain` says what was checked
and what not; and `unverified` names every failing span (seq range, checkpoint, tables, and
with a copy each row that differs). A report of a run that verifies is not made here.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlite_utils
from amdflash.store.partial import Partial, check_segments, compare_with_export, compare_with_trail, rows_view
from amdflash.store.queries import RunReport, _report, resolve_run
from amdflash.store.run_rows import RunUnverified, open_run, verify_command
from amdflash.store.verify import VerifyReport, connect_reader, snapshot

NO_COPY = ("a copy of the run made before (amdflash audit export --run RUN -o FILE) names the rows that differ: "
           "amdflash report RUN --against FILE (or --against central: the central record, when the run was pushed)")


def partial_report(db: sqlite_utils.Database, run_id: str, keyfiles: list[Path] | None = None,
                   against: Path | None = None, copy: tuple[Path, str] | None = None) -> RunReport:
    """The report of a run that does not verify, marked (raises RunUnverified where nothing of
    it can be shown: store.partial.check_segments). `against`: an export of the run; `copy`:
    another audit database holding it (the central record's, materialized) and its name in
    words; either names the rows that differ, and is refused (ValueError) unless its copy of
    the run verifies. A run that verifies: RuntimeError (use store.queries.report)."""
    with snapshot(db.conn):
        run_id = resolve_run(db, run_id)
        try:
            open_run(db.conn, run_id, keyfiles)
        except RunUnverified as e:
            refusal = e
        else:
            raise RuntimeError(f"run {run_id} verifies: its report is store.queries.report's")
        try:
            partial = check_segments(db.conn, run_id, refusal.problem, keyfiles)
        except RunUnverified:
            raise refusal from None       # nothing of it can be shown: refused as before, in the same words
        compared = None
        if against is not None:
            compared = compare_with_export(partial, db.conn, against, keyfiles)
        elif copy is not None:
            other = connect_reader(str(copy[0]))
            try:
                compared = compare_with_trail(partial, db.conn, other, copy[1], keyfiles)
            finally:
                other.close()
        check = VerifyReport(False, f"run {run_id}", rows=partial.vouched_rows, checkpoints=len(partial.checkpoints),
                             runs=1, signers=partial.signers, trusted=partial.trusted, key=partial.key,
                             sealed=partial.last_vouched, problem=refusal.problem)
        rows = rows_view(partial, check)
        rep = _report(db, rows, keyfiles)
        _status(db, rep, partial)
        rep["register_writes"], rep["spi_transactions"] = _counts(db, partial)
        rep["chain"] = _chain(partial, refusal.problem)
        rep["unverified"] = {
            "problem": refusal.problem,
            "check": verify_command(db.conn, run_id),
            "vouched": [list(r) for r in partial.vouched],
            "spans": [s.to_json() for s in partial.spans],
            "notes": [n for n in partial.notes if n != refusal.problem],
            "copy": compared,
            "next": None if compared is not None else NO_COPY.replace("RUN", run_id),
        }
        rep.rows = rows
        return rep


def _vouched(partial: Partial, seq: int) -> bool:
    return any(lo <= seq <= hi for lo, hi in partial.vouched)


def _status(db: sqlite_utils.Database, rep: dict[str, Any], partial: Partial) -> None:
    """The run's status is shown only if its newest status row is vouched for and no failing
    span comes after it: a later one may have held (or hidden, by a DELETE) a newer status."""
    newest = db.conn.execute("SELECT seq, status FROM run_status WHERE run_id = ? AND seq >= ? ORDER BY seq DESC "
                             "LIMIT 1", (partial.run_id, partial.key)).fetchone()
    if newest is not None and _vouched(partial, newest[0]) and \
            not any(s.last is None or s.last > newest[0] for s in partial.spans):
        return
    recorded = newest[1] if newest is not None else None
    rep["recorded_status"] = recorded
    rep["status_verified"] = False
    rep["status"] = f"{recorded} (not verified)" if isinstance(recorded, str) and recorded else "not verified"
    rep["ended"] = None
    rep["error"] = None
    facts = rep.get("facts")
    if isinstance(facts, dict):
        # Read through the vouched rows only, the run looked as if it had no end (killed); its
        # end is a row that does not verify, which is what the reviewer must be told.
        from amdflash.store.fact_words import words

        facts["ended"] = {"how": "not verified", "status": recorded, "at": None}
        facts["words"] = [{"key": k, "label": label, "text": text} for k, label, text in words(rep)]


def _counts(db: sqlite_utils.Database, partial: Partial) -> tuple[int, int]:
    """(register writes, SPI transactions) of the vouched rows (store.queries.counts, by range)."""
    from amdflash.store import schema

    writes = transactions = raw = 0
    for lo, hi in partial.vouched:
        w, t = db.conn.execute(
            f"SELECT coalesce(sum(length(coalesce(shape, '{schema.DEFAULT_SHAPE}'))), 0), "
            "coalesce(sum(1 + (again IS NOT NULL)), 0) FROM log_spi WHERE seq BETWEEN ? AND ? AND run = ?",
            (lo, hi, partial.key)).fetchone()
        raw += db.conn.execute("SELECT count(*) FROM log_writes WHERE seq BETWEEN ? AND ? AND run = ?",
                               (lo, hi, partial.key)).fetchone()[0]
        writes, transactions = writes + w, transactions + t
    return writes + raw, transactions


def _chain(partial: Partial, problem: str) -> dict[str, Any]:
    from amdflash.store.keys import fingerprint

    held = [c for c, ok in zip(partial.checkpoints, partial.valid, strict=True)
            if ok and c.last_seq is not None and _vouched(partial, c.last_seq)]
    cp = held[-1] if held else None
    how = "verified against the given key" if partial.trusted else \
        "valid under the key recorded in the database (not checked against a trusted key)"
    ranges = ", ".join(f"seq {lo}..{hi}" for lo, hi in partial.vouched)
    return {
        "ok": False,
        "problem": problem,
        "rows": partial.vouched_rows,
        "checkpoints": len(partial.checkpoints),
        "checkpoint": cp.id if cp else None,
        "sealed": cp.kind if cp else None,
        "head": cp.head.hex() if cp and cp.head else None,
        "checkpoint_hash": cp.hash.hex() if cp else None,
        "signed_by": fingerprint(cp.public_key) if cp and cp.public_key else None,
        "legacy": None,
        "unsealed_rows": 0,
        "signature": f"{how}, for the vouched rows only ({ranges}: {len(held)} of {len(partial.checkpoints)} "
                     "checkpoints hold); the rest is not verified",
        "vouched": [list(r) for r in partial.vouched],
    }
