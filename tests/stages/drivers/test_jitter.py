"""No access lands early, whatever the host's or the link's timing does.

A real host is preempted at any moment, and a real link is sometimes faster and sometimes
slower than the cost model. These tests make the emulated board's time jump at random —
between accesses (the host delayed) and inside them (each access's latency scaled) — on
strict boards, which raise on any access to COMMAND, CNTL or the data window while a
transaction runs. The driver must finish every job with the right bytes, no violation,
and every completion seen.
"""
from __future__ import annotations

import random
from typing import Callable

import pytest

from tests.support.flash_sectors import flash_sectors
from amdflash.stages.drivers.flash.spinor import SpiNor
from amdflash.stages.drivers.navi31.romsw import RomSw, RomSwOptions
from amdflash.stages.sim import SimBar5

SIZE = 0x200000


class PreemptedHost:
    """The `Bar5` of an emulated board whose host is preempted at random: before and after
    each access, the board's clock may jump ahead by up to `most` seconds."""

    def __init__(self, bar: SimBar5, rng: random.Random, most: float):
        self.bar, self.clock, self.identity = bar, bar.clock, bar.identity
        self.rng, self.most = rng, most
        self.jumps = 0

    def _jump(self) -> None:
        if self.rng.random() < 0.5:
            self.jumps += 1
            self.clock.sleep(self.rng.uniform(0, self.most))

    def _around(self, access: Callable[[], object]) -> object:
        self._jump()
        result = access()
        self._jump()
        return result

    def read32(self, offset: int) -> int:
        return self._around(lambda: self.bar.read32(offset))  # type: ignore[return-value]

    def write32(self, offset: int, value: int) -> None:
        self._around(lambda: self.bar.write32(offset, value))

    def read_block(self, offset: int, size: int) -> bytes:
        return self._around(lambda: self.bar.read_block(offset, size))  # type: ignore[return-value]

    def write_block(self, offset: int, data: bytes) -> None:
        self._around(lambda: self.bar.write_block(offset, data))

    def close(self) -> None:
        self.bar.close()


def varying_link(bar: SimBar5, rng: random.Random, slowest: float) -> SimBar5:
    """Every transport cost the board charges (the time to landing, and the rest) scaled by a
    random factor from 0 (a link far faster than the model) to `slowest`."""
    clock = bar.clock
    charge = clock.advance
    clock.advance = lambda seconds: charge(seconds * rng.uniform(0, slowest))  # type: ignore[method-assign]
    return bar


def job(bar, image: bytes, current: bytes) -> RomSw:  # noqa: ANN001 - any Bar5
    """Open (self-checks included), identify, read, flash 8 sectors, read them back."""
    engine = RomSw(bar, RomSwOptions())
    with engine:
        nor = SpiNor(engine)
        nor.identify()
        assert nor.read(0x40000, 0x10000) == current[0x40000:0x50000]
        flash_sectors(nor, image, start_sector=24, sector_count=8)
        assert nor.read(24 * 0x1000, 8 * 0x1000) == image[24 * 0x1000:32 * 0x1000]
    return engine


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_preempted_host_never_touches_a_transaction_in_flight(make_board, seed):
    rng = random.Random(seed)
    current, image = rng.randbytes(SIZE), rng.randbytes(SIZE)
    sim = SimBar5(make_board(content=current))
    host = PreemptedHost(sim, rng, most=400e-6)     # up to two of the bridge's latencies
    try:
        engine = job(host, image, current)
        stats = sim.board.stats()
    finally:
        host.close()
    assert host.jumps > 1000
    assert all(f.ok for f in engine.findings), engine.findings
    assert stats["protocol_violations"] == 0 and stats["unobserved_completions"] == 0
    assert engine.completions == engine.transactions and engine.found_running == 0


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_link_faster_or_slower_than_at_open_never_touches_a_transaction_in_flight(make_board, seed):
    rng = random.Random(seed)
    current, image = rng.randbytes(SIZE), rng.randbytes(SIZE)
    sim = varying_link(SimBar5(make_board(content=current)), rng, slowest=3.0)
    try:
        engine = job(sim, image, current)
        stats = sim.board.stats()
    finally:
        sim.close()
    assert stats["protocol_violations"] == 0 and stats["unobserved_completions"] == 0
    assert engine.completions == engine.transactions and engine.found_running == 0
