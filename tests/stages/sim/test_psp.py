"""The PSP boot mailbox model (docs/psp-mailbox.md), driven through the board's BAR5 registers.

`Mailbox` below is a deliberately minimal test-side client (not the product's driver): it
waits for the ready bit on the board's virtual clock, as docs/psp-mailbox.md describes.
"""
from __future__ import annotations

import json

import struct
from pathlib import Path

import pytest

from amdflash.stages.image import ifwi
from amdflash.stages.drivers.navi31 import regs as R
from amdflash.stages.sim import Board, synth
from amdflash.stages.sim.psp import DEFAULT_ORDER

STATUS, DATA, DOORBELL = R.MP0_C2PMSG_115, R.MP0_C2PMSG_116, R.MP0_C2PMSG_73
READY = 0x80000000
GET_BOOT_PARTITION, GET_FB_STATE, GET_TRANSFER_TYPE = 0x01, 0x06, 0x07
START, DATA_TRANSFER, END = 0x08, 0x09, 0x0A
SPI_GET_MODEL_ID = 0x0B
LIVE_ADDR_LO, LIVE_ADDR_HI, LIVE_UPDATE = 0x02, 0x03, 0x04
POLL = 1e-3


class Mailbox:
    def __init__(self, board: Board):
        self.board = board

    def read(self, offset: int) -> int:
        return struct.unpack("<I", self.board.stream_read(offset, 4))[0]

    def write(self, offset: int, value: int) -> None:
        self.board.stream_write(offset, struct.pack("<I", value))

    def ring(self, command: int, argument: int | None = None) -> None:
        assert self.read(STATUS) & READY, "mailbox not ready before the command"
        if argument is not None:
            self.write(DATA, argument)
        self.write(STATUS, command << 16)
        self.write(DOORBELL, 1)

    def wait(self, timeout: float = 60.0) -> tuple[int, int]:
        deadline = self.board.clock.now() + timeout
        while not (status := self.read(STATUS)) & READY:
            assert self.board.clock.now() < deadline, f"PSP command timed out: status={status:#x}"
            self.board.clock.sleep(POLL)
        return status & 0xFFFF, self.read(DATA)

    def command(self, command: int, argument: int | None = None) -> tuple[int, int]:
        self.ring(command, argument)
        return self.wait()

    def error(self, command: int, argument: int | None = None) -> int:
        return self.command(command, argument)[0]

    def send(self, item: int, payload: bytes) -> int:
        """START, every DATA, END; the first error, or 0."""
        if error := self.error(START, len(payload) << 8 | item):
            return error
        for (word,) in struct.iter_unpack("<I", payload):
            assert self.error(DATA_TRANSFER, word) == 0
        return self.error(END, len(payload) << 8 | item)

    def stream_image(self, image: bytes) -> list[int]:
        """Every item the firmware asks for, resolved from `image`, to the terminal one."""
        seen = []
        for _ in range(19):
            error, transfer_type = self.command(GET_TRANSFER_TYPE)
            assert error == 0
            seen.append(transfer_type)
            item = transfer_type & 0xFF
            assert self.send(item, ifwi.resolve_item(image, item)[1]) == 0
            if transfer_type >> 8 == 2:
                return seen
        raise AssertionError(f"no terminal item after 19: {seen}")


def raw32(board: Board, offset: int) -> int:
    """A register read that takes no modelled time."""
    return struct.unpack("<I", board.reg_read(offset, 4))[0]


def raw_ring(board: Board, command: int, argument: int = 0) -> None:
    for offset, value in ((DATA, argument), (STATUS, command << 16), (DOORBELL, 1)):
        board.reg_write(offset, struct.pack("<I", value))


def short_partitions(seed: int, size: int = 0x2000) -> bytes:
    """A synthetic image whose ISH slots describe short payloads, to keep streams quick."""
    image = bytearray(synth.synthetic_ifwi(seed))
    for ish, location, fw_id, priority in ((synth.ISH_A, synth.PARTITION_A, synth.ISH_A_FW_ID, 1),
                                           (synth.ISH_B, synth.PARTITION_B, synth.ISH_B_FW_ID, 0)):
        image[ish:ish + synth.ISH_BYTES] = synth.ish_header(location, size, fw_id, priority)
    return bytes(image)


