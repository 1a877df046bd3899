"""Trusted time (store/timestamp.py): an RFC 3161 token from a local authority (`openssl ts
-reply`, tests/support/tsa.py) over the cosigned tree head, kept only when it verifies, and
checked by `openssl ts -verify` as a reviewer would; a changed token or changed head fails both."""
from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from amdflash.pipeline.engine import witnessing
from amdflash.store import timestamp
from amdflash.store import witness as ws
from tests.support.tsa import AuthorityServer, make_authority
from tests.support.witness_server import MerkleLog, WitnessServer


@pytest.fixture(scope="module")
def authority(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthorityServer]:
    server = AuthorityServer(make_authority(tmp_path_factory.mktemp("tsa"))).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def stranger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another CA: the roots of an authority that is not the one answering."""
    return make_authority(tmp_path_factory.mktemp("other-ca")) / "ca.crt"


def witnessed(tmp_path: Path, authority: AuthorityServer, roots: Path | None = None) -> tuple[str, witnessing.Outcome]:
    log = MerkleLog()
    for i in range(6):
        log.add(f"leaf {i}".encode())
    server = WitnessServer(logs={log.origin: [log.vkey]}).start()
    try:
        settings = witnessing.settings({"witnesses": [{"url": server.url, "key": server.vkey}],
                                        "timestamp_authorities": [{"url": authority.url,
                                                                   "roots": str(roots or authority.roots)}]})
        assert settings is not None
        db = str(tmp_path / "audit.sqlite")
        return db, witnessing.ask(db, log, settings)
    finally:
        server.stop()


def openssl_verify(data: Path, token: Path, roots: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["openssl", "ts", "-verify", "-data", str(data), "-in", str(token), "-CAfile", str(roots)],
                          capture_output=True, text=True, timeout=30)


def test_a_token_over_the_cosigned_head_verifies_with_openssl(tmp_path: Path, authority: AuthorityServer) -> None:
    db, outcome = witnessed(tmp_path, authority)
    assert outcome.words() == "witnessed by 1 of 1" and outcome.timestamps == 1
    [token] = timestamp.tokens(db, 6)
    data = ws.witnessed_dir(db) / "checkpoint.6.timestamped"
    kept = ws.stored(db, 6)
    assert kept is not None and data.read_text() == kept.text      # the cosigned head, as it stood
    done = openssl_verify(data, token, authority.roots)
    assert done.returncode == 0 and "Verification: OK" in done.stdout, done.stderr
    assert token.stat().st_mode & 0o777 == 0o600
    assert timestamp.check(token.read_bytes(), data.read_bytes(), authority.roots).year >= 2024


def test_a_changed_token_or_changed_head_is_refused_by_openssl_and_by_amdflash(
        tmp_path: Path, authority: AuthorityServer) -> None:
    db, _ = witnessed(tmp_path, authority)
    [token] = timestamp.tokens(db, 6)
    data = ws.witnessed_dir(db) / "checkpoint.6.timestamped"
    raw = token.read_bytes()
    changed = tmp_path / "changed.tsr"
    changed.write_bytes(raw[:-8] + bytes([raw[-8] ^ 1]) + raw[-7:])       # a byte of the signature
    assert openssl_verify(data, changed, authority.roots).returncode != 0
    with pytest.raises(timestamp.TimestampError):
        timestamp.check(changed.read_bytes(), data.read_bytes(), authority.roots)
    other = tmp_path / "other head"
    other.write_bytes(data.read_bytes().replace(b"\n6\n", b"\n7\n"))
    assert openssl_verify(other, token, authority.roots).returncode != 0
    with pytest.raises(timestamp.TimestampError, match="does not verify"):
        timestamp.check(raw, other.read_bytes(), authority.roots)


def test_a_token_that_does_not_chain_to_the_configured_roots_is_not_kept(
        tmp_path: Path, authority: AuthorityServer, stranger: Path) -> None:
    db, outcome = witnessed(tmp_path, authority, roots=stranger)
    assert outcome.witnessed and outcome.timestamps == 0
    assert timestamp.tokens(db, 6) == []
    assert any(p.startswith(f"timestamp authority {authority.url}: the token does not verify")
               for p in outcome.problems), outcome.problems


def test_the_evidence_for_a_bundle_is_the_covering_cosigned_head_keys_and_tokens(
        tmp_path: Path, authority: AuthorityServer) -> None:
    db, outcome = witnessed(tmp_path, authority)
    kept = ws.stored(db, 6)
    assert kept is not None
    name, key = ws.parse_vkey(WitnessServer().vkey)
    files = ws.evidence(db, 4, [ws.Witness(name, key, "http://x")])      # an entry at index 3: in the head of 6
    assert sorted(files) == ["checkpoint.cosigned", "checkpoint.timestamped", "tsa0.tsr", "witnesses.vkeys"]
    assert files["checkpoint.cosigned"] == kept.text.encode()
    assert files["witnesses.vkeys"].decode() == f"{ws.Witness(name, key, 'http://x').vkey}\n"
    assert timestamp.check(files["tsa0.tsr"], files["checkpoint.timestamped"], authority.roots)
    assert ws.evidence(db, 7, []) == {}          # no cosigned head holds a 7th entry yet
