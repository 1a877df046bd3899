"""The scratch block of `hardware-report --scratch-sector` is never left erased without a way
back: a failure during the measurement puts the block back at once; a host that dies leaves the
backup (a whole-flash image holding the block) and `info` names the command that writes it."""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from amdflash.stages import measure
from amdflash.stages.sim import Board, create_board

SCRATCH = ("--scratch-sector", "32", "--yes")      # the 64 KiB block at 0x020000, data all through it


def _writes(board) -> int:  # noqa: ANN001
    with Board(board) as b:
        return int(b.stats()["reg_writes"])


@pytest.mark.slow
def test_a_host_killed_mid_scratch_leaves_a_backup_that_info_says_how_to_put_back(amdflash, tmp_path):
    # Register writes of a run without the scratch part, then of one with it, on a like board:
    # the kill lands halfway through the scratch part (erased, partly reprogrammed).
    ref = create_board(tmp_path / "ref", seed=6, transport="ideal")
    assert amdflash("hardware-report", "--board", f"sim:{ref}", "-o", tmp_path / "plain.json").code == 0
    plain = _writes(ref)
    assert amdflash("hardware-report", "--board", f"sim:{ref}", "-o", tmp_path / "full.json", *SCRATCH).code == 0
    scratch = _writes(ref) - 2 * plain
    assert scratch > 1000

    board = create_board(tmp_path / "b", seed=6, transport="ideal",
                         faults=[f"kill-after-writes={plain + scratch // 2}"])
    before = (board / "flash.bin").read_bytes()
    killed = subprocess.run([sys.executable, "-m", "amdflash", "hardware-report", "--board", f"sim:{board}",
                             "-o", str(tmp_path / "my report.json"), *SCRATCH], capture_output=True, text=True,
                            env=dict(os.environ), timeout=300)
    assert killed.returncode == -9, killed.stderr
    after = (board / "flash.bin").read_bytes()
    assert after != before and after[:0x20000] == before[:0x20000] and after[0x30000:] == before[0x30000:]
    backup = tmp_path / "my report.json.block-020000.bin"       # a name the shell must have quoted
    assert backup.read_bytes()[0x20000:0x30000] == before[0x20000:0x30000]

    assert backup.stat().st_mode & 0o777 == 0o600                  # the board's content: the owner's alone

    # A backup replaced since (or gone) is never advised: only the very file the run wrote.
    kept = backup.read_bytes()
    backup.write_bytes(kept[:0x20000] + bytes(0x10000) + kept[0x30000:])
    said = amdflash("info", "--board", f"sim:{board}")
    assert "not the file the run wrote" in said.out and "to put it back" not in said.out, said.out
    backup.write_bytes(kept)

    said = amdflash("info", "--board", f"sim:{board}")
    assert said.code == 0 and "left its scratch block" in said.out, said.out
    # The step names the run's database (here $AMDFLASH_DB), as every step does.
    command = re.search(rf"to put it back: amdflash --db {re.escape(os.environ['AMDFLASH_DB'])} (flash .*--force -- .*)$",
                        said.out, re.M)
    assert command and shlex.split(command.group(1))[-2:] == ["--", str(backup)], said.out
    assert amdflash(*shlex.split(command.group(1))).code == 0
    assert (board / "flash.bin").read_bytes() == before            # byte-identical again
    assert "left its scratch block" not in amdflash("info", "--board", f"sim:{board}").out   # no longer named


@pytest.mark.parametrize("at", [1, 40])   # the 64 KiB erase still running; the first pages programmed
def test_a_failure_during_the_measurement_puts_the_block_back_before_it_is_reported(amdflash, tmp_path,
                                                                                   monkeypatch, at):
    board = create_board(tmp_path / "b", seed=7)          # physical busy times
    before = (board / "flash.bin").read_bytes()
    real, calls = measure.BusyMeter.run, []

    def times_out(self, opcode, address, tx=b"", timeout=30.0):  # noqa: ANN001, ANN202
        calls.append(opcode)
        if len(calls) == at:
            self.engine.command(measure.WREN)
            self.engine.command(opcode, address, 3, tx)           # the chip busy with it as the failure comes
            raise TimeoutError(f"opcode {opcode:#04x} at {address:#08x} still busy after {timeout:g} s")
        return real(self, opcode, address, tx, timeout)

    monkeypatch.setattr(measure.BusyMeter, "run", times_out)
    r = amdflash("hardware-report", "--board", f"sim:{board}", "-o", tmp_path / "r.json", *SCRATCH)
    assert r.code == 1 and "still busy after 30 s" in r.err, r.err
    assert (board / "flash.bin").read_bytes() == before
    assert not list(tmp_path.glob("r.json*"))                      # no report, and the backup is not needed
    run_id = re.search(r"run (\d{8}T\d{6}-[0-9a-f]{8})", r.err + r.out).group(1)
    stages = json.loads(amdflash("report", run_id, "--format", "json").out)["stages"]
    said = [s["detail"] for s in stages if s["stage"] == "measure" and s["event"] == "scratch"]
    assert said[-1].startswith("block 0x020000 restored and read back identical (after: opcode 0x"), said
    assert "left its scratch block" not in amdflash("info", "--board", f"sim:{board}").out