def changed_bytes(a: bytes, b: bytes) -> set[int]:
    out: set[int] = set()
    for sector in range(0, len(a), 0x1000):
        if a[sector:sector + 0x1000] != b[sector:sector + 0x1000]:
            out.update(i for i in range(sector, sector + 0x1000) if a[i] != b[i])
    return out


@pytest.fixture
def open_board(make_board):
    boards: list[Board] = []

    def make(**options) -> tuple[Board, Mailbox]:
        board = Board(make_board(**options))
        boards.append(board)
        return board, Mailbox(board)

    yield make
    for board in boards:
        board.close()


# -- registers and timing --------------------------------------------------------------------

def test_power_on(open_board):
    board, _ = open_board()
    assert raw32(board, STATUS) == READY
    assert raw32(board, DATA) == 0 and raw32(board, DOORBELL) == 0


def test_ready_clears_at_the_doorbell_and_returns_on_virtual_time(open_board):
    board, _ = open_board()
    raw_ring(board, GET_TRANSFER_TYPE, argument=0x1234)
    assert raw32(board, STATUS) == GET_TRANSFER_TYPE << 16      # busy: ready and error clear
    assert raw32(board, DATA) == 0x1234                          # no response yet
    assert raw32(board, DOORBELL) == 0                           # the doorbell was taken
    board.clock.sleep(1e-6)
    assert not raw32(board, STATUS) & READY
    board.clock.sleep(10e-6)
    assert raw32(board, STATUS) == READY | GET_TRANSFER_TYPE << 16
    assert raw32(board, DATA) == 0x101


def test_doorbell_rings_only_with_1(open_board):
    board, mailbox = open_board()
    mailbox.write(STATUS, GET_TRANSFER_TYPE << 16)
    mailbox.write(DOORBELL, 2)
    board.clock.sleep(1.0)
    assert raw32(board, STATUS) == GET_TRANSFER_TYPE << 16  # nothing ran: ready stays clear
    mailbox.write(DOORBELL, 1)
    assert mailbox.wait() == (0, 0x101)


def test_doorbell_while_busy_is_lost(open_board):
    board, mailbox = open_board()
    raw_ring(board, GET_TRANSFER_TYPE)
    raw_ring(board, SPI_GET_MODEL_ID)  # no time has passed: the firmware is still busy
    error, response = mailbox.wait()
    assert (error, response) == (0, 0x101)
    assert raw32(board, STATUS) >> 16 & 0xFF == GET_TRANSFER_TYPE


def test_a_due_result_does_not_overwrite_the_next_command(open_board):
    board, mailbox = open_board()
    raw_ring(board, GET_TRANSFER_TYPE, argument=0x55)
    board.clock.sleep(1e-3)  # done by now, though nobody has looked
    raw_ring(board, START, argument=0x54 << 8 | 0x01)  # neither argument nor command may be lost
    assert raw32(board, STATUS) == START << 16
    assert mailbox.wait() == (0, 0)
    assert mailbox.error(DATA_TRANSFER, 0) == 0  # the session is open


def test_reference_style_polling_over_usb_costs_time(open_board):
    board, mailbox = open_board()
    before = board.clock.now()
    mailbox.command(GET_BOOT_PARTITION)
    assert board.clock.now() - before > 5 * 100e-6  # each BAR access is a USB round trip


# -- commands --------------------------------------------------------------------------------

def test_query_commands(open_board):
    _, mailbox = open_board()
    assert mailbox.command(GET_BOOT_PARTITION) == (0, 0)
    assert mailbox.command(GET_FB_STATE) == (0, 0)
    assert mailbox.command(SPI_GET_MODEL_ID) == (0, 0xC86015)
    assert mailbox.command(GET_TRANSFER_TYPE) == (0, 0x100 | DEFAULT_ORDER[0])


@pytest.mark.parametrize("command", [0x00, LIVE_ADDR_LO, LIVE_ADDR_HI, LIVE_UPDATE, 0x05, 0x0C, 0x7F, 0xFF])
def test_unknown_commands_and_live_commands_without_sos(open_board, command):
    _, mailbox = open_board()
    assert mailbox.command(command, 0x1000) == (0x0E, 0)


