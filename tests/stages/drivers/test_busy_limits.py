"""A board's measured busy maxima raise the driver's limit for that board (spinor.busy_limits)."""
from __future__ import annotations

import pytest

from amdflash.stages.drivers.flash.spinor import ChipTooSlow


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


def test_a_host_late_to_its_status_reads_does_not_make_the_chip_too_slow(open_board):
    """The host is preempted for up to 3 s around each access, far past any erase's limit: the
    chip finished on time, and only a status read sent past the limit that still shows WIP is
    evidence of a slow chip. A wait that merely ends late is no such evidence."""
    import random

    from tests.support.flash_sectors import flash_sectors
    from tests.stages.drivers.test_jitter import PreemptedHost

    o = open_board(content=bytes(0x200000), transport="pcie")
    with o.engine:
        o.nor.identify()
        host = PreemptedHost(o.engine.bar, random.Random(7), 3.0)
        o.engine.bar = host
        image = bytes(range(256)) * (0x200000 // 256)
        flash_sectors(o.nor, image, start_sector=16, sector_count=4)
        assert host.jumps > 0
        assert o.nor.read(16 * 0x1000, 4 * 0x1000) == image[16 * 0x1000:20 * 0x1000]
