"""The per-host transparency log: an RFC 6962 Merkle tree over the exact bytes of every sealed
checkpoint's text and of every run's receipt, its tree heads signed as C2SP tlog-checkpoint
notes with a log key of its own.

Interface for the witness and timestamp clients (store/witness.py, store/timestamp.py):

    log_dir(db_path) -> Path                 where a database's log lives (beside its anchor)
    newest_tree_head(directory) -> str|None  the newest signed tree head: the C2SP
                                             tlog-checkpoint signed note text, exactly as signed
                                             ("<origin>\\n<size>\\n<base64 root>\\n\\n— <name> <sig>\\n")
    consistency_proof(directory, old, new) -> list[bytes]
                                             RFC 6962 / RFC 9162 §2.1.4 proof that the tree of size
                                             `old` is a prefix of the tree of size `new`
    verifier_key(directory) -> str|None      the log's note verifier key (Go's note.NewVerifier text)
    parse_checkpoint(text) -> (origin, size, root)   the body of a tree head (no signature check)

The files, in one directory beside the anchor (DB.anchor.tlog/), which `audit archive` never
touches, so the leaf hashes outlive the rows they were made from:

    hashes     every hash of the tree that is ever final, 32 bytes each, append-only: leaf i at
               stored_index(0, i), the root of each complete subtree right after its last leaf
               (so appending and every proof read O(log n) hashes)
    entries    one JSON line per leaf: what it is (a checkpoint by id and hash, a run's receipt)
    heads      one JSON line per signed tree head: size, root, note (the newest is the last)
    log.vkey   the verifier key

A tree head is never signed for a smaller tree than the last one signed, nor for a different
tree of a size already signed: before signing, the stored tree's hash at the last signed size
must still be the last signed root (else the log was damaged or rolled back, and nothing is
signed). The log key (log_key.pem beside the host key, 0600) signs only tree heads.
"""
from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import os
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from amdflash.store import keys
from amdflash.store.writer.database import default_anchor

HASH = 32
EMPTY_ROOT = hashlib.sha256(b"").digest()
ALG_ED25519 = b"\x01"
LOG_KEY_FILE = "log_key.pem"


class LogError(RuntimeError):
    """The log cannot be read, extended or signed as asked (one line saying why)."""


# -- RFC 6962 hashing ----------------------------------------------------------------------------

