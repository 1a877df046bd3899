"""What a host sends to the central record: `audit push` (the host's checks before the
database's own), `audit verify --central` (this trail's checkpoints against the record's), and
the live progress the host's follow service publishes (advisory, unsigned)."""
from __future__ import annotations

import json
import math
import re
import sqlite3
import time
from dataclasses import dataclass, field
from typing import Any

from amdflash.store.chain import Checkpoint, load_checkpoints
from amdflash.store.schema import PHYSICAL, PLAIN
from amdflash.store.central.bounds import CONTROLS
from amdflash.store.central.sending import send_batch
from amdflash.store.central.tlog_mirror import LogCheck, LogPush, check_local, send
from amdflash.store.central.schema import (NS, PROGRESS_BOUNDS, PROGRESS_LENGTHS, PROGRESS_SHAPES, RUN_KINDS,
                                           CentralError, connect, first_line, need_schema)

@dataclass


class PushReport:
    host: str = ""
    checkpoints: int = 0
    rows: int = 0
    blobs: int = 0
    blob_bytes: int = 0            # bytes of the blobs sent
    through: int = 0               # the host's last checkpoint now stored centrally
    held_back: int = 0             # rows after their run's last checkpoint: not sealed yet, not sent
    stranded: dict[str, int] = field(default_factory=dict)   # run → rows its dead process never sealed
    seconds: float = 0.0
    by_table: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        if not self.checkpoints:
            return "\n".join([f"central database already holds host {self.host}'s trail through checkpoint "
                              f"#{self.through}: nothing to push ({self.seconds:.2f} s)", *self.stranded_lines()])
        text = (f"pushed host {self.host}: {self.checkpoints} checkpoints, {self.rows} rows, {self.blobs} blobs "
                f"({self.blob_bytes / 1e6:.1f} MB) in {self.seconds:.2f} s; verified and stored by the central "
                f"database through checkpoint #{self.through}")
        if self.held_back:
            text += f"\n{self.held_back} row(s) of running runs are not sealed yet: the next push sends them"
        return "\n".join([text, *self.stranded_lines()])

    def stranded_lines(self, told: set[str] | frozenset[str] = frozenset()) -> list[str]:
        """A line for each run (not in `told`) whose rows will never be sealed, and so never pushed."""
        return [f"run {run_id} ended without sealing its last {n} row(s) (its process was killed or its host lost "
                "power): no signature covers them and no push will send them; they stay in this host's trail "
                "('audit verify --run' names them)" for run_id, n in self.stranded.items() if run_id not in told]


def _signing_key(checkpoints: list[Checkpoint]) -> bytes:
    signers = {c.public_key for c in checkpoints}
    if len(signers) != 1:
        raise CentralError(f"this audit database's checkpoints are signed by {len(signers)} keys; a push sends the "
                           "trail of one host key")
    return signers.pop()


def push(local: sqlite3.Connection, url: str, batch_rows: int = 500_000) -> PushReport:
    """Send what the central database lacks of this trail: the checkpoints after the last one
    it holds for this host, the rows they seal and the blobs those rows refer to; in batches
    of whole checkpoints, each one transaction that the database verifies before it commits.
    Refuses (CentralError, nothing sent) when this trail contradicts what the central database
    already holds for the host: a checkpoint rewritten, or the tail it holds missing here."""
    started = time.perf_counter()
    report = PushReport()
    with connect(url) as pg:
        import psycopg

        need_schema(pg)
        local.execute("BEGIN")      # one snapshot of the host's trail for the whole push
        try:
            every = load_checkpoints(local)
            if not every:
                raise CentralError("this audit database has no checkpoints: nothing to push")
            host_id, report.host = _own_host(pg, _signing_key(every))
            _refuse_contradiction(pg, host_id, report.host, every)
            while True:
                # Two pushes of one host (the timer's and the follow service's) take turns: the
                # second waits for the first's batch, then finds it stored.
                pg.execute("SELECT pg_advisory_xact_lock(%s::integer, %s::integer)", (_PUSH_LOCK, host_id))
                stored = pg.execute(f"SELECT coalesce(max(id), 0) FROM {NS}.own_checkpoints WHERE host_id = %s",
                                    (host_id,)).fetchone()[0]
                report.through = stored
                todo = [c for c in every if c.id > stored]
                if not todo:
                    pg.commit()
                    break
                if todo[0].id != stored + 1:
                    raise CentralError(f"the central database holds this host's checkpoints through #{stored}, and "
                                       f"this database's next is #{todo[0].id} (the ones between were archived "
                                       "away before they were pushed): not pushable")
                batch = _batch(every, todo, batch_rows)
                try:
                    _send(local, pg, host_id, every, batch, report)
                    pg.commit()
                except psycopg.Error as e:
                    pg.rollback()
                    raise CentralError(first_line(e) + " — nothing of this batch was stored") from None
            report.held_back, report.stranded = _unsealed(local, every)
        finally:
            local.execute("COMMIT")
    report.seconds = time.perf_counter() - started
    return report


