"""A run's receipt: an in-toto Statement v1 in a DSSE envelope, signed with the host key.

What it says (the predicate, PREDICATE_TYPE, documented in docs/compliance.md) is read from
the run's sealed rows only — its report (store.queries.report, which refuses a run that does
not verify) and its checkpoints — and only what those rows fix for good: no later run's word
(resumed by, fixed by, superseded by) is in it. Its subjects are digests: the image written,
the board's content before (each backup), the read-back of a verify that passed, the board's
identity as a salted hash, and the run's final checkpoint text.

Receipts are not stored: `amdflash audit receipt --run RUN` builds one from the trail when
asked, and the run's end builds the one the transparency log takes as a leaf. They are the
same bytes every time — canonical JSON (RFC 8785, store.jcs) and Ed25519, which is
deterministic (RFC 8032) — so the log's leaf hash proves any copy. Storing them would add a
table (three canonical row texts, a migration) for bytes the trail already determines.

The board's identity: SHA-256(salt || "<jedec>:<unique id>"), the salt a per-run 16 bytes
derived from the host key (the first 16 bytes of SHA-256 of its signature over
"amdflash receipt salt\\n<run id>"): the same every time, unguessable without the key, so two
receipts of one board cannot be linked by their subject, while whoever holds the board reads
its unique ID from the chip and checks the digest with the salt the predicate gives.
"""
from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from amdflash.store import chain, jcs, keys

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
PREDICATE_TYPE = "https://amdflash.dev/flash-run/v1"

# Arguments that let a run do what it would otherwise refuse: each one given is a force.
FORCES = ("force", "clear_cmp", "unknown_chip_ok", "start_over", "unbind_driver", "expect_part")


class ReceiptRefused(RuntimeError):
    """No receipt for this run (one line saying why)."""


class NotThisKey(ReceiptRefused):
    """The run was sealed by another key than the one at hand: only its host signs its receipt."""


