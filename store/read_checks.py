"""What a run's confirmed reads found: how kept bytes were confirmed, where reads disagreed."""
from __future__ import annotations

from typing import Any

import sqlite_utils


def read_checks(db: sqlite_utils.Database, run_id: str) -> dict[str, Any]:
    """The run's read policy (None for runs that read nothing through it) and its
    disagreements; a board with any is flagged by the report."""
    policy = [r["detail"] for r in db.query(
        "SELECT detail FROM stages WHERE run_id = ? AND stage = 'reads' AND event = 'policy' ORDER BY seq LIMIT 1",
        [run_id])]
    counts = {r["purpose"]: (r["units"], r["unresolved"]) for r in db.query(
        "SELECT purpose, count(*) AS units, sum(resolved = 0) AS unresolved FROM read_disagreements "
        "WHERE run_id = ? GROUP BY purpose ORDER BY min(seq)", [run_id])}
    first = list(db.query("SELECT address, purpose, reads, differing, resolved FROM read_disagreements "
                          "WHERE run_id = ? ORDER BY resolved, seq LIMIT 5", [run_id]))
    return {
        "policy": policy[0] if policy else None,
        "confirmed": bool(policy) and not policy[0].startswith("1 read"),
        "disagreed_units": sum(units for units, _ in counts.values()),
        "unresolved_units": sum(unresolved or 0 for _, unresolved in counts.values()),
        "by_purpose": {p: {"units": u, "unresolved": x or 0} for p, (u, x) in counts.items()},
        "first": first,
    }


def describe(checks: dict[str, Any]) -> str | None:
    """One report line, or None when the run read nothing it kept."""
    if not checks["policy"]:
        return None
    line = checks["policy"]
    if checks["disagreed_units"]:
        line += (f"; READS DISAGREED in {checks['disagreed_units']} unit(s), "
                 f"{checks['unresolved_units']} unresolved (table read_disagreements)")
    return line
