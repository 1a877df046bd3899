"""Witness cosignatures (store/witness.py) checked against a witness of our own
(tests/support/witness_server.py): the keys, the lines, the times, and the files kept."""
from __future__ import annotations

import base64
import os
import stat
import struct
import time
from pathlib import Path

import pytest

from amdflash.store import witness as ws
from tests.support.witness_server import MerkleLog, WitnessServer, consistent


def log_of(n: int) -> MerkleLog:
    log = MerkleLog()
    for i in range(n):
        log.add(f"leaf {i}".encode())
    return log


def configured(server: WitnessServer) -> ws.Witness:
    name, key = ws.parse_vkey(server.vkey)
    return ws.Witness(name, key, "http://127.0.0.1:1")


def answer_of(server: WitnessServer, log: MerkleLog, old: int = 0) -> tuple[str, bytes]:
    head = log.checkpoint()
    server.logs.setdefault(log.origin, [log.vkey])
    status, _, answer = server.add_checkpoint(ws.request_body(old, log.consistency(old), head))
    assert status == 200, answer
    return head, answer


def test_the_test_logs_proofs_hold_for_every_pair_of_sizes() -> None:
    log = log_of(13)
    for new in range(1, 14):
        for old in range(1, new + 1):
            assert consistent(old, new, log.root(old), log.root(new), log.consistency(old, new)), (old, new)
            if old < new:
                assert not consistent(old, new, log.root(old)[::-1], log.root(new), log.consistency(old, new))


def test_vkey_round_trips_and_a_wrong_key_id_or_type_is_refused() -> None:
    server = WitnessServer()
    name, key = ws.parse_vkey(server.vkey)
    assert ws.Witness(name, key, "http://x").vkey == server.vkey
    parts = server.vkey.split("+", 2)
    with pytest.raises(ws.WitnessError, match="key id does not match"):
        ws.parse_vkey(f"{parts[0]}+00000000+{parts[2]}")
    with pytest.raises(ws.WitnessError, match="type 0x04"):
        ws.parse_vkey(MerkleLog().vkey)      # a log's (type 0x01) key is not a witness's
    with pytest.raises(ws.WitnessError, match="name\\+keyid\\+base64"):
        ws.parse_vkey("just-a-name")


def test_request_body_is_old_size_proof_blank_line_checkpoint() -> None:
    log = log_of(7)
    head7 = log.checkpoint()
    for i in range(7, 20):
        log.add(f"leaf {i}".encode())
    body = ws.request_body(7, log.consistency(7), log.checkpoint()).decode()
    lines = body.split("\n")
    assert lines[0] == "old 7"
    proof = lines[1:lines.index("")]
    assert [base64.b64decode(p) for p in proof] == log.consistency(7)
    assert body.endswith("\n\n" + log.checkpoint().split("\n\n", 1)[1])
    assert ws.parse_note(head7).size == 7
    with pytest.raises(ws.WitnessError, match="63"):
        ws.request_body(1, [b"x" * 32] * 64, head7)


def test_a_cosignature_verifies_with_the_witness_key_only() -> None:
    server, log = WitnessServer(), log_of(5)
    head, answer = answer_of(server, log)
    body = ws.parse_note(head).body
    cosig = ws.check_answer(configured(server), body, answer, time.time(), time.time() - 1)
    assert cosig.witness == server.name and abs(cosig.timestamp - time.time()) < 5
    other = WitnessServer(name=server.name)          # same name, another key: its lines are ignored
    with pytest.raises(ws.WitnessError, match="no cosignature of its key"):
        ws.check_answer(configured(other), body, answer, time.time(), time.time())
    # Over another checkpoint body, the witness's own line fails: the whole answer is refused.
    log.add(b"one more")
    with pytest.raises(ws.WitnessError, match="does not verify"):
        ws.check_answer(configured(server), ws.parse_note(log.checkpoint()).body, answer, time.time(), time.time())


def test_a_changed_timestamp_or_signature_byte_is_refused() -> None:
    server, log = WitnessServer(), log_of(3)
    head, answer = answer_of(server, log)
    body, w = ws.parse_note(head).body, configured(server)
    dash, name, b64 = answer.decode().split()
    raw = base64.b64decode(b64)
    for changed in (raw[:4] + struct.pack(">Q", struct.unpack(">Q", raw[4:12])[0] + 1) + raw[12:],
                    raw[:-1] + bytes([raw[-1] ^ 1])):
        line = f"{dash} {name} {base64.b64encode(changed).decode()}\n".encode()
        with pytest.raises(ws.WitnessError, match="does not verify"):
            ws.check_answer(w, body, line, time.time(), time.time())


