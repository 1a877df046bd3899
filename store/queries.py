"""Read side of the audit trail: run listings and the per-run report.

Every reader runs inside one read transaction (`verify.snapshot`): a writer appending
meanwhile is invisible to it, so what it reports is one consistent state of the trail.
"""
from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import sqlite_utils
from amdflash.store import schema
from amdflash.store.chain import LEGACY, Broken
from amdflash.store.run_rows import RunRows, RunUnverified, open_run
from amdflash.store.status import ENDS, PROCESS_STAGE, run_status
from amdflash.store.status_seal import sealed_statuses
from amdflash.store.verify import VerifyReport, run_key, snapshot


LEGACY_RUN = ("recorded by an older amdflash, unsigned: its rows are verified only by their version-1 chain, "
              "checked when the trail was upgraded; nothing signs them")


class RunNotFound(LookupError):
    pass


def open_readonly(path: str) -> sqlite_utils.Database:
    """The database, read-only: store.reading.open_trail, the one way in (one connection that
    writes nothing beside the file, store.read_only); SchemaError (its TrailRefused) unless it
    is an amdflash database of this version."""
    from amdflash.store.reading import open_trail

    return open_trail(path, strict=False)


def _last_status(db: sqlite_utils.Database, rows: RunRows) -> dict[str, Any]:
    found = list(db.query(f"SELECT * FROM run_status WHERE {rows.sql} ORDER BY seq DESC LIMIT 1", rows.args))
    return found[0] if found else {}


def _db_file(db: sqlite_utils.Database) -> str:
    """The file the connection reads (the operator needs to know which database was searched)."""
    from amdflash.store.read_only import source_path

    return source_path(db.conn) or "(in memory)"


def resolve_run(db: sqlite_utils.Database, run_id: str) -> str:
    rows = list(dict.fromkeys(r["run_id"] for r in db.query(
        "SELECT run_id FROM runs WHERE substr(run_id, 1, ?) = ? ORDER BY seq", [len(run_id), run_id])))
    if not rows:
        raise RunNotFound(f"no run {run_id!r} in the audit database {_db_file(db)}")
    if len(rows) > 1 and run_id not in rows:
        raise RunNotFound(f"run id {run_id!r} is ambiguous ({len(rows)} runs start with it)")
    return run_id if run_id in rows else rows[0]


def runs(db: sqlite_utils.Database, superseded: bool = True) -> list[dict[str, Any]]:
    """Every run, oldest first, with its status as store.status.run_status decides it (a run
    whose process is gone is "interrupted", never "running" for ever), the detail of its last
    status row (`reason`: the error or refusal) and, for a run that did not succeed, the resume
    that finished its work (`fixed_by`) or else (`superseded`: worked out) the later run that
    wrote its board since (`superseded_by`). One query: a trail of many runs is listed in one
    pass; a run is verified only where a decision needs it."""
    with snapshot(db.conn):
        rows = [dict(r) for r in db.query("""
            SELECT r.seq, r.run_id, r.command, r.board_spec, r.at AS started, r.image_sha256, r.resumes_run_id,
                   r.machine_id, s.status, s.seq AS status_seq, s.at AS updated, s.detail AS reason, b.unique_id,
                   b.emulated,
                   CASE WHEN s.status IN (?, ?, ?, ?) THEN NULL ELSE
                     (SELECT p.detail FROM stages p WHERE p.run_id = r.run_id AND p.stage = ? ORDER BY p.seq
                      LIMIT 1) END AS process
            FROM runs r
            LEFT JOIN run_status s ON s.seq = (SELECT max(x.seq) FROM run_status x WHERE x.run_id = r.run_id)
            LEFT JOIN boards b ON b.seq = (SELECT min(y.seq) FROM boards y WHERE y.run_id = r.run_id)
            ORDER BY r.seq""", [*ENDS, PROCESS_STAGE])]
        # A resume speaks for the run it resumes (makes it "resumed", "fixed by" it) only as a
        # report's related runs do (_Related): verified, through its own runs row, with its
        # status from its own sealed rows. Rows INSERTed without the key vouch for nothing.
        related = _Related(db)
        said = {r["seq"]: related.speaks(r["run_id"], r["seq"]) for r in rows if r["resumes_run_id"]}
        resumed = {r["resumes_run_id"] for r in rows if said.get(r["seq"]) is not None}
        legacy = {r for (r,) in db.conn.execute("SELECT DISTINCT run_id FROM checkpoints WHERE kind = ?", (LEGACY,))}
        # A status is fact only where a signed checkpoint seals its row (store.status_seal): one
        # relabelled by an UPDATE, or INSERTed after the run's seals, is shown as not verified.
        sealed = sealed_statuses(db.conn, [(r["run_id"], r["seq"], r["status_seq"]) for r in rows
                                           if r["status_seq"] is not None and r["run_id"] not in legacy])
        for r in rows:
            r["legacy"] = r["run_id"] in legacy      # an older amdflash recorded it, unsigned
            process = r.pop("process")
            recorded = r["status"]
            r["status"] = run_status(r["status"], r["run_id"] in resumed, process, r.pop("machine_id"))
            seal = sealed.get(r["seq"])
            r["status_verified"] = None if r["legacy"] else bool(seal)
            # Marked: a status row changed since its seal, or an end no seal covers (the writer
            # seals an end as it records it). A live run's first rows are not sealed yet: its
            # status (running, or interrupted once its process is gone) is not a recorded end.
            forged_end = seal is None and recorded in ENDS
            if r.pop("status_seq") is not None and not r["legacy"] and (seal is False or forged_end):
                r["recorded_status"] = r["status"]
                r["status"] = f"{r['status']} (not verified)"
            r["reason"] = r["reason"] if r["status"] != "succeeded" else None
        fixed = fixed_by([r if not r["resumes_run_id"] else {**r, "status": said[r["seq"]]}
                          for r in rows if not r["resumes_run_id"] or said[r["seq"]] is not None])
        for r in rows:
            r["fixed_by"] = fixed.get(r["run_id"])
            # A flash no resume finished, whose board a later run wrote since: its resume would be
            # refused, so what it left is no longer its business (superseded_by).
            r["superseded_by"] = (superseded_by(db, r["run_id"], related) if superseded and not r["fixed_by"]
                                  and r["command"] in WRITES and r["status"] in UNFINISHED else None)
            del r["seq"]
    return rows


