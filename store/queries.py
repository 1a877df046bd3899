"""Read side of the audit trail: run listings and the per-run report.

Every reader runs inside one read transaction (`verify.snapshot`): a writer appending
meanwhile is invisible to it, so what it reports is one consistent state of the trail.
"""
from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sqlite_utils
from amdflash.store import schema
from amdflash.store.verify import snapshot


class RunNotFound(LookupError):
    pass


def open_readonly(path: str) -> sqlite_utils.Database:
    """The database, read-only; SchemaError unless it is an amdflash database of this version."""
    conn = schema.connect(path, readonly=True)
    found = schema.version(conn)
    if found != schema.SCHEMA_VERSION:
        conn.close()
        if found is None:
            raise schema.SchemaError(f"{path} is not an amdflash audit database")
        raise schema.SchemaError(f"audit database {path} has schema version {found}; this amdflash reads "
                                 f"{schema.SCHEMA_VERSION}")
    return sqlite_utils.Database(conn)


def _last_status(db: sqlite_utils.Database, run_id: str) -> dict[str, Any]:
    rows = list(db.query("SELECT * FROM run_status WHERE run_id = ? ORDER BY seq DESC LIMIT 1", [run_id]))
    return rows[0] if rows else {}


def resolve_run(db: sqlite_utils.Database, run_id: str) -> str:
    rows = [r["run_id"] for r in db.query("SELECT run_id FROM runs WHERE substr(run_id, 1, ?) = ? ORDER BY seq",
                                          [len(run_id), run_id])]
    if not rows:
        raise RunNotFound(f"no run {run_id!r} in the audit database")
    if len(rows) > 1 and run_id not in rows:
        raise RunNotFound(f"run id {run_id!r} is ambiguous ({len(rows)} runs start with it)")
    return run_id if run_id in rows else rows[0]


def runs(db: sqlite_utils.Database) -> list[dict[str, Any]]:
    """Every run, oldest first. A run that recorded no end but was resumed by a later run is
    over (its host died): it shows as "interrupted", never as "running" for ever."""
    with snapshot(db.conn):
        rows = [dict(r) for r in db.query("""
            SELECT r.run_id, r.command, r.board_spec, r.at AS started, r.image_sha256, r.resumes_run_id,
                   (SELECT status FROM run_status s WHERE s.run_id = r.run_id ORDER BY seq DESC LIMIT 1) AS status,
                   (SELECT at FROM run_status s WHERE s.run_id = r.run_id ORDER BY seq DESC LIMIT 1) AS updated,
                   (SELECT unique_id FROM boards b WHERE b.run_id = r.run_id ORDER BY seq LIMIT 1) AS unique_id,
                   (SELECT emulated FROM boards b WHERE b.run_id = r.run_id ORDER BY seq LIMIT 1) AS emulated
            FROM runs r ORDER BY r.seq""")]
    resumed = {r["resumes_run_id"] for r in rows if r["resumes_run_id"]}
    for r in rows:
        r["status"] = shown_status(r["status"], r["run_id"] in resumed)
    return rows


def shown_status(recorded: str | None, resumed: bool) -> str:
    """A run's status as shown: its last recorded one, except that a run with no end on record
    ("running", or nothing yet) that a later run resumed has ended, interrupted."""
    status = recorded or "running"
    return "interrupted" if status == "running" and resumed else status


def latest_unfinished(db: sqlite_utils.Database, board_spec: str) -> str | None:
    """The newest flash/resume run of this board that did not succeed."""
    for r in reversed(runs(db)):
        if r["board_spec"] == board_spec and r["command"] in ("flash", "resume"):
            return None if r["status"] == "succeeded" else r["run_id"]
    return None


