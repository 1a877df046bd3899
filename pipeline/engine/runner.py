"""Running jobs: one audited run per board, all boards concurrently, restore on every path.

Lifecycle of a run: record the run row, open the transport (and lock the board), run the
job's stages, and — whatever happened — restore registers inside a shielded cancel
scope, record the outcome, release the board. SIGINT/SIGTERM set a stop flag that the
stages honour at their next safe point; a second signal cancels outright (restore still
runs).
"""
from __future__ import annotations

import datetime as dt
import json
import os
import signal
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from collections.abc import Awaitable, Callable

import anyio

from amdflash.pipeline.engine import next_step
from amdflash.pipeline.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_REFUSED, Refusal
from amdflash.pipeline.logsetup import logger
from amdflash.pipeline.engine.progress import ProgressBoard
from amdflash.pipeline.engine.settle import settle_registers
from amdflash.store.reading import TrailSource
from amdflash.pipeline.engine.run_facts import host_facts
from amdflash.stages.device import AuditSink, Device, Interrupted, StopFlag
from amdflash.stages.open_transport import AuditedBar, AuditFailureError, BoardSpec, BoardSpecError, open_transport
from amdflash.stages.restore import restore_registers
from amdflash.stages.transport.base import NoBoardFound
from amdflash.stages.transport.lock import BoardBusy
from amdflash.store.status import PROCESS_STAGE, this_process
from amdflash.store.writer.process import AuditFailure, SpaceLow
from amdflash.store.writer.recorder import Recorder

if TYPE_CHECKING:
    from anyio.abc import TaskStatus

JobBody = Callable[[Device, "RunInfo"], Awaitable[dict[str, Any]]]


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


@dataclass
class RunInfo:
    """What a job body knows about its run, and what it reports back."""

    run_id: str
    spec: BoardSpec
    command: str
    arguments: dict[str, Any]
    image_sha256: str | None = None
    resumes_run_id: str | None = None
    output: list[str] = field(default_factory=list)   # lines to print when the run ends
    operator_claimed: str | None = None                # --operator NAME: recorded as claimed, beside the OS account
    # The trail as the command opened it before the run (store.reading.Trail): what the job reads
    # of earlier runs (stranded registers, the board's history) goes through it, never by path.
    trail: TrailSource = None
    advice: next_step.Advice = next_step.BARE          # the places the commands it suggests name (--db, --config)


@dataclass
class RunResult:
    run_id: str
    spec: str
    status: str          # succeeded | failed | interrupted
    exit_code: int
    error: str | None
    summary: dict[str, Any]
    output: list[str]


def say_now(info: RunInfo, line: str) -> None:
    """A line on stderr at once, not with the run's other lines at its end: what must be known
    even if the process is killed next (the backup's path), or what the end does not show for a
    run that did not succeed. Printed and flushed at once, on a terminal or not (logsetup)."""
    logger(run_id=info.run_id, board=str(info.spec)).info(f"{info.spec}: {line}")


def new_run_id() -> str:
    # 32 random bits, as uuid4().hex[:8] gave (its version bits lie beyond them), without uuid
    # (which loads platform and its regexes).
    return dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S") + "-" + os.urandom(4).hex()