def fixed_by(rows: list[dict[str, Any]]) -> dict[str, str]:
    """For each run that did not succeed, the resume (through resumes of resumes) that
    succeeded and so finished its work, from the listing's own rows (resumes_run_id, status)."""
    children: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r["resumes_run_id"]:
            children.setdefault(r["resumes_run_id"], []).append(r)
    found: dict[str, str] = {}
    for r in rows:
        if r["status"] == "succeeded" or r["run_id"] not in children:
            continue
        todo, seen = list(children[r["run_id"]]), {r["run_id"]}
        while todo:
            child = todo.pop(0)
            if child["run_id"] in seen:
                continue
            seen.add(child["run_id"])
            if child["status"] == "succeeded":
                found[r["run_id"]] = child["run_id"]
                break
            todo.extend(children.get(child["run_id"], ()))
    return found


def _process(db: sqlite_utils.Database, run_id: str, rows: RunRows | None = None) -> str | None:
    """The detail of the run's "process" row (store.status), read through `rows` when given."""
    where, args = (rows.sql, rows.args) if rows is not None else ("run_id = ?", [run_id])
    found = db.conn.execute(f"SELECT detail FROM stages WHERE {where} AND stage = ? ORDER BY seq LIMIT 1",
                            [*args, PROCESS_STAGE]).fetchone()
    return found[0] if found else None


def latest_unfinished(db: sqlite_utils.Database, board_spec: str) -> str | None:
    """The newest flash/resume run of this board that began (was not refused) and did not
    succeed, as its own verified rows say; one that does not verify is named (resuming it
    refuses, saying why), one that no checkpoint seals is passed over (newest_verified)."""
    named = [r for (r,) in db.conn.execute("SELECT run_id FROM runs WHERE board_spec = ?", (board_spec,))]

    def of_board(own: dict[str, Any], rows: RunRows | None) -> bool:
        return bool(own["board_spec"] == board_spec and own["command"] in ("flash", "resume"))

    # A refused run wrote nothing. (One stopped before it changed the flash is not unfinished either,
    # but resuming it is still the way to finish its job: a bare resume takes it.)
    newest = newest_verified(db, named, of_board, skip=("refused",))
    return None if newest is None or newest[1] == "succeeded" else newest[0]


