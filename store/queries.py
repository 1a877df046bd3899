"""Read side of the audit trail: run listings and the per-run report."""
from __future__ import annotations

import json
import sqlite3
from typing import Any, Iterator

import sqlite_utils


class RunNotFound(LookupError):
    pass


def open_readonly(path: str) -> sqlite_utils.Database:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30.0)
    return sqlite_utils.Database(conn)


def _last_status(db: sqlite_utils.Database, run_id: str) -> dict[str, Any]:
    rows = list(db.query("SELECT * FROM run_status WHERE run_id = ? ORDER BY seq DESC LIMIT 1", [run_id]))
    return rows[0] if rows else {}


def resolve_run(db: sqlite_utils.Database, run_id: str) -> str:
    rows = [r["run_id"] for r in db.query("SELECT run_id FROM runs WHERE run_id LIKE ? ORDER BY seq",
                                          [run_id + "%"])]
    if not rows:
        raise RunNotFound(f"no run {run_id!r} in the audit database")
    if len(rows) > 1 and run_id not in rows:
        raise RunNotFound(f"run id {run_id!r} is ambiguous ({len(rows)} runs start with it)")
    return run_id if run_id in rows else rows[0]


def runs(db: sqlite_utils.Database) -> list[dict[str, Any]]:
    out = []
    for r in db.query("""
        SELECT r.run_id, r.command, r.board_spec, r.at AS started, r.image_sha256, r.resumes_run_id,
               (SELECT status FROM run_status s WHERE s.run_id = r.run_id ORDER BY seq DESC LIMIT 1) AS status,
               (SELECT at FROM run_status s WHERE s.run_id = r.run_id ORDER BY seq DESC LIMIT 1) AS updated,
               (SELECT unique_id FROM boards b WHERE b.run_id = r.run_id ORDER BY seq LIMIT 1) AS unique_id
        FROM runs r ORDER BY r.seq"""):
        out.append(dict(r))
    return out


def latest_unfinished(db: sqlite_utils.Database, board_spec: str) -> str | None:
    """The newest flash/resume run of this board that did not succeed."""
    for r in reversed(runs(db)):
        if r["board_spec"] == board_spec and r["command"] in ("flash", "resume"):
            return None if r["status"] == "succeeded" else r["run_id"]
    return None


def unit_states(db: sqlite_utils.Database, run_id: str) -> dict[int, dict[str, Any]]:
    """The latest state row of every unit of the run."""
    states: dict[int, dict[str, Any]] = {}
    for u in db.query("SELECT address, size, state, action, detail FROM units WHERE run_id = ? ORDER BY seq",
                      [run_id]):
        prev = states.get(u["address"])
        action = u["action"] if u["state"] != "verified" or not prev else prev["action"]
        states[u["address"]] = {**u, "action": action}
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


def report(db: sqlite_utils.Database, run_id: str) -> dict[str, Any]:
    run_id = resolve_run(db, run_id)
    run = next(db.query("SELECT * FROM runs WHERE run_id = ?", [run_id]))
    status = _last_status(db, run_id)
    boards = list(db.query("SELECT * FROM boards WHERE run_id = ? ORDER BY seq", [run_id]))
    board = boards[0] if boards else {}
    first, last = run_seq_range(db, run_id)   # the bulk tables have no run_id index
    count = next(db.query("SELECT count(*) AS n FROM register_writes WHERE seq BETWEEN ? AND ? AND run_id = ?",
                          [first, last, run_id]))["n"]
    spi = next(db.query("SELECT count(*) AS n FROM spi_transactions WHERE seq BETWEEN ? AND ? AND run_id = ?",
                        [first, last, run_id]))["n"]
    units = [{"address": u["address"], "size": u["size"], "action": u["action"], "state": u["state"]}
             for u in sorted(unit_states(db, run_id).values(), key=lambda u: u["address"])]
    errors = list(db.query("SELECT stage, message, address, at FROM errors WHERE run_id = ? ORDER BY seq", [run_id]))
    stages = list(db.query("SELECT stage, event, detail, at FROM stages WHERE run_id = ? ORDER BY seq", [run_id]))
    verifies = next(db.query(
        "SELECT count(*) AS total, sum(ok) AS ok FROM verifies WHERE run_id = ?", [run_id]))
    failed_verifies = list(db.query(
        "SELECT address, attempt, mismatch_address, flash_byte, image_byte FROM verifies "
        "WHERE run_id = ? AND ok = 0 ORDER BY seq", [run_id]))
    backups = list(db.query("SELECT sha256, size, path FROM backups WHERE run_id = ? ORDER BY seq", [run_id]))
    summary = json.loads(status["summary"]) if status.get("summary") else {}
    return {
        "run_id": run_id,
        "command": run["command"],
        "arguments": json.loads(run["arguments"] or "{}"),
        "status": status.get("status", "running"),
        "started": run["at"],
        "ended": status.get("at") if status.get("status") != "running" else None,
        "operator": run["operator"],
        "host": run["host"],
        "tool_version": run["tool_version"],
        "resumes_run_id": run["resumes_run_id"],
        "board": {
            "spec": run["board_spec"],
            "jedec": board.get("jedec"),
            "chip": board.get("chip"),
            "unique_id": board.get("unique_id"),
            "bridge_serial": board.get("bridge_serial"),
            "pci_address": board.get("pci_address"),
            "sr1": board.get("sr1"), "sr2": board.get("sr2"), "sr3": board.get("sr3"),
            "protection": board.get("protection"),
        },
        "image_path": run["image_path"],
        "image_sha256": run["image_sha256"],
        "result_sha256": status.get("result_sha256"),
        "units": units,
        "register_writes": count,
        "spi_transactions": spi,
        "verifies": {"total": verifies["total"] or 0, "ok": verifies["ok"] or 0, "failed": failed_verifies},
        "backups": backups,
        "stages": stages,
        "errors": errors,
        "error": status.get("detail") if status.get("status") != "succeeded" else None,
        "summary": summary,
    }


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