def unit_states(db: sqlite_utils.Database, run_id: str) -> dict[int, dict[str, Any]]:
    """The latest state row of every unit of the run."""
    states: dict[int, dict[str, Any]] = {}
    for u in db.query("SELECT seq, address, size, state, action, detail FROM units WHERE run_id = ? ORDER BY seq",
                      [run_id]):
        prev = states.get(u["address"])
        action = u["action"] if u["state"] != "verified" or not prev else prev["action"]
        intended = (prev or {}).get("intended", False) or u["state"] not in ("planned", "verified")
        states[u["address"]] = {**u, "action": action, "intended": intended}
    return states


def run_chain(db: sqlite_utils.Database, run_id: str) -> list[str]:
    """Run ids from the original flash to this one, following resumes."""
    chain = [run_id]
    while True:
        rows = list(db.query("SELECT resumes_run_id FROM runs WHERE run_id = ?", [chain[-1]]))
        parent = rows[0]["resumes_run_id"] if rows else None
        if not parent or parent in chain:
            return list(reversed(chain))
        chain.append(parent)


def resumed_by(db: sqlite_utils.Database, run_id: str) -> list[dict[str, Any]]:
    """The runs that resumed this one, with their status."""
    return [{"run_id": r["run_id"], "status": _last_status(db, r["run_id"]).get("status", "running")}
            for r in db.query("SELECT run_id FROM runs WHERE resumes_run_id = ? ORDER BY seq", [run_id])]


def last_checkpoint(db: sqlite_utils.Database, run_id: str) -> dict[str, Any] | None:
    rows = list(db.query(
        "SELECT c.id, c.kind, c.rows, c.last_seq, c.head, c.hash, c.at, h.public_key FROM checkpoints c "
        "JOIN runs r ON r.seq = c.run LEFT JOIN hosts h ON h.id = c.host WHERE r.run_id = ? "
        "ORDER BY c.id DESC LIMIT 1", [run_id]))
    return rows[0] if rows else None


def report(db: sqlite_utils.Database, run_id: str, keyfiles: list[Path] | None = None) -> dict[str, Any]:
    """Everything a reviewer needs about one run, including its chain checked (O(the run))."""
    with snapshot(db.conn):
        return _report(db, resolve_run(db, run_id), keyfiles)


