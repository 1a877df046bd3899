"""`amdflash replay`: a recorded run re-applied to an emulated board started from its backup."""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from amdflash.stages.drivers.flash.protection import decode
from amdflash.store.queries import open_readonly
from amdflash.store.replay import build_board, replay
from tests.store.conftest import STUCK_UNIT, Recorded, amdflash


@pytest.fixture
def cli(recorded: Recorded, capsys: pytest.CaptureFixture[str]):  # noqa: ANN201
    def run(*args: object) -> tuple[int, str, str]:
        code = amdflash(recorded.db, "replay", *args)
        out, err = capsys.readouterr()
        return code, out, err
    return run


def replay_json(cli, *args: object) -> tuple[int, dict]:  # noqa: ANN001
    code, out, err = cli(*args, "--format", "json")
    assert code in (0, 1), err
    return code, json.loads(out)


def writes_before(recorded: Recorded, run_id: str, seq: int) -> tuple[int, int]:
    """(n, seq) of the run's last register write recorded before `seq`."""
    con = sqlite3.connect(recorded.db)
    try:
        return con.execute("SELECT n, seq FROM register_writes WHERE run_id = ? AND seq < ? ORDER BY seq DESC, n DESC "
                           "LIMIT 1", [run_id, seq]).fetchone()
    finally:
        con.close()


def test_a_clean_run_replays_identically(recorded: Recorded, cli) -> None:  # noqa: ANN001
    code, r = replay_json(cli, recorded.runs["clean"])
    assert code == 0 and r["identical"] and r["divergences"] == []
    assert r["writes_applied"] == r["writes_total"] > 10_000
    assert r["units_backed_up"] == 512 and r["verifies_excluded"] == 0
    assert r["verifies_checked"] == r["verifies_matching"] == 512      # 495 skipped + 17 written, 1 attempt each
    assert r["status_registers"] == [0x00, 0x40, 0x00]                 # CMP set as identified
    assert r["result_matches"] is True and r["replay_sha256"] == r["result_sha256"]


def test_a_stuck_bit_diverges_exactly_at_its_address(recorded: Recorded, cli) -> None:  # noqa: ANN001
    run = recorded.runs["stuck"]
    code, r = replay_json(cli, run)
    assert code == 1 and not r["identical"]
    first = r["divergences"][0]
    a = recorded.stuck_address
    assert (first["what"], first["unit"], first["address"], first["attempt"]) == ("verify", STUCK_UNIT, a, 1)
    # The hardware read the stuck 1; the replay board, which has no stuck bit, holds the image byte.
    assert first["recorded_byte"] == recorded.image_bytes[a] | 1
    assert first["replayed_byte"] == recorded.image_bytes[a]
    assert (first["after_write_n"], first["after_write_seq"]) == writes_before(recorded, run, first["verify_seq"])
    # Every retry diverges the same way; nothing before the stuck unit does.
    assert [(d["unit"], d["attempt"]) for d in r["divergences"]] == [(STUCK_UNIT, n) for n in (1, 2, 3)]
    assert r["verifies_matching"] == r["verifies_checked"] - 3


@pytest.mark.slow
def test_divergence_in_text(recorded: Recorded, cli) -> None:  # noqa: ANN001
    code, out, _ = cli(recorded.runs["stuck"])
    a = recorded.stuck_address
    assert code == 1 and "DIVERGED" in out
    assert f"byte     {a:#08x}: recorded {recorded.image_bytes[a] | 1:#04x}, replayed {recorded.image_bytes[a]:#04x}" \
        in out
    code, out, _ = cli(recorded.runs["clean"])
    assert code == 0 and "identical" in out and "DIVERGED" not in out


@pytest.mark.slow   # a long scenario: CI runs it (pytest -m slow)
def test_until_stops_after_that_write(recorded: Recorded, cli) -> None:  # noqa: ANN001
    run = recorded.runs["stuck"]
    _, full = replay_json(cli, run)
    n = full["divergences"][0]["after_write_n"]
    # Up to the last write before the failed verify row, that row is not reached yet...
    code, r = replay_json(cli, run, "--until", n - 1)
    assert code == 0 and r["writes_applied"] == n - 1 and r["identical"]
    assert r["verifies_checked"] < full["verifies_checked"] and r["result_matches"] is None
    assert any("stopped after register write" in note for note in r["notes"])
    # ...one write later it is.
    code, r = replay_json(cli, run, "--until", n)
    assert code == 1 and r["writes_applied"] == n and len(r["divergences"]) == 1
    assert r["divergences"][0]["address"] == recorded.stuck_address


