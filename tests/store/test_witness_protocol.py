"""The tlog-witness client (pipeline/engine/witnessing.py) against witnesses of our own over HTTP
on loopback: cosigned, the quorum, each of the spec's refusals (409 and the retry, 403, 404,
422), a witness that is down or slow, and a log that was rolled back or forked."""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from collections.abc import Iterator

import pytest

from amdflash.pipeline.engine import witnessing
from amdflash.pipeline.errors import UsageError
from amdflash.store import witness as ws
from tests.support.witness_server import MerkleLog, WitnessServer


@pytest.fixture
def log() -> MerkleLog:
    log = MerkleLog()
    for i in range(5):
        log.add(f"leaf {i}".encode())
    return log


@pytest.fixture
def servers(log: MerkleLog) -> Iterator[list[WitnessServer]]:
    started = [WitnessServer(name=f"w.test/{i}", logs={log.origin: [log.vkey]}).start() for i in range(2)]
    yield started
    for s in started:
        s.stop()


def conf(servers: list[WitnessServer], quorum: int | None = None, timeout: float = 2.0) -> witnessing.Settings:
    data: dict = {"witnesses": [{"url": s.url, "key": s.vkey} for s in servers], "witness_timeout": timeout}
    if quorum is not None:
        data["witness_quorum"] = quorum
    settings = witnessing.settings(data)
    assert settings is not None
    return settings


def grow(log: MerkleLog, n: int, tag: str = "leaf") -> None:
    start = len(log.leaves)
    for i in range(start, start + n):
        log.add(f"{tag} {i}".encode())


def test_two_witnesses_cosign_and_the_head_is_kept_with_both(tmp_path: Path, log: MerkleLog,
                                                             servers: list[WitnessServer]) -> None:
    db = str(tmp_path / "audit.sqlite")
    outcome = witnessing.ask(db, log, conf(servers))
    assert outcome.words() == "witnessed by 2 of 2"
    kept = ws.stored(db, 5)
    assert kept is not None and len(kept.signatures) == 3
    # The log grows: each witness is asked from the size it cosigned, with a consistency proof.
    grow(log, 6)
    assert witnessing.ask(db, log, conf(servers)).words() == "witnessed by 2 of 2"
    assert all(s.known[log.origin][0] == 11 for s in servers)
    assert [r[0] for r in servers[0].requests] == [200, 200]
    # Asked again for a head both cosigned: nothing is sent.
    assert witnessing.ask(db, log, conf(servers)).words() == "witnessed by 2 of 2"
    assert len(servers[0].requests) == 2


def test_a_witness_down_leaves_it_not_yet_witnessed_and_a_later_ask_completes_it(
        tmp_path: Path, log: MerkleLog, servers: list[WitnessServer]) -> None:
    db = str(tmp_path / "audit.sqlite")
    settings = conf(servers)
    servers[1].stop()
    outcome = witnessing.ask(db, log, settings)
    assert not outcome.witnessed
    assert outcome.words().startswith("not yet witnessed (1 of 2 cosigned, 2 needed: w.test/1: unreachable at ")
    assert "connection refused" in outcome.words()
    # With a quorum of 1 the same answers are enough.
    assert witnessing.ask(db, log, dataclasses.replace(settings, quorum=1)).words() == "witnessed by 1 of 2"
    later = WitnessServer(name="w.test/1", key=servers[1].key, logs=servers[1].logs).start()
    try:
        settings = witnessing.settings({"witnesses": [{"url": s.url, "key": s.vkey} for s in (servers[0], later)]})
        assert settings is not None
        assert witnessing.ask(db, log, settings).words() == "witnessed by 2 of 2"
        assert len(servers[0].requests) == 1        # the one that had cosigned is not asked again
    finally:
        later.stop()


