"""Issue 45's done-when, end to end: a flash on an emulated board with two witnesses of our own
(quorum 2) and a local timestamp authority; `audit bundle` of the run; then, from the bundle
alone, the receipt's DSSE signature with `openssl pkeyutl -verify -rawin`, its inclusion proof
and the cosigned tree head with Go's golang.org/x/mod/sumdb/note and tlog (the programs under
tests/compliance), the token with `openssl ts -verify`, and `amdflash audit verify --bundle DIR
--policy FILE` (exit 0). Each also on a mutated copy, which must fail.

Skipped, saying why, where go, Go's x/mod or openssl is missing; not in CI, which installs them."""
from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.compliance import test_outside_checks as outside
from tests.compliance import test_witness_outside as witnessed
from tests.support import cli as command_line
from tests.support.tsa import AuthorityServer, make_authority
from tests.support.witness_server import WitnessServer

ORIGIN = "test.example/bundle-outside"

pytestmark = pytest.mark.skipif(outside._missing() is not None and os.environ.get("CI") != "true",
                                reason=outside._missing() or "")


def _manifest(directory: Path) -> None:
    """What a forger does after changing a file: the manifest written again to match."""
    import hashlib

    names = sorted(n.name for n in directory.iterdir() if n.name != "MANIFEST.sha256")
    (directory / "MANIFEST.sha256").write_text("".join(
        f"{hashlib.sha256((directory / n).read_bytes()).hexdigest()}  {n}\n" for n in names))


def _copy(bundle: Path, where: Path, name: str, change) -> Path:
    out = where / f"bundle-{name.replace('/', '_')}"
    shutil.copytree(bundle, out)
    change(out)
    _manifest(out)
    return out


@dataclass
class Flashed:
    bundle: Path
    log_vkey: str
    servers: list[WitnessServer]
    roots: Path
    said: str                       # what audit bundle said


def flash_and_bundle(tmp_path: Path, witness_down: bool = False, authority_down: bool = False) -> Flashed:
    """A three-sector flash on an emulated board, two witnesses (quorum 2; the second down if
    asked) and a local timestamp authority (down if asked) in the config file; the run's bundle."""
    from amdflash.stages.sim import create_board
    from amdflash.stages.sim.synth import PART_KEY, synthetic_ifwi
    from amdflash.store import keys, tlog

    key_path = tmp_path / "keys" / "host_key.pem"
    key_path.parent.mkdir()
    keys.load_or_create(key_path)
    log_vkey = tlog.vkey(ORIGIN, keys.public_bytes(keys.load_or_create(tlog.log_key_path(key_path))))
    servers = [WitnessServer(name=f"w{i}.test/bundle", logs={ORIGIN: [log_vkey]}).start() for i in range(2)]
    urls = [s.url for s in servers]
    if witness_down:
        servers[1].stop()
    authority = AuthorityServer(make_authority(tmp_path / "tsa")).start()
    tsa_url = authority.url
    if authority_down:
        authority.stop()
    env = {"AMDFLASH_DB": str(tmp_path / "audit.sqlite"), "AMDFLASH_LOCK_DIR": str(tmp_path / "locks"),
           "AMDFLASH_HOST_KEY": str(key_path), "AMDFLASH_CONFIG": str(tmp_path / "config.toml")}
    try:
        config = tmp_path / "config.toml"
        config.write_text(f'log_origin = "{ORIGIN}"\nwitness_quorum = 2\n' + "".join(
            f'[[witnesses]]\nurl = "{url}"\nkey = "{s.vkey}"\n' for s, url in zip(servers, urls))
            + f'[[timestamp_authorities]]\nurl = "{tsa_url}"\nroots = "{authority.roots}"\n')
        config.chmod(0o600)
        image = tmp_path / "image.bin"
        image.write_bytes(synthetic_ifwi(21)[:3 * 4096])
        board = create_board(tmp_path / "board", transport="ideal", seed=1)
        r = command_line.run("--no-progress", "flash", image, "--yes", "--force", "--start-sector", 0,
                             "--sector-count", 3, "--expect-part", PART_KEY, "--board", f"sim:{board}", "--json",
                             env=env)
        assert r.code == 0 and ("not yet witnessed" if witness_down else "succeeded, witnessed by 2 of 2") in r.err, \
            r.err
    finally:
        for s in servers:
            s.stop()
        authority.stop()
    run = json.loads(r.out)["run_id"]
    bundle = tmp_path / "bundle"
    r = command_line.run("-q", "audit", "bundle", "--run", run, "-o", bundle, env=env)
    assert r.code == 0, r.err
    return Flashed(bundle, log_vkey, servers, authority.roots, r.out)


