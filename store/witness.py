"""Witnesses: outside parties that cosign this host's transparency log (store/tlog.py).

A witness (C2SP tlog-witness) keeps, for each log it follows, the last tree head it cosigned,
and cosigns a new one only if a consistency proof shows that the new tree extends it. So a
host that rolls back or rewrites its log cannot get the rewritten tree cosigned: the witness
answers 409 (it cosigned another tree at that size) or 422 (the proof does not hold), and a
reviewer who requires k cosignatures from witnesses they trust (the config file's quorum)
knows that k parties saw this tree grow only by appending.

This module holds what needs no network: the request body of `add-checkpoint`, the checkpoint
note parsed, the witnesses' keys (C2SP signed-note verifier keys, type 0x04), cosignatures
checked (C2SP tlog-cosignature v1: the witness's key, the line's name and key id, the
timestamp), and the cosigned tree heads kept as files beside the anchor. Asking the
witnesses is the engine's (pipeline/engine/witnessing.py).

Files: `<anchor>.witnessed/` (0700), holding `checkpoint.<size>` (0600): the log's tree head
at that size with every cosignature that verified appended, as a C2SP signed note any note
verifier reads; and `last.<key id>`: the size a witness last cosigned (what the next
request's `old` line says; a wrong one costs a 409 and a retry, never trust).
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from amdflash.stages.files import PRIVATE, private_dir, write_new
from amdflash.store.files import NotAFile, read_regular
from amdflash.store.keys import verify_signature
from amdflash.store.writer.database import default_anchor

COSIGNATURE_TYPE = 0x04       # signed-note signature type: timestamped Ed25519 cosignature
MAX_PROOF_LINES = 63          # the protocol's bound on a consistency proof
DASH = "\u2014"               # every signature line starts with an em dash and a space
MAX_NOTE = 64 * 1024          # a checkpoint with a few dozen signatures is a few kB
SKEW = 600                    # seconds a witness's clock may be ahead of ours
_NAME = re.compile(r"[^\s+]+")


class WitnessError(ValueError):
    """A witness setting, answer or cosignature that cannot be taken; the text says why."""


@dataclass(frozen=True)
class Witness:
    """A witness as the config file names it: its verifier key (`name+keyid+base64`) and URL."""

    name: str
    key: bytes              # the Ed25519 public key, 32 bytes
    url: str                # the submission prefix: add-checkpoint is POSTed to URL/add-checkpoint

    @property
    def key_id(self) -> bytes:
        return key_id(self.name, self.key)

    @property
    def vkey(self) -> str:
        raw = bytes([COSIGNATURE_TYPE]) + self.key
        return f"{self.name}+{self.key_id.hex()}+{base64.b64encode(raw).decode()}"


def key_id(name: str, key: bytes, kind: int = COSIGNATURE_TYPE) -> bytes:
    """SHA-256(name || 0x0A || type || key)[:4] (C2SP signed-note)."""
    return hashlib.sha256(name.encode() + b"\n" + bytes([kind]) + key).digest()[:4]


def parse_vkey(text: str) -> tuple[str, bytes]:
    """(name, Ed25519 public key) of a cosignature verifier key `name+<8 hex>+<base64 0x04||key>`."""
    parts = text.strip().split("+", 2)   # the base64 may hold "+" too
    if len(parts) != 3 or not _NAME.fullmatch(parts[0]):
        raise WitnessError(f"witness key {text!r} is not 'name+keyid+base64' (a C2SP verifier key)")
    name, hex_id, b64 = parts
    try:
        wanted, raw = bytes.fromhex(hex_id), base64.b64decode(b64, validate=True)
    except (ValueError, binascii.Error):
        raise WitnessError(f"witness key {text!r}: the key id is not hex or the key is not base64") from None
    if len(raw) != 33 or raw[0] != COSIGNATURE_TYPE:
        raise WitnessError(f"witness key {text!r} is not a timestamped Ed25519 cosignature key (type 0x04, 32 bytes)")
    if len(wanted) != 4 or key_id(name, raw[1:]) != wanted:
        raise WitnessError(f"witness key {text!r}: the key id does not match the name and key")
    return name, raw[1:]


@dataclass(frozen=True)
class Checkpoint:
    """A C2SP tlog-checkpoint: its note text (origin, size, root hash, extension lines) and the
    signature lines that followed it."""

    body: str
    signatures: tuple[str, ...] = ()

    @property
    def origin(self) -> str:
        return self.body.split("\n", 1)[0]

    @property
    def size(self) -> int:
        return int(self.body.split("\n")[1])

    @property
    def root(self) -> bytes:
        return base64.b64decode(self.body.split("\n")[2])

    @property
    def text(self) -> str:
        return self.body + "\n" + "".join(line + "\n" for line in self.signatures)

    def with_lines(self, lines: list[str]) -> Checkpoint:
        return Checkpoint(self.body, tuple(dict.fromkeys([*self.signatures, *lines])))


def parse_note(text: str) -> Checkpoint:
    """The checkpoint in a signed note's text; WitnessError if it is not one."""
    if any(ord(c) < 0x20 and c != "\n" for c in text) or not text.endswith("\n"):
        raise WitnessError("not a signed note: control characters, or no final newline")
    cut = text.rfind("\n\n")
    if cut < 0:
        raise WitnessError("not a signed note: no blank line before the signatures")
    body, lines = text[:cut + 1], text[cut + 2:].splitlines()
    fields = body.split("\n")
    if len(fields) < 4 or not fields[0] or not fields[1].isdigit() or (fields[1] != "0" and fields[1][0] == "0"):
        raise WitnessError("not a checkpoint: origin, tree size and root hash lines expected")
    try:
        if len(base64.b64decode(fields[2], validate=True)) != 32:
            raise ValueError
    except (ValueError, binascii.Error):
        raise WitnessError("not a checkpoint: the third line is not a base64 SHA-256 root hash") from None
    if not lines or not all(_signature_line(line) for line in lines):
        raise WitnessError("not a signed note: a signature line is malformed")
    return Checkpoint(body, tuple(lines))


