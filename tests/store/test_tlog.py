"""The per-host transparency log (store.tlog, store.trail_log): RFC 6962 hashes and proofs,
checked against the RFC's own definitions written out here; C2SP signed-note tree heads; the
refusal to sign a smaller or different tree; and, through the CLI, the log a flash leaves,
surviving `audit archive`, refusing a trail rolled back under it."""
from __future__ import annotations

import base64
import hashlib
import json
import shutil
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from amdflash.store import tlog
from tests.pipeline.engine.conftest import cli, db  # noqa: F401 - fixtures: in-process CLI with its own database

ORIGIN = "amdflash.local/test/0000"


def _leaf(d: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + d).digest()


def _node(a: bytes, b: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + a + b).digest()


def mth(d: list[bytes]) -> bytes:
    """RFC 6962 §2.1: MTH, straight from the definition."""
    if not d:
        return hashlib.sha256(b"").digest()
    if len(d) == 1:
        return _leaf(d[0])
    k = 1
    while k * 2 < len(d):
        k *= 2
    return _node(mth(d[:k]), mth(d[k:]))


def check_inclusion(index: int, size: int, leaf: bytes, path: list[bytes], root: bytes) -> bool:
    """RFC 9162 §2.1.3.2."""
    if index >= size:
        return False
    fn, sn, r = index, size - 1, leaf
    for p in path:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = _node(p, r)
            while not fn & 1 and fn:
                fn, sn = fn >> 1, sn >> 1
        else:
            r = _node(r, p)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and r == root


def check_consistency(m: int, n: int, old: bytes, new: bytes, path: list[bytes]) -> bool:
    """RFC 9162 §2.1.4.2."""
    if m == n:
        return not path and old == new
    if not path:
        return False
    if m & (m - 1) == 0:
        path = [old, *path]
    fn, sn = m - 1, n - 1
    while fn & 1:
        fn, sn = fn >> 1, sn >> 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr, sr = _node(c, fr), _node(c, sr)
            while not fn & 1 and fn:
                fn, sn = fn >> 1, sn >> 1
        else:
            sr = _node(sr, c)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and fr == old and sr == new


@pytest.fixture
def grown(tmp_path: Path) -> tuple[tlog.Log, list[bytes]]:
    """A log of 37 leaves appended in uneven batches (1, 2, 5, then one by one)."""
    log = tlog.Log(tmp_path / "x.tlog")
    data = [b"leaf %d" % i for i in range(37)]
    with log.locked():
        log.append([(data[0], {})])
        log.append([(d, {}) for d in data[1:3]])
        log.append([(d, {}) for d in data[3:8]])
        for d in data[8:]:
            log.append([(d, {"n": 1})])
    return log, data


def test_tree_hash_is_rfc6962_mth_at_every_size(grown):
    log, data = grown
    assert log.size() == 37
    for n in range(38):
        assert log.tree_hash(n) == mth(data[:n]), n


def test_stored_hashes_grow_as_the_layout_says(grown):
    log, _ = grown
    # Every hash that is final is written once: 37 leaves and the roots of their complete subtrees.
    assert log.hashes.stat().st_size == tlog.stored_index(0, 37) * 32
    assert tlog.stored_index(0, 37) == 37 + 18 + 9 + 4 + 2 + 1


def test_inclusion_proofs_verify_by_rfc9162(grown):
    log, data = grown
    for n in range(1, 38):
        root = mth(data[:n])
        for i in range(n):
            path = log.inclusion(i, n)
            assert check_inclusion(i, n, _leaf(data[i]), path, root), (i, n)
            assert not check_inclusion(i, n, _leaf(data[i] + b"x"), path, root)


def test_consistency_proofs_verify_by_rfc9162(grown):
    log, data = grown
    for n in range(1, 38):
        for m in range(1, n + 1):
            path = log.consistency(m, n)
            assert check_consistency(m, n, mth(data[:m]), mth(data[:n]), path), (m, n)
            if m < n:
                assert not check_consistency(m, n, mth(data[:m - 1] + [b"forged"]), mth(data[:n]), path)


def test_tree_head_is_a_c2sp_signed_note(grown):
    log, data = grown
    key = Ed25519PrivateKey.generate()
    with log.locked():
        head = log.sign(key, ORIGIN)
    body, sigs = tlog.note_signatures(head.note)
    assert body == f"{ORIGIN}\n37\n{base64.b64encode(mth(data)).decode()}\n"
    assert head.note.startswith(body + "\n\u2014 " + ORIGIN + " ")
    public = key.public_key().public_bytes_raw()
    hint = hashlib.sha256(ORIGIN.encode() + b"\n\x01" + public).digest()[:4]
    assert sigs[0][1] == hint
    vkey = tlog.verifier_key(log.dir)
    encoded = base64.b64encode(b"\x01" + public).decode()
    assert vkey == f"{ORIGIN}+{hint.hex()}+{encoded}"
    assert tlog.verify_note(head.note, vkey) == body
    with pytest.raises(tlog.LogError):
        tlog.verify_note(head.note.replace("\n37\n", "\n36\n"), vkey)
    assert tlog.parse_checkpoint(head.note) == (ORIGIN, 37, mth(data))
    assert tlog.newest_tree_head(log.dir) == head.note