def leaf_hash(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def stored_index(level: int, n: int) -> int:
    """Where the n-th hash of `level` sits in the hashes file. Leaf n is followed by the roots
    of the complete subtrees it closes, lowest first; a level-L node is the one written right
    after the level L-1 node 2n+1, which takes us down to leaf (n+1)*2^L - 1, written after
    every hash of the leaves before it: (that leaf) + (its half) + (its quarter) + ..."""
    for _ in range(level):
        n = 2 * n + 1
    i = 0
    while n:
        i += n
        n >>= 1
    return i + level


def _split(n: int) -> int:
    """The largest power of two smaller than n (n > 1)."""
    return 1 << ((n - 1).bit_length() - 1)


# -- signed notes (C2SP signed-note, Ed25519) ----------------------------------------------------

_NAME = re.compile(r"^[^\s+]+$")


def key_id(name: str, public: bytes) -> bytes:
    """The 4-byte key hash of a note key: SHA-256(name || 0x0A || 0x01 || public key)[:4]."""
    return hashlib.sha256(name.encode() + b"\n" + ALG_ED25519 + public).digest()[:4]


def vkey(name: str, public: bytes) -> str:
    """The verifier key text (golang.org/x/mod/sumdb/note's NewVerifier reads it)."""
    return f"{name}+{key_id(name, public).hex()}+{base64.b64encode(ALG_ED25519 + public).decode()}"


def parse_vkey(text: str) -> tuple[str, bytes]:
    """(name, public key) of a verifier key; LogError if it is not one for Ed25519."""
    parts = text.strip().split("+", 2)          # the key's base64 may hold a "+" itself
    try:
        name, hint, raw = parts[0], bytes.fromhex(parts[1]), base64.b64decode(parts[2], validate=True)
    except (IndexError, ValueError):
        raise LogError(f"not a note verifier key: {text.strip()[:80]!r}") from None
    if len(parts) != 3 or not _NAME.match(name) or raw[:1] != ALG_ED25519 or len(raw) != 33 \
            or key_id(name, raw[1:]) != hint:
        raise LogError(f"not an Ed25519 note verifier key (or its key hash does not match): {text.strip()[:80]!r}")
    return name, raw[1:]


def sign_note(body: str, name: str, key: Any) -> str:
    """`body` (lines, each ending in a newline) signed as a note by `key` under `name`."""
    if not body.endswith("\n") or "\n\n" in body:
        raise LogError("a note's text is non-empty lines, each ending in a newline")
    public = keys.public_bytes(key)
    sig = key.sign(body.encode())
    return f"{body}\n\u2014 {name} {base64.b64encode(key_id(name, public) + sig).decode()}\n"


def note_signatures(note: str) -> tuple[str, list[tuple[str, bytes, bytes]]]:
    """(body, [(name, key hash, signature)]) of a signed note; LogError if it is not one."""
    cut = note.rfind("\n\n")
    if cut < 0 or not note.endswith("\n"):
        raise LogError("not a signed note (no blank line before its signatures)")
    body, sigs = note[:cut + 1], []
    for line in note[cut + 2:].splitlines():
        m = re.fullmatch(r"\u2014 (\S+) ([A-Za-z0-9+/=]+)", line)
        if not m:
            raise LogError(f"not a note signature line: {line[:80]!r}")
        try:
            raw = base64.b64decode(m.group(2), validate=True)
        except ValueError:
            raise LogError(f"not a note signature line: {line[:80]!r}") from None
        sigs.append((m.group(1), raw[:4], raw[4:]))
    return body, sigs


def verify_note(note: str, verifier: str) -> str:
    """The body of `note` if `verifier` (a vkey) signed it; LogError otherwise."""
    name, public = parse_vkey(verifier)
    body, sigs = note_signatures(note)
    hint = key_id(name, public)
    for signer, h, sig in sigs:
        if signer == name and h == hint and keys.verify_signature(public, sig, body.encode()):
            return body
    raise LogError(f"the note carries no valid signature by {name}")


def checkpoint_body(origin: str, size: int, root: bytes) -> str:
    return f"{origin}\n{size}\n{base64.b64encode(root).decode()}\n"


def parse_checkpoint(text: str) -> tuple[str, int, bytes]:
    """(origin, size, root hash) of a tree head note's body (or of the whole note: the body is
    its first three lines). No signature is checked here: verify_note does that."""
    lines = text.split("\n")
    try:
        origin, size, root = lines[0], int(lines[1]), base64.b64decode(lines[2], validate=True)
    except (IndexError, ValueError):
        raise LogError("not a tlog checkpoint (origin, size, base64 root hash)") from None
    if not origin or size < 0 or len(root) != HASH or lines[1] != str(size):
        raise LogError("not a tlog checkpoint (origin, size, base64 root hash)")
    return origin, size, root


# -- where it lives ------------------------------------------------------------------------------

def log_dir(db_path: str) -> Path:
    """The log of the database at `db_path`: a directory beside its anchor file."""
    anchor = default_anchor(db_path)
    return anchor.with_name(anchor.name + ".tlog")


def log_key_path(host_key: Path) -> Path:
    """The log key's file: beside the host key (same directory, same 0600 rule)."""
    return host_key.with_name(LOG_KEY_FILE)


def default_origin() -> str:
    """amdflash.local/<hostname>/<first 8 hex of the machine-id>: one log per host."""
    from amdflash.store.writer.sealer import machine_id

    host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname()) or "host"
    mid = (machine_id() or "").strip()[:8] or "nomachineid"
    return f"amdflash.local/{host}/{mid}"


