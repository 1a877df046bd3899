"""The floors of a job, computed from the cost model: checked against hand arithmetic, and
against the driver, which may come close but never below."""
from __future__ import annotations

import random

import pytest

from tests.support.flash_sectors import flash_sectors
from amdflash.stages.drivers.flash.spinor import SpiNor
from amdflash.stages.drivers.navi31.romsw import RomSw, RomSwOptions
from amdflash.stages.sim import SimBar5
from amdflash.stages.sim.cost import PCIE
from amdflash.stages.confirm import Expectation
from tests.support.floor import (dump_ops, erase_ops, flash_ops, kept_reads_of, physical_floor,
                                program_ops, read_ops, transport_floor, verify_ops)

US = 1e-6
SPI_READ = 1 * US + 8 * 260 * 9 / 100e6          # a 256-byte array read at prescale 8: 188.2 µs


def test_a_read_in_a_long_chain_costs_what_the_rules_leave():
    """Per read: clear STATUS and set COMMAND (two 100 µs single-TLP writes), CNTL (100 µs,
    lands at its end), then a streamed read of STATUS..window that must land after the SPI
    time: sent 88.2 µs after CNTL landed, it lands 100 µs later and takes 100 µs + 268 bytes
    at 1.8 MB/s."""
    per_read = 300 * US + SPI_READ + 100 * US + 268 / 1.8e6
    one_more = transport_floor(read_ops(101)) - transport_floor(read_ops(100))
    assert one_more == pytest.approx(per_read, rel=1e-9)
    assert per_read == pytest.approx(737.1 * US, abs=0.1 * US)
    assert transport_floor(dump_ops()) == pytest.approx(8192 * per_read, rel=2e-4)


def test_the_observed_floor_sends_no_read_before_the_end_it_observes():
    """The same read when the host cannot count on the link's latency: the streamed read is
    sent when the SPI time has passed since CNTL returned, 100 µs later than above."""
    per_read = 300 * US + SPI_READ + 200 * US + 268 / 1.8e6
    one_more = transport_floor(read_ops(101), credit_latency=False) - transport_floor(read_ops(100), credit_latency=False)
    assert one_more == pytest.approx(per_read, rel=1e-9)
    assert per_read == pytest.approx(837.1 * US, abs=0.1 * US)
    # Page programs: the write enable's CNTL goes out when the chip is free, not 100 µs before,
    # and its STATUS read when its SPI time (1.72 µs) has passed, not at once.
    page = transport_floor(program_ops(11), credit_latency=False) - transport_floor(program_ops(10), credit_latency=False)
    write_enable_spi = 1 * US + 8 * 9 / 100e6
    assert page - (transport_floor(program_ops(11)) - transport_floor(program_ops(10))) == \
        pytest.approx(100 * US + write_enable_spi, rel=1e-9)


def test_a_page_program_in_a_run_costs_its_busy_time_and_the_unavoidable_round_trip():
    """Busy (500 µs) and SPI time (188.2 µs) plus, from the write enable landing at the busy
    end to the program landing: the write enable's STATUS read (200 µs), STATUS and COMMAND
    (200 µs), CNTL (100 µs). The page data loads meanwhile, while the previous page programs."""
    one_more = transport_floor(program_ops(11)) - transport_floor(program_ops(10))
    assert one_more == pytest.approx(500 * US + SPI_READ + 500 * US, rel=1e-9)


def test_physical_floor_is_busy_time_plus_bus_time():
    assert physical_floor(erase_ops(0x10000)) == pytest.approx(0.250 + (1 + 8 * 9 / 100) * US + (1 + 32 * 9 / 100) * US)
    assert physical_floor(read_ops(1)) == pytest.approx(SPI_READ)          # the trailing read is not physical


@pytest.mark.parametrize("seed", range(4))
def test_the_transport_floor_lies_between_the_physical_floor_and_a_pcie_or_asm24_run(seed):
    rng = random.Random(seed)
    current = rng.randbytes(0x200000)
    image = bytearray(current)
    for _ in range(rng.randrange(1, 6)):
        a, n = rng.randrange(0x60000, 0x80000), rng.randrange(1, 0x3000)
        image[a:a + n] = rng.randbytes(n)
    assert len(image) == 0x200000
    ops = flash_ops(current, bytes(image), 0x60, 40)
    assert physical_floor(ops) <= transport_floor(ops, PCIE) <= transport_floor(ops)


def test_the_driver_comes_close_to_the_floor_but_never_below_it(make_board):
    rng = random.Random(12)
    current, image = rng.randbytes(0x200000), rng.randbytes(0x200000)
    bar = SimBar5(make_board(content=current))
    try:
        with RomSw(bar, RomSwOptions()) as engine:
            nor = SpiNor(engine)
            nor.identify()
            t = bar.clock.now()
            nor.read(0, 0x40000)
            dump = bar.clock.now() - t
            t = bar.clock.now()
            flash_sectors(nor, image, 64, 16)          # 16 units: read, 4 KiB erases, program, read back
            flashed = bar.clock.now() - t
    finally:
        bar.close()
    # The driver never counts on the link's latency: its yardstick is the observed floor.
    dump_ops_ = read_ops(0x40000 // 0x100)
    assert transport_floor(dump_ops_) < transport_floor(dump_ops_, credit_latency=False) <= dump
    assert dump <= 1.03 * transport_floor(dump_ops_, credit_latency=False)
    ops = flash_ops(current, image, 64, 16)
    assert transport_floor(ops) < transport_floor(ops, credit_latency=False) <= flashed


def _chunk_reads(ops) -> int:  # noqa: ANN001
    return sum(1 for op in ops if op.wire == 4 + 0x100 and op.physical)


def test_floors_count_kept_reads_as_amdflash_confirms_them():
    """A chunk found as expected and free to confirm itself is read once; patterned content,
    a dump and the backup of a unit about to change are read `kept_reads` times."""
    rng = random.Random(30)
    content = rng.randbytes(0x200000)
    erased = b"\xff" * 0x200000
    assert _chunk_reads(verify_ops(content, content, 2)) == 8192          # every chunk matches: once
    assert _chunk_reads(verify_ops(erased, erased, 2)) == 2 * 8192        # all 0xFF proves nothing
    assert _chunk_reads(verify_ops(content, content, 1)) == 8192
    assert _chunk_reads(dump_ops(reads_per_unit=2)) == 2 * 8192
    image = bytearray(content)
    image[0x10000:0x12000] = rng.randbytes(0x2000)                         # two units change
    ops = flash_ops(content, bytes(image), 0x10, 4, kept_reads=2)
    first_erase = next(i for i, op in enumerate(ops) if op.busy)
    last_program = max(i for i, op in enumerate(ops) if op.busy)
    # Backup: two units about to change (twice), two found equal (once); the read-back of the
    # units written (those that change, and any equal one an erase took in), once.
    assert _chunk_reads(ops[:first_erase]) == 16 * (2 * 2 + 2)
    assert _chunk_reads(ops[last_program + 1:]) in (16 * 2, 16 * 3, 16 * 4)
    assert kept_reads_of(content[:0x1000], Expectation(bytes(image)), 0, 0x1000, 2, whole=True) == 16
    assert kept_reads_of(bytes(0x1000), Expectation(bytes(image)), 0, 0x1000, 2, whole=True) == 32
