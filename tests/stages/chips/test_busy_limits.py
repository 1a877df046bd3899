"""Busy waits end on evidence: the limit is the datasheet maximum with a stated margin
(spinor.BUSY_MARGIN), a chip slower than that is reported with its measured time once the
operation is over (so the unit is whole and `resume` finishes it), and a board's measured
maxima raise the limit for that board."""
from __future__ import annotations

import json
import re

from amdflash.stages.drivers.flash import chips
from amdflash.stages.drivers.flash.spinor import BUSY_MARGIN
from amdflash.stages.sim.synth import PART_KEY
from tests.pipeline.engine.conftest import flash_content

MAX_4K = chips.GD25LQ16E.erase_type(0x1000).maximum        # 300 ms, the one confirmed figure


def slow_board(make_board, seconds: float):
    """A GD25LQ16E whose 4 KiB erases take `seconds` (a calibrated board, as from a hardware report)."""
    return make_board(content=bytes(0x200000), transport="pcie", calibration={"busy": {"0x20": seconds}})


def test_a_chip_slower_than_the_maximum_but_within_the_margin_is_flashed(cli, make_board, image):
    """1.5 x the 4 KiB erase maximum: a chip the datasheet's own tolerance may allow."""
    assert BUSY_MARGIN > 1.5
    board = slow_board(make_board, 1.5 * MAX_4K)
    r = cli("flash", image, "--yes", "--expect-part", PART_KEY, "--sector-count", "4", "--board", f"sim:{board}")
    assert r.code == 0, r.err
    assert flash_content(board)[:0x4000] == image.read_bytes()[:0x4000]


def test_a_chip_slower_than_the_limit_is_reported_with_its_time_and_resume_finishes(cli, make_board, image):
    """3 x the maximum: over the limit. The erase is waited out and reported with its time;
    the unit is whole (erased), so resume has only its pages left and finishes."""
    board = slow_board(make_board, 3 * MAX_4K)
    r = cli("flash", image, "--yes", "--expect-part", PART_KEY, "--sector-count", "1", "--board", f"sim:{board}")
    assert r.code == 1, r.err
    took = re.search(r"the 4 KiB erase at 0x000000 took (\d+\.\d+) s", r.err)
    # Measured by polling ever sparser past the limit: within 5 % of the chip's time, never under it.
    assert took and 3 * MAX_4K <= float(took.group(1)) < 3 * MAX_4K * 1.05, r.err
    assert "slower than its datasheet" in r.err and f"datasheet maximum {MAX_4K:g} s × {BUSY_MARGIN:g}" in r.err
    assert flash_content(board)[:0x1000] == b"\xff" * 0x1000          # the erase did finish
    run_id = json.loads(cli("runs", "--format", "json").out)[-1]["run_id"]
    resumed = cli("resume", run_id, "--board", f"sim:{board}", "--yes")
    assert resumed.code == 0, resumed.err
    assert flash_content(board)[:0x1000] == image.read_bytes()[:0x1000]
