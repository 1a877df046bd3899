"""Notifications of the line view: Apprise on a thread of its own (Notifier), what waits to be
delivered (Outbox: each notification kept until every service took it, retried with backoff),
and what was decided (Memory), both kept in the serve's state directory so that an outage or a
restart neither loses nor repeats one. The state directory is this user's alone (owned by it,
writable by nobody else: open_state_dir) and every write of it is a fresh file renamed into
place, never a fixed name another user could have linked."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from amdflash.pipeline.fleet.serve.words import mask_url, mask_urls

RETRY_FIRST = 2.0           # seconds before a service that refused a notification is tried again,
RETRY_LONGEST = 300.0       # doubling each time up to this
OUTBOX_KEPT = 10000         # notifications waiting at most (a service down for days: the oldest go)


class _MaskUrls:
    """A logging filter: every URL in a record masked (mask_urls)."""

    def filter(self, record: Any) -> bool:
        record.msg, record.args = mask_urls(record.getMessage()), ()
        return True


class Outbox:
    """Notifications not delivered yet, in the order they were decided: each leaves only once
    every notification service took it (Apprise said so), whatever the outages and restarts in
    between (Memory keeps it in the state directory). A service is told by the hash of its URL
    (`delivered`), never by the URL: the state holds no token."""

    def __init__(self, items: list[dict[str, Any]] | None = None):
        self.items: list[dict[str, Any]] = list(items or [])
        self.lock = threading.Lock()
        self.changed = False               # changed since the state was last saved
        self.wake = threading.Condition(self.lock)

    def add(self, title: str, body: str, kind: str) -> dict[str, Any] | None:
        """The new notification; returns the one dropped to make room for it, if one was."""
        with self.lock:
            dropped = self.items.pop(0) if len(self.items) >= OUTBOX_KEPT else None
            self.items.append({"title": title, "body": body, "kind": kind, "at": time.time(), "delivered": []})
            self.changed = True
            self.wake.notify_all()
        return dropped

    def waiting_for(self, target: str) -> list[dict[str, Any]]:
        with self.lock:
            return [n for n in self.items if target not in n["delivered"]]

    def delivered(self, item: dict[str, Any], target: str, targets: list[str]) -> None:
        with self.lock:
            item["delivered"].append(target)
            if all(t in item["delivered"] for t in targets) and item in self.items:
                self.items.remove(item)
            self.changed = True

    def snapshot(self) -> list[dict[str, Any]]:
        with self.lock:
            self.changed = False
            return [{**n, "delivered": list(n["delivered"])} for n in self.items]

    def __len__(self) -> int:
        with self.lock:
            return len(self.items)

    @staticmethod
    def checked(items: Any) -> list[dict[str, Any]]:
        """The outbox as the state file holds it; ValueError when it is not one."""
        if not isinstance(items, list):
            raise ValueError("outbox is not a list")
        for n in items:
            if not (isinstance(n, dict) and all(isinstance(n.get(k), str) for k in ("title", "body", "kind"))
                    and isinstance(n.get("delivered"), list) and isinstance(n.get("at"), (int, float))):
                raise ValueError("outbox holds an entry that is not a notification")
        return items


def target_id(url: str) -> str:
    """A notification service as the state names it: a hash of its URL (which carries tokens)."""
    return hashlib.sha256(url.encode()).hexdigest()[:16]


class Notifier:
    """Apprise, on a thread of its own: a slow or unreachable notification service never holds
    up the line view. Every message is plain text (an e-mail has no HTML part: nothing a host
    wrote becomes a link or a remote image), and a URL is never printed whole (mask_url).

    What is sent waits in an Outbox (the Line's Memory's: kept in the state directory) until
    each service took it; a service that did not is tried again after RETRY_FIRST seconds,
    doubling up to RETRY_LONGEST, and at once after a restart."""

    def __init__(self, urls: list[str], log: Callable[[str], None]):
        self.urls = urls
        self.log = log
        self.sent: list[tuple[str, str]] = []
        self.outbox = Outbox()
        self._targets: dict[str, Any] = {}
        self._retry: dict[str, tuple[int, float]] = {}     # target → (failures in a row, next try, monotonic)
        self._refused: dict[str, int] = {}                 # target → the notification it last did not take
        self._closing = False
        self._thread: threading.Thread | None = None
        if urls:
            import logging

            import apprise

            apprise_log = logging.getLogger("apprise")     # Apprise says URLs too: masked as ours are
            if not any(isinstance(f, _MaskUrls) for f in apprise_log.filters):
                apprise_log.addFilter(_MaskUrls())
            for url in urls:
                one = apprise.Apprise()
                if not one.add(url):
                    raise ValueError(f"--notify {mask_url(url)}: not a notification URL Apprise knows")
                self._targets[target_id(url)] = one

    def keep_in(self, outbox: Outbox) -> None:
        """Deliver from `outbox` (the Line's Memory's, saved with it) and start delivering."""
        self.outbox = outbox
        self._start()

    def _start(self) -> None:
        if self._targets and self._thread is None:
            self._thread = threading.Thread(target=self._work, name="amdflash-notify", daemon=True)
            self._thread.start()

    def send(self, title: str, body: str, kind: str = "info") -> None:
        self.sent.append((title, body))
        self.log(f"notify: {title}")
        if self._targets:
            dropped = self.outbox.add(title, body, kind)
            if dropped is not None:
                self.log(f"notification outbox full ({OUTBOX_KEPT}): the oldest dropped: {dropped['title']}")
            self._start()

    def _work(self) -> None:
        import apprise

        types = {"info": apprise.NotifyType.INFO, "failure": apprise.NotifyType.FAILURE,
                 "warning": apprise.NotifyType.WARNING, "success": apprise.NotifyType.SUCCESS}
        targets = list(self._targets)
        while True:
            now = time.monotonic()
            for target in targets:
                failures, due = self._retry.get(target, (0, 0.0))
                if due > now:
                    continue
                waiting = self.outbox.waiting_for(target)
                last = self._refused.get(target)
                for item in [n for n in waiting if id(n) != last] + [n for n in waiting if id(n) == last]:
                    # the one it last refused goes last: a notification a service will never take
                    # (it answers 400 to it) does not hold up the others
                    if self._deliver(target, item, types):
                        self.outbox.delivered(item, target, targets)
                        failures = 0
                        continue
                    failures += 1
                    self._refused[target] = id(item)
                    wait = min(RETRY_FIRST * 2 ** (failures - 1), RETRY_LONGEST)
                    self._retry[target] = (failures, time.monotonic() + wait)
                    self.log(f"notification not delivered to {self._shown(target)}: {item['title']} (tried "
                             f"{failures} time(s) in a row; again in {wait:g} s, kept until delivered)")
                    break
                else:
                    self._retry.pop(target, None)
            with self.outbox.lock:
                if self._closing:
                    return
                now = time.monotonic()
                pending = [t for t in targets if any(t not in n["delivered"] for n in self.outbox.items)]
                next_due: float | None = min((self._retry.get(t, (0, 0.0))[1] for t in pending), default=None)
                if next_due is None or next_due > now:      # nothing to send, or every service waiting its turn
                    self.outbox.wake.wait(None if next_due is None else next_due - now)

    def _deliver(self, target: str, item: dict[str, Any], types: dict[str, Any]) -> bool:
        import apprise

        try:
            return bool(self._targets[target].notify(title=item["title"], body=item["body"],
                                                     notify_type=types.get(item["kind"], types["info"]),
                                                     body_format=apprise.NotifyFormat.TEXT))
        except Exception as e:
            self.log(f"notification failed: {item['title']}: {mask_urls(str(e))}")
            return False

    def _shown(self, target: str) -> str:
        return next((mask_url(u) for u in self.urls if target_id(u) == target), target)

    def close(self, grace: float = 5.0) -> None:
        """Stop delivering: what is due is tried for up to `grace` seconds; the rest waits in the
        outbox (in the state directory) for the next start."""
        if self._thread is None:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and self._due():
            time.sleep(0.05)
        with self.outbox.lock:
            self._closing = True
            self.outbox.wake.notify_all()
        self._thread.join(timeout=30)

    def _due(self) -> bool:
        now = time.monotonic()
        return any(self._retry.get(t, (0, 0.0))[1] <= now and self.outbox.waiting_for(t) for t in self._targets)


NOTIFIED_KEPT = 20000               # run ends remembered as notified (the oldest are forgotten)


class StateDirError(ValueError):
    """The state directory is not this user's alone."""


