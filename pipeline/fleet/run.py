"""Running one job on many boards of a line: take the places, run on each board's host, report.

Lifecycle: open a coordinator session; pick the places whose tags match `--where`; reserve
and acquire each (a place someone else holds is skipped and reported, never taken); run
`amdflash fleet job` on each board's host, at most `parallel` at once, through the labgrid
driver; give the places back; one row per board.

What can go wrong on the way, and what happens:
* the board's exporter stops publishing it mid-job for longer than `exporter_grace` seconds:
  the job is asked to stop at its next safe point (its run is then interrupted, and the next
  flash of the image resumes it). A shorter gap — an exporter restarted to publish a
  hot-plugged bridge — is ridden out;
* the job's amdflash process is killed on its host: the host-side job still reports the
  run, which stays unfinished (interrupted here; resumed by the next flash);
* the coordinator goes away: running jobs go on (they only need SSH to their hosts) and are
  recorded on their hosts; the client says from when it could not see exporters and places,
  and which places it could not give back.
"""
from __future__ import annotations

import asyncio
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from amdflash.pipeline.fleet.coordinator import BoardPlace, Coordinator
from amdflash.pipeline.fleet.labgrid_board import started

EXIT_OK, EXIT_FAILED, EXIT_REFUSED, EXIT_INTERRUPTED = 0, 1, 2, 130
#: Row status → exit status (the worst row decides, as for multi-board runs).
STATUS_EXIT = {"succeeded": EXIT_OK, "failed": EXIT_FAILED, "lost": EXIT_FAILED, "unreachable": EXIT_FAILED,
               "refused": EXIT_REFUSED, "skipped": EXIT_REFUSED, "unavailable": EXIT_REFUSED,
               "interrupted": EXIT_INTERRUPTED, "not started": EXIT_INTERRUPTED}


@dataclass
class Row:
    board: str                     # the place
    host: str
    spec: str | None = None
    status: str = "pending"
    run_id: str | None = None
    job: str | None = None         # flash | resume | verify | dump | info
    resumes: str | None = None
    modelled_seconds: float | None = None
    wall_seconds: float | None = None
    error: str | None = None
    output: str | None = None
    lines: list[str] = field(default_factory=list)


@dataclass
class FleetResult:
    rows: list[Row]
    notes: list[str]               # what the client could not see or do

    @property
    def exit_code(self) -> int:
        codes = {STATUS_EXIT.get(r.status, EXIT_FAILED) for r in self.rows}
        for code in (EXIT_INTERRUPTED, EXIT_FAILED, EXIT_REFUSED):
            if code in codes:
                return code
        return EXIT_OK

    def as_json(self) -> dict[str, Any]:
        return {"boards": [asdict(r) for r in self.rows], "notes": self.notes, "exit_code": self.exit_code}


@dataclass
class _Job:
    board: BoardPlace
    token: str
    row: Row
    driver: Any = None
    proc: asyncio.subprocess.Process | None = None
    stop_reason: str | None = None
    gone_since: float | None = None


def _driver(board: BoardPlace) -> Any:
    """The labgrid target for one place: its board resource and our driver, activated."""
    from labgrid import Target
    from labgrid.factory import target_factory

    from amdflash.pipeline.fleet.labgrid_board import AmdflashDriver

    target = Target(board.place)
    resource = target_factory.make_resource(target, board.cls, board.resource, board.entry.args)
    resource.extra = board.entry.extra   # labgrid's proxy settings for this exporter
    driver = AmdflashDriver(target, None)
    target.activate(driver)
    return driver


