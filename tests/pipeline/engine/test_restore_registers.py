"""Registers always go back to the truth: the values a run found before it changed anything.

A run whose host is killed, or whose link is lost, cannot put its registers back. The next
run on the same board — of any command — puts back the values that run recorded, says so,
and records it; `amdflash restore` does only that.
"""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from amdflash.stages.drivers.navi31 import regs as R
from amdflash.stages.restore import RESTORABLE
from amdflash.stages.sim import Board
from tests.pipeline.engine.conftest import ROOT


@pytest.fixture
def cli(cli_shown):
    """What the operator sees: these tests read what a run says on success."""
    return cli_shown


def registers(board: Path) -> dict[int, int]:
    with Board(board) as b:
        return {r: b.get32(r) for r in RESTORABLE}


def set_fault(cli, board: Path, *specs: str) -> None:  # noqa: ANN001
    assert cli("sim", "fault", board, "--clear", *specs).code == 0


def killed(args: list[object], db: Path, extra_env: dict[str, str] | None = None) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AMDFLASH_DB": str(db), **(extra_env or {})}
    p = subprocess.run([sys.executable, "-m", "amdflash.pipeline.cli", "--no-progress", *map(str, args)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == -signal.SIGKILL, p.stderr


def killed_dump(cli, board: Path, db: Path, tmp_path: Path) -> str:  # noqa: ANN001
    """A dump whose host dies with the ROM_SW engine configured; returns its run id."""
    set_fault(cli, board, "kill-after-writes=3000")
    killed(["dump", tmp_path / "d.bin", "--board", f"sim:{board}"], db)
    return runs(cli)[-1]["run_id"]


def stages(db: Path, run_id: str, name: str) -> list[tuple[str, str]]:
    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT event, detail FROM stages WHERE run_id = ? AND stage = ? ORDER BY seq",
                           [run_id, name]).fetchall()
    finally:
        con.close()


def runs(cli) -> list[dict]:  # noqa: ANN001
    return json.loads(cli("runs", "--format", "json").out)


def test_a_killed_dump_is_put_back_by_the_next_run_of_any_command(cli, make_board, db, tmp_path):
    board = make_board(transport="ideal")
    before = registers(board)
    dead = killed_dump(cli, board, db, tmp_path)
    assert registers(board) != before                    # the engine was configured when the host died
    r = cli("probe", "--board", f"sim:{board}")          # touches only the PSP mailbox itself
    assert r.code == 0, r.err
    assert f"put back the registers run {dead} left changed" in r.out and "host was killed" in r.out
    assert registers(board) == before
    probe = runs(cli)[-1]["run_id"]
    (event, detail), = [s for s in stages(db, probe, "restore_stranded") if s[0] == "end"]
    assert json.loads(detail)["run"] == dead and "GPIOPAD_MASK" in json.loads(detail)["put_back"]
    # Once put back, the next run finds nothing to do.
    r = cli("info", "--board", f"sim:{board}")
    assert r.code == 0 and "put back" not in r.out
    assert cli("audit", "verify").code == 0


def test_restore_does_only_that(cli, make_board, db, tmp_path):
    board = make_board(transport="ideal")
    before = registers(board)
    r = cli("restore", "--board", f"sim:{board}")
    assert r.code == 0 and "nothing to put back" in r.out
    set_fault(cli, board, "kill-after-writes=2000")
    image = tmp_path / "image.bin"
    image.write_bytes(Path(board / "flash.bin").read_bytes())
    killed(["verify", image, "--board", f"sim:{board}"], db)
    with Board(board) as b:
        spi_before = b.stats()["spi_transactions"]
    r = cli("restore", "--board", f"sim:{board}")
    assert r.code == 0 and "put back the registers" in r.out, r.err
    assert registers(board) == before
    with Board(board) as b:
        assert b.stats()["spi_transactions"] == spi_before   # no SPI traffic: registers only
    assert runs(cli)[-1]["command"] == "restore" and runs(cli)[-1]["status"] == "succeeded"


def test_a_lost_link_names_the_registers_left_changed_and_the_next_run_puts_them_back(cli, make_board, db,
                                                                                        monkeypatch, tmp_path):
    from amdflash.stages.transport import discovery

    board = make_board(transport="ideal", faults=["usb-disconnect-after=30000"])
    before = registers(board)
    monkeypatch.setenv(discovery.ENV_SIM_USB, str(board))
    r = cli("dump", tmp_path / "d.bin", "--board", "usb")
    assert r.code == 1
    error, = [line for line in r.err.splitlines() if line.startswith("error:")]
    assert "disconnected" in error and "registers not put back" in error
    for name in ("ROM_CNTL", "PAGE_MIRROR_CNTL", "GPIOPAD_MASK", "GPIOPAD_A", "GPIOPAD_EN"):
        assert f"{name}=" in error
    assert "the next amdflash run on this board puts them back" in error, error
    assert f"amdflash --db {os.environ['AMDFLASH_DB']} restore --board usb:" in error, error
    assert registers(board) != before
    r = cli("restore", "--board", "usb")                 # the bridge is back (re-plugged)
    assert r.code == 0 and "put back the registers" in r.out and "failed without putting them back" in r.out
    assert registers(board) == before


def test_a_run_killed_while_putting_back_leaves_the_truth_to_the_next(cli, make_board, db, tmp_path):
    board = make_board(transport="ideal")
    before = registers(board)
    first = killed_dump(cli, board, db, tmp_path)
    set_fault(cli, board, "kill-after-writes=3")               # dies on its 3rd write: mid put-back
    killed(["info", "--board", f"sim:{board}"], db)
    set_fault(cli, board)
    r = cli("info", "--board", f"sim:{board}")
    assert r.code == 0 and f"run {first} left changed" in r.out, r.out
    assert registers(board) == before


def test_a_board_reset_since_needs_nothing_and_foreign_changes_are_left_alone(cli, make_board, db, tmp_path):
    board = make_board(transport="ideal")
    before = registers(board)
    killed_dump(cli, board, db, tmp_path)
    with Board(board) as b:                               # as after a power cycle
        for reg, value in before.items():
            b.set32(reg, value)
    r = cli("restore", "--board", f"sim:{board}")
    assert r.code == 0 and "registers already as found" in r.out
    killed_dump(cli, board, db, tmp_path)
    with Board(board) as b:                               # something else set the board up since
        b.set32(R.GPIOPAD_A, b.get32(R.GPIOPAD_A) | 0x1)
        left = {r: b.get32(r) for r in RESTORABLE}
    r = cli("restore", "--board", f"sim:{board}")
    assert r.code == 0 and "changed by something else" in r.out and "GPIOPAD_A" in r.out
    assert registers(board) == left                        # nothing written over it


def test_a_different_flash_behind_the_same_bridge_is_warned_about(cli, make_board, db, tmp_path):
    board = make_board(transport="ideal")
    killed_dump(cli, board, db, tmp_path)
    config = json.loads((board / "board.json").read_text())
    config["unique_id"] = "00112233445566778899aabbccddeeff"     # another flash on the same board serial
    (board / "board.json").write_text(json.dumps(config))
    r = cli("info", "--board", f"sim:{board}")
    assert r.code == 0 and "put back the registers" in r.out
    assert "warning: the registers put back were recorded by run" in r.out