def test_boot_partition_comes_from_the_metadata_at_power_on(open_board):
    image = bytearray(synth.synthetic_ifwi(3))
    record = synth.metadata_record(synth.Metadata(active=1, updates=4, b_checksum=0))
    image[synth.METADATA:synth.METADATA + len(record)] = record
    _, mailbox = open_board(content=bytes(image))
    assert mailbox.command(GET_BOOT_PARTITION) == (0, 1)


@pytest.mark.parametrize("code", range(0x01, 0x13))
def test_psp_error_fault_answers_every_code(open_board, code):
    _, mailbox = open_board(faults=[f"psp-error=0x1:{code:#x}"])
    assert mailbox.command(GET_BOOT_PARTITION) == (code, 0)
    assert mailbox.command(GET_BOOT_PARTITION)[0] == code       # every time
    assert mailbox.command(GET_TRANSFER_TYPE) == (0, 0x101)      # other commands unaffected


def test_psp_error_fault_is_stateless(open_board):
    board, mailbox = open_board(faults=["psp-error=0x8:0xC"])
    efs = ifwi.resolve_item(synth.synthetic_ifwi(1), 0x01)[1]
    for _ in range(2):
        assert mailbox.error(START, len(efs) << 8 | 0x01) == 0x0C
    assert mailbox.error(DATA_TRANSFER, 0) == 0x10  # START never took effect
    assert mailbox.command(GET_TRANSFER_TYPE) == (0, 0x101)


# -- streaming -------------------------------------------------------------------------------

def check_partition_b_update(before: bytes, after: bytes, payload: bytes, updates: int = 1) -> None:
    """Partition B holds the payload; only the cookie, ISH B's counter/checksum and the
    metadata changed elsewhere (the seed's observation on a stock board)."""
    b_at, b_size = struct.unpack_from("<I", before, 0x13010)[0], struct.unpack_from("<I", before, 0x13018)[0]
    assert after[b_at:b_at + b_size] == payload
    cookie = synth.cookie_offset(b_at, b_size)
    checksum = ifwi.fletcher32(payload)
    assert after[cookie:cookie + 16] == b"$AMDVBFL" + struct.pack("<II", updates, checksum)
    ish = after[0x13000:0x13020]
    assert struct.unpack_from("<I", ish, 8)[0] == struct.unpack_from("<I", before, 0x13008)[0] + 1
    assert struct.unpack_from("<I", ish, 0)[0] == ifwi.fletcher32(ish[4:])
    assert ish[4:8] == before[0x13004:0x13008] and ish[0xC:] == before[0x1300C:0x13020]
    meta = synth.read_metadata(after)
    assert meta is not None and (meta.active, meta.updates, meta.b_checksum) == (1, updates, checksum)
    allowed = (range(b_at, b_at + b_size), range(cookie, cookie + 16), range(0x13000, 0x13004),
               range(0x13008, 0x1300C), range(synth.METADATA, synth.METADATA + synth.METADATA_BYTES))
    stray = sorted(i for i in changed_bytes(before, after) if not any(i in r for r in allowed))
    assert not stray, f"unexpected flash changes at {[hex(i) for i in stray[:8]]}"


def test_full_stream_in_the_default_order_updates_partition_b(open_board):
    board, mailbox = open_board(seed=11)
    image = synth.synthetic_ifwi(11)
    before = bytes(board.files.flash)
    seen = mailbox.stream_image(image)
    assert [t & 0xFF for t in seen] == list(DEFAULT_ORDER)
    assert [t >> 8 for t in seen] == [1] * (len(seen) - 1) + [2]
    assert seen[-1] == 0x208 and len(seen) <= 19
    check_partition_b_update(before, bytes(board.files.flash), ifwi.resolve_item(image, 0x08)[1])
    # Done: power cycle required. Boot state is what it was at power-on.
    for command in (GET_TRANSFER_TYPE, START, DATA_TRANSFER, END):
        assert mailbox.error(command, 0x5401) == 0x11
    assert mailbox.command(GET_BOOT_PARTITION) == (0, 0)


