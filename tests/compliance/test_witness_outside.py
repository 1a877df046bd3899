"""The witnesses' cosignatures and the timestamp token of a flash's tree head, checked without
amdflash: a Go program over Go's own golang.org/x/mod/sumdb/note (tests/compliance/witness,
built from Debian's golang-go and golang-golang-x-mod-dev, offline) for the cosigned tree head
(the log's signature and a quorum of tlog-cosignature v1 lines), and `openssl ts -verify` for
the RFC 3161 token. Each also on a mutated copy, which must fail. docs/compliance.md gives a
reviewer these commands.

Skipped, saying why, where go, Go's x/mod or openssl is missing; CI installs them (.ci/run)."""
from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.compliance.test_outside_checks import GOCODE, _missing
from tests.support import cli as command_line
from tests.support.tsa import AuthorityServer, make_authority
from tests.support.witness_server import WitnessServer

HERE = Path(__file__).resolve().parent
ORIGIN = "test.example/outside-checks"

pytestmark = pytest.mark.skipif(_missing() is not None and os.environ.get("CI") != "true", reason=_missing() or "")


@dataclass
class Evidence:
    dir: Path
    program: Path
    roots: Path


def _go_build(out: Path) -> Path:
    env = {**os.environ, "GO111MODULE": "off", "GOPATH": str(GOCODE), "GOFLAGS": "", "GOPROXY": "off",
           "GOCACHE": str(out / "gocache"), "CGO_ENABLED": "0"}
    binary = out / "witness"
    r = subprocess.run(["go", "build", "-o", str(binary), str(HERE / "witness" / "main.go")], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return binary


@pytest.fixture(scope="module")
def evidence(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Evidence]:
    """A flash on an emulated board with two witnesses of our own (quorum 2) and a local
    timestamp authority; what a reviewer is handed of them (store.witness.evidence)."""
    from amdflash.stages.sim import create_board
    from amdflash.stages.sim.synth import PART_KEY, synthetic_ifwi
    from amdflash.store import keys, tlog
    from amdflash.store import witness as ws

    root = tmp_path_factory.mktemp("witnessed")
    program = _go_build(root)
    key_path = root / "host_key.pem"
    keys.load_or_create(key_path)
    log_vkey = tlog.vkey(ORIGIN, keys.public_bytes(keys.load_or_create(tlog.log_key_path(key_path))))
    servers = [WitnessServer(name=f"w{i}.test/outside", logs={ORIGIN: [log_vkey]}).start() for i in range(2)]
    authority = AuthorityServer(make_authority(root / "tsa")).start()
    try:
        config = root / "config.toml"
        config.write_text(f'log_origin = "{ORIGIN}"\nwitness_quorum = 2\n' + "".join(
            f'[[witnesses]]\nurl = "{s.url}"\nkey = "{s.vkey}"\n' for s in servers)
            + f'[[timestamp_authorities]]\nurl = "{authority.url}"\nroots = "{authority.roots}"\n')
        config.chmod(0o600)
        db = root / "audit.sqlite"
        image = root / "image.bin"
        image.write_bytes(synthetic_ifwi(21)[:3 * 4096])
        board = create_board(root / "board", transport="ideal", seed=1)
        r = command_line.run("--no-progress", "flash", image, "--yes", "--force", "--start-sector", 0,
                             "--sector-count", 3, "--expect-part", PART_KEY, "--board", f"sim:{board}",
                             env={"AMDFLASH_DB": str(db), "AMDFLASH_LOCK_DIR": str(root / "locks"),
                                  "AMDFLASH_HOST_KEY": str(key_path), "AMDFLASH_CONFIG": str(config)})
        assert r.code == 0 and "succeeded, witnessed by 2 of 2" in r.err, r.err
    finally:
        for s in servers:
            s.stop()
        authority.stop()
    head = ws.newest(str(db))
    assert head is not None
    out = root / "out"
    out.mkdir()
    witnesses = [ws.Witness(*ws.parse_vkey(s.vkey), "http://127.0.0.1") for s in servers]
    for name, data in ws.evidence(str(db), head.size, witnesses).items():
        (out / name).write_bytes(data)
    (out / "log.vkey").write_text(log_vkey + "\n")
    yield Evidence(out, program, authority.roots)


def go(ev: Evidence, checkpoint: Path, quorum: int = 2, vkeys: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(ev.program), str(ev.dir / "log.vkey"), str(vkeys or ev.dir / "witnesses.vkeys"),
                           str(quorum), str(checkpoint)], capture_output=True, text=True, timeout=60)


def test_go_s_note_code_verifies_the_log_signature_and_two_cosignatures(evidence: Evidence) -> None:
    r = go(evidence, evidence.dir / "checkpoint.cosigned")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith(f"tree head {ORIGIN}: ")
    assert "cosigned by w0.test/outside at " in r.stdout and "cosigned by w1.test/outside at " in r.stdout
    assert r.stdout.splitlines()[-1] == "OK: cosigned by 2 witnesses (quorum 2)"


def test_a_mutated_cosigned_head_or_a_missing_cosigner_fails(evidence: Evidence, tmp_path: Path) -> None:
    text = (evidence.dir / "checkpoint.cosigned").read_text()
    body, sigs = text.split("\n\n", 1)
    lines = sigs.splitlines()
    fields = body.split("\n")
    changed = tmp_path / "root changed"
    changed.write_text("\n".join([fields[0], fields[1], fields[2][::-1], *fields[3:]]) + "\n\n" + sigs)
    assert go(evidence, changed).returncode == 1
    cosig = lines[1].split(" ")
    raw = cosig[2]
    flipped = raw[:8] + ("A" if raw[8] != "A" else "B") + raw[9:]        # a byte of the cosignature's time
    bad = tmp_path / "time changed"
    bad.write_text(body + "\n\n" + "\n".join([lines[0], " ".join([*cosig[:2], flipped]), *lines[2:]]) + "\n")
    r = go(evidence, bad)
    assert r.returncode == 1 and "does not verify" in r.stderr, r.stderr
    one = tmp_path / "one cosignature"
    one.write_text(body + "\n\n" + "\n".join(lines[:2]) + "\n")
    r = go(evidence, one)
    assert r.returncode == 1 and "cosigned by 1 of the witnesses listed, 2 needed" in r.stderr, r.stderr
    assert go(evidence, one, quorum=1).returncode == 0


def test_openssl_ts_verify_accepts_the_token_and_refuses_a_mutated_one(evidence: Evidence, tmp_path: Path) -> None:
    def verify(data: Path, token: Path) -> subprocess.CompletedProcess:
        return subprocess.run(["openssl", "ts", "-verify", "-data", str(data), "-in", str(token), "-CAfile",
                               str(evidence.roots)], capture_output=True, text=True, timeout=60)

    data, token = evidence.dir / "checkpoint.timestamped", evidence.dir / "tsa0.tsr"
    assert data.read_text().startswith((evidence.dir / "checkpoint.cosigned").read_text().split("\n\n")[0])
    r = verify(data, token)
    assert r.returncode == 0 and "Verification: OK" in r.stdout, r.stdout + r.stderr
    raw = token.read_bytes()
    mutated = tmp_path / "mutated.tsr"
    mutated.write_bytes(raw[:-8] + bytes([raw[-8] ^ 1]) + raw[-7:])
    assert verify(data, mutated).returncode != 0
    other = tmp_path / "other data"
    other.write_bytes(data.read_bytes() + b" ")
    assert verify(other, token).returncode != 0
