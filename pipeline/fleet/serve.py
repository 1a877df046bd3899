"""`amdflash fleet serve`: the line, live, in a browser — read-only, over the central record.

Pages (every one plain server-rendered HTML, complete with JavaScript off; a small script only
swaps in live updates, which arrive as server-sent events):

* `/` — the line at a glance: every board that said anything in the last `--window` hours
  (host, place, board, state, stage, a progress bar, bytes, rate, ETA, its run), failures
  first. A row says whether its state is the signed record's (the run was pushed and
  verified by central) or the host's live word (progress, advisory);
* `/runs/HOST_ID/RUN_ID.html` — a run's page: the HTML report of `amdflash report`, made from
  the central record as `fleet report` makes it (the run copied into a temporary trail, its
  chain and signatures checked again here, against the host's enrolled key);
* `/history` — runs of the signed record, filtered by host, board, status, image part number
  and date;
* `/health` — each host: its last push, the record's newest checkpoint of it and how far
  behind the host's own it is, when it was last heard;
* `/metrics` — Prometheus text (prometheus-client); `/events` — the live stream.

Everything shown from the record — board names, errors, paths, host names — is escaped
(docs/threat-model.md: strings from outside), and the pages link only to their own pages:
a run link is built from a host id (an integer) and a run id of the run-id shape, never
taken from a recorded value. The server connects with whatever role its URL names; it is
meant to be `amdflash_read` (SELECT only), so it can change nothing even if asked to.

One thread keeps the line current: it LISTENs on the progress channel (a host's follow
service NOTIFYs with every insert; the payload is not used: any wake-up re-reads), reads the
new rows (and every two seconds even with no wake-up), and every two seconds the signed status
of the runs shown and each host's health. Notifications (Apprise) are decided there.

What a host wrote is read defensively (docs/threat-model.md, "the line view"): its time is read
as text and its numbers checked, so a row no reader can take (an infinite rate, a time of
'infinity' or year 10000) is shown as unreadable instead of failing the page or the reader.
Notifications are decided from the record's rows in order and what was notified is kept in the
serve's state directory, so a restart, an outage or a reconnect neither loses nor repeats one;
they carry the record's own fields only, checked and made printable, as plain text.
"""
from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import math
import os
import queue
import re
import tempfile
import threading
import time
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from html import escape as _html_escape
from pathlib import Path
from typing import Any, ClassVar

from amdflash.store.status import ENDS


def escape(text: str) -> str:
    """Text for HTML: markup characters escaped, and controls and format characters (a bidi
    override from a board's name) shown as escapes, as the terminal shows them."""
    from amdflash.pipeline.terminal import printable

    return _html_escape(printable(str(text), multiline=True))


RUN_ID = re.compile(r"[0-9]{8}T[0-9]{6}-[0-9a-f]{8}")     # what amdflash's run ids look like (store/html.py)
FAILED = ("failed", "interrupted", "refused")
ORDER = {"failed": 0, "interrupted": 1, "refused": 2, "unreadable": 3, "running": 4, "succeeded": 5}
STATES = ("running", *ENDS, "alive")
REFRESH = 2.0                       # seconds between reads of signed status and health (and new rows)
BATCH = 20000                       # progress rows read at once


def word(value: Any, limit: int = 200) -> str:
    """A recorded value for a notification: one printable line (controls, bidi overrides and
    newlines shown as escapes, as the terminal shows them), at most `limit` characters."""
    from amdflash.pipeline.terminal import printable

    text = printable("" if value is None else str(value))
    return text if len(text) <= limit else text[:limit - 1] + "…"


def run_word(run_id: Any) -> str:
    """A run id for a notification: only one of amdflash's shape is named."""
    return run_id if isinstance(run_id, str) and RUN_ID.fullmatch(run_id) else "(not a run id)"


_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://([^\s'\"<>]*)")
_HOST = re.compile(r"(?:localhost|[0-9.]+|\[[0-9a-fA-F:.]+\]|[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+)(?::[0-9]+)?")


