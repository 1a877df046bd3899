"""The line view's connections, held against one local user (issue 41): every connection must
send a whole request head within HEADER_TIMEOUT of connecting or of its last answer (a client
that sends half a request and waits, or nothing, is dropped) and take its answer within
RESPONSE_TIMEOUT (but a live stream); connections are capped below the
process's file-descriptor limit (Limits), and at the cap a new one takes the place of the oldest
that is still waiting for its request, else it is answered 503 at once; and what clients can make
the server log (malformed requests, accept errors when descriptors run out) is logged at most
once a minute per kind, with a count of the lines not logged (Limiter).

uvicorn (0.55) has no timeout for a request's head, and its limit_concurrency counts a
connection only once it has sent a request: an H11Protocol of our own (`protocol`) adds both."""
from __future__ import annotations

import logging
import resource
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

HEADER_TIMEOUT = 5.0          # seconds a connection has to send a whole request head
RESPONSE_TIMEOUT = 60.0       # seconds an answer (but a live stream) may take to be made and taken
STREAMS = ("/events",)        # paths whose answer never ends (a client that stops reading: sse's send_timeout)
BACKLOG = 100                 # connections the kernel queues; also what asyncio accepts in one go
RESERVE = 64 + 2 * BACKLOG    # descriptors kept for all but connections: PostgreSQL, files, the
#                               threads' copies of runs, and connections accepted in one go and closing
MOST_CONNECTIONS = 1024
FEWEST_CONNECTIONS = 32
MOST_STREAMS = 256
LOG_EVERY = 60.0              # seconds between two lines of one kind
KINDS = 100                   # kinds of line told apart (beyond: counted as one)

BUSY = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\nretry-after: 5\r\n"
        b"connection: close\r\ncontent-length: 27\r\n\r\nbusy: too many connections\n")


@dataclass(frozen=True)
class Limits:
    connections: int              # open at once
    streams: int                  # live streams (/events) at once, of those
    header_timeout: float = HEADER_TIMEOUT
    response_timeout: float = RESPONSE_TIMEOUT
    nofile: int = 0               # the file-descriptor limit they were derived from


