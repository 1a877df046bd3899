"""A run's bundle (`audit bundle`) carries its receipt, the receipt's inclusion proof and the
log's verifier key (store/receipt_parts.py), and `audit verify --bundle` checks them offline:
a changed byte in any of them, or another run's receipt put in its place, is BROKEN even with
the manifest made again."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from amdflash.stages.sim import create_board
from amdflash.stages.sim.synth import PART_KEY, synthetic_ifwi
from tests.support import cli

PARTS = ("receipt.intoto.json", "receipt.tlog-proof", "log.vkey")


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """Two range flashes on emulated boards, and the first one's bundle."""
    root = tmp_path_factory.mktemp("receipt-bundle")
    env = {"AMDFLASH_DB": str(root / "audit.sqlite"), "AMDFLASH_LOCK_DIR": str(root / "locks"),
           "AMDFLASH_CONFIG": None, "AMDFLASH_ANCHOR": None}
    image = root / "image.bin"
    image.write_bytes(synthetic_ifwi(21)[:3 * 4096])
    runs = []
    for seed in (1, 2):
        board = create_board(root / f"board{seed}", transport="ideal", seed=seed)
        r = cli.run("-q", "flash", image, "--yes", "--force", "--start-sector", 0, "--sector-count", 3,
                    "--expect-part", PART_KEY, "--board", f"sim:{board}", "--json", env=env)
        assert r.code == 0, r.err
        runs.append(json.loads(r.out)["run_id"])
    r = cli.run("-q", "audit", "bundle", "--run", runs[0], "-o", root / "b", env=env)
    assert r.code == 0, r.err
    r = cli.run("-q", "audit", "receipt", "--run", runs[1], "-o", root / "other.json", env=env)
    assert r.code == 0, r.err
    return SimpleNamespace(root=root, env=env, runs=runs, bundle=root / "b", other=root / "other.json")


def _copy(made: SimpleNamespace, tmp_path: Path) -> Path:
    out = tmp_path / "copy"
    shutil.copytree(made.bundle, out)
    return out


def _remanifest(bundle: Path) -> None:
    names = sorted(n for n in os.listdir(bundle) if n != "MANIFEST.sha256")
    (bundle / "MANIFEST.sha256").write_text(
        "".join(f"{hashlib.sha256((bundle / n).read_bytes()).hexdigest()}  {n}\n" for n in names))


def verify(bundle: Path, env: dict) -> cli.Result:
    return cli.run("audit", "verify", "--bundle", bundle, env=env)


def test_a_bundle_carries_the_receipt_its_proof_and_the_log_key(made):
    for name in PARTS:
        assert (made.bundle / name).is_file(), name
    r = cli.run("-q", "audit", "receipt", "--run", made.runs[0], env=made.env)
    assert (made.bundle / "receipt.intoto.json").read_text() == r.out       # the receipt rebuilt: the same bytes
    r = verify(made.bundle, made.env)
    assert r.code == 0, r.out + r.err
    assert "receipt     receipt.intoto.json" in r.out and "the receipt is leaf" in r.out


@pytest.mark.parametrize("name,at", [("receipt.intoto.json", '"sig":"'), ("receipt.tlog-proof", "index "),
                                     ("receipt.tlog-proof", "\n\n"), ("log.vkey", "+")])
def test_a_changed_byte_in_a_receipt_part_is_broken(made, tmp_path, name, at):
    b = _copy(made, tmp_path)
    data = bytearray((b / name).read_bytes())
    i = data.index(at.encode()) + len(at) + 2
    data[i] = ord("7") if data[i] != ord("7") else ord("8")
    (b / name).write_bytes(bytes(data))
    _remanifest(b)
    r = verify(b, made.env)
    assert r.code == 1 and "BROKEN" in r.out and (name in r.out or "receipt" in r.out), r.out + r.err


def test_another_runs_receipt_in_its_place_is_broken(made, tmp_path):
    b = _copy(made, tmp_path)
    shutil.copy(made.other, b / "receipt.intoto.json")
    _remanifest(b)
    r = verify(b, made.env)
    assert r.code == 1 and "not the receipt of the bundle's run" in r.out, r.out + r.err


def test_a_receipt_part_removed_is_broken(made, tmp_path):
    b = _copy(made, tmp_path)
    (b / "receipt.tlog-proof").unlink()
    _remanifest(b)
    r = verify(b, made.env)
    assert r.code == 1 and "receipt.tlog-proof" in r.out, r.out + r.err


@pytest.mark.parametrize("name", PARTS)
def test_random_changes_to_a_receipt_part_are_broken_never_a_crash(made, tmp_path, name):
    import random

    rng = random.Random(45)
    original = (made.bundle / name).read_bytes()
    b = _copy(made, tmp_path)
    for _ in range(6):
        data = bytearray(original)
        i = rng.randrange(len(data))
        data[i] ^= 1 << rng.randrange(8)
        (b / name).write_bytes(bytes(data))
        _remanifest(b)
        r = verify(b, made.env)
        assert r.code == 1 and "BROKEN" in r.out and "Traceback" not in r.err, (i, r.out, r.err)


def test_the_receipt_s_proof_carries_the_cosigned_tree_head(tmp_path, monkeypatch):
    """With witnesses configured (two of our own, quorum 2), the receipt's tlog-proof is against
    the tree head they cosigned: its note carries their cosignatures beside the log's signature,
    and the proof and the bundle still verify."""
    from amdflash.store import tlog
    from tests.pipeline.cli.test_witnessed_run import ORIGIN, configure, log_vkey
    from tests.support.witness_server import WitnessServer

    servers = [WitnessServer(name=f"w{i}.test/witness", logs={ORIGIN: [log_vkey()]}).start() for i in range(2)]
    try:
        configure(tmp_path, monkeypatch, servers)
        env = {"AMDFLASH_DB": str(tmp_path / "audit.sqlite"), "AMDFLASH_LOCK_DIR": str(tmp_path / "locks")}
        image = tmp_path / "image.bin"
        image.write_bytes(synthetic_ifwi(21)[:3 * 4096])
        board = create_board(tmp_path / "board", transport="ideal", seed=3)
        r = cli.run("-q", "flash", image, "--yes", "--force", "--start-sector", 0, "--sector-count", 3,
                    "--expect-part", PART_KEY, "--board", f"sim:{board}", "--json", env=env)
        assert r.code == 0, r.err
        run = json.loads(r.out)["run_id"]
        proof = cli.run("-q", "audit", "log", "--proof", run, env=env)
        assert proof.code == 0, proof.err
        index, path, note, _ = tlog.parse_proof_file(proof.out)
        _, sigs = tlog.note_signatures(note)
        assert sorted(name for name, _, _ in sigs) == sorted([ORIGIN, "w0.test/witness", "w1.test/witness"])
        vkey = cli.run("-q", "audit", "log", "--vkey", env=env).out
        tlog.verify_note(note, vkey)
        receipt = cli.run("-q", "audit", "receipt", "--run", run, env=env).out.encode()
        _, size, root = tlog.parse_checkpoint(note)
        assert tlog.root_from_inclusion(index, size, tlog.leaf_hash(receipt), path) == root
        assert cli.run("-q", "audit", "bundle", "--run", run, "-o", tmp_path / "b", env=env).code == 0
        assert (tmp_path / "b" / "receipt.tlog-proof").read_text() == proof.out
        r = cli.run("audit", "verify", "--bundle", tmp_path / "b", env=env)
        assert r.code == 0, r.out + r.err
    finally:
        for s in servers:
            s.stop()