def test_signing_again_with_nothing_new_gives_the_same_head(grown):
    log, _ = grown
    key = Ed25519PrivateKey.generate()
    with log.locked():
        first = log.sign(key, ORIGIN)
        assert log.sign(key, ORIGIN) == first
    assert len(log.heads.read_bytes().splitlines()) == 1


def test_a_changed_hash_under_a_signed_size_is_never_signed_again(grown):
    log, _ = grown
    key = Ed25519PrivateKey.generate()
    with log.locked():
        log.sign(key, ORIGIN)
        log.append([(b"more", {})])
    raw = bytearray(log.hashes.read_bytes())
    raw[tlog.stored_index(0, 36) * 32] ^= 1      # leaf 36's hash: part of the tree of 37 signed
    log.hashes.write_bytes(bytes(raw))
    with log.locked(), pytest.raises(tlog.LogError, match="not the one signed"):
        log.sign(key, ORIGIN)
    assert len(log.heads.read_bytes().splitlines()) == 1


def test_a_log_cut_below_its_signed_size_is_refused(grown):
    log, _ = grown
    key = Ed25519PrivateKey.generate()
    with log.locked():
        log.sign(key, ORIGIN)
    lines = log.entries_path.read_bytes().splitlines(keepends=True)
    log.entries_path.write_bytes(b"".join(lines[:30]))
    with pytest.raises(tlog.LogError, match="rolled back or damaged"), log.locked():
        pass


def test_another_origin_or_key_is_refused(grown):
    log, _ = grown
    key = Ed25519PrivateKey.generate()
    with log.locked():
        log.sign(key, ORIGIN)
        with pytest.raises(tlog.LogError, match="chosen once"):
            log.sign(key, "amdflash.local/other/1111")
        with pytest.raises(tlog.LogError, match="chosen once"):
            log.sign(Ed25519PrivateKey.generate(), ORIGIN)


def test_a_torn_append_is_dropped_before_the_next(grown):
    log, data = grown
    with open(log.hashes, "ab") as f:
        f.write(b"\x07" * 40)           # a crash after part of the hashes, before the entry line
    with open(log.entries_path, "ab") as f:
        f.write(b'{"i":37')
    key = Ed25519PrivateKey.generate()
    with log.locked():
        log.sign(key, ORIGIN)
    with open(log.heads, "ab") as f:
        f.write(b'{"size":38,"ro')          # a head torn by a crash
    with log.locked():
        log.append([(b"after", {})])
        head = log.sign(key, ORIGIN)
    assert log.size() == 38 and log.tree_hash(38) == mth([*data, b"after"])
    assert log.last_head() == head and head.size == 38


# -- through the CLI -----------------------------------------------------------------------------

def _flash(cli, tmp_path: Path, make_board, seed: int) -> str:  # noqa: F811
    from amdflash.stages.sim.synth import PART_KEY, synthetic_ifwi

    image = tmp_path / f"image{seed}.bin"
    image.write_bytes(synthetic_ifwi(21)[:3 * 4096])
    board = make_board(transport="ideal", seed=seed)
    r = cli("flash", image, "--yes", "--force", "--start-sector", "0", "--sector-count", "3",
            "--expect-part", PART_KEY, "--board", f"sim:{board}", "--json")
    assert r.code == 0, r.err
    return json.loads(r.out)["run_id"]


def _entries(db: Path) -> list[dict]:  # noqa: F811
    return tlog.Log(tlog.log_dir(str(db))).entries()


def test_a_flash_logs_every_checkpoint_and_its_receipt(cli, db, tmp_path, make_board):  # noqa: F811
    import sqlite3

    run = _flash(cli, tmp_path, make_board, 1)
    entries = _entries(db)
    conn = sqlite3.connect(db)
    ids = [r[0] for r in conn.execute("SELECT id FROM checkpoints ORDER BY id")]
    conn.close()
    assert [e["id"] for e in entries if e["kind"] == "checkpoint"] == ids
    assert entries[-1]["kind"] == "receipt" and entries[-1]["run"] == run
    r = cli("audit", "log")
    assert r.code == 0, r.err
    origin, size, _ = tlog.parse_checkpoint(r.out)
    assert size == len(entries) and origin == tlog.default_origin()
    # The log key: its own file beside the host key, the owner's alone; it signed the head.
    import os

    log_key = Path(os.environ["AMDFLASH_HOST_KEY"]).with_name("log_key.pem")
    assert log_key.stat().st_mode & 0o777 == 0o600
    from amdflash.store.keys import load_private, public_bytes

    assert tlog.parse_vkey(cli("audit", "log", "--vkey").out)[1] == public_bytes(load_private(log_key))
    assert tlog.verify_note(r.out, cli("audit", "log", "--vkey").out)