def _signature_line(line: str) -> tuple[str, bytes] | None:
    """(key name, key id || signature) of `— name base64`, None if malformed."""
    if not line.startswith(DASH + " "):
        return None
    parts = line[2:].split(" ")
    if len(parts) != 2 or not _NAME.fullmatch(parts[0]):
        return None
    try:
        raw = base64.b64decode(parts[1], validate=True)
    except (ValueError, binascii.Error):
        return None
    return (parts[0], raw) if len(raw) > 4 else None


def request_body(old: int, proof: list[bytes], checkpoint: str) -> bytes:
    """The body of `POST <prefix>/add-checkpoint`: `old N`, the proof's hashes, a blank line,
    the signed checkpoint."""
    if len(proof) > MAX_PROOF_LINES:
        raise WitnessError(f"a consistency proof of {len(proof)} hashes (the protocol allows {MAX_PROOF_LINES})")
    lines = [f"old {old}", *(base64.b64encode(h).decode() for h in proof), ""]
    return ("\n".join(lines) + "\n" + checkpoint).encode()


def cosigned_message(body: str, timestamp: int) -> bytes:
    """What a cosignature v1 signs: its header, its time, then the checkpoint's note text."""
    return f"cosignature/v1\ntime {timestamp}\n{body}".encode()


@dataclass(frozen=True)
class Cosignature:
    witness: str            # the witness's name
    timestamp: int          # when it cosigned (POSIX seconds), as it signed it
    line: str               # the signature line, to append to the checkpoint


