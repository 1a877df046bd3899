"""A bundle's witness parts (store/bundle.py: PARTS, ADD, CHECKS), and a reviewer's policy held
against the whole bundle (`audit verify --bundle DIR --policy FILE`, store/policy.py).

    checkpoint.cosigned      the tree head receipt.tlog-proof proves the receipt under, with the
                             witnesses' cosignatures (a C2SP signed note)
    witnesses.vkeys          the configured witnesses' verifier keys, one a line
    checkpoint.timestamped   that head as it stood when it reached its quorum: the bytes dated
    tsa<i>.tsr               authority i's RFC 3161 token over them (DER)

store.witness.evidence gathers them; a bundle of a run whose tree head no quorum cosigned yet
has none (`audit witness`, then a new bundle). Without a policy they are checked for what the
bundle can say of itself (one head, the log's, the cosignature lines of the keys it lists);
who the witnesses and authorities are is the reviewer's to say: their keys and roots come from
the policy, never from the bundle.
"""
from __future__ import annotations

import hashlib
import re
from typing import Any

from amdflash.store import tlog
from amdflash.store import witness as ws
from amdflash.store.chain import Broken

COSIGNED = "checkpoint.cosigned"
VKEYS = "witnesses.vkeys"
STAMPED = "checkpoint.timestamped"
TOKEN = re.compile(r"tsa[0-9]{1,2}\.tsr")
RECEIPT, PROOF, VKEY = "receipt.intoto.json", "receipt.tlog-proof", "log.vkey"
NEVER = float(1 << 62)       # a cosignature's time is not held against the reviewer's clock, years later


def add(db: Any, selection: Any, facts: Any) -> dict[str, bytes]:
    """The witness parts of the bundle's run: those of the cosigned head its receipt's proof is
    against (none when its receipt is not logged, or no quorum cosigned a head holding it)."""
    from amdflash.store import trail_log

    from amdflash.store.read_only import source_path

    path = source_path(db.conn) or ""      # the log sits beside the database, not beside a private copy
    directory = tlog.log_dir(path)
    logged = trail_log.logged_receipt(directory, selection.run_id)
    if logged is None:
        return {}
    try:
        proof = trail_log.proof_of(directory, logged[0], path)
    except tlog.LogError:
        return {}
    files = ws.evidence(path, int(logged[0]["i"]) + 1, list(selection.witnesses))
    note = tlog.parse_proof_file(proof)[2]
    if COSIGNED not in files or _body(files[COSIGNED].decode()) != _body(note):
        return {}        # not the head the proof is against (a head cosigned since): the next bundle has it
    if not selection.witnesses:
        files.pop(VKEYS, None)
    if not any(TOKEN.fullmatch(n) for n in files):
        files.pop(STAMPED, None)    # fixed before an authority was asked, and none answered: nothing dates it
    return files


def _body(note: str) -> str:
    return note[:note.find("\n\n") + 1]


def _tokens(bundle: Any) -> list[str]:
    return sorted(n for n in bundle.fds if TOKEN.fullmatch(n))


def _text(bundle: Any, name: str) -> str:
    try:
        return bundle.read(name).decode("utf-8")
    except UnicodeDecodeError:
        raise Broken(f"{name} is not UTF-8 text: it was changed") from None


def _proof_note(bundle: Any) -> str:
    try:
        return tlog.parse_proof_file(_text(bundle, PROOF))[2]
    except tlog.LogError as e:
        raise Broken(f"{PROOF}: {e}: it was changed") from None


