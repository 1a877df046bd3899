"""The ROM_SW engine driver: configuration, restore on every path, RX quirk modes, gating."""
from __future__ import annotations

import pytest

from amdflash.stages.drivers.navi31 import regs as R
from amdflash.stages.drivers.navi31.romsw import Request, RomSwError, RomSwOptions, RomSwTimeout
from tests.stages.drivers.conftest import registers

JEDEC = bytes((0xC8, 0x60, 0x15))


def test_open_configures_pads_mirror_and_prescaler_and_close_restores(open_board):
    o = open_board()
    before = registers(o.board)
    o.engine.open()
    b = o.board
    assert b.get32(R.GPIOPAD_MASK) & R.SPI_PAD_BITS == 0
    assert b.get32(R.GPIOPAD_A) & R.SPI_PAD_BITS == 0
    assert b.get32(R.GPIOPAD_EN) & R.SPI_PAD_BITS == 0
    assert b.get32(R.PAGE_MIRROR_CNTL) & 0x0E000000 == 0x06000000
    assert (b.get32(R.ROM_CNTL) >> 24) & 0x1F == 0x18        # override + prescale 8
    assert o.engine.read(0x9F, count=3) == JEDEC
    o.engine.close()
    assert registers(b) == before


def test_primed_read_issues_two_transactions_and_returns_fresh_data(open_board):
    o = open_board(content="blank")
    o.engine.open()
    o.engine.read(0x9F, count=3)
    o.ops.clear()
    assert o.engine.read(0x05, count=1) == b"\x00"
    assert [op for op, *_ in o.ops] == [0x05, 0x05]


def test_unprimed_read_returns_the_previous_transactions_data(open_board):
    o = open_board()
    o.engine.open()
    o.engine.read(0x05, count=4)                                 # SR1 repeated: 00 00 00 00
    stale = o.engine.raw(0x9F, count=3)
    assert stale != JEDEC and stale == b"\x00\x00\x00"
    assert o.engine.raw(0x05, count=3) == JEDEC                  # now the 9F capture shows


@pytest.mark.parametrize("mode", ["primed", "chained"])
def test_read_chain_returns_each_request_in_order(open_board, mode):
    image = bytes(range(256)) * 0x2000
    o = open_board(content=image, engine={"rx_mode": mode})
    o.engine.open()
    requests = [Request(0x03, a, 3, 256) for a in range(0x1000, 0x1800, 0x100)]
    o.ops.clear()
    got = list(o.engine.read_chain(requests))
    assert got == [image[r.address:r.address + 256] for r in requests]
    assert len(o.ops) == (2 * len(requests) if mode == "primed" else len(requests) + 1)


def test_restore_each_mode_restores_after_every_transaction(open_board):
    o = open_board(engine={"restore_each": True})
    before = registers(o.board)
    o.engine.open()
    assert o.engine.read(0x9F, count=3) == JEDEC
    assert registers(o.board) == before
    o.engine.close()
    assert registers(o.board) == before


def test_gated_engine_times_out_with_the_reference_message_and_restores(open_board):
    # Without the open-time self-check, the first read times out ...
    o = open_board(gated=True, engine={"timeout": 0.05, "self_check": False})
    before = registers(o.board)
    o.engine.open()
    with pytest.raises(RomSwTimeout) as e:
        o.engine.read(0x9F, count=3)
    assert "engine may be gated after SOS boot" in str(e.value)
    assert "0x04000800" in str(e.value)
    with pytest.raises(RomSwError):
        o.engine.read(0x9F, count=3)      # nothing more is started after a timeout
    o.engine.close()
    assert registers(o.board) == before
    # ... with it (the default), opening does, and leaves the registers as they were.
    o = open_board(gated=True, engine={"timeout": 0.05})
    before = registers(o.board)
    with pytest.raises(RomSwTimeout, match="engine may be gated after SOS boot"):
        o.engine.open()
    assert registers(o.board) == before


def test_stall_times_out_and_registers_are_restored(open_board):
    o = open_board(faults=["stall-after=200"], engine={"timeout": 0.05})
    before = registers(o.board)
    with o.engine:
        with pytest.raises(RomSwTimeout, match=r"the engine stopped answering after \d+ completed transactions"):
            for _ in range(200):
                o.engine.read(0x05)
    assert registers(o.board) == before


def test_missing_raw_controller_fails_at_open_and_leaves_nothing_changed(open_board):
    o = open_board(no_raw_rom=True)
    with pytest.raises(RomSwError, match="did not clear"):
        o.engine.open()
    assert o.board.get32(R.ROM_CNTL) == 0xFFFFFFFF