def check_line(witness: Witness, body: str, line: str, now: float, asked: float | None = None) -> Cosignature | None:
    """The witness's cosignature in `line` over the checkpoint `body`; None for a line of
    another key (ignored, as the spec says); WitnessError for a line of this witness's key that
    does not verify, or whose time is ahead of ours or before we asked."""
    parsed = _signature_line(line)
    if parsed is None:
        raise WitnessError(f"witness {witness.name} answered a malformed signature line")
    name, raw = parsed
    if name != witness.name or raw[:4] != witness.key_id:
        return None
    if len(raw) != 4 + 8 + 64:
        raise WitnessError(f"witness {witness.name}'s cosignature is not a timestamped Ed25519 signature")
    (timestamp,) = struct.unpack(">Q", raw[4:12])
    if timestamp >= 1 << 63 or not verify_signature(witness.key, raw[12:], cosigned_message(body, timestamp)):
        raise WitnessError(f"witness {witness.name}'s cosignature does not verify with its key")
    if timestamp > now + SKEW:
        raise WitnessError(f"witness {witness.name}'s cosignature is dated {int(timestamp - now)} s in the future")
    if asked is not None and timestamp < asked - SKEW:
        raise WitnessError(f"witness {witness.name}'s cosignature is dated {int(asked - timestamp)} s before it "
                           "was asked (an old answer replayed?)")
    return Cosignature(witness.name, timestamp, line)


def check_answer(witness: Witness, body: str, answer: bytes, now: float, asked: float) -> Cosignature:
    """The witness's cosignature among the lines of its 200 answer (the others ignored)."""
    try:
        text = answer.decode("utf-8")
    except UnicodeDecodeError:
        raise WitnessError(f"witness {witness.name} answered text that is not UTF-8") from None
    found = [c for line in text.splitlines() if line and (c := check_line(witness, body, line, now, asked))]
    if not found:
        raise WitnessError(f"witness {witness.name} answered no cosignature of its key")
    return found[0]


def cosigned_by(checkpoint: Checkpoint, witnesses: list[Witness], now: float) -> list[Cosignature]:
    """The witnesses among `witnesses` whose cosignature on the checkpoint verifies (one each)."""
    found: dict[str, Cosignature] = {}
    for witness in witnesses:
        for line in checkpoint.signatures:
            try:
                c = check_line(witness, checkpoint.body, line, now)
            except WitnessError:
                continue
            if c is not None:
                found.setdefault(witness.vkey, c)
    return list(found.values())


# -- the cosigned tree heads, beside the anchor ---------------------------------------------------------

def witnessed_dir(db: str) -> Path:
    return Path(str(default_anchor(db)) + ".witnessed")


def _path(db: str, size: int) -> Path:
    return witnessed_dir(db) / f"checkpoint.{size}"


def stored(db: str, size: int) -> Checkpoint | None:
    """The cosigned tree head kept for `size`, None if there is none (or it is not one)."""
    try:
        return parse_note(read_regular(_path(db, size), MAX_NOTE).decode("utf-8"))
    except (OSError, NotAFile, UnicodeDecodeError, WitnessError):
        return None


def store(db: str, checkpoint: Checkpoint, cosignatures: list[Cosignature]) -> Checkpoint:
    """Keep the checkpoint with these cosignatures added to those already kept for its size. A
    kept head of another tree at that size is never merged with it, and never replaced once
    witnesses cosigned it: that head is what the witnesses hold against a log rolled back or
    forked since (then the new one, not kept, is returned). Returns what is kept."""
    private_dir(witnessed_dir(db))
    before = stored(db, checkpoint.size)
    if before is not None and before.body != checkpoint.body and len(before.signatures) > 1:
        return checkpoint.with_lines([c.line for c in cosignatures])
    base = before if before is not None and before.body == checkpoint.body else checkpoint
    kept = base.with_lines([*checkpoint.signatures, *(c.line for c in cosignatures)])
    if before is None or kept.text != before.text:
        write_new(_path(db, checkpoint.size), kept.text, mode=PRIVATE)
    return kept


def last_size(db: str, witness: Witness) -> int:
    """The tree size this witness last cosigned for this log, as we last heard (0: never)."""
    try:
        text = read_regular(witnessed_dir(db) / f"last.{witness.key_id.hex()}", 64).decode()
        return int(text) if text.strip().isdigit() else 0
    except (OSError, NotAFile, UnicodeDecodeError):
        return 0


