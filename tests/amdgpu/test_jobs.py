"""The amdgpu job bodies on the virtual clock: a 150 s timeout recorded and reported in no wall time."""
from __future__ import annotations

import time
from typing import Any

import anyio
import pytest

from amdflash.pipeline.amdgpu_jobs import AmdgpuFlashJob, ByTransport
from amdflash.pipeline.errors import Refusal
from amdflash.pipeline.runner import RunInfo
from amdflash.stages.device import Device, Interrupted, StopFlag
from amdflash.stages.open_transport import BoardSpec
from amdflash.stages.part_check import PartPolicy
from amdflash.stages.transport.amdgpu import VbflashError
from amdflash.stages.transport.sim.synth import synthetic_ifwi
from tests.amdgpu.conftest import open_board


class Rows:
    """What a job records, kept in memory."""

    run_id = "test"
    register_writes = 0
    failed = None

    def __init__(self) -> None:
        self.rows: list[tuple[str, dict[str, Any]]] = []

    def add(self, table: str, **row: Any) -> None:  # noqa: ANN401
        self.rows.append((table, row))

    def durable(self) -> None:
        self.rows.append(("durable", {}))

    def stage(self, name: str) -> list[tuple[str, str | None]]:
        return [(r["event"], r["detail"]) for t, r in self.rows if t == "stages" and r["stage"] == name]


def run_job(board, body, stop: StopFlag | None = None) -> tuple[Rows, RunInfo]:  # noqa: ANN001
    rows = Rows()
    dev = Device(board, board.identity, rows, stop or StopFlag())
    info = RunInfo("test", BoardSpec("amdgpu", board.device.address), "flash", {})

    async def main() -> None:
        await ByTransport("flash", body, body)(dev, info)

    anyio.run(main)
    return rows, info


def test_a_stuck_psp_fails_the_job_after_1500_polls_of_virtual_time(emulated):
    emu = emulated(outcome="stuck")
    board, clock = open_board(emu)
    start = time.perf_counter()
    with pytest.raises(VbflashError, match="after 1500 polls"):
        run_job(board, AmdgpuFlashJob(synthetic_ifwi(9), PartPolicy()))
    assert clock.t == pytest.approx(149.9) and time.perf_counter() - start < 20


def test_the_job_records_each_status_change_and_the_outcome(emulated):
    emu = emulated(busy=0.25)
    board, _ = open_board(emu)
    rows, info = run_job(board, AmdgpuFlashJob(synthetic_ifwi(9), PartPolicy()))
    events = rows.stage("psp_vbflash")
    assert [e for e, _ in events] == ["start", "staged", "triggered", "status", "status", "status", "end"]
    assert [d.split()[0] for e, d in events if e == "status"] == ["0x0", "0x1", "0x80000000"]
    # Write-ahead: the intent is durable before the driver gets the image.
    order = [r.get("event", table) for table, r in rows.rows if table == "durable" or r.get("stage") == "psp_vbflash"]
    assert order[:3] == ["start", "durable", "staged"]
    assert any("PSP update succeeded" in line for line in info.output)


def test_a_stop_before_the_psp_gets_the_image_leaves_it_untouched(emulated):
    emu = emulated()
    board, _ = open_board(emu)
    stop = StopFlag()
    stop.set("SIGINT received")
    with pytest.raises(Interrupted):
        run_job(board, AmdgpuFlashJob(synthetic_ifwi(9), PartPolicy()), stop)
    assert (emu.device / "psp_vbflash").stat().st_size == 0 and emu.statuses == ["0x0"]


def test_a_bar5_job_on_an_amdgpu_board_is_refused(emulated):
    board, _ = open_board(emulated())

    async def never(dev, info):  # noqa: ANN001, ANN202
        raise AssertionError("the BAR5 body must not run")

    dev = Device(board, board.identity, Rows(), StopFlag())
    with pytest.raises(Refusal, match="'dump' needs BAR5"):
        anyio.run(ByTransport("dump", never, None), dev, RunInfo("t", BoardSpec("amdgpu"), "dump", {}))