def write_policy(f: Flashed, where: Path) -> Path:
    """What the reviewer trusts, kept apart from the bundle: the host key, the log key, the
    witnesses' keys and the authority's root."""
    where.mkdir()
    shutil.copy(f.bundle / "host.pem", where / "host.pem")
    shutil.copy(f.roots, where / "tsa-root.pem")
    policy = where / "policy.toml"
    policy.write_text(f'host_key = "host.pem"\nlog_key = "{f.log_vkey}"\nquorum = 2\ntsa_roots = ["tsa-root.pem"]\n'
                      "witnesses = [\n" + "".join(f'  {{name = "{s.name}", key = "{s.vkey}"}},\n'
                                                  for s in f.servers) + "]\n")
    return policy


@pytest.mark.slow      # several whole commands, five seconds or more: in CI's slow set
def test_a_flash_s_bundle_is_checked_without_amdflash_and_against_a_policy(tmp_path: Path) -> None:
    verifier, program = outside._go_build(tmp_path), witnessed._go_build(tmp_path)
    f = flash_and_bundle(tmp_path)
    bundle, servers = f.bundle, f.servers
    assert "  witnesses: checkpoint.cosigned, the receipt's tree head cosigned by 2 of the 2 witnesses configured; 1 " \
           "timestamp token(s)\n" in f.said, f.said
    names = {p.name for p in bundle.iterdir()}
    assert {"receipt.intoto.json", "receipt.tlog-proof", "log.vkey", "host.pem", "checkpoint.cosigned",
            "witnesses.vkeys", "checkpoint.timestamped", "tsa0.tsr"} <= names, names
    # The proof is against the cosigned head: the same note, its two cosignatures with it.
    proof = (bundle / "receipt.tlog-proof").read_text()
    assert proof.split("\n\n", 1)[1] == (bundle / "checkpoint.cosigned").read_text()
    assert (bundle / "witnesses.vkeys").read_text() == "".join(s.vkey + "\n" for s in servers)
    policy = write_policy(f, tmp_path / "trusted")
    trusted = policy.parent
    check_receipt_with_openssl(bundle, trusted / "host.pem", tmp_path)
    check_proof_and_cosignatures_with_go(bundle, verifier, program, tmp_path)
    check_token_with_openssl(bundle, trusted / "tsa-root.pem", tmp_path)
    check_audit_verify_policy(bundle, policy, tmp_path)


def test_the_bundle_of_a_run_not_yet_witnessed_fails_a_policy_that_asks_for_witnesses_and_time(
        tmp_path: Path) -> None:
    f = flash_and_bundle(tmp_path, witness_down=True)
    assert "  witnesses: checkpoint.cosigned, the receipt's tree head cosigned by 1 of the 2 witnesses configured; 0 " \
           "timestamp token(s) ('amdflash audit witness' asks the witnesses again; then a new bundle)" in f.said, f.said
    names = {p.name for p in f.bundle.iterdir()}
    assert "receipt.intoto.json" in names and not names & {"checkpoint.timestamped", "tsa0.tsr"}
    policy = write_policy(f, tmp_path / "trusted")
    r = command_line.run("audit", "verify", "--bundle", f.bundle, "--policy", policy)
    assert r.code == 1, r.out + r.err
    assert "2 of 5 checks fail: witnesses: cosigned by 1 of the policy's 2 witnesses (w0.test/bundle), 2 needed; " \
           "time: no checkpoint.timestamped in the bundle" in r.out, r.out
    # The same bundle holds for a reviewer who asks for neither.
    policy.write_text(policy.read_text().replace("quorum = 2", "quorum = 0").replace('["tsa-root.pem"]', "[]")
                      .split("witnesses = [")[0] + "witnesses = []\n")
    r = command_line.run("audit", "verify", "--bundle", f.bundle, "--policy", policy)
    assert r.code == 0 and "witnesses  not required by the policy (quorum = 0)" in r.out, r.out


