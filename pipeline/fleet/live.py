"""`amdflash audit push --follow`: a host's runs, live, in the central record.

A long-running service on each host of a line (pipeline/fleet/units/amdflash-follow.service)
that watches the host's own audit trail — read-only, the way `runs` and `report` read it — and
publishes what its runs are doing into the central database's `progress` table: command,
board and place, stage, bytes done of bytes planned, rate, ETA, and every end (succeeded,
failed with its error, interrupted, refused) as the host's own `runs` decides it
(store.status.run_status: a run whose process is gone is interrupted at once). Each insert
NOTIFYs the listeners (`fleet serve`). After a run ends, and every `--push-every` seconds,
the signed trail is pushed as `audit push` pushes it, so the run's verified report follows its
live row within seconds.

Why a service watching the trail rather than the job reporting itself: the trail is the
write-ahead log and nothing a job does may wait on the network. The jobs never know this
service exists; it reads what they committed (every unit boundary, every stage change, every
end). When central cannot be reached the jobs go on; what this service saw meanwhile waits in
memory (the newest state of each run, every end) and is sent, with the host's own times, as
soon as central answers again — and an end it never saw (it was not running) is found in the
trail at its next start and sent then.

Progress is advisory: the host's word, unsigned, for people watching the line. The verdict on
a run is its signed record, which the push delivers and central verifies.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import signal
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from amdflash.store.status import ENDS, PROCESS_STAGE, run_status

OUTCOMES = ("end", "fail", "cancelled", "stop")   # a stage row that ends its stage
RATE_WINDOW = 10.0                                # seconds of samples behind a rate
CATCH_UP_HOURS = 24.0                             # runs this recent are checked for ends central lacks
RETRY = 2.0                                       # seconds between attempts to reach central


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


@dataclass
class RunWatch:
    """What the trail says of one run so far (read incrementally)."""

    key: int                                   # its runs row's seq
    run_id: str
    command: str
    board: str | None
    image_sha256: str | None
    resumes: str | None
    machine: str | None
    started: str | None
    units: dict[int, tuple[int, str]] = field(default_factory=dict)   # address → (size, state)
    stages: list[str] = field(default_factory=list)                  # started, not ended, in order
    last_unit_seq: int = 0
    last_stage_seq: int = 0
    process: str | None = None
    error: str | None = None
    samples: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=128))
    sent: tuple[Any, ...] | None = None         # what was last queued (state, stage, bytes)
    sent_at: float = 0.0
    ended: bool = False

    def amounts(self) -> tuple[int | None, int | None]:
        if not self.units:
            return None, None
        total = sum(size for size, _ in self.units.values())
        done = sum(size for size, state in self.units.values() if state in ("verified", "failed"))
        return done, total

    def rate(self) -> float | None:
        if len(self.samples) < 2:
            return None
        (t0, d0), (t1, d1) = self.samples[0], self.samples[-1]
        return (d1 - d0) / (t1 - t0) if t1 > t0 and d1 >= d0 else None


class TrailWatch:
    """The host's trail, read-only, polled: each poll returns the progress rows to publish."""

    def __init__(self, db: str, places: dict[str, str] | None = None, min_interval: float = 1.0,
                 start_seq: int | None = None):
        from amdflash.store import schema

        self.conn = schema.connect(db, readonly=True)
        self.places = places or {}
        self.min_interval = min_interval     # a running run's row at most this often (ends at once)
        self.runs: dict[str, RunWatch] = {}
        # the newest run when this began (later ones are followed); 0 for a trail made since
        self.start_seq: int | None = start_seq
        self.last_run_seq: int | None = start_seq

    def close(self) -> None:
        self.conn.close()

    def catch_up(self, published_ends: Callable[[list[str]], set[str]] | None = None,
                 hours: float = CATCH_UP_HOURS) -> None:
        """Also follow the runs from before this service started that central may lack: every run
        with no end recorded, and every run started in the last `hours`, less those whose end
        central already has (so a service that was down, or never reached central, sends the
        ends it missed once)."""
        since = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=hours)).isoformat(timespec="milliseconds")
        self.conn.execute("BEGIN")
        try:
            if self.start_seq is None:
                self.start_seq = self.last_run_seq = self.conn.execute("SELECT coalesce(max(seq), 0) FROM runs"
                                                                       ).fetchone()[0]
            found = self.conn.execute(
                "SELECT seq, run_id, command, board_spec, image_sha256, resumes_run_id, machine_id, at FROM runs r "
                "WHERE r.seq <= ? AND (r.at >= ? OR NOT EXISTS (SELECT 1 FROM run_status s WHERE s.run_id = r.run_id "
                f"AND s.status IN ({', '.join('?' * len(ENDS))}))) ORDER BY seq",
                (self.start_seq, since, *ENDS)).fetchall()
        finally:
            self.conn.execute("COMMIT")
        found = [r for r in found if r[1] not in self.runs]
        done = published_ends([r[1] for r in found]) if published_ends and found else set()
        for row in found:
            if row[1] not in done:
                self._follow(row)

    def _follow(self, row: tuple[Any, ...]) -> None:
        key, run_id, command, board, sha, resumes, machine, at = row
        self.runs[run_id] = RunWatch(key, run_id, command, board, sha, resumes, machine, at)

    def poll(self, now: float | None = None) -> list[dict[str, Any]]:
        """Progress rows for the runs whose state changed (one consistent read of the trail)."""
        now = time.monotonic() if now is None else now
        out = []
        self.conn.execute("BEGIN")
        try:
            if self.start_seq is None:
                self.start_seq = self.last_run_seq = self.conn.execute("SELECT coalesce(max(seq), 0) FROM runs"
                                                                       ).fetchone()[0]
            for row in self.conn.execute(
                    "SELECT seq, run_id, command, board_spec, image_sha256, resumes_run_id, machine_id, at FROM runs "
                    "WHERE seq > ? ORDER BY seq", (self.last_run_seq,)).fetchall():
                self._follow(row)
                self.last_run_seq = row[0]
            resumed = {r for (r,) in self.conn.execute(
                f"SELECT resumes_run_id FROM runs WHERE resumes_run_id IN ({', '.join('?' * len(self.runs))})",
                list(self.runs))} if self.runs else set()
            for run in sorted(self.runs.values(), key=lambda r: r.key):
                row = self._observe(run, run.run_id in resumed, now)
                if row is not None:
                    out.append(row)
                if run.ended:
                    del self.runs[run.run_id]
        finally:
            self.conn.execute("COMMIT")
        return out

    def _observe(self, run: RunWatch, resumed: bool, now: float) -> dict[str, Any] | None:
        c = self.conn
        for seq, stage, event, detail in c.execute(
                "SELECT seq, stage, event, detail FROM stages WHERE run_id = ? AND seq > ? ORDER BY seq",
                (run.run_id, run.last_stage_seq)).fetchall():
            run.last_stage_seq = seq
            if stage == PROCESS_STAGE:
                run.process = run.process or detail
            elif event == "start":
                if stage in run.stages:
                    run.stages.remove(stage)
                run.stages.append(stage)
            elif event in OUTCOMES and stage in run.stages:
                run.stages.remove(stage)
        for seq, address, size, state in c.execute(
                "SELECT seq, address, size, state FROM log_units WHERE run = ? AND seq > ? ORDER BY seq",
                (run.key, run.last_unit_seq)).fetchall():
            run.last_unit_seq = seq
            run.units[address] = (size, state)
        done, total = run.amounts()
        if done is not None:
            run.samples.append((now, done))
            while len(run.samples) > 2 and now - run.samples[0][0] > RATE_WINDOW:
                run.samples.popleft()
        last = c.execute("SELECT status, detail, at FROM run_status WHERE run_id = ? ORDER BY seq DESC LIMIT 1",
                         (run.run_id,)).fetchone()
        recorded, detail, recorded_at = (last or (None, None, None))
        state = run_status(recorded, resumed, run.process, run.machine)
        if state != "running" and run.error is None and state != "succeeded":
            first = c.execute("SELECT message, address FROM errors WHERE run_id = ? ORDER BY seq LIMIT 1",
                              (run.run_id,)).fetchone()
            run.error = detail or (first[0] if first else None)
            if state == "interrupted" and recorded not in ENDS and run.error is None:
                run.error = ("no end recorded and its process is gone (killed, or the host lost power): "
                             "a fleet flash of the same image resumes it")
        stage = run.stages[-1] if run.stages else None
        said = (state, stage, done, total)
        if state == "running":
            if said == run.sent or now - run.sent_at < self.min_interval and run.sent is not None \
                    and run.sent[:2] == said[:2]:
                return None
        else:
            run.ended = True
        run.sent, run.sent_at = said, now
        rate = run.rate() if state == "running" else None
        eta = (total - done) / rate if rate and total is not None and done is not None else None
        return {"run_id": run.run_id, "state": state, "command": run.command, "board": run.board,
                "place": self.places.get(run.board or ""), "stage": stage if state == "running" else None,
                "bytes_done": done, "bytes_total": total, "rate": rate, "eta": eta,
                "error": (run.error or "")[:4000] or None, "image_sha256": run.image_sha256,
                "resumes": run.resumes, "started": run.started,
                # an end as the trail recorded it; anything else when it was seen
                "at": recorded_at if recorded in ENDS and recorded_at else _now()}

    def newest_checkpoint(self) -> int | None:
        row = self.conn.execute("SELECT max(id) FROM checkpoints").fetchone()
        return row[0] if row else None


