"""The line as the central record says it: the progress rows read defensively into each
board's state (Board, LineSnapshot), kept current by one thread (Line) that LISTENs for
wake-ups, reads the signed status and each host's health, and decides the notifications."""
from __future__ import annotations

import datetime as dt
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from amdflash.pipeline.fleet.serve.notify import Memory, Notifier
from amdflash.pipeline.fleet.serve.words import age, duration, mask_urls, run_href, run_word, word
from amdflash.store.status import ENDS

FAILED = ("failed", "interrupted", "refused")
ORDER = {"failed": 0, "interrupted": 1, "refused": 2, "unreadable": 3, "running": 4, "succeeded": 5}
STATES = ("running", *ENDS, "alive")
REFRESH = 2.0                       # seconds between reads of signed status and health (and new rows)
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
    owner = row.pop("owner", None)
    if owner is not None and owner != row.get("host_id"):     # a host speaks for its own runs only
        why = why or "its run id is another host's run (as the signed record holds it)"
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
        "extract(epoch FROM p.at)::float8 AS at, extract(epoch FROM p.received_at)::float8 AS received, "
        "o.host_id AS owner "
        f"FROM {NS}.progress p JOIN {NS}.hosts h ON h.id = p.host_id "
        f"LEFT JOIN {NS}.run_owners o ON o.run_id = p.run_id WHERE {where} ORDER BY {order}", params)
    names = [d.name for d in cur.description]
    return [check_row(dict(zip(names, r, strict=True))) for r in cur]


def window_rows(pg: Any, hours: float) -> list[dict[str, Any]]:
    """The newest progress row of every board heard from in the last `hours`."""
    return progress_rows(pg, "p.received_at > now() - make_interval(secs => %s) AND p.run_id IS NOT NULL",
                         (hours * 3600,), "DISTINCT ON (p.host_id, coalesce(p.board, p.run_id))",
                         "p.host_id, coalesce(p.board, p.run_id), p.id DESC")


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
                 log: Callable[[str], None] = print, state: Path | None = None, stale_after: float = 1800.0):
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
        self._state_problem: str | None = None
        self.error: str | None = None
        self._thread: threading.Thread | None = None

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
            self.memory = Memory(self.memory.path)
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
        hosts = central.hosts_health(pg)
        changed = False
        with self.lock:
            for b in self.boards.values():
                now = signed.get((b.host_id, b.row["run_id"]))
                if now != b.signed:
                    b.signed, changed = now, True
            if hosts != self.hosts:
                self.hosts, changed = hosts, True
        return changed

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
            boards = sorted((Board(b.host_id, b.host, b.key, dict(b.row), b.signed, self._stale(b, now))
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

    def close(self) -> None:
        self.stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.memory.save(wait=True)
        self.notifier.close()

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
                                                                                  100)}
            m.round[key] = end
            if row["state"] in ("failed", "interrupted") and key not in m.notified:
                m.notified[key] = int(row["id"])
                sent = True
                self.notifier.send(
                    f"amdflash: run {end['run']} {row['state']} on {end['host']} ({end['place']})",
                    f"{word(row.get('command') or 'run', 40)} on board {word(row.get('board'), 200)} of host "
                    f"{end['host']} {row['state']}: {word(row.get('error'), 500)}\n"
                    f"report: {self.report_url(end['host_id'], row['run_id'])}", "failure")
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
        lines = [f"{len(ends)} run(s) ended: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))]
        for e in failures:
            lines.append(f"- {e['state']}: {e['host']} {e['place']} run {e['run']}: "
                         f"{self.report_url(e['host_id'], e['run_id'])}")
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
