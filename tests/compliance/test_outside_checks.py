"""A run's receipt, its inclusion proof and the log's tree heads, checked without amdflash:
openssl for the receipt's DSSE signature (the host key as PEM), and a Go program over Go's own
golang.org/x/mod/sumdb/note and sumdb/tlog (tests/compliance/verifier, built here from Debian's
golang-go and golang-golang-x-mod-dev, offline) for the tree heads and the proofs. Each check
also runs on a mutated copy, which must fail. docs/compliance.md gives a reviewer these very
commands.

Skipped, saying why, where go or Go's x/mod or openssl is missing; CI installs them (.ci/run) and runs it.
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import cli as command_line

HERE = Path(__file__).resolve().parent
GOCODE = Path("/usr/share/gocode")
XMOD = GOCODE / "src/golang.org/x/mod/sumdb"


def _missing() -> str | None:
    if shutil.which("go") is None:
        return "go is not installed (Debian: apt-get install golang-go golang-golang-x-mod-dev; CI installs them)"
    if not (XMOD / "note").is_dir() or not (XMOD / "tlog").is_dir():
        return f"Go's golang.org/x/mod is not at {XMOD} (Debian: apt-get install golang-golang-x-mod-dev)"
    if shutil.which("openssl") is None:
        return "openssl is not installed"
    return None


# Skipped where a tool is missing, except in CI, which installs them (.ci/run): there it must run.
pytestmark = pytest.mark.skipif(_missing() is not None and os.environ.get("CI") != "true", reason=_missing() or "")


@dataclass
class Evidence:
    dir: Path
    verifier: Path
    run: str
    old_size: int


def _go_build(out: Path) -> Path:
    """The verifier, built as Debian's packaged Go libraries are used offline: GOPATH mode over
    /usr/share/gocode, no module download, a build cache of its own."""
    env = {**os.environ, "GO111MODULE": "off", "GOPATH": str(GOCODE), "GOFLAGS": "", "GOPROXY": "off",
           "GOCACHE": str(out / "gocache"), "CGO_ENABLED": "0"}
    binary = out / "verifier"
    r = subprocess.run(["go", "build", "-o", str(binary), str(HERE / "verifier" / "main.go")], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return binary


def make_evidence(root: Path) -> Evidence:
    """Two range flashes on emulated boards; after the first, the log's tree head; after the
    second, its bundle's receipt, receipt proof, log verifier key and host key as PEM, and a
    consistency proof from the first tree head."""
    from amdflash.stages.sim import create_board
    from amdflash.stages.sim.synth import PART_KEY, synthetic_ifwi

    verifier = _go_build(root)
    db = root / "audit.sqlite"
    env = {"AMDFLASH_DB": str(db), "AMDFLASH_LOCK_DIR": str(root / "locks")}
    image = root / "image.bin"
    image.write_bytes(synthetic_ifwi(21)[:3 * 4096])

    def amdflash(*args: object) -> str:
        r = command_line.run("-q", *args, env=env)
        assert r.code == 0, r.err
        return r.out

    def flash(seed: int) -> str:
        board = create_board(root / f"board{seed}", transport="ideal", seed=seed)
        out = amdflash("flash", image, "--yes", "--force", "--start-sector", 0, "--sector-count", 3,
                       "--expect-part", PART_KEY, "--board", f"sim:{board}", "--json")
        return json.loads(out)["run_id"]

    flash(1)
    (root / "old.note").write_text(amdflash("audit", "log"))
    old_size = int((root / "old.note").read_text().split("\n")[1])
    run = flash(2)
    out = root / "out"
    out.mkdir()
    # What a reviewer is handed: the run's bundle (audit bundle), and a consistency proof.
    amdflash("audit", "bundle", "--run", run, "-o", root / "bundle")
    for name in ("receipt.intoto.json", "receipt.tlog-proof", "log.vkey", "host.pem"):
        shutil.copy(root / "bundle" / name, out / name)
    amdflash("audit", "log", "--consistency-from", old_size, "-o", out / "consistency")
    # The bundle's are what the commands give one by one.
    assert amdflash("audit", "receipt", "--run", run) == (out / "receipt.intoto.json").read_text()
    assert amdflash("audit", "key", "--pem") == (out / "host.pem").read_text()
    shutil.copy(root / "old.note", out / "old.note")
    return Evidence(out, verifier, run, old_size)


def go(ev: Evidence, *args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(ev.verifier), *map(str, args)], capture_output=True, text=True, timeout=60)


def openssl_verify(pem: Path, sig: Path, message: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["openssl", "pkeyutl", "-verify", "-rawin", "-pubin", "-inkey", str(pem),
                           "-sigfile", str(sig), "-in", str(message)], capture_output=True, text=True, timeout=60)


def mutated(ev: Evidence, name: str, change: Callable[[bytes], bytes]) -> Path:
    path = ev.dir.parent / f"mutated-{name}"
    path.write_bytes(change((ev.dir / name).read_bytes()))
    return path


def _pae_and_sig(envelope: bytes, where: Path) -> tuple[Path, Path]:
    """DSSE's PAE of the envelope's payload and its signature, written with Python's standard
    library only (what a reviewer's few lines do): "DSSEv1" SP len(type) SP type SP len(body) SP body."""
    env = json.loads(envelope)
    body = base64.b64decode(env["payload"])
    kind = env["payloadType"].encode()
    pae, sig = where.with_suffix(".pae"), where.with_suffix(".sig")
    pae.write_bytes(b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(body), body))
    sig.write_bytes(base64.b64decode(env["signatures"][0]["sig"]))
    return pae, sig