def test_a_cosignature_from_the_future_or_from_before_the_request_is_refused() -> None:
    log = log_of(3)
    future = WitnessServer(clock=time.time() + 3600)
    head, answer = answer_of(future, log)
    with pytest.raises(ws.WitnessError, match="in the future"):
        ws.check_answer(configured(future), ws.parse_note(head).body, answer, time.time(), time.time())
    old = WitnessServer(clock=time.time() - 3600)
    head, answer = answer_of(old, log)
    with pytest.raises(ws.WitnessError, match="before it was asked"):
        ws.check_answer(configured(old), ws.parse_note(head).body, answer, time.time(), time.time())


def test_kept_checkpoint_is_a_signed_note_with_its_cosignatures_in_private_files(tmp_path: Path) -> None:
    db = str(tmp_path / "audit.sqlite")
    log, one, two = log_of(4), WitnessServer(name="w.test/one"), WitnessServer(name="w.test/two")
    head = ws.parse_note(log.checkpoint())
    for server in (one, two):
        _, answer = answer_of(server, log)
        kept = ws.store(db, head, [ws.check_answer(configured(server), head.body, answer, time.time(), 0)])
    assert ws.stored(db, 4) == kept and ws.newest(db) == kept
    assert [c.witness for c in ws.cosigned_by(kept, [configured(one), configured(two)], time.time())] == \
        ["w.test/one", "w.test/two"]
    assert kept.text.startswith(log.checkpoint())       # the log's signature first, then the cosignatures
    assert stat.S_IMODE(os.stat(ws.witnessed_dir(db)).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(ws.witnessed_dir(db) / "checkpoint.4").st_mode) == 0o600
    # A head of another tree at the same size is neither merged with the cosigned one kept nor
    # put in its place: the cosigned head is what the witnesses hold against a fork.
    forked = MerkleLog(log.origin, log.key)
    for i in range(4):
        forked.add(f"other {i}".encode())
    fork = ws.store(db, ws.parse_note(forked.checkpoint()), [])
    assert fork.body != kept.body and len(fork.signatures) == 1
    assert ws.stored(db, 4) == kept
    # One no witness cosigned is replaced (the newest head the log signed is what is asked about).
    uncosigned = str(tmp_path / "other.sqlite")
    ws.store(uncosigned, head, [])
    assert ws.store(uncosigned, ws.parse_note(forked.checkpoint()), []) == ws.stored(uncosigned, 4) != head


@pytest.mark.parametrize("text", ["no final newline", "origin\n12\nroot\n\n\u2014 x y\n", "o\n1\n" +
                                  base64.b64encode(b"x" * 32).decode() + "\n\nnot a signature\n",
                                  "o\n01\n" + base64.b64encode(b"x" * 32).decode() + "\n\n\u2014 k AAAAAAA=\n"])
def test_malformed_notes_are_refused(text: str) -> None:
    with pytest.raises(ws.WitnessError):
        ws.parse_note(text)


def test_offline_check_needs_the_log_key_and_a_quorum_of_trusted_witnesses() -> None:
    log, one, two = log_of(4), WitnessServer(name="w.test/one"), WitnessServer(name="w.test/two")
    head = ws.parse_note(log.checkpoint())
    lines = [answer_of(s, log)[1].decode().strip() for s in (one, two)]
    cosigned = head.with_lines(lines).text
    trusted = [configured(one), configured(two)]
    assert [c.witness for c in ws.check_offline(cosigned, log.vkey, trusted, 2)] == ["w.test/one", "w.test/two"]
    with pytest.raises(ws.WitnessError, match="cosigned by 1 of the 2 trusted witnesses, 2 needed"):
        ws.check_offline(head.with_lines(lines[:1]).text, log.vkey, trusted, 2)
    with pytest.raises(ws.WitnessError, match="cosigned by 0 of the 1 trusted witnesses"):
        ws.check_offline(cosigned, log.vkey, [configured(WitnessServer(name="w.test/one"))], 1)
    with pytest.raises(ws.WitnessError, match="is not the log's"):
        ws.check_offline(cosigned, MerkleLog(log.origin).vkey, trusted, 1)
    dash, name, b64 = lines[1].split()
    raw = base64.b64decode(b64)
    forged = f"{dash} {name} {base64.b64encode(raw[:-1] + bytes([raw[-1] ^ 1])).decode()}"
    with pytest.raises(ws.WitnessError, match="does not verify"):
        ws.check_offline(head.with_lines([lines[0], forged]).text, log.vkey, trusted, 1)