# -- a run's bulk rows, by seq range ---------------------------------------------------------
# register_writes and spi_transactions carry no run_id index (store/schema.py): a run's rows
# are found by walking the seq primary key between the run's first and last rows, which
# stays cheap however many other runs the database holds.

def run_seq_range(db: sqlite_utils.Database, run_id: str) -> tuple[int, int]:
    """(first, last) seq that can hold rows of this run.

    A run that never recorded its final status (killed host) may have rows up to the chain
    head; rows of other runs inside the range are told apart by run_id.
    """
    first = next(db.query("SELECT min(seq) AS s FROM runs WHERE run_id = ?", [run_id]))["s"]
    if first is None:
        raise RunNotFound(f"no run {run_id!r} in the audit database")
    status = _last_status(db, run_id)
    if status and status.get("status") != "running":
        return first, status["seq"]
    # chain_head is updated in the transaction that inserts rows: it is the last seq there is.
    head = list(db.query("SELECT seq FROM chain_head WHERE id = 1"))
    return first, max(status.get("seq", first), head[0]["seq"] if head else 2 ** 62)


def register_writes_before(db: sqlite_utils.Database, run_id: str, seq: int, limit: int = 32) -> list[dict[str, Any]]:
    """The run's last `limit` register writes recorded before `seq`, oldest first."""
    first, last = run_seq_range(db, run_id)
    rows = db.conn.execute(
        "SELECT seq, n, offset, value, data, clock FROM register_writes "
        "WHERE seq BETWEEN ? AND ? AND run_id = ? ORDER BY seq DESC LIMIT ?",
        [first, min(seq - 1, last), run_id, limit]).fetchall()
    keys = ("seq", "n", "offset", "value", "data", "clock")
    return [dict(zip(keys, r)) for r in reversed(rows)]


def iter_register_writes(db: sqlite_utils.Database, run_id: str,
                         until: int | None = None) -> Iterator[tuple[int, int, int, int | None, bytes | None]]:
    """(seq, n, offset, value, data) of the run's register writes in issue order (n)."""
    first, last = run_seq_range(db, run_id)
    cursor = db.conn.execute(
        "SELECT seq, n, offset, value, data FROM register_writes "
        "WHERE seq BETWEEN ? AND ? AND run_id = ? AND n <= ? ORDER BY n",
        [first, last, run_id, until if until is not None else 2 ** 62])
    yield from cursor


def register_write_order(db: sqlite_utils.Database, run_id: str) -> Iterator[tuple[int, int]]:
    """(seq, n) of the run's register writes in seq order: how they interleave with other rows."""
    first, last = run_seq_range(db, run_id)
    yield from db.conn.execute(
        "SELECT seq, n FROM register_writes WHERE seq BETWEEN ? AND ? AND run_id = ? ORDER BY seq",
        [first, last, run_id])


def writes_since(db: sqlite_utils.Database, run_id: str, unique_id: str, lineage: list[str]) -> list[dict[str, Any]]:
    """Runs that may have written the board (same flash unique ID) after `run_id` began,
    other than those in `lineage` (the run and its resumes)."""
    start = next(db.query("SELECT min(seq) AS s FROM runs WHERE run_id = ?", [run_id]))["s"]
    rows = db.query(
        "SELECT DISTINCT r.run_id, r.command, r.at FROM runs r JOIN boards b ON b.run_id = r.run_id "
        "WHERE r.seq > ? AND b.unique_id = ? AND r.command IN ('flash', 'resume', 'ifwi-all') ORDER BY r.seq",
        [start, unique_id])
    return [dict(r) for r in rows if r["run_id"] not in lineage]
