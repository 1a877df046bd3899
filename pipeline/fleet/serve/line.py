"""The line as the central record says it: the progress rows read defensively into each
board's state (Board, LineSnapshot), kept current by one thread (Line) that LISTENs for
wake-ups, reads the signed status and each host's health, and decides the notifications."""
from __future__ import annotations

import datetime as dt
import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from amdflash.pipeline.fleet.serve.ends import ENDED_BADLY
from amdflash.pipeline.fleet.serve.notify import Memory, Notifier
from amdflash.pipeline.fleet.serve.words import age, duration, mask_urls, run_href, run_word, word
from amdflash.store.status import ENDS

FAILED = ("failed", "interrupted", "refused")
ORDER = {"failed": 0, "interrupted": 1, "refused": 2, "unreadable": 3, "running": 4, "succeeded": 5}
STATES = ("running", *ENDS, "alive")
REFRESH = 2.0                       # seconds between reads of signed status and health (and new rows)
END_WAIT = 10.0                     # seconds a failure's notification waits for its end in the record,
END_WAIT_LONGEST = 60.0             # and at most this while its host's push or its end's telling is under way
BATCH = 20000                       # progress rows read at once


def _epoch(value: Any) -> dt.datetime | None:
    """A time read as seconds since the epoch (float); None when it is not a real time."""
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    try:
        return dt.datetime.fromtimestamp(value, dt.UTC)
    except (OverflowError, OSError, ValueError):
        return None


def check_row(row: dict[str, Any]) -> dict[str, Any]:
    """A progress row as read (progress_rows), with `unreadable` saying why no view may take it
    at its word (None: it reads): a state, number or time outside what a host can mean."""
    why = None
    if row.get("state") not in STATES:
        why = f"state {word(row.get('state'), 40)!r} is not a progress state"
    for name in ("rate", "eta", "bytes_done", "bytes_total"):
        v = row.get(name)
        if v is not None and (not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0):
            why = why or f"{name} {word(v, 40)} is not a finite number of 0 or more"
    at = row.get("at")
    row["at"] = _epoch(at)
    if at is not None and row["at"] is None:
        why = why or f"at (the host's clock, {word(at, 40)} s since 1970) is not a time"
    row["received"] = _epoch(row.get("received"))
    if row["received"] is None:
        why = why or "its arrival time is not a time"
    row["unreadable"] = why
    return row


def progress_rows(pg: Any, where: str, params: tuple[Any, ...], distinct: str = "", order: str = "p.id") \
        -> list[dict[str, Any]]:
    """Progress rows with their host's enrolled name, read so that no value a host wrote can fail
    the read: its times as seconds since 1970 (infinity too: a float), then check_row."""
    from amdflash.store.central import NS

    cur = pg.execute(
        f"SELECT {distinct} p.id, p.host_id, h.name AS host, p.run_id, p.state, p.command, p.board, p.place, "
        "p.stage, p.bytes_done, p.bytes_total, p.rate, p.eta, p.error, p.resumes, p.started, p.checkpoint, "
        "extract(epoch FROM p.at)::float8 AS at, extract(epoch FROM p.received_at)::float8 AS received "
        f"FROM {NS}.progress p JOIN {NS}.hosts h ON h.id = p.host_id WHERE {where} ORDER BY {order}", params)
    names = [d.name for d in cur.description]
    return [check_row(dict(zip(names, r, strict=True))) for r in cur]


def window_rows(pg: Any, hours: float, page: int = 0) -> list[dict[str, Any]]:
    """The newest progress row of every board heard from in the last `hours`, a bounded page of
    them (page 0: the newest): at most BOARDS_PER_HOST boards of one host, so that one host's
    flood of boards neither slows the view nor hides another host's, and BOARDS_PAGE in all."""
    from amdflash.store.central import BOARDS_PAGE, BOARDS_PER_HOST, NS

    newest = (f"SELECT id FROM (SELECT id, row_number() OVER (PARTITION BY host_id ORDER BY id DESC) AS n "
              f"FROM (SELECT DISTINCT ON (host_id, coalesce(board, run_id)) id, host_id FROM {NS}.progress "
              "WHERE received_at > now() - make_interval(secs => %s) AND run_id IS NOT NULL "
              "ORDER BY host_id, coalesce(board, run_id), id DESC) b) w "
              f"WHERE n <= {int(BOARDS_PER_HOST)} ORDER BY id DESC LIMIT {int(BOARDS_PAGE)} OFFSET %s")
    return progress_rows(pg, f"p.id IN ({newest})", (hours * 3600, int(page) * BOARDS_PAGE))