def _report(db: sqlite_utils.Database, run_id: str, keyfiles: list[Path] | None) -> dict[str, Any]:
    from amdflash.store.keys import fingerprint
    from amdflash.store.verify import verify_run

    run = next(db.query("SELECT * FROM runs WHERE run_id = ?", [run_id]))
    status = _last_status(db, run_id)
    boards = list(db.query("SELECT * FROM boards WHERE run_id = ? ORDER BY seq", [run_id]))
    board = next((b for b in reversed(boards) if b.get("chip")), boards[0] if boards else {})
    writes, transactions = counts(db.conn, run_id)
    units = [{"address": u["address"], "size": u["size"], "action": u["action"], "state": u["state"]}
             for u in sorted(unit_states(db, run_id).values(), key=lambda u: u["address"])]
    errors = list(db.query("SELECT stage, message, address, at FROM errors WHERE run_id = ? ORDER BY seq", [run_id]))
    stages = list(db.query("SELECT seq, stage, event, detail, at FROM stages WHERE run_id = ? ORDER BY seq", [run_id]))
    verifies = next(db.query(
        "SELECT count(*) AS total, sum(ok) AS ok FROM verifies WHERE run_id = ?", [run_id]))
    failed_verifies = list(db.query(
        "SELECT address, attempt, mismatch_address, flash_byte, image_byte FROM verifies "
        "WHERE run_id = ? AND ok = 0 ORDER BY seq", [run_id]))
    backups = list(db.query("SELECT sha256, size, path FROM backups WHERE run_id = ? ORDER BY seq", [run_id]))
    summary = json.loads(status["summary"]) if status.get("summary") else {}
    try:
        detail = json.loads(board["detail"]) if board.get("detail") else None
    except ValueError:
        detail = board.get("detail")
    checked = verify_run(db.conn, run_id, keyfiles)
    cp = last_checkpoint(db, run_id)
    resumes = resumed_by(db, run_id)
    return {
        "run_id": run_id,
        "command": run["command"],
        "arguments": json.loads(run["arguments"] or "{}"),
        "status": shown_status(status.get("status"), bool(resumes)),
        "emulated": bool(board.get("emulated")) if board else None,
        "started": run["at"],
        "ended": status.get("at") if status.get("status") != "running" else None,
        "operator": run["operator"],
        "operator_claimed": run["operator_claimed"],
        "host": run["host"],
        "machine_id": run["machine_id"],
        "tool_version": run["tool_version"],
        "tool_revision": run["tool_revision"],
        "clock_sync": run["clock_sync"],
        "resumes_run_id": run["resumes_run_id"],
        "resumed_by": resumes,
        "finished_by": finished_by(db, run_id),
        "board": {
            "spec": run["board_spec"],
            "emulated": bool(board.get("emulated")) if board else None,
            "jedec": board.get("jedec"),
            "chip": board.get("chip"),
            "unique_id": board.get("unique_id"),
            "bridge_serial": board.get("bridge_serial"),
            "pci_address": board.get("pci_address"),
            "sr1": board.get("sr1"), "sr2": board.get("sr2"), "sr3": board.get("sr3"),
            "protection": board.get("protection"),
            "detail": detail,
        },
        "image_path": run["image_path"],
        "image_sha256": run["image_sha256"],
        "result_sha256": status.get("result_sha256"),
        "units": units,
        "register_writes": writes,
        "spi_transactions": transactions,
        "verifies": {"total": verifies["total"] or 0, "ok": verifies["ok"] or 0, "failed": failed_verifies},
        "backups": backups,
        "stages": stages,
        "errors": errors,
        "error": status.get("detail") if status.get("status") != "succeeded" else None,
        "summary": summary,
        "chain": {
            "ok": checked.ok,
            "problem": checked.problem,
            "rows": checked.rows,
            "checkpoints": checked.checkpoints,
            "checkpoint": cp["id"] if cp else None,
            "sealed": cp["kind"] if cp else None,
            "head": cp["head"].hex() if cp and cp["head"] else None,
            "checkpoint_hash": cp["hash"].hex() if cp else None,
            "signed_by": fingerprint(cp["public_key"]) if cp and cp["public_key"] else None,
            "unsealed_rows": sum(checked.unsealed.values()),
            "signature": ("verified against the given key" if checked.trusted else
                          "valid under the key recorded in the database (not checked against a trusted key)")
            if checked.ok else "not valid: " + str(checked.problem),
        },
    }


def counts(conn: sqlite3.Connection, run_id: str) -> tuple[int, int]:
    """(register writes, SPI transactions) of a run, counted from the compact rows."""
    span = _span(conn, run_id)
    if span is None:
        return 0, 0
    key, first, last = span
    writes, transactions = conn.execute(
        f"SELECT coalesce(sum(length(coalesce(shape, '{schema.DEFAULT_SHAPE}'))), 0), "
        "coalesce(sum(1 + (again IS NOT NULL)), 0) FROM log_spi WHERE seq BETWEEN ? AND ? AND run = ?",
        (first, last, key)).fetchone()
    raw = conn.execute("SELECT count(*) FROM log_writes WHERE seq BETWEEN ? AND ? AND run = ?",
                       (first, last, key)).fetchone()[0]
    return writes + raw, transactions


def _span(conn: sqlite3.Connection, run_id: str) -> tuple[int, int, int] | None:
    """(run key, first seq, last seq) of a run's rows: from its runs row to its final checkpoint
    (or the last row recorded, for a run that recorded no end)."""
    row = conn.execute(f"SELECT r.seq, {schema.RUN_END_SQL} FROM runs r WHERE r.run_id = ?", (run_id,)).fetchone()
    if row is None:
        return None
    return row[0], row[0], row[1]