def test_409_tells_the_witness_size_and_the_client_retries_from_it(
        tmp_path: Path, log: MerkleLog, servers: list[WitnessServer]) -> None:
    db = str(tmp_path / "audit.sqlite")
    assert witnessing.ask(db, log, conf(servers)).witnessed
    for path in ws.witnessed_dir(db).glob("last.*"):     # the client forgot what each witness cosigned
        path.unlink()
    grow(log, 3)
    assert witnessing.ask(db, log, conf(servers)).words() == "witnessed by 2 of 2"
    assert [r[0] for r in servers[0].requests] == [200, 409, 200]


def test_unknown_log_and_unknown_log_key_are_told(tmp_path: Path, log: MerkleLog,
                                                   servers: list[WitnessServer]) -> None:
    db = str(tmp_path / "audit.sqlite")
    servers[0].logs = {"another.example/log": [log.vkey]}
    servers[1].logs = {log.origin: [MerkleLog(log.origin).vkey]}
    words = witnessing.ask(db, log, conf(servers)).words()
    assert "w.test/0: refused (404): it does not follow this log (test.example/log)" in words
    assert "w.test/1: refused (403): it does not trust this log's key" in words
    assert words.startswith("not yet witnessed (")


def test_a_rolled_back_log_is_refused_by_every_witness_and_said_so(
        tmp_path: Path, log: MerkleLog, servers: list[WitnessServer]) -> None:
    db = str(tmp_path / "audit.sqlite")
    grow(log, 5)
    assert witnessing.ask(db, log, conf(servers)).witnessed           # cosigned at 10 entries
    rolled = MerkleLog(log.origin, log.key)
    rolled.leaves = log.leaves[:5]                                     # the trail put back to 5 entries
    grow(rolled, 7, tag="rewritten")                                   # and rewritten: 12 other entries
    outcome = witnessing.ask(db, rolled, conf(servers))
    assert not outcome.witnessed and outcome.refused
    assert "refused (422): the tree does not extend the one of 10 entries it cosigned: the log was rolled back " \
           "or forked" in outcome.words()
    # With the client's files rolled back too, the witness's 409 and the retry still end in a refusal.
    for path in ws.witnessed_dir(db).glob("last.*"):
        path.unlink()
    outcome = witnessing.ask(db, rolled, conf(servers))
    assert outcome.refused and "(422)" in outcome.words()
    # A log rolled back to fewer entries than a witness cosigned: refused before asking.
    small = MerkleLog(log.origin, log.key)
    small.leaves = log.leaves[:6]
    words = witnessing.ask(db, small, conf(servers)).words()
    assert "it cosigned a tree of 10 entries, larger than this log's 6: the log was rolled back or forked" in words


def test_a_fork_at_the_size_already_cosigned_is_a_409_conflict(
        tmp_path: Path, log: MerkleLog, servers: list[WitnessServer]) -> None:
    db = str(tmp_path / "audit.sqlite")
    assert witnessing.ask(db, log, conf(servers)).witnessed
    forked = MerkleLog(log.origin, log.key)
    grow(forked, 5, tag="forked")
    outcome = witnessing.ask(str(tmp_path / "other.sqlite"), forked, conf(servers))
    assert outcome.refused
    assert "refused (409): it cosigned another tree of 5 entries: the log was rolled back or forked" in outcome.words()
    assert all(s.known[log.origin] == (5, log.root()) for s in servers)   # the witnesses kept the first tree


def test_a_slow_witness_costs_at_most_the_timeout(tmp_path: Path, log: MerkleLog,
                                                  servers: list[WitnessServer]) -> None:
    servers[1].delay = 3.0
    started = time.monotonic()
    outcome = witnessing.ask(str(tmp_path / "audit.sqlite"), log, conf(servers, timeout=0.5))
    assert time.monotonic() - started < 1.5
    assert "w.test/1: no answer" in outcome.words() and outcome.cosigned == ["w.test/0"]


def test_a_forged_cosignature_is_not_kept(tmp_path: Path, log: MerkleLog, servers: list[WitnessServer]) -> None:
    db = str(tmp_path / "audit.sqlite")
    settings = conf(servers)
    servers[1].key = servers[0].key       # it now signs with another key than the one configured for it
    outcome = witnessing.ask(db, log, settings)
    assert outcome.cosigned == ["w.test/0"] and "w.test/1: witness w.test/1 answered no cosignature of its key" \
        in outcome.words()
    kept = ws.stored(db, 5)
    assert kept is not None and len(kept.signatures) == 2