def mask_url(url: str) -> str:
    """A URL for a message: its scheme and host only, a user, password or token as `***`
    (Apprise URLs carry tokens in the user part, the path, the query, and even the host)."""
    m = _URL.match(url.strip())
    if not m:
        return "***"
    scheme, rest = m.groups()
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    tail = rest[len(authority):]
    user, at, host = authority.rpartition("@")
    shown = ("***@" if at else "") + (host if _HOST.fullmatch(host) else "***" if host else "")
    return f"{scheme}://{shown}" + ("/***" if tail.strip("/") else "")


def no_password(text: str) -> str:
    """`text` with any password=… of a connection string (libpq's key=value or URL query) as ***."""
    return re.sub(r"((?:ssl)?password\s*=\s*)('[^']*'|[^\s&]*)", r"\1***", text, flags=re.IGNORECASE)


def mask_urls(text: str) -> str:
    """`text` with every URL in it masked (mask_url), and any password=… of a connection string."""
    return _URL.sub(lambda m: mask_url(m.group(0)), no_password(text))


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


def _age(when: dt.datetime | None, now: dt.datetime | None = None) -> float | None:
    if when is None:
        return None
    now = now or dt.datetime.now(dt.UTC)
    return max(0.0, (now - when).total_seconds())


def _bytes(n: int | None) -> str:
    if n is None:
        return ""
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def _duration(seconds: float | None) -> str:
    if seconds is None or math.isnan(seconds) or seconds < 0:
        return ""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def run_href(host_id: int | None, run_id: str | None, prefix: str = "") -> str | None:
    """This server's page of a run, or None for a value that is not a run id (never a link)."""
    if host_id is None or not run_id or not RUN_ID.fullmatch(run_id):
        return None
    return f"{prefix}runs/{int(host_id)}/{run_id}.html"


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


class _MaskUrls:
    """A logging filter: every URL in a record masked (mask_urls)."""

    def filter(self, record: Any) -> bool:
        record.msg, record.args = mask_urls(record.getMessage()), ()
        return True


class Notifier:
    """Apprise, on a thread of its own: a slow or unreachable notification service never holds
    up the line view. Every message is plain text (an e-mail has no HTML part: nothing a host
    wrote becomes a link or a remote image), and a URL is never printed whole (mask_url)."""

    def __init__(self, urls: list[str], log: Callable[[str], None]):
        self.urls = urls
        self.log = log
        self.sent: list[tuple[str, str]] = []
        self._queue: queue.Queue[tuple[str, str, str] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        if urls:
            import logging

            import apprise

            apprise_log = logging.getLogger("apprise")     # Apprise says URLs too: masked as ours are
            if not any(isinstance(f, _MaskUrls) for f in apprise_log.filters):
                apprise_log.addFilter(_MaskUrls())
            self._apprise = apprise.Apprise()
            for url in urls:
                if not self._apprise.add(url):
                    raise ValueError(f"--notify {mask_url(url)}: not a notification URL Apprise knows")
            self._thread = threading.Thread(target=self._work, daemon=True)
            self._thread.start()

    def send(self, title: str, body: str, kind: str = "info") -> None:
        self.sent.append((title, body))
        self.log(f"notify: {title}")
        if self._thread is not None:
            self._queue.put((title, body, kind))

    def _work(self) -> None:
        import apprise

        types = {"info": apprise.NotifyType.INFO, "failure": apprise.NotifyType.FAILURE,
                 "warning": apprise.NotifyType.WARNING, "success": apprise.NotifyType.SUCCESS}
        while (item := self._queue.get()) is not None:
            title, body, kind = item
            try:
                if not self._apprise.notify(title=title, body=body, notify_type=types[kind],
                                            body_format=apprise.NotifyFormat.TEXT):
                    self.log(f"notification not delivered: {title}")
            except Exception as e:
                self.log(f"notification failed: {title}: {mask_urls(str(e))}")

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=30)


NOTIFIED_KEPT = 20000               # run ends remembered as notified (the oldest are forgotten)