def register_snapshot(db: sqlite_utils.Database, run_id: str, label: str) -> dict[int, int] | None:
    rows = list(db.query("SELECT registers FROM register_snapshots WHERE run_id = ? AND label = ? ORDER BY seq LIMIT 1",
                         [run_id, label]))
    if not rows:
        return None
    return {int(k, 16): v for k, v in json.loads(rows[0]["registers"]).items()}


def has_intents(db: sqlite_utils.Database, run_id: str) -> bool:
    return bool(list(db.query("SELECT 1 FROM units WHERE run_id = ? AND state = 'intent' LIMIT 1", [run_id])))


def finished_by(db: sqlite_utils.Database, run_id: str) -> str | None:
    """The run that completed this run's work through resumes, if any."""
    todo = [run_id]
    while todo:
        current = todo.pop()
        for r in db.query("SELECT run_id FROM runs WHERE resumes_run_id = ?", [current]):
            if _last_status(db, r["run_id"]).get("status") == "succeeded":
                return r["run_id"]
            todo.append(r["run_id"])
    return None


# -- a run's register writes and transactions ---------------------------------------------------

def iter_register_writes(db: sqlite_utils.Database, run_id: str,
                         until: int | None = None) -> Iterator[tuple[int, int, int, int | None, bytes | None]]:
    """(seq, n, offset, value, data) of the run's register writes in issue order (n)."""
    yield from db.conn.execute(
        "SELECT seq, n, offset, value, data FROM register_writes WHERE run_id = ? AND n <= ? ORDER BY n",
        [run_id, until if until is not None else 2 ** 62])


def register_write_order(db: sqlite_utils.Database, run_id: str) -> Iterator[tuple[int, int]]:
    """(seq, n) of the run's register writes in seq order: how they interleave with other rows.
    The writes of one ROM_SW transaction share the seq of its row."""
    yield from db.conn.execute("SELECT seq, n FROM register_writes WHERE run_id = ? ORDER BY seq, n", [run_id])


def transactions_between(db: sqlite_utils.Database, run_id: str, after: int, before: int) -> list[dict[str, Any]]:
    """The run's ROM_SW transactions recorded with seq in (after, before), decoded."""
    rows = [dict(r) for r in db.query(
        "SELECT t.seq, t.n, t.opcode, t.address, t.address_bytes, t.tx_len, t.rx_len, t.clock, "
        f"coalesce(s.shape, '{schema.DEFAULT_SHAPE}') AS shape FROM spi_transactions t JOIN log_spi s ON s.seq = t.seq "
        "WHERE t.run_id = ? AND t.seq > ? AND t.seq < ? ORDER BY t.seq, t.n", [run_id, after, before])]
    for i, row in enumerate(rows):
        # A row shared by a repeated transaction: each transaction's own writes.
        parts = re.findall(r"[^Nn]*[Nn]", row["shape"]) or [row["shape"]]
        repeat = i and rows[i - 1]["seq"] == row["seq"]
        row["writes"] = parts[min(1, len(parts) - 1)] if repeat else parts[0]
    return rows


def writes_since(db: sqlite_utils.Database, run_id: str, unique_id: str, lineage: list[str]) -> list[dict[str, Any]]:
    """Runs that may have written the board (same flash unique ID) after `run_id` began,
    other than those in `lineage` (the run and its resumes)."""
    start = next(db.query("SELECT min(seq) AS s FROM runs WHERE run_id = ?", [run_id]))["s"]
    rows = db.query(
        "SELECT DISTINCT r.run_id, r.command, r.at FROM runs r JOIN boards b ON b.run_id = r.run_id "
        "WHERE r.seq > ? AND b.unique_id = ? AND r.command IN ('flash', 'resume', 'ifwi-all') ORDER BY r.seq",
        [start, unique_id])
    return [dict(r) for r in rows if r["run_id"] not in lineage]
