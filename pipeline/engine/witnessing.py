"""Asking the witnesses to cosign this host's newest tree head, and the timestamp authorities
to date it: at each board command's end, by `audit witness`, and by `audit push`.

The board is done by then: nothing here changes a run's result. Every witness is asked at once,
each on its own thread, all within one short deadline (`witness_timeout`, 2 s unless the config
file says otherwise); a witness that is down, slow or refuses costs at most that, and is named
in the words the run ends with (`not yet witnessed (why)`). A later `audit witness` or `audit
push` asks again for the newest tree head, which covers every earlier one.

What a witness answers is checked before it is kept (store/witness.py): its key, the line's
name and key id, and the time it signed. A witness that refuses because the log is not
consistent with what it cosigned before (409 at the same size, 422) is said loudly: this
log was rolled back or forked, which is what witnesses are for.
"""
from __future__ import annotations

import os
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from amdflash.pipeline.errors import UsageError
from amdflash.store import witness as ws

DEFAULT_TIMEOUT = 2.0
MAX_ANSWER = 64 * 1024


class TreeHeads(Protocol):
    """The log as witnessing needs it (store/tlog.py)."""

    def checkpoint(self) -> str:
        """The newest signed tree head, as a C2SP checkpoint note."""
        ...

    def consistency(self, old: int, new: int) -> list[bytes]:
        """RFC 6962 consistency proof between two tree sizes."""
        ...


@dataclass(frozen=True)
class Authority:
    url: str
    roots: Path             # PEM certificates the authority's chain must end in


@dataclass(frozen=True)
class Settings:
    witnesses: tuple[ws.Witness, ...]
    quorum: int
    timeout: float = DEFAULT_TIMEOUT
    authorities: tuple[Authority, ...] = ()


def settings(data: dict[str, Any]) -> Settings | None:
    """The witness settings of a loaded config file (pipeline/config.py): None when it names no
    witness; UsageError (exit 2, before any run) for one that cannot be used."""
    listed = data.get("witnesses") or []
    if not listed:
        return None
    witnesses: list[ws.Witness] = []
    for i, entry in enumerate(listed):
        where = f"config file: witnesses[{i}]"
        if not isinstance(entry, dict) or set(entry) - {"url", "key"} or not isinstance(entry.get("url"), str) \
                or not isinstance(entry.get("key"), str):
            raise UsageError(f"{where}: must be {{url = \"http(s)://...\", key = \"name+keyid+base64\"}}")
        _check_url(entry["url"], where)
        try:
            name, key = ws.parse_vkey(entry["key"])
        except ws.WitnessError as e:
            raise UsageError(f"{where}: {e}") from None
        if any(w.name == name for w in witnesses):
            raise UsageError(f"{where}: witness {name} is named twice")
        witnesses.append(ws.Witness(name, key, entry["url"].rstrip("/")))
    quorum = data.get("witness_quorum", len(witnesses))
    if not 1 <= quorum <= len(witnesses):
        raise UsageError(f"config file: witness_quorum = {quorum}: must be 1..{len(witnesses)} (the witnesses named)")
    timeout = data.get("witness_timeout", DEFAULT_TIMEOUT)
    if not 0 < timeout <= 60:
        raise UsageError(f"config file: witness_timeout = {timeout}: must be more than 0 and at most 60 seconds")
    authorities = []
    for i, entry in enumerate(data.get("timestamp_authorities") or []):
        where = f"config file: timestamp_authorities[{i}]"
        if not isinstance(entry, dict) or set(entry) != {"url", "roots"} or not all(
                isinstance(v, str) for v in entry.values()):
            raise UsageError(f"{where}: must be {{url = \"http(s)://...\", roots = \"PEM file of its root CA\"}}")
        _check_url(entry["url"], where)
        authorities.append(Authority(entry["url"], Path(entry["roots"]).expanduser()))
    return Settings(tuple(witnesses), quorum, float(timeout), tuple(authorities))


def _check_url(url: str, where: str) -> None:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"{where}: url {url!r} is not an http:// or https:// address")


@dataclass
class Outcome:
    """Where the newest tree head stands with the witnesses."""

    size: int
    quorum: int
    witnesses: int
    cosigned: list[str] = field(default_factory=list)        # names of the witnesses whose cosignature is kept
    problems: list[str] = field(default_factory=list)        # why the others are missing
    refused: bool = False        # a witness refused the log as rolled back or forked
    timestamps: int = 0          # tokens kept from timestamp authorities

    @property
    def witnessed(self) -> bool:
        return len(self.cosigned) >= self.quorum

    def words(self) -> str:
        if self.witnessed:
            return f"witnessed by {len(self.cosigned)} of {self.witnesses}"
        why = "; ".join(self.problems) or "no answer"
        have = f"{len(self.cosigned)} of {self.witnesses} cosigned, {self.quorum} needed: " if self.cosigned else ""
        return f"not yet witnessed ({have}{why})"


