"""The amdgpu job bodies on the tree's virtual clock: a 60 s trigger and a 150 s timeout recorded
and reported in no wall time; the driver's buffer emptied before anything is staged."""
from __future__ import annotations

import hashlib
import time
from typing import Any

import anyio
import pytest

from amdflash.pipeline.engine.amdgpu_jobs import AmdgpuFlashJob, ByTransport
from amdflash.pipeline.errors import Refusal
from amdflash.pipeline.engine.runner import RunInfo
from amdflash.stages.device import Device, Interrupted, StopFlag
from amdflash.stages.open_transport import BoardSpec
from amdflash.stages.image.part_check import PartPolicy
from amdflash.stages.transport.amdgpu import VbflashError
from amdflash.stages.sim.synth import synthetic_ifwi
from tests.stages.amdgpu.conftest import open_board


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


def run_job(board, body, stop: StopFlag | None = None, rows: Rows | None = None) -> tuple[Rows, RunInfo]:  # noqa: ANN001
    rows = rows or Rows()
    dev = Device.through_amdgpu(board, rows, stop or StopFlag())
    info = RunInfo("test", BoardSpec("amdgpu", board.device.address), "flash", {})

    async def main() -> None:
        await ByTransport("flash", body, body)(dev, info)

    anyio.run(main)
    return rows, info


def test_a_stuck_psp_fails_the_job_after_the_60_s_trigger_and_1500_polls_of_virtual_time(emulated):
    emu = emulated(outcome="stuck")
    board, clock = open_board(emu)
    start = time.perf_counter()
    with pytest.raises(VbflashError, match="after 1500 polls"):
        run_job(board, AmdgpuFlashJob(synthetic_ifwi(9), PartPolicy()))
    assert clock.now() == pytest.approx(60 + 149.9) and time.perf_counter() - start < 20


def test_the_job_records_each_step_and_the_outcome(emulated):
    emu = emulated(busy=0.25)
    board, _ = open_board(emu)
    image = synthetic_ifwi(9)
    rows, info = run_job(board, AmdgpuFlashJob(image, PartPolicy()))
    events = rows.stage("psp_vbflash")
    assert [e for e, _ in events] == ["start", "clearing", "cleared", "staging", "staged", "triggered", "status",
                                      "end"]
    assert [d.split()[0] for e, d in events if e == "status"] == ["0x80000000"]
    # Write-ahead: the intent, the clearing and the staging are durable before the driver gets a byte.
    order = [r.get("event", table) for table, r in rows.rows if table == "durable" or r.get("stage") == "psp_vbflash"]
    assert order[:7] == ["start", "durable", "clearing", "durable", "cleared", "staging", "durable"]
    assert any("PSP update succeeded" in line for line in info.output)
    assert emu.handed_over == [f"{len(image):#x} {hashlib.sha256(image).hexdigest()}"]


@pytest.mark.parametrize("limit", [0x300000, 0x1000000])
def test_a_staging_left_behind_never_reaches_the_psp(emulated, limit):
    """An interrupted update (or another program) left bytes in the driver's buffer: the PSP
    gets exactly this run's image — on a 3 MiB kernel as on a 16 MiB one."""
    emu = emulated(limit=limit)
    emu.stage_leftover(synthetic_ifwi(4)[:0x200000])
    board, _ = open_board(emu)
    image = synthetic_ifwi(9)
    rows, _ = run_job(board, AmdgpuFlashJob(image, PartPolicy()))
    assert emu.handed_over == [f"{len(image):#x} {hashlib.sha256(image).hexdigest()}"]
    [(_, cleared)] = [(e, d) for e, d in rows.stage("psp_vbflash") if e == "cleared"]
    assert f"{limit - 0x200000 + 0x1000:#x} bytes of zeros, then ENOMEM" in cleared
    assert "psp_vbflash_status reads 0x0" in cleared
    assert emu.state.heap_overflows == 0 and emu.updates == 1


def test_after_a_trigger_the_buffer_is_known_empty_and_is_not_cleared(emulated):
    emu = emulated()
    board, _ = open_board(emu)
    run_job(board, AmdgpuFlashJob(synthetic_ifwi(9), PartPolicy()))
    rows, _ = run_job(board, AmdgpuFlashJob(synthetic_ifwi(9), PartPolicy()))
    events = rows.stage("psp_vbflash")
    assert [e for e, _ in events][:3] == ["start", "buffer", "staging"]
    assert "empty: psp_vbflash_status 0x80000000 shows a trigger" in events[1][1]


def test_a_buffer_that_cannot_be_emptied_refuses_the_run_saying_what_to_do(emulated, monkeypatch):
    from amdflash.stages.transport import amdgpu

    monkeypatch.setattr(amdgpu, "CLEAR_BOUND", 0x10000)
    emu = emulated()
    board, _ = open_board(emu)
    with pytest.raises(Refusal, match="may hold bytes this run did not stage .*Nothing was handed to the PSP. "
                                      "Do not read psp_vbflash; reboot the machine"):
        run_job(board, AmdgpuFlashJob(synthetic_ifwi(9), PartPolicy()))
    assert emu.handed_over == [] and emu.updates == 0


def test_a_stop_before_the_psp_gets_the_image_leaves_it_untouched(emulated):
    emu = emulated()
    board, _ = open_board(emu)
    stop = StopFlag()
    stop.set("SIGINT received")
    with pytest.raises(Interrupted):
        run_job(board, AmdgpuFlashJob(synthetic_ifwi(9), PartPolicy()), stop)
    assert emu.state.image_size == 0 and not emu.state.allocated and emu.handed_over == []


def test_a_bar5_job_on_an_amdgpu_board_is_refused(emulated):
    board, _ = open_board(emulated())

    async def never(dev, info):  # noqa: ANN001, ANN202
        raise AssertionError("the BAR5 body must not run")

    dev = Device.through_amdgpu(board, Rows(), StopFlag())
    with pytest.raises(Refusal, match="'dump' needs BAR5"):
        anyio.run(ByTransport("dump", never, None), dev, RunInfo("t", BoardSpec("amdgpu"), "dump", {}))