def newest_tree_head(directory: Path) -> str | None:
    """The newest signed tree head (note text), or None when none was signed yet."""
    last = Log(directory).last_head()
    return last.note if last else None


def consistency_proof(directory: Path, old: int, new: int) -> list[bytes]:
    return Log(directory).consistency(old, new)


def inclusion_proof(directory: Path, index: int, size: int) -> list[bytes]:
    return Log(directory).inclusion(index, size)


def verifier_key(directory: Path) -> str | None:
    try:
        return (directory / "log.vkey").read_text().strip() or None
    except OSError:
        return None


# -- the log -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Head:
    size: int
    root: bytes
    note: str


class Log:
    """One log directory. Reading needs no lock; appending and signing hold `locked()`."""

    def __init__(self, directory: Path):
        self.dir = Path(directory)
        self.hashes = self.dir / "hashes"
        self.entries_path = self.dir / "entries"
        self.heads = self.dir / "heads"

    # -- reading --
    def size(self) -> int:
        """Leaves recorded (a complete entry line each; hashes beyond them are not leaves yet)."""
        return self._raw().count(b"\n")

    def _raw(self) -> bytes:
        try:
            return self.entries_path.read_bytes()
        except FileNotFoundError:
            return b""

    def entries(self) -> list[dict[str, Any]]:
        """Every entry (a torn last line, without its newline, is not one)."""
        return [json.loads(line) for line in self._raw().split(b"\n")[:-1]]

    def find(self, needle: bytes, newest: bool = True) -> dict[str, Any] | None:
        """The newest (or first) entry whose line holds `needle`, read without parsing the
        others: what a run's end needs of a log of many thousand leaves."""
        raw = self._raw()
        end = raw.rfind(b"\n") + 1                 # complete lines only
        at = raw.rfind(needle, 0, end) if newest else raw.find(needle, 0, end)
        if at < 0:
            return None
        start = raw.rfind(b"\n", 0, at) + 1
        return json.loads(raw[start:raw.index(b"\n", at)])

    def last_head(self) -> Head | None:
        try:
            data = self.heads.read_bytes()
        except FileNotFoundError:
            return None
        lines = data.split(b"\n")[:-1]
        if not lines:
            return None
        h = json.loads(lines[-1])
        return Head(int(h["size"]), bytes.fromhex(h["root"]), h["note"])

    def _read(self, f: Any, index: int) -> bytes:
        f.seek(index * HASH)
        data = f.read(HASH)
        if len(data) != HASH:
            raise LogError(f"{self.hashes} is shorter than the log it records (hash {index} is missing)")
        return data

    @contextlib.contextmanager
    def _reader(self) -> Iterator[Any]:
        try:
            f = open(self.hashes, "rb")
        except FileNotFoundError:
            raise LogError(f"no log at {self.dir}") from None
        with f:
            yield f

    def _range(self, f: Any, lo: int, hi: int) -> bytes:
        """MTH of leaves [lo, hi): complete aligned subtrees are read, the rest is combined."""
        n = hi - lo
        if n & (n - 1) == 0 and lo % n == 0:
            level = n.bit_length() - 1
            return self._read(f, stored_index(level, lo >> level))
        k = _split(n)
        return node_hash(self._range(f, lo, lo + k), self._range(f, lo + k, hi))

    def tree_hash(self, size: int) -> bytes:
        if size == 0:
            return EMPTY_ROOT
        with self._reader() as f:
            return self._range(f, 0, size)

    def inclusion(self, index: int, size: int) -> list[bytes]:
        """RFC 6962 §2.1.1 audit path of leaf `index` in the tree of `size` leaves."""
        if not 0 <= index < size:
            raise LogError(f"leaf {index} is not in a tree of {size}")
        self._known(size)
        with self._reader() as f:
            return self._path(f, index, 0, size)

    def _path(self, f: Any, m: int, lo: int, hi: int) -> list[bytes]:
        if hi - lo == 1:
            return []
        k = _split(hi - lo)
        if m < k:
            return self._path(f, m, lo, lo + k) + [self._range(f, lo + k, hi)]
        return self._path(f, m - k, lo + k, hi) + [self._range(f, lo, lo + k)]

    def consistency(self, old: int, new: int) -> list[bytes]:
        """RFC 6962 §2.1.2 (RFC 9162 §2.1.4) proof that tree `old` is a prefix of tree `new`."""
        if not 0 <= old <= new:
            raise LogError(f"no consistency proof from {old} to {new} leaves")
        self._known(new)
        if old == 0 or old == new:
            return []
        with self._reader() as f:
            return self._subproof(f, old, 0, new, True)

    def _subproof(self, f: Any, m: int, lo: int, hi: int, whole: bool) -> list[bytes]:
        n = hi - lo
        if m == n:
            return [] if whole else [self._range(f, lo, hi)]
        k = _split(n)
        if m <= k:
            return self._subproof(f, m, lo, lo + k, whole) + [self._range(f, lo + k, hi)]
        return self._subproof(f, m - k, lo + k, hi, False) + [self._range(f, lo, lo + k)]

    def _known(self, size: int) -> None:
        if size > self.size():
            raise LogError(f"the log at {self.dir} has {self.size()} leaves, not {size}")

    # -- writing --
    @contextlib.contextmanager
    def locked(self) -> Iterator[Log]:
        """The log held for appending and signing (other amdflash processes wait)."""
        from amdflash.stages.files import private_dir

        private_dir(self.dir)
        fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._repair()
            yield self
        finally:
            os.close(fd)

    def _repair(self) -> None:
        """After a crash mid-append: hashes or an entry line past the last complete leaf are
        dropped (never below the last signed size: that is damage, refused)."""
        raw = self._raw()
        n = raw.count(b"\n")
        for path, data in ((self.entries_path, raw), (self.heads, _read_or_empty(self.heads))):
            if data and not data.endswith(b"\n"):      # a line torn by a crash: never a whole one
                with open(path, "r+b") as f:
                    f.truncate(data.rfind(b"\n") + 1)
        want = stored_index(0, n) * HASH
        have = self.hashes.stat().st_size if self.hashes.exists() else 0
        if have < want:
            raise LogError(f"{self.hashes} holds {have // HASH} hashes, fewer than the {n} leaves recorded need: "
                           "the log was damaged; nothing more is signed")
        if have > want:
            with open(self.hashes, "r+b") as f:
                f.truncate(want)
        last = self.last_head()
        if last is not None and last.size > n:
            raise LogError(f"the log at {self.dir} has {n} leaves, but a tree of {last.size} was signed: it was "
                           "rolled back or damaged; nothing more is signed")

    def append(self, leaves: list[tuple[bytes, dict[str, Any]]]) -> int:
        """Append (leaf bytes, what it is) in order; the index of the first. Holding locked()."""
        n = self.size()
        first = n
        with open(self.hashes, "ab") as hf:
            reader = open(self.hashes, "rb") if n else None
            try:
                pending: list[bytes] = []
                written = stored_index(0, n)

                def stored(index: int) -> bytes:
                    if index >= written:
                        return pending[index - written]
                    assert reader is not None
                    return self._read(reader, index)

                for data, _ in leaves:
                    h = leaf_hash(data)
                    pending.append(h)
                    level, i = 0, n
                    while i & 1:                 # leaf n closes a subtree at each trailing 1 bit
                        h = node_hash(stored(stored_index(level, i - 1)), h)
                        level, i = level + 1, i >> 1
                        pending.append(h)
                    n += 1
                hf.write(b"".join(pending))
                hf.flush()
                os.fdatasync(hf.fileno())
            finally:
                if reader is not None:
                    reader.close()
        lines = "".join(json.dumps({"i": first + j, **what}, sort_keys=True, separators=(",", ":")) + "\n"
                        for j, (_, what) in enumerate(leaves))
        with open(self.entries_path, "ab") as ef:
            ef.write(lines.encode())
            ef.flush()
            os.fdatasync(ef.fileno())
        return first

    def sign(self, key: Any, origin: str) -> Head:
        """A signed tree head for the whole log now (holding locked()): the last one again if
        nothing was added; refused if the stored tree no longer has the last signed root."""
        if not _NAME.match(origin):
            raise LogError(f"log origin {origin!r}: it must be one word, without spaces or '+'")
        public = keys.public_bytes(key)
        key_text = vkey(origin, public)
        known = verifier_key(self.dir)
        if known is not None and known != key_text:
            name, _ = parse_vkey(known)
            raise LogError(f"the log at {self.dir} is {name}'s (its key is {known}); this log key or origin "
                           f"({origin}) is another: a log's origin and key are chosen once, when it starts")
        size = self.size()
        last = self.last_head()
        if last is not None:
            if size < last.size:
                raise LogError(f"the log has {size} leaves, fewer than the {last.size} already signed")
            if self.tree_hash(last.size) != last.root:
                raise LogError(f"the log's tree of {last.size} leaves is not the one signed: the log was changed; "
                               "nothing more is signed")
            if size == last.size:
                return last
        root = self.tree_hash(size)
        note = sign_note(checkpoint_body(origin, size, root), origin, key)
        if known is None:
            _write_small(self.dir / "log.vkey", key_text + "\n")
        with open(self.heads, "ab") as f:
            f.write(json.dumps({"size": size, "root": root.hex(), "note": note},
                               separators=(",", ":")).encode() + b"\n")
            f.flush()
            os.fdatasync(f.fileno())
        return Head(size, root, note)


