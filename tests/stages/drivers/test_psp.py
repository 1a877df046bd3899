"""The PSP boot mailbox driver against the emulated bootloader (docs/psp-mailbox.md)."""
from __future__ import annotations

import pytest

from amdflash.stages.image import ifwi
from amdflash.stages.drivers.navi31 import psp
from amdflash.stages.drivers.navi31 import regs as R
from amdflash.stages.sim import SimBar5
from amdflash.stages.sim.synth import synthetic_ifwi


@pytest.fixture
def mailbox(make_board):
    opened = []

    def make(profile: str = "ideal", **board) -> psp.PspMailbox:
        board.setdefault("seed", 3)
        bar = SimBar5(make_board(**board), profile=profile)
        opened.append(bar)
        return psp.PspMailbox(bar)

    yield make
    for bar in opened:
        bar.close()


def test_probe_answers_every_query(mailbox):
    result = mailbox().probe()
    assert set(result.answers) == {"boot_partition", "fb_state", "model_id", "transfer_type"}
    assert all(error == 0 for error, _ in result.answers.values())
    assert result.answers["model_id"][1] == 0xC86015
    assert result.transfer_type & 0xFF == 0x01 and result.transfer_type >> 8 == 1
    assert not result.gated


def test_probe_shows_the_gated_hint_when_sos_is_up(mailbox):
    assert mailbox(sos=True).probe().gated


def test_ifwi_all_streams_every_requested_item_and_stops_after_the_terminal_one(mailbox):
    box = mailbox()
    image = synthetic_ifwi(3)
    items = box.ifwi_all(image)
    assert len(items) <= psp.IFWI_MAX_ITEMS
    assert items[-1].phase == 2 and all(i.phase == 1 for i in items[:-1])
    for it in items:
        offset, payload = ifwi.resolve_item(image, it.item)
        assert (it.offset, it.size) == (offset, len(payload))
    # The bootloader is now done until a power cycle.
    error, _ = box.command(psp.GET_TRANSFER_TYPE)
    assert error != 0


def test_ifwi_all_follows_a_custom_request_order(mailbox):
    order = [0x01, 0x80, 0x81, 0x06, 0x07, 0x08]
    items = mailbox(psp_order=order).ifwi_all(synthetic_ifwi(3))
    assert [i.item for i in items] == order


def test_stream_refuses_an_item_the_bootloader_did_not_ask_for(mailbox):
    box = mailbox()
    with pytest.raises(psp.PspError, match="requests item 0x1, not 0x2"):
        box.stream(bytes(16), 0x02)


@pytest.mark.parametrize("payload", [b"", b"\x00" * 6])
def test_stream_payload_rules(mailbox, payload):
    with pytest.raises(ValueError):
        mailbox().stream(payload, 0x01)


def test_psp_error_fault_is_reported_with_its_code_and_meaning(mailbox):
    box = mailbox(faults=["psp-error=0x8:0xC"])
    with pytest.raises(psp.PspError) as e:
        box.ifwi_all(synthetic_ifwi(3))
    assert e.value.code == 0xC and "write to SPI error" in str(e.value)


def test_gated_bootloader_refuses_ifwi_all_with_the_hint(mailbox):
    with pytest.raises(psp.PspError, match="gated"):
        mailbox(sos=True).ifwi_all(synthetic_ifwi(3))


def test_malformed_image_is_refused_before_any_command(mailbox):
    box = mailbox()
    with pytest.raises(ifwi.IfwiError):
        box.ifwi_all(b"\xff" * 0x200000)
    assert box.bar.board.stats()["reg_writes"] == 0


class Interrupting:
    """A transport that fails every write after `limit` mailbox data writes."""

    def __init__(self, bar: SimBar5, limit: int):
        self.bar, self.limit = bar, limit
        self.clock, self.identity = bar.clock, bar.identity
        self.commands: list[int] = []
        self.arguments: list[int] = []
        self.data_writes = 0

    def read32(self, offset: int) -> int:
        return self.bar.read32(offset)

    def write32(self, offset: int, value: int) -> None:
        if offset == R.MP0_C2PMSG_116:
            self.arguments.append(value)
        if offset == R.MP0_C2PMSG_115:
            self.commands.append(value >> 16)
            if value >> 16 == psp.DATA_TRANSFER:
                self.data_writes += 1
                if self.data_writes > self.limit:
                    raise OSError("USB transfer failed")
        self.bar.write32(offset, value)


def test_an_interrupted_stream_sends_exactly_one_end_with_the_bytes_sent(make_board):
    bar = SimBar5(make_board(seed=3), profile="ideal")
    try:
        flaky = Interrupting(bar, limit=5)
        box = psp.PspMailbox(flaky)
        _, payload = ifwi.resolve_item(synthetic_ifwi(3), 0x01)
        with pytest.raises(OSError):
            box.stream(payload, 0x01)
        assert flaky.commands.count(psp.END_TRANSFER) == 1
        assert flaky.commands[-1] == psp.END_TRANSFER
        assert flaky.arguments[-1] == (5 * 4) << 8 | 0x01      # the five dwords that went out
    finally:
        bar.close()


def test_a_rejected_end_is_not_sent_twice(make_board):
    bar = SimBar5(make_board(seed=3, faults=["psp-error=0xA:0x11"]), profile="ideal")
    try:
        flaky = Interrupting(bar, limit=10**9)
        box = psp.PspMailbox(flaky)
        _, payload = ifwi.resolve_item(synthetic_ifwi(3), 0x01)
        with pytest.raises(psp.PspError) as e:
            box.stream(payload, 0x01)
        assert e.value.code == 0x11
        assert flaky.commands.count(psp.END_TRANSFER) == 1
    finally:
        bar.close()


def test_mailbox_not_ready_is_reported(make_board):
    bar = SimBar5(make_board(seed=3), profile="ideal")
    try:
        bar.write32(R.MP0_C2PMSG_115, psp.GET_FB_STATE << 16)   # a host overwrote the ready bit
        with pytest.raises(psp.PspError, match="not ready"):
            psp.PspMailbox(bar).command(psp.GET_FB_STATE)
    finally:
        bar.close()
