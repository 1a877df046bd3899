"""Through the command line, on strict boards in real-time mode.

A real-time board lives in wall time: whatever the host spends between accesses (Python
work, scheduling) passes on the board too, so its transactions end earlier, relative to
the driver's accesses, than the cost model alone says — as on a real link, where the host
is preempted at any moment. No command may touch a transaction in flight there: the
strict board would fail the run, and its counters must stay at zero.
"""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.support import cli as command_line
from amdflash.stages.sim import Board
from amdflash.stages.sim.synth import synthetic_ifwi
from tests.stages.transport.test_cli import sim_usb_env

SIZE, UNIT = 0x200000, 0x1000


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    monkeypatch.setenv("AMDFLASH_DB", str(tmp_path / "audit.sqlite"))

    def run(*args: object) -> int:
        r = command_line.run("-q", "--no-progress", *args)
        assert r.code == 0, r.err
        return r.code
    return run


def diagnostics(path: Path) -> dict[str, int]:
    board = Board(path)
    try:
        stats = board.stats()
    finally:
        board.close()
    return {k: stats[k] for k in ("protocol_violations", "unobserved_completions")}


CLEAN = {"protocol_violations": 0, "unobserved_completions": 0}


@pytest.mark.slow   # a long scenario: CI runs it (pytest -m slow)
def test_dump_and_verify_on_real_time_boards(cli, make_board, tmp_path):
    image = synthetic_ifwi(31)
    board = make_board(content=image, realtime_scale=0.25)     # a whole dump: ~2 s of wall time
    cli("dump", tmp_path / "dump.bin", "--board", f"sim:{board}")
    assert (tmp_path / "dump.bin").read_bytes() == image
    assert diagnostics(board) == CLEAN
    faster = make_board(content=image, realtime_scale=0.05)
    cli("verify", tmp_path / "dump.bin", "--board", f"sim:{faster}")
    assert diagnostics(faster) == CLEAN


@pytest.mark.parametrize("scale", [0.05, 0.25])
def test_flash_a_range_on_a_real_time_board(cli, make_board, tmp_path, scale):
    rng = random.Random(12)
    current, image = rng.randbytes(SIZE), bytearray(rng.randbytes(SIZE))
    image[:4] = b"\xaa\x55\xaa\x55"
    (tmp_path / "image.bin").write_bytes(image)
    board = make_board(content=current, realtime_scale=scale)
    # Random content: no part number to match, hence --force.
    cli("flash", tmp_path / "image.bin", "--yes", "--force", "--board", f"sim:{board}",
        "--start-sector", "64", "--sector-count", "16")
    flash = (board / "flash.bin").read_bytes()
    assert flash[64 * UNIT:80 * UNIT] == bytes(image[64 * UNIT:80 * UNIT])
    assert flash[:64 * UNIT] == current[:64 * UNIT] and flash[80 * UNIT:] == current[80 * UNIT:]
    assert diagnostics(board) == CLEAN


def test_flash_over_the_emulated_usb_bridge_on_a_real_time_board(cli, make_board, tmp_path, monkeypatch):
    current, image = synthetic_ifwi(41), synthetic_ifwi(42)
    (tmp_path / "image.bin").write_bytes(image)
    board = make_board(content=current, realtime_scale=0.1)
    monkeypatch.setenv(*next(iter(sim_usb_env(board).items())))
    cli("flash", tmp_path / "image.bin", "--yes", "--force", "--board", "usb",
        "--start-sector", "0", "--sector-count", "16")
    assert (board / "flash.bin").read_bytes()[:16 * UNIT] == image[:16 * UNIT]
    assert diagnostics(board) == CLEAN
