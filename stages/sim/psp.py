"""PSP boot mailbox model (docs/psp-mailbox.md): the early boot firmware behind C2PMSG_115/116/73.

The registers, as the host meets them:

* C2PMSG_115: b31 ready, b23:16 command, b15:0 error. C2PMSG_116: argument, then response.
  C2PMSG_73: writing 1 rings the doorbell (and reads back 0 once taken; other values
  just sit there).
* The host writes `command << 16` itself, which clears the ready bit in the register it has
  just overwritten. The doorbell makes the firmware take the command and the argument,
  keep ready clear, and publish `ready | command << 16 | error` and the response only when
  the command's modelled time has passed on the board clock. A doorbell rung while a
  command is still running is lost, as a firmware that polls its doorbell only when idle
  would lose it: a driver that does not wait for ready sees its command vanish.

The bootloader asks for IFWI items one at a time, in `board.config["psp_order"]` (default
`DEFAULT_ORDER`, 18 items ending with the partition payload 0x08). GET_TRANSFER_TYPE answers
`phase << 8 | item`: phase 1, or 2 for the last (terminal) item. Each item is one session:
START (`size << 8 | item`), DATA (one little-endian dword each), END (`sent << 8 | item`).
A session ends with END whatever its outcome; a failed one is requested again. When the
terminal item completes, the firmware updates partition B (found from ISH B in the current
flash) with the payload it received for item 0x08, changing only B's update cookie, ISH B's
counter and checksum and the metadata record (synth.py has the formats), and then stays
done until a power cycle. Its own SPI writes go through `board.chip.psp_update`, whole 4 KiB
sectors at a time (read, merge, erase, program), and take the time the chip is busy for
that: one 4 KiB erase per sector and one page program per page not left erased (§7, typical
column), the same figure the chip model charges for `psp_update`.

With SOS up (`variant["sos"]`), the boot commands are gated: GET_TRANSFER_TYPE and
START/DATA/END answer 0xA. The live commands (0x02/0x03/0x04) exist only then; UPDATE does
what the seed saw on a stock board: it writes its `$AMDVBFL` cookie, then fails with 0xC.

Which error answers which mistake is an assumption (no firmware source is public); the
choice follows the names of the codes:

    0x02 out of bounds          START size above what the item can be; DATA past START's size
    0x03 invalid parameter      START item other than the requested one; size 0, not a
                                multiple of 4, or other than the item's size
    0x05 address not set        live UPDATE before ADDR_LO and ADDR_HI
    0x06 parse off-chip error   a received EFS, $PSP directory or $SGN table is malformed
    0x07 address map error      a received ISH or $SGN pointer points outside the flash
    0x08 parse on-chip error    ISH B in the current flash does not describe a partition
    0x0A partition update error gated by SOS; ISH B's size changed while the payload streamed
    0x0B map on-chip error      partition B (and its cookie sector) would not fit the flash
    0x0C write to SPI error     `psp_update` refused (write-protected flash)
    0x0E invalid command        unknown command; live commands without SOS
    0x0F signature not found    a received $SGN signature item is erased (all 0xFF)
    0x10 state machine not init DATA or END without a started session
    0x11 state machine transfer START during a session; END whose item, count or size does
                                not match; any transfer command after completion

Codes with no natural cause here (0x01, 0x04, 0x09, 0x0D, 0x12) come from the psp-error
fault, which makes one command answer one code every time, with no other effect.

State lives where the board keeps it across host processes: the firmware's variables in
the board's "psp" region, received bytes in the firmware's SRAM, a file beside the board
(`psp_sram.bin`, created on the first transfer).
"""
from __future__ import annotations

import mmap
import os
import struct
from typing import TYPE_CHECKING, NamedTuple
from collections.abc import Callable

from amdflash.stages.drivers.flash.geometry import FLASH_SIZE, PAGE, SECTOR
from amdflash.stages.drivers.navi31 import regs as R
from amdflash.stages.sim import synth

if TYPE_CHECKING:
    from amdflash.stages.sim.board import Board

# Commands.
GET_BOOT_PARTITION = 0x01
LIVE_ADDR_LO, LIVE_ADDR_HI, LIVE_UPDATE = 0x02, 0x03, 0x04
GET_FB_STATE, GET_TRANSFER_TYPE = 0x06, 0x07
START_TRANSFER, DATA_TRANSFER, END_TRANSFER = 0x08, 0x09, 0x0A
SPI_GET_MODEL_ID = 0x0B