def test_timeout_uses_the_transport_clock(open_board):
    o = open_board(gated=True, engine={"timeout": 0.5, "self_check": False})
    o.engine.open()
    start = o.bar.clock.now()
    with pytest.raises(RomSwTimeout):
        o.engine.read(0x05)
    assert 0.5 <= o.bar.clock.now() - start < 0.6


def test_option_validation():
    with pytest.raises(ValueError):
        RomSwOptions(prescale=16)
    with pytest.raises(ValueError):
        RomSwOptions(rx_mode="fast")  # type: ignore[arg-type]


def test_tx_and_rx_together_and_oversize_are_refused(open_board):
    o = open_board()
    with o.engine:
        with pytest.raises(ValueError):
            o.engine._transaction(0x02, 0, 3, b"\x00", 1, True)
        with pytest.raises(ValueError):
            o.engine.command(0x02, 0, 3, bytes(257))


def test_close_writes_every_register_back_even_when_one_write_fails(open_board):
    o = open_board()
    before = registers(o.board)
    o.engine.open()
    o.engine.read(0x9F, count=3)
    real = o.bar.write32
    failing = {R.PAGE_MIRROR_CNTL}

    def flaky(offset: int, value: int) -> None:
        if offset in failing:
            raise OSError("transport hiccup")
        real(offset, value)

    o.bar.write32 = flaky
    with pytest.raises(OSError):
        o.engine.close()
    after = registers(o.board)
    assert {r: v for r, v in after.items() if r != R.PAGE_MIRROR_CNTL} == \
           {r: v for r, v in before.items() if r != R.PAGE_MIRROR_CNTL}


def test_a_chain_that_goes_on_where_the_last_ended_reuses_its_trailing_read(open_board):
    """A chain ends with the read of the chunk after its last: a dump, unit after unit, pays
    for one trailing transaction in all, not one per unit."""
    image = bytes(range(256)) * 0x2000
    o = open_board(content=image)
    o.engine.open()
    o.nor.identify()
    o.ops.clear()
    assert o.nor.read(0x4000, 0x1000) == image[0x4000:0x5000]
    assert len(o.ops) == 17                                       # 16 reads + the read of 0x5000
    o.ops.clear()
    assert o.nor.read(0x5000, 0x1000) == image[0x5000:0x6000]
    assert len(o.ops) == 16                                       # 0x5000 was already captured
    o.ops.clear()
    assert o.nor.read(0x9000, 0x100) == image[0x9000:0x9100]       # elsewhere: nothing to reuse
    assert len(o.ops) == 2


def test_a_write_between_two_reads_drops_the_kept_capture(open_board):
    o = open_board(content=bytes(range(256)) * 0x2000)
    o.engine.open()
    o.nor.identify()
    o.nor.read(0x4000, 0x1000)                                    # keeps the capture of 0x5000
    o.nor.erase(0x5000, 0x1000)
    o.ops.clear()
    assert o.nor.read(0x5000, 0x100) == b"\xff" * 0x100            # read again, not the old capture
    assert [op for op, *_ in o.ops][:2] == [0x03, 0x03] and o.ops[0][1] == 0x5000


@pytest.mark.parametrize("then", ["close", "read again"])
def test_an_exception_while_a_transaction_runs_waits_for_its_end_before_touching_the_engine(open_board, then):
    """Interrupted between a CNTL write and the done bit (here: the transaction observer
    raising, as Ctrl-C could): the strict board fails any later access to COMMAND, CNTL or
    the window before the transaction's end, so the next transaction — or close()'s
    restore — must see that end first."""
    image = bytes(range(256)) * 0x2000
    o = open_board(content=image)
    before = registers(o.board)
    o.engine.open()

    def interrupted(*_: object) -> None:
        o.engine.observer = None
        raise KeyboardInterrupt

    o.engine.observer = interrupted
    with pytest.raises(KeyboardInterrupt):
        o.engine.read(0x03, 0x1000, 3, 0x100)                   # 188 µs of SPI time, still running
    if then == "close":
        o.engine.close()
        assert registers(o.board) == before
    else:
        assert o.engine.read(0x03, 0x2000, 3, 0x100) == image[0x2000:0x2100]
    stats = o.board.stats()
    assert stats["protocol_violations"] == 0 and stats["unobserved_completions"] == 0
    assert o.engine.completions == o.engine.transactions