def test_until_beyond_the_end_is_a_full_replay(recorded: Recorded, cli) -> None:  # noqa: ANN001
    code, r = replay_json(cli, recorded.runs["protected"], "--until", 10**9)
    assert code == 0 and r["writes_applied"] == r["writes_total"]
    # A sector-range run backs up 16 units: the rest stay 0xFF and the whole-flash result is not compared.
    assert r["units_backed_up"] == 16 and r["result_sha256"] is None and r["result_matches"] is None


def test_refusals(recorded: Recorded, cli, tmp_path: Path) -> None:  # noqa: ANN001
    code, _, err = cli("no-such-run")
    assert code == 2 and "no run 'no-such-run'" in err
    code, _, err = cli(recorded.runs["info"])
    assert code == 2 and "recorded no backup" in err
    other = tmp_path / "other.bin"
    other.write_bytes(b"\xff" * 0x200000)
    code, _, err = cli(recorded.runs["clean"], "--image", other)
    assert code == 2 and "is not the image of run" in err
    code, _, err = cli(recorded.runs["clean"], "--until", "0")   # a usage error: one line, exit 2
    assert code == 2 and "register writes are numbered from 1" in err and "Traceback" not in err
    assert amdflash(tmp_path / "missing.sqlite", "replay", recorded.runs["clean"]) == 2


def test_help_says_it_writes_only_a_temporary_board(cli) -> None:  # noqa: ANN001
    from amdflash.pipeline.cli.main import build_parser

    text = build_parser()._subparsers._group_actions[0].choices["replay"].format_help()  # noqa: SLF001
    assert "temporary" in text and "--until" in text and "Writes nothing but" in text


def test_without_the_image_a_verified_unit_is_compared_by_hash(recorded: Recorded) -> None:
    db = open_readonly(str(recorded.db))
    try:
        r = replay(db, recorded.runs["stuck"], image=None)
    finally:
        db.conn.close()
    # The stuck byte is pinned by the record itself: its first mismatch and flash byte.
    assert r.first is not None and r.first.address == recorded.stuck_address
    assert any("image is not available" in note for note in r.notes)


@pytest.mark.parametrize("status", [(0x00, 0x40, 0x00), (0x24, 0x02, 0x60), (0x04, 0x00, 0x00)])
def test_replay_board_holds_the_identified_status_registers(tmp_path: Path, status: tuple[int, int, int]) -> None:
    notes: list[str] = []
    board = build_board(tmp_path / "b", {0: b"\x00" * 0x1000}, status, {0x5A3A8: 0x1234}, notes)
    try:
        chip = board.chip
        got = tuple(chip.transaction(bytes((op,)), 1)[0] for op in (0x05, 0x35, 0x15))
        assert got == status and notes == []
        assert board.get32(0x5A3A8) == 0x1234
        assert board.files.flash[0:0x1000] == b"\x00" * 0x1000 and board.files.flash[0x1000] == 0xFF
        # BP/CMP act: an erase of the top block is refused when they protect it.
        top = 0x1F0000
        board.files.flash[top:top + 4] = b"\x00" * 4
        chip.transaction(b"\x06", 0)
        chip.transaction(bytes((0x20, top >> 16, 0, 0)), 0)
        protected = decode(status[0], status[1]).overlaps(top, 0x1000)
        assert board.files.flash[top] == (0x00 if protected else 0xFF)
    finally:
        board.close()


def test_a_run_whose_host_died_replays_what_was_recorded(recorded: Recorded, capsys) -> None:  # noqa: ANN001
    code = amdflash(recorded.killed_db, "replay", recorded.runs["clean"], "--format", "json")
    r = json.loads(capsys.readouterr().out)
    assert code == 0 and r["identical"] and r["status"] == "running"
    # The whole backup is on record before the first erase, so a death mid-erase finds it complete.
    assert r["writes_applied"] == r["writes_total"] > 0 and r["units_backed_up"] == 512
    assert r["verifies_checked"] > 0 and r["result_matches"] is None
    assert any("recorded no end" in note for note in r["notes"])
