"""Driver tests: the drivers over an emulated board, through the Bar5 interface only."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from amdflash.stages.drivers.flash.spinor import SpiNor
from amdflash.stages.drivers.navi31 import regs as R
from amdflash.stages.drivers.navi31.romsw import RomSw, RomSwOptions
from amdflash.stages.sim import SimBar5


class Opened:
    def __init__(self, path: Path, profile: str | None, **engine):
        self.bar = SimBar5(path, profile=profile)
        self.engine = RomSw(self.bar, RomSwOptions(**engine))
        self.ops: list[tuple[int, int, int, int]] = []   # (opcode, address, tx_len, rx_len)
        self.engine.observer = lambda op, addr, ab, tx, rx: self.ops.append((op, addr, tx, rx))
        self.nor = SpiNor(self.engine)

    @property
    def board(self):  # noqa: ANN201
        return self.bar.board

    def writes_to_flash(self) -> list[tuple[int, int]]:
        """(opcode, address) of every program/erase/status-write transaction sent."""
        return [(op, a) for op, a, tx, rx in self.ops if op in (0x02, 0x20, 0x52, 0xD8, 0x60, 0xC7, 0x01, 0x31, 0x11)]

    def close(self) -> None:
        self.engine.close()
        self.bar.close()


@pytest.fixture
def open_board(make_board) -> Callable[..., Opened]:
    opened: list[Opened] = []

    def make(path: Path | None = None, profile: str | None = None, engine: dict | None = None, **board) -> Opened:
        o = Opened(path or make_board(**board), profile, **(engine or {}))
        opened.append(o)
        return o

    yield make
    for o in opened:
        o.close()


SAVED = (R.GPIOPAD_MASK, R.GPIOPAD_A, R.GPIOPAD_EN, R.PAGE_MIRROR_CNTL, R.ROM_CNTL, R.ROM_SW_COMMAND)


def registers(board) -> dict[int, int]:  # noqa: ANN001
    return {r: board.get32(r) for r in SAVED}