def newest_verified(db: sqlite_utils.Database, run_ids: Iterable[str],
                    accept: Callable[[dict[str, Any], RunRows | None], bool], skip: tuple[str, ...] = (),
                    opened: dict[str, RunRows] | None = None,
                    passed_over: Callable[[sqlite_utils.Database, RunRows, str], bool] | None = None) \
        -> tuple[str, str | None] | None:
    """(run id, status) of the newest of `run_ids` — by its own runs row, the one its
    checkpoints seal, not a second row INSERTed with its id — that `accept` takes (its own
    runs row, and its rows once verified) and whose status (from its own verified rows) is
    not in `skip`. A run that does not verify is returned with status None: the caller says
    so rather than look past it. A run no checkpoint seals any of is passed over: the writer
    seals a run's rows before its first write, so it wrote nothing and vouches for nothing.
    `opened`: runs the caller already verified (each verified once: O(its rows)); `passed_over`
    (db, its rows, its status): a verified run it says True of is looked past, as a skipped one."""
    related = _Related(db)
    keyed = []
    for run_id in set(run_ids):
        try:
            keyed.append((run_key(db.conn, run_id), run_id))
        except Broken:
            continue
    for key, run_id in sorted(keyed, reverse=True):
        own = run_row(db, key)
        try:
            rows = (opened or {}).get(run_id) or open_run(db.conn, run_id)
        except RunUnverified:
            if accept(own, None):
                return run_id, None
            continue
        if rows.sealed is None or rows.key != key or not accept(own, rows):
            continue
        status = status_of(db, rows, related)
        if status not in skip and not (passed_over is not None and passed_over(db, rows, status)):
            return run_id, status
    return None


# -- what a write run changed, and which later run took its board over --------------------------

WRITES = ("flash", "resume")
WRITERS = ("flash", "resume", "ifwi-all")      # what a resume checks has not written its board since
UNFINISHED = ("failed", "interrupted")
# Stages that change the flash without a unit's intent: a CMP clear, the amdgpu driver's flash,
# the PSP bootloader's stream (ifwi-all): each on record before it begins.
OTHER_WRITES = ("clear_cmp", "psp_vbflash", "ifwi_all")


def changed_nothing(db: sqlite_utils.Database, rows: RunRows) -> bool:
    """Whether a verified run's own sealed rows show it changed nothing on the flash: no unit
    past `planned` or `verified` (a unit's intent is sealed before its erase begins, so a unit
    erased even in part, or programmed, has one), no status-register write (a CMP clear is on
    record, sealed, before it is sent) and no flash handed to the amdgpu driver or streamed to
    the PSP (OTHER_WRITES: no units). Rows in an unsealed tail never reached the board."""
    unit = db.conn.execute(f"SELECT 1 FROM units WHERE {rows.sealed_sql} AND state NOT IN ('planned', 'verified') "
                           "LIMIT 1", rows.sealed_args).fetchone()
    other = db.conn.execute(f"SELECT 1 FROM stages WHERE {rows.sealed_sql} AND stage IN {OTHER_WRITES} LIMIT 1",
                            rows.sealed_args).fetchone()
    return unit is None and other is None


def lineage_changed_nothing(db: sqlite_utils.Database, rows: RunRows, status: str) -> bool:
    """A run that ended without finishing (`status` failed or interrupted) whose flash — it and
    the runs it resumes — changed nothing: the board is as that flash found it, so it is not
    unfinished (a new flash is not refused over it, nor does it hide an older unfinished one).
    False where a run of its lineage does not verify: such a one is named, never looked past."""
    if status not in UNFINISHED:
        return False
    try:
        return all(changed_nothing(db, r) for r in run_chain(db, rows.run_id))
    except (RunUnverified, RunNotFound):
        return False


def wrote_nothing(db: sqlite_utils.Database, run_id: str) -> bool:
    """Whether a run is on record, in its own verified and sealed rows, as having ended without
    finishing and changed nothing on the flash: a resume of an earlier flash of the board may
    go on after it (it wrote nothing the resume would overwrite)."""
    try:
        rows = open_run(db.conn, run_id)
    except RunUnverified:
        return False
    return rows.sealed is not None and status_of(db, rows) in UNFINISHED and changed_nothing(db, rows)


