"""Confirmed reads: nothing kept rests on a single read, every disagreement is on record.

The `read-flip` fault flips bits of bytes read from the flash (an unstable cell or a noisy
SPI line). Without confirmation a dump silently differs from the flash; with it, the dump
is byte-identical or the run fails naming the unit.
"""
from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amdflash.stages.confirm import MAJORITY, Noise, confirm, confirm_whole, settle
from amdflash.stages.sim import Board
from tests.pipeline.engine.conftest import flash_content
from tests.support.cli import audit_rows


@pytest.fixture
def cli(cli_shown):
    """What the operator sees: these tests read the warnings a run prints on success."""
    return cli_shown

MiB2 = 0x200000


def as_read(board: Path) -> bytes:
    with Board(board) as b:
        return bytes(b.chip._array(0, MiB2))


rows = audit_rows


def last_run(cli) -> dict:  # noqa: ANN001
    return json.loads(cli("runs", "--format", "json").out)[-1]


# -- the vote, on its own ------------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(copies=st.integers(1, 9).flatmap(
           lambda n: st.lists(st.binary(min_size=8, max_size=8), min_size=n, max_size=n)),
       k=st.integers(1, 5))
def test_a_kept_byte_always_has_the_agreement_the_rule_asks_for(copies, k):
    data, differing, unsettled, votes = settle(copies, k)
    n = len(copies)
    for offset in range(8):
        column = [c[offset] for c in copies]
        tally = Counter(column)
        if offset in unsettled:
            continue
        value, count = tally.most_common(1)[0]
        assert data[offset] == value
        unanimous = count == n and n >= k
        majority = count >= max(MAJORITY, k) and 2 * count > n
        assert unanimous or majority, (column, k)
        assert (offset in differing) == (len(tally) > 1)


def noisy_reader(truth: bytes, p: float, seed: int, same_bit: bool = False):  # noqa: ANN201
    rng = random.Random(seed)

    def read(ranges):  # noqa: ANN001, ANN202
        out = []
        for a, n in ranges:
            chunk = bytearray(truth[a:a + n])
            for i in range(n):
                if rng.random() < p:
                    chunk[i] ^= 1 if same_bit else 1 << rng.randrange(8)
            out.append(bytes(chunk))
        return out
    return read


@pytest.mark.parametrize("p", [0.0, 1e-4, 1e-2])
def test_noisy_reads_give_the_truth(p):
    truth = random.Random(1).randbytes(0x10000)
    noise = Noise()
    for address in range(0, len(truth), 0x1000):
        result = confirm(noisy_reader(truth, p, address), address, 0x1000, 2, noise)
        assert result.resolved and result.data == truth[address:address + 0x1000]
    assert (noise.flips > 0) == (p > 0)


def test_the_agreement_asked_for_grows_with_the_noise_seen():
    assert [Noise(10 ** 9, int(p * 10 ** 9)).agreeing(2) for p in (0, 1e-6, 1e-5, 1e-3, 1e-2)] == [2, 2, 3, 4, 5]
    assert Noise(10 ** 9, 10 ** 7).agreeing(1) == 1          # --reads 1: nothing is confirmed
    assert Noise().agreeing(4) == 4                           # --reads raises the floor


def test_a_cell_that_never_reads_the_same_is_not_kept():
    truth = bytes(0x1000)
    reads = iter(range(1, 256))

    def unstable(ranges):  # noqa: ANN001, ANN202
        out = []
        for a, n in ranges:
            chunk = bytearray(truth[a:a + n])
            if a <= 0x123 < a + n:
                chunk[0x123 - a] = next(reads)      # a different value on every read
            out.append(bytes(chunk))
        return out

    result = confirm(unstable, 0, 0x1000, 2)
    assert not result.resolved and result.unsettled == [0x123]
    assert result.reads == 2 + 6                             # the bound: k + 6 reads, then given up


def test_a_whole_read_path_votes_per_unit():
    truth = random.Random(2).randbytes(0x8000)
    read = noisy_reader(truth, 1e-3, 5)
    passes = []

    def whole() -> bytes:
        passes.append(1)
        return read([(0, len(truth))])[0]

    units = confirm_whole(whole, len(truth), 0x1000, 2)
    assert b"".join(u.data for u in units) == truth and all(u.resolved for u in units)
    assert len(passes) >= 3 and any(u.differing for u in units)


# -- through the CLI -----------------------------------------------------------------------------

@pytest.mark.slow   # a long scenario: CI runs it (pytest -m slow)
def test_a_dump_of_a_noisy_board_is_the_flash_and_every_disagreement_is_recorded(cli, make_board, db, tmp_path):
    board = make_board(transport="ideal", faults=["read-flip=1e-2"])
    out = tmp_path / "dump.bin"
    r = cli("dump", out, "--board", f"sim:{board}")
    assert r.code == 0, r.err
    assert out.read_bytes() == as_read(board)
    assert "reads of this board disagreed" in r.out
    run_id = last_run(cli)["run_id"]
    recorded = rows(db, "SELECT address, purpose, reads, differing, resolved, detail FROM read_disagreements "
                        "WHERE run_id = ?", run_id)
    assert len([x for x in recorded if x[1] == "dump"]) == 512 and all(x[4] == 1 for x in recorded)
    address, _, reads, differing, _, detail = recorded[-1]
    assert reads >= 3 and differing >= 1
    first = json.loads(detail)["bytes"][0]
    assert int(first[0], 16) // 0x1000 * 0x1000 == address and sum(first[1].values()) >= 3
    report = json.loads(cli("report", run_id, "--format", "json").out)
    assert report["reads"]["by_purpose"]["dump"] == {"reads": 512, "unresolved": 0}
    assert report["reads"]["unresolved_reads"] == 0
    text = cli("report", run_id).out
    assert "reads      2 agreeing reads" in text and "READS DISAGREED (" in text and "dump 512" in text


