"""BAR5 of an emulated board, reached the way a physical transport reaches it.

`SimBar` is the byte-level view the reference-client conformance runner needs (every call
one streamed access). `SimBar5` implements the drivers' `Bar5` interface: single
registers as single TLPs (a posted write, or a read with its completion), blocks as one
streamed access — the same choices the USB driver makes, so modelled costs agree.
"""
from __future__ import annotations

import os
from pathlib import Path

from amdflash.stages.transport.base import BoardIdentity
from amdflash.stages.sim.board import Board
from amdflash.stages.sim.state import C

DIAGNOSTIC_COUNTERS = ("protocol_violations", "unobserved_completions", "ignored_while_busy")


class SimBar:
    """BAR5 as byte reads and writes, each one streamed access."""

    def __init__(self, board: Board):
        self.board = board

    def read(self, offset: int, size: int) -> bytes:
        return self.board.stream_read(offset, size)

    def write(self, offset: int, data: bytes) -> None:
        self.board.stream_write(offset, bytes(data))

    def close(self) -> None:
        self.board.close()


class SimBar5:
    """The `Bar5` transport interface over an emulated board (`sim:PATH`)."""

    def __init__(self, path: str | os.PathLike[str], profile: str | None = None,
                 realtime_scale: float | None = None):
        self.board = Board(path, profile=profile, realtime_scale=realtime_scale)
        self.clock = self.board.clock
        resolved = Path(path).resolve()
        self.identity = BoardIdentity(
            spec=f"sim:{resolved}", kind="sim", serial=self.board.config.get("serial"),
            vendor_id=0x1002, device_id=0x744C,
            extra={"profile": self.board.cost.name, "emulated": True},
        )
        self._counted = {name: self.board.counters[C[name]] for name in DIAGNOSTIC_COUNTERS}

    def diagnostics(self) -> dict[str, int]:
        """What went wrong on the board since this transport opened it."""
        return {name: int(self.board.counters[C[name]] - start) for name, start in self._counted.items()}

    def read32(self, offset: int) -> int:
        return self.board.tlp_read32(offset)

    def write32(self, offset: int, value: int) -> None:
        self.board.tlp_write32(offset, value)

    def read_block(self, offset: int, size: int) -> bytes:
        return self.board.stream_read(offset, size)

    def write_block(self, offset: int, data: bytes) -> None:
        self.board.stream_write(offset, bytes(data))

    def close(self) -> None:
        self.board.close()


def open_bar(path: str | os.PathLike[str], transport: str = "asm24") -> SimBar:
    """Conformance entry point: a persistent board charged on the `transport` profile."""
    return SimBar(Board(path, profile=transport))