def superseded_by(db: sqlite_utils.Database, run_id: str, related: _Related | None = None) -> str | None:
    """The later run that wrote the board of this unfinished flash (a start-over, a
    restore-original, a later flash or ifwi-all), found as `resume` finds what refuses it —
    after the first run of its lineage, on its board (flash unique ID, else its spec), outside
    the lineage, neither refused nor stopped before it changed the flash — so that its report
    offers no resume that would be refused. Only a run that speaks for itself does: its own runs
    row, its rows verified and sealed (under this host's key, for a board command), and signed
    by no key but those that signed the flash it supersedes — a row INSERTed or sealed by
    someone else never hides an unfinished flash (later_writers)."""
    return later_writers(db, run_id, related)[0]


def later_writers(db: sqlite_utils.Database, run_id: str, related: _Related | None = None) \
        -> tuple[str | None, object]:
    """(superseded_by, unvouched): the run that superseded this flash, else the first later run
    on record as writing its board that nothing verified vouches for — not superseding it, yet
    `resume` refuses over it (it may have written), so the flash's report must not offer the
    resume as the way. (None, None) when neither: the resume is the way."""
    if not isinstance(run_id, str) or not _written_after(db, run_id):
        return None, None   # the common case, the board's newest flash: decided without verifying a run
    related = related or _Related(db)
    try:
        chain = run_chain(db, newest_resume(db, run_id))
    except (RunUnverified, RunNotFound):
        return None, None
    ids = [r.run_id for r in chain]
    identity = next((b for b in map(lambda r: _identified(db, r), chain) if b["unique_id"] or b["chip"]), None)
    if identity is None:
        return None, None   # it never identified its board: it wrote nothing, and resume asks no more
    signers = {k for r in chain for k in r.check.signers}
    if identity["unique_id"]:
        later = db.conn.execute(
            "SELECT DISTINCT r.run_id, r.seq FROM runs r JOIN boards b ON b.run_id = r.run_id WHERE r.seq > ? "
            f"AND b.unique_id = ? AND r.command IN {WRITERS} ORDER BY r.seq", (chain[0].key, identity["unique_id"]))
    else:                   # a part without a readable unique ID is known by its spec
        spec = run_row(db, chain[-1].key)["board_spec"]
        later = db.conn.execute(f"SELECT run_id, seq FROM runs WHERE seq > ? AND board_spec = ? AND command IN "
                                f"{WRITERS} ORDER BY seq", (chain[0].key, spec))
    unvouched: object = None
    for other, seq in list(later):
        if other in ids:
            continue
        status = related.speaks(other, seq) if isinstance(other, str) else None
        rows = related.opened.get(other) if isinstance(other, str) else None
        if status == "refused" and rows is not None:
            continue        # it wrote nothing, by its own sealed rows
        if status is None or rows is None or (signers and not set(rows.check.signers) <= signers):
            unvouched = other if unvouched is None else unvouched      # sealed by no key the flash's host used
            continue
        if status in UNFINISHED and changed_nothing(db, rows):
            continue
        return other, None
    return None, unvouched


def _written_after(db: sqlite_utils.Database, run_id: str) -> bool:
    """Whether any run after this one, of any kind that writes, names its board (its spec, or a
    unique ID any boards row of it names): what superseded_by then decides from verified rows."""
    first = db.conn.execute("SELECT seq, board_spec FROM runs WHERE run_id = ? ORDER BY seq LIMIT 1",
                            (run_id,)).fetchone()
    if first is None:
        return False
    return db.conn.execute(
        f"SELECT 1 FROM runs r WHERE r.seq > ? AND r.command IN {WRITERS} AND (r.board_spec = ? OR EXISTS ("
        "SELECT 1 FROM boards b JOIN boards mine ON mine.unique_id = b.unique_id WHERE b.run_id = r.run_id "
        "AND mine.run_id = ? AND b.unique_id IS NOT NULL AND b.unique_id != '')) LIMIT 1",
        (first[0], first[1], run_id)).fetchone() is not None


def _identified(db: sqlite_utils.Database, rows: RunRows) -> dict[str, Any]:
    """The board a run identified, as its sealed rows record it (the last row naming a chip)."""
    found = db.conn.execute(f"SELECT unique_id, chip FROM boards WHERE {rows.sealed_sql} ORDER BY chip IS NULL, "
                            "CASE WHEN chip IS NULL THEN seq ELSE -seq END LIMIT 1", rows.sealed_args).fetchone()
    return {"unique_id": found[0] or "", "chip": found[1] or ""} if found else {"unique_id": "", "chip": ""}


