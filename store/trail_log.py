"""What the host's transparency log (store.tlog) holds: every sealed checkpoint's text, in id
order, and the receipt (store.receipts) of every run that ended.

`record` runs at each run's end, after the writer sealed the final checkpoint: it appends the
checkpoints sealed since the last one logged (by any amdflash process of this trail), then
the receipts of the runs that just ended, and signs a new tree head. Before appending it
checks that the last checkpoint logged is still in the database, unchanged (or was archived):
a database rolled back or rewritten under the log is refused here, with nothing signed.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from amdflash.store import chain, receipts, tlog
from amdflash.store.tlog import Head, Log, LogError


@dataclass(frozen=True)
class Logged:
    head: Head
    receipts: dict[str, int]      # run id -> the leaf index of its receipt


def _archived_through(conn: Any) -> int:
    through = 0
    for (detail,) in conn.execute("SELECT detail FROM checkpoints WHERE kind = 'archive'"):
        try:
            through = max(through, int(json.loads(detail or "{}").get("through_checkpoint", 0)))
        except (ValueError, TypeError):
            continue
    return through


def _checkpoint_leaves(conn: Any, last: dict[str, Any] | None) -> list[tuple[bytes, dict[str, Any]]]:
    """The checkpoints sealed since `last`, the last one logged, as leaves; LogError if the
    database no longer holds what the log says it held."""
    after = int(last["id"]) if last else 0
    if last is not None:
        row = conn.execute("SELECT hash FROM checkpoints WHERE id = ?", (after,)).fetchone()
        if row is None and _archived_through(conn) < after:
            newest = conn.execute("SELECT max(id) FROM checkpoints").fetchone()[0]
            raise LogError(f"the transparency log holds checkpoint #{after}, but the database ends at "
                           f"#{newest or 0}: the trail was rolled back (or replaced) under its log")
        if row is not None and bytes(row[0]).hex() != last["hash"]:
            raise LogError(f"checkpoint #{after} differs from the one the transparency log holds: the trail was "
                           "rewritten under its log")
    cps = chain.load_checkpoints(conn, "WHERE c.id > ?", (after,))
    if not cps:
        return []
    if last is not None and cps[0].id == after + 1:
        prev = bytes.fromhex(last["hash"])
    else:
        # The first log of this trail, or checkpoints archived before they were logged: the
        # chain goes on from where the database's own chain starts (genesis, or an archive).
        from amdflash.store.verify import _base

        prev = _base(chain.load_checkpoints(conn, "WHERE c.kind = 'archive'"))[1]
    leaves = []
    for cp in cps:
        text = receipts.checkpoint_text(cp, prev)
        if hashlib.sha256(text).digest() != cp.hash:
            raise LogError(f"checkpoint #{cp.id}'s fields and the one before it do not give its hash: the trail "
                           "does not verify ('amdflash audit verify' names what)")
        leaves.append((text, {"kind": "checkpoint", "id": cp.id, "hash": cp.hash.hex()}))
        prev = cp.hash
    return leaves


def record(conn: Any, directory: Path, log_key: Any, origin: str,
           ended: Iterable[receipts.Receipt] = ()) -> Logged:
    """Append the checkpoints not logged yet and the receipts given (of runs that ended, not
    logged yet), then sign the tree head. `conn`: the trail, read in one snapshot."""
    from amdflash.store.verify import snapshot

    log = Log(directory)
    with log.locked():
        logged: dict[str, int] = {}
        with snapshot(conn):
            leaves = _checkpoint_leaves(conn, log.find(b'"kind":"checkpoint"'))
        fresh = {}
        for r in ended:
            known = receipt_leaf(directory, r.run_id)
            if known is not None:
                logged[r.run_id] = int(known["i"])
                if logged_receipt(directory, r.run_id) is None and \
                        known.get("sha256") == hashlib.sha256(r.envelope).hexdigest():
                    _keep(directory, int(known["i"]), r.envelope)     # its copy was lost: the same bytes again
            if known is not None or r.run_id in fresh:
                continue
            if not r.ended:
                raise LogError(f"run {r.run_id} has not ended (its last checkpoint is not final): its receipt "
                               "could still change, so it is not logged")
            fresh[r.run_id] = len(leaves)
            leaves.append((r.envelope, {"kind": "receipt", "run": r.run_id, "checkpoint": r.final,
                                        "sha256": hashlib.sha256(r.envelope).hexdigest()}))
        first = log.append(leaves) if leaves else log.size()
        for i in fresh.values():
            # The bytes beside their leaf: a bundle or a proof needs no key to hand them over.
            _keep(directory, first + i, leaves[i][0])
        head = log.sign(log_key, origin)
        return Logged(head, {**logged, **{run: first + i for run, i in fresh.items()}})


RECEIPTS = "receipts"


def _keep(directory: Path, index: int, data: bytes) -> None:
    """A copy, not the record (the leaf is): written without a sync of its own; one lost in a
    crash is put back the next time the run's receipt is built (record, with it ended)."""
    from amdflash.stages.files import private_dir

    private_dir(directory / RECEIPTS)
    path = directory / RECEIPTS / f"{index}.intoto.json"
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def logged_receipt(directory: Path, run_id: str) -> tuple[dict[str, Any], bytes] | None:
    """A run's receipt as the log took it: (its entry, its bytes), the bytes checked against the
    SHA-256 the entry keeps; None when it was never logged (or its copy is gone or changed)."""
    entry = receipt_leaf(directory, run_id)
    if entry is None:
        return None
    try:
        data = (directory / RECEIPTS / f"{int(entry['i'])}.intoto.json").read_bytes()
    except OSError:
        return None
    return (entry, data) if hashlib.sha256(data).hexdigest() == entry.get("sha256") else None