def places_from(config: Path | None, host: str) -> dict[str, str]:
    """{board spec: place} from this host's exporter configuration: the place `fleet places`
    makes for each board (EXPORTER-GROUP). Empty when there is none to read."""
    if config is None or not config.is_file():
        return {}
    try:
        import yaml   # comes with labgrid (the fleet extra), which an exporter host has
    except ImportError:
        return {}
    from amdflash.pipeline.fleet.attributes import RESOURCE_CLASS

    try:
        groups = yaml.safe_load(config.read_text().replace("{{ hostname }}", host)) or {}
    except (OSError, yaml.YAMLError):
        return {}
    out = {}
    for group, resources in groups.items() if isinstance(groups, dict) else ():
        board = (resources or {}).get(RESOURCE_CLASS) if isinstance(resources, dict) else None
        if isinstance(board, dict) and isinstance(board.get("spec"), str):
            out[board["spec"]] = f"{host}-{group}"
    return out


@dataclass
class Outbox:
    """Rows not yet in central: the newest running row of each run, every end, the last heartbeat."""

    rows: list[dict[str, Any]] = field(default_factory=list)

    def add(self, row: dict[str, Any]) -> None:
        if row["state"] in ("running", "alive"):
            self.rows = [r for r in self.rows if not (r["state"] == row["state"] and r["run_id"] == row["run_id"])]
        self.rows.append(row)