def unit_states(db: sqlite_utils.Database, rows: RunRows, sealed_only: bool = False) -> dict[int, dict[str, Any]]:
    """The latest state row of every unit of the run (`sealed_only`: as its checkpoints seal them)."""
    states: dict[int, dict[str, Any]] = {}
    where, args = (rows.sealed_sql, rows.sealed_args) if sealed_only else (rows.sql, rows.args)
    for u in db.query(f"SELECT seq, address, size, state, action, detail FROM units WHERE {where} ORDER BY seq", args):
        prev = states.get(u["address"])
        action = u["action"] if u["state"] != "verified" or not prev else prev["action"]
        intended = (prev or {}).get("intended", False) or u["state"] not in ("planned", "verified")
        states[u["address"]] = {**u, "action": action, "intended": intended}
    return states


def run_chain(db: sqlite_utils.Database, run_id: str) -> list[RunRows]:
    """The runs from the original flash to this one, following resumes, each verified (a run
    that does not verify is refused: RunUnverified)."""
    chain = [open_run(db.conn, run_id)]
    seen = {run_id}
    while True:
        parent = db.conn.execute("SELECT resumes_run_id FROM runs WHERE seq = ?", (chain[-1].key,)).fetchone()[0]
        if not parent or parent in seen:
            return list(reversed(chain))
        seen.add(parent)
        chain.append(open_run(db.conn, resolve_run(db, parent)))


def newest_resume(db: sqlite_utils.Database, run_id: str) -> str:
    """The newest run carrying on this run's flash: from run to the resume of it, while one
    did (a resume that verifies, neither refused, which wrote nothing, nor succeeded, which
    finished the work). Resuming a run whose resume was interrupted in turn goes on from there."""
    related = _Related(db)
    current, seen = run_id, {run_id}
    while True:
        carried = [r["run_id"] for r in related.resumed_by(current)
                   if r["verified"] and r["status"] not in ("refused", "succeeded") and r["run_id"] not in seen]
        if not carried:
            return current
        current = carried[-1]
        seen.add(current)


def lineage_units(db: sqlite_utils.Database, run_id: str) -> list[dict[str, Any]]:
    """The flash's units as this run and the runs it resumes last left them (as a report lists
    a run's own): a unit a resume only planned keeps the state an earlier run left it in
    (RunUnverified or RunNotFound where a run of the lineage does not verify or is missing)."""
    states: dict[int, dict[str, Any]] = {}
    for rows in run_chain(db, run_id):
        for address, u in unit_states(db, rows).items():
            if u["state"] != "planned" or address not in states:
                states[address] = {"address": address, "size": u["size"], "action": u["action"], "state": u["state"]}
    return [states[a] for a in sorted(states)]


def unvouched(db: sqlite_utils.Database, run_id: object) -> str | None:
    """Why the run's record vouches for nothing — its rows do not verify, or no checkpoint
    seals any of them — or None when they verify and a checkpoint seals some (see _Related)."""
    if not isinstance(run_id, str):
        return "its run id is not text: amdflash did not write it"
    try:
        rows = open_run(db.conn, run_id)
    except RunUnverified as e:
        return f"its record does not verify ({e.problem})"
    return None if rows.sealed is not None else "no checkpoint seals any of its rows"