def open_state_dir(path: Path, create: bool = False) -> int:
    """The state directory, open (a descriptor every read and write goes through); StateDirError
    unless this user owns it and neither its group nor others may write in it (another user could
    put a link there, or swap the state for one that mutes failures). The path may be a link that
    root or this user made (systemd's StateDirectory= with DynamicUser= is one), to such a directory.
    `create`: made (0700) when missing."""
    if create:
        try:
            path.mkdir(parents=True, mode=0o700)
        except FileExistsError:
            pass
        except OSError as e:
            raise StateDirError(f"{path}: cannot be made: {e.strerror or e}") from None
    try:
        link = os.lstat(path)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise StateDirError(f"{path}: {e.strerror or e}") from None
    me = os.geteuid()
    found = os.fstat(fd)
    if stat.S_ISLNK(link.st_mode) and link.st_uid not in (0, me):
        problem = f"a link made by another user (uid {link.st_uid})"
    elif found.st_uid != me:
        problem = f"owned by another user (uid {found.st_uid}), not by this one (uid {me})"
    elif found.st_mode & 0o022:
        who = " and ".join(w for w, bit in (("its group", 0o020), ("others", 0o002)) if found.st_mode & bit)
        problem = f"writable by {who} (mode {stat.S_IMODE(found.st_mode):o}): chmod go-w it, or give a directory " \
                  "only this user can write"
    else:
        return fd
    os.close(fd)
    raise StateDirError(f"{path}: {problem}")


