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
service NOTIFYs with every insert), reads the new rows, and every two seconds the signed
status of the runs shown and each host's health. Notifications (Apprise) are decided there.
"""
from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import math
import queue
import re
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from html import escape as _html_escape
from pathlib import Path
from typing import Any

from amdflash.store.status import ENDS

def escape(text: str) -> str:
    """Text for HTML: markup characters escaped, and controls and format characters (a bidi
    override from a board's name) shown as escapes, as the terminal shows them."""
    from amdflash.pipeline.terminal import printable

    return _html_escape(printable(str(text), multiline=True))


RUN_ID = re.compile(r"[0-9]{8}T[0-9]{6}-[0-9a-f]{8}")     # what amdflash's run ids look like (store/html.py)
FAILED = ("failed", "interrupted", "refused")
ORDER = {"failed": 0, "interrupted": 1, "refused": 2, "running": 3, "succeeded": 4}
REFRESH = 2.0                       # seconds between reads of signed status and health


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

    @property
    def state(self) -> str:
        """The signed record's end when it has one; else the host's live word."""
        if self.signed in ENDS:
            return str(self.signed)
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


class Notifier:
    """Apprise, on a thread of its own: a slow or unreachable notification service never holds
    up the line view."""

    def __init__(self, urls: list[str], log: Callable[[str], None]):
        self.urls = urls
        self.log = log
        self.sent: list[tuple[str, str]] = []
        self._queue: queue.Queue[tuple[str, str, str] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        if urls:
            import apprise

            self._apprise = apprise.Apprise()
            for url in urls:
                if not self._apprise.add(url):
                    raise ValueError(f"--notify {url}: not a notification URL Apprise knows")
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
                if not self._apprise.notify(title=title, body=body, notify_type=types[kind]):
                    self.log(f"notification not delivered: {title}")
            except Exception as e:
                self.log(f"notification failed: {title}: {e}")

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=30)


@dataclass
class Watch:
    """What notifications need to remember."""

    started_id: int = 0                                  # rows before this were there at start: no alerts
    alerted: set[tuple[int, str]] = field(default_factory=set)
    silent: set[int] = field(default_factory=set)
    round_ends: dict[tuple[int, str], Board] = field(default_factory=dict)
    round_active: bool = False
    last_activity: float = 0.0


class Line:
    """The line as the central record says it, kept current by one thread."""

    def __init__(self, url: str, window_hours: float = 24.0, notifier: Notifier | None = None,
                 silent_after: float = 600.0, settle: float = 30.0, public_url: str = "",
                 log: Callable[[str], None] = print):
        self.url = url
        self.window_hours = window_hours
        self.notifier = notifier or Notifier([], log)
        self.silent_after = silent_after
        self.settle = settle
        self.public_url = public_url.rstrip("/") + "/" if public_url else ""
        self.log = log
        self.boards: dict[tuple[int, str], Board] = {}
        self.hosts: list[dict[str, Any]] = []
        self.version = 0
        self.last_id = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.listeners: list[Callable[[], None]] = []
        self.watch = Watch()
        self.error: str | None = None
        self._thread: threading.Thread | None = None

    # -- reading the record ----------------------------------------------------------------

    def load(self, pg: Any) -> None:
        from amdflash.store import central

        central.need_schema(pg)
        last = central.last_progress_id(pg)
        rows = central.line_progress(pg, self.window_hours)
        with self.lock:
            self.boards = {}
            for row in rows:
                self._take(row)
            self.last_id = max([last, *(r["id"] for r in rows)])
            self.watch.started_id = self.last_id
        self._refresh(pg)

    def _take(self, row: dict[str, Any]) -> Board | None:
        if row.get("run_id") is None:
            return None
        key = (int(row["host_id"]), str(row.get("board") or row["run_id"]))
        board = self.boards.get(key)
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

    def _poll(self, pg: Any) -> list[Board]:
        from amdflash.store import central

        rows = central.progress_after(pg, self.last_id)
        changed = []
        with self.lock:
            for row in rows:
                self.last_id = max(self.last_id, int(row["id"]))
                board = self._take(row)
                if board is not None:
                    changed.append(board)
        return changed

    def snapshot(self) -> LineSnapshot:
        with self.lock:
            boards = sorted((Board(b.host_id, b.host, b.key, dict(b.row), b.signed) for b in self.boards.values()),
                            key=Board.sort_key)
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
        self.notifier.close()

    def _run(self) -> None:
        from amdflash.store import central

        while not self.stop.is_set():
            try:
                with central.connect(self.url, autocommit=True, timeout=10) as listen, \
                        central.connect(self.url, autocommit=True, timeout=10) as pg:
                    listen.execute(f"LISTEN {central.PROGRESS_CHANNEL}")
                    self.load(pg)
                    self.error = None
                    self._changed()
                    self._follow(listen, pg)
            except Exception as e:
                message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                if message != self.error:
                    self.log(f"central database: {message} (trying again)")
                self.error = message
                self._changed()
                self.stop.wait(3.0)

    def _follow(self, listen: Any, pg: Any) -> None:
        next_refresh = time.monotonic() + REFRESH
        while not self.stop.is_set():
            wait = max(0.05, next_refresh - time.monotonic())
            heard = False
            for _ in listen.notifies(timeout=wait, stop_after=1):
                heard = True
            changed = self._poll(pg) if heard else []
            refreshed = False
            if time.monotonic() >= next_refresh:
                refreshed = self._refresh(pg)
                next_refresh = time.monotonic() + REFRESH
            elif any(b.row["state"] != "running" for b in changed):
                refreshed = self._refresh(pg)    # an end: its signed status may follow soon
            self._decide(changed)
            if changed or refreshed:
                self._changed()

    # -- notifications ----------------------------------------------------------------------

    def report_url(self, board: Board) -> str:
        href = run_href(board.host_id, board.row.get("run_id"))
        return f"{self.public_url}{href}" if href and self.public_url else (href or "")

    def _decide(self, changed: list[Board]) -> None:
        w = self.watch
        now = time.monotonic()
        for b in changed:
            row = b.row
            if row["id"] <= w.started_id:
                continue
            w.last_activity = now
            if row["state"] == "running":
                w.round_active = True
                continue
            w.round_ends[(b.host_id, row["run_id"])] = b
            w.round_active = True
            if row["state"] in ("failed", "interrupted") and (b.host_id, row["run_id"]) not in w.alerted:
                w.alerted.add((b.host_id, row["run_id"]))
                error = row.get("error") or ""
                self.notifier.send(f"amdflash: run {row['run_id']} {row['state']} on {b.host} ({b.place})",
                                   f"{row.get('command') or 'run'} on board {row.get('board')} of host {b.host} "
                                   f"{row['state']}: {error}\nreport: {self.report_url(b)}", "failure")
        with self.lock:
            running = any(x.state == "running" for x in self.boards.values())
        if w.round_active and not running and now - w.last_activity >= self.settle:
            self._line_done()
        self._silent_hosts()

    def _line_done(self) -> None:
        w = self.watch
        ends = list(w.round_ends.values())
        w.round_ends, w.round_active = {}, False
        if not ends:
            return
        counts: dict[str, int] = {}
        for b in ends:
            counts[b.row["state"]] = counts.get(b.row["state"], 0) + 1
        failures = [b for b in ends if b.row["state"] in FAILED]
        lines = [f"{len(ends)} run(s) ended: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))]
        for b in failures:
            lines.append(f"- {b.row['state']}: {b.host} {b.place} run {b.row['run_id']}: {self.report_url(b)}")
        self.notifier.send(f"amdflash: line done, {len(ends)} run(s), {len(failures)} not succeeded",
                           "\n".join(lines), "failure" if failures else "success")

    def _silent_hosts(self) -> None:
        w = self.watch
        with self.lock:
            hosts = list(self.hosts)
        for h in hosts:
            heard = [t for t in (h.get("last_heard"), h.get("pushed_at")) if t is not None]
            if not heard:
                continue
            silence = _age(max(heard))
            if silence is not None and silence > self.silent_after:
                if h["id"] not in w.silent:
                    w.silent.add(h["id"])
                    self.notifier.send(f"amdflash: host {h['name']} silent for {_duration(silence)}",
                                       f"host {h['name']} has neither pushed nor said anything for "
                                       f"{_duration(silence)} (last heard {max(heard).isoformat()})", "warning")
            else:
                w.silent.discard(h["id"])


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
    error = escape(str(row.get("error") or "")) if state != "succeeded" else ""
    job = escape(str(row.get("command") or ""))
    if row.get("resumes"):
        job += " <span class=\"muted\">(resumes " + escape(str(row["resumes"])) + ")</span>"
    return (f"<tr class=\"s-{escape(state)}\" data-host=\"{escape(b.host)}\" data-place=\"{escape(b.place)}\" "
            f"data-state=\"{escape(state)}\" data-run=\"{run}\" data-source=\"{b.source}\" "
            f"data-job=\"{escape(str(row.get('command') or ''))}\">"
            f"<td>{escape(b.host)}</td><td>{escape(b.place)}</td><td>{_state(state)} {source}</td>"
            f"<td>{job}</td><td>{stage}</td><td data-field=\"progress\">{bar}{escape(amounts)}</td>"
            f"<td>{escape(rate)}</td><td>{escape(eta)}</td><td>{link}</td><td class=\"error\">{error}</td></tr>")


def rows_html(snap: LineSnapshot, prefix: str = "") -> str:
    if not snap.boards:
        return "<tr><td colspan=\"10\" class=\"muted\">no board has said anything in the window</td></tr>"
    return "\n".join(board_row(b, prefix) for b in snap.boards)


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
    from amdflash.pipeline import commands
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


def app(line: Line, url: str) -> Any:
    """The Starlette application over `line` (kept current by its thread) and the record at `url`."""
    from sse_starlette.sse import EventSourceResponse
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, Response
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
        if not RUN_ID.fullmatch(run_id):
            return HTMLResponse(page("not a run", "<p>Not a run id.</p>", prefix="../../"), 404, headers=headers)
        status, body = await asyncio.to_thread(render_run, url, int(host_id), run_id)
        return HTMLResponse(body, status, headers=headers)

    async def history(request: Request) -> Response:
        from amdflash.store import central

        filters = {k: request.query_params.get(k, "")[:200] for k in HISTORY_FIELDS}

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

    return Starlette(routes=[
        Route("/", index), Route("/events", events), Route("/static/line.js", script),
        Route("/runs/{host_id:int}/{run}", run_page), Route("/history", history), Route("/health", health),
        Route("/metrics", metrics_page),
    ], lifespan=lifespan)


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--listen {text}: expected HOST:PORT (e.g. 127.0.0.1:8470)")
    return host.strip("[]") or "127.0.0.1", int(port)


def serve(url: str, listen: str, notify: list[str], window_hours: float, silent_after: float, settle: float,
          public_url: str, log: Callable[[str], None]) -> int:
    import uvicorn

    host, port = parse_listen(listen)
    notifier = Notifier(notify, log)
    line = Line(url, window_hours, notifier, silent_after, settle, public_url or f"http://{listen}/", log)
    line.start()
    config = uvicorn.Config(app(line, url), host=host, port=port, log_level="warning", lifespan="on",
                            timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    from amdflash.store.central import shown_url

    log(f"serving the line at http://{host}:{port}/ (read-only, from {shown_url(url)})")
    try:
        server.run()
    finally:
        line.close()
    return 0

