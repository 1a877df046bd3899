"""The line view's web application (Starlette): its routes, the live stream (server-sent
events), the history's filters, and `serve`, which starts the line's thread and uvicorn."""
from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Any

from amdflash.pipeline.fleet.serve.guard import BACKLOG, HEADER_TIMEOUT, Limiter, Limits, limits, protocol
from amdflash.pipeline.fleet.serve.line import Line
from amdflash.pipeline.fleet.serve.notify import Notifier
from amdflash.pipeline.fleet.serve.pages import (CSP, SCRIPT, health_page, history_page, line_page, page, render_run,
                                                 rows_html, summary_html, time_text)
from amdflash.pipeline.fleet.serve.words import RUN_ID, no_password, word
from amdflash.store.status import ENDS


HISTORY_FIELDS = ("host", "board", "status", "part", "since", "until")
INT4 = 2**31 - 1                      # a host id beyond this is no host (PostgreSQL's integer)
THREADS = 8                           # threads answering run pages, history and metrics at once


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
    runs = runs[:limit]
    witnessed = central.witness_states(pg, central.NS, [(r["host_id"], r["run_id"]) for r in runs])
    for r in runs:
        r["witnessed"] = witnessed.get((r["host_id"], r["run_id"]))
    return runs


class Table:
    """The line's table (its rows, the summary, the live stream's event) rendered once per change
    of the line and shared by every client: `GET /` and every live stream send the same
    rendering, so the number of viewers never multiplies what a change costs. Rendered on a
    thread (a long table never holds up the server), one rendering at a time."""

    FRESH = 10.0          # seconds a rendering serves `GET /` with no change (its "stale" marks age)

    def __init__(self, line: Line):
        from concurrent.futures import ThreadPoolExecutor

        self.line = line
        self.rendered: dict[str, Any] | None = None
        # A thread of its own: run pages keeping the shared pool busy never hold up the line's page.
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="amdflash-serve-table")
        self._lock: asyncio.Lock | None = None
        self._changed: asyncio.Event | None = None

    def change(self) -> asyncio.Event:
        """The event set at the next change of the line (on the server's loop)."""
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    def changed(self) -> None:
        """The line changed (called on the server's loop): every stream waiting wakes."""
        event, self._changed = self.change(), asyncio.Event()
        event.set()

    async def current(self, fresh: float | None = None) -> dict[str, Any]:
        """The rendering of the line's current version (made now if there is none yet)."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            r = self.rendered
            if r is None or r["version"] != self.line.version or fresh is not None and \
                    asyncio.get_running_loop().time() - r["made"] > fresh:
                r = self.rendered = await asyncio.get_running_loop().run_in_executor(self._thread, self._render)
                r["made"] = asyncio.get_running_loop().time()
            return r

    def _render(self) -> dict[str, Any]:
        from sse_starlette.sse import ServerSentEvent

        snap = self.line.snapshot()
        rows, summary = rows_html(snap), summary_html(snap, self.line.error)
        data = json.dumps({"rows": rows, "summary": summary, "updated": time_text(snap.at), "version": snap.version})
        return {"version": snap.version, "snap": snap, "rows": rows, "summary": summary,
                "event": ServerSentEvent(data=data, event="line").encode()}


def app(line: Line, url: str, allowed_hosts: list[str] | None = None, caps: Limits | None = None,
        limiter: Limiter | None = None) -> Any:
    """The Starlette application over `line` (kept current by its thread) and the record at `url`,
    answering only requests whose Host: is one of `allowed_hosts` (default this machine's names:
    a page of another name is how DNS rebinding reaches a loopback server). At most `caps.streams`
    live streams at once (default: as this process's descriptor limit allows, guard.limits)."""
    from concurrent.futures import ThreadPoolExecutor

    from sse_starlette.sse import EventSourceResponse
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.middleware.trustedhost import TrustedHostMiddleware
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, PlainTextResponse, Response
    from starlette.routing import Route

    from amdflash.pipeline.fleet import metrics

    caps = caps or limits()
    limiter = limiter or Limiter()
    headers = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
               "Cache-Control": "no-store"}
    loop_box: dict[str, asyncio.AbstractEventLoop] = {}
    table = Table(line)
    streams = [0]

    def wake() -> None:   # from the line's thread
        loop = loop_box.get("loop")
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(table.changed)
            except RuntimeError:   # closed between the check and the call: the server has stopped
                pass

    line.listeners.append(wake)

    async def index(request: Request) -> Response:
        r = await table.current(fresh=Table.FRESH)
        return HTMLResponse(line_page(r["snap"], line.window_hours, line.error, rows=r["rows"], summary=r["summary"]),
                            headers=headers)

    async def events(request: Request) -> Response:
        loop_box["loop"] = asyncio.get_running_loop()
        if streams[0] >= caps.streams:
            ok, skipped = limiter.allow("streams")
            if ok:
                line.log(f"fleet serve: {caps.streams} live streams open: a new one refused (503)"
                         f"{limiter.suffix(skipped)}")
            return PlainTextResponse(f"busy: {caps.streams} live streams open; the page works without one "
                                     "(reload for the newest)\n", 503, headers={**headers, "Retry-After": "30"})

        async def stream() -> Any:
            seen = None
            while True:
                change = table.change()
                r = await table.current()
                if r["version"] != seen:
                    seen = r["version"]
                    yield r["event"]          # the same bytes for every client
                await change.wait()

        class Counted(EventSourceResponse):
            """A live stream holding its slot until it ends, however it ends (a generator never
            started, as when the client left at once, would never run a finally of its own)."""

            async def __call__(self, *args: Any) -> None:
                try:
                    await super().__call__(*args)
                finally:
                    streams[0] -= 1

        streams[0] += 1
        # A client that stops reading is let go after 30 s (its stream's slot with it).
        return Counted(stream(), ping=15, headers={"Cache-Control": "no-store"}, send_timeout=30)

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
        loop = loop_box["loop"] = asyncio.get_running_loop()
        loop.set_exception_handler(limiter.exceptions)     # asyncio's lines: rate-limited
        # Run pages, history and metrics run on threads, each with a database connection and files
        # open: a pool of its own bounds the descriptors they hold (guard.RESERVE counts them).
        loop.set_default_executor(ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="amdflash-serve"))
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