async def run_board(body: JobBody, info: RunInfo, writer, stop: StopFlag, ui: ProgressBoard,
                    image_path: str | None) -> RunResult:
    recorder = ui.observe(Recorder(writer, info.run_id), str(info.spec), info.run_id)
    log = logger(run_id=info.run_id, board=str(info.spec))
    facts = host_facts()
    recorder.add("runs", command=info.command, arguments=json.dumps(info.arguments, sort_keys=True),
                 operator=facts.operator, operator_claimed=info.operator_claimed, host=facts.host,
                 machine_id=facts.machine_id, tool_version=facts.tool_version, tool_revision=facts.tool_revision,
                 clock_sync=facts.clock_sync, image_path=image_path, image_sha256=info.image_sha256,
                 board_spec=str(info.spec), resumes_run_id=info.resumes_run_id, at=now_iso())
    recorder.add("run_status", status="running", detail=None, at=now_iso())
    # Which process this is: while it lives the run is "running"; once it is gone, whatever
    # killed it, every view shows the run interrupted (store.status).
    stage(recorder, PROCESS_STAGE, "start", this_process())
    log.debug("run started", command=info.command)
    progress = ui.reporter(str(info.spec), info.run_id)

    dev: Device | None = None
    settled: list[str] = []     # what was put back of an earlier run's registers, in words
    lock = None
    registers = False   # a board reached through amdgpu has no BAR5: no registers to snapshot or restore
    status, code, error, summary = "failed", EXIT_FAILED, None, {}
    try:
        stage(recorder, "open_transport", "start")
        opened, lock = await anyio.to_thread.run_sync(open_transport, info.spec, lambda m: log.info(m))
        if opened.capability == "bar5":
            registers = True
            dev = Device(AuditedBar(opened.bar, recorder), opened.identity, recorder, stop, progress)
        else:
            # The driver owns BAR5: its jobs (amdgpu_jobs.py) drive the board through dev.amdgpu.
            dev = Device.through_amdgpu(opened.board, recorder, stop, progress)
        stage(recorder, "open_transport", "end", opened.identity.spec)
        dev.suggest = info.advice.command    # a step the board layer suggests names the run's --db/--config
        if registers:
            # Registers an earlier run left changed go back first; then the "before" snapshot.
            settled = await settle_registers(dev, info.trail or getattr(writer, "path", None))
            info.output += settled
        # The run and the registers as found are on record before the first register write:
        # a host that dies at that write still leaves a run to resume and values to restore.
        await anyio.to_thread.run_sync(recorder.durable)
        summary = await body(dev, info)
        status, code = "succeeded", EXIT_OK
    except anyio.get_cancelled_exc_class():
        status, code, error = "interrupted", EXIT_INTERRUPTED, "cancelled"
        raise
    except Exception as raised:
        e = primary_error(raised)
        if isinstance(e, Interrupted):
            status, code, error = "interrupted", EXIT_INTERRUPTED, str(e)
        elif isinstance(e, (Refusal, BoardBusy, NoBoardFound, BoardSpecError)):
            # A check failed before anything was written (or no board / another owner: nothing
            # was sent at all). The attempt stays on record, as a refusal.
            status, code, error = "refused", EXIT_REFUSED, _message(e)
        else:
            status, code, error = "failed", EXIT_FAILED, _message(e)
            recorder.add("errors", stage=getattr(e, "stage", None), message=error,
                         address=getattr(e, "address", None), at=now_iso())
            if not isinstance(e, (RuntimeError, OSError, ValueError, TimeoutError)):
                error = f"internal error {type(e).__name__}: {error} (-v shows where)"
                log.debug("unexpected failure", exc_info=raised)
    finally:
        with anyio.CancelScope(shield=True):
            if dev is not None and registers:
                stage(recorder, "restore", "start")
                try:
                    note = await dev.call(restore_registers, dev)
                    stage(recorder, "restore", "end", note)
                except Exception as e:
                    stage(recorder, "restore", "fail", _message(e))
                    # Both count: what went wrong, and which registers it left changed.
                    error = f"{error}; {_message(e)}" if error else _message(e)
                    status, code = "failed", EXIT_FAILED
            if dev is not None:
                await anyio.to_thread.run_sync(dev.bar.close)
            if lock is not None:
                lock.release()
            recorder.add("run_status", status=status, detail=error,
                         result_sha256=summary.get("result_sha256") if status == "succeeded" else None,
                         summary=json.dumps(summary, sort_keys=True, default=str), at=now_iso())
            try:
                await anyio.to_thread.run_sync(recorder.durable)
            except SpaceLow as e:
                # The end is committed and fsynced as `status`: the run is what its record says.
                # Only what would follow must not start; the next run refuses at its start.
                if _message(e) not in (error or ""):
                    info.output.append(f"warning: {_message(e)}")
            except Exception as e:
                error = error or _message(e)
                status, code = "failed", EXIT_FAILED
            log.debug("run ended", status=status, error=error)
            if status != "succeeded":
                # The run's lines are shown only on success: a refused or failed run still wrote
                # these registers back, before anything else, and says so.
                for line in settled:
                    say_now(info, line)
    return RunResult(info.run_id, str(info.spec), status, code, error, summary, info.output)