def rows_after(pg: Any, last_id: int, limit: int = BATCH) -> list[dict[str, Any]]:
    return progress_rows(pg, "p.id > %s", (last_id,), order=f"p.id LIMIT {int(limit)}")


@dataclass
class Board:
    """One board of the line: its newest progress row, and its run's signed status if pushed."""

    host_id: int
    host: str
    key: str                    # the board as its host names it (spec), else the run id
    row: dict[str, Any]
    signed: str | None = None   # the signed record's status of its run (None: not pushed yet)
    stale: bool = False         # running, but no word of it for longer than the line's stale_after
    end: dict[str, Any] | None = None   # a failed or interrupted run's end as its signed record tells it
    witnessed: tuple[int, int | None] | None = None   # (k, n) of its receipt's cosignatures (central's mirror)

    @property
    def state(self) -> str:
        """The signed record's end when it has one; else the host's live word (if it reads)."""
        if self.signed in ENDS:
            return str(self.signed)
        if self.row.get("unreadable"):
            return "unreadable"
        return str(self.row["state"])

    @property
    def source(self) -> str:
        return "signed" if self.signed in ENDS else "live"

    @property
    def place(self) -> str:
        return self.row.get("place") or self.row.get("board") or ""

    def sort_key(self) -> tuple[Any, ...]:
        return (ORDER.get(self.state, 5), self.host, self.place)


@dataclass
class LineSnapshot:
    boards: list[Board]
    hosts: list[dict[str, Any]]
    at: dt.datetime
    version: int