def test_the_log_outlives_audit_archive(cli, db, tmp_path, make_board):  # noqa: F811
    first = _flash(cli, tmp_path, make_board, 1)
    old = cli("audit", "log").out
    _, old_size, _ = tlog.parse_checkpoint(old)
    r = cli("audit", "archive", "--before", "2999-01-01", "-o", tmp_path / "archive.jsonl")
    assert r.code == 0, r.err
    second = _flash(cli, tmp_path, make_board, 2)
    entries = _entries(db)
    assert any(e.get("run") == first for e in entries) and entries[-1]["run"] == second
    r = cli("audit", "log", "--consistency-from", old_size)
    assert r.code == 0, r.err
    head = r.out.split("\n\n", 1)[1]
    _, new_size, new_root = tlog.parse_checkpoint(head)
    proof = [base64.b64decode(x) for x in r.out.split("\n\n", 1)[0].splitlines()[1:]]
    assert check_consistency(old_size, new_size, tlog.parse_checkpoint(old)[2], new_root, proof)
    # The log still holds the archived run's checkpoints and receipt, and proves the new one.
    assert cli("audit", "log", "--proof", second).code == 0


def test_a_trail_rolled_back_under_its_log_is_refused(cli, db, tmp_path, make_board):  # noqa: F811
    _flash(cli, tmp_path, make_board, 1)
    saved = tmp_path / "saved.sqlite"
    shutil.copy(db, saved)
    shutil.copy(str(db) + ".anchor", str(saved) + ".anchor")
    _flash(cli, tmp_path, make_board, 2)
    before = tlog.Log(tlog.log_dir(str(db))).last_head()
    shutil.copy(saved, db)                  # the database and its anchor rolled back together
    shutil.copy(str(saved) + ".anchor", str(db) + ".anchor")
    for suffix in ("-wal", "-shm"):
        Path(str(db) + suffix).unlink(missing_ok=True)
    r = cli("audit", "log")
    assert r.code == 2 and "rolled back" in r.err, r.err
    assert tlog.Log(tlog.log_dir(str(db))).last_head() == before       # nothing signed


def test_the_origin_comes_from_the_config_file(cli, db, tmp_path, make_board, monkeypatch):  # noqa: F811
    config = tmp_path / "config.toml"
    config.write_text('log_origin = "example.com/line7/host3"\n')
    monkeypatch.setenv("AMDFLASH_CONFIG", str(config))
    _flash(cli, tmp_path, make_board, 1)
    r = cli("audit", "log")
    assert r.code == 0 and r.out.startswith("example.com/line7/host3\n"), r.err
    assert cli("audit", "log", "--vkey").out.startswith("example.com/line7/host3+")


@pytest.mark.wall_clock
def test_a_run_s_end_costs_the_same_in_a_log_of_a_hundred_thousand_leaves(tmp_path):
    """A host's log grows by every checkpoint of every run (a real flash seals ~1 a second):
    appending and signing read O(log n) hashes and no entry but the newest checkpoint's."""
    import time

    log = tlog.Log(tmp_path / "big.tlog")
    key = Ed25519PrivateKey.generate()
    with log.locked():
        log.append([(b"cp %d" % i, {"kind": "checkpoint", "id": i + 1, "hash": "00"}) for i in range(100_000)])
        log.sign(key, ORIGIN)
    started = time.perf_counter()
    with log.locked():
        assert log.find(b'"kind":"checkpoint"')["id"] == 100_000
        log.append([(b"receipt", {"kind": "receipt", "run": "r", "sha256": "00"})])
        head = log.sign(key, ORIGIN)
    took = time.perf_counter() - started
    assert head.size == 100_001 and took < 0.25, took


def test_a_run_the_log_could_not_take_says_so_at_its_end(db, tmp_path, make_board):  # noqa: F811
    from amdflash.stages.sim.synth import PART_KEY, synthetic_ifwi
    from tests.support import cli as command_line

    tlog.log_dir(str(db)).write_text("not a directory")        # the log cannot be made there
    image = tmp_path / "image.bin"
    image.write_bytes(synthetic_ifwi(21)[:3 * 4096])
    board = make_board(transport="ideal", seed=1)
    r = command_line.run("--no-progress", "flash", image, "--yes", "--force", "--start-sector", "0",
                         "--sector-count", "3", "--expect-part", PART_KEY, "--board", f"sim:{board}")
    assert r.code == 0, r.err
    line = next(x for x in r.err_lines if x.startswith("run "))
    assert ": succeeded \u2014 not in the transparency log (" in line, line
