"""Receipts (store.receipts): canonical JSON by RFC 8785's own examples, DSSE's PAE, and through
the CLI the receipt of a flash that succeeded and of one that failed — its subjects, its
predicate, its signature, the same bytes every time, and the leaf the log holds of it."""
from __future__ import annotations

import base64
import hashlib
import json
import struct
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from amdflash.store import jcs, receipts, tlog
from amdflash.store.receipts import pae
from tests.pipeline.engine.conftest import cli, db  # noqa: F401 - fixtures: in-process CLI with its own database

# -- RFC 8785 ------------------------------------------------------------------------------------


def test_jcs_rfc8785_main_example():
    """RFC 8785 §3.2.2 (input) and §3.2.3 (its canonical form)."""
    value = json.loads('{"numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],'
                       '"string": "\\u20ac$\\u000F\\u000aA\'\\u0042\\u0022\\u005c\\\\\\"\\/",'
                       '"literals": [null, true, false]}')
    assert jcs.canonical(value) == ('{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,'
                                    '1e-27],"string":"€$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}').encode()


def test_jcs_sorts_names_by_utf16_code_units():
    """RFC 8785 §3.2.3's sorting example: the emoji (a surrogate pair, D83D) sorts before U+FB33."""
    value = {"\u20ac": "Euro Sign", "\r": "Carriage Return", "\ufb33": "Hebrew Letter Dalet With Dagesh",
             "1": "One", "\U0001f600": "Emoji: Grinning Face", "\u0080": "Control",
             "\u00f6": "Latin Small Letter O With Diaeresis"}
    out = json.loads(jcs.canonical(value))
    assert list(out.values()) == ["Carriage Return", "One", "Control", "Latin Small Letter O With Diaeresis",
                                  "Euro Sign", "Emoji: Grinning Face", "Hebrew Letter Dalet With Dagesh"]
    assert jcs.canonical({"\u0080": 1}) == '{"\u0080":1}'.encode()     # written as it is, not escaped


@pytest.mark.parametrize("bits,text", [
    ("0000000000000000", "0"), ("8000000000000000", "0"), ("0000000000000001", "5e-324"),
    ("8000000000000001", "-5e-324"), ("7fefffffffffffff", "1.7976931348623157e+308"),
    ("4340000000000000", "9007199254740992"), ("4430000000000000", "295147905179352830000"),
    ("44b52d02c7e14af5", "9.999999999999997e+22"), ("44b52d02c7e14af6", "1e+23"),
    ("444b1ae4d6e2ef50", "1e+21"), ("444b1ae4d6e2ef4f", "999999999999999900000"),
    ("3eb0c6f7a0b5ed8c", "9.999999999999997e-7"), ("3eb0c6f7a0b5ed8d", "0.000001"),
    ("41b3de4355555553", "333333333.3333332"), ("41b3de4355555557", "333333333.33333343"),
    ("becbf647612f3696", "-0.0000033333333333333333"), ("43143ff3c1cb0959", "1424953923781206.2"),
])
def test_jcs_numbers_as_rfc8785_appendix_b(bits, text):
    assert jcs.number(struct.unpack(">d", bytes.fromhex(bits))[0]) == text


def test_jcs_escapes_only_what_it_must_and_refuses_what_json_cannot_hold():
    assert jcs.canonical("a\x01\x1f\b\t\"\\/é") == b'"a\\u0001\\u001f\\b\\t\\"\\\\/\xc3\xa9"'
    for bad in (float("nan"), float("inf"), 2 ** 53, "\ud800", {1: 2}, b"bytes"):
        with pytest.raises(jcs.NotCanonical):
            jcs.canonical(bad)
    assert jcs.canonical([True, False, None, -(2 ** 53 - 1)]) == b"[true,false,null,-9007199254740991]"


def test_dsse_pae_as_the_spec_gives_it():
    assert pae("http://example.com/HelloWorld", b"hello world") == \
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"


# -- a flash's receipt, through the CLI ----------------------------------------------------------

def _flash(cli, tmp_path: Path, make_board, *extra: object) -> tuple[str, Path, Path, int]:  # noqa: F811
    from amdflash.stages.sim.synth import PART_KEY, synthetic_ifwi

    image = tmp_path / "image.bin"
    image.write_bytes(synthetic_ifwi(21)[:3 * 4096])
    board = make_board(transport="ideal", seed=7, **dict(extra))
    r = cli("flash", image, "--yes", "--force", "--start-sector", "0", "--sector-count", "3",
            "--expect-part", PART_KEY, "--board", f"sim:{board}", "--json", "--operator", "Ada Lovelace")
    return json.loads(r.out)["run_id"], image, board, r.code


