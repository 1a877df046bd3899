"""The host's Ed25519 key, which signs every checkpoint of the audit trail.

The private key is created on first use, readable by its owner only (0600), and never
leaves the host. Its public key (`amdflash audit key`) is what a reviewer keeps apart from
the database: `audit verify --key FILE` then proves that the checkpoints were made by this
host, which someone who rewrote the database and recomputed its hashes cannot fake.

A public key file holds one line, `amdflash-ed25519 <64 hex digits>`; a PEM public key
(SubjectPublicKeyInfo) is accepted too.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from amdflash.store.files import NotAFile, read_regular
from amdflash.stages.files import create_new, private_dir

PUBLIC_PREFIX = "amdflash-ed25519"
KEY_FILE_LIMIT = 64 * 1024   # a PEM key is a few hundred bytes


class KeyError_(RuntimeError):
    """The key file is unreadable, malformed or too widely readable."""


def load_or_create(path: Path) -> Ed25519PrivateKey:
    """The host key at `path`, created (mode 0600, in a directory of its own) if missing."""
    if path.exists():
        return load_private(path)
    private_dir(path.parent)
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    try:
        fd = create_new(path, 0o600)
    except FileExistsError:
        return load_private(path)   # another amdflash process made it first
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
        f.flush()
        os.fsync(f.fileno())
    return key


def load_private(path: Path) -> Ed25519PrivateKey:
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise KeyError_(f"host key {path} is readable by others (mode {mode:o}); chmod 600 it")
    try:
        key = serialization.load_pem_private_key(read_regular(path, KEY_FILE_LIMIT), password=None)
    except NotAFile as e:
        raise KeyError_(f"host key {e}") from None
    except (ValueError, TypeError) as e:
        raise KeyError_(f"host key {path} is not a PEM Ed25519 private key ({e})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyError_(f"host key {path} is not an Ed25519 key")
    return key


def public_bytes(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def public_of(path: Path) -> bytes | None:
    """The public half of the host key at `path`; None if there is none yet (or it is unusable:
    too widely readable, malformed), which no signature matches."""
    if not path.exists():
        return None
    try:
        return public_bytes(load_private(path))
    except (OSError, KeyError_):
        return None


def public_line(public: bytes) -> str:
    return f"{PUBLIC_PREFIX} {public.hex()}"


def fingerprint(public: bytes) -> str:
    return "SHA256:" + hashlib.sha256(public).hexdigest()[:32]


def read_public(path: Path) -> bytes:
    """A public key from a file written by `amdflash audit key` (or PEM)."""
    try:
        text = read_regular(path, KEY_FILE_LIMIT).decode("ascii").strip()
    except (OSError, UnicodeDecodeError, NotAFile) as e:
        raise KeyError_(f"cannot read public key {path}: {e}") from None
    if text.startswith(PUBLIC_PREFIX):
        try:
            raw = bytes.fromhex(text.split()[1])
        except (IndexError, ValueError):
            raw = b""
        if len(raw) != 32:
            raise KeyError_(f"{path}: expected '{PUBLIC_PREFIX} <64 hex digits>'")
        return raw
    try:
        key = serialization.load_pem_public_key(text.encode())
    except ValueError:
        raise KeyError_(f"{path} is neither '{PUBLIC_PREFIX} <hex>' nor a PEM public key") from None
    if not isinstance(key, Ed25519PublicKey):
        raise KeyError_(f"{path} is not an Ed25519 public key")
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def verify_signature(public: bytes, signature: bytes, message: bytes) -> bool:
    try:
        Ed25519PublicKey.from_public_bytes(public).verify(signature, message)
        return True
    except (InvalidSignature, ValueError):
        return False