def test_terminal_end_takes_the_erase_and_program_time(open_board):
    board, mailbox = open_board(psp_order=[0x08])
    payload = ifwi.resolve_item(bytes(board.files.flash), 0x08)[1]
    assert mailbox.error(START, len(payload) << 8 | 0x08) == 0
    for (word,) in struct.iter_unpack("<I", payload):
        raw_ring(board, DATA_TRANSFER, word)
        board.clock.sleep(10e-6)
        assert raw32(board, STATUS) == READY | DATA_TRANSFER << 16
    raw_ring(board, END, len(payload) << 8 | 0x08)
    rung = board.clock.now()
    board.clock.sleep(0.8)  # erasing the payload's 16 sectors alone takes this long
    assert not raw32(board, STATUS) & READY
    while not raw32(board, STATUS) & READY:
        board.clock.sleep(1e-3)
    elapsed = board.clock.now() - rung
    # 16 payload sectors + cookie, ISH B and metadata sectors erased (50 ms each), then at
    # most their 19 × 16 pages programmed (0.5 ms each): §7's typical column.
    assert 19 * 0.05 < elapsed < 19 * 0.05 + 19 * 16 * 0.5e-3 + 1e-3
    assert raw32(board, STATUS) & 0xFFFF == 0


def test_stream_in_a_custom_order(open_board):
    image = short_partitions(5)
    board, mailbox = open_board(content=image, psp_order=[0x06, 0x01, 0x08])
    before = bytes(board.files.flash)
    assert mailbox.stream_image(image) == [0x106, 0x101, 0x208]
    check_partition_b_update(before, bytes(board.files.flash), ifwi.resolve_item(image, 0x08)[1])


def test_payload_from_another_image_lands_in_partition_b(open_board):
    board, mailbox = open_board(content=short_partitions(5), psp_order=[0x08])
    other = short_partitions(99)
    before = bytes(board.files.flash)
    assert mailbox.stream_image(other) == [0x208]
    payload = ifwi.resolve_item(other, 0x08)[1]
    assert payload != before[0x20000:0x22000] and payload != before[0x100000:0x102000]
    check_partition_b_update(before, bytes(board.files.flash), payload)


def test_terminal_item_without_a_payload_writes_nothing(open_board):
    board, mailbox = open_board(psp_order=[0x01, 0x89])
    before = bytes(board.files.flash)
    assert mailbox.stream_image(synth.synthetic_ifwi(1)) == [0x101, 0x289]
    assert bytes(board.files.flash) == before
    assert mailbox.error(GET_TRANSFER_TYPE) == 0x11


def test_start_checks_item_and_size(open_board):
    _, mailbox = open_board()
    assert mailbox.error(START, 0x50 << 8 | 0x02) == 0x03   # a valid directory, but not the requested item
    assert mailbox.error(START, 0x50 << 8 | 0x01) == 0x03   # smaller than the EFS
    assert mailbox.error(START, 0x58 << 8 | 0x01) == 0x02   # larger than the EFS
    assert mailbox.error(START, 0x55 << 8 | 0x01) == 0x03   # not whole dwords
    assert mailbox.error(START, 0x00 << 8 | 0x01) == 0x03
    assert mailbox.error(DATA_TRANSFER, 0) == 0x10          # no session was opened
    assert mailbox.error(END, 0x01) == 0x10
    assert mailbox.error(START, 0x54 << 8 | 0x01) == 0
    assert mailbox.error(START, 0x54 << 8 | 0x01) == 0x11   # a session is already open


@pytest.mark.parametrize("order, item, size, error", [
    ([0x08], 0x08, 0x10000 - 4, 0x03),   # must fill partition B exactly
    ([0x08], 0x08, 0x10004, 0x02),
    ([0x02], 0x02, 0x1010, 0x02),        # a directory fits in a sector
    ([0x02], 0x02, 0x48, 0x03),          # header and entries are 16 bytes each
    ([0x85], 0x85, 0x10004, 0x02),
    ([0x42], 0x42, 0x10, 0x00),          # an item the firmware knows no size for
])
def test_start_size_per_item(open_board, order, item, size, error):
    _, mailbox = open_board(psp_order=order)
    assert mailbox.error(START, size << 8 | item) == error


