"""The flash stage graph: which stage feeds which, through which bounded queue, and why.

    backup units ─reads(4)─▶ plan ─work(4)─▶ erase ─erased(4)─▶ program ─programmed(4)─▶ verify
     (in memory)              diff and        intent,            program the          read back,
                              choose erases   barrier, erase     planned pages        compare, retry

Before this graph runs, the flash job has identified the board, checked the image and the
protection, and read, recorded and stored the backup (the board's original content): the graph
only ever writes units whose original content is on record. Each stage is a task; every board
access goes through the board's one worker slot (`Device.call`), so the stages take turns on
the board, and a stage's host-side work (a durable barrier, bookkeeping) overlaps another
stage's board work.

Every queue holds at most `size` items: memory stays bounded whatever the flash size, and no
stage runs far ahead of the next, so when the operator stops a run (the erase stage stops
taking work at its next safe point) only the few units already past the erase are finished.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from amdflash.pipeline.engine.runner import stage
from amdflash.stages.confirm import Expectation
from amdflash.stages.device import Device
from amdflash.stages.erase import erase_stage
from amdflash.stages.drivers.flash.chips import ChipInfo
from amdflash.stages.drivers.flash.planning import PlanCosts, UnitPlan
from amdflash.stages.plan import PlanSummary, WorkItem, plan
from amdflash.stages.program import program_stage
from amdflash.stages.snapshot import UnitRead
from amdflash.stages.verify import verify_stage

T = TypeVar("T")


@dataclass(frozen=True)
class Queue(Generic[T]):
    """A bounded queue from one stage to the next."""

    name: str
    size: int          # items in flight, at most
    why: str

    def open(self) -> tuple[MemoryObjectSendStream[T], MemoryObjectReceiveStream[T]]:
        return anyio.create_memory_object_stream[T](self.size)


READS: Queue[UnitRead] = Queue(
    "reads", 4, "backup units (4 KiB each) to the planner; the planner holds one 64 KiB erase block of them "
                "itself, so a short queue is enough to keep it fed")
WORK: Queue[WorkItem] = Queue(
    "work", 4, "planned steps (an erase and the units it takes, or one program-only unit) waiting for the "
               "erase stage: planning is host work and stays only a few steps ahead of the board")
ERASED: Queue[UnitPlan] = Queue(
    "erased", 4, "units erased (or needing no erase) waiting to be programmed: once four wait, the erase "
                 "stage waits too, so it is never more than the block it just erased ahead of programming")
PROGRAMMED: Queue[UnitPlan] = Queue(
    "programmed", 4, "units programmed waiting to be read back: verification trails programming closely")

# (producer, queue, consumer), in the order the data flows.
GRAPH: tuple[tuple[str, Queue[Any], str], ...] = (
    ("backup", READS, "plan"),
    ("plan", WORK, "erase"),
    ("erase", ERASED, "program"),
    ("program", PROGRAMMED, "verify"),
)


@dataclass
class FlashOutcome:
    stopped: bool      # the operator stopped the run before the erase stage took all the work
    retries: int       # units whose read-back differed at first and were written again


async def run_flash_graph(dev: Device, image: bytes, units: list[UnitRead], chip: ChipInfo, summary: PlanSummary,
                          retries: int, reads: int, written: Expectation | None = None) -> FlashOutcome:
    """Write and verify `units` (their backup already read and on record) towards `image`;
    `written`: the image as the read-back expects it (confirmation by expectation)."""
    n = len(units)
    reads_tx, reads_rx = READS.open()
    work_tx, work_rx = WORK.open()
    erased_tx, erased_rx = ERASED.open()
    programmed_tx, programmed_rx = PROGRAMMED.open()
    results: dict[str, Any] = {}

    async def feed() -> None:
        async with reads_tx:
            for u in units:
                await reads_tx.send(u)

    async def timed(name: str, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        # Each stage's outcome is its own: it ends when its input has run dry, stops early
        # when the operator asked, and is cancelled (not failed) when another stage failed.
        stage(dev.recorder, name, "start")
        try:
            results[name] = await fn(*args)
        except anyio.get_cancelled_exc_class():
            stage(dev.recorder, name, "cancelled", "stopped: another stage failed, or the run was cancelled")
            raise
        except BaseException as e:
            stage(dev.recorder, name, "fail", str(e) or type(e).__name__)
            raise
        stage(dev.recorder, name, "stop" if results[name] is True else "end")

    async with anyio.create_task_group() as tg:
        tg.start_soon(feed)                                                      # backup -> reads
        tg.start_soon(timed, "plan", plan, dev, image, [e.size for e in chip.erase_types], chip.page_size,
                      reads_rx, work_tx, summary, PlanCosts.for_chip(chip))     # reads -> plan -> work
        tg.start_soon(timed, "erase", erase_stage, dev, work_rx, erased_tx, n)  # work -> erase -> erased
        tg.start_soon(timed, "program", program_stage, dev, erased_rx, programmed_tx, n)
        tg.start_soon(timed, "verify", verify_stage, dev, programmed_rx, n, retries, reads, written)
    # Stopped means work was left undone: the erase stage stopped taking items (a stop after
    # the last verify is no interruption).
    return FlashOutcome(stopped=bool(results.get("erase")), retries=int(results.get("verify", 0)))
