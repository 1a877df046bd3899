"""A board's measured busy maxima raise the driver's limit for that board (spinor.busy_limits)."""
from __future__ import annotations

import pytest

from amdflash.stages.flash.spinor import ChipTooSlow


def test_a_boards_measured_maximum_raises_its_limit(open_board):
    """The hardware report measured this board's 4 KiB erase at 0.7 s: that board's limit is
    0.7 s x the margin, and a 0.9 s erase passes; without it the same erase is too slow."""
    o = open_board(content=bytes(0x200000), transport="pcie", calibration={"busy": {"0x20": 0.9}})
    with o.engine:
        o.nor.identify()
        with pytest.raises(ChipTooSlow, match=r"took 0\.9\d\d s"):
            o.nor.erase(0x0, 0x1000)
        o.nor.busy_limits = {0x20: 0.7}
        o.nor.erase(0x1000, 0x1000)
        assert o.nor.read(0x1000, 0x1000) == b"\xff" * 0x1000
