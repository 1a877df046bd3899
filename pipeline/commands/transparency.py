"""Receipts and the host's transparency log, for the commands: where the log and its key live,
its origin, logging the runs that just ended, and what a reviewer is handed (receipt, proof,
verifier key).

The log key (log_key.pem) sits beside the host key and signs only tree heads. The origin is
the config file's `log_origin`, else one per host (store.tlog.default_origin); it is fixed
when the log starts: a log refuses to be signed under another name or key.
"""
from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from amdflash.pipeline import config
from amdflash.pipeline.engine import auditdb
from amdflash.pipeline.errors import Refusal
from amdflash.store import keys, receipts, tlog, trail_log

ORIGIN_KEY = "log_origin"


def log_dir(db: str) -> Path:
    return tlog.log_dir(db)


def log_key_path(db: str) -> Path:
    return tlog.log_key_path(auditdb.host_key_path(db))


def origin(settings: dict[str, Any] | None = None) -> str:
    """The log's origin: the config file's `log_origin`, else this host's default."""
    chosen = (settings if settings is not None else config.load()).get(ORIGIN_KEY)
    return str(chosen) if chosen else tlog.default_origin()


def _keys(db: str) -> tuple[Any, Any]:
    """(host key, log key): the host key must exist (it signed the trail); the log key is
    made on first use beside it."""
    host = auditdb.host_key_path(db)
    return keys.load_private(host), keys.load_or_create(log_key_path(db))


def record_ended(db: str, reports: dict[str, dict[str, Any]], opened: Any = None,
                 settings: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """At the end of a board command (the writer closed: every run sealed): the checkpoints
    sealed since the last logged and the receipts of the runs that ended go into the log, and a
    tree head is signed. Per run: {"origin", "tree_size", "leaf"} or {"error": why}. Never
    raises: a run's end is not undone by its log. `opened`: the command's reader of the trail
    after the run (kept open), else one is opened here."""
    if not reports:
        return {}
    try:
        host_key, log_key = _keys(db)
        reader = opened or auditdb.open_reader(db)
        try:
            ended = []
            for run_id, rep in reports.items():
                cps = receipts.run_checkpoints(reader.conn, run_id)
                if cps and cps[-1].kind == "final":
                    ended.append(receipts.from_report(rep, cps, host_key))
            logged = trail_log.record(reader.conn, log_dir(db), log_key, origin(settings), ended)
        finally:
            if opened is None:
                reader.conn.close()
    except (tlog.LogError, receipts.ReceiptRefused, keys.KeyError_, OSError, sqlite3.Error, Refusal,
            ValueError) as e:
        return {run_id: {"error": str(e)} for run_id in reports}
    head = logged.head
    name = tlog.parse_checkpoint(head.note)[0]
    return {run_id: ({"origin": name, "tree_size": head.size, "leaf": logged.receipts[run_id]}
                     if run_id in logged.receipts else {"error": "the run has not ended: no receipt logged"})
            for run_id in reports}


class NoHostKey(Refusal):
    """This account has not the key that sealed the run, so it cannot sign the run's receipt."""


def receipt(db: str, run_id: str) -> receipts.Receipt:
    """A run's receipt, built from the trail (the run must verify) and signed by the host key."""
    from amdflash.store.queries import RunNotFound
    from amdflash.store.run_rows import RunUnverified

    path = auditdb.host_key_path(db)
    try:
        if not path.exists():
            raise NoHostKey(f"no host key at {path}: only the host that recorded a run signs its receipt")
        host_key = keys.load_private(path)
    except (OSError, keys.KeyError_) as e:
        raise NoHostKey(f"host key {path}: {e}") from None
    reader = auditdb.open_reader(db)
    try:
        return receipts.build(reader, run_id, host_key)
    except receipts.NotThisKey as e:
        raise NoHostKey(str(e)) from None
    except (RunNotFound, receipts.ReceiptRefused) as e:
        raise Refusal(str(e)) from None
    except RunUnverified as e:
        raise Refusal(f"run {run_id} does not verify, so no receipt vouches for it: {e}") from None
    finally:
        reader.conn.close()


def _signer(db: str, reader: Any) -> Any | None:
    """The log key, when this account may sign the trail's log: its host key signed the trail's
    newest checkpoint (the owner; the log key is made on first use) and the log, if it exists,
    is this key's. None for anyone else (a reviewer, another account): they read what is signed."""
    from amdflash.store.chain import load_checkpoints

    path = auditdb.host_key_path(db)
    try:
        public = keys.public_bytes(keys.load_private(path)) if path.exists() else None
    except (OSError, keys.KeyError_):
        return None
    newest = load_checkpoints(reader.conn, "WHERE c.id = (SELECT max(id) FROM checkpoints)")
    if public is None or not newest or newest[0].public_key != public:
        return None
    key_path = log_key_path(db)
    known = tlog.verifier_key(log_dir(db))
    if known is not None and not key_path.exists():
        return None
    try:
        key = keys.load_or_create(key_path)
    except (OSError, keys.KeyError_):
        return None
    if known is not None and tlog.parse_vkey(known)[1] != keys.public_bytes(key):
        return None
    return key


def log_now(db: str, settings: dict[str, Any] | None = None, with_receipt: receipts.Receipt | None = None
            ) -> tlog.Head:
    """The newest signed tree head, the log first brought up to the trail (the checkpoints not
    logged yet, and a receipt if given) when this account signs it (_signer); for anyone else
    the newest one signed, read only. Refusal when there is none."""
    reader = auditdb.open_reader(db)
    try:
        key = _signer(db, reader)
        if key is not None:
            return trail_log.record(reader.conn, log_dir(db), key, origin(settings),
                                    [with_receipt] if with_receipt else []).head
    except (tlog.LogError, OSError) as e:
        raise Refusal(f"transparency log {log_dir(db)}: {e}") from None
    finally:
        reader.conn.close()
    if with_receipt is not None:
        raise Refusal(f"the receipt of run {with_receipt.run_id} is not in the transparency log, and only the "
                      "account whose key signs the trail logs it")
    head = tlog.Log(log_dir(db)).last_head()
    if head is None:
        raise Refusal(f"no signed tree head in {log_dir(db)} yet: the log starts at the end of this host's next "
                      "board command")
    return head


def resolve(db: str, run_id: str) -> str:
    """The run a (prefix of a) run id names; Refusal if none or several."""
    from amdflash.store.queries import RunNotFound, resolve_run

    reader = auditdb.open_reader(db)
    try:
        return resolve_run(reader, run_id)
    except RunNotFound as e:
        raise Refusal(str(e)) from None
    finally:
        reader.conn.close()


def proof(db: str, run_id: str, settings: dict[str, Any] | None = None) -> tuple[bytes, str]:
    """A run's receipt (its bytes as logged) and its C2SP tlog-proof against the newest tree
    head. A receipt the log holds needs no key; one never logged (its process died, or the log
    could not be written then) is built and logged first, by the trail's owner only."""
    run_id = resolve(db, run_id)
    directory = log_dir(db)
    logged = trail_log.logged_receipt(directory, run_id)
    if logged is None:
        made = receipt(db, run_id)
        if not made.ended:
            raise Refusal(f"run {made.run_id} has not ended (its last checkpoint is not final): its receipt is "
                          "not logged until it has")
        log_now(db, settings, made)
        logged = trail_log.logged_receipt(directory, run_id)
        if logged is None:
            raise Refusal(f"the receipt of run {run_id} could not be logged in {directory}")
    try:
        return logged[1], trail_log.proof_of(directory, logged[0], db)
    except tlog.LogError as e:
        raise Refusal(str(e)) from None