@pytest.mark.parametrize("data, words", [
    ({"witnesses": [{"url": "ftp://x", "key": "k"}]}, "is not an http:// or https:// address"),
    ({"witnesses": [{"url": "http://x"}]}, "must be {url ="),
    ({"witnesses": [{"url": "http://x", "key": "w+00+AA=="}]}, "is not a timestamped Ed25519 cosignature key"),
    ({"witnesses": [{"url": "http://x", "key": "K"}], "witness_quorum": 3}, None),
])
def test_witness_settings_that_cannot_be_used_are_refused(data: dict, words: str | None) -> None:
    if words is None:     # a good key, a quorum above the witnesses named
        data["witnesses"][0]["key"] = WitnessServer().vkey
        words = "witness_quorum = 3: must be 1..1"
    with pytest.raises(UsageError, match=words.replace("(", "\\(").replace("{", "\\{")):
        witnessing.settings(data)


def test_two_commands_ending_together_are_not_taken_for_a_rolled_back_log(
        tmp_path: Path, log: MerkleLog, servers: list[WitnessServer]) -> None:
    """Command A reads the log's tree head of 5 entries; before A's request reaches the witnesses,
    command B (the log grown to 9) asks with its own. Taken in turn, both are cosigned: B's head
    extends A's. Interleaved, the witnesses would have cosigned 9 before A asked with 5, which
    reads as a rolled-back log."""
    import threading

    db = str(tmp_path / "audit.sqlite")
    grown = MerkleLog(log.origin, log.key)
    grown.leaves = list(log.leaves)
    grow(grown, 4)
    results: dict[str, witnessing.Outcome] = {}

    class Racing:
        def __init__(self) -> None:
            self.raced = False

        def checkpoint(self) -> str:
            if not self.raced:
                self.raced = True
                other = threading.Thread(target=lambda: results.setdefault("B", witnessing.ask(db, grown,
                                                                                               conf(servers))))
                other.start()
                other.join(1.0)      # B finishes first unless it waits for A
                results["B joined"] = other   # type: ignore[assignment]
            return log.checkpoint()

        def consistency(self, old: int, new: int) -> list[bytes]:
            return log.consistency(old, new)

    results["A"] = witnessing.ask(db, Racing(), conf(servers))
    results["B joined"].join(5)     # type: ignore[attr-defined]
    assert results["A"].words() == "witnessed by 2 of 2", results["A"].words()
    assert results["B"].words() == "witnessed by 2 of 2", results["B"].words()
    assert all(s.known[log.origin][0] == 9 for s in servers)


def test_what_a_rogue_witness_sends_reaches_the_words_printable_and_bounded(
        tmp_path: Path, log: MerkleLog, servers: list[WitnessServer]) -> None:
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def answer() -> None:
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.sendall(b"\x1b]0;owned\x07\x1b[2J" + b"X" * 5000 + b"\r\n\r\n")
        conn.close()

    threading.Thread(target=answer, daemon=True).start()
    rogue = WitnessServer(name="w.test/rogue")
    settings = witnessing.settings({"witnesses": [{"url": servers[0].url, "key": servers[0].vkey},
                                                  {"url": f"http://127.0.0.1:{listener.getsockname()[1]}",
                                                   "key": rogue.vkey}]})
    assert settings is not None
    outcome = witnessing.ask(str(tmp_path / "audit.sqlite"), log, settings)
    listener.close()
    [said] = outcome.problems
    assert said.startswith("w.test/rogue: ") and "owned" in said and "XXX" in said, said
    assert "\x1b" not in said and "\x07" not in said and len(said) < 400, said
    assert "\x1b" not in outcome.words() and outcome.words().startswith("not yet witnessed (1 of 2 cosigned")