def test_blank_flash_has_no_partition_b_to_update(open_board):
    _, mailbox = open_board(content="blank", psp_order=[0x08])
    assert mailbox.error(START, 0x10000 << 8 | 0x08) == 0x08


def test_data_overflow_and_end_mismatch_abort_the_session(open_board):
    _, mailbox = open_board()
    efs = synth.synthetic_ifwi(1)[:0x54]
    assert mailbox.error(START, 0x54 << 8 | 0x01) == 0
    for (word,) in struct.iter_unpack("<I", efs):
        assert mailbox.error(DATA_TRANSFER, word) == 0
    assert mailbox.error(DATA_TRANSFER, 0) == 0x02          # past START's size
    assert mailbox.error(END, 0x58 << 8 | 0x01) == 0x11     # more than was received
    assert mailbox.error(DATA_TRANSFER, 0) == 0x10          # the session is gone
    assert mailbox.command(GET_TRANSFER_TYPE) == (0, 0x101) # and the item is asked again
    assert mailbox.send(0x01, efs) == 0
    assert mailbox.command(GET_TRANSFER_TYPE) == (0, 0x102)


def test_end_naming_another_item_fails(open_board):
    _, mailbox = open_board()
    efs = synth.synthetic_ifwi(1)[:0x54]
    assert mailbox.error(START, 0x54 << 8 | 0x01) == 0
    for (word,) in struct.iter_unpack("<I", efs):
        assert mailbox.error(DATA_TRANSFER, word) == 0
    assert mailbox.error(END, 0x54 << 8 | 0x02) == 0x11
    assert mailbox.command(GET_TRANSFER_TYPE) == (0, 0x101)


def test_interrupted_stream_takes_one_end(open_board):
    board, mailbox = open_board(psp_order=[0x04, 0x05])
    image = synth.synthetic_ifwi(1)
    blob = ifwi.resolve_item(image, 0x04)[1]
    assert mailbox.error(START, len(blob) << 8 | 0x04) == 0
    for (word,) in struct.iter_unpack("<I", blob[:20]):
        assert mailbox.error(DATA_TRANSFER, word) == 0
    assert mailbox.error(END, 20 << 8 | 0x04) == 0x11   # the bytes actually sent: rejected, session closed
    assert mailbox.error(END, 20 << 8 | 0x04) == 0x10   # a second END finds nothing to end
    assert mailbox.send(0x04, blob) == 0
    assert mailbox.command(GET_TRANSFER_TYPE) == (0, 0x205)


@pytest.mark.parametrize("item, offset, value, error", [
    (0x01, 0x0, b"\0\0\0\0", 0x06),            # EFS without its magic
    (0x02, 0x15, b"\x20", 0x06),              # an entry's size changed: the checksum breaks
    (0x02, 0x0, b"$PL2", 0x06),
    (0x03, 0x8, struct.pack("<I", 3), 0x06),  # entry count disagrees with the size
    (0x81, 0x0, b"$SGX", 0x06),
    (0x06, 0x10, struct.pack("<I", 0x1F8000), 0x07),  # ISH payload past the flash
    (0x80, 0x0, struct.pack("<I", 0x200000), 0x07),
])
def test_malformed_items_are_rejected_at_end(open_board, item, offset, value, error):
    _, mailbox = open_board(psp_order=[item, 0x89])
    good = ifwi.resolve_item(synth.synthetic_ifwi(1), item)[1]
    bad = bytearray(good)
    bad[offset:offset + len(value)] = value
    assert bad != good
    assert mailbox.send(item, bytes(bad)) == error
    assert mailbox.command(GET_TRANSFER_TYPE) == (0, 0x100 | item)  # asked again
    assert mailbox.send(item, good) == 0
    assert mailbox.command(GET_TRANSFER_TYPE) == (0, 0x289)


def test_erased_signature_is_not_found(open_board):
    _, mailbox = open_board(psp_order=[0x85, 0x89])
    assert mailbox.send(0x85, b"\xff" * 0x200) == 0x0F