def limits(nofile: int | None = None) -> Limits:
    """The caps for this process's file-descriptor limit (its soft RLIMIT_NOFILE: the unit's
    LimitNOFILE=): connections up to the limit less RESERVE (at most MOST_CONNECTIONS), a quarter
    of them live streams (at most MOST_STREAMS). ValueError when the limit leaves too few."""
    if nofile is None:
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if nofile == resource.RLIM_INFINITY:
            nofile = 1 << 20
    connections = min(MOST_CONNECTIONS, nofile - RESERVE)
    if connections < FEWEST_CONNECTIONS:
        raise ValueError(f"fleet serve: its file-descriptor limit ({nofile}) leaves room for {max(connections, 0)} "
                         f"connections, fewer than {FEWEST_CONNECTIONS}: raise it to {RESERVE + 256} or more "
                         "(ulimit -n; LimitNOFILE= in its unit)")
    return Limits(connections, min(MOST_STREAMS, max(8, connections // 4)), nofile=nofile)


class Limiter:
    """At most one line of a kind every `every` seconds; the next one says how many were not logged."""

    def __init__(self, every: float = LOG_EVERY, clock: Callable[[], float] = time.monotonic):
        self.every = every
        self.clock = clock
        self._last: dict[str, tuple[float, int]] = {}
        self._lock = threading.Lock()

    def allow(self, kind: str) -> tuple[bool, int]:
        """(whether to log this one, how many of its kind were not logged since the last)."""
        with self._lock:
            if kind not in self._last and len(self._last) >= KINDS:
                kind = "(other kinds)"
            now = self.clock()
            last, skipped = self._last.get(kind, (None, 0))
            if last is None or now - last >= self.every:
                self._last[kind] = (now, 0)
                return True, skipped
            self._last[kind] = (last, skipped + 1)
            return False, 0

    def suffix(self, skipped: int) -> str:
        return f" ({skipped} more like it in the last {self.every:g} s not logged)" if skipped else ""

    def filter(self, record: logging.LogRecord) -> bool:
        """As a logging filter (uvicorn's and sse-starlette's loggers: their lines any client can cause)."""
        kind = f"{record.name}: {str(record.msg).splitlines()[0][:80] if record.msg else ''}"
        ok, skipped = self.allow(kind)
        if ok and skipped:
            record.msg, record.args = record.getMessage() + self.suffix(skipped), ()
        return ok

    def exceptions(self, loop: Any, context: dict[str, Any]) -> None:
        """As the event loop's exception handler: asyncio's own lines (an accept that failed for want
        of descriptors is tried again and said again, hundreds of times a second)."""
        ok, skipped = self.allow(f"asyncio: {str(context.get('message'))[:80]}")
        if ok:
            if skipped:
                context = {**context, "message": f"{context.get('message')}{self.suffix(skipped)}"}
            loop.default_exception_handler(context)

    def install(self) -> None:
        for name in ("uvicorn.error", "uvicorn.access", "sse_starlette.sse"):
            logger = logging.getLogger(name)
            if not any(isinstance(f, Limiter) for f in logger.filters):
                logger.addFilter(self)


def protocol(caps: Limits, limiter: Limiter, log: Callable[[str], None]) -> type:
    """uvicorn's H11Protocol (named whatever else is installed: httptools would have none of
    this) with the header and response timeouts and the connection cap of `caps`."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    waiting: dict[Any, None] = {}       # connections waiting for a request head, oldest first

    def say(kind: str, message: str) -> None:
        ok, skipped = limiter.allow(kind)
        if ok:
            log(message + limiter.suffix(skipped))

    class Guarded(H11Protocol):
        _deadline: Any = None
        _answer_by: Any = None
        _refused = False

        def connection_made(self, transport: Any) -> None:
            if len(self.connections) >= caps.connections:
                oldest = next(iter(waiting), None)
                if oldest is None:           # every one busy answering: this one is told so
                    self._refused = True
                    transport.write(BUSY)
                    transport.close()
                    say("refused", f"fleet serve: {caps.connections} connections open, all answering: a new one "
                        "refused (503)")
                    return
                say("evicted", f"fleet serve: {caps.connections} connections open: the oldest that had sent no "
                    "request closed for a new one")
                oldest._drop(force=True)
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._refused:
                return
            self._disarm()
            self._answered()
            super().connection_lost(exc)

        def handle_events(self) -> None:
            answering = self.cycle
            super().handle_events()
            if self.cycle is not answering:  # a request's head arrived whole
                self._disarm()
                self._answered()
                if self.scope.get("path") not in STREAMS:    # its answer made and taken in time
                    self._answer_by = self.loop.call_later(caps.response_timeout, self._too_slow)

        def on_response_complete(self) -> None:
            answered = self.cycle
            if not self.transport.get_write_buffer_size():   # else: made, but not taken yet
                self._answered()
            super().on_response_complete()
            if not self.transport.is_closing() and self.cycle is answered:
                self._arm()                  # the next request's head: within the timeout too

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(caps.header_timeout, self._drop)
            waiting[self] = None

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None
            waiting.pop(self, None)

        def _answered(self) -> None:
            if self._answer_by is not None:
                self._answer_by.cancel()
                self._answer_by = None

        def _too_slow(self) -> None:
            """An answer not made and taken within the response timeout (a client reading a long
            page a byte at a time holds its connection, and no new one may take its place)."""
            self._answer_by = None
            if self.cycle is not None and not self.cycle.response_complete or self.transport.get_write_buffer_size():
                say("slow", f"fleet serve: an answer not taken within {caps.response_timeout:g} s: its "
                    "connection closed")
                self.transport.abort()

        def _drop(self, force: bool = False) -> None:
            self._disarm()
            if not force and self.cycle is not None and not self.cycle.response_complete:
                return                       # answering a request: not the head's timeout
            if not force and self.transport.get_write_buffer_size():
                self._arm()                  # its answer still being taken: the response timeout's
                return
            self.transport.abort()

    return Guarded