class _Related:
    """Other runs a report or a decision speaks of (the runs that resumed it, a board's newest
    flash): each verified once, and its status taken from its own verified rows. A run speaks
    only through its own runs row (the one its checkpoints seal, not a second row INSERTed
    with its id) and only when a checkpoint seals some of it: one that does not verify, or
    that no checkpoint seals (rows INSERTed without the key), is named as such and never makes
    another look resumed, finished or unfinished."""

    def __init__(self, db: sqlite_utils.Database, keyfiles: list[Path] | None = None):
        self.db, self.keyfiles = db, keyfiles
        self._found: dict[str, tuple[str, int] | None] = {}
        self.opened: dict[str, RunRows] = {}       # the runs that verified, as verified

    def verified(self, run_id: str) -> tuple[str, int] | None:
        """(status as store.status.run_status gives it, the seq of its runs row), or None if
        the run does not verify or no checkpoint seals any of it."""
        if run_id not in self._found:
            self._found[run_id] = None        # while it is worked out: a run that names itself vouches for nothing
            try:
                rows = open_run(self.db.conn, run_id, self.keyfiles)
            except RunUnverified:
                return None
            if rows.sealed is not None:
                self.opened[run_id] = rows
                self._found[run_id] = (status_of(self.db, rows, self), rows.key)
        return self._found[run_id]

    def speaks(self, run_id: str, seq: int) -> str | None:
        """The verified status of the run whose runs row is at `seq`, or None (see `verified`)."""
        found = self.verified(run_id)
        return found[0] if found is not None and found[1] == seq else None

    def of(self, run_id: str) -> str | None:
        """The run's status, or None if it does not verify (see `verified`)."""
        found = self.verified(run_id)
        return found[0] if found is not None else None

    def resumed_by(self, run_id: str) -> list[dict[str, Any]]:
        """The runs that resumed this one, with their status ("not verified" for a forged one)."""
        said: dict[str, str | None] = {}
        for r, seq in self._children(run_id):
            if said.get(r) is None:        # its own row speaks; a second row with its id does not
                said[r] = self.speaks(r, seq)
        return [{"run_id": r, "status": status or "not verified", "verified": status is not None}
                for r, status in said.items()]

    def finished_by(self, run_id: str) -> str | None:
        """The run that completed this run's work through resumes, if any."""
        todo, seen = [run_id], {run_id}
        while todo:
            for child, seq in self._children(todo.pop()):
                status = self.speaks(child, seq)
                if status == "succeeded":
                    return child
                if status is not None and child not in seen:
                    seen.add(child)
                    todo.append(child)
        return None

    def _children(self, run_id: str) -> list[tuple[str, int]]:
        return [(r, seq) for r, seq in self.db.conn.execute(
            "SELECT run_id, seq FROM runs WHERE resumes_run_id = ? ORDER BY seq", (run_id,))]


def resumed_by(db: sqlite_utils.Database, run_id: str) -> list[dict[str, Any]]:
    """The runs that resumed this one, with their status (each verified)."""
    return _Related(db).resumed_by(run_id)


def finished_by(db: sqlite_utils.Database, run_id: str) -> str | None:
    """The run that completed this run's work through resumes, if any (each verified)."""
    return _Related(db).finished_by(run_id)


def status_of(db: sqlite_utils.Database, rows: RunRows, related: _Related | None = None) -> str:
    """The status of a verified run, as every view shows it (store.status.run_status)."""
    recorded = _last_status(db, rows).get("status")
    if recorded in ENDS:     # sealed: verifying refuses an end in the unsealed tail (added after the fact)
        return str(recorded)
    related = related or _Related(db)
    resumed = any(r["verified"] for r in related.resumed_by(rows.run_id))
    machine = db.conn.execute("SELECT machine_id FROM runs WHERE seq = ?", (rows.key,)).fetchone()[0]
    return run_status(recorded, resumed, _process(db, rows.run_id, rows), machine)


class RunReport(dict):
    """`report`'s object (plain JSON), carrying the verified rows it was read through, for the
    HTML page that renders it."""

    rows: RunRows


def report(db: sqlite_utils.Database, run_id: str, keyfiles: list[Path] | None = None) -> RunReport:
    """Everything a reviewer needs about one run, read only once its chain verifies (O(the
    run)); a run that does not verify is refused (RunUnverified), never rendered."""
    with snapshot(db.conn):
        return _report(db, open_run(db.conn, resolve_run(db, run_id), keyfiles), keyfiles)


