"""amdgpu tests: an emulated sysfs tree per test, the transport pointed at it."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from amdflash.stages.transport.amdgpu import AmdgpuBoard, find_amdgpu
from amdflash.stages.sim.amdgpu_sysfs import EmulatedAmdgpu, KernelClock, Psp
from tests.pipeline.engine.conftest import cli, db  # noqa: F401 - fixtures


@pytest.fixture
def emulated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., EmulatedAmdgpu]]:
    """emulated(**EmulatedAmdgpu options, outcome=..., busy=...) -> a tree the transport (and the
    CLI, in this process or another) is pointed at: AMDFLASH_SIM_AMDGPU puts its emulated kernel
    behind the attributes, on the tree's virtual clock."""
    made: list[EmulatedAmdgpu] = []

    def make(outcome: str = "success", busy: float = 0.15, error_status: int = 0x80000005,
             **options: Any) -> EmulatedAmdgpu:  # noqa: ANN401
        emu = EmulatedAmdgpu(tmp_path / f"tree{len(made)}", psp=Psp(outcome, busy, error_status), **options)
        made.append(emu)
        for key, value in emu.env.items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("AMDFLASH_LOCK_DIR", str(tmp_path / "locks"))
        monkeypatch.delenv("AMDFLASH_SIM_USB", raising=False)
        return emu

    yield make
    for emu in made:
        emu.close()


def open_board(emu: EmulatedAmdgpu, **options: Any) -> tuple[AmdgpuBoard, KernelClock]:  # noqa: ANN401
    """The transport on the tree, its attributes answered by the tree's kernel, on its clock."""
    [device] = find_amdgpu(emu.root / "devices")
    board = AmdgpuBoard(device, dev_dri=emu.dev_dri, debugfs_dri=emu.debugfs_dri, io=emu.kernel(), **options)
    assert isinstance(board.clock, KernelClock)
    return board, board.clock
