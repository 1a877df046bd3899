"""Driver for the PSP boot-firmware mailbox (MP0 C2PMSG, docs/psp-mailbox.md).

Usable after an autonomous PSP boot and before a driver loads SOS. Probe is read-only in
effect; `ifwi_all` streams the items the bootloader asks for. The single-item `stream` and
`ifwi-step` are implemented for protocol documentation but the CLI refuses them: a stock
reflash through the live path failed validation. The SOS live update (LIVE_ADDR_LO/HI,
LIVE_UPDATE) is never sent: its command numbers stay listed with the rest (docs/psp-mailbox.md).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from collections.abc import Callable

from amdflash.stages.image import ifwi
from amdflash.stages.drivers.navi31 import regs as R
from amdflash.stages.transport.base import Bar5

GET_BOOT_PARTITION, LIVE_ADDR_LO, LIVE_ADDR_HI, LIVE_UPDATE = 0x01, 0x02, 0x03, 0x04
GET_FB_STATE, GET_TRANSFER_TYPE = 0x06, 0x07
START_TRANSFER, DATA_TRANSFER, END_TRANSFER, SPI_GET_MODEL_ID = 0x08, 0x09, 0x0A, 0x0B
TRANSFER_TYPE_GATED = 0xA
IFWI_MAX_ITEMS = 19      # Navi31's ROM item count
TERMINAL_PHASE = 2

# Error codes of C2PMSG_115 b15:0 (docs/psp-mailbox.md), in the firmware's own words.
ERRORS = dict(enumerate((
    "generic error", "out of bounds", "invalid parameter", "off-chip boot error", "address not set",
    "off-chip parse error", "address map error", "on-chip parse error", "full update error",
    "partition update error", "on-chip map error", "write to SPI error", "signature validation error",
    "invalid command", "signature not found", "state machine not initialised",
    "state machine transfer error", "initialisation error",
), start=0x01))

DISABLED_REASON = ("firmware-mediated writes are disabled: on a stock board the PSP live path parsed "
                   "the IFWI but failed with status 0xC (write to SPI error) after writing an "
                   "$AMDVBFL cookie; use 'amdflash flash' (the ROM_SW path) for recovery")


class PspError(RuntimeError):
    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        self.code = code


class PspTimeout(PspError, TimeoutError):
    pass


def describe_error(code: int) -> str:
    return f"{code:#x} ({ERRORS.get(code, 'unknown error')})"


@dataclass(frozen=True)
class ProbeResult:
    answers: dict[str, tuple[int, int]]   # name -> (error, response)

    @property
    def transfer_type(self) -> int:
        return self.answers["transfer_type"][1]

    @property
    def gated(self) -> bool:
        return self.answers["transfer_type"][0] == TRANSFER_TYPE_GATED or self.transfer_type == TRANSFER_TYPE_GATED


@dataclass(frozen=True)
class StreamedItem:
    item: int
    phase: int
    offset: int
    size: int


class PspMailbox:
    def __init__(self, bar: Bar5, timeout: float = 10.0, poll_interval: float = 100e-6):
        self.bar = bar
        self.timeout = timeout
        self.poll_interval = poll_interval
        self._known_ready = False   # the last completion already showed the ready bit

    def command(self, command: int, argument: int | None = None, timeout: float | None = None) -> tuple[int, int]:
        """Run one mailbox command: (error, response)."""
        bar = self.bar
        if not self._known_ready:
            status = bar.read32(R.MP0_C2PMSG_115)
            if not status & R.PSP_READY:
                raise PspError(f"PSP mailbox not ready before command {command:#x} (C2PMSG_115={status:#010x})")
        self._known_ready = False
        if argument is not None:
            bar.write32(R.MP0_C2PMSG_116, argument & 0xFFFFFFFF)
        bar.write32(R.MP0_C2PMSG_115, command << 16)
        bar.write32(R.MP0_C2PMSG_73, 1)
        status = self._wait_ready(command, timeout or self.timeout)
        self._known_ready = True
        error = status & 0xFFFF
        response = bar.read32(R.MP0_C2PMSG_116) if command not in (DATA_TRANSFER,) or error else 0
        return error, response

    def _wait_ready(self, command: int, timeout: float) -> int:
        clock = self.bar.clock
        deadline = clock.now() + timeout
        while True:
            status = self.bar.read32(R.MP0_C2PMSG_115)
            if status & R.PSP_READY:
                return status
            if clock.now() >= deadline:
                raise PspTimeout(f"PSP mailbox command {command:#x} timed out after {timeout:g} s "
                                 f"(C2PMSG_115={status:#010x})")
            clock.sleep(self.poll_interval)

    def require(self, command: int, argument: int | None = None, name: str = "",
                timeout: float | None = None) -> int:
        error, response = self.command(command, argument, timeout)
        if error:
            raise PspError(f"PSP {name or hex(command)} failed: error {describe_error(error)}", error)
        return response

    def probe(self) -> ProbeResult:
        queries = {"boot_partition": GET_BOOT_PARTITION, "fb_state": GET_FB_STATE,
                   "model_id": SPI_GET_MODEL_ID, "transfer_type": GET_TRANSFER_TYPE}
        return ProbeResult({name: self.command(command) for name, command in queries.items()})

    def stream(self, payload: bytes, item: int, transfer_type: int | None = None,
               on_progress: Callable[[int, int], None] | None = None) -> None:
        """Stream one item the bootloader asked for: START, DATA per dword, END."""
        ifwi.check_stream_payload(payload)
        if not 0 <= item <= 0xFF:
            raise ValueError("item id must fit in 8 bits")
        if transfer_type is None:
            transfer_type = self.require(GET_TRANSFER_TYPE, name="GET_TRANSFER_TYPE")
        if transfer_type & 0xFF != item:
            raise PspError(f"the bootloader requests item {transfer_type & 0xFF:#x}, not {item:#x}")
        self.require(START_TRANSFER, len(payload) << 8 | item, "START_TRANSFER")
        sent = 0
        words = struct.unpack(f"<{len(payload) // 4}I", payload)
        try:
            for word in words:
                self.require(DATA_TRANSFER, word, f"DATA_TRANSFER at {sent:#x}")
                sent += 4
                if on_progress and not sent % 0x1000:
                    on_progress(sent, len(payload))
        except BaseException:
            # Close the interrupted session once with the bytes actually sent.
            try:
                self.command(END_TRANSFER, sent << 8 | item, timeout=10.0)
            except Exception:
                pass
            raise
        # END is sent once: if the bootloader rejects it, there is no second END.
        self.require(END_TRANSFER, sent << 8 | item, "END_TRANSFER", timeout=60.0)

    def ifwi_all(self, image: bytes, on_item: Callable[[StreamedItem], None] | None = None,
                 on_progress: Callable[[int, int], None] | None = None) -> list[StreamedItem]:
        """Stream every requested item until the terminal (phase 2) item has been sent."""
        problems = ifwi.check_image(image)
        if problems:
            raise ifwi.IfwiError("; ".join(problems))
        done: list[StreamedItem] = []
        error, state = self.command(GET_TRANSFER_TYPE)
        if TRANSFER_TYPE_GATED in (error, state):
            raise PspError("update commands are gated (transfer type 0xA): SOS is up; reset the card and "
                           "do not initialise a driver/SOS before streaming", error or None)
        if error:
            raise PspError(f"PSP GET_TRANSFER_TYPE failed: error {describe_error(error)}", error)
        for _ in range(IFWI_MAX_ITEMS):
            item, phase = state & 0xFF, state >> 8
            offset, payload = ifwi.resolve_item(image, item)
            self.stream(payload, item, state, on_progress)
            streamed = StreamedItem(item, phase, offset, len(payload))
            done.append(streamed)
            if on_item:
                on_item(streamed)
            if phase == TERMINAL_PHASE:
                return done
            state = self.require(GET_TRANSFER_TYPE, name="GET_TRANSFER_TYPE")
        raise PspError(f"the bootloader did not reach the terminal phase within {IFWI_MAX_ITEMS} items "
                       f"(last state {state:#x})")