def _report(db: sqlite_utils.Database, rows: RunRows, keyfiles: list[Path] | None) -> RunReport:
    from amdflash.store.keys import fingerprint
    from amdflash.store.read_checks import read_checks

    run_id, where, args = rows.run_id, rows.sql, rows.args
    run = next(db.query("SELECT * FROM runs WHERE seq = ?", [rows.key]))
    status = _last_status(db, rows)
    boards = list(db.query(f"SELECT * FROM boards WHERE {where} ORDER BY seq", args))
    board = next((b for b in reversed(boards) if b.get("chip")), boards[0] if boards else {})
    writes, transactions = counts(db.conn, rows)
    units = [{"address": u["address"], "size": u["size"], "action": u["action"], "state": u["state"]}
             for u in sorted(unit_states(db, rows).values(), key=lambda u: u["address"])]
    errors = list(db.query(f"SELECT stage, message, address, at FROM errors WHERE {where} ORDER BY seq", args))
    stages = list(db.query(f"SELECT seq, stage, event, detail, at FROM stages WHERE {where} ORDER BY seq", args))
    verifies = next(db.query(f"SELECT count(*) AS total, sum(ok) AS ok FROM verifies WHERE {where}", args))
    failed_verifies = list(db.query(
        "SELECT address, attempt, mismatch_address, flash_byte, image_byte FROM verifies "
        f"WHERE {where} AND ok = 0 ORDER BY seq", args))
    backups = list(db.query(f"SELECT sha256, size, path FROM backups WHERE {where} ORDER BY seq", args))
    summary = json.loads(status["summary"]) if status.get("summary") else {}
    try:
        detail = json.loads(board["detail"]) if board.get("detail") else None
    except ValueError:
        detail = board.get("detail")
    checked = rows.check
    cp = checked.head
    related = _Related(db, keyfiles)      # the runs it names are held to the same keys
    resumes = related.resumed_by(run_id)
    rep = RunReport({
        "run_id": run_id,
        "command": run["command"],
        "arguments": json.loads(run["arguments"] or "{}"),
        "status": status_of(db, rows, related),
        "emulated": bool(board.get("emulated")) if board else None,
        "started": run["at"],
        "ended": status.get("at") if status.get("status") in ENDS else None,
        "operator": run["operator"],
        "operator_claimed": run["operator_claimed"],
        "host": run["host"],
        "machine_id": run["machine_id"],
        "tool_version": run["tool_version"],
        "tool_revision": run["tool_revision"],
        "clock_sync": run["clock_sync"],
        "resumes_run_id": run["resumes_run_id"],
        "resumed_by": resumes,
        "finished_by": related.finished_by(run_id),
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
        "reads": read_checks(db, rows),
        "chain": {
            "ok": checked.ok,
            "problem": checked.problem,
            "rows": checked.rows,
            "checkpoints": checked.checkpoints,
            "checkpoint": cp.id if cp else None,
            "sealed": cp.kind if cp else None,
            "head": cp.head.hex() if cp and cp.head else None,
            "checkpoint_hash": cp.hash.hex() if cp else None,
            "signed_by": fingerprint(cp.public_key) if cp and cp.public_key and not checked.legacy else None,
            "legacy": LEGACY_RUN if checked.legacy else None,
            "unsealed_rows": rows.unsealed_rows,
            "signature": _signature(checked),
        },
    })
    rep.rows = rows
    from amdflash.store import facts

    facts.add(db.conn, rows, rep, _db_file(db))     # every fact the trail holds, said the same in each format
    return rep


def _signature(checked: VerifyReport) -> str:
    """What the run's signatures prove, and of which rows."""
    if checked.legacy:
        return f"none: {LEGACY_RUN}"
    if not checked.checkpoints:
        return "none: no checkpoint seals any row of this run yet, so nothing in it is verified"
    how = ("verified against the given key" if checked.trusted else
           "valid under the key recorded in the database (not checked against a trusted key)")
    unsealed = sum(checked.unsealed.values())
    return how if not unsealed else f"{how}, for its sealed rows; its last {unsealed} row(s) are not sealed"


def counts(conn: sqlite3.Connection, rows: RunRows) -> tuple[int, int]:
    """(register writes, SPI transactions) of a run, counted from the compact rows of its seq
    span: from its runs row to its final checkpoint (or the last row recorded, for a run that
    recorded no end)."""
    key = rows.key
    last = conn.execute(f"SELECT {schema.RUN_END_SQL} FROM runs r WHERE r.seq = ?", (key,)).fetchone()[0]
    writes, transactions = conn.execute(
        f"SELECT coalesce(sum(length(coalesce(shape, '{schema.DEFAULT_SHAPE}'))), 0), "
        "coalesce(sum(1 + (again IS NOT NULL)), 0) FROM log_spi WHERE seq BETWEEN ? AND ? AND run = ?",
        (key, last, key)).fetchone()
    raw = conn.execute("SELECT count(*) FROM log_writes WHERE seq BETWEEN ? AND ? AND run = ?",
                       (key, last, key)).fetchone()[0]
    return writes + raw, transactions


def register_snapshot(db: sqlite_utils.Database, rows: RunRows, label: str,
                      sealed_only: bool = False) -> dict[int, int] | None:
    where, args = (rows.sealed_sql, rows.sealed_args) if sealed_only else (rows.sql, rows.args)
    found = list(db.query(f"SELECT registers FROM register_snapshots WHERE {where} AND label = ? "
                          "ORDER BY seq LIMIT 1", [*args, label]))
    if not found:
        return None
    return {int(k, 16): v for k, v in json.loads(found[0]["registers"]).items()}