def test_write_protected_flash_answers_write_to_spi_error(open_board):
    board, mailbox = open_board(content=short_partitions(1), psp_order=[0x08])
    refused: list[int] = []
    board.chip.psp_update = lambda address, data: refused.append(address) or False
    before = bytes(board.files.flash)
    payload = ifwi.resolve_item(before, 0x08)[1]
    assert mailbox.send(0x08, payload) == 0x0C
    assert refused and bytes(board.files.flash) == before
    assert mailbox.command(GET_TRANSFER_TYPE) == (0, 0x208)  # not done: it may be tried again


# -- SOS gating and the live path ------------------------------------------------------------

def test_sos_gates_the_update_commands(open_board):
    _, mailbox = open_board(sos=True)
    assert mailbox.command(GET_TRANSFER_TYPE) == (0x0A, 0)
    for command in (START, DATA_TRANSFER, END):
        assert mailbox.error(command, 0x54 << 8 | 0x01) == 0x0A
    assert mailbox.command(GET_BOOT_PARTITION) == (0, 0)
    assert mailbox.command(GET_FB_STATE) == (0, 1)
    assert mailbox.command(SPI_GET_MODEL_ID) == (0, 0xC86015)


def test_live_update_writes_its_cookie_then_fails_as_on_a_stock_board(open_board):
    board, mailbox = open_board(sos=True)
    before = bytes(board.files.flash)
    assert mailbox.error(LIVE_UPDATE) == 0x05             # no address yet
    assert mailbox.error(LIVE_ADDR_LO, 0x00100000) == 0
    assert mailbox.error(LIVE_UPDATE) == 0x05
    assert mailbox.error(LIVE_ADDR_HI, 0x8) == 0
    assert mailbox.error(LIVE_UPDATE) == 0x0C
    after = bytes(board.files.flash)
    assert after[0x110000:0x110008] == b"$AMDVBFL"
    assert all(0x110000 <= i < 0x110010 for i in changed_bytes(before, after))


# -- persistence -----------------------------------------------------------------------------

def test_a_stream_survives_reopening_the_board(make_board):
    path: Path = make_board(seed=2, psp_order=[0x01, 0x02, 0x08])
    image = synth.synthetic_ifwi(2)
    efs = ifwi.resolve_item(image, 0x01)[1]
    with Board(path) as board:
        mailbox = Mailbox(board)
        assert mailbox.error(START, len(efs) << 8 | 0x01) == 0
        for (word,) in struct.iter_unpack("<I", efs[:40]):
            assert mailbox.error(DATA_TRANSFER, word) == 0
    with Board(path) as board:
        mailbox = Mailbox(board)
        assert mailbox.command(GET_TRANSFER_TYPE) == (0, 0x101)
        for (word,) in struct.iter_unpack("<I", efs[40:]):
            assert mailbox.error(DATA_TRANSFER, word) == 0
        assert mailbox.error(END, len(efs) << 8 | 0x01) == 0
        assert mailbox.command(GET_TRANSFER_TYPE) == (0, 0x102)


def test_a_running_update_survives_reopening_the_board(make_board):
    path: Path = make_board(content=short_partitions(4), psp_order=[0x08])
    with Board(path) as board:
        before = bytes(board.files.flash)
        payload = ifwi.resolve_item(before, 0x08)[1]
        mailbox = Mailbox(board)
        assert mailbox.error(START, len(payload) << 8 | 0x08) == 0
        for (word,) in struct.iter_unpack("<I", payload):
            assert mailbox.error(DATA_TRANSFER, word) == 0
        raw_ring(board, END, len(payload) << 8 | 0x08)
    with Board(path) as board:
        assert not raw32(board, STATUS) & READY  # still erasing and programming
        assert Mailbox(board).wait() == (0, 0)
        check_partition_b_update(before, bytes(board.files.flash), payload)


@pytest.mark.parametrize("order", [[], [0x01, 0x100], [0x00], ["0x01"]])
def test_a_bad_psp_order_is_refused(make_board, order):
    # At creation (sim create checks it) ...
    with pytest.raises(ValueError, match="psp_order"):
        make_board(psp_order=order)
    # ... and when a hand-edited board opens.
    path = make_board()
    config = json.loads((path / "board.json").read_text())
    config["psp_order"] = order
    (path / "board.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="psp_order"):
        Board(path)
