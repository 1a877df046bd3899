"""A witness of our own for the tests (C2SP tlog-witness), and a small log to feed it.

`WitnessServer` is an HTTP server on loopback answering `POST /add-checkpoint` as the spec
says: it keeps, per log origin, the size and root hash it last cosigned; checks the note's
signature against the log keys it knows (404 unknown origin, 403 no known key verifies), the
old size (400 above the checkpoint's, 409 with its own size when it differs, 409 when the sizes
match but the roots do not), the RFC 6962 consistency proof (422), and answers 200 with a
timestamped Ed25519 cosignature (cosignature/v1) of its own key. It is written apart from
amdflash's code (store/witness.py, store/tlog.py): its own Merkle arithmetic and signing, so
the tests check one against the other.

`MerkleLog` is an RFC 6962 tree with a signing log key, for tests that need a log without
amdflash's.
"""
from __future__ import annotations

import base64
import hashlib
import http.server
import struct
import threading
import time
from dataclasses import dataclass, field

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

DASH = "\u2014"


def _raw(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def _key_id(name: str, kind: int, public: bytes) -> bytes:
    return hashlib.sha256(name.encode() + b"\n" + bytes([kind]) + public).digest()[:4]


def vkey(name: str, kind: int, public: bytes) -> str:
    return f"{name}+{_key_id(name, kind, public).hex()}+{base64.b64encode(bytes([kind]) + public).decode()}"


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    k = 1
    while k << 1 < n:
        k <<= 1
    return k


class MerkleLog:
    """An RFC 6962 tree over byte leaves, signing its tree heads with a log key (type 0x01)."""

    def __init__(self, origin: str = "test.example/log", key: Ed25519PrivateKey | None = None) -> None:
        self.origin = origin
        self.key = key or Ed25519PrivateKey.generate()
        self.leaves: list[bytes] = []

    @property
    def vkey(self) -> str:
        return vkey(self.origin, 0x01, _raw(self.key))

    def add(self, data: bytes) -> None:
        self.leaves.append(hashlib.sha256(b"\x00" + data).digest())

    def root(self, n: int | None = None) -> bytes:
        n = len(self.leaves) if n is None else n
        return hashlib.sha256(b"").digest() if n == 0 else self._hash(self.leaves[:n])

    def _hash(self, leaves: list[bytes]) -> bytes:
        if len(leaves) == 1:
            return leaves[0]
        k = _split(len(leaves))
        return _node(self._hash(leaves[:k]), self._hash(leaves[k:]))

    def consistency(self, old: int, new: int | None = None) -> list[bytes]:
        new = len(self.leaves) if new is None else new
        if old == 0 or old == new:
            return []
        return self._subproof(old, self.leaves[:new], True)

    def _subproof(self, m: int, leaves: list[bytes], complete: bool) -> list[bytes]:
        n = len(leaves)
        if m == n:
            return [] if complete else [self._hash(leaves)]
        k = _split(n)
        if m <= k:
            return self._subproof(m, leaves[:k], complete) + [self._hash(leaves[k:])]
        return self._subproof(m - k, leaves[k:], False) + [self._hash(leaves[:k])]

    def checkpoint(self, n: int | None = None) -> str:
        n = len(self.leaves) if n is None else n
        body = f"{self.origin}\n{n}\n{base64.b64encode(self.root(n)).decode()}\n"
        sig = self.key.sign(body.encode())
        line = base64.b64encode(_key_id(self.origin, 0x01, _raw(self.key)) + sig).decode()
        return f"{body}\n{DASH} {self.origin} {line}\n"


def consistent(first: int, second: int, first_hash: bytes, second_hash: bytes, proof: list[bytes]) -> bool:
    """RFC 9162 section 2.1.4.2, as written there."""
    if first == second:
        return not proof and first_hash == second_hash
    if first == 0:
        return not proof
    if first > second or not proof:
        return False
    if first & (first - 1) == 0:
        proof = [first_hash, *proof]
    fn, sn = first - 1, second - 1
    while fn & 1:
        fn, sn = fn >> 1, sn >> 1
    fr = sr = proof[0]
    for c in proof[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr, sr = _node(c, fr), _node(c, sr)
            if not fn & 1:
                while fn and not fn & 1:
                    fn, sn = fn >> 1, sn >> 1
        else:
            sr = _node(sr, c)
        fn, sn = fn >> 1, sn >> 1
    return fr == first_hash and sr == second_hash and sn == 0


@dataclass
class WitnessServer:
    """A witness on 127.0.0.1; `logs` maps an origin to the log verifier keys it trusts."""

    name: str = "witness.test/w1"
    logs: dict[str, list[str]] = field(default_factory=dict)
    key: Ed25519PrivateKey = field(default_factory=Ed25519PrivateKey.generate)
    clock: float | None = None           # a fixed time to sign with (None: now)
    delay: float = 0.0                   # seconds to wait before answering (a slow witness)
    known: dict[str, tuple[int, bytes]] = field(default_factory=dict)   # origin -> (size, root) cosigned
    requests: list[tuple[int, str]] = field(default_factory=list)        # (status answered, origin)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._server: http.server.ThreadingHTTPServer | None = None

    @property
    def vkey(self) -> str:
        return vkey(self.name, 0x04, _raw(self.key))

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> WitnessServer:
        witness = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if witness.delay:
                    time.sleep(witness.delay)
                status, kind, answer = (witness.add_checkpoint(body) if self.path.rstrip("/").endswith(
                    "/add-checkpoint") else (404, "text/plain", b"no such endpoint\n"))
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def add_checkpoint(self, request: bytes) -> tuple[int, str, bytes]:
        status, kind, answer, origin = self._answer(request)
        self.requests.append((status, origin))
        return status, kind, answer

    def _answer(self, request: bytes) -> tuple[int, str, bytes, str]:
        text = request.decode("utf-8", "replace")
        head, sep, note = text.partition("\n\n")
        lines = head.split("\n")
        if not sep or not lines[0].startswith("old ") or not lines[0][4:].isdigit():
            return 400, "text/plain", b"malformed request\n", ""
        old = int(lines[0][4:])
        try:
            proof = [base64.b64decode(line, validate=True) for line in lines[1:]]
        except ValueError:
            return 400, "text/plain", b"malformed proof\n", ""
        cut = note.rfind("\n\n")
        body, sigs = note[:cut + 1], note[cut + 2:].splitlines()
        fields = body.split("\n")
        origin = fields[0]
        if origin not in self.logs:
            return 404, "text/plain", b"unknown log\n", origin
        if not any(self._log_signed(body, sigs, key) for key in self.logs[origin]):
            return 403, "text/plain", b"no signature of a known log key\n", origin
        size, root = int(fields[1]), base64.b64decode(fields[2])
        if old > size:
            return 400, "text/plain", b"old size above the checkpoint's\n", origin
        with self._lock:    # the check and the update at once (the spec's race)
            known_size, known_root = self.known.get(origin, (0, b""))
            if old != known_size:
                return 409, "text/x.tlog.size", f"{known_size}\n".encode(), origin
            if old == size and known_size and known_root != root:
                return 409, "text/x.tlog.size", f"{known_size}\n".encode(), origin
            if known_size and not consistent(old, size, known_root, root, proof):
                return 422, "text/plain", b"consistency proof does not verify\n", origin
            if not known_size and proof:
                return 422, "text/plain", b"a proof from size 0 must be empty\n", origin
            self.known[origin] = (size, root)
        stamp = int(self.clock if self.clock is not None else time.time())
        sig = self.key.sign(f"cosignature/v1\ntime {stamp}\n".encode() + body.encode())
        raw = _key_id(self.name, 0x04, _raw(self.key)) + struct.pack(">Q", stamp) + sig
        return 200, "text/plain", f"{DASH} {self.name} {base64.b64encode(raw).decode()}\n".encode(), origin

    @staticmethod
    def _log_signed(body: str, sigs: list[str], vk: str) -> bool:
        name, hex_id, b64 = vk.split("+", 2)
        raw = base64.b64decode(b64)
        for line in sigs:
            parts = line[2:].split(" ")
            if len(parts) != 2 or parts[0] != name:
                continue
            sig = base64.b64decode(parts[1])
            if sig[:4].hex() != hex_id:
                continue
            try:
                Ed25519PublicKey.from_public_bytes(raw[1:]).verify(sig[4:], body.encode())
                return True
            except Exception:
                return False
        return False