# Error codes (docs/psp-mailbox.md).
OK = 0x00
OUT_OF_BOUNDS = 0x02
INVALID_PARAMETER = 0x03
ADDRESS_NOT_SET = 0x05
PARSE_OFF_CHIP = 0x06
ADDRESS_MAP = 0x07
PARSE_ON_CHIP = 0x08
PARTITION_UPDATE = 0x0A
MAP_ON_CHIP = 0x0B
WRITE_TO_SPI = 0x0C
INVALID_COMMAND = 0x0E
SIGNATURE_NOT_FOUND = 0x0F
STATE_NOT_INITIALIZED = 0x10
STATE_TRANSFER = 0x11

PARTITION_PAYLOAD = 0x08
# A plausible Navi31 request sequence (assumption): every resolvable item once, the
# partition payload last. 18 items, within Navi31's 19.
DEFAULT_ORDER: tuple[int, ...] = (0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x80, 0x81,
                                  *range(0x82, 0x89), 0x89, PARTITION_PAYLOAD)
# SPI_GET_MODEL_ID's answer: the flash part's JEDEC bytes, e.g. C8 60 15 (assumed encoding).

# What START accepts per item: exact sizes, 16-byte tables, or anything up to the cap.
FIXED_SIZES = {0x01: 0x54, 0x04: 0x1000, 0x05: 0x1000, 0x06: 0x20, 0x07: 0x20, 0x80: 4, 0x89: 0x100}
TABLE_ITEMS = (0x02, 0x03, 0x81)
SIGNATURE_ITEMS = range(0x82, 0x89)
MAX_ITEM_SIZE = 0x10000

# Modelled firmware time per command (assumption: "a few µs"); flash busy time from §7.
COMMAND_SECONDS = 2e-6
START_SECONDS = 5e-6
END_SECONDS = 20e-6
SECTOR_ERASE_SECONDS = 50e-3
PAGE_PROGRAM_SECONDS = 0.5e-3

# Firmware stages.
IDLE, RECEIVING, DONE = 0, 1, 2

STATE_MAGIC = 0x4D505350  # "PSPM"
SRAM_FILE = "psp_sram.bin"
SRAM_PAYLOAD = 0                    # the partition payload: at most the whole flash
SRAM_ITEM = FLASH_SIZE        # the item being received, when it is not the payload
SRAM_SIZE = SRAM_ITEM + MAX_ITEM_SIZE

_U32 = struct.Struct("<I")
_F64 = struct.Struct("<d")


class Answer(NamedTuple):
    error: int
    response: int = 0
    seconds: float = COMMAND_SECONDS


class Slot(NamedTuple):
    location: int
    size: int


class _U32Field:
    def __init__(self, offset: int):
        self.offset = offset

    def __get__(self, state: _State, owner: type | None = None) -> int:
        return _U32.unpack_from(state.mem, self.offset)[0]

    def __set__(self, state: _State, value: int) -> None:
        _U32.pack_into(state.mem, self.offset, value & 0xFFFFFFFF)


class _F64Field:
    def __init__(self, offset: int):
        self.offset = offset

    def __get__(self, state: _State, owner: type | None = None) -> float:
        return _F64.unpack_from(state.mem, self.offset)[0]

    def __set__(self, state: _State, value: float) -> None:
        _F64.pack_into(state.mem, self.offset, value)


class _State:
    """The firmware's variables, laid out in the board's persistent "psp" region."""

    magic = _U32Field(0x00)
    stage = _U32Field(0x04)           # IDLE, RECEIVING or DONE
    step = _U32Field(0x08)            # index into the order: the item requested now
    busy = _U32Field(0x0C)            # a command runs until done_at
    command = _U32Field(0x10)
    error = _U32Field(0x14)
    response = _U32Field(0x18)
    done_at = _F64Field(0x20)
    item = _U32Field(0x28)            # the session: item, announced size, bytes received
    size = _U32Field(0x2C)
    received = _U32Field(0x30)
    staged_payload = _U32Field(0x34)  # bytes of a completed item 0x08 held in SRAM
    boot_partition = _U32Field(0x38)
    live_set = _U32Field(0x3C)        # b0 ADDR_LO given, b1 ADDR_HI given
    live_lo = _U32Field(0x40)
    live_hi = _U32Field(0x44)

    def __init__(self, mem: memoryview):
        self.mem = mem


