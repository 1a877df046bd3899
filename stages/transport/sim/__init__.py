"""The emulated Navi31 board and ASM24 bridge: hardware for tests, demo and benchmarks.

`open_bar(path, transport)` is the entry point the reference-client conformance runner
uses (../shared/conformance): a persistent board whose `read`/`write` calls are each
charged as one streamed BAR access on the named cost profile.
"""
from __future__ import annotations

import os

from stages.transport.sim.board import Board
from stages.transport.sim.create import create_board

__all__ = ["Board", "SimBar", "create_board", "open_bar"]


class SimBar:
    """BAR5 of an emulated board as byte reads and writes, each one streamed access."""

    def __init__(self, board: Board):
        self.board = board

    def read(self, offset: int, size: int) -> bytes:
        return self.board.stream_read(offset, size)

    def write(self, offset: int, data: bytes) -> None:
        self.board.stream_write(offset, bytes(data))

    def close(self) -> None:
        self.board.close()


def open_bar(path: str | os.PathLike[str], transport: str = "asm24") -> SimBar:
    return SimBar(Board(path, profile=transport))