@dataclass
class Memory:
    """What notifications remember, kept in `path` (the serve's state directory; None: in memory
    only). Rows are decided in the record's order, each once: `seen_id` is the last decided, so
    rows that arrived while the serve was stopped or central was out of reach are decided when it
    reads again, and `notified` holds every run end already decided, so none is sent twice; what
    was decided and not yet delivered waits in `outbox`, saved with the rest (one file, written
    whole: the two never disagree)."""

    path: Path | None = None
    seen_id: int | None = None                           # None: never read (the first read sets it)
    notified: dict[str, int] = field(default_factory=dict)         # "HOST_ID/RUN_ID" → its row's id
    silent: list[int] = field(default_factory=list)                # hosts notified as silent
    round: dict[str, dict[str, Any]] = field(default_factory=dict)   # the current round's ends
    round_active: bool = False
    pending: dict[str, dict[str, Any]] = field(default_factory=dict)  # failures waiting for their end's words
    last_activity: float = 0.0                                     # wall clock of the newest row decided
    outbox: Outbox = field(default_factory=Outbox)                 # decided, not delivered yet
    saved_at: float = 0.0
    _dirty: bool = field(default=False, repr=False)                # decided more than was saved
    _pending: str | None = field(default=None, repr=False)         # the newest state not written yet
    _writer: threading.Thread | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    problem: str | None = field(default=None, repr=False)          # why the last write failed (None: it did not)

    FIELDS: ClassVar[dict[str, type | tuple[type, ...]]] = {
        "seen_id": (int, type(None)), "notified": dict, "silent": list, "round": dict, "round_active": bool,
        "last_activity": (int, float), "pending": dict, "outbox": list}

    @property
    def dirty(self) -> bool:
        """Whether the state changed since it was saved: decided more, or a notification delivered."""
        return self._dirty or self.outbox.changed

    @dirty.setter
    def dirty(self, value: bool) -> None:
        self._dirty = value

    @classmethod
    def load(cls, path: Path | None) -> Memory:
        memory = cls(path)
        if path is None or not path.parent.exists():
            return memory
        directory = open_state_dir(path.parent)
        try:
            try:
                fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory)
            except FileNotFoundError:
                return memory
            with os.fdopen(fd, "rb") as f:
                data = json.loads(f.read())
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            for name, kind in cls.FIELDS.items():
                if name in data:
                    if not isinstance(data[name], kind):
                        raise ValueError(f"{name} is a {type(data[name]).__name__}")
                    if name == "outbox":
                        memory.outbox = Outbox(Outbox.checked(data[name]))
                    else:
                        setattr(memory, name, data[name])
        except (OSError, ValueError) as e:
            raise ValueError(f"{path}: not the line view's notification state ({e}): move it away to start "
                             "afresh") from None
        finally:
            os.close(directory)
        return memory

    def save(self, wait: bool = False) -> None:
        """The state as it is now, written by a thread of its own (the line's thread never waits
        on the disk; `wait`: until it is written)."""
        self.saved_at, self.dirty = time.monotonic(), False
        if self.path is None:
            self.outbox.changed = False
            return
        while len(self.notified) > NOTIFIED_KEPT:
            del self.notified[next(iter(self.notified))]
        data = json.dumps({name: self.outbox.snapshot() if name == "outbox" else getattr(self, name)
                           for name in self.FIELDS}, sort_keys=True)
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
            except StateDirError as e:
                self.problem = str(e)
            except OSError as e:
                self.problem = f"{self.path}: {e.strerror or e}"

    def _write(self, data: str) -> None:
        """Written whole to a fresh file of a random name (0600; O_EXCL and O_NOFOLLOW: never
        through a name someone put there first), flushed to disk, and renamed over the old one
        in the same directory: a crash leaves the old state or the new, never half of one."""
        assert self.path is not None
        directory = open_state_dir(self.path.parent, create=True)
        try:
            tmp = f".{self.path.name}.{secrets.token_hex(8)}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=directory)
            try:
                try:
                    view = memoryview(data.encode())
                    while view:
                        view = view[os.write(fd, view):]
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(tmp, self.path.name, src_dir_fd=directory, dst_dir_fd=directory)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=directory)
                raise
            os.fsync(directory)       # the rename itself on disk
        finally:
            os.close(directory)