def check_receipt_with_openssl(bundle: Path, pem: Path, tmp: Path) -> None:
    pae, sig = outside._pae_and_sig((bundle / "receipt.intoto.json").read_bytes(), tmp / "receipt")
    r = outside.openssl_verify(pem, sig, pae)
    assert r.returncode == 0 and "Signature Verified Successfully" in r.stdout, r.stdout + r.stderr
    sig.write_bytes(bytes([sig.read_bytes()[0] ^ 1]) + sig.read_bytes()[1:])
    assert outside.openssl_verify(pem, sig, pae).returncode != 0


def check_proof_and_cosignatures_with_go(bundle: Path, verifier: Path, program: Path, tmp: Path) -> None:
    def run(binary: Path, *args: object) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True, timeout=60)

    r = run(verifier, "inclusion", bundle / "log.vkey", bundle / "receipt.tlog-proof", bundle / "receipt.intoto.json")
    assert r.returncode == 0 and "included: leaf" in r.stdout, r.stderr
    other = tmp / "other.intoto.json"
    other.write_bytes((bundle / "receipt.intoto.json").read_bytes().replace(b'"sig":"', b'"sig":"A', 1))
    assert run(verifier, "inclusion", bundle / "log.vkey", bundle / "receipt.tlog-proof", other).returncode == 1
    r = run(program, bundle / "log.vkey", bundle / "witnesses.vkeys", 2, bundle / "checkpoint.cosigned")
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == "OK: cosigned by 2 witnesses (quorum 2)", r.stderr
    body, sigs = (bundle / "checkpoint.cosigned").read_text().split("\n\n", 1)
    one = tmp / "one cosignature"
    one.write_text(body + "\n\n" + "\n".join(sigs.splitlines()[:2]) + "\n")
    r = run(program, bundle / "log.vkey", bundle / "witnesses.vkeys", 2, one)
    assert r.returncode == 1 and "cosigned by 1 of the witnesses listed, 2 needed" in r.stderr, r.stderr


def check_token_with_openssl(bundle: Path, roots: Path, tmp: Path) -> None:
    def verify(data: Path, token: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["openssl", "ts", "-verify", "-data", str(data), "-in", str(token), "-CAfile",
                               str(roots)], capture_output=True, text=True, timeout=60)

    r = verify(bundle / "checkpoint.timestamped", bundle / "tsa0.tsr")
    assert r.returncode == 0 and "Verification: OK" in r.stdout, r.stdout + r.stderr
    other = tmp / "other.timestamped"
    other.write_bytes((bundle / "checkpoint.timestamped").read_bytes() + b" ")
    assert verify(other, bundle / "tsa0.tsr").returncode != 0