def proof_of(directory: Path, entry: dict[str, Any], db: str | None = None) -> str:
    """The C2SP tlog-proof of a logged leaf: against the tree head holding it that the most
    witnesses cosigned, the smallest of those (store.witness.covering: the note with their
    cosignatures), else against
    the newest tree head the log signed. `db`: the trail, whose cosigned heads are looked up."""
    from amdflash.store import witness

    log = Log(directory)
    index = int(entry["i"])
    cosigned = witness.covering(db, index + 1) if db is not None else None
    if cosigned is not None and cosigned.size <= log.size():
        if log.tree_hash(cosigned.size) != cosigned.root:
            raise LogError(f"the cosigned tree head of {cosigned.size} leaves is not this log's tree of that size")
        return tlog.proof_file(index, log.inclusion(index, cosigned.size), cosigned.text)
    head = log.last_head()
    if head is None or head.size <= index:
        raise LogError("no signed tree head includes the receipt yet")
    return tlog.proof_file(index, log.inclusion(index, head.size), head.note)


def receipt_leaf(directory: Path, run_id: str) -> dict[str, Any] | None:
    """The log's entry of a run's receipt, or None."""
    # Entries are written with sorted keys, compact: a receipt's line holds "run":"<id>",
    # "sha256" right after it (a run id is JSON text of its own, so it cannot fake the quote).
    needle = b'"run":' + json.dumps(run_id).encode() + b',"sha256"'
    e = Log(directory).find(needle, newest=False)
    return e if e is not None and e.get("kind") == "receipt" and e.get("run") == run_id else None


def consistency_file(directory: Path, old: int, note: str | None = None) -> str:
    """A consistency proof in the body format of C2SP tlog-witness's add-checkpoint: "old N",
    the proof's hashes in base64 (one a line), a blank line, the newer tree head note."""
    import base64

    log = Log(directory)
    last = log.last_head()
    note = note or (last.note if last else None)
    if note is None:
        raise LogError("no signed tree head yet")
    _, size, _ = tlog.parse_checkpoint(note)
    hashes = log.consistency(old, size)
    return f"old {old}\n" + "".join(base64.b64encode(h).decode() + "\n" for h in hashes) + "\n" + note