def _read_or_empty(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


def _write_small(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def root_from_inclusion(index: int, size: int, leaf: bytes, path: list[bytes]) -> bytes | None:
    """RFC 9162 §2.1.3.2: the root that `path` proves leaf hash `leaf` at `index` is under, in a
    tree of `size`; None when the path cannot be one of such a tree."""
    if not 0 <= index < size:
        return None
    fn, sn, r = index, size - 1, leaf
    for p in path:
        if sn == 0:
            return None
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            while not fn & 1 and fn:
                fn, sn = fn >> 1, sn >> 1
        else:
            r = node_hash(r, p)
        fn, sn = fn >> 1, sn >> 1
    return r if sn == 0 else None


def parse_proof_file(text: str) -> tuple[int, list[bytes], str, bytes | None]:
    """(index, inclusion path, checkpoint note, extra) of a C2SP tlog-proof; LogError if not one."""
    lines = text.split("\n")
    if not lines or lines[0] != "c2sp.org/tlog-proof@v1":
        raise LogError("not a c2sp.org/tlog-proof@v1 file")
    i, extra = 1, None
    try:
        if lines[i].startswith("extra "):
            extra = base64.b64decode(lines[i][6:], validate=True)
            i += 1
        if not lines[i].startswith("index ") or str(int(lines[i][6:])) != lines[i][6:]:
            raise ValueError
        index = int(lines[i][6:])
        path = []
        for line in lines[i + 1:]:
            if not line:
                break
            h = base64.b64decode(line, validate=True)
            if len(h) != HASH:
                raise ValueError
            path.append(h)
    except (IndexError, ValueError):
        raise LogError("not a c2sp.org/tlog-proof@v1 file (its index or proof lines)") from None
    cut = text.find("\n\n")
    if cut < 0:
        raise LogError("a tlog-proof without its checkpoint")
    return index, path, text[cut + 2:], extra


def proof_file(index: int, path: list[bytes], head_note: str, extra: bytes | None = None) -> str:
    """A C2SP tlog-proof (c2sp.org/tlog-proof@v1): index, inclusion proof, the checkpoint."""
    lines = ["c2sp.org/tlog-proof@v1"]
    if extra:
        lines.append("extra " + base64.b64encode(extra).decode())
    lines.append(f"index {index}")
    lines += [base64.b64encode(h).decode() for h in path]
    return "\n".join(lines) + "\n\n" + head_note