def check_audit_verify_policy(bundle: Path, policy: Path, tmp: Path) -> None:
    def verify(directory: Path, with_policy: Path = policy) -> command_line.Result:
        return command_line.run("audit", "verify", "--bundle", directory, "--policy", with_policy)

    r = verify(bundle)
    assert r.code == 0, r.out + r.err
    assert "receipt, inclusion, log, witnesses and time all hold" in r.out, r.out
    assert "cosigned by 2 of the policy's 2 witnesses, quorum 2" in r.out and "chaining to the policy's tsa_roots" \
        in r.out, r.out

    def drop_cosignature(d: Path) -> None:     # the forger keeps one witness's line, in both files
        text = (d / "checkpoint.cosigned").read_text()
        (d / "checkpoint.cosigned").write_text(text.rsplit("\u2014 ", 1)[0])
        proof = (d / "receipt.tlog-proof").read_text()
        (d / "receipt.tlog-proof").write_text(proof.rsplit("\u2014 ", 1)[0])

    def flip_token(d: Path) -> None:
        raw = (d / "tsa0.tsr").read_bytes()
        (d / "tsa0.tsr").write_bytes(raw[:-8] + bytes([raw[-8] ^ 1]) + raw[-7:])

    def flip_receipt(d: Path) -> None:
        env = json.loads((d / "receipt.intoto.json").read_bytes())
        sig = bytearray(base64.b64decode(env["signatures"][0]["sig"]))
        sig[0] ^= 1
        env["signatures"][0]["sig"] = base64.b64encode(bytes(sig)).decode()
        (d / "receipt.intoto.json").write_text(json.dumps(env))

    for name, change, says in (("cosignature", drop_cosignature, "witnesses: cosigned by 1 of the policy's 2 "
                                                                  "witnesses"),
                               ("token", flip_token, "time: tsa0.tsr: "),
                               ("receipt", flip_receipt, "receipt.intoto.json: its signature is not by the policy's "
                                                         "host key")):
        r = verify(_copy(bundle, tmp, name, change))
        assert r.code == 1 and says in r.out, (name, r.out, r.err)

    # The same, as fields: each claim held or not.
    r = command_line.run("audit", "verify", "--bundle", tmp / "bundle-cosignature", "--policy", policy, "--format",
                         "json")
    said = json.loads(r.out)
    assert r.code == 1 and said["ok"] is False and said["policy"]["checked"] is True, r.out
    assert {c: v["holds"] for c, v in said["policy"]["claims"].items()} == {
        "receipt": True, "inclusion": True, "log": True, "witnesses": False, "time": True}, said
    assert said["policy"]["claims"]["witnesses"]["words"].startswith("cosigned by 1 of the policy's 2 witnesses")

    def junk(name: str, data: bytes):
        return lambda d: (d / name).write_bytes(data)

    # Files of the bundle that are not what they say (the manifest written again): BROKEN, named, never a crash.
    for name, data, says in (("checkpoint.cosigned", b"\x1b[2Jnot a note\n", "checkpoint.cosigned: not a signed note"),
                             ("witnesses.vkeys", b"w+00+AA\n", "witnesses.vkeys line 1 is not a witness's verifier"),
                             ("tsa0.tsr", b"0\x84\xff\xff\xff\xff", "tsa0.tsr is not a token over checkpoint."),
                             ("checkpoint.timestamped", b"other\n1\n\n", "checkpoint.timestamped: not a ")):
        for with_policy in (True, False):
            d = _copy(bundle, tmp, f"{name}-{with_policy}", junk(name, data))
            r = verify(d) if with_policy else command_line.run("audit", "verify", "--bundle", d)
            assert r.code == 1 and says in r.out, (name, r.out, r.err)
    # A policy that trusts another log key, or needs a witness the bundle has no cosignature of.
    other = policy.with_name("other-log.toml")
    from amdflash.store import tlog
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    stranger = tlog.vkey(ORIGIN, Ed25519PrivateKey.generate().public_key().public_bytes_raw())
    other.write_text(policy.read_text().replace(policy.read_text().split('log_key = "')[1].split('"')[0], stranger))
    r = verify(bundle, other)
    assert r.code == 1 and "1 of 5 checks fail: log: the proof's tree head is not signed by the policy's log key" \
        in r.out, r.out
    # A bad policy file: exit 2, one line.
    bad = policy.with_name("bad.toml")
    bad.write_text(policy.read_text().replace("quorum = 2", "quorum = 3"))
    r = verify(bundle, bad)
    assert r.code == 2 and r.err.strip().startswith("error: policy ") and "quorum = 3: must be 1..2" in r.err, r.err