class Line:
    """The line as the central record says it, kept current by one thread."""

    def __init__(self, url: str, window_hours: float = 24.0, notifier: Notifier | None = None,
                 silent_after: float = 600.0, settle: float = 30.0, public_url: str = "",
                 log: Callable[[str], None] = print, state: Path | None = None, stale_after: float = 1800.0,
                 end_wait: float = END_WAIT):
        self.url = url
        self.window_hours = window_hours
        self.notifier = notifier or Notifier([], log)
        self.silent_after = silent_after
        self.settle = settle
        self.stale_after = stale_after       # a running row with no word for longer no longer holds the line
        self.public_url = public_url.rstrip("/") + "/" if public_url else ""
        self.log = log
        self.boards: dict[tuple[int, str], Board] = {}
        self.hosts: list[dict[str, Any]] = []
        self.version = 0
        self.last_id = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.listeners: list[Callable[[], None]] = []
        self.memory = Memory.load(state)
        self.notifier.keep_in(self.memory.outbox)     # what waits to be delivered is saved with it
        self._state_problem: str | None = None
        self.error: str | None = None
        self._thread: threading.Thread | None = None
        # Failed and interrupted runs' ends, told from the signed record by a thread of its own
        # (copying a run out of the record takes a while): (host id, run id, signed status) →
        # its end, or None when the record told nothing (not pushed yet, or not verifying).
        self.end_wait = end_wait
        self.ends: dict[tuple[int, str, str | None], dict[str, Any] | None] = {}
        self._asked: queue.Queue[tuple[int, str, str | None, str] | None] = queue.Queue()
        self._ends_thread: threading.Thread | None = None

    # -- reading the record ----------------------------------------------------------------

    def load(self, pg: Any) -> None:
        """Read the line afresh, and decide the rows not decided yet for notifications (all of
        them since the last decided, however long the serve was stopped or central out of reach)."""
        from amdflash.store import central

        central.need_schema(pg)
        last = central.last_progress_id(pg)
        rows = window_rows(pg, self.window_hours)
        with self.lock:
            self.boards = {}
            for row in rows:
                self._take(row)
            self.last_id = max([last, *(r["id"] for r in rows)])
        if self.memory.seen_id is not None and self.memory.seen_id > last:
            self.log(f"notification state {self.memory.path}: the record holds fewer rows than it remembers "
                     "(a record made afresh): starting from the record's newest row")
            self.memory = Memory(self.memory.path, outbox=self.memory.outbox)   # undelivered: still due
        if self.memory.seen_id is None:       # the first read ever: what was already there is not news
            self.memory.seen_id = self.last_id
            self.memory.save()
        self._refresh(pg)
        while batch := rows_after(pg, self.memory.seen_id):    # in batches: days of rows are millions
            self._decide(batch)
            if len(batch) < BATCH:
                break

    def _take(self, row: dict[str, Any]) -> Board | None:
        if row.get("run_id") is None:
            return None
        key = (int(row["host_id"]), str(row.get("board") or row["run_id"]))
        board = self.boards.get(key)
        if board is not None and board.row["id"] > row["id"]:
            return None                       # an older row (read again to decide it): the board shows newer
        if board is None:                     # a host's boards, as window_rows bounds them: its newest
            from amdflash.store.central import BOARDS_PER_HOST

            mine = [k for k in self.boards if k[0] == key[0]]
            if len(mine) >= BOARDS_PER_HOST:
                del self.boards[min(mine, key=lambda k: self.boards[k].row["id"])]
        if board is not None and board.row.get("run_id") == row["run_id"]:
            board.row = row
        else:
            board = self.boards[key] = Board(key[0], row["host"], key[1], row)
        return board

    def _refresh(self, pg: Any) -> bool:
        from amdflash.store import central

        with self.lock:
            wanted = [(b.host_id, b.row["run_id"]) for b in self.boards.values()]
        signed = central.signed_status(pg, wanted)
        witnessed = central.witness_states(pg, central.NS, wanted)
        hosts = central.hosts_health(pg)
        changed = False
        with self.lock:
            for b in self.boards.values():
                now = signed.get((b.host_id, b.row["run_id"]))
                if now != b.signed:
                    b.signed, changed = now, True
                cosigned = witnessed.get((b.host_id, b.row["run_id"]))
                if cosigned != b.witnessed:
                    b.witnessed, changed = cosigned, True
                self._ask_end(b)
            if hosts != self.hosts:
                self.hosts, changed = hosts, True
        return changed

    def _ask_end(self, b: Board) -> None:
        """Have the end of a board's failed or interrupted run told, once it is in the record
        (again when its signed status changes: its end pushed, a resume that fixed it)."""
        key = (b.host_id, str(b.row["run_id"]), b.signed)
        if b.signed is not None and b.state in ENDED_BADLY and key not in self.ends:
            self.ends[key] = None
            self._asked.put((*key, str(b.row["state"])))

    def _tell_ends(self) -> None:
        from amdflash.pipeline.fleet.serve.ends import run_end

        while (asked := self._asked.get()) is not None:
            host_id, run_id, signed, said = asked
            try:
                told = run_end(self.url, host_id, run_id, said)
            except Exception as e:       # the record out of reach: the line's thread asks again
                why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                self.log(f"the end of run {run_word(run_id)} not told: {mask_urls(why)}")
                told = None
            with self.lock:
                if told is None:
                    self.ends.pop((host_id, run_id, signed), None)
                    continue
                self.ends[(host_id, run_id, signed)] = told
            self._changed()

    def end_of(self, host_id: int, run_id: str) -> dict[str, Any] | None:
        """The newest end told of the run (of any signed status), if one was."""
        with self.lock:
            found = [e for (h, r, _), e in self.ends.items() if h == host_id and r == run_id and e is not None]
        return found[-1] if found else None

    def _poll(self, pg: Any) -> list[dict[str, Any]]:
        """The rows newer than the last read (each applied to its board)."""
        rows = rows_after(pg, self.last_id)
        with self.lock:
            for row in rows:
                self.last_id = max(self.last_id, int(row["id"]))
                self._take(row)
        return rows

    def _stale(self, b: Board, now: dt.datetime) -> bool:
        """Running by its row, but no word of the run for longer than stale_after: a leftover (its
        follow service gone, its host reinstalled) that must not hold "line done" back forever."""
        received = b.row.get("received")
        return b.state == "running" and received is not None and (now - received).total_seconds() > self.stale_after

    def snapshot(self) -> LineSnapshot:
        now = dt.datetime.now(dt.UTC)
        with self.lock:
            boards = sorted((Board(b.host_id, b.host, b.key, dict(b.row), b.signed, self._stale(b, now),
                                   self.ends.get((b.host_id, str(b.row["run_id"]), b.signed)), b.witnessed)
                             for b in self.boards.values()), key=Board.sort_key)
            return LineSnapshot(boards, [dict(h) for h in self.hosts], dt.datetime.now(dt.UTC),
                                self.version)

    def _changed(self) -> None:
        with self.lock:
            self.version += 1
        for listener in list(self.listeners):
            listener()

    # -- the thread ------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="amdflash-line", daemon=True)
        self._thread.start()
        self._ends_thread = threading.Thread(target=self._tell_ends, name="amdflash-line-ends", daemon=True)
        self._ends_thread.start()

    def close(self) -> None:
        self.stop.set()
        self._asked.put(None)
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._ends_thread is not None:
            self._ends_thread.join(timeout=30)
        self.notifier.close()             # first: what it delivered meanwhile leaves the saved outbox
        self.memory.save(wait=True)

    def _run(self) -> None:
        from amdflash.store import central

        while not self.stop.is_set():
            try:
                with central.connect(self.url, autocommit=True, timeout=10) as listen, \
                        central.connect(self.url, autocommit=True, timeout=10) as pg:
                    listen.execute(f"LISTEN {self._channel(listen)}")   # a reviewer's secret
                    self.load(pg)
                    self.error = None
                    self._changed()
                    self._follow(listen, pg)
            except Exception as e:
                message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                message = mask_urls(message)
                if message != self.error:
                    self.log(f"central database: {message} (trying again)")
                self.error = message
                self._changed()
                self.stop.wait(3.0)

    @staticmethod
    def _channel(pg: Any) -> str:
        """The channel progress wake-ups come on: the record's own, readable by reviewers only
        (store.central.progress_channel), or the fixed name where the record has none yet."""
        from amdflash.store import central

        find = getattr(central, "progress_channel", None)
        return str(find(pg)) if find is not None else central.PROGRESS_CHANNEL

    def _follow(self, listen: Any, pg: Any) -> None:
        next_refresh = time.monotonic() + REFRESH
        while not self.stop.is_set():
            wait = max(0.05, next_refresh - time.monotonic())
            heard = False
            for _ in listen.notifies(timeout=wait, stop_after=1):
                heard = True                      # any wake-up, with a payload or none: read what is new
            due = time.monotonic() >= next_refresh
            changed = self._poll(pg) if heard or due else []   # and every REFRESH even with no wake-up
            refreshed = False
            if due:
                refreshed = self._refresh(pg)
                next_refresh = time.monotonic() + REFRESH
            elif any(r["state"] not in ("running", "alive") for r in changed):
                refreshed = self._refresh(pg)    # an end: its signed status may follow soon
            self._decide(changed)
            if changed or refreshed:
                self._changed()

    # -- notifications ----------------------------------------------------------------------

    def report_url(self, host_id: int, run_id: Any) -> str:
        href = run_href(host_id, run_id)
        return f"{self.public_url}{href}" if href and self.public_url else (href or "")

    def _decide(self, rows: list[dict[str, Any]]) -> None:
        """Notifications from the rows not decided yet, in the record's order, each row once.
        A notification names the host the record authenticated the row by (its enrolled name),
        and carries only the row's own fields, each checked and made one printable line."""
        m = self.memory
        now = time.time()
        sent = False
        for row in rows:
            if m.seen_id is not None and row["id"] <= m.seen_id:
                continue
            m.seen_id, m.dirty = int(row["id"]), True
            if row.get("unreadable") or row.get("run_id") is None or row["state"] == "alive":
                continue
            m.last_activity, m.round_active = now, True
            if row["state"] == "running":
                continue
            key = f"{int(row['host_id'])}/{row['run_id']}"
            end = {"host_id": int(row["host_id"]), "host": word(row["host"], 64), "run": run_word(row["run_id"]),
                   "run_id": row["run_id"], "state": row["state"], "place": word(row.get("place") or row.get("board"),
                                                                                  100),
                   "resumes": run_word(row["resumes"]) if row.get("resumes") else None}
            m.round[key] = end
            if row["state"] in ENDED_BADLY and key not in m.notified and key not in m.pending:
                # Sent once its end is told from the record (the follow service pushes it within
                # seconds), or after end_wait without it.
                m.pending[key] = {**end, "id": int(row["id"]), "command": word(row.get("command") or "run", 40),
                                  "board": word(row.get("board"), 200), "error": word(row.get("error"), 500),
                                  "due": now + self.end_wait}
        sent = self._send_failures(now) or sent
        wall = dt.datetime.now(dt.UTC)
        with self.lock:
            running = any(x.state == "running" and not self._stale(x, wall) for x in self.boards.values())
        if m.round_active and not running and now - m.last_activity >= self.settle:
            self._line_done()
            sent = True
        sent = self._silent_hosts() or sent
        if sent or m.dirty and time.monotonic() - m.saved_at >= 1.0:
            m.save()      # at once when something was sent; else at most every second
        if m.problem != self._state_problem:
            self._state_problem = m.problem
            self.log(f"notification state not saved: {m.problem} (a restart may repeat or miss a notification)"
                     if m.problem else "notification state saved again")

    def _send_failures(self, now: float) -> bool:
        """Each failure waiting for its end: sent with the end's words (the flash's state, the
        backup, the next step on its host, as `fleet report` says them) once the signed record
        tells them, or without them after end_wait (a host that cannot push)."""
        m = self.memory
        sent = False
        for key, p in list(m.pending.items()):
            told = self.end_of(int(p["host_id"]), str(p["run_id"]))
            waited = now - float(p["due"]) + self.end_wait
            if told is None and (waited < self.end_wait or waited < END_WAIT_LONGEST
                                 and self._coming(int(p["host_id"]), str(p["run_id"]))):
                continue
            del m.pending[key]
            m.notified[key] = int(p["id"])
            sent = True
            said = "".join(f"\n{word(line, 1000)}" for line in (told or {}).get("lines", []))
            self.notifier.send(
                f"amdflash: run {p['run']} {p['state']} on {p['host']} ({p['place']})",
                f"{p['command']} on board {p['board']} of host {p['host']} {p['state']}: {p['error']}{said}\n"
                f"report: {self.report_url(int(p['host_id']), p['run_id'])}", "failure")
        return sent

    def _coming(self, host_id: int, run_id: str) -> bool:
        """Whether the run's end is on its way: its host said it has checkpoints the record has
        not yet (its push is under way), or the end is being told from the record now."""
        with self.lock:
            telling = any(h == host_id and r == run_id and e is None for (h, r, _), e in self.ends.items())
            lag = [(h.get("host_checkpoint"), h.get("checkpoint")) for h in self.hosts if h.get("id") == host_id]
        return telling or any(mine is not None and (held is None or mine > held) for mine, held in lag)

    def _line_done(self) -> None:
        m = self.memory
        ends = list(m.round.values())
        m.round, m.round_active = {}, False
        if not ends:
            return
        counts: dict[str, int] = {}
        for e in ends:
            counts[e["state"]] = counts.get(e["state"], 0) + 1
        failures = [e for e in ends if e["state"] in FAILED]
        fixed = {(e["host_id"], e["resumes"]): e["run"] for e in ends if e["state"] == "succeeded" and e.get("resumes")}
        lines = [f"{len(ends)} run(s) ended: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))]
        for e in failures:
            fix = fixed.get((e["host_id"], e["run"]))
            lines.append(f"- {e['state']}{f' (fixed by {fix})' if fix else ''}: {e['host']} {e['place']} run "
                         f"{e['run']}: {self.report_url(e['host_id'], e['run_id'])}")
        told = {(e["host_id"], e["run"]) for e in failures}
        for (host_id, resumed), fix in fixed.items():      # a failure of an earlier round, fixed in this one
            if (host_id, resumed) not in told:
                e = next(x for x in ends if x["host_id"] == host_id and x["run"] == fix)
                lines.append(f"- run {resumed} fixed by {fix}: {e['host']} {e['place']}")
        wall = dt.datetime.now(dt.UTC)
        with self.lock:
            stale = sum(self._stale(b, wall) for b in self.boards.values())
        if stale:
            lines.append(f"{stale} board(s) said running but nothing for over {duration(self.stale_after)}: "
                         "not waited for")
        self.notifier.send(f"amdflash: line done, {len(ends)} run(s), {len(failures)} not succeeded",
                           "\n".join(lines), "failure" if failures else "success")

    def _silent_hosts(self) -> bool:
        m = self.memory
        with self.lock:
            hosts = list(self.hosts)
        sent = False
        for h in hosts:
            heard = [t for t in (h.get("last_heard"), h.get("pushed_at")) if t is not None]
            if not heard:
                continue
            silence = age(max(heard))
            if silence is not None and silence > self.silent_after:
                if h["id"] not in m.silent:
                    m.silent.append(h["id"])
                    sent = True
                    name = word(h["name"], 64)
                    self.notifier.send(f"amdflash: host {name} silent for {duration(silence)}",
                                       f"host {name} has neither pushed nor said anything for "
                                       f"{duration(silence)} (last heard {max(heard).isoformat()})", "warning")
            elif h["id"] in m.silent:
                m.silent.remove(h["id"])
                sent = True
        return sent
