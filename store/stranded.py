"""Runs that left a board's registers changed, and the values to put back.

Every run records, before it writes anything, the board it reached (a stages row
`registers`/start whose detail is the board key) and the registers as it found them
(snapshot "before"); a run that put them back records the snapshot "after restore". A
later run that dealt with another run's registers (put them back, found them already
back, or found them changed by something else since) records `restore_stranded`/end
naming that run.

A board's registers are stranded when the newest run on it that took a "before" snapshot
has neither: then its "before" values are the truth. Runs without a "before" snapshot
changed nothing of their own (they died while putting an older run's values back) and are
passed over, so the truth is never taken from a board that was already changed.
"""
from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path

import sqlite_utils
from amdflash.store.queries import register_snapshot
from amdflash.store.reading import TrailSource, reading
from amdflash.store.run_rows import open_run
from amdflash.store.verify import snapshot


@dataclass(frozen=True)
class StrandedRun:
    run_id: str
    command: str
    registers: dict[int, int]     # as the run found them, before it changed anything
    unique_id: str | None         # of the flash, if the run got as far as identifying it
    outcome: str                  # how the run ended, for the operator


def board_key(spec: str, serial: str | None) -> str:
    """What identifies a board before anything is written to it: the bridge (or emulated
    board) serial where there is one, else the transport's own spec (PCI address)."""
    return f"serial:{serial}" if serial else spec


def find_stranded(source: TrailSource, key: str, current_run: str) -> StrandedRun | None:
    """The run whose registers are stranded on the board `key`, read through the command's trail
    (store.reading.Trail) or, for a tool run alone, the file at a path."""
    if not source or (isinstance(source, str) and not Path(source).exists()):
        return None
    try:
        with reading(source) as db, snapshot(db.conn):
            return _find(db, key, current_run)
    except sqlite3.OperationalError:
        return None   # not an amdflash database yet (no tables): nothing was stranded


def _find(db: sqlite_utils.Database, key: str, current_run: str) -> StrandedRun | None:
    conn = db.conn
    runs = [r for (r,) in conn.execute(
        "SELECT run_id FROM stages WHERE stage = 'registers' AND event = 'start' AND detail = ? "
        "ORDER BY seq DESC", [key])]
    settled = set()
    for (detail,) in conn.execute(
            "SELECT detail FROM stages WHERE stage = 'restore_stranded' AND event = 'end'"):
        try:
            settled.add(json.loads(detail)["run"])
        except (TypeError, ValueError, KeyError):
            continue
    for run_id in dict.fromkeys(runs):
        if run_id == current_run:
            continue
        if not conn.execute("SELECT 1 FROM register_snapshots WHERE run_id = ? AND label = 'before' LIMIT 1",
                            [run_id]).fetchone():
            continue
        # Its "before" values are about to be written to the board: only from a run whose
        # record verifies (RunUnverified otherwise: nothing is written), and only as a
        # checkpoint seals them (a snapshot in an unsealed tail vouches for nothing).
        rows = open_run(conn, run_id)
        before = register_snapshot(db, rows, "before", sealed_only=True)
        if before is None:
            continue
        if register_snapshot(db, rows, "after restore") is not None or run_id in settled:
            return None
        command = conn.execute("SELECT command FROM runs WHERE seq = ?", [rows.key]).fetchone()
        uid = conn.execute(f"SELECT unique_id FROM boards WHERE {rows.sql} AND unique_id IS NOT NULL "
                           "ORDER BY seq LIMIT 1", rows.args).fetchone()
        status = conn.execute(f"SELECT status FROM run_status WHERE {rows.sql} ORDER BY seq DESC LIMIT 1",
                              rows.args).fetchone()
        if status is None or status[0] == "running":
            outcome = "it never finished: its host was killed or lost"
        else:
            outcome = f"it {status[0]} without putting them back"
        return StrandedRun(run_id, command[0] if command else "?", before, uid[0] if uid else None, outcome)
    return None
