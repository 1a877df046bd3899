"""amdgpu tests: an emulated sysfs tree per test, the transport pointed at it."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from amdflash.stages.transport.amdgpu import AmdgpuBoard, find_amdgpu
from amdflash.stages.transport.sim.amdgpu_sysfs import EmulatedAmdgpu, Psp, VirtualClock
from tests.pipeline.conftest import cli, db  # noqa: F401 - fixtures


@pytest.fixture
def emulated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., EmulatedAmdgpu]]:
    """emulated(**EmulatedAmdgpu options, outcome=..., busy=...) -> a tree the transport (and the
    CLI run in this process) is pointed at."""
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


def open_board(emu: EmulatedAmdgpu, **options: Any) -> tuple[AmdgpuBoard, VirtualClock]:  # noqa: ANN401
    """The transport on the tree, its polls on a virtual clock that lets the emulated kernel act."""
    clock = VirtualClock(emu)
    [device] = find_amdgpu(emu.root / "devices")
    return AmdgpuBoard(device, clock=clock, dev_dri=emu.dev_dri, debugfs_dri=emu.debugfs_dri, **options), clock