def check(bundle: Any) -> None:
    """What the witness parts can say of themselves; Broken naming what does not hold."""
    held = [n for n in (COSIGNED, VKEYS, STAMPED) if n in bundle.fds] + _tokens(bundle)
    if not held:
        bundle.said.append("witnesses   none in the bundle (no tree head holding the receipt had its quorum of "
                           "cosignatures when the bundle was made)")
        return
    for needed in (COSIGNED, PROOF):
        if needed not in bundle.fds:
            raise Broken(f"the bundle has {held[0]} but no {needed}: it was removed")
    if (STAMPED in bundle.fds) != bool(_tokens(bundle)):
        raise Broken(f"the bundle has {STAMPED} or a tsaN.tsr token without the other: one was removed")
    text = _text(bundle, COSIGNED)
    try:
        head = ws.parse_note(text)
        tlog.verify_note(text, _text(bundle, VKEY))
    except (ws.WitnessError, tlog.LogError) as e:
        raise Broken(f"{COSIGNED}: {e}: it was changed") from None
    if head.body != _body(_proof_note(bundle)):
        raise Broken(f"{COSIGNED} is not the tree head {PROOF} proves the receipt under: one of them was changed")
    said = f"witnesses   {COSIGNED}: the proof's tree head, signed by {VKEY}"
    if VKEYS in bundle.fds:
        listed = _listed(bundle)
        found = []
        for w in listed:
            for line in head.signatures:
                try:
                    c = ws.check_line(w, head.body, line, NEVER)
                except ws.WitnessError as e:
                    raise Broken(f"{COSIGNED}: {e}: it was changed") from None
                if c is not None:
                    found.append(w.name)
                    break
        said += (f"; cosigned by {len(found)} of the {len(listed)} witnesses {VKEYS} names ({', '.join(found)}): "
                 "who they are is the bundle's word (--policy names the witnesses you trust)")
    bundle.said.append(said)
    if STAMPED in bundle.fds:
        _stamped_head(bundle, head.body)
        dated = hashlib.sha256(bundle.read(STAMPED)).digest()
        for name in _tokens(bundle):
            if _imprint(bundle.read(name)) != dated:
                raise Broken(f"{name} is not a token over {STAMPED}: one of them was changed")
        bundle.said.append(f"time        {', '.join(_tokens(bundle))}: RFC 3161 token(s) over {STAMPED}, that tree "
                           "head (the authority's signature and chain: --policy names the roots you trust)")


def _listed(bundle: Any) -> list[ws.Witness]:
    out = []
    for n, line in enumerate(_text(bundle, VKEYS).splitlines(), 1):
        try:
            out.append(ws.Witness(*ws.parse_vkey(line), ""))
        except ws.WitnessError:
            raise Broken(f"{VKEYS} line {n} is not a witness's verifier key: it was changed") from None
    return out


def _stamped_head(bundle: Any, body: str) -> ws.Checkpoint:
    try:
        stamped = ws.parse_note(_text(bundle, STAMPED))
    except ws.WitnessError as e:
        raise Broken(f"{STAMPED}: {e}: it was changed") from None
    if stamped.body != body:
        raise Broken(f"{STAMPED} is not the tree head {PROOF} proves the receipt under: one of them was changed")
    return stamped


def _imprint(token: bytes) -> bytes | None:
    from rfc3161_client import decode_timestamp_response

    try:
        return bytes(decode_timestamp_response(token).tst_info.message_imprint.message)
    except Exception:
        return None


# -- a reviewer's policy ---------------------------------------------------------------------------

class _Fails(Exception):
    pass


def check_policy(bundle: Any) -> None:
    """With a policy: the receipt signed by its host key, included under the tree head, the head
    signed by its log key, cosigned by `quorum` of its witnesses, dated by a token chaining to
    its roots. Each is checked whatever the others give; Broken naming every one that fails."""
    policy = bundle.policy
    if policy is None:
        return
    results: list[tuple[str, str | None, str]] = []
    for claim, step in (("receipt", _receipt), ("inclusion", _inclusion), ("log", _log), ("witnesses", _quorum),
                        ("time", _time)):
        try:
            results.append((claim, step(bundle, policy), ""))
        except _Fails as e:
            results.append((claim, None, str(e)))
    bundle.policy_claims = {claim: {"holds": ok is not None, "words": ok if ok is not None else why}
                            for claim, ok, why in results}
    failed = [f"{claim}: {why}" for claim, ok, why in results if ok is None]
    if failed:
        raise Broken(f"policy {policy.path}: {len(failed)} of {len(results)} checks fail: " + "; ".join(failed))
    bundle.said.append(f"policy      {policy.path}: receipt, inclusion, log, witnesses and time all hold")
    bundle.said += [f"  {claim:<10} {words}" for claim, words, _ in results]