_PUSH_LOCK = 0x616D64   # the advisory lock class of pushes (with the host's id)


def _own_host(pg: Any, public: bytes) -> tuple[int, str]:
    """(id, name) of the host enrolled with this key, if this session may push for it."""
    from amdflash.store.keys import fingerprint

    row = pg.execute(f"SELECT id, name FROM {NS}.own_hosts WHERE public_key = %s", (public,)).fetchone()
    if row is None:
        login = pg.execute("SELECT session_user").fetchone()[0]
        raise CentralError(f"this trail's key {fingerprint(public)} is not enrolled in the central database as a host "
                           f"that login {login} may push or read: its administrator enrols the key and binds it to "
                           "this host's login ('amdflash fleet enroll --key FILE --name HOST --login LOGIN', FILE "
                           "from 'amdflash audit key')")
    return int(row[0]), str(row[1])


def _refuse_contradiction(pg: Any, host_id: int, host: str, every: list[Checkpoint]) -> None:
    """Refuse to push a trail that contradicts what the central database holds for the host.

    Each checkpoint's hash covers the one before it, so when the newest checkpoint stored
    centrally is here unchanged, so is everything before it: one row answers the common case.
    Otherwise every stored checkpoint is compared, to name the first that differs."""
    last = pg.execute(f"SELECT id, hash FROM {NS}.own_checkpoints WHERE host_id = %s ORDER BY id DESC LIMIT 1",
                      (host_id,)).fetchone()
    if last is None:
        return
    through, through_hash = archived_through(every)
    mine = {c.id: c.hash for c in every}
    ident, digest = int(last[0]), bytes(last[1])
    if mine.get(ident) == digest or (ident == through and through_hash == digest) or ident < through:
        return   # (archived before it was pushed: the push loop says so)
    found = compare(every, central_checkpoints(pg, host_id), host)
    if not found.ok:
        raise CentralError(f"refused: this trail contradicts the central record: {found.problem}; nothing was pushed")


def archived_through(checkpoints: list[Checkpoint]) -> tuple[int, bytes | None]:
    """(the last checkpoint `audit archive` took out of this database, its hash), or (0, None)."""
    seals = [c for c in checkpoints if c.kind == "archive"]
    if not seals:
        return 0, None
    info = json.loads(seals[-1].detail or "{}")
    return int(info["through_checkpoint"]), bytes.fromhex(info["through_hash"])


def central_checkpoints(pg: Any, host_id: int) -> list[tuple[int, bytes, str]]:
    """(id, hash, when it was pushed) of every checkpoint the central database holds for the host."""
    return [(int(i), bytes(h), str(at)) for i, h, at in pg.execute(
        f"SELECT id, hash, pushed_at::text FROM {NS}.own_checkpoints WHERE host_id = %s ORDER BY id", (host_id,))]


@dataclass
class Comparison:
    """This trail against what the central database holds for its host (the off-host anchor)."""

    host: str
    problem: str | None = None     # the first contradiction, naming its checkpoint
    first: int | None = None       # the first checkpoint that differs or is missing here
    matched: int = 0               # central checkpoints that this database holds unchanged (or archived)
    central_last: int = 0          # the newest checkpoint central holds for the host
    unpushed: int = 0              # checkpoints here after it: not pushed yet

    @property
    def ok(self) -> bool:
        return self.problem is None

    def describe(self, where: str) -> str:
        if not self.ok:
            return f"audit chain BROKEN against the central record ({where}): {self.problem}"
        if not self.central_last:
            return (f"central     {where}: holds no checkpoint of host {self.host} yet (nothing to compare); "
                    f"{self.unpushed} checkpoint(s) here not pushed yet")
        return (f"central     {where}: host {self.host}'s checkpoints 1..#{self.central_last} as pushed "
                f"({self.matched} compared) are all in this database unchanged; {self.unpushed} newer checkpoint(s) "
                "here not pushed yet")