def check_openssl_verifies_the_receipts_dsse_signature(evidence: Evidence) -> None:
    ev = evidence
    pae, sig = _pae_and_sig((ev.dir / "receipt.intoto.json").read_bytes(), ev.dir.parent / "receipt")
    r = openssl_verify(ev.dir / "host.pem", sig, pae)
    assert r.returncode == 0 and "Signature Verified Successfully" in r.stdout, r.stdout + r.stderr
    # The Go program writes the same PAE.
    assert go(ev, "pae", ev.dir / "receipt.intoto.json", ev.dir.parent / "go.pae", ev.dir.parent / "go.sig"
              ).returncode == 0
    assert (ev.dir.parent / "go.pae").read_bytes() == pae.read_bytes()


def check_openssl_refuses_a_mutated_receipt_or_signature(evidence: Evidence) -> None:
    ev = evidence
    envelope = json.loads((ev.dir / "receipt.intoto.json").read_bytes())
    body = json.loads(base64.b64decode(envelope["payload"]))
    body["predicate"]["run"]["result"] = "succeeded" if body["predicate"]["run"]["result"] != "succeeded" else "x"
    envelope["payload"] = base64.b64encode(json.dumps(body).encode()).decode()
    pae, sig = _pae_and_sig(json.dumps(envelope).encode(), ev.dir.parent / "forged")
    r = openssl_verify(ev.dir / "host.pem", sig, pae)
    assert r.returncode != 0 and "Signature Verification Failure" in r.stdout + r.stderr
    pae, sig = _pae_and_sig((ev.dir / "receipt.intoto.json").read_bytes(), ev.dir.parent / "flipped")
    sig.write_bytes(bytes([sig.read_bytes()[0] ^ 1]) + sig.read_bytes()[1:])
    assert openssl_verify(ev.dir / "host.pem", sig, pae).returncode != 0


def check_go_verifies_the_tree_head_note(evidence: Evidence) -> None:
    ev = evidence
    r = go(ev, "note", ev.dir / "log.vkey", ev.dir / "old.note")
    assert r.returncode == 0 and f"tree size {ev.old_size} " in r.stdout, r.stderr
    forged = mutated(ev, "old.note", lambda b: b.replace(b"\n%d\n" % ev.old_size, b"\n%d\n" % (ev.old_size + 1)))
    r = go(ev, "note", ev.dir / "log.vkey", forged)
    assert r.returncode == 1 and "verifier:" in r.stderr
    other = mutated(ev, "log.vkey", lambda b: b[:-6] + (b"A" if b[-6:-5] != b"A" else b"B") + b[-5:])
    assert go(ev, "note", other, ev.dir / "old.note").returncode == 1