def pae(payload_type: str, body: bytes) -> bytes:
    """DSSE's pre-authentication encoding: "DSSEv1" SP len(type) SP type SP len(body) SP body."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(body), body)


def board_salt(key: Any, run_id: str) -> bytes:
    return hashlib.sha256(key.sign(b"amdflash receipt salt\n" + run_id.encode())).digest()[:16]


def checkpoint_text(cp: chain.Checkpoint, prev: bytes) -> bytes:
    """The exact bytes a checkpoint's hash is the SHA-256 of (store.chain's canonical form)."""
    return b"checkpoint|" + b"|".join(chain.field(v) for v in (
        cp.id, cp.kind, cp.run_id, cp.rows, cp.last_seq, cp.head, cp.public_key, cp.at, cp.detail, prev))


def _sha(text: Any) -> dict[str, str] | None:
    return {"sha256": text.lower()} if isinstance(text, str) and len(text) == 64 else None


def statement(rep: dict[str, Any], checkpoints: Sequence[chain.Checkpoint], salt: bytes) -> dict[str, Any]:
    """The in-toto statement of a run: `rep` its report, `checkpoints` its own, in order."""
    if not checkpoints:
        raise ReceiptRefused(f"run {rep.get('run_id')} has no checkpoint: nothing of it is sealed")
    final = checkpoints[-1]
    board = rep.get("board") or {}
    verifies = rep.get("verifies") or {}
    failed = list(verifies.get("failed") or [])
    verified = bool(verifies.get("total")) and not failed and rep.get("status") == "succeeded"
    subjects: list[dict[str, Any]] = []

    def subject(name: str, digest: dict[str, str] | None) -> None:
        if digest:
            subjects.append({"name": name, "digest": digest})

    subject("image", _sha(rep.get("image_sha256")))
    for i, b in enumerate(rep.get("backups") or ()):
        subject("backup" if i == 0 else f"backup.{i}", _sha(b.get("sha256")))
    if verified:
        subject("read-back", _sha(rep.get("result_sha256")))
    identity = None
    if board.get("unique_id") and board.get("jedec"):
        identity = f"{str(board['jedec']).lower()}:{str(board['unique_id']).lower()}"
        subject("board", {"sha256": hashlib.sha256(salt + identity.encode()).hexdigest()})
    subject(f"trail:{rep.get('run_id')}", {"sha256": final.hash.hex()})

    arguments = rep.get("arguments") or {}
    errors = rep.get("errors") or []
    first_error = rep.get("error") or (errors[0].get("message") if errors else None)
    predicate = {
        "verifier": {"id": "https://amdflash.dev/amdflash", "version": rep.get("tool_version"),
                     "revision": rep.get("tool_revision")},
        "run": {"id": rep.get("run_id"), "command": rep.get("command"), "arguments": arguments,
                "result": rep.get("status"), "firstError": first_error, "emulated": bool(rep.get("emulated"))},
        "verify": {"units": verifies.get("total") or 0, "ok": verifies.get("ok") or 0, "failed": len(failed),
                   "firstFailed": failed[0] if failed else None, "passed": verified},
        "board": {"spec": board.get("spec"), "chip": board.get("chip"), "jedec": board.get("jedec"),
                  "identity": "sha256(salt || '<jedec>:<unique id>')" if identity else None,
                  "salt": salt.hex() if identity else None},
        "protection": {"sr1": board.get("sr1"), "sr2": board.get("sr2"), "sr3": board.get("sr3"),
                       "reading": board.get("protection")},
        "forces": sorted(k for k in FORCES if arguments.get(k)),
        "operator": {"claimed": rep.get("operator_claimed"), "account": rep.get("operator")},
        "host": {"name": rep.get("host"), "machineId": rep.get("machine_id"),
                 "key": keys.fingerprint(final.public_key), "clock": rep.get("clock_sync")},
        "times": {"started": rep.get("started"), "ended": rep.get("ended")},
        "lineage": {"resumes": rep.get("resumes_run_id")},
        "trail": {"firstSeq": checkpoints[0].run, "lastSeq": final.last_seq, "rows": final.rows,
                  "sealed": final.kind, "head": final.head.hex() if final.head else None,
                  "checkpoints": [{"id": c.id, "sha256": c.hash.hex()} for c in checkpoints]},
    }
    return {"_type": STATEMENT_TYPE, "subject": subjects, "predicateType": PREDICATE_TYPE, "predicate": predicate}


def envelope(body: bytes, key: Any) -> bytes:
    """The DSSE envelope of `body`, signed by `key` over the PAE; canonical JSON bytes."""
    sig = key.sign(pae(PAYLOAD_TYPE, body))
    return jcs.canonical({"payloadType": PAYLOAD_TYPE, "payload": base64.b64encode(body).decode(),
                          "signatures": [{"keyid": keys.fingerprint(keys.public_bytes(key)),
                                          "sig": base64.b64encode(sig).decode()}]})


@dataclass(frozen=True)
class Receipt:
    run_id: str
    envelope: bytes          # receipt.intoto.json
    statement: dict[str, Any]
    final: int               # the id of the checkpoint it sums up to
    ended: bool              # sealed final: the run ended, nothing more is added to it


def run_checkpoints(conn: Any, run_id: str) -> list[chain.Checkpoint]:
    return [c for c in chain.load_checkpoints(conn, "WHERE c.run_id = ?", (run_id,)) if c.kind != "archive"]


def from_report(rep: dict[str, Any], checkpoints: Sequence[chain.Checkpoint], key: Any) -> Receipt:
    """The receipt of a run whose report (store.queries.report) is at hand, signed by `key`."""
    run_id = str(rep["run_id"])
    if rep.get("unverified"):
        raise ReceiptRefused(f"run {run_id} does not verify: no receipt vouches for what its rows no longer prove")
    if checkpoints and checkpoints[-1].public_key != keys.public_bytes(key):
        raise NotThisKey(f"run {run_id} was sealed by key {keys.fingerprint(checkpoints[-1].public_key)}, "
                             "not this host's: only the host that recorded a run signs its receipt")
    st = statement(rep, checkpoints, board_salt(key, run_id))
    return Receipt(run_id, envelope(jcs.canonical(st), key), st, checkpoints[-1].id,
                   checkpoints[-1].kind == "final")


def build(db: Any, run_id: str, key: Any) -> Receipt:
    """A run's receipt from the trail (`db`, a sqlite_utils reader): its report, which verifies
    the run first, and its checkpoints."""
    from amdflash.store.queries import report, resolve_run
    from amdflash.store.verify import snapshot

    with snapshot(db.conn):
        run_id = resolve_run(db, run_id)
        rep = report(db, run_id)
        return from_report(rep, run_checkpoints(db.conn, run_id), key)