def _receipt(cli, run: str, tmp_path: Path) -> bytes:  # noqa: F811
    out = tmp_path / f"receipt-{len(list(tmp_path.iterdir()))}.json"
    r = cli("audit", "receipt", "--run", run, "-o", out)
    assert r.code == 0, r.err
    return out.read_bytes()


def _public(cli) -> bytes:  # noqa: F811
    from amdflash.store.keys import read_public

    return read_public(_pem(cli))


def _pem(cli) -> Path:  # noqa: F811
    import tempfile

    path = Path(tempfile.mkdtemp()) / "host.pem"
    r = cli("audit", "key", "--pem", "-o", path)
    assert r.code == 0 and r.out.startswith("-----BEGIN PUBLIC KEY-----"), r.err
    return path


def test_a_flash_has_a_signed_receipt_naming_what_it_wrote(cli, db, tmp_path, make_board):  # noqa: F811
    run, image, board, code = _flash(cli, tmp_path, make_board)
    assert code == 0
    raw = _receipt(cli, run, tmp_path)
    env = json.loads(raw)
    assert jcs.canonical(env) == raw                       # canonical bytes
    assert env["payloadType"] == "application/vnd.in-toto+json"
    body = base64.b64decode(env["payload"])
    assert jcs.canonical(json.loads(body)) == body
    Ed25519PublicKey.from_public_bytes(_public(cli)).verify(
        base64.b64decode(env["signatures"][0]["sig"]), pae(env["payloadType"], body))
    st = json.loads(body)
    assert st["_type"] == "https://in-toto.io/Statement/v1"
    assert st["predicateType"] == "https://amdflash.dev/flash-run/v1"
    subjects = {s["name"]: s["digest"]["sha256"] for s in st["subject"]}
    # A sector range's bytes are written as the whole-flash image they make, the rest erased.
    placed = image.read_bytes() + b"\xff" * (0x200000 - image.stat().st_size)
    assert subjects["image"] == hashlib.sha256(placed).hexdigest()
    rep = json.loads(cli("report", run, "--format", "json").out)
    assert subjects["backup"] == rep["backups"][0]["sha256"]
    assert "read-back" not in subjects        # a range flash records no digest of the whole read-back
    p = st["predicate"]
    uid = json.loads((board / "board.json").read_text())["unique_id"]
    salt = bytes.fromhex(p["board"]["salt"])
    assert subjects["board"] == hashlib.sha256(salt + f"{rep['board']['jedec']}:{uid}".encode()).hexdigest()
    assert uid not in raw.decode()                         # the identity only as its salted hash
    assert p["run"] == {"id": run, "command": "flash", "arguments": rep["arguments"], "result": "succeeded",
                        "firstError": None, "emulated": True}
    assert p["forces"] == ["expect_part", "force"]
    assert p["operator"] == {"claimed": "Ada Lovelace", "account": rep["operator"]}
    assert p["verify"]["passed"] is True and p["verify"]["failed"] == 0
    assert p["protection"]["reading"] == rep["board"]["protection"]
    trail = p["trail"]
    assert trail["sealed"] == "final" and trail["checkpoints"][-1]["sha256"] == rep["chain"]["checkpoint_hash"]
    assert subjects[f"trail:{run}"] == rep["chain"]["checkpoint_hash"]
    # The same bytes every time: the log's leaf is the receipt rebuilt on demand.
    assert _receipt(cli, run, tmp_path) == raw
    entry = [e for e in tlog.Log(tlog.log_dir(str(db))).entries() if e.get("run") == run]
    assert entry and entry[0]["sha256"] == hashlib.sha256(raw).hexdigest()


def test_a_failed_flash_has_a_receipt_too(cli, db, tmp_path, make_board):  # noqa: F811
    from amdflash.stages.sim.synth import synthetic_ifwi

    content = bytearray(synthetic_ifwi(21))
    stuck = next(a for a in range(0x1000) if not content[a] & 1)
    content[:0x1000] = bytes(0x1000)         # unit 0 must be written, and a bit it clears stays set
    run, _, _, code = _flash(cli, tmp_path, make_board, ("content", bytes(content)),
                             ("faults", [f"stuck-bit={stuck:#x}:0"]))
    assert code == 1
    st = json.loads(base64.b64decode(json.loads(_receipt(cli, run, tmp_path))["payload"]))
    p = st["predicate"]
    assert p["run"]["result"] == "failed" and p["run"]["firstError"]
    assert p["verify"]["passed"] is False and p["verify"]["failed"] >= 1 and p["verify"]["firstFailed"]
    names = {s["name"] for s in st["subject"]}
    assert "read-back" not in names and {"image", "backup", "board", f"trail:{run}"} <= names


