"""PSP boot mailbox model (HARDWARE.md §5). STUB: being written."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stages.transport.sim.board import Board


class PspMailbox:
    def __init__(self, board: "Board"):
        self.board = board

    def close(self) -> None:
        pass