def has_intents(db: sqlite_utils.Database, rows: RunRows) -> bool:
    return bool(list(db.query(f"SELECT 1 FROM units WHERE {rows.sql} AND state = 'intent' LIMIT 1", rows.args)))



# -- rows a command reads of one run: the caller opens the reader, calls, closes -----------------

def run_row(db: sqlite_utils.Database, key: int) -> dict[str, Any]:
    """The runs row of the run whose key (the seq of that row) is `key`."""
    return dict(next(db.query("SELECT * FROM runs WHERE seq = ?", [key])))


def first_board(db: sqlite_utils.Database, rows: RunRows, columns: Sequence[str]) -> dict[str, Any] | None:
    """`columns` of the run's first boards row that its checkpoints seal, or None."""
    found = list(db.query(f"SELECT {', '.join(columns)} FROM boards WHERE {rows.sealed_sql} ORDER BY seq LIMIT 1",
                          rows.sealed_args))
    return found[0] if found else None


def stage_details(db: sqlite_utils.Database, rows: RunRows, stage: str, event: str, limit: int = -1) -> list[Any]:
    """The details of the run's stages rows of `stage` and `event` that its checkpoints seal, in
    the order recorded (at most `limit` of them; -1: all)."""
    return [r["detail"] for r in db.query(f"SELECT detail FROM stages WHERE {rows.sealed_sql} AND stage = ? AND "
                                          "event = ? ORDER BY seq LIMIT ?", [*rows.sealed_args, stage, event, limit])]


# -- a run's register writes and transactions ---------------------------------------------------

def iter_register_writes(db: sqlite_utils.Database, rows: RunRows,
                         until: int | None = None) -> Iterator[tuple[int, int, int, int | None, bytes | None]]:
    """(seq, n, offset, value, data) of the run's register writes in issue order (n)."""
    yield from db.conn.execute(
        f"SELECT seq, n, offset, value, data FROM register_writes WHERE {rows.sql} AND n <= ? ORDER BY n",
        [*rows.args, until if until is not None else 2 ** 62])


def register_write_order(db: sqlite_utils.Database, rows: RunRows) -> Iterator[tuple[int, int]]:
    """(seq, n) of the run's register writes in seq order: how they interleave with other rows.
    The writes of one ROM_SW transaction share the seq of its row."""
    yield from db.conn.execute(f"SELECT seq, n FROM register_writes WHERE {rows.sql} ORDER BY seq, n", rows.args)


def transactions_between(db: sqlite_utils.Database, rows: RunRows, after: int, before: int) -> list[dict[str, Any]]:
    """The run's ROM_SW transactions recorded with seq in (after, before), decoded."""
    found = [dict(r) for r in db.query(
        "SELECT t.seq, t.n, t.opcode, t.address, t.address_bytes, t.tx_len, t.rx_len, t.clock, "
        f"coalesce(s.shape, '{schema.DEFAULT_SHAPE}') AS shape FROM spi_transactions t JOIN log_spi s ON s.seq = t.seq "
        f"WHERE {rows.where('t')} AND t.seq > ? AND t.seq < ? ORDER BY t.seq, t.n", [*rows.args, after, before])]
    for i, row in enumerate(found):
        # A row shared by a repeated transaction: each transaction's own writes.
        parts = re.findall(r"[^Nn]*[Nn]", row["shape"]) or [row["shape"]]
        repeat = i and found[i - 1]["seq"] == row["seq"]
        row["writes"] = parts[min(1, len(parts) - 1)] if repeat else parts[0]
    return found


def writes_since(db: sqlite_utils.Database, first: RunRows, unique_id: str, lineage: list[str]) -> list[dict[str, Any]]:
    """Runs that may have written the board (same flash unique ID) after `first` began,
    other than those in `lineage` (the run and its resumes) and those on record as having
    changed nothing (wrote_nothing)."""
    rows = db.query(
        "SELECT DISTINCT r.run_id, r.command, r.at FROM runs r JOIN boards b ON b.run_id = r.run_id "
        "WHERE r.seq > ? AND b.unique_id = ? AND r.command IN ('flash', 'resume', 'ifwi-all') ORDER BY r.seq",
        [first.key, unique_id])
    # One that stopped before it changed the flash wrote nothing a resume would overwrite.
    return [dict(r) for r in rows if r["run_id"] not in lineage and not wrote_nothing(db, r["run_id"])]
