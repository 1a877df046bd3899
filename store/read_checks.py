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
        policy = (f"{reads} agreeing reads (more on a noisy board) confirm each kept byte, or one proven read "
                  "of what it should hold" if reads >= 2
                  else "1 read per byte: kept bytes are NOT confirmed (--reads 1)")
    counts = {r["purpose"]: (r["n"], r["unresolved"]) for r in db.query(
        "SELECT purpose, count(*) AS n, sum(resolved = 0) AS unresolved FROM read_disagreements "
        f"WHERE {rows.sql} GROUP BY purpose ORDER BY min(seq)", rows.args)}
    first = list(db.query("SELECT address, purpose, reads, differing, resolved FROM read_disagreements "
                          f"WHERE {rows.sql} ORDER BY resolved, seq LIMIT 5", rows.args))
    return {
        "confirmation": confirmation(db, rows),
        "policy": policy,
        "confirmed": isinstance(reads, int) and reads >= 2,
        "disagreed_reads": sum(n for n, _ in counts.values()),
        "unresolved_reads": sum(unresolved or 0 for _, unresolved in counts.values()),
        "by_purpose": {p: {"reads": n, "unresolved": x or 0} for p, (n, x) in counts.items()},
        "first": first,
    }


def confirmation(db: sqlite_utils.Database, rows: RunRows) -> dict[str, dict[str, Any]]:
    """How the run's kept units were confirmed, per purpose (the `stages` rows "reads /
    confirmed" its reading phases recorded): units matched (every chunk equal to what it
    should hold, proven to come from the chip), mixed, by agreeing reads, read once."""
    out: dict[str, dict[str, Any]] = {}
    for r in db.query(f"SELECT detail FROM stages WHERE {rows.sql} AND stage = 'reads' AND event = 'confirmed' "
                      "ORDER BY seq", rows.args):
        try:
            d = json.loads(r["detail"] or "")
        except ValueError:
            continue
        if not isinstance(d, dict) or not isinstance(d.get("purpose"), str):
            continue
        c = out.setdefault(d["purpose"], {"units": 0, "matched": 0, "mixed": 0, "agreeing": 0, "single": 0,
                                          "matched_what": None})
        for k in ("units", "matched", "mixed", "agreeing", "single"):
            v = d.get(k)
            c[k] += v if isinstance(v, int) else 0
        c["matched_what"] = c["matched_what"] or d.get("matched_what")
    return out


def describe(checks: dict[str, Any]) -> str | None:
    """One report line, or None when the run read nothing it kept."""
    if not checks["policy"]:
        return None
    line = checks["policy"]
    how = []
    for purpose, c in (checks.get("confirmation") or {}).items():
        if c["single"] == c["units"]:
            how.append(f"{purpose}: {c['units']} unit{'' if c['units'] == 1 else 's'} read once")
            continue
        how.append(f"{purpose}: {c['matched']} unit{'' if c['matched'] == 1 else 's'} matched "
                   f"{c['matched_what'] or 'what they should hold'}, "
                   f"{c['mixed']} in part, {c['agreeing']} by agreeing reads")
    if how:
        line += "; confirmed — " + "; ".join(how)
    if checks["disagreed_reads"]:
        where = ", ".join(f"{p} {c['reads']}" for p, c in checks["by_purpose"].items())
        line += (f"; READS DISAGREED ({where}), {checks['unresolved_reads']} unresolved "
                 "(table read_disagreements)")
    return line