def test_the_receipt_of_a_run_that_does_not_verify_is_refused(cli, db, tmp_path, make_board):  # noqa: F811
    import sqlite3

    from amdflash.store.schema import drop_triggers

    run, _, _, _ = _flash(cli, tmp_path, make_board)
    conn = sqlite3.connect(db)
    drop_triggers(conn)
    conn.execute("UPDATE runs SET operator_claimed = 'Mallory' WHERE run_id = ?", (run,))
    conn.commit()
    conn.close()
    r = cli("audit", "receipt", "--run", run)
    assert r.code != 0 and "does not verify" in r.err and r.out == ""


def test_audit_key_pem_is_the_host_key(cli, db):  # noqa: F811
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    pem = _pem(cli)
    line = cli("audit", "key").out.split()[1]
    key = load_pem_public_key(pem.read_bytes())
    assert isinstance(key, Ed25519PublicKey) and key.public_bytes_raw().hex() == line


def test_salt_is_the_same_for_a_run_and_unlike_another_runs():
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    assert receipts.board_salt(key, "r1") == receipts.board_salt(key, "r1") != receipts.board_salt(key, "r2")


def test_the_read_back_is_a_subject_only_of_a_verify_that_passed():
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from amdflash.store.chain import Checkpoint

    key = Ed25519PrivateKey.generate()
    cp = Checkpoint(3, "final", "r1", 10, 12, b"h" * 32, b"k" * 32, "t", None, hash=b"c" * 32, run=2)
    rep = {"run_id": "r1", "status": "succeeded", "image_sha256": "a" * 64, "result_sha256": "b" * 64,
           "verifies": {"total": 512, "ok": 512, "failed": []}, "board": {}}
    names = {s["name"]: s["digest"]["sha256"] for s in receipts.statement(rep, [cp], b"s")["subject"]}
    assert names == {"image": "a" * 64, "read-back": "b" * 64, "trail:r1": (b"c" * 32).hex()}
    failed = {**rep, "status": "failed", "verifies": {"total": 512, "ok": 511, "failed": [{"address": 0}]}}
    assert "read-back" not in {s["name"] for s in receipts.statement(failed, [cp], b"s")["subject"]}
    with pytest.raises(receipts.ReceiptRefused, match="not this host's"):
        receipts.from_report(rep, [cp], key)      # a run another key sealed: no receipt signed for it here


def test_a_reviewer_without_the_keys_reads_the_log_and_writes_nothing(cli, db, tmp_path, make_board):  # noqa: F811
    """Another account (no host key, no log key) gets the newest tree head, a logged receipt and
    its proof from the log as it is: nothing is signed, no key is made, no file is written."""
    import os

    run, _, _, _ = _flash(cli, tmp_path, make_board)
    home = tmp_path / "reviewer"
    home.mkdir()
    env = {"HOME": str(home), "XDG_CONFIG_HOME": None, "XDG_DATA_HOME": None, "AMDFLASH_HOST_KEY": None,
           "AMDFLASH_CONFIG": None}
    directory = tlog.log_dir(str(db))

    def state() -> dict[str, bytes]:
        return {str(p): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}

    before = state()
    head = cli("audit", "log", env=env)
    assert head.code == 0 and head.out == tlog.newest_tree_head(directory), head.err
    r = cli("audit", "receipt", "--run", run, env=env)
    assert r.code == 0, r.err                                          # the log's copy (-q: no note)
    assert r.out == cli("audit", "receipt", "--run", run).out          # the host's own, built again
    p = cli("audit", "log", "--proof", run, env=env)
    assert p.code == 0 and p.out.startswith("c2sp.org/tlog-proof@v1\n"), p.err
    assert state() == before and list(os.walk(home)) == [(str(home), [], [])]


def test_a_receipt_that_would_be_built_otherwise_now_is_a_finding(cli, db, tmp_path, make_board,  # noqa: F811
                                                                  monkeypatch):
    run, _, _, _ = _flash(cli, tmp_path, make_board)
    monkeypatch.setattr(receipts, "PREDICATE_TYPE", "https://amdflash.dev/flash-run/v2")
    r = cli("audit", "receipt", "--run", run)
    assert r.code == 1 and "differs from the one the transparency log holds" in r.err and r.out == "", r.err


def test_a_lost_copy_of_a_logged_receipt_is_put_back_from_the_trail(cli, db, tmp_path, make_board):  # noqa: F811
    import shutil

    run, _, _, _ = _flash(cli, tmp_path, make_board)
    directory = tlog.log_dir(str(db))
    kept = sorted((directory / "receipts").iterdir())
    before = [p.read_bytes() for p in kept]
    shutil.rmtree(directory / "receipts")          # the copies, not the record: the leaf stays
    r = cli("audit", "log", "--proof", run)
    assert r.code == 0 and r.out.startswith("c2sp.org/tlog-proof@v1"), r.err
    assert [p.read_bytes() for p in kept] == before
    assert len(tlog.Log(directory).entries()) == int(r.out.split("\n\n")[1].split("\n")[1])   # nothing appended
