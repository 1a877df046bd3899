"""A board's original content as the audit trail knows it.

* `original_units`: the original content of a flash run's units, as its lineage (the run and
  its resumes) recorded it: for a resume that must rebuild the backup file.
* `board_history`: per physical board (its flash's unique ID and chip, or its spec when the
  part has no readable unique ID, as resume matches boards), the backups that hold the
  content amdflash first found there, and the newest flash of it that never finished.

Nothing here is a new record: every flash already records its backup (`backups`, one row,
with the file's SHA-256) before its first erase, and its units' states; the board's
original is the first backup of each unit any flash of the board made.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import sqlite_utils

from amdflash.store.queries import (RunNotFound, changed_nothing, first_board, lineage_changed_nothing,
                                    newest_verified, run_chain, status_of, unit_states)
from amdflash.store.run_rows import RunRows, RunUnverified, open_run
from amdflash.store.reading import Trail, TrailSource, reading
from amdflash.store.sealed_facts import SealedFacts
from amdflash.store.verify import snapshot
from amdflash.stages.drivers.flash.geometry import FLASH_SIZE, UNIT

WRITES = ("flash", "resume")
BLANK_UIDS = ("f" * 32, "0" * 32, "")      # a unique ID that tells no two boards apart


class DamagedBackup(RuntimeError):
    pass


@dataclass
class RecordedBackup:
    units: dict[int, bytes] = field(default_factory=dict)    # address -> first recorded content
    files: list[tuple[str, str]] = field(default_factory=list)   # (sha256, path) of backup files


def original_units(path: TrailSource, lineage: list[str], addresses: list[int]) -> RecordedBackup:
    """Each unit's first backup row across the lineage, in record order, checked against its
    recorded SHA-256. Every run reads a unit's backup before anything erases it, so the first
    row is the content before the lineage touched it.

    Only rows a checkpoint seals, of runs that verify (store.run_rows): a backup file is kept,
    or a unit's content taken, only on the word of a run whose record holds (RunUnverified
    otherwise). A unit backed up only in an unsealed tail was not erased by that run (its
    intent, which precedes any erase, is sealed first), so what the board holds now is it."""
    out = RecordedBackup()
    if not path or not lineage:
        return out
    wanted = set(addresses)
    with reading(path) as db:
        with snapshot(db.conn):
            for run in [open_run(db.conn, run_id) for run_id in lineage]:
                for address, sha, data in db.conn.execute(
                        f"SELECT address, sha256, data FROM backup_units WHERE {run.sealed_sql} ORDER BY seq",
                        run.sealed_args):
                    if address not in wanted or address in out.units:
                        continue
                    if hashlib.sha256(data or b"").hexdigest() != sha:
                        raise DamagedBackup(f"the backup of unit {address:#08x} recorded by run {run.run_id} does not "
                                            "match its recorded SHA-256: the audit database is damaged (see 'amdflash "
                                            "audit verify')")
                    out.units[address] = bytes(data)
                out.files += [(sha, p) for sha, p in db.conn.execute(
                    f"SELECT sha256, path FROM backups WHERE {run.sealed_sql} ORDER BY seq", run.sealed_args)]
    return out


# -- the board's original, across runs -----------------------------------------------------------

@dataclass(frozen=True)
class Backup:
    """A backup file a flash run recorded (sealed), and the sectors it holds."""
    run_id: str
    path: str
    sha256: str
    size: int
    start_sector: int = 0

    @property
    def whole(self) -> bool:
        return self.size == FLASH_SIZE and self.start_sector == 0

    @property
    def sector_count(self) -> int:
        return self.size // UNIT

    def intact(self) -> bool:
        """Whether the file still holds exactly what the run recorded (its SHA-256)."""
        try:
            with open(self.path, "rb") as f:
                return hashlib.file_digest(f, "sha256").hexdigest() == self.sha256
        except OSError:
            return False


@dataclass(frozen=True)
class Unfinished:
    """The newest flash of a board, when it never finished (interrupted, or failed after it
    began writing) and no resume finished it."""
    run_id: str                  # the newest run of its lineage: what `resume` takes
    status: str
    lineage: tuple[str, ...]     # from the first flash to run_id
    written: int | None          # units its lineage wrote or began to write (None: its record does not verify)
    backup: Backup | None        # the lineage's own backup: the content as its first run found it


@dataclass(frozen=True)
class BoardHistory:
    original: tuple[Backup, ...] = ()   # oldest first; put back newest first, each unit ends as first found
    unfinished: Unfinished | None = None
    writes: tuple[str, ...] = ()        # the flash runs of the board since its first backup, oldest first

    @property
    def first(self) -> Backup | None:
        """The backup named as the board's original (the oldest; whole unless ranges preceded it)."""
        return self.original[0] if self.original else None