class Follower:
    """The service: poll the trail, publish to central, push after every end and on a period."""

    def __init__(self, db: str, url: str, interval: float = 0.5, push_every: float = 30.0,
                 heartbeat: float = 30.0, exporter_config: Path | None = None, host_name: str | None = None,
                 push: bool = True, log: Callable[[str], None] = print, host_key: bytes | None = None):
        self.db, self.url = db, url
        self.interval, self.push_every, self.heartbeat = interval, push_every, heartbeat
        self.exporter_config, self.host_name, self.pushing = exporter_config, host_name, push
        self.log = log
        self.host_key = host_key
        self.stop = threading.Event()
        self.push_now = threading.Event()
        self.outbox = Outbox()
        self.pg: Any = None
        self.host_id: int | None = None
        self.watch: TrailWatch | None = None
        self.last_sent = 0.0
        self.last_problem: str | None = None
        self.caught_up = False
        self.first_tick = True
        self.retry_at = 0.0
        self.places: dict[str, str] = {}
        self.place_host: str | None = None   # the exporter's name the places are made of
        self.places_read: tuple[int, int, int] | None = None   # the board list's file as last read
        self.told: set[str] = set()        # runs whose never-sealed rows were said
        self.witnessed: str | None = None   # what the witnesses last said of the newest tree head

    def _say(self, problem: str | None) -> None:
        if problem != self.last_problem:      # one line per change of trouble, not per tick
            self.log(problem or "central database reachable again: caught up")
            self.last_problem = problem

    def _connect(self) -> None:
        from amdflash.store import central

        pg = central.connect(self.url, autocommit=True, timeout=5)
        try:
            central.need_schema(pg)
            host_id, name = central.host_for_trail(pg, self.db if Path(self.db).is_file() else None,
                                                   self.host_key)
            self.place_host = self.host_name or name
        except BaseException:
            pg.close()
            raise
        self.pg, self.host_id = pg, host_id

    def tick(self) -> None:
        from amdflash.store import central

        now = time.monotonic()
        try:
            if self.watch is None and Path(self.db).is_file():   # the trail, from now on: no network needed
                self.watch = TrailWatch(self.db, start_seq=None if self.first_tick else 0)
                self.caught_up = False
            self.first_tick = False
            for row in self.watch.poll(now) if self.watch is not None else []:
                if row["state"] != "running":
                    self.push_now.set()
                self.outbox.add(row)
            if self.pg is None:
                if now < self.retry_at:
                    return
                self.retry_at = now + RETRY
                self._connect()
            if self.watch is not None and not self.caught_up:
                host_id, pg = self.host_id, self.pg
                assert host_id is not None
                self.watch.catch_up(lambda ids: central.published_ends(pg, host_id, ids))
                self.caught_up = True
            if not self.outbox.rows and now - self.last_sent >= self.heartbeat:
                self.outbox.add({"run_id": None, "state": "alive", "at": _now()})
            if self.outbox.rows:
                places = self._places()
                for row in self.outbox.rows:
                    if row.get("board") and not row.get("place"):
                        row["place"] = places.get(row["board"])
                assert self.host_id is not None
                checkpoint = self.watch.newest_checkpoint() if self.watch is not None else None
                central.publish_progress(self.pg, self.host_id, self.outbox.rows, checkpoint)
                self.outbox.rows = []
                self.last_sent = now
            self._say(None)
        except (central.CentralError, sqlite3.Error, OSError) as e:
            self._lost(str(e))
        except Exception as e:   # psycopg's errors, without importing it here
            if type(e).__module__.startswith("psycopg"):
                self._lost(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
            else:
                raise

    def _places(self) -> dict[str, str]:
        """{board spec: place}, read again whenever the exporter's board list changed: a board
        plugged in while this runs restarts the exporter (70-amdflash-fleet.rules), which writes
        the list afresh, and its runs are then named by their place with no restart of this."""
        try:
            st = self.exporter_config.stat() if self.exporter_config is not None else None
        except OSError:
            st = None
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino) if st is not None else None
        if self.place_host is not None and stamp != self.places_read:
            self.places, self.places_read = places_from(self.exporter_config, self.place_host), stamp
        return self.places

    def _lost(self, why: str) -> None:
        if self.pg is not None:
            try:
                self.pg.close()
            except Exception:
                pass
        self.pg = None
        self._say(f"central database not reachable ({why}): the jobs go on; progress waits and is sent "
                  "when it answers")

    def _pusher(self) -> None:
        while not self.stop.is_set():
            self.push_now.wait(self.push_every)
            if self.stop.is_set():
                return
            self.push_now.clear()
            if Path(self.db).is_file():
                self.push_once()
                self.witness_once()
                self.push_log_once()

    def push_once(self) -> None:
        """Push the signed trail, saying what was pushed (a failure is said and retried later)."""
        from amdflash.pipeline.engine.auditdb import open_reader
        from amdflash.store import central

        try:
            reader = open_reader(self.db)
            try:
                report = central.push(reader.conn, self.url)
            finally:
                reader.conn.close()
            if report.checkpoints:
                self.log(dataclasses.replace(report, stranded={}).describe())
            for line in report.stranded_lines(self.told):   # a dead run's rows: said once, not every push
                self.log(line)
            self.told |= set(report.stranded)
        except Exception as e:
            self.log(f"push failed, retried later: {e}")

    def push_log_once(self) -> None:
        """The transparency log's new tree heads, cosignatures and receipts to the central record
        (after the witnesses were asked: what they cosigned goes too); a refusal (a host log
        rolled back or forked) is said, and said again at every push while it stands."""
        from amdflash.pipeline.engine import witnessing
        from amdflash.store import central, tlog

        if not tlog.log_dir(self.db).is_dir():
            return
        try:
            conf = witnessing.configured()
        except Exception:
            conf = None          # (witness_once says what is wrong with them)
        try:
            done = central.push_log(self.db, self.url, len(conf.witnesses) if conf else None, self.host_key)
            if done.heads or done.cosignatures or done.receipts:
                self.log(done.describe())
        except Exception as e:
            self.log(f"push of the transparency log failed, retried later: {e}")

    def witness_once(self) -> None:
        """Ask the config file's witnesses again to cosign the newest tree head (one was down at a
        run's end; a head they all cosigned costs no request), saying each change of answer once."""
        from amdflash.pipeline.engine import witnessing

        try:
            conf = witnessing.configured()
            if conf is None:
                return
            outcome = witnessing.ask(self.db, witnessing.HostLog(self.db), conf)
            said = f"witnesses: tree head of {outcome.size} entries: {outcome.words()}"
        except Exception as e:      # the service goes on: a witness problem is words
            said = f"witnesses: not yet witnessed ({e})"
        if said != self.witnessed:
            self.log(said)
            self.witnessed = said

    def run(self) -> None:
        pusher = threading.Thread(target=self._pusher, daemon=True) if self.pushing else None
        if pusher:
            pusher.start()
        try:
            while not self.stop.is_set():
                started = time.monotonic()
                self.tick()
                self.stop.wait(max(0.0, self.interval - (time.monotonic() - started)))
        finally:
            self.push_now.set()
            if pusher:
                pusher.join(timeout=60)
            if self.watch is not None:
                self.watch.close()
            if self.pg is not None:
                self.pg.close()


def follow(db: str, url: str, **options: Any) -> int:
    """Run the follow service until SIGTERM (exit 0) or SIGINT (exit 130)."""
    follower = Follower(db, url, **options)
    got: list[int] = []

    def stop(signum: int, _frame: object) -> None:
        got.append(signum)
        follower.stop.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    follower.run()
    return 130 if signal.SIGINT in got else 0


def describe(row: dict[str, Any]) -> str:
    """A progress row in one line (for logs)."""
    return json.dumps({k: v for k, v in row.items() if v is not None}, sort_keys=True)