class PspMailbox:
    def __init__(self, board: Board):
        self.board = board
        self.order = check_order(board.config.get("psp_order"))
        self.sos = bool(board.variant.get("sos"))
        self.state = _State(board.files.region("psp"))
        self._sram_map: mmap.mmap | None = None
        if self.state.magic != STATE_MAGIC:
            self.power_on()
        self._handlers: dict[int, Callable[[int], Answer]] = {
            GET_BOOT_PARTITION: lambda _: Answer(OK, self.state.boot_partition),
            GET_FB_STATE: lambda _: Answer(OK, 1 if self.sos else 0),  # trained memory only with SOS
            SPI_GET_MODEL_ID: lambda _: Answer(OK, int.from_bytes(self.board.chip.part.jedec, "big")),
            GET_TRANSFER_TYPE: self._get_transfer_type,
            START_TRANSFER: self._start,
            DATA_TRANSFER: self._data,
            END_TRANSFER: self._end,
            LIVE_ADDR_LO: self._live_address(0),
            LIVE_ADDR_HI: self._live_address(1),
            LIVE_UPDATE: self._live_update,
        }
        board.on_write(R.MP0_C2PMSG_73, self._doorbell)
        for offset in (R.MP0_C2PMSG_115, R.MP0_C2PMSG_116):
            board.on_read(offset, self._observe(offset))
            board.on_write(offset, self._overwrite(offset))

    def power_on(self) -> None:
        """The boot firmware starts over (board creation, or a GPU reset)."""
        self.state.mem[:] = bytes(len(self.state.mem))
        meta = synth.read_metadata(self.board.files.flash)
        self.state.boot_partition = meta.active if meta and meta.active in (0, 1) else 0
        self.board.set32(R.MP0_C2PMSG_115, R.PSP_READY)
        self.board.set32(R.MP0_C2PMSG_116, 0)
        self.board.set32(R.MP0_C2PMSG_73, 0)
        self.state.magic = STATE_MAGIC  # last: a host killed mid-way powers on again

    # -- registers -----------------------------------------------------------------------------
    def _doorbell(self, value: int) -> None:
        if value != 1:
            return
        board, state = self.board, self.state
        board.set32(R.MP0_C2PMSG_73, 0)
        self._settle()
        if state.busy:
            return
        command = (board.get32(R.MP0_C2PMSG_115) >> 16) & 0xFF
        answer = self._execute(command, board.get32(R.MP0_C2PMSG_116))
        state.command, state.error, state.response = command, answer.error, answer.response
        state.done_at = board.clock.now() + answer.seconds
        state.busy = 1
        board.set32(R.MP0_C2PMSG_115, command << 16)

    def _settle(self) -> bool:
        """Publish the running command's result if its time has come (True if it did now).
        Results are published lazily, so every access to the mailbox registers settles
        first: what the host sees is what an eager firmware would have left there."""
        state = self.state
        if not state.busy or self.board.clock.now() < state.done_at:
            return False
        self.board.set32(R.MP0_C2PMSG_116, state.response)
        self.board.set32(R.MP0_C2PMSG_115, R.PSP_READY | state.command << 16 | state.error)
        state.busy = 0
        return True

    def _observe(self, offset: int) -> Callable[[], int]:
        def hook() -> int:
            self._settle()
            return self.board.get32(offset)
        return hook

    def _overwrite(self, offset: int) -> Callable[[int], None]:
        def hook(value: int) -> None:
            # The result was published before this write landed, so the write wins.
            if self._settle():
                self.board.set32(offset, value)
        return hook

    def _execute(self, command: int, argument: int) -> Answer:
        fault = self.board.faults.psp_errors.get(command)
        if fault is not None:
            return Answer(fault)
        handler = self._handlers.get(command)
        return handler(argument) if handler else Answer(INVALID_COMMAND)

    # -- the IFWI stream -----------------------------------------------------------------------
    def _requested(self) -> int:
        return self.order[self.state.step]

    def _refusal(self) -> int:
        if self.sos:
            return PARTITION_UPDATE
        return STATE_TRANSFER if self.state.stage == DONE else OK

    def _get_transfer_type(self, _argument: int) -> Answer:
        if refusal := self._refusal():
            return Answer(refusal)
        phase = 2 if self.state.step == len(self.order) - 1 else 1
        return Answer(OK, phase << 8 | self._requested())

    def _start(self, argument: int) -> Answer:
        state = self.state
        item, size = argument & 0xFF, argument >> 8
        if self._refusal():
            error = self._refusal()
        elif state.stage == RECEIVING:
            error = STATE_TRANSFER
        elif item != self._requested():
            error = INVALID_PARAMETER
        else:
            error = self._check_size(item, size)
        if error:
            return Answer(error, seconds=START_SECONDS)
        state.item, state.size, state.received = item, size, 0
        if item == PARTITION_PAYLOAD:
            state.staged_payload = 0
        state.stage = RECEIVING
        return Answer(OK, seconds=START_SECONDS)

    def _check_size(self, item: int, size: int) -> int:
        if size == 0 or size % 4:
            return INVALID_PARAMETER
        if item == PARTITION_PAYLOAD:
            # ISH B's size is not among what the update changes: the payload must fill it exactly.
            slot = self._partition_b()
            return slot if isinstance(slot, int) else _exactly(size, slot.size)
        if item in FIXED_SIZES:
            return _exactly(size, FIXED_SIZES[item])
        if size > (SECTOR if item in TABLE_ITEMS else MAX_ITEM_SIZE):
            return OUT_OF_BOUNDS
        return INVALID_PARAMETER if item in TABLE_ITEMS and size % 0x10 else OK

    def _data(self, argument: int) -> Answer:
        state = self.state
        if refusal := self._refusal():
            return Answer(refusal)
        if state.stage != RECEIVING:
            return Answer(STATE_NOT_INITIALIZED)
        if state.received + 4 > state.size:
            return Answer(OUT_OF_BOUNDS)
        base = SRAM_PAYLOAD if state.item == PARTITION_PAYLOAD else SRAM_ITEM
        _U32.pack_into(self._sram, base + state.received, argument)
        state.received += 4
        return Answer(OK)

    def _end(self, argument: int) -> Answer:
        state = self.state
        if refusal := self._refusal():
            return Answer(refusal, seconds=END_SECONDS)
        if state.stage != RECEIVING:
            return Answer(STATE_NOT_INITIALIZED, seconds=END_SECONDS)
        state.stage = IDLE  # the session is over, whatever follows; a failed item is asked again
        item, sent = argument & 0xFF, argument >> 8
        if item != state.item or sent != state.received or sent != state.size:
            return Answer(STATE_TRANSFER, seconds=END_SECONDS)
        if item == PARTITION_PAYLOAD:
            state.staged_payload = state.size
        elif error := _parse(item, bytes(self._sram[SRAM_ITEM:SRAM_ITEM + state.size])):
            return Answer(error, seconds=END_SECONDS)
        if state.step < len(self.order) - 1:
            state.step += 1
            return Answer(OK, seconds=END_SECONDS)
        # The terminal item: without a received payload there is nothing to write.
        update = self._update_partition_b() if state.staged_payload else Answer(OK, seconds=0.0)
        if update.error == OK:
            state.stage = DONE
        return Answer(update.error, seconds=END_SECONDS + update.seconds)

    # -- the firmware's own flash writes -------------------------------------------------------
    def _partition_b(self) -> Slot | int:
        """Partition B as ISH B in the current flash describes it, or the error code."""
        header = bytes(self.board.files.flash[synth.ISH_B:synth.ISH_B + synth.ISH_BYTES])
        location, size = _u32(header, synth.ISH_LOCATION), _u32(header, synth.ISH_SIZE)
        if size == 0 or size % 4 or size == 0xFFFFFFFF or location == 0xFFFFFFFF:
            return PARSE_ON_CHIP
        if synth.cookie_offset(location, size) + SECTOR > FLASH_SIZE:
            return MAP_ON_CHIP
        return Slot(location, size)

    def _update_partition_b(self) -> Answer:
        slot = self._partition_b()
        if isinstance(slot, int):
            return Answer(slot)
        payload = bytes(self._sram[SRAM_PAYLOAD:SRAM_PAYLOAD + self.state.staged_payload])
        if len(payload) != slot.size:  # ISH B changed under the stream (a ROM_SW write)
            return Answer(PARTITION_UPDATE)
        flash = self.board.files.flash
        checksum = synth.fletcher32(payload)
        meta = synth.read_metadata(flash)
        updates = (meta.updates if meta else 0) + 1
        ish = bytearray(flash[synth.ISH_B:synth.ISH_B + synth.ISH_BYTES])
        _U32.pack_into(ish, synth.ISH_UPDATE_COUNTER, (_u32(ish, synth.ISH_UPDATE_COUNTER) + 1) & 0xFFFFFFFF)
        _U32.pack_into(ish, synth.ISH_CHECKSUM, synth.ish_checksum(ish))
        stamp = int(self.board.clock.now() * 1000)
        record = synth.metadata_record(synth.Metadata(active=1, updates=updates, b_checksum=checksum, stamp_ms=stamp))
        writes = ((synth.cookie_offset(*slot), synth.update_cookie(updates, checksum)),
                  (slot.location, payload),
                  (synth.ISH_B, bytes(ish)),
                  (synth.METADATA, record))
        seconds = 0.0
        for address, data in writes:
            written, spent = self._program(address, data)
            seconds += spent
            if not written:
                return Answer(WRITE_TO_SPI, seconds=seconds)
        return Answer(OK, seconds=seconds)

    def _program(self, address: int, data: bytes) -> tuple[bool, float]:
        """Rewrite the sectors under `data` (read, patch, erase, program); (written, seconds).
        A protected chip ignores erase and program at once, so a refusal costs no busy time."""
        first = address & ~(SECTOR - 1)
        last = (address + len(data) + SECTOR - 1) & ~(SECTOR - 1)
        board = self.board
        board.engine.settle(board.clock.now())        # a ROM_SW transaction already over lands first
        sectors = bytearray(board.files.flash[first:last])
        sectors[address - first:address - first + len(data)] = data
        if not board.chip.psp_update(first, bytes(sectors)):
            return False, 0.0
        return True, (last - first) // SECTOR * SECTOR_ERASE_SECONDS + _program_seconds(sectors)

    # -- the live path (SOS up) ----------------------------------------------------------------
    def _live_address(self, half: int) -> Callable[[int], Answer]:
        def command(argument: int) -> Answer:
            if not self.sos:
                return Answer(INVALID_COMMAND)
            if half:
                self.state.live_hi = argument
            else:
                self.state.live_lo = argument
            self.state.live_set |= 1 << half
            return Answer(OK)
        return command

    def _live_update(self, _argument: int) -> Answer:
        if not self.sos:
            return Answer(INVALID_COMMAND)
        if self.state.live_set != 3:
            return Answer(ADDRESS_NOT_SET)
        slot = self._partition_b()
        if isinstance(slot, int):
            return Answer(slot)
        meta = synth.read_metadata(self.board.files.flash)
        # The image staged in VRAM is not modelled, so the cookie cannot carry its checksum.
        cookie = synth.update_cookie((meta.updates if meta else 0) + 1, 0xFFFFFFFF)
        _, seconds = self._program(synth.cookie_offset(*slot), cookie)
        return Answer(WRITE_TO_SPI, seconds=COMMAND_SECONDS + seconds)

    # -- lifetime ------------------------------------------------------------------------------
    @property
    def _sram(self) -> mmap.mmap:
        if self._sram_map is None:
            fd = os.open(self.board.path / SRAM_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            try:
                if os.fstat(fd).st_size != SRAM_SIZE:
                    os.ftruncate(fd, SRAM_SIZE)
                self._sram_map = mmap.mmap(fd, SRAM_SIZE)
            finally:
                os.close(fd)
        return self._sram_map

    def close(self) -> None:
        if self._sram_map is not None:
            self._sram_map.close()
            self._sram_map = None
        self.state.mem.release()


def check_order(value: object) -> tuple[int, ...]:
    """The bootloader's item request order from board.json (None: the default order)."""
    if value is None:
        return DEFAULT_ORDER
    if (not isinstance(value, list) or not value
            or len(value) > 19 or any(type(item) is not int or not 0 < item <= 0xFF for item in value)):
        raise ValueError(f"board psp_order {value!r}: expected a non-empty list of at most 19 item ids 0x01..0xFF")
    return tuple(value)


def _u32(data: bytes | bytearray, offset: int) -> int:
    return _U32.unpack_from(data, offset)[0]


def _exactly(size: int, expected: int) -> int:
    if size == expected:
        return OK
    return OUT_OF_BOUNDS if size > expected else INVALID_PARAMETER


def _parse(item: int, data: bytes) -> int:
    """What the firmware checks in a received item before it moves on (error code or OK)."""
    if item == 0x01:
        return OK if data[:4] == synth.EFS_MAGIC else PARSE_OFF_CHIP
    if item in (0x02, 0x03):
        if (data[:4] != b"$PSP" or (_u32(data, 8) + 1) * 0x10 != len(data)
                or _u32(data, 4) != synth.fletcher32(data[8:])):
            return PARSE_OFF_CHIP
    if item == 0x81 and (data[:4] != b"$SGN" or (_u32(data, 8) + 1) * 0x10 != len(data)):
        return PARSE_OFF_CHIP
    if item in (0x06, 0x07) and _u32(data, synth.ISH_LOCATION) + _u32(data, synth.ISH_SIZE) > FLASH_SIZE:
        return ADDRESS_MAP
    if item == 0x80 and _u32(data, 0) + 0x10 > FLASH_SIZE:
        return ADDRESS_MAP
    if item in SIGNATURE_ITEMS and data == b"\xff" * len(data):
        return SIGNATURE_NOT_FOUND
    return OK


def _program_seconds(data: bytes | bytearray) -> float:
    blank = b"\xff" * PAGE
    pages = sum(1 for p in range(0, len(data), PAGE) if data[p:p + PAGE] != blank)
    return pages * PAGE_PROGRAM_SECONDS