def ask(db: str, log: TreeHeads, conf: Settings) -> Outcome:
    """Ask every witness that has not yet cosigned the log's newest tree head, keep what they
    cosign, then date the cosigned head with the configured authorities; all within the
    settings' timeout. One amdflash of this trail at a time: two commands ending together
    would otherwise ask with a tree head the other's has already overtaken at the witness, which
    answers as it would to a log rolled back."""
    deadline = time.monotonic() + conf.timeout
    with _one_at_a_time(db, deadline):
        return _ask(db, log, conf, deadline)


@contextmanager
def _one_at_a_time(db: str, deadline: float) -> Iterator[None]:
    import fcntl

    from amdflash.stages.files import PRIVATE, private_dir

    private_dir(ws.witnessed_dir(db))
    fd = os.open(ws.witnessed_dir(db) / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, PRIVATE)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise ws.WitnessError("another amdflash of this trail was asking the witnesses until the "
                                          "deadline") from None
                time.sleep(0.02)
        yield
    finally:
        os.close(fd)      # and the lock with it


def _ask(db: str, log: TreeHeads, conf: Settings, deadline: float) -> Outcome:
    head = ws.parse_note(log.checkpoint())     # read once the lock is held: the newest there is
    kept = ws.stored(db, head.size)
    have = ws.cosigned_by(kept, list(conf.witnesses), time.time()) if kept and kept.body == head.body else []
    done = {c.witness for c in have}
    answers: dict[str, ws.Cosignature | str] = {}

    def one(w: ws.Witness) -> None:
        try:
            answers[w.name] = _ask_one(db, log, head, w, deadline)
        except Exception as e:      # a witness's failure is words, never the run's
            answers[w.name] = f"{w.name}: {_bounded(e)}"

    threads = [threading.Thread(target=one, args=(w,), daemon=True) for w in conf.witnesses if w.name not in done]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    got = [a for a in answers.values() if isinstance(a, ws.Cosignature)]
    if got or kept is None or kept.body != head.body:
        ws.store(db, head, got)
    outcome = Outcome(head.size, conf.quorum, len(conf.witnesses), sorted(done | {c.witness for c in got}))
    for w in conf.witnesses:
        if w.name in outcome.cosigned:
            continue
        said = answers.get(w.name)
        said = said if isinstance(said, str) else f"{w.name}: no answer within {conf.timeout:g} s"
        outcome.problems.append(said)
        outcome.refused |= "rolled back or forked" in said
    if outcome.witnessed and conf.authorities:
        outcome.timestamps = _date(db, head.size, conf, deadline, outcome.problems)
    return outcome


def _bounded(e: Exception) -> str:
    """An error in words fit for the run's end line: it may quote what a witness or an
    authority sent (an HTTP status line), so made printable and cut at 300 characters."""
    from amdflash.stages.terminal import printable

    said = printable(str(e) or type(e).__name__)
    return said[:300] + ("..." if len(said) > 300 else "")


class _Refused(Exception):
    pass


def _ask_one(db: str, log: TreeHeads, head: ws.Checkpoint, w: ws.Witness, deadline: float) -> ws.Cosignature:
    """One witness's cosignature of `head`: from the size it last cosigned, once more from the
    size its 409 says."""
    old = ws.last_size(db, w)
    for attempt in range(2):
        if old > head.size:
            raise _Refused(f"it cosigned a tree of {old} entries, larger than this log's {head.size}: "
                           "the log was rolled back or forked")
        proof = log.consistency(old, head.size) if old else []
        asked = time.time()
        status, answer = _post(w.url + "/add-checkpoint", ws.request_body(old, proof, head.text), deadline)
        if status == 200:
            cosig = ws.check_answer(w, head.body, answer, time.time(), asked)
            ws.remember(db, w, head.size)
            return cosig
        if status == 409:
            said = answer.decode("ascii", "replace").strip()
            known = int(said) if said.isdigit() else None
            if known is None:
                raise _Refused(f"answered 409 without its tree size ({said[:40]!r})")
            if known == old or attempt:
                ws.remember(db, w, known)
                raise _Refused(f"refused (409): it cosigned another tree of {known} entries: the log was "
                               "rolled back or forked")
            ws.remember(db, w, known)
            old = known
            continue
        raise _Refused(_STATUS.get(status, f"answered HTTP {status}").format(old=old, origin=head.origin)
                       + _detail(answer))
    raise AssertionError("unreachable")