def test_a_run_witnessed_while_the_timestamp_authority_was_down_is_bundled_without_time(tmp_path: Path) -> None:
    """The head's bytes to date are fixed before the authority is asked: with no token they are
    left out of the bundle, which is made and verifies; a policy asking for time says so."""
    f = flash_and_bundle(tmp_path, authority_down=True)
    assert "cosigned by 2 of the 2 witnesses configured; 0 timestamp token(s)" in f.said, f.said
    assert not {p.name for p in f.bundle.iterdir()} & {"checkpoint.timestamped", "tsa0.tsr"}
    r = command_line.run("audit", "verify", "--bundle", f.bundle, "--policy", write_policy(f, tmp_path / "trusted"))
    assert r.code == 1, r.out
    assert r.out.strip().endswith("1 of 5 checks fail: time: no checkpoint.timestamped in the bundle"), r.out


def test_an_earlier_run_s_bundle_takes_the_later_tree_head_the_quorum_cosigned(tmp_path: Path) -> None:
    """Run A ends while a witness is down: its tree head gathers one cosignature and is never
    asked again (witnesses are asked for the newest head). Run B's head, which holds A's receipt
    too, is cosigned by both: A's bundle proves A's receipt under B's head, and a policy of two
    witnesses holds."""
    from amdflash.stages.sim import create_board
    from amdflash.stages.sim.synth import PART_KEY, synthetic_ifwi
    from amdflash.store import keys, tlog

    key_path = tmp_path / "keys" / "host_key.pem"
    key_path.parent.mkdir()
    keys.load_or_create(key_path)
    log_vkey = tlog.vkey(ORIGIN, keys.public_bytes(keys.load_or_create(tlog.log_key_path(key_path))))
    servers = [WitnessServer(name=f"w{i}.test/bundle", logs={ORIGIN: [log_vkey]}) for i in range(2)]
    config = tmp_path / "config.toml"
    env = {"AMDFLASH_DB": str(tmp_path / "audit.sqlite"), "AMDFLASH_LOCK_DIR": str(tmp_path / "locks"),
           "AMDFLASH_HOST_KEY": str(key_path), "AMDFLASH_CONFIG": str(config)}
    image = tmp_path / "image.bin"
    image.write_bytes(synthetic_ifwi(21)[:3 * 4096])
    board = create_board(tmp_path / "board", transport="ideal", seed=1)

    def flash(urls: list[str]) -> tuple[str, str]:
        config.write_text(f'log_origin = "{ORIGIN}"\nwitness_quorum = 2\n' + "".join(
            f'[[witnesses]]\nurl = "{url}"\nkey = "{s.vkey}"\n' for s, url in zip(servers, urls)))
        config.chmod(0o600)
        r = command_line.run("--no-progress", "flash", image, "--yes", "--force", "--start-sector", 0,
                             "--sector-count", 3, "--expect-part", PART_KEY, "--board", f"sim:{board}", "--json",
                             env=env)
        assert r.code == 0, r.err
        return json.loads(r.out)["run_id"], r.err

    up = servers[0].start()
    try:
        first, said = flash([up.url, "http://127.0.0.1:9"])
        assert "not yet witnessed (1 of 2 cosigned" in said, said
        back = servers[1].start()
        try:
            assert "witnessed by 2 of 2" in flash([up.url, back.url])[1]
        finally:
            back.stop()
    finally:
        up.stop()
    bundle = tmp_path / "bundle"
    r = command_line.run("-q", "audit", "bundle", "--run", first, "-o", bundle, env=env)
    assert r.code == 0 and "cosigned by 2 of the 2 witnesses configured" in r.out, r.out + r.err
    trusted = tmp_path / "trusted"
    trusted.mkdir()
    shutil.copy(bundle / "host.pem", trusted / "host.pem")
    policy = trusted / "policy.toml"
    policy.write_text(f'host_key = "host.pem"\nlog_key = "{log_vkey}"\nquorum = 2\ntsa_roots = []\nwitnesses = ['
                      + ", ".join(f'{{key = "{s.vkey}"}}' for s in servers) + "]\n")
    r = command_line.run("audit", "verify", "--bundle", bundle, "--policy", policy)
    assert r.code == 0, r.out + r.err