def check_go_verifies_the_receipts_inclusion_proof(evidence: Evidence) -> None:
    ev = evidence
    proof = (ev.dir / "receipt.tlog-proof").read_text()
    assert proof.startswith("c2sp.org/tlog-proof@v1\nindex ")
    r = go(ev, "inclusion", ev.dir / "log.vkey", ev.dir / "receipt.tlog-proof", ev.dir / "receipt.intoto.json")
    assert r.returncode == 0 and "included: leaf" in r.stdout, r.stderr
    # Another receipt's bytes, a changed proof hash, and a changed index each fail.
    receipt = mutated(ev, "receipt.intoto.json", lambda b: b.replace(b'"sig":"', b'"sig":"A', 1))
    assert go(ev, "inclusion", ev.dir / "log.vkey", ev.dir / "receipt.tlog-proof", receipt).returncode == 1
    lines = proof.split("\n")
    lines[2] = base64.b64encode(bytes(32)).decode()
    bad = ev.dir.parent / "bad.tlog-proof"
    bad.write_text("\n".join(lines))
    assert go(ev, "inclusion", ev.dir / "log.vkey", bad, ev.dir / "receipt.intoto.json").returncode == 1
    index = int(lines[1].split()[1])
    moved = mutated(ev, "receipt.tlog-proof", lambda b: b.replace(b"index %d\n" % index, b"index %d\n" % (index - 1)))
    assert go(ev, "inclusion", ev.dir / "log.vkey", moved, ev.dir / "receipt.intoto.json").returncode == 1


def check_go_verifies_the_consistency_proof(evidence: Evidence) -> None:
    ev = evidence
    r = go(ev, "consistency", ev.dir / "log.vkey", ev.dir / "old.note", ev.dir / "consistency")
    assert r.returncode == 0 and f"tree {ev.old_size} is a prefix" in r.stdout, r.stderr
    text = (ev.dir / "consistency").read_text()
    first = text.split("\n")[1]
    forged = mutated(ev, "consistency", lambda b: b.replace(first.encode(), base64.b64encode(bytes(32)), 1))
    assert go(ev, "consistency", ev.dir / "log.vkey", ev.dir / "old.note", forged).returncode == 1
    # A tree head of the old size with another root, signed by the log key itself: a fork. Its
    # signature holds; no consistency proof joins it to the newer tree.
    origin, size = (ev.dir / "old.note").read_text().split("\n")[:2]
    fork = ev.dir.parent / "fork.note"
    fork.write_text(_signed_note(f"{origin}\n{size}\n{base64.b64encode(bytes(32)).decode()}\n", origin))
    assert go(ev, "note", ev.dir / "log.vkey", fork).returncode == 0
    r = go(ev, "consistency", ev.dir / "log.vkey", fork, ev.dir / "consistency")
    assert r.returncode == 1 and "invalid transparency proof" in r.stderr, r.stderr


def _signed_note(body: str, name: str) -> str:
    """`body` signed as a C2SP note by the log key (log_key.pem beside the tests' host key), by
    the spec's rules written out here."""
    import hashlib

    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    key = load_pem_private_key((Path(os.environ["AMDFLASH_HOST_KEY"]).parent / "log_key.pem").read_bytes(), None)
    public = key.public_key().public_bytes_raw()
    hint = hashlib.sha256(name.encode() + b"\n\x01" + public).digest()[:4]
    sig = base64.b64encode(hint + key.sign(body.encode())).decode()
    return f"{body}\n\u2014 {name} {sig}\n"


def test_receipt_proof_and_tree_heads_are_checked_without_amdflash(tmp_path):
    """One test, so the two flashes and the Go build are made once whatever pytest-xdist does."""
    evidence = make_evidence(tmp_path)
    check_openssl_verifies_the_receipts_dsse_signature(evidence)
    check_openssl_refuses_a_mutated_receipt_or_signature(evidence)
    check_go_verifies_the_tree_head_note(evidence)
    check_go_verifies_the_receipts_inclusion_proof(evidence)
    check_go_verifies_the_consistency_proof(evidence)