_STATUS = {
    403: "refused (403): it does not trust this log's key",
    404: "refused (404): it does not follow this log ({origin})",
    422: "refused (422): the tree does not extend the one of {old} entries it cosigned: the log was rolled back "
         "or forked",
    400: "refused (400): it could not read the request",
}


def _detail(answer: bytes) -> str:
    from amdflash.stages.terminal import printable

    text = answer[:200].decode("utf-8", "replace").strip()
    return f" ({printable(text)})" if text and "\n" not in text else ""


def _post(url: str, body: bytes, deadline: float, kind: str = "text/plain") -> tuple[int, bytes]:
    """POST `body` to `url` within the deadline: (status, answer), or OSError-like words."""
    import http.client      # here: a command whose config names no witness never loads it

    parts = urllib.parse.urlsplit(url)
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("no time left to ask")
    conn_type = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = conn_type(parts.hostname or "", parts.port, timeout=left)
    try:
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        conn.request("POST", path or "/", body, {"Content-Type": kind, "Content-Length": str(len(body))})
        reply = conn.getresponse()
        return reply.status, reply.read(MAX_ANSWER)
    except ConnectionRefusedError:
        raise _Refused(f"unreachable at {parts.netloc} (connection refused)") from None
    except TimeoutError:
        raise _Refused(f"no answer from {parts.netloc} within the deadline") from None
    except OSError as e:
        raise _Refused(f"unreachable at {parts.netloc} ({e.strerror or e})") from None
    finally:
        conn.close()


def _date(db: str, size: int, conf: Settings, deadline: float, problems: list[str]) -> int:
    """RFC 3161 tokens from each authority over the cosigned tree head (store/timestamp.py)."""
    from amdflash.store import timestamp

    data = timestamp.subject(db, size)
    if data is None:
        return 0
    got = 0
    for i, authority in enumerate(conf.authorities):
        try:
            request, nonce = timestamp.request(data)
            status, answer = _post(authority.url, request, deadline, "application/timestamp-query")
            if status != 200:
                raise timestamp.TimestampError(f"answered HTTP {status}")
            timestamp.keep(db, size, i, answer, data, authority.roots, nonce)
            got += 1
        except Exception as e:      # a missing token is words, never the run's
            problems.append(f"timestamp authority {authority.url}: {_bounded(e)}")
    return got


class HostLog:
    """This trail's transparency log (store/tlog.py) as the witnesses are asked about it."""

    def __init__(self, db: str) -> None:
        from amdflash.store import tlog

        self._tlog = tlog
        self.directory = tlog.log_dir(db)

    def checkpoint(self) -> str:
        head = self._tlog.newest_tree_head(self.directory)
        if head is None:
            raise ws.WitnessError("the transparency log has signed no tree head yet")
        return head

    def consistency(self, old: int, new: int) -> list[bytes]:
        return self._tlog.consistency_proof(self.directory, old, new)


def configured(data: dict[str, Any] | None = None) -> Settings | None:
    """The witness settings of the config file (`data`: as loaded); UsageError if unusable."""
    from amdflash.pipeline import config

    return settings(config.load() if data is None else data)


def at_end(db: str, conf: Settings | None, logged: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """At a board command's end, after its runs' tree head was signed (`logged`: per run, the
    tree size that holds its receipt, or the error that kept it out: pipeline/commands/
    transparency.record_ended): the witnesses asked (and the authorities, once a quorum
    cosigned). What the runs' end says of it: {"words", "witnessed", "tree_size", "refused"};
    None when no witness is configured or no run was recorded. Never raises."""
    from amdflash.stages.terminal import printable

    if conf is None or not logged:
        return None
    sizes = [int(v["tree_size"]) for v in logged.values() if isinstance(v.get("tree_size"), int)]
    if not sizes:      # the log signed no head for these runs: an older head vouches for none of them
        why = next((str(v["error"]) for v in logged.values() if v.get("error")), "no tree head")
        return {"words": f"not yet witnessed (the transparency log did not take the run: {printable(why)})",
                "witnessed": False, "tree_size": None, "refused": False}
    try:
        outcome = ask(db, HostLog(db), conf)
    except Exception as e:      # the board is done: a witness problem is words, not the run's
        return {"words": f"not yet witnessed ({printable(str(e))})", "witnessed": False, "tree_size": None,
                "refused": False}
    return {"words": outcome.words(), "witnessed": outcome.witnessed, "tree_size": outcome.size,
            "refused": outcome.refused}