def compare(local: list[Checkpoint], central: list[tuple[int, bytes, str]], host: str) -> Comparison:
    """Every checkpoint central holds for the host must be in this database unchanged (a
    checkpoint `audit archive` took away: its seal's hash of the last one archived); the
    first that is not is named. Checkpoints here after central's newest are not pushed yet."""
    found = Comparison(host, central_last=central[-1][0] if central else 0)
    mine = {c.id: c.hash for c in local}
    through, through_hash = archived_through(local)
    last_here = max(mine, default=through)
    for ident, digest, pushed in central:
        if ident < through:
            found.matched += 1            # archived here; the seal vouches for them through #through
            continue
        here = mine.get(ident, through_hash if ident == through else None)
        if here == digest:
            found.matched += 1
            continue
        found.first = ident
        if here is not None:
            found.problem = (f"checkpoint #{ident} differs from the one the central database holds for host {host} "
                             f"(pushed {pushed}): this trail was rewritten after it was pushed")
        elif ident > last_here:
            found.problem = (f"the central database holds host {host}'s checkpoints through #{found.central_last} "
                             f"and this database's last is #{last_here}: checkpoint #{ident} (pushed {pushed}) and "
                             "the ones after it are missing here: its tail was cut, or it was rolled back to an "
                             "older copy")
        else:
            found.problem = (f"checkpoint #{ident}, which the central database holds for host {host} (pushed "
                             f"{pushed}), is missing from this database: it was removed")
        return found
    found.unpushed = sum(1 for ident in mine if ident > found.central_last)
    return found


def verify_against(local: sqlite3.Connection, url: str, host_key: bytes | None = None) -> Comparison:
    """Compare this trail's every checkpoint with what the central database holds for its host
    (the host its checkpoints' key is enrolled as; for a trail with none, `host_key`'s)."""
    local.execute("BEGIN")
    try:
        every = load_checkpoints(local)
    finally:
        local.execute("COMMIT")
    public = _signing_key(every) if every else host_key
    if public is None:
        raise CentralError("this audit database has no checkpoints and there is no host key to name its host: "
                           "nothing to compare")
    with connect(url) as pg:
        need_schema(pg)
        host_id, host = _own_host(pg, public)
        return compare(every, central_checkpoints(pg, host_id), host)


def push_log(db: str, url: str, witnesses: int | None = None, host_key: bytes | None = None) -> LogPush:
    """Send what the central record lacks of this host's transparency log — its tree heads,
    their cosignatures, its receipts (store/central/tlog_mirror.py) — in one transaction the
    database checks: a head that is not consistent with the largest it holds (a log rolled
    back or forked) is refused (CentralError) and nothing of it is stored. `witnesses`: how
    many the host's config names (for the readers' "k of n")."""
    with connect(url) as pg:
        import psycopg

        need_schema(pg)
        host_id, _ = host_for_trail(pg, db, host_key)
        pg.execute("SELECT pg_advisory_xact_lock(%s::integer, %s::integer)", (_PUSH_LOCK, host_id))
        try:
            done = send(pg, NS, host_id, db, witnesses)
            pg.commit()
        except psycopg.Error as e:
            pg.rollback()
            raise CentralError(f"the central database refused this host's transparency log: {first_line(e)} — "
                               "nothing of it was stored") from None
    return done


def verify_log_against(db: str, url: str, host_key: bytes | None = None) -> LogCheck:
    """The central record's newest tree head of this host's log against the log here."""
    with connect(url) as pg:
        need_schema(pg)
        host_id, host = host_for_trail(pg, db, host_key)
        return check_local(pg, NS, host_id, host, db)


