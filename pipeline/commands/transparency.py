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


def record_ended(db: str, reports: dict[str, dict[str, Any]], settings: dict[str, Any] | None = None
                 ) -> dict[str, dict[str, Any]]:
    """At the end of a board command (the writer closed: every run sealed): the checkpoints
    sealed since the last logged and the receipts of the runs that ended go into the log, and a
    tree head is signed. Per run: {"origin", "tree_size", "leaf"} or {"error": why}. Never
    raises: a run's end is not undone by its log."""
    if not reports:
        return {}
    try:
        host_key, log_key = _keys(db)
        reader = auditdb.open_reader(db)
        try:
            ended = []
            for run_id, rep in reports.items():
                cps = receipts.run_checkpoints(reader.conn, run_id)
                if cps and cps[-1].kind == "final":
                    ended.append(receipts.from_report(rep, cps, host_key))
            logged = trail_log.record(reader.conn, log_dir(db), log_key, origin(settings), ended)
        finally:
            reader.conn.close()
    except (tlog.LogError, receipts.ReceiptRefused, keys.KeyError_, OSError, sqlite3.Error, Refusal,
            ValueError) as e:
        return {run_id: {"error": str(e)} for run_id in reports}
    head = logged.head
    name = tlog.parse_checkpoint(head.note)[0]
    return {run_id: ({"origin": name, "tree_size": head.size, "leaf": logged.receipts[run_id]}
                     if run_id in logged.receipts else {"error": "the run has not ended: no receipt logged"})
            for run_id in reports}


def receipt(db: str, run_id: str) -> receipts.Receipt:
    """A run's receipt, built from the trail (the run must verify)."""
    from amdflash.store.queries import RunNotFound
    from amdflash.store.run_rows import RunUnverified

    try:
        host_key = keys.load_private(auditdb.host_key_path(db))
    except (OSError, keys.KeyError_) as e:
        raise Refusal(f"host key {auditdb.host_key_path(db)}: {e}") from None
    reader = auditdb.open_reader(db)
    try:
        return receipts.build(reader, run_id, host_key)
    except (RunNotFound, receipts.ReceiptRefused) as e:
        raise Refusal(str(e)) from None
    except RunUnverified as e:
        raise Refusal(f"run {run_id} does not verify, so no receipt vouches for it: {e}") from None
    finally:
        reader.conn.close()


def log_now(db: str, settings: dict[str, Any] | None = None, with_receipt: receipts.Receipt | None = None
            ) -> trail_log.Logged:
    """Bring the log up to the trail (the checkpoints not logged yet, and a receipt if given)
    and sign its tree head."""
    try:
        _, log_key = _keys(db)
    except (OSError, keys.KeyError_) as e:
        raise Refusal(f"cannot sign the transparency log's tree head: {e}") from None
    reader = auditdb.open_reader(db)
    try:
        return trail_log.record(reader.conn, log_dir(db), log_key, origin(settings),
                                [with_receipt] if with_receipt else [])
    except (tlog.LogError, OSError) as e:
        raise Refusal(f"transparency log {log_dir(db)}: {e}") from None
    finally:
        reader.conn.close()


def proof(db: str, run_id: str, settings: dict[str, Any] | None = None) -> tuple[receipts.Receipt, str]:
    """A run's receipt and its C2SP tlog-proof; the receipt is logged first if it never was
    (a run whose end was not logged: its process died, or the log key was unreadable then)."""
    made = receipt(db, run_id)
    if trail_log.receipt_leaf(log_dir(db), made.run_id) is None:
        if not made.ended:
            raise Refusal(f"run {made.run_id} has not ended (its last checkpoint is not final): its receipt is "
                          "not logged until it has")
        log_now(db, settings, made)
    try:
        return made, trail_log.proof(log_dir(db), made)
    except tlog.LogError as e:
        raise Refusal(str(e)) from None


def bundle_files(db: str, run_id: str, settings: dict[str, Any] | None = None) -> dict[str, bytes]:
    """What a reviewer's bundle holds of the run's receipt: receipt.intoto.json (the DSSE
    envelope), receipt.tlog-proof (its inclusion in the newest tree head), log.vkey (the log's
    note verifier key) and host.pem (the host key's public half, for openssl)."""
    made, text = proof(db, run_id, settings)
    vkey = tlog.verifier_key(log_dir(db)) or ""
    return {"receipt.intoto.json": made.envelope, "receipt.tlog-proof": text.encode(),
            "log.vkey": (vkey + "\n").encode(), "host.pem": host_pem(db).encode()}


def host_pem(db: str) -> str:
    """The host key's public half as PEM (SubjectPublicKeyInfo), for openssl."""
    from cryptography.hazmat.primitives import serialization

    path = auditdb.host_key_path(db)
    try:
        key = keys.load_or_create(path)
    except (OSError, keys.KeyError_) as e:
        raise Refusal(f"host key {path}: {e}") from None
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo).decode()
