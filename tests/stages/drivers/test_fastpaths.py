"""The driver's fast paths: checked at open, given up per board, never trusted for correctness.

The strict emulated board raises on any access that lands while a transaction runs; the
`unobserved_completions` counter shows any transaction whose done bit was never read
before the engine was touched again. Both stay at zero on every cost profile, including
ones much faster than the asm24 bridge the driver's waits were tuned on.
"""
from __future__ import annotations

import random
import pytest

from tests.support.flash_sectors import flash_sectors
from amdflash.stages.drivers.flash.spinor import SpiNor
from amdflash.stages.drivers.navi31 import fastpaths
from amdflash.stages.drivers.navi31.fastpaths import VALIDATED, FastPaths, Finding
from amdflash.stages.drivers.navi31.romsw import RomSw, RomSwOptions
from amdflash.stages.sim import SimBar5

SIZE = 0x200000


@pytest.mark.parametrize("profile", ["asm24", "pcie", "ideal"])
def test_every_completion_is_observed_on_every_profile(open_board, profile):
    rng = random.Random(3)
    current, image = rng.randbytes(SIZE), rng.randbytes(SIZE)
    o = open_board(content=current, profile=profile)
    o.engine.open()
    assert all(f.ok for f in o.engine.findings), o.engine.findings
    o.nor.identify()
    assert o.nor.read(0, 0x20000) == current[:0x20000]
    flash_sectors(o.nor, image, start_sector=16, sector_count=20)
    assert o.nor.read(0x10000, 20 * 0x1000) == image[0x10000:0x10000 + 20 * 0x1000]
    stats = o.board.stats()
    assert stats["protocol_violations"] == 0 and stats["unobserved_completions"] == 0
    assert stats["ignored_while_busy"] == 0        # nothing but status reads reached the busy chip
    assert o.engine.completions == o.engine.transactions


def test_all_fast_paths_pass_their_check_on_a_faithful_board(open_board):
    o = open_board()
    o.engine.open()
    names = {f.name for f in o.engine.findings}
    assert names == {"chained RX", "single-TLP register access", "status and window in one read",
                     "no CNTL clears", "streamed command", "preload", "timed pages"}
    assert all(f.ok for f in o.engine.findings)
    fast = o.engine.fast
    assert fast.chained and fast.single_tlp and fast.combined_read and fast.no_cntl_clears
    assert fast.streamed_command and fast.preload and fast.timed_pages
    assert o.engine.found_running == 0


def test_primed_mode_keeps_the_other_fast_paths(open_board):
    o = open_board(engine={"rx_mode": "primed"})
    o.engine.open()
    assert not o.engine.fast.chained and o.engine.fast.combined_read
    assert "chained RX" not in {f.name for f in o.engine.findings}


class Scripted:
    """A stand-in engine for the comparison logic: what `sample` returns under each setting."""

    def __init__(self, wrong: set[str], flaky_once: bool = False):
        self.fast = VALIDATED
        self.wrong, self.flaky_once = wrong, flaky_once

    def read_chain(self, requests):  # noqa: ANN001, ANN201
        data = b"good" if not any(getattr(self.fast, n) for n in self.wrong) else b"bad!"
        if self.flaky_once and self.fast != VALIDATED:
            self.flaky_once, data = False, b"flip"
        return iter([data])


@pytest.mark.parametrize("wrong", sorted(fastpaths.COMPARED))
def test_a_fast_path_that_disagrees_is_turned_off_alone(wrong):
    engine = Scripted({wrong})
    findings: list[Finding] = []
    accepted = fastpaths._compare(engine, b"good", list(fastpaths.COMPARED), findings)  # type: ignore[arg-type]
    assert set(accepted) == set(fastpaths.COMPARED) - {wrong}
    off = [f for f in findings if not f.ok]
    assert len(off) == 1 and "disagrees with the validated sequence" in off[0].detail


def test_a_transient_difference_is_compared_once_more():
    engine = Scripted(set(), flaky_once=True)
    findings: list[Finding] = []
    accepted = fastpaths._compare(engine, b"good", list(fastpaths.COMPARED), findings)  # type: ignore[arg-type]
    assert set(accepted) == set(fastpaths.COMPARED) and all(f.ok for f in findings)


class ShortLongReads:
    """A transport whose streamed reads longer than one dword come back wrong from STATUS on:
    the combined status-and-window read cannot be trusted on it."""

    def __init__(self, bar: SimBar5):
        self.bar, self.clock, self.identity = bar, bar.clock, bar.identity

    def read32(self, offset: int) -> int:
        return self.bar.read32(offset)

    def write32(self, offset: int, value: int) -> None:
        self.bar.write32(offset, value)

    def read_block(self, offset: int, size: int) -> bytes:
        data = self.bar.read_block(offset, size)
        if offset == 0x5A3A4 and size > 16:
            return data[:12] + bytes(reversed(data[12:]))
        return data

    def write_block(self, offset: int, data: bytes) -> None:
        self.bar.write_block(offset, data)

    def close(self) -> None:
        self.bar.close()