@dataclass(frozen=True)
class BoardKey:
    """How a physical board is known across runs: its flash's unique ID and chip; a part whose
    unique ID tells nothing (blank or unreadable) is known by its --board spec alone."""
    unique_id: str
    chip: str
    spec: str

    @property
    def by_uid(self) -> bool:
        return self.unique_id not in BLANK_UIDS


def board_history(path: str | Trail | sqlite_utils.Database, key: BoardKey, exclude: str | None = None) -> BoardHistory:
    """What the trail knows of the board (`path`: the command's trail, an open reader, or a
    file opened for this read): read before a flash writes anything, so `exclude` (the run
    asking) is left out."""
    if isinstance(path, sqlite_utils.Database):
        with snapshot(path.conn):
            return _history(path, key, exclude)
    with reading(path) as db:
        with snapshot(db.conn):
            return _history(db, key, exclude)


def _board_runs(db: sqlite_utils.Database, key: BoardKey) -> set[str]:
    if key.by_uid:
        found = db.conn.execute("SELECT DISTINCT run_id FROM boards WHERE unique_id = ? AND chip = ?",
                                (key.unique_id, key.chip))
    else:
        found = db.conn.execute("SELECT run_id FROM runs WHERE board_spec = ?", (key.spec,))
    return {r for (r,) in found}


def _history(db: sqlite_utils.Database, key: BoardKey, exclude: str | None) -> BoardHistory:
    mine = _board_runs(db, key)
    # Every runs row in record order (what store.queries.runs lists, without the statuses it
    # works out for every run of the trail: only the command is needed to pick the writes).
    writes = [{"run_id": run_id, "command": command} for run_id, command in db.conn.execute(
        "SELECT run_id, command FROM runs ORDER BY seq") if run_id in mine and run_id != exclude and command in WRITES]
    original: list[Backup] = []
    opened: dict[str, RunRows] = {}
    # The original and the newest flash are read from runs verified whole (a handful: the loop
    # below stops at the first whole backup, newest_verified at the newest run that wrote).
    for r in writes:       # every backup up to the first whole one: together they hold each unit as first found
        try:
            rows = opened[r["run_id"]] = open_run(db.conn, r["run_id"])
        except RunUnverified:
            continue       # nothing it recorded is taken as the board's content
        backup = _first_backup(db, rows)
        if backup is not None:
            original.append(backup)
            if backup.whole:
                break
    since = original[0].run_id if original else None
    ids = [r["run_id"] for r in writes]
    # The flashes since: every one asked whether it wrote, each checked only where its answer
    # lies (store.sealed_facts) — one verified whole each would make a board's info and flash
    # cost every earlier flash of it again, quadratic over the board's life on a line.
    facts = SealedFacts(db.conn)
    changed = tuple(r for r in ids[ids.index(since):] if r == since or _wrote(db, r, opened, facts, key)) \
        if since else ()
    # The newest run that wrote (a refused one wrote nothing), as its own verified rows say: a
    # run that does not verify or that no checkpoint seals (INSERTed without the key, even
    # with a real run's id) neither hides an unfinished flash nor stands in for one.

    def wrote_this_board(own: dict[str, Any], rows: RunRows | None) -> bool:
        if own["command"] not in WRITES:
            return False
        if not key.by_uid or rows is None:      # one that does not verify is named, whatever it claims
            return rows is None or bool(own["board_spec"] == key.spec)
        board = first_board(db, rows, ("unique_id", "chip"))
        return board is not None and (board["unique_id"], board["chip"]) == (key.unique_id, key.chip)

    # A flash stopped before it changed the flash (its whole lineage) is looked past as a refused
    # one is: it is not unfinished, and an older unfinished flash under it still is.
    newest = newest_verified(db, [r["run_id"] for r in writes], wrote_this_board, ("refused",), opened,
                             lineage_changed_nothing)
    unfinished = _unfinished(db, {"run_id": newest[0], "status": newest[1] or "not verified"}) if newest else None
    return BoardHistory(tuple(original), unfinished, changed)