def primary_error(raised: BaseException) -> BaseException:
    """The one failure to report when concurrent stages failed together.

    When one cause (a dead audit trail, a stop request) hits several stages at once, anyio
    raises them as a group; the operator needs the cause, not the group.
    """
    if not isinstance(raised, BaseExceptionGroup):
        return raised
    leaves: list[BaseException] = []

    def walk(e: BaseException) -> None:
        if isinstance(e, BaseExceptionGroup):
            for sub in e.exceptions:
                walk(sub)
        elif not isinstance(e, anyio.get_cancelled_exc_class()):
            leaves.append(e)

    walk(raised)
    for kind in (Interrupted, Refusal, BoardBusy, AuditFailure, AuditFailureError):
        for leaf in leaves:
            if isinstance(leaf, kind):
                return leaf
    return leaves[0] if leaves else raised


def stage(recorder: AuditSink, name: str, event: str, detail: str | None = None) -> None:
    recorder.add("stages", stage=name, event=event, detail=detail, at=now_iso())


def _message(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    where = getattr(e, "where", None)     # the stage and unit a failure without an address of its own hit
    return f"{where}: {text}" if where else text


async def run_boards(make_body: Callable[[BoardSpec], tuple[JobBody, RunInfo]], specs: list[BoardSpec],
                     writer, show_progress: bool = True, image_path: str | None = None) -> list[RunResult]:
    """Run the job on every board concurrently; one board's failure does not stop the others."""
    stop = StopFlag()
    results: list[RunResult] = []
    started: dict[str, str] = {}      # spec -> run id, for runs a second signal cancels mid-way
    with ProgressBoard(enabled=show_progress) as ui:
        async with anyio.create_task_group() as tg:
            # No board's run begins before Ctrl-C is this watcher's: until then the event loop's
            # own handler (asyncio.Runner) takes it, cancelling this task, and a board task already
            # scheduled would still record its run before the cancellation reached it, leaving a
            # run on record that nothing reports (no resume advice, only "interrupted").
            await tg.start(_watch_signals, stop, tg.cancel_scope)

            async def one(spec: BoardSpec) -> None:
                body, info = make_body(spec)
                started[str(spec)] = info.run_id
                results.append(await run_board(body, info, writer, stop, ui, image_path))

            async with anyio.create_task_group() as boards:
                for spec in specs:
                    boards.start_soon(one, spec)
            tg.cancel_scope.cancel()   # stop the signal watcher
    finished = {r.spec for r in results}
    for spec in specs:
        if str(spec) not in finished:   # cancelled by a second signal before it could report
            results.append(RunResult(started.get(str(spec), ""), str(spec), "interrupted", EXIT_INTERRUPTED,
                                     "cancelled by a second signal, as soon as the device operation returned "
                                     "(registers restored)", {}, []))
    order = {str(s): i for i, s in enumerate(specs)}
    return sorted(results, key=lambda r: order.get(r.spec, 0))


async def _watch_signals(stop: StopFlag, scope: anyio.CancelScope,
                         *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        task_status.started()
        async for signum in signals:
            name = signal.Signals(signum).name
            if stop:
                scope.cancel()   # a second signal: stop now (restore still runs, shielded)
            else:
                stop.set(f"{name} received: stopped at a safe point")
                logger().warning("stopping at the next safe point", signal=name)