def remember(db: str, witness: Witness, size: int) -> None:
    private_dir(witnessed_dir(db))
    write_new(witnessed_dir(db) / f"last.{witness.key_id.hex()}", f"{size}\n", mode=PRIVATE)


def newest(db: str) -> Checkpoint | None:
    """The largest tree head kept."""
    try:
        sizes = [int(n.split(".", 1)[1]) for n in os.listdir(witnessed_dir(db))
                 if n.startswith("checkpoint.") and n.split(".", 1)[1].isdigit()]
    except OSError:
        return None
    return stored(db, max(sizes)) if sizes else None


def covering(db: str, size: int) -> Checkpoint | None:
    """The kept cosigned tree head of at least `size` entries that an entry at index size-1 (a
    run's receipt) is proven in: the one with the most cosignatures, the smallest of those.
    Witnesses are asked for the newest head only, so a head that missed one (a witness down)
    never gathers more, while a later head holding the same entry may have them all."""
    try:
        sizes = sorted(int(n.split(".", 1)[1]) for n in os.listdir(witnessed_dir(db))
                       if n.startswith("checkpoint.") and n.split(".", 1)[1].isdigit())
    except OSError:
        return None
    best: Checkpoint | None = None
    for s in sizes:
        if s >= size:
            kept = stored(db, s)     # every line kept was checked (store): the log's and cosignatures
            if kept is not None and len(kept.signatures) > max(1, len(best.signatures) if best else 0):
                best = kept
    return best


def evidence(db: str, size: int, witnesses: list[Witness]) -> dict[str, bytes]:
    """What a reviewer's bundle holds of the witnesses for an entry the tree of `size` entries
    holds: `checkpoint.cosigned` (the covering tree head with its cosignatures, a signed note
    any note verifier reads), `witnesses.vkeys` (the configured witnesses' verifier keys, one
    a line), and for each timestamp token `checkpoint.timestamped` (the exact bytes it dates)
    with `tsa<i>.tsr`. Empty when no cosigned head covers it yet."""
    head = covering(db, size)
    if head is None:
        return {}
    files = {"checkpoint.cosigned": head.text.encode(),
             "witnesses.vkeys": "".join(w.vkey + "\n" for w in witnesses).encode()}
    base = witnessed_dir(db) / f"checkpoint.{head.size}"
    try:
        files["checkpoint.timestamped"] = read_regular(Path(f"{base}.timestamped"), MAX_NOTE)
        for token in sorted(base.parent.glob(base.name + ".tsa*.tsr")):
            files[token.name.split(".", 2)[2]] = read_regular(token, MAX_NOTE)
    except (OSError, NotAFile):
        files.pop("checkpoint.timestamped", None)
    return files


def check_offline(cosigned: str, log_vkey: str, trusted: list[Witness], quorum: int) -> list[Cosignature]:
    """A reviewer's check of a cosigned tree head, without the host: signed by the log's key
    (`log_vkey`), and cosigned by at least `quorum` of the witnesses the reviewer trusts (their
    keys from the witnesses, never from the bundle). The cosignatures that count; WitnessError
    naming what falls short. A cosignature's time is not held against the reviewer's clock:
    a bundle is checked years later."""
    from amdflash.store import tlog

    head = parse_note(cosigned)
    try:
        tlog.verify_note(cosigned, log_vkey)
    except tlog.LogError as e:
        raise WitnessError(f"the tree head is not the log's: {e}") from None
    if head.origin != log_vkey.split("+", 1)[0]:
        raise WitnessError(f"the tree head's origin {head.origin!r} is not the log key's name")
    found: dict[str, Cosignature] = {}
    for witness in trusted:
        for line in head.signatures:
            c = check_line(witness, head.body, line, float(1 << 62))
            if c is not None:
                found.setdefault(witness.vkey, c)
    if len(found) < quorum:
        raise WitnessError(f"cosigned by {len(found)} of the {len(trusted)} trusted witnesses, {quorum} needed")
    return list(found.values())
