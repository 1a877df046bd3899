"""Notifications of the line view: Apprise on a thread of its own (Notifier), and what was
notified, kept in the serve's state directory so that a restart neither loses nor repeats one
(Memory)."""
from __future__ import annotations

import json
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from amdflash.pipeline.fleet.serve.words import mask_url, mask_urls


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
    pending: dict[str, dict[str, Any]] = field(default_factory=dict)  # failures waiting for their end's words
    last_activity: float = 0.0                                     # wall clock of the newest row decided
    saved_at: float = 0.0
    dirty: bool = False                                            # decided more than was saved
    _pending: str | None = field(default=None, repr=False)         # the newest state not written yet
    _writer: threading.Thread | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    problem: str | None = field(default=None, repr=False)          # why the last write failed (None: it did not)

    FIELDS: ClassVar[dict[str, type | tuple[type, ...]]] = {
        "seen_id": (int, type(None)), "notified": dict, "silent": list, "round": dict, "round_active": bool,
        "last_activity": (int, float), "pending": dict}

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