class FleetRun:
    def __init__(self, address: str, where: dict[str, str], job: str, image: Path | None = None,
                 output_dir: Path | None = None, parallel: int = 8, exporter_grace: float = 30.0):
        self.address = address
        self.where = where
        self.job = job
        self.image = image
        self.output_dir = output_dir
        self.parallel = max(1, parallel)
        self.exporter_grace = exporter_grace
        self.notes: list[str] = []
        self.stopping = False
        self._prepare = asyncio.Lock()
        self._staged: dict[str, str] = {}   # host → the image's path there

    async def run(self) -> FleetResult:
        coordinator = await Coordinator(self.address).open()
        rows: list[Row] = []
        jobs: list[_Job] = []
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self._on_signal, jobs)
        try:
            boards, unusable = coordinator.board_places(self.where)
            rows += [Row(name, "-", status="unavailable", error=why) for name, why in unusable.items()]
            for board in boards:
                row = Row(board.place, board.host, spec=board.entry.args.get("spec"))
                rows.append(row)
                if self.stopping:
                    row.status, row.error = "not started", "stopped by the operator before it started"
                    continue
                token, why = await coordinator.take(board, self.where)
                if why:
                    row.status, row.error = "skipped", f"not taken: {why}"
                else:
                    jobs.append(_Job(board, token, row))
            await self._run_jobs(coordinator, jobs)
        finally:
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(signum)
            await self._give_back(coordinator, jobs)
            await coordinator.close()
        return FleetResult(rows, self.notes)

    async def _run_jobs(self, coordinator: Coordinator, jobs: list[_Job]) -> None:
        if not jobs:
            return
        limit = asyncio.Semaphore(self.parallel)
        watcher = asyncio.create_task(self._watch(coordinator, jobs))
        try:
            await asyncio.gather(*(self._one(coordinator, job, limit) for job in jobs))
        finally:
            watcher.cancel()
        self._coordinator_note(coordinator)

    def _on_signal(self, jobs: list[_Job]) -> None:
        if self.stopping:   # a second signal: stop waiting; the jobs themselves go on on their hosts
            for job in jobs:
                if job.proc is not None and job.proc.returncode is None:
                    job.proc.kill()
            return
        self.stopping = True
        for job in jobs:
            self._stop(job, "stopped by the operator")

    def _stop(self, job: _Job, reason: str) -> None:
        if job.stop_reason is None and job.proc is not None and job.proc.returncode is None and job.proc.stdin:
            job.stop_reason = reason
            job.proc.stdin.write(b"stop\n")

    async def _watch(self, coordinator: Coordinator, jobs: list[_Job]) -> None:
        while True:
            await asyncio.sleep(0.2)
            if coordinator.lost:
                continue   # nothing more can be seen; the jobs go on
            now = time.monotonic()
            for job in jobs:
                gone = coordinator.resource_state(job.board)
                if not gone:
                    job.gone_since = None
                elif job.gone_since is None:
                    job.gone_since = now
                elif now - job.gone_since >= self.exporter_grace:
                    self._stop(job, f"{gone} (for {now - job.gone_since:.0f} s)")

    async def _one(self, coordinator: Coordinator, job: _Job, limit: asyncio.Semaphore) -> None:
        row = job.row
        async with limit:
            if self.stopping:
                row.status, row.error = "not started", "stopped by the operator before it started"
                return
            gone = None if coordinator.lost else coordinator.resource_state(job.board)
            if gone and job.gone_since is not None and time.monotonic() - job.gone_since >= self.exporter_grace:
                row.status, row.error = "unavailable", f"not started: {gone}"
                return
            try:
                async with self._prepare:   # labgrid's SSH connection manager is not thread-safe
                    argv = await asyncio.to_thread(self._command, job)
            except Exception as e:  # noqa: BLE001 - SSH or copying failed: nothing ran on the board
                row.status, row.error = "unreachable", f"{job.board.host}: {e}"
                return
            wall0 = time.monotonic()
            for attempt in (1, 2):
                stdout, stderr = await self._start(job, argv)
                if started(stdout) or self.stopping or attempt == 2:
                    break
                # The session never began (nothing ran on the board): once more, after a pause.
                await asyncio.sleep(1.0)
        if not started(stdout):
            row.wall_seconds = round(time.monotonic() - wall0, 3)
            tail = (stderr.strip().splitlines() or ["no output"])[-1]
            row.status = "unreachable"
            row.error = f"the job could not be started on {job.board.host} (nothing ran): {tail}"
            return
        self._record(job, stdout, stderr, time.monotonic() - wall0)
        if row.status == "succeeded" and self.job == "dump" and row.output:
            local = Path(self.output_dir or ".") / f"{job.board.place}.bin"
            try:
                await asyncio.to_thread(job.driver.fetch, row.output, local)
                row.output = str(local)
            except Exception as e:  # noqa: BLE001
                row.status, row.error = "failed", f"dump made on {job.board.host} but not copied here: {e}"

    async def _start(self, job: _Job, argv: list[str]) -> tuple[str, str]:
        # Its own session: a Ctrl-C at the terminal reaches this client only, which then asks
        # the job to stop at a safe point; a killed ssh would leave the job unstoppable.
        job.proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True)
        if self.stopping:
            self._stop(job, "stopped by the operator")
        stdout, stderr = await job.proc.communicate()
        return stdout.decode(errors="replace"), stderr.decode(errors="replace")

    def _command(self, job: _Job) -> list[str]:
        job.driver = _driver(job.board)
        args = []
        if self.image is not None:
            # One copy per host serves all its boards (labgrid keeps it by content hash).
            host = job.driver.host
            if host not in self._staged:
                self._staged[host] = job.driver.stage_image(self.image)
            args.append(self._staged[host])
        return job.driver.command(self.job, *args)

    def _record(self, job: _Job, stdout: str, stderr: str, wall: float) -> None:
        from amdflash.pipeline.fleet.labgrid_board import JobError, parse_result

        row = job.row
        row.wall_seconds = round(wall, 3)
        try:
            result = parse_result(stdout, stderr, job.proc.returncode if job.proc else -1)
        except JobError as e:
            row.status = "lost"
            row.error = (f"{e}; lost contact with {job.board.host}: the job may have gone on there and is "
                         f"recorded in that host's audit trail")
            return
        row.status = result.get("status") or "failed"
        row.run_id = result.get("run_id")
        row.job = result.get("job")
        row.resumes = result.get("resumes")
        row.modelled_seconds = result.get("modelled_seconds")
        row.error = result.get("error")
        row.output = result.get("output")
        row.lines = result.get("lines") or []
        if job.stop_reason and row.status == "interrupted":
            row.error = f"{job.stop_reason}: stopped at a safe point ({row.error})"

    def _coordinator_note(self, coordinator: Coordinator) -> None:
        if coordinator.lost and coordinator.lost_at is not None:
            at = time.strftime("%H:%M:%S", time.localtime(coordinator.lost_at))
            self.notes.append(f"the coordinator at {self.address} stopped answering at {at}: from then on "
                              f"exporters and places could not be seen (a board whose exporter went away "
                              f"was not stopped); the jobs ran on and are recorded on their hosts")

    async def _give_back(self, coordinator: Coordinator, jobs: list[_Job]) -> None:
        kept = []
        for job in jobs:
            why = await coordinator.give_back(job.board, job.token)
            if why:
                kept.append(job.board.place)
        if kept:
            self.notes.append(f"could not release {', '.join(kept)} (coordinator unreachable): once it is back, "
                              f"'labgrid-client -p PLACE release' each of them")