def _wrote(db: sqlite_utils.Database, run_id: str, opened: dict[str, RunRows], facts: SealedFacts,
           key: BoardKey) -> bool:
    """Whether a flash run of the board is on record as writing it: its rows verify, a
    checkpoint seals some of them (the writer seals before the first write), and its own
    sealed rows do not say it was refused (a refused run wrote nothing) nor that it stopped
    before it changed the flash (queries.wrote_nothing).

    A run sealed as ended that succeeded or was refused is answered from the segments holding
    its runs row, the boards row naming this board and its end, each rebuilt against the head
    its checkpoint signed (store.sealed_facts): those are all the answer rests on. Any other —
    failed or interrupted (whether it changed the flash rests on all its units' rows), not
    ended, or one those segments do not vouch for — is verified whole, as before."""
    if run_id not in opened:
        ended = facts.ended(run_id, (key.unique_id, key.chip) if key.by_uid else None)
        if ended is not None and ended.command in WRITES and ended.status in ("succeeded", "refused") and \
                (key.by_uid or ended.board_spec == key.spec):
            return ended.status == "succeeded"
    try:
        rows = opened.get(run_id) or open_run(db.conn, run_id)
    except RunUnverified:
        return False
    if rows.sealed is None:
        return False
    status = status_of(db, rows)
    return status != "refused" and not (status in ("failed", "interrupted") and changed_nothing(db, rows))


def _unfinished(db: sqlite_utils.Database, newest: dict[str, Any]) -> Unfinished | None:
    if newest["status"] in ("succeeded", "running"):
        return None
    try:
        lineage = run_chain(db, newest["run_id"])
    except (RunUnverified, RunNotFound):     # a run of its lineage does not verify, or was archived
        return Unfinished(newest["run_id"], newest["status"], (newest["run_id"],), None, None)
    if all(rows.sealed is None for rows in lineage):
        return None        # no checkpoint seals a row: it wrote nothing (writes are sealed first), nor can resume
    touched: set[int] = set()      # units some run of the lineage meant to write (intent on record)
    for rows in lineage:
        touched |= {a for a, u in unit_states(db, rows, sealed_only=True).items() if u["intended"]}
    written = len(touched)
    if all(changed_nothing(db, rows) for rows in lineage):
        # Failed or stopped (Ctrl-C, killed) before it changed anything — no unit's erase begun,
        # no status register written: the board is as it found it, and nothing is unfinished.
        return None
    backup = next((b for b in map(lambda rows: _first_backup(db, rows), lineage) if b is not None), None)
    return Unfinished(newest["run_id"], newest["status"], tuple(r.run_id for r in lineage), written, backup)


def _first_backup(db: sqlite_utils.Database, rows: RunRows) -> Backup | None:
    found = db.conn.execute(f"SELECT sha256, size, path FROM backups WHERE {rows.sealed_sql} ORDER BY seq LIMIT 1",
                            rows.sealed_args).fetchone()
    if not found:
        return None
    sha, size, path = found
    (arguments,) = db.conn.execute("SELECT arguments FROM runs WHERE seq = ?", (rows.key,)).fetchone()
    try:
        start = int(json.loads(arguments or "{}").get("start_sector") or 0)
    except (ValueError, TypeError, AttributeError):
        start = 0
    return Backup(rows.run_id, path, sha, int(size), 0 if size == FLASH_SIZE else start)