def test_a_board_where_one_read_of_status_and_window_fails_reads_them_apart(make_board):
    image = random.Random(4).randbytes(SIZE)
    bar = ShortLongReads(SimBar5(make_board(content=image)))
    engine = RomSw(bar, RomSwOptions())  # type: ignore[arg-type]
    with engine:
        verdicts = {f.name: f.ok for f in engine.findings}
        assert verdicts["status and window in one read"] is False
        assert verdicts["chained RX"] and verdicts["single-TLP register access"]
        assert not engine.fast.combined_read
        nor = SpiNor(engine)
        nor.identify()
        assert nor.read(0x3000, 0x1000) == image[0x3000:0x4000]
    bar.close()


def too_short_a_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver's bound of the SPI time made too short (as if the engine ran four times slower
    than its clock says): reads of STATUS and the window sent after a 256-byte read's 188 µs
    bound / 4 land (100 µs later, asm24) while it still runs."""
    real = RomSw.spi_estimate
    monkeypatch.setattr(RomSw, "spi_estimate", lambda self, wire, margin=True: real(self, wire, margin) / 4)


def test_a_combined_read_that_finds_the_transaction_running_is_taken_again_and_the_path_dropped(
        open_board, monkeypatch):
    """A lenient board counts the spoiled transactions; the driver sees STATUS not done in the
    read, takes the data again, and reads STATUS on its own from then on."""
    image = random.Random(5).randbytes(SIZE)
    too_short_a_bound(monkeypatch)
    o = open_board(content=image, strict=False, engine={"fast": FastPaths(), "self_check": False})
    dropped: list[Finding] = []
    o.engine.on_finding = dropped.append
    o.engine.open()
    o.nor.identify()                    # short transactions: over before their bound anyway
    assert o.nor.read(0, 0x2000) == image[:0x2000]
    assert o.board.stats()["protocol_violations"] >= 1 and o.engine.found_running == 1
    assert not o.engine.fast.combined_read
    assert [f.name for f in dropped] == ["status and window in one read"] and not dropped[0].ok
    violations = o.board.stats()["protocol_violations"]
    assert o.nor.read(0x2000, 0x1000) == image[0x2000:0x3000]
    assert o.board.stats()["protocol_violations"] == violations


def test_the_self_check_turns_off_a_combined_read_that_found_a_transaction_running(open_board, monkeypatch):
    too_short_a_bound(monkeypatch)
    o = open_board(strict=False)
    o.engine.open()
    verdict = next(f for f in o.engine.findings if f.name == "status and window in one read")
    assert not verdict.ok and "still running" in verdict.detail
    assert not o.engine.fast.combined_read and o.engine.fast.chained


def test_the_same_mistake_on_a_strict_board_fails_loudly(open_board, monkeypatch):
    from amdflash.stages.sim.romsw import ProtocolViolation

    too_short_a_bound(monkeypatch)
    o = open_board(engine={"fast": FastPaths(), "self_check": False})
    o.engine.open()
    o.nor.identify()
    with pytest.raises(ProtocolViolation, match="the data window was read"):
        o.nor.read(0, 0x1000)


def test_a_slow_chip_drops_timed_pages_and_the_retry_programs_checked(open_board):
    """Page programs taking twice their typical time: a write enable sent at the typical time
    finds the chip busy and is ignored, so is its page. The read-back finds it; the retry
    (through program_unit) turns the board to checked programming, which waits for WIP."""
    from amdflash.stages.drivers.flash.planning import plan_unit
    from amdflash.stages.program import program_unit

    image = random.Random(6).randbytes(SIZE)
    o = open_board(content=b"\xff" * SIZE, faults=["slow-busy=2"])
    o.engine.open()
    o.nor.identify()
    assert o.engine.fast.timed_pages
    o.nor.program(0x8000, image[0x8000:0x9000])
    assert o.nor.read(0x8000, 0x1000) != image[0x8000:0x9000]       # pages were dropped

    class Dev:
        nor = o.nor
    o.nor.erase(0x8000, 0x1000)
    unit = plan_unit(0x8000, b"\xff" * 0x1000, image[0x8000:0x9000], 0x100)
    program_unit(Dev, unit, unit.pages)  # type: ignore[arg-type]
    assert not o.engine.fast.timed_pages
    assert o.nor.read(0x8000, 0x1000) == image[0x8000:0x9000]
    assert [f.name for f in o.engine.findings if not f.ok] == ["timed pages"]
