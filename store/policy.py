"""A reviewer's policy: the keys and roots they trust, kept apart from any bundle, that
`audit verify --bundle DIR --policy FILE` holds a bundle to (store/witness_parts.py).

A TOML file (docs/compliance.md):

    host_key = "host.pem"           # the host key: a file, or inline ('amdflash-ed25519 HEX' or PEM)
    log_key = "ORIGIN+HASH+BASE64"  # the host's log's note verifier key: inline, or a file holding it
    quorum = 2                      # cosignatures of the witnesses below the tree head needs
    witnesses = [{name = "w1.example/witness", key = "w1.example/witness+HASH+BASE64"}, ...]
    tsa_roots = ["tsa-root.pem"]    # a timestamp authority's root certificates: files, or PEM inline

Every file is named relative to the policy file. Every key must be there: `quorum = 0` with
`witnesses = []`, or `tsa_roots = []`, says in so many words that the reviewer does not ask for
witnesses or time, and the verdict says so. Anything else that does not parse is PolicyError
(exit 2), before the bundle is read.
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from amdflash.store import keys, tlog
from amdflash.store import witness as ws
from amdflash.store.files import NotAFile, read_regular

LIMIT = 1 << 20
FIELDS = ("host_key", "log_key", "quorum", "witnesses", "tsa_roots")


class PolicyError(ValueError):
    """A policy file that cannot be used; the text says why (exit 2)."""


@dataclass(frozen=True)
class Policy:
    path: Path
    host_key: bytes                       # Ed25519 public key
    log_key: str                          # note verifier key (vkey)
    quorum: int
    witnesses: tuple[ws.Witness, ...]
    tsa_roots: tuple[x509.Certificate, ...]

    @property
    def origin(self) -> str:
        return self.log_key.split("+", 1)[0]


def load(path: Path) -> Policy:
    try:
        data = tomllib.loads(read_regular(path, LIMIT).decode("utf-8"))
    except (OSError, NotAFile) as e:
        raise PolicyError(f"cannot read policy {path}: {e}") from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise PolicyError(f"policy {path} is not TOML: {e}") from None
    where = f"policy {path}"
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        raise PolicyError(f"{where}: unknown setting {unknown[0]!r} (it knows {', '.join(FIELDS)})")
    missing = [f for f in FIELDS if f not in data]
    if missing:
        raise PolicyError(f"{where}: no {missing[0]} (every one of {', '.join(FIELDS)} must be set)")
    base = path.parent
    witnesses = tuple(_witness(w, i, where) for i, w in enumerate(_list(data, "witnesses", where)))
    if len({w.vkey for w in witnesses}) != len(witnesses):
        raise PolicyError(f"{where}: a witness is named twice")
    quorum = data["quorum"]
    if not isinstance(quorum, int) or isinstance(quorum, bool) or not 0 <= quorum <= len(witnesses) \
            or (witnesses and quorum == 0):
        raise PolicyError(f"{where}: quorum = {quorum!r}: must be 1..{len(witnesses)} (the witnesses named), or 0 "
                          "with witnesses = []")
    roots: list[x509.Certificate] = []
    for i, entry in enumerate(_list(data, "tsa_roots", where)):
        roots += _certs(entry, base, f"{where}: tsa_roots[{i}]")
    return Policy(path, _host_key(data["host_key"], base, where), _log_key(data["log_key"], base, where), quorum,
                  witnesses, tuple(roots))


def _list(data: dict[str, Any], name: str, where: str) -> list[Any]:
    value = data[name]
    if not isinstance(value, list):
        raise PolicyError(f"{where}: {name} must be a list")
    return value


def _text(value: Any, base: Path, where: str, inline: bool) -> str:
    """`value` itself when it is inline, else the file it names (relative to the policy)."""
    if not isinstance(value, str) or not value.strip():
        raise PolicyError(f"{where}: a string expected")
    if inline:
        return value
    try:
        return read_regular(base / value, LIMIT).decode("utf-8")
    except (OSError, NotAFile, UnicodeDecodeError) as e:
        raise PolicyError(f"{where}: cannot read {base / value}: {e}") from None


def _host_key(value: Any, base: Path, where: str) -> bytes:
    text = _text(value, base, f"{where}: host_key", isinstance(value, str) and value.lstrip().startswith(
        (keys.PUBLIC_PREFIX, "-----BEGIN"))).strip()
    if text.startswith(keys.PUBLIC_PREFIX):
        try:
            raw = bytes.fromhex(text.split()[1])
        except (IndexError, ValueError):
            raw = b""
        if len(raw) == 32:
            return raw
        raise PolicyError(f"{where}: host_key: expected '{keys.PUBLIC_PREFIX} <64 hex digits>'")
    try:
        key = serialization.load_pem_public_key(text.encode())
    except ValueError:
        raise PolicyError(f"{where}: host_key is neither '{keys.PUBLIC_PREFIX} <hex>' nor a PEM public key") from None
    if not isinstance(key, Ed25519PublicKey):
        raise PolicyError(f"{where}: host_key is not an Ed25519 public key")
    return key.public_bytes_raw()


def _log_key(value: Any, base: Path, where: str) -> str:
    if not isinstance(value, str):
        raise PolicyError(f"{where}: log_key: a verifier key (name+hash+base64) or a file holding one expected")
    try:
        tlog.parse_vkey(value)
        return value.strip()
    except tlog.LogError as e:
        if not (base / value).is_file():        # not a file's name either: say what is wrong with the key
            raise PolicyError(f"{where}: log_key: {e}") from None
    text = _text(value, base, f"{where}: log_key", False)
    try:
        tlog.parse_vkey(text)
    except tlog.LogError as e:
        raise PolicyError(f"{where}: log_key {base / value}: {e}") from None
    return text.strip()


def _witness(entry: Any, i: int, where: str) -> ws.Witness:
    at = f"{where}: witnesses[{i}]"
    if not isinstance(entry, dict) or set(entry) - {"name", "key"} or "key" not in entry:
        raise PolicyError(f"{at}: {{name = \"...\", key = \"name+keyid+base64\"}} expected")
    try:
        name, key = ws.parse_vkey(str(entry["key"]))
    except ws.WitnessError as e:
        raise PolicyError(f"{at}: {e}") from None
    if "name" in entry and entry["name"] != name:
        raise PolicyError(f"{at}: name {entry['name']!r} is not its key's ({name!r})")
    return ws.Witness(name, key, "")


def _certs(entry: Any, base: Path, where: str) -> list[x509.Certificate]:
    text = _text(entry, base, where, isinstance(entry, str) and entry.lstrip().startswith("-----BEGIN"))
    try:
        return x509.load_pem_x509_certificates(text.encode())
    except ValueError as e:
        raise PolicyError(f"{where}: not PEM certificates ({e})") from None