@dataclass
class Memory:
    """What notifications remember, kept in `path` (the serve's state directory; None: in memory
    only). Rows are decided in the record's order, each once: `seen_id` is the last decided, so
    rows that arrived while the serve was stopped or central was out of reach are decided when it
    reads again, and `notified` holds every run end already notified, so none is sent twice."""

    path: Path | None = None
    seen_id: int | None = None                           # None: never read (the first read sets it)
    notified: dict[str, int] = field(default_factory=dict)         # "HOST_ID/RUN_ID" → its row's id
    silent: list[int] = field(default_factory=list)                # hosts notified as silent
    round: dict[str, dict[str, Any]] = field(default_factory=dict)   # the current round's ends
    round_active: bool = False
    last_activity: float = 0.0                                     # wall clock of the newest row decided
    saved_at: float = 0.0
    dirty: bool = False                                            # decided more than was saved
    _pending: str | None = field(default=None, repr=False)         # the newest state not written yet
    _writer: threading.Thread | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    problem: str | None = field(default=None, repr=False)          # why the last write failed (None: it did not)

    FIELDS: ClassVar[dict[str, type | tuple[type, ...]]] = {
        "seen_id": (int, type(None)), "notified": dict, "silent": list, "round": dict, "round_active": bool,
        "last_activity": (int, float)}

    @classmethod
    def load(cls, path: Path | None) -> Memory:
        memory = cls(path)
        if path is None or not path.exists():
            return memory
        try:
            data = json.loads(path.read_text())
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            for name, kind in cls.FIELDS.items():
                if name in data:
                    if not isinstance(data[name], kind):
                        raise ValueError(f"{name} is a {type(data[name]).__name__}")
                    setattr(memory, name, data[name])
        except (OSError, ValueError) as e:
            raise ValueError(f"{path}: not the line view's notification state ({e}): move it away to start "
                             "afresh") from None
        return memory

    def save(self, wait: bool = False) -> None:
        """The state as it is now, written by a thread of its own (the line's thread never waits
        on the disk; `wait`: until it is written)."""
        self.saved_at, self.dirty = time.monotonic(), False
        if self.path is None:
            return
        while len(self.notified) > NOTIFIED_KEPT:
            del self.notified[next(iter(self.notified))]
        data = json.dumps({name: getattr(self, name) for name in self.FIELDS}, sort_keys=True)
        with self._lock:
            self._pending = data
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_pending, name="amdflash-line-state", daemon=True)
                self._writer.start()
            writer = self._writer
        if wait:
            writer.join()

    def _write_pending(self) -> None:
        while True:
            with self._lock:
                data, self._pending = self._pending, None
                if data is None:
                    self._writer = None
                    return
            try:
                self._write(data)
                self.problem = None
            except OSError as e:
                self.problem = f"{self.path}: {e.strerror or e}"

    def _write(self, data: str) -> None:
        """Written whole to a temporary file (0600) and renamed over the old one: a crash leaves
        the old state or the new, never half of one."""
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)


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
            lines.append(f"{stale} board(s) said running but nothing for over {_duration(self.stale_after)}: "
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
            silence = _age(max(heard))
            if silence is not None and silence > self.silent_after:
                if h["id"] not in m.silent:
                    m.silent.append(h["id"])
                    sent = True
                    name = word(h["name"], 64)
                    self.notifier.send(f"amdflash: host {name} silent for {_duration(silence)}",
                                       f"host {name} has neither pushed nor said anything for "
                                       f"{_duration(silence)} (last heard {max(heard).isoformat()})", "warning")
            elif h["id"] in m.silent:
                m.silent.remove(h["id"])
                sent = True
        return sent


# -- rendering ---------------------------------------------------------------------------------

CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #1d2330; background: #f6f7f9; }
header { background: #1d2330; color: #fff; padding: 10px 20px; display: flex; gap: 24px; align-items: baseline; }
header a { color: #cfe0ff; } header h1 { font-size: 18px; margin: 0; }
main { padding: 16px 20px; }
table { border-collapse: collapse; width: 100%; background: #fff; }
th, td { text-align: left; padding: 5px 8px; border-bottom: 1px solid #e3e6ea; vertical-align: top; }
th { background: #eef1f5; font-weight: 600; }
.state { font-weight: 600; padding: 1px 6px; border-radius: 3px; }
.s-failed, .s-interrupted, .s-refused { background: #fde2e1; color: #8e1b13; }
.s-running { background: #e2eefe; color: #123f86; }
.s-succeeded { background: #e0f4e3; color: #14592a; }
.s-unreadable { background: #fff7d6; color: #6b4e00; }
tr.s-failed td, tr.s-interrupted td { background: #fff6f5; }
progress { width: 160px; height: 14px; }
.muted { color: #6b7280; } .mono { font-family: ui-monospace, monospace; font-size: 12px; }
.summary span { margin-right: 16px; } .error { color: #8e1b13; max-width: 420px; }
form.filters label { margin-right: 12px; } .note { color: #6b7280; margin: 8px 0; }
.banner { padding: 8px 20px; background: #fff7d6; border-bottom: 1px solid #e8d98a; }
.banner.bad { background: #fde2e1; } .banner.good { background: #e0f4e3; }
"""

SCRIPT = """// Live updates: the server sends the line's table as it changes (server-sent events).
(function () {
  if (!window.EventSource) { return; }
  var source = new EventSource("events");
  source.addEventListener("line", function (event) {
    var data = JSON.parse(event.data);
    document.getElementById("boards").innerHTML = data.rows;
    document.getElementById("summary").innerHTML = data.summary;
    document.getElementById("updated").textContent = data.updated;
    document.body.setAttribute("data-version", data.version);
  });
  source.onerror = function () { document.getElementById("updated").textContent = "reconnecting…"; };
})();
"""

CSP = ("default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self'; "
       "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")


def page(title: str, body: str, script: bool = False, prefix: str = "") -> str:
    nav = (f"<header><h1>amdflash line</h1><a href=\"{prefix}./\">line</a><a href=\"{prefix}history\">history</a>"
           f"<a href=\"{prefix}health\">health</a></header>")
    tail = f"<script src=\"{prefix}static/line.js\"></script>" if script else ""
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{escape(title)}</title>"
            f"<style>{CSS}</style></head><body>{nav}<main>{body}</main>{tail}</body></html>\n")


def _state(state: str) -> str:
    return f"<span class=\"state s-{escape(state)}\">{escape(state)}</span>"


def _time(when: Any) -> str:
    if isinstance(when, dt.datetime):
        return escape(when.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC"))
    return escape(str(when or ""))


def board_row(b: Board, prefix: str = "") -> str:
    row = b.row
    state = b.state
    done, total = row.get("bytes_done"), row.get("bytes_total")
    if state == "running" and total:
        bar = f"<progress value=\"{int(done or 0)}\" max=\"{int(total)}\"></progress> "
    elif total:
        bar = f"<progress value=\"{int(done or 0)}\" max=\"{int(total)}\"></progress> "
    else:
        bar = ""
    amounts = f"{_bytes(done)} / {_bytes(total)}" if total else ""
    rate = f"{_bytes(int(row['rate']))}/s" if row.get("rate") and state == "running" else ""
    eta = _duration(row.get("eta")) if state == "running" else ""
    href = run_href(b.host_id, row.get("run_id"), prefix)
    run = escape(str(row.get("run_id") or ""))
    link = f"<a class=\"mono\" href=\"{href}\">{run}</a>" if href else f"<span class=\"mono\">{run}</span>"
    source = ("<span title=\"the run's signed record, verified by the central database\">signed</span>"
              if b.source == "signed" else
              "<span class=\"muted\" title=\"the host's live word: advisory, not signed\">live</span>")
    stage = escape(str(row.get("stage") or "")) if state == "running" else ""
    if b.stale:
        stage += " <span class=\"muted\">(no word of it for a long time: not waited for)</span>"
    error = escape(str(row.get("error") or "")) if state != "succeeded" else ""
    if state == "unreadable":
        error = escape(f"this row does not read: {row.get('unreadable')}")
    job = escape(str(row.get("command") or ""))
    if row.get("resumes"):
        job += " <span class=\"muted\">(resumes " + escape(str(row["resumes"])) + ")</span>"
    return (f"<tr class=\"s-{escape(state)}\" data-host=\"{escape(b.host)}\" data-place=\"{escape(b.place)}\" "
            f"data-state=\"{escape(state)}\" data-run=\"{run}\" data-source=\"{b.source}\" "
            f"data-job=\"{escape(str(row.get('command') or ''))}\">"
            f"<td>{escape(b.host)}</td><td>{escape(b.place)}</td><td>{_state(state)} {source}</td>"
            f"<td>{job}</td><td>{stage}</td><td data-field=\"progress\">{bar}{escape(amounts)}</td>"
            f"<td>{escape(rate)}</td><td>{escape(eta)}</td><td>{link}</td><td class=\"error\">{error}</td></tr>")


def _unreadable_row(b: Board, problem: Exception) -> str:
    return (f"<tr class=\"s-unreadable\" data-host=\"{escape(b.host)}\" data-place=\"{escape(b.place)}\" "
            f"data-state=\"unreadable\"><td>{escape(b.host)}</td><td>{escape(b.place)}</td>"
            f"<td>{_state('unreadable')}</td><td colspan=\"7\" class=\"error\">this row does not read: "
            f"{escape(type(problem).__name__)}</td></tr>")


def rows_html(snap: LineSnapshot, prefix: str = "") -> str:
    if not snap.boards:
        return "<tr><td colspan=\"10\" class=\"muted\">no board has said anything in the window</td></tr>"
    out = []
    for b in snap.boards:
        try:
            out.append(board_row(b, prefix))
        except (TypeError, ValueError, OverflowError, KeyError) as e:   # one odd row never takes the page down
            out.append(_unreadable_row(b, e))
    return "\n".join(out)


def summary_html(snap: LineSnapshot, error: str | None = None) -> str:
    counts: dict[str, int] = {}
    for b in snap.boards:
        counts[b.state] = counts.get(b.state, 0) + 1
    parts = [f"<span>{len(snap.boards)} board(s)</span>"]
    parts += [f"<span>{_state(s)} {n}</span>" for s, n in sorted(counts.items(), key=lambda x: ORDER.get(x[0], 9))]
    if error:
        parts.append(f"<span class=\"error\">central database: {escape(error)}</span>")
    return "".join(parts)


def line_page(snap: LineSnapshot, window_hours: float, error: str | None = None) -> str:
    head = ("<tr><th>host</th><th>place</th><th>state</th><th>job</th><th>stage</th><th>progress</th><th>rate</th>"
            "<th>ETA</th><th>run (report)</th><th>error</th></tr>")
    body = (f"<p class=\"summary\" id=\"summary\">{summary_html(snap, error)}</p>"
            f"<p class=\"note\">Every board that said anything in the last {window_hours:g} h, failures first. "
            "<b>signed</b>: the run's end as its signed record says it (pushed, verified by the central "
            "database); <b>live</b>: the host's word, advisory until its record is pushed. "
            f"Updated <span id=\"updated\">{_time(snap.at)}</span>"
            "<noscript> (live updates need JavaScript: reload for the newest)</noscript>.</p>"
            f"<table><thead>{head}</thead><tbody id=\"boards\">{rows_html(snap)}</tbody></table>")
    return page("amdflash line", body, script=True)


def health_page(snap: LineSnapshot, error: str | None = None) -> str:
    rows = []
    for h in snap.hosts:
        pushed, heard = h.get("pushed_at"), h.get("last_heard")
        central_last, host_last = h.get("checkpoint"), h.get("host_checkpoint")
        behind = (host_last - central_last) if host_last is not None and central_last is not None else None
        lag = ("" if behind is None else "up to date" if behind <= 0 else f"{behind} checkpoint(s) not pushed yet")
        verified = (f"verified by the central database at every push, through #{central_last}"
                    if central_last else "nothing pushed yet")
        rows.append(f"<tr data-host=\"{escape(str(h['name']))}\"><td>{escape(str(h['name']))}</td>"
                    f"<td>{_time(pushed)} <span class=\"muted\">{escape(_duration(_age(pushed, snap.at)))} "
                    f"ago</span></td><td>{escape(verified)}</td><td>{escape(lag)}</td>"
                    f"<td>{_time(heard)} <span class=\"muted\">{escape(_duration(_age(heard, snap.at)))} ago</span>"
                    "</td></tr>")
    problem = f"<p class=\"error\">central database: {escape(error)}</p>" if error else ""
    body = (f"{problem}<table><thead><tr><th>host</th><th>last push</th><th>chain</th><th>push lag</th>"
            "<th>last heard (progress)</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
            "<p class=\"note\">The central database verifies every checkpoint and row as it is pushed and "
            "refuses what does not verify; push lag compares the newest checkpoint the host last said it had "
            "with the newest the record holds.</p>")
    return page("amdflash line: health", body)


# -- the web application -----------------------------------------------------------------------

HISTORY_FIELDS = ("host", "board", "status", "part", "since", "until")
INT4 = 2**31 - 1                      # a host id beyond this is no host (PostgreSQL's integer)


def history_filters(query: Any) -> dict[str, str]:
    """The history's filters from a query string; ValueError naming the field that is not one
    (a control character such as NUL, over 200 characters, a status or date that is none)."""
    filters = {}
    for name in HISTORY_FIELDS:
        value = query.get(name, "")
        if len(value) > 200:
            raise ValueError(f"{name}: longer than 200 characters")
        if any(unicodedata.category(c) == "Cc" for c in value):
            raise ValueError(f"{name}: holds a control character")
        filters[name] = value
    if filters["status"] not in ("", "running", *ENDS):
        raise ValueError(f"status {filters['status']!r}: not one of running, {', '.join(ENDS)}")
    for name in ("since", "until"):
        if filters[name]:
            try:
                dt.date.fromisoformat(filters[name])
            except ValueError:
                raise ValueError(f"{name} {filters[name]!r}: not a date (YYYY-MM-DD)") from None
    return filters


def _history_query(pg: Any, filters: dict[str, str], limit: int = 500) -> list[dict[str, Any]]:
    from amdflash.store import central

    runs = central.select_runs(pg, host=filters.get("host") or None, board=filters.get("board") or None,
                               since=filters.get("since") or None, until=filters.get("until") or None,
                               newest_first=True, limit=None if filters.get("status") or filters.get("part")
                               else limit)
    if filters.get("status"):
        runs = [r for r in runs if r["status"] == filters["status"]]
    parts = central.image_parts(pg, [(r["host_id"], r["run_id"]) for r in runs[:5000]])
    for r in runs:
        r["part"] = parts.get((r["host_id"], r["run_id"]))
    if filters.get("part"):
        runs = [r for r in runs if r["part"] and filters["part"].lower() in r["part"].lower()]
    return runs[:limit]


def history_page(runs: list[dict[str, Any]], filters: dict[str, str], hosts: list[str]) -> str:
    def field_(name: str, label: str, kind: str = "text") -> str:
        return (f"<label>{label} <input type=\"{kind}\" name=\"{name}\" value=\"{escape(filters.get(name, ''))}\">"
                "</label>")

    options = "".join(f"<option{' selected' if filters.get('status') == s else ''}>{s}</option>"
                      for s in ("", "running", *ENDS))
    host_options = "".join(f"<option{' selected' if filters.get('host') == h else ''}>{escape(h)}</option>"
                           for h in ["", *hosts])
    form = (f"<form class=\"filters\" method=\"get\" action=\"history\"><label>host <select name=\"host\">"
            f"{host_options}</select></label>{field_('board', 'board')}<label>status <select name=\"status\">"
            f"{options}</select></label>{field_('part', 'image part number')}{field_('since', 'from', 'date')}"
            f"{field_('until', 'before', 'date')}<button type=\"submit\">filter</button></form>")
    rows = []
    for r in runs:
        href = run_href(r["host_id"], r["run_id"])
        run = escape(r["run_id"])
        link = f"<a class=\"mono\" href=\"{href}\">{run}</a>" if href else f"<span class=\"mono\">{run}</span>"
        rows.append(f"<tr data-run=\"{run}\" data-state=\"{escape(r['status'])}\"><td>{escape(r['host'])}</td>"
                    f"<td>{link}</td><td>{escape(str(r['command']))}</td><td>{_state(r['status'])}</td>"
                    f"<td class=\"mono\">{escape(str(r['board_spec'] or ''))}</td>"
                    f"<td class=\"mono\">{escape(str(r['unique_id'] or ''))}</td>"
                    f"<td>{escape(str(r['part'] or ''))}</td>"
                    f"<td>{escape(str(r['started'] or ''))}</td><td>{escape(str(r['updated'] or ''))}</td></tr>")
    table = ("<table><thead><tr><th>host</th><th>run</th><th>command</th><th>status</th><th>board</th>"
             "<th>unique ID</th><th>image part</th><th>started</th><th>updated</th></tr></thead><tbody>"
             + ("".join(rows) or "<tr><td colspan=\"9\" class=\"muted\">no run matches</td></tr>")
             + "</tbody></table>")
    note = ("<p class=\"note\">Runs of the signed record (pushed and verified by the central database), newest "
            f"first; {len(runs)} shown.</p>")
    return page("amdflash line: history", form + note + table)


def _banner(ok: bool, host: str, run_id: str, problem: str | None) -> str:
    if ok:
        return (f"<div class=\"banner good\" data-field=\"verification\">verified here: run {escape(run_id)} of "
                f"host {escape(host)}, copied from the central record, its chain and signatures checked again "
                "against the host's enrolled key</div>")
    return (f"<div class=\"banner bad\" data-field=\"verification\">NOT verified: run {escape(run_id)} of host "
            f"{escape(host)}: {escape(problem or 'its chain or signatures do not hold')}</div>")


def render_run(url: str, host_id: int, run_id: str) -> tuple[int, str]:
    """(HTTP status, page) of one run: its report from the central record, checked again here."""
    from amdflash.pipeline.commands import board as commands
    from amdflash.pipeline.errors import Refusal
    from amdflash.store import central
    from amdflash.store.keys import KeyError_
    from amdflash.store.run_rows import RunUnverified

    with central.connect(url) as pg:
        central.need_schema(pg)
        host = pg.execute(f"SELECT name, public_key FROM {central.NS}.hosts WHERE id = %s", (host_id,)).fetchone()
    if host is None:
        return 404, page("no such host", f"<p>No host #{int(host_id)} is enrolled.</p>", prefix="../../")
    name, public = str(host[0]), bytes(host[1])
    with tempfile.TemporaryDirectory(prefix="amdflash-serve-") as tmp:
        key = Path(tmp) / "host.pub"
        from amdflash.store.keys import public_line

        key.write_text(public_line(public) + "\n")
        try:
            found = central.materialize(url, f"{name}/{run_id}", Path(tmp) / "run.sqlite")
        except central.CentralError as e:
            return 404, page("run not in the record", f"<p>{escape(str(e))}: a run's page exists once its host "
                             "has pushed it (its follow service pushes after every end; the push timer every 30 s)."
                             " Its live state is on the <a href=\"../../\">line</a>.</p>", prefix="../../")
        try:
            rep, html = commands.report(found, str(Path(tmp) / "run.sqlite"), html=True, keys=[key])
        except (Refusal, RunUnverified, KeyError_) as e:
            return 409, page("run does not verify", _banner(False, name, run_id, str(e)), prefix="../../")
    chain = rep.get("chain") or {}
    banner = _banner(bool(chain.get("ok")), name, run_id, chain.get("problem"))
    nav = ("<nav style=\"padding:6px 20px;background:#1d2330\"><a style=\"color:#cfe0ff\" href=\"../../\">line</a> · "
           "<a style=\"color:#cfe0ff\" href=\"../../history\">history</a></nav>")
    assert html is not None
    return 200, html.replace("<body>\n", f"<body>\n{nav}{banner}\n", 1)


def app(line: Line, url: str, allowed_hosts: list[str] | None = None) -> Any:
    """The Starlette application over `line` (kept current by its thread) and the record at `url`,
    answering only requests whose Host: is one of `allowed_hosts` (default this machine's names:
    a page of another name is how DNS rebinding reaches a loopback server)."""
    from sse_starlette.sse import EventSourceResponse
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.middleware.trustedhost import TrustedHostMiddleware
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, PlainTextResponse, Response
    from starlette.routing import Route

    from amdflash.pipeline.fleet import metrics

    headers = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
               "Cache-Control": "no-store"}
    loop_box: dict[str, asyncio.AbstractEventLoop] = {}
    clients: set[asyncio.Queue[int]] = set()

    def wake() -> None:   # from the line's thread
        loop = loop_box.get("loop")
        if loop is not None:
            loop.call_soon_threadsafe(_broadcast)

    def _broadcast() -> None:
        for q in list(clients):
            if q.empty():
                q.put_nowait(1)

    line.listeners.append(wake)

    async def index(request: Request) -> Response:
        return HTMLResponse(line_page(line.snapshot(), line.window_hours, line.error), headers=headers)

    async def events(request: Request) -> Response:
        loop_box["loop"] = asyncio.get_running_loop()
        mine: asyncio.Queue[int] = asyncio.Queue(maxsize=1)
        clients.add(mine)

        async def stream() -> Any:
            try:
                while True:
                    snap = line.snapshot()
                    yield {"event": "line", "data": json.dumps({
                        "rows": rows_html(snap), "summary": summary_html(snap, line.error),
                        "updated": _time(snap.at), "version": snap.version})}
                    await mine.get()
            finally:
                clients.discard(mine)

        return EventSourceResponse(stream(), ping=15, headers={"Cache-Control": "no-store"})

    async def script(request: Request) -> Response:
        return Response(SCRIPT, media_type="text/javascript", headers=headers)

    async def run_page(request: Request) -> Response:
        host_id, run_file = request.path_params["host_id"], request.path_params["run"]
        run_id = run_file[:-len(".html")] if run_file.endswith(".html") else run_file
        if not RUN_ID.fullmatch(run_id) or host_id > INT4:
            return HTMLResponse(page("not a run", "<p>Not a run id.</p>", prefix="../../"), 404, headers=headers)
        status, body = await asyncio.to_thread(render_run, url, int(host_id), run_id)
        return HTMLResponse(body, status, headers=headers)

    async def history(request: Request) -> Response:
        from amdflash.store import central

        try:
            filters = history_filters(request.query_params)
        except ValueError as e:
            return PlainTextResponse(f"history: {word(str(e), 300)}\n", 400, headers=headers)

        def query() -> tuple[list[dict[str, Any]], list[str]]:
            with central.connect(url) as pg:
                central.need_schema(pg)
                hosts = [h["name"] for h in central.hosts_health(pg)]
                return _history_query(pg, filters), hosts

        runs, hosts = await asyncio.to_thread(query)
        return HTMLResponse(history_page(runs, filters, hosts), headers=headers)

    async def health(request: Request) -> Response:
        return HTMLResponse(health_page(line.snapshot(), line.error), headers=headers)

    collector = metrics.Collector(line, url)

    async def metrics_page(request: Request) -> Response:
        body, media = await asyncio.to_thread(collector.render)
        return Response(body, media_type=media)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Any) -> Any:
        loop_box["loop"] = asyncio.get_running_loop()
        yield

    hosts = allowed_hosts if allowed_hosts is not None else ["127.0.0.1", "localhost"]
    return Starlette(routes=[
        Route("/", index), Route("/events", events), Route("/static/line.js", script),
        Route("/runs/{host_id:int}/{run}", run_page), Route("/history", history), Route("/health", health),
        Route("/metrics", metrics_page),
    ], lifespan=lifespan, middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=hosts)])


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--listen {text}: expected HOST:PORT (e.g. 127.0.0.1:8470)")
    return host.strip("[]") or "127.0.0.1", int(port)


def allowed(listen_host: str, given: list[str]) -> list[str]:
    """The Host: names served: the bind address, localhost, and what the operator added."""
    return list(dict.fromkeys([listen_host, "localhost", *given]))


def state_file(state_dir: Path, url: str) -> Path:
    """The notification state of the record at `url` (one file per record: a serve of another
    record, or a test's, never takes this one's for its own)."""
    import hashlib

    from amdflash.store.central import shown_url

    return state_dir / f"notified-{hashlib.sha256(no_password(shown_url(url)).encode()).hexdigest()[:16]}.json"


def serve(url: str, listen: str, notify: list[str], window_hours: float, silent_after: float, settle: float,
          public_url: str, log: Callable[[str], None], state_dir: Path | None = None,
          allowed_hosts: list[str] | None = None, stale_after: float = 1800.0) -> int:
    import uvicorn

    host, port = parse_listen(listen)
    notifier = Notifier(notify, log)
    line = Line(url, window_hours, notifier, silent_after, settle, public_url or f"http://{listen}/", log,
                state_file(state_dir, url) if state_dir else None, stale_after)
    line.start()
    config = uvicorn.Config(app(line, url, allowed(host, allowed_hosts or [])), host=host, port=port,
                            log_level="warning", lifespan="on", timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)

    from amdflash.store.central import shown_url

    log(f"serving the line at http://{host}:{port}/ (read-only, from {no_password(shown_url(url))})")
    try:
        server.run()
    finally:
        line.close()
    return 0

