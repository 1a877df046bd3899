"""What a run's confirmed reads found: how kept bytes were confirmed, where reads disagreed."""
from __future__ import annotations

import json
from typing import Any

import sqlite_utils
from amdflash.store.run_rows import RunRows


def read_checks(db: sqlite_utils.Database, rows: RunRows) -> dict[str, Any]:
    """The run's read policy (from its --reads argument; None for runs without one) and
    its disagreements; a board with any is flagged by the report."""
    arguments = [r["arguments"] for r in db.query("SELECT arguments FROM runs WHERE seq = ?", [rows.key])]
    reads = json.loads(arguments[0] or "{}").get("reads") if arguments else None
    policy = None
    if isinstance(reads, int):
        policy = (f"{reads} agreeing reads (more on a noisy board) confirm each kept byte" if reads >= 2
                  else "1 read per byte: kept bytes are NOT confirmed (--reads 1)")
    counts = {r["purpose"]: (r["n"], r["unresolved"]) for r in db.query(
        "SELECT purpose, count(*) AS n, sum(resolved = 0) AS unresolved FROM read_disagreements "
        f"WHERE {rows.sql} GROUP BY purpose ORDER BY min(seq)", rows.args)}
    first = list(db.query("SELECT address, purpose, reads, differing, resolved FROM read_disagreements "
                          f"WHERE {rows.sql} ORDER BY resolved, seq LIMIT 5", rows.args))
    return {
        "policy": policy,
        "confirmed": isinstance(reads, int) and reads >= 2,
        "disagreed_reads": sum(n for n, _ in counts.values()),
        "unresolved_reads": sum(unresolved or 0 for _, unresolved in counts.values()),
        "by_purpose": {p: {"reads": n, "unresolved": x or 0} for p, (n, x) in counts.items()},
        "first": first,
    }


def describe(checks: dict[str, Any]) -> str | None:
    """One report line, or None when the run read nothing it kept."""
    if not checks["policy"]:
        return None
    line = checks["policy"]
    if checks["disagreed_reads"]:
        where = ", ".join(f"{p} {c['reads']}" for p, c in checks["by_purpose"].items())
        line += (f"; READS DISAGREED ({where}), {checks['unresolved_reads']} unresolved "
                 "(table read_disagreements)")
    return line
