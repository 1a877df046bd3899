"""A reviewer's policy file (store/policy.py) for `audit verify --bundle DIR --policy FILE`: what
it accepts (files relative to it, keys and roots inline), and every policy it cannot use refused
in one line, exit 2, before the bundle is read (the bundle here does not even exist)."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from amdflash.store import keys, policy, tlog
from tests.support.cli import run as amdflash
from tests.support.tsa import make_authority
from tests.support.witness_server import WitnessServer

# The authority's root is made with openssl: skipped without it, except in CI, which installs it.
pytestmark = pytest.mark.skipif(shutil.which("openssl") is None and os.environ.get("CI") != "true",
                                reason="openssl is not installed")


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    where = tmp_path_factory.mktemp("policy")
    host = Ed25519PrivateKey.generate()
    (where / "host.pub").write_text(keys.public_line(keys.public_bytes(host)) + "\n")
    make_authority(where / "tsa")
    return {"dir": str(where), "host": keys.public_line(keys.public_bytes(host)),
            "log": tlog.vkey("example.org/log", keys.public_bytes(Ed25519PrivateKey.generate())),
            "w1": WitnessServer(name="w1.example/w").vkey, "w2": WitnessServer(name="w2.example/w").vkey,
            "root": (where / "tsa" / "ca.crt").read_text()}


def write(parts: dict[str, str], text: str) -> Path:
    path = Path(parts["dir"]) / "policy.toml"
    path.write_text(text)
    return path


def good(parts: dict[str, str]) -> str:
    return (f'host_key = "host.pub"\nlog_key = "{parts["log"]}"\nquorum = 2\ntsa_roots = ["tsa/ca.crt"]\n'
            f'witnesses = [{{name = "w1.example/w", key = "{parts["w1"]}"}}, {{key = "{parts["w2"]}"}}]\n')


def test_a_policy_with_files_relative_to_it_or_everything_inline_loads(parts: dict[str, str]) -> None:
    p = policy.load(write(parts, good(parts)))
    assert keys.public_line(p.host_key) == parts["host"] and p.log_key == parts["log"] and p.quorum == 2
    assert [w.vkey for w in p.witnesses] == [parts["w1"], parts["w2"]] and len(p.tsa_roots) == 1
    inline = (f'host_key = "{parts["host"]}"\nlog_key = "{parts["log"]}"\nquorum = 0\nwitnesses = []\n'
              f'tsa_roots = ["""{parts["root"]}"""]\n')
    p = policy.load(write(parts, inline))
    assert keys.public_line(p.host_key) == parts["host"] and p.quorum == 0 and len(p.tsa_roots) == 1


@pytest.mark.parametrize("change, says", [
    (lambda t: t.replace("quorum = 2\n", ""), "no quorum (every one of host_key, log_key, quorum, witnesses, "
                                              "tsa_roots must be set)"),
    (lambda t: t + "quorom = 1\n", "unknown setting 'quorom'"),
    (lambda t: t.replace("quorum = 2", "quorum = 3"), "quorum = 3: must be 1..2 (the witnesses named)"),
    (lambda t: t.replace("quorum = 2", "quorum = 0"), "quorum = 0: must be 1..2"),
    (lambda t: t.replace('name = "w1.example/w"', 'name = "w9.example/w"'), "witnesses[0]: name 'w9.example/w' "
                                                                            "is not its key's ('w1.example/w')"),
    (lambda t: t.replace("+", "-", 1), "log_key: not a note verifier key"),
    (lambda t: t.replace('"host.pub"', '"gone.pub"'), "host_key: cannot read "),
    (lambda t: t.replace('["tsa/ca.crt"]', '["host.pub"]'), "tsa_roots[0]: not PEM certificates"),
    (lambda t: t.replace("witnesses = [", "witnesses = [{key = \"w1.example/w+00000000+AAAA\"}, "),
     "witnesses[0]: witness key"),
    (lambda t: t.replace("quorum = 2", "quorum = "), "is not TOML"),
])
def test_a_policy_that_cannot_be_used_is_refused_before_the_bundle_is_read(parts: dict[str, str], tmp_path: Path,
                                                                          change, says) -> None:
    path = write(parts, change(good(parts)))
    r = amdflash("audit", "verify", "--bundle", str(tmp_path / "no bundle"), "--policy", str(path))
    assert r.code == 2 and len(r.err_lines) == 1 and r.err_lines[0].startswith(f"error: policy {path}"), r.err
    assert says in r.err, r.err


def test_policy_goes_with_a_bundle_and_not_with_key(parts: dict[str, str], tmp_path: Path) -> None:
    path = write(parts, good(parts))
    r = amdflash("audit", "verify", "--policy", str(path))
    assert r.code == 2 and "give the bundle with --bundle DIR" in r.err, r.err
    r = amdflash("audit", "verify", "--bundle", str(tmp_path), "--policy", str(path), "--key",
                 str(Path(parts["dir"]) / "host.pub"))
    assert r.code == 2 and r.err.strip() == "error: --policy names the host key: not with --key", r.err