@pytest.mark.slow
def test_reads_1_opts_out_and_says_so(cli, make_board, db, tmp_path):
    board = make_board(transport="ideal", faults=["read-flip=1e-3"])
    out = tmp_path / "dump.bin"
    assert cli("dump", out, "--reads", "1", "--board", f"sim:{board}").code == 0
    assert out.read_bytes() != as_read(board)                 # what confirmation is for
    run_id = last_run(cli)["run_id"]
    assert json.loads(rows(db, "SELECT arguments FROM runs WHERE run_id = ?", run_id)[0][0])["reads"] == 1
    report = json.loads(cli("report", run_id, "--format", "json").out)
    assert report["summary"]["reads"]["confirmed"] is False and report["reads"]["confirmed"] is False
    assert "reads      1 read per byte: kept bytes are NOT confirmed (--reads 1)" in cli("report", run_id).out
    assert cli("dump", out, "--reads", "0", "--board", f"sim:{board}").code == 2


@pytest.mark.slow
def test_a_dump_whose_reads_never_agree_fails_naming_the_unit_and_writes_nothing(cli, make_board, db, tmp_path):
    board = make_board(transport="ideal", faults=["read-flip=0.06"])   # so noisy that a byte stays disputed
    out = tmp_path / "dump.bin"
    r = cli("dump", out, "--board", f"sim:{board}")
    assert r.code == 1
    errors = [line for line in r.err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "do not agree" in errors[0], r.err
    assert not out.exists() and not list(tmp_path.glob(".dump.bin*"))
    (address, purpose, detail), = rows(db, "SELECT address, purpose, detail FROM read_disagreements "
                                           "WHERE resolved = 0")
    assert purpose == "dump" and f"error: reads of unit {address:#08x} (dump) do not agree" in errors[0]
    assert json.loads(detail)["unsettled"]


def test_read_output_of_a_noisy_board(cli, make_board, tmp_path):
    board = make_board(transport="ideal", faults=["read-flip=1e-2"])
    out = tmp_path / "part.bin"
    r = cli("read", 0x1F000, 0x3000, "-o", out, "--board", f"sim:{board}")
    assert r.code == 0 and "disagreed" in r.out, r.err
    assert out.read_bytes() == as_read(board)[0x1F000:0x22000]


@pytest.mark.slow
def test_verify_of_a_noisy_board_passes_and_a_real_difference_still_fails(cli, make_board, tmp_path):
    board = make_board(transport="ideal", faults=["read-flip=1e-3"])
    image = tmp_path / "image.bin"
    image.write_bytes(as_read(board))
    r = cli("verify", image, "--board", f"sim:{board}")
    assert r.code == 0 and "flash equals the image" in r.out, r.err
    wrong = bytearray(as_read(board))
    wrong[0x54321] ^= 0x10
    image.write_bytes(wrong)
    r = cli("verify", image, "--board", f"sim:{board}")
    assert r.code == 1 and "verify mismatch at 0x054321" in r.err


@pytest.mark.slow   # a long scenario: CI runs it (pytest -m slow)
def test_a_flash_on_a_noisy_board_keeps_the_true_backup(cli, make_board, db, image, tmp_path):
    img = image.read_bytes()
    content = bytearray(img)
    content[0x20000:0x30000] = bytes(0x10000)
    board = make_board(content=bytes(content), transport="ideal", faults=["read-flip=1e-4"])
    r = cli("flash", image, "--yes", "--board", f"sim:{board}")
    assert r.code == 0, r.err
    assert flash_content(board) == img
    run_id = last_run(cli)["run_id"]
    units = rows(db, "SELECT address, sha256, data FROM backup_units WHERE run_id = ? ORDER BY address", run_id)
    assert b"".join(u[2] for u in units) == bytes(content)
    assert all(hashlib.sha256(u[2]).hexdigest() == u[1] for u in units)
    (sha, path), = rows(db, "SELECT sha256, path FROM backups WHERE run_id = ?", run_id)
    assert Path(path).read_bytes() == bytes(content) and sha == hashlib.sha256(content).hexdigest()


@pytest.mark.slow   # a long scenario: CI runs it (pytest -m slow)
def test_an_aperture_dump_reads_the_whole_flash_twice(cli, make_board, tmp_path):
    board = make_board()
    out = tmp_path / "dump.bin"
    assert cli("dump", out, "--via", "aperture", "--board", f"sim:{board}").code == 0
    with Board(board) as b:
        reads = b.stats()["reg_reads"]
    assert out.read_bytes() == flash_content(board)
    assert 3 * 0x200000 // 4 > reads >= 2 * 0x200000 // 4      # one ROM_DATA read per dword, twice


@pytest.mark.slow
def test_an_aperture_dump_of_a_noisy_board_is_the_flash(cli, make_board, tmp_path):
    board = make_board(faults=["read-flip=1e-4"])
    out = tmp_path / "dump.bin"
    r = cli("dump", out, "--via", "aperture", "--board", f"sim:{board}")
    assert r.code == 0, r.err
    assert out.read_bytes() == as_read(board) and "disagreed" in r.out