def server_config(asgi: Any, host: str, port: int, caps: Limits | None = None, limiter: Limiter | None = None,
                  log: Callable[[str], None] | None = None) -> Any:
    """uvicorn's configuration for the view. Its own lines (a malformed request, an exception)
    go to the root logger amdflash configured (log_config=None), so they are words like any
    other: one JSON object per line with --log-json, escaped otherwise; uvicorn's default
    handlers would print its own plain-text format beside them. Those any client can cause are
    rate-limited (guard.Limiter), and connections are held to guard's header timeout and cap."""
    import logging

    import uvicorn

    caps = caps or limits()
    limiter = limiter or Limiter()
    limiter.install()
    say = log or logging.getLogger("amdflash.serve").warning
    return uvicorn.Config(asgi, host=host, port=port, log_level="warning", lifespan="on",
                          timeout_graceful_shutdown=2, log_config=None, http=protocol(caps, limiter, say),
                          backlog=BACKLOG, timeout_keep_alive=int(HEADER_TIMEOUT))


def serve(url: str, listen: str, notify: list[str], window_hours: float, silent_after: float, settle: float,
          public_url: str, log: Callable[[str], None], state_dir: Path | None = None,
          allowed_hosts: list[str] | None = None, stale_after: float = 1800.0) -> int:
    import uvicorn

    from amdflash.pipeline.errors import Refusal

    host, port = parse_listen(listen)
    try:
        caps = limits()
    except ValueError as e:
        raise Refusal(str(e)) from None
    limiter = Limiter()
    notifier = Notifier(notify, log)
    line = Line(url, window_hours, notifier, silent_after, settle, public_url or f"http://{listen}/", log,
                state_file(state_dir, url) if state_dir else None, stale_after)
    line.start()
    view = app(line, url, allowed(host, allowed_hosts or []), caps, limiter)
    server = uvicorn.Server(server_config(view, host, port, caps, limiter, log))

    from amdflash.store.central import shown_url

    log(f"serving the line at http://{host}:{port}/ (read-only, from {no_password(shown_url(url))}; at most "
        f"{caps.connections} connections, {caps.streams} live streams, under a limit of {caps.nofile} descriptors)")
    try:
        server.run()
    finally:
        line.close()
    return 0