def _batch(every: list[Checkpoint], todo: list[Checkpoint], batch_rows: int) -> list[Checkpoint]:
    """The next checkpoints to send together: at least one, about `batch_rows` rows at most."""
    rows_before: dict[Any, int] = {}
    for c in every:
        if c.id >= todo[0].id:
            break
        if c.kind in RUN_KINDS:
            rows_before[c.run] = c.rows or 0
    out: list[Checkpoint] = []
    total = 0
    for c in todo:
        n = (c.rows or 0) - rows_before.get(c.run, 0) if c.kind in RUN_KINDS else 0
        if out and total + n > batch_rows:
            break
        if c.kind in RUN_KINDS:
            rows_before[c.run] = c.rows or 0
        out.append(c)
        total += n
    return out


def _spans(every: list[Checkpoint], batch: list[Checkpoint], run_keys: dict[str, int]) -> list[tuple]:
    """(run key, run_id, first seq, last seq) of the spans that the batch's checkpoints seal."""
    last: dict[Any, Any] = {}
    spans = []
    wanted = {c.id for c in batch}
    for c in every:
        if c.kind not in RUN_KINDS:
            continue
        lo = last.get(c.run, run_keys.get(c.run_id or "", c.run))
        if c.id in wanted:
            spans.append((c.run, c.run_id, lo, c.last_seq))
        last[c.run] = (c.last_seq or 0) + 1
    return spans


def _send(local: sqlite3.Connection, pg: Any, host_id: int, every: list[Checkpoint], batch: list[Checkpoint],
          report: PushReport) -> None:
    run_keys = dict(local.execute("SELECT run_id, seq FROM runs").fetchall())
    # pushed_in/pushed_by are set by the database itself (its trigger overrides these).
    checkpoints = [(host_id, c.id, c.kind, c.run, c.run_id, c.rows, c.last_seq, c.head, c.at, c.detail, c.hash,
                    c.sig, 0, "") for c in batch]
    with pg.cursor() as cur:
        send_batch(local, cur, host_id, _spans(every, batch, run_keys), checkpoints, report)
        cur.execute("SET CONSTRAINTS ALL IMMEDIATE")     # the span checks, now rather than at COMMIT
    report.checkpoints += len(batch)
    report.through = batch[-1].id


def _unsealed(local: sqlite3.Connection, every: list[Checkpoint]) -> tuple[int, dict[str, int]]:
    """(rows recorded after their run's last checkpoint by runs still being written, {run: such
    rows} of the runs that are over: their writer died before sealing them, so none ever will)."""
    ends = {}
    for c in every:
        if c.kind in RUN_KINDS:
            ends[c.run] = (c.kind, c.last_seq)
    runs = dict(local.execute("SELECT seq, run_id FROM runs").fetchall())
    n, stranded = 0, {}
    for key, run_id in runs.items():
        kind, last = ends.get(key, (None, key - 1))
        if kind == "final":
            continue
        rows = 0
        for table in PHYSICAL:
            column, value = ("run_id", run_id) if table in PLAIN else ("run", key)
            rows += local.execute(f"SELECT count(*) FROM {table} WHERE seq > ? AND +{column} = ?",
                                  (last, value)).fetchone()[0]
        if rows and _over(local, key, run_id):
            stranded[run_id] = rows
        else:
            n += rows
    return n, stranded


def _over(local: sqlite3.Connection, key: int, run_id: str) -> bool:
    """Whether the run is over, as this host's own `runs` says (store.status.run_status)."""
    from amdflash.store.status import PROCESS_STAGE, run_status

    recorded = local.execute("SELECT status FROM run_status WHERE run_id = ? ORDER BY seq DESC LIMIT 1",
                             (run_id,)).fetchone()
    resumed = local.execute("SELECT 1 FROM runs WHERE resumes_run_id = ? LIMIT 1", (run_id,)).fetchone()
    process = local.execute("SELECT detail FROM stages WHERE run_id = ? AND stage = ? ORDER BY seq LIMIT 1",
                            (run_id, PROCESS_STAGE)).fetchone()
    machine = local.execute("SELECT machine_id FROM runs WHERE seq = ?", (key,)).fetchone()
    return run_status(recorded[0] if recorded else None, resumed is not None, process[0] if process else None,
                      machine[0] if machine else None) != "running"


