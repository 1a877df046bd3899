"""A bundle's receipt parts (store/bundle.py: PARTS, ADD, CHECKS): the run's receipt
(receipt.intoto.json), its inclusion in the host's transparency log (receipt.tlog-proof, a
C2SP tlog-proof against the newest tree head) and the log's verifier key (log.vkey).

Adding needs no key: the log keeps each receipt's bytes beside its leaf (store.trail_log). A run
whose receipt was never logged gets none in its bundle (`audit log --proof RUN` logs it).

Checking (`audit verify --bundle`) needs no amdflash database and no network: the envelope's
DSSE signature by the key that signed the export's checkpoints (or a given --key); its statement
of the bundle's run, summing up checkpoints that are the export's; the proof's tree head signed
by log.vkey, and the receipt's leaf under its root.
"""
from __future__ import annotations

import base64
import json
from typing import Any

from amdflash.store import keys, receipts, tlog, trail_log
from amdflash.store.chain import Broken

RECEIPT = "receipt.intoto.json"
PROOF = "receipt.tlog-proof"
VKEY = "log.vkey"
NAMES = (RECEIPT, PROOF, VKEY)


def add(db: Any, selection: Any, facts: Any) -> dict[str, bytes]:
    """The receipt parts of the bundle's run, if its receipt is in the log (else none)."""
    from amdflash.store.read_only import source_path

    path = source_path(db.conn) or ""      # the log sits beside the database, not beside a private copy
    directory = tlog.log_dir(path)
    logged = trail_log.logged_receipt(directory, selection.run_id)
    vkey = tlog.verifier_key(directory)
    if logged is None or vkey is None:
        return {}
    entry, data = logged
    try:
        proof = trail_log.proof_of(directory, entry, path)
    except tlog.LogError:
        return {}
    return {RECEIPT: data, PROOF: proof.encode(), VKEY: (vkey + "\n").encode()}


def check(bundle: Any) -> None:
    """The receipt parts of a bundle, if it has them; Broken naming what does not hold."""
    held = [n for n in NAMES if n in bundle.fds]
    if not held:
        bundle.said.append("receipt     none in the bundle (its run's receipt was not in the host's log)")
        return
    if len(held) != len(NAMES):
        missing = ", ".join(n for n in NAMES if n not in held)
        raise Broken(f"the bundle has {', '.join(held)} but not {missing}: it was removed")
    raw = bundle.read(RECEIPT)
    statement = _envelope(raw, bundle)
    _statement(statement, bundle)
    index, size, origin = _proof(raw, bundle)
    bundle.said.append(f"receipt     {RECEIPT}: the run's in-toto statement ({receipts.PREDICATE_TYPE}), its DSSE "
                       "signature by the key that signed the export's checkpoints")
    bundle.said.append(f"log         {PROOF}: the receipt is leaf {index} of {origin}'s tree of {size}, whose head "
                       f"{VKEY} signed (keep the log's key apart from the bundle to prove whose log it is)")


def _envelope(raw: bytes, bundle: Any) -> dict[str, Any]:
    try:
        env = json.loads(raw)
        body = base64.b64decode(env["payload"], validate=True)
        sigs = [base64.b64decode(s["sig"], validate=True) for s in env["signatures"]]
        kind = env["payloadType"]
        statement = json.loads(body)
    except (ValueError, KeyError, TypeError, RecursionError):
        raise Broken(f"{RECEIPT} is not a DSSE envelope of a statement: it was changed") from None
    if kind != receipts.PAYLOAD_TYPE or not isinstance(statement, dict):
        raise Broken(f"{RECEIPT}: payload type {str(kind)[:60]!r}, not an in-toto statement: it was changed")
    given, called = bundle.given()
    trusted = given if given is not None else list(bundle.facts.signers)
    message = receipts.pae(kind, body)
    if not any(keys.verify_signature(k, s, message) for k in trusted for s in sigs):
        whose = called if given is not None else "the key that signed the export's checkpoints"
        raise Broken(f"{RECEIPT}: its signature is not by {whose}: the receipt was changed or made elsewhere")
    return statement


def _statement(st: dict[str, Any], bundle: Any) -> None:
    run = str(bundle.info.get("run"))
    predicate = _dict(st.get("predicate"))
    if st.get("_type") != receipts.STATEMENT_TYPE or st.get("predicateType") != receipts.PREDICATE_TYPE \
            or _dict(predicate.get("run")).get("id") != run:
        raise Broken(f"{RECEIPT} is not the receipt of the bundle's run {run}: it was changed or swapped")
    known = bundle.facts.checkpoints
    listed = _dict(predicate.get("trail")).get("checkpoints")
    for cp in listed if isinstance(listed, list) else []:
        ident = cp.get("id") if isinstance(cp, dict) else None
        if ident in known and known[ident] != cp.get("sha256"):
            raise Broken(f"{RECEIPT}: checkpoint #{ident} is not the export's (its hash differs): one of them was "
                         "changed")


def _dict(value: Any) -> dict[str, Any]:
    """A field of a statement from elsewhere: a JSON object, or {} for anything else."""
    return value if isinstance(value, dict) else {}


def _proof(raw: bytes, bundle: Any) -> tuple[int, int, str]:
    try:
        index, path, note, _ = tlog.parse_proof_file(bundle.read(PROOF).decode("utf-8"))
        tlog.verify_note(note, bundle.read(VKEY).decode("utf-8"))
        origin, size, root = tlog.parse_checkpoint(note)
    except UnicodeDecodeError:
        raise Broken(f"{PROOF} or {VKEY} is not UTF-8 text: it was changed") from None
    except tlog.LogError as e:
        raise Broken(f"{PROOF}: {e}: it was changed") from None
    if tlog.root_from_inclusion(index, size, tlog.leaf_hash(raw), path) != root:
        raise Broken(f"{PROOF}: the receipt is not leaf {index} of the tree its checkpoint signs: the receipt or "
                     "the proof was changed")
    return index, size, origin
