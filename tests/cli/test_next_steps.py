"""Every way a board command can end badly says what state the board is in and what to do
next — and the run's end is on record (issue: "every run ends with a true status")."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from amdflash.stages.transport.sim.synth import synthetic_ifwi


def first_differing_bit(image: bytes, start: int) -> int:
    return next(a for a in range(start, len(image)) if image[a] & 0x01 == 0)


def last_run(amdflash) -> dict:  # noqa: ANN001
    return json.loads(amdflash("runs", "--format", "json").out)[-1]


def test_a_flash_that_fails_verify_says_what_is_half_written_and_how_back(amdflash, make_board, image, tmp_path):
    img = image.read_bytes()
    stuck = first_differing_bit(img, 0x100000)
    board = make_board(transport="ideal", faults=[f"stuck-bit={stuck:#x}:0"])
    r = amdflash("--no-progress", "flash", image, "--yes", "--force", "--board", f"sim:{board}")
    assert r.code == 1
    run = last_run(amdflash)
    error, advice = r.err_lines[-2], r.err_lines[-1]
    assert error.startswith("error: verify failed at") and f"(run {run['run_id']}, failed)" in error, r.err
    assert advice.startswith("  next: the flash is partly written: ") and "failed verify" in advice, r.err
    backup = next(Path(tmp_path).glob("**/backups/*.bin"))
    assert f"The original content is backup {backup.resolve()}" in advice
    assert f"amdflash flash {backup.resolve()} --board sim:{board} --yes --force" in advice
    assert f"amdflash resume {run['run_id']} --board sim:{board} --yes" in advice
    assert run["status"] == "failed"


def _transfers(board: Path) -> int:
    stats = json.loads(subprocess.run([sys.executable, "-m", "amdflash", "sim", "stats", str(board)],
                                      capture_output=True, text=True, check=True).stdout)
    return int(stats["control_transfers"] + stats["bulk_transfers"])


def test_a_link_lost_mid_flash_says_the_same(amdflash, make_board, image, monkeypatch):
    argv = ("--no-progress", "flash", image, "--yes", "--force", "--sector-count", "32", "--board", "usb:0")
    clean = make_board(content="blank", transport="ideal", seed=7)
    monkeypatch.setenv("AMDFLASH_SIM_USB", str(clean))
    assert amdflash(*argv).code == 0
    whole = _transfers(clean)
    # The same board and job, its bridge gone near the end (while units are written and verified).
    board = make_board(content="blank", transport="ideal", seed=7,
                       faults=[f"usb-disconnect-after={whole * 19 // 20}"])
    monkeypatch.setenv("AMDFLASH_SIM_USB", str(board))
    r = amdflash(*argv)
    assert r.code == 1, r.err
    run = last_run(amdflash)
    assert "disconnected" in r.err and run["status"] == "failed", r.err
    assert "  next: the flash is partly written" in r.err, r.err
    assert f"amdflash resume {run['run_id']} --board usb:0 --yes" in r.err


def test_ifwi_all_that_fails_says_a_power_cycle_is_needed(amdflash, make_board, tmp_path):
    image = tmp_path / "ifwi.bin"
    image.write_bytes(synthetic_ifwi(3))
    board = make_board(transport="ideal", faults=["psp-error=0x9:0xC"])
    r = amdflash("--no-progress", "ifwi-all", image, "--yes", "--board", f"sim:{board}")
    assert r.code == 1, r.err
    assert "  next: the PSP bootloader may hold a partial stream: power the board off and on" in r.err, r.err
    assert "amdflash sim power-cycle" in r.err


def test_info_after_a_killed_flash_names_the_unfinished_run_and_the_resume(amdflash, make_board, image):
    board = make_board(content="blank", transport="ideal", faults=["kill-after-writes=30000"])
    killed = subprocess.run([sys.executable, "-m", "amdflash", "-q", "flash", str(image), "--yes", "--force",
                             "--board", f"sim:{board}"], capture_output=True, text=True, env=dict(os.environ))
    assert killed.returncode != 0
    run = last_run(amdflash)
    r = amdflash("info", "--board", f"sim:{board}")
    assert r.code == 0, r.err
    assert (f"unfinished flash {run['run_id']} on this board" in r.out
            and f"amdflash resume {run['run_id']} --board sim:{board} --yes" in r.out), r.out


@pytest.mark.slow   # a long scenario: CI runs it (pytest -m slow)
def test_resume_after_the_image_moved_suggests_naming_it(amdflash, make_board, image, tmp_path):
    board = make_board(content="blank", transport="ideal", faults=["kill-after-writes=30000"])
    subprocess.run([sys.executable, "-m", "amdflash", "-q", "flash", str(image), "--yes", "--force",
                    "--board", f"sim:{board}"], capture_output=True, text=True, env=dict(os.environ))
    run = last_run(amdflash)["run_id"]
    moved = tmp_path / "moved.bin"
    image.rename(moved)
    r = amdflash("resume", "--yes", "--board", f"sim:{board}")
    assert r.code == 2 and f"amdflash resume {run} --image FILE --yes" in r.err, r.err
    assert amdflash("resume", "--yes", "--image", moved, "--board", f"sim:{board}").code == 0


# -- a full disk --------------------------------------------------------------------------------------

@pytest.fixture
def small_disk(tmp_path):
    """A file system of a few MiB of its own (tmpfs; needs root)."""
    where = tmp_path / "small"
    where.mkdir()

    def mount(mib: int) -> Path:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m", "tmpfs", str(where)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs here ({done.stderr.strip()}): needs root")
        return where
    yield mount
    subprocess.run(["umount", str(where)], capture_output=True)


def test_a_nearly_full_disk_refuses_before_the_run_naming_the_database(amdflash, make_board, small_disk):
    where = small_disk(6)
    r = amdflash("info", "--board", f"sim:{make_board(transport='ideal')}", "--db", where / "audit.sqlite")
    assert r.code == 2 and f"audit database {where / 'audit.sqlite'}: the file system has" in r.err, r.err


def test_a_disk_that_fills_during_a_flash_fails_the_run_on_record(amdflash, make_board, image, small_disk):
    where = small_disk(9)        # 8 MiB to start with; the backup and the rows of a dense flash eat the rest
    db = where / "audit.sqlite"
    board = make_board(transport="ideal")           # other synthetic content: every unit is rewritten
    r = amdflash("--no-progress", "flash", image, "--yes", "--force", "--board", f"sim:{board}", "--db", db)
    assert r.code == 1, r.err
    assert f"audit database {db}: the file system has" in r.err and "free some space" in r.err, r.err
    [run] = json.loads(amdflash("runs", "--format", "json", "--db", db).out)
    assert run["status"] == "failed"
    assert "  next: " in r.err and f"amdflash resume {run['run_id']}" in r.err


def test_sim_power_cycle_restarts_the_bootloader_after_ifwi_all(amdflash, make_board, tmp_path):
    image = tmp_path / "ifwi.bin"
    image.write_bytes(synthetic_ifwi(3))
    board = make_board(transport="ideal")
    assert amdflash("--no-progress", "ifwi-all", image, "--yes", "--board", f"sim:{board}").code == 0
    r = amdflash("probe", "--board", f"sim:{board}")
    assert "error 0x11" in r.out and "amdflash sim power-cycle" in r.out, r.out
    r = amdflash("sim", "power-cycle", board)
    assert r.code == 0, r.err
    r = amdflash("probe", "--board", f"sim:{board}")
    assert "the bootloader requests item 0x01, phase 1" in r.out and "power-cycle" not in r.out, r.out


def test_sim_power_cycle_brings_back_a_chip_left_in_deep_power_down(amdflash, make_board):
    from amdflash.stages.transport.sim import Board

    board = make_board(transport="ideal")
    with Board(board) as b:
        b.chip.transaction(b"\xb9", 0, b.clock.now())       # deep power-down: only ABh is heard
    r = amdflash("info", "--board", f"sim:{board}")
    assert r.code == 1 and "ff ff ff" in r.err, r.err
    assert amdflash("sim", "power-cycle", board).code == 0
    assert amdflash("info", "--board", f"sim:{board}").code == 0


def test_sim_power_cycle_waits_for_a_job(amdflash, make_board):
    from amdflash.stages.transport.lock import sim_lock

    board = make_board(transport="ideal")
    with sim_lock(board):
        r = amdflash("sim", "power-cycle", board)
    assert r.code == 2 and "board busy" in r.err