# -- live progress (advisory) ------------------------------------------------------------------

PROGRESS_COLUMNS = ("run_id", "state", "command", "board", "place", "stage", "bytes_done", "bytes_total", "rate",
                    "eta", "error", "image_sha256", "resumes", "started", "at")


def host_for_trail(pg: Any, db: str | None, host_key: bytes | None = None) -> tuple[int, str]:
    """(id, name) of the enrolled host whose key signs this trail (for a trail with no checkpoint
    yet, or none at all, `host_key`'s), if this session may push for it."""
    from amdflash.store import schema as host_schema

    row = None
    if db is not None:
        local = host_schema.connect(db, readonly=True)
        try:
            row = local.execute("SELECT h.public_key FROM checkpoints c JOIN hosts h ON h.id = c.host "
                                "ORDER BY c.id DESC LIMIT 1").fetchone()
        finally:
            local.close()
    public = bytes(row[0]) if row else host_key
    if public is None:
        raise CentralError("this audit database has no checkpoints and there is no host key to name its host")
    return _own_host(pg, public)


def publishable(row: dict[str, Any]) -> dict[str, Any]:
    """The row with each value the database would refuse (a number not finite or out of
    bounds, a name not of its shape) left out, so that one odd value of the host's — a place
    named after an unusual host name — costs that value, not the whole batch of rows."""
    out = dict(row)
    if isinstance(out.get("error"), str):      # an error's lines and odd characters become spaces
        out["error"] = _CONTROL.sub(" ", out["error"])
    for column, bound in PROGRESS_BOUNDS.items():
        value = out.get(column)
        if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value)
                                      and 0 <= value <= bound):
            out[column] = None
    for column, shape in PROGRESS_SHAPES.items():
        value = out.get(column)
        if value is not None and not (isinstance(value, str) and re.search(shape, value)):
            out[column] = None
    for column, longest in PROGRESS_LENGTHS.items():
        value = out.get(column)
        if isinstance(value, str) and len(value) > longest:
            out[column] = value[:longest - 1] + "…" if column == "error" else None
    return out


_CONTROL = re.compile(f"[{CONTROLS}]")
# Rows a statement: well within the database's bounds of a host (a bucket of ends smaller than
# this would refuse a backlog of ends for good: progress_limits says at most how many at once).
PUBLISH_BATCH = 20


def publish_progress(pg: Any, host_id: int, rows: list[dict[str, Any]], checkpoint: int | None) -> None:
    """Insert progress rows for the host, up to PUBLISH_BATCH a statement (one NOTIFY each); the
    database checks that this login may speak for the host, keeps it within its bounds, and
    stamps each row's arrival and sender itself. On an autocommit connection each statement's
    rows are taken out of `rows` once stored, so that after a refusal (over the host's rate, a
    backlog sent after an outage) `rows` holds what is still to send, and nothing twice."""
    stored_each = bool(getattr(pg, "autocommit", False))
    start = 0
    while start < len(rows):
        batch = [publishable(r) for r in rows[start:start + PUBLISH_BATCH]]
        names = ", ".join(PROGRESS_COLUMNS)
        one = "(" + ", ".join(["%s"] * (len(PROGRESS_COLUMNS) + 2)) + ", 0, now(), '')"
        values = [v for r in batch for v in (host_id, checkpoint, *(r.get(c) for c in PROGRESS_COLUMNS))]
        # id, received_at, sent_by: set by the database's trigger (whatever a client sends)
        pg.execute(f"INSERT INTO {NS}.progress (host_id, checkpoint, {names}, id, received_at, sent_by) "
                   f"VALUES {', '.join([one] * len(batch))}", values)
        if stored_each:
            del rows[:len(batch)]
        else:
            start += len(batch)


def published_ends(pg: Any, host_id: int, run_ids: list[str]) -> set[str]:
    """The runs among `run_ids` whose end the host has already published."""
    return {r for (r,) in pg.execute(f"SELECT DISTINCT run_id FROM {NS}.own_progress WHERE host_id = %s AND "
                                     "run_id = ANY(%s) AND state NOT IN ('running', 'alive')", (host_id, run_ids))}