def _need(bundle: Any, name: str) -> None:
    if name not in bundle.fds:
        raise _Fails(f"no {name} in the bundle")


def _receipt(bundle: Any, policy: Any) -> str:
    from amdflash.store import keys, receipt_parts

    _need(bundle, RECEIPT)
    try:
        receipt_parts._envelope(bundle.read(RECEIPT), bundle)       # under bundle.given(): the policy's key
    except Broken as e:
        raise _Fails(str(e)) from None
    return f"{RECEIPT} signed (DSSE) by the policy's host key {keys.fingerprint(policy.host_key)}"


def _head(bundle: Any) -> tuple[int, list[bytes], str]:
    _need(bundle, PROOF)
    try:
        index, path, note, _ = tlog.parse_proof_file(bundle.read(PROOF).decode("utf-8"))
        tlog.parse_checkpoint(note)
    except (UnicodeDecodeError, tlog.LogError) as e:
        raise _Fails(f"{PROOF} is not a tlog-proof ({e})") from None
    return index, path, note


def _inclusion(bundle: Any, policy: Any) -> str:
    index, path, note = _head(bundle)
    _need(bundle, RECEIPT)
    _, size, root = tlog.parse_checkpoint(note)
    if tlog.root_from_inclusion(index, size, tlog.leaf_hash(bundle.read(RECEIPT)), path) != root:
        raise _Fails(f"the receipt is not leaf {index} of the tree of {size} the proof's tree head names")
    return f"the receipt is leaf {index} of the tree of {size} ({PROOF})"


def _log(bundle: Any, policy: Any) -> str:
    note = _head(bundle)[2]
    try:
        tlog.verify_note(note, policy.log_key)
    except tlog.LogError as e:
        raise _Fails(f"the proof's tree head is not signed by the policy's log key ({e})") from None
    origin = tlog.parse_checkpoint(note)[0]
    if origin != policy.origin:
        raise _Fails(f"the tree head's origin {origin!r} is not the policy's log key's name {policy.origin!r}")
    return f"the tree head is signed by the policy's log key ({origin})"


def _quorum(bundle: Any, policy: Any) -> str:
    if policy.quorum == 0:
        return "not required by the policy (quorum = 0)"
    try:
        head = ws.parse_note(_head(bundle)[2])
    except ws.WitnessError as e:
        raise _Fails(f"the proof's tree head is not a signed note ({e})") from None
    found = []
    for w in policy.witnesses:
        for line in head.signatures:
            try:
                c = ws.check_line(w, head.body, line, NEVER)
            except ws.WitnessError:
                continue            # a changed line of this witness's key: not a cosignature
            if c is not None:
                found.append(c)
                break
    if len(found) < policy.quorum:
        raise _Fails(f"cosigned by {len(found)} of the policy's {len(policy.witnesses)} witnesses"
                     f"{' (' + ', '.join(c.witness for c in found) + ')' if found else ''}, {policy.quorum} needed")
    import datetime as dt

    at = ", ".join(f"{c.witness} at {dt.datetime.fromtimestamp(c.timestamp, dt.UTC).isoformat(timespec='seconds')}"
                   for c in found)
    return f"cosigned by {len(found)} of the policy's {len(policy.witnesses)} witnesses, quorum {policy.quorum}: {at}"


def _time(bundle: Any, policy: Any) -> str:
    from amdflash.store import timestamp

    if not policy.tsa_roots:
        return "not required by the policy (tsa_roots = [])"
    _need(bundle, STAMPED)
    note = _head(bundle)[2]
    try:
        _stamped_head(bundle, _body(note))
    except Broken as e:
        raise _Fails(str(e)) from None
    data = bundle.read(STAMPED)
    problems = []
    for name in _tokens(bundle):
        try:
            when = timestamp.verify(bundle.read(name), data, list(policy.tsa_roots))
        except timestamp.TimestampError as e:
            problems.append(f"{name}: {e}")
            continue
        return f"{name} dates {STAMPED} (the tree head) at {when.isoformat()}, chaining to the policy's tsa_roots"
    raise _Fails("; ".join(problems) or "no tsaN.tsr token in the bundle")
