"""What an `audit verify` proved, what it could not, and what would prove the rest.

A reviewer holds a copy of the database and perhaps the host's public key, rarely the anchor
file. What the copy alone proves: every row under a signed checkpoint hashes to it, and the
checkpoints chain (by the given key: who signed). What it cannot: that nothing was cut after
its newest checkpoint — a database whose newest runs (or a run's last rows) were removed
verifies the same way — and the rows after a run's last checkpoint. Those are "not proven",
never "broken": exit 0 when nothing checked is wrong (store.verify.VerifyReport.verdict).
"""
from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from amdflash.store.verify import VerifyReport

# What the lead may adjust once `audit bundle` (issue 44) and receipts (issue 45) are in.
BUNDLE_WITNESS = ("a bundle made on the recording host ('amdflash audit bundle --run RUN -o DIR'), whose anchor "
                  "lines cover its run: amdflash audit verify --bundle DIR --key PUBFILE")


def _signed_by(report: VerifyReport) -> str:
    return "the given --key" if report.trusted else "keys the database itself records"


def _sealed_rows(report: VerifyReport) -> int:
    return report.rows - sum(report.unsealed.values()) - (report.legacy.rows if report.legacy else 0)


def proven(report: VerifyReport) -> list[str]:
    if report.verdict != "intact":
        return []
    out = []
    span = f"checkpoints up to #{report.head.id}" if report.head is not None else "no checkpoint"
    if report.key is None:
        out.append(f"every row under a checkpoint signed by {_signed_by(report)} verifies: {_sealed_rows(report)} "
                   f"row(s) of {report.runs} run(s), {span}, each checkpoint chained to the one before")
    else:
        out.append(f"every row of the run under a checkpoint signed by {_signed_by(report)} verifies: "
                   f"{_sealed_rows(report)} row(s) up to seq {report.sealed}, {span}")
        if report.ended:
            out.append("the run's end: recorded and sealed by its final checkpoint (no row of it can follow)")
    if report.anchor and report.unwitnessed is None and "entries" in report.anchor:
        out.append(f"nothing the anchor saw was removed or changed: {report.anchor}")
    if report.archived:
        out.append(f"the archived part is vouched for by its seal: {report.archived}")
    return out


def not_proven(report: VerifyReport) -> list[str]:
    if report.verdict not in ("intact", "not proven"):
        return []
    if report.verdict == "not proven":
        return [f"any row of {report.scope}: no checkpoint seals it, so no signature covers it"]
    out = []
    newest = f"#{report.head.id}" if report.head is not None else "(none)"
    if report.key is None and report.unwitnessed is not None:
        out.append(f"that the trail is complete after its newest checkpoint {newest}: no anchor was compared "
                   + (f"(the trail was appended to {report.unwitnessed} on the recording host)"
                      if report.unwitnessed else "(no checkpoint records one)")
                   + ", and a database whose newest runs or rows were cut verifies the same way")
    elif report.key is not None and not report.ended:
        out.append(f"that the run has no rows after seq {report.sealed}, its last sealed one: its end is not sealed "
                   "(still running, killed, or its host went down), and a copy cut there verifies the same way")
    if not report.trusted:
        out.append("who signed: the keys checked are the ones the database itself carries (anyone who rewrote it "
                   "could have re-signed it with a key of their own)")
    for run_id, n in report.unsealed.items():
        out.append(f"the last {n} row(s) of run {run_id}: after its last checkpoint, no signature covers them")
    if report.legacy is not None:
        out.append(f"who wrote the {report.legacy.rows} legacy row(s): recorded by an older amdflash, unsigned")
    return out


def would_prove(report: VerifyReport, command: str) -> list[str]:
    """Commands (to paste) that would prove what `not_proven` lists."""
    gaps = not_proven(report)
    if not gaps:
        return []
    out = []
    if not report.trusted:
        out.append(f"the recording host's public key ('amdflash audit key -o host.pub' there): {command} --key "
                   "host.pub")
    if report.verdict == "intact" and (report.unwitnessed is not None or (report.key is not None
                                                                          and not report.ended)):
        where = f" ({report.unwitnessed} on the recording host)" if report.unwitnessed else ""
        out.append(f"the anchor file{where}, copied beside the database or named: {command} --anchor FILE")
        out.append(f"the central record, if the recording host pushed to one: {command} --central URL")
        out.append(BUNDLE_WITNESS)
    return out


def summary_lines(report: VerifyReport, command: str) -> list[str]:
    lines = [f"proven      {p}" for p in proven(report)]
    lines += [f"not proven  {p}" for p in not_proven(report)]
    lines += [f"would prove {p}" for p in would_prove(report, command)]
    return lines


def as_json(report: VerifyReport, command: str) -> dict[str, Any]:
    """The verdict as fields: the same facts as the text."""
    head = {"id": report.head.id, "hash": report.head.hash.hex()} if report.head is not None else None
    return {"verdict": report.verdict, "scope": report.scope, "problem": report.problem, "rows": report.rows,
            "runs": report.runs, "checkpoints": report.checkpoints - report.legacy_checkpoints, "head": head,
            "signers": report.signers, "trusted_key": report.trusted,
            "proven": proven(report), "not_proven": not_proven(report), "would_prove": would_prove(report, command),
            "anchor": report.anchor, "anchor_recorded": report.unwitnessed or None,
            "unsealed_rows": report.unsealed, "run_end_sealed": report.ended, "seconds": round(report.seconds, 3)}


def verify_command(db: str, run: str | None, keys: list[str] | None) -> str:
    """The `audit verify` line a verdict names, to paste."""
    argv = ["amdflash", "--db", db, "audit", "verify"]
    if run:
        argv += [f"--run={run}"] if run.startswith("-") else ["--run", run]
    for k in keys or ():
        argv += ["--key", k]
    return shlex.join(argv)
