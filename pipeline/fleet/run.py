"""Running one job on many boards of a line: take the places, run on each board's host, report.

Lifecycle: open a coordinator session; pick the places whose tags match `--where`; refuse
(and report) every board resource the operator's rules do not allow (trust.py: a host not
in the allowlist, or not the exporter's own, unexpected attributes, a wrong database);
reserve and acquire each of the others (a place someone else holds is skipped and
reported, never taken); run
the job on each board's host through the labgrid driver, the boards of one host in batches
(one `amdflash fleet job` over SSH, one amdflash process writing the host's audit trail), at
most `parallel` boards at once; give the places back; one row per board.

What can go wrong on the way, and what happens:
* a host's exporter stops publishing its boards mid-job for longer than `exporter_grace`
  seconds: the host's jobs are asked to stop at their next safe point (their runs are then
  interrupted, and the next flash of the image resumes them). A shorter gap — an exporter
  restarted to publish a hot-plugged bridge — is ridden out;
* a job's amdflash process is killed on its host: the host-side job still reports the runs,
  which stay unfinished (interrupted here; resumed by the next flash);
* the host-side job itself is killed (its top process, or its whole process group): its
  boards' jobs stop at their next safe point, and the client — which heard each board's run
  id as it began — reports them interrupted with those ids. Only a host it cannot reach, or
  a job that goes on there after the connection dropped, is "lost";
* the coordinator goes away: running jobs go on (they only need SSH to their hosts) and are
  recorded on their hosts; the client says from when it could not see exporters and places,
  and which places it could not give back.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Sequence

from amdflash.pipeline.engine.next_step import BARE, Advice
from amdflash.pipeline.fleet.coordinator import BoardPlace, Coordinator
from amdflash.pipeline.fleet.labgrid_board import JobError, parse_results, started
from amdflash.pipeline.fleet.trust import HOST_KEY_FAILED, Allowlist, board_problem, shown
from amdflash.stages.files import OutputExists
from amdflash.stages.terminal import printable

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
    advice: str | None = None      # the host CLI's next step, as it told it
    next_step: str | None = None   # what the operator does next (a failed, interrupted or refused row)


@dataclass
class Live:
    """A board's job as it goes, from its host job's lines: for the live view."""

    place: str
    host: str
    stage: str = "waiting"
    done: int | None = None
    total: int | None = None
    unit: str = "bytes"
    rate: float | None = None
    eta: float | None = None
    status: str = "pending"
    heard: float = 0.0             # time.monotonic() of its last progress


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


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass
class _Job:
    """One board taken for this run."""

    board: BoardPlace
    token: str
    row: Row
    driver: Any = None
    gone_since: float | None = None

    @property
    def spec(self) -> str:
        return self.board.spec


@dataclass
class _Batch:
    """Boards of one host (and audit database) that one amdflash process works on."""

    jobs: list[_Job]
    proc: asyncio.subprocess.Process | None = None
    stop_reason: str | None = None

    @property
    def host(self) -> str:
        return self.jobs[0].board.host


def _json_lines(stdout: str) -> list[dict[str, Any]]:
    out = []
    for line in stdout.splitlines():
        if line.strip().startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict) and isinstance(value.get("board"), str):
                out.append(value)
    return out


def _reported(stdout: str) -> set[str]:
    """The boards whose result the host-side job printed."""
    return {v["board"] for v in _json_lines(stdout) if "status" in v}


def _announced(stdout: str) -> dict[str, str]:
    """Each board's run id, as the host-side job said it when the run began."""
    return {v["board"]: v["run_id"] for v in _json_lines(stdout)
            if "status" not in v and isinstance(v.get("run_id"), str)}


def _driver(board: BoardPlace, allow: Allowlist, host_command: Sequence[str]) -> Any:
    """The labgrid target for one (checked) place: its board resource and our driver, activated,
    with the operator's allowlist and host command."""
    from labgrid import Target
    from labgrid.factory import target_factory

    from amdflash.pipeline.fleet.labgrid_board import AmdflashDriver

    target = Target(board.place)
    resource = target_factory.make_resource(target, board.cls, board.resource, board.args)
    resource.extra = {}   # no proxy: the client reaches the allowlisted host itself
    hosts = [f"{host}={db}" for host, db in allow.hosts.items()]
    # labgrid ships no type information (mypy does not see the fields its attrs base class adds):
    # the driver's own fields are set after it is made.
    driver = AmdflashDriver(target, None)
    driver.host_command, driver.hosts = shlex.join(host_command), hosts
    target.activate(driver)
    return driver


def batches(jobs: list[_Job], parallel: int) -> list[_Batch]:
    """The jobs by host (exporter, audit database), cut so that `parallel` boards are shared
    out over the hosts, and in the order that takes the hosts in turn."""
    by_key: dict[tuple[str, ...], list[_Job]] = {}
    for job in jobs:
        args = job.board.args
        key = (job.board.exporter, job.board.host, str(args.get("db")))
        by_key.setdefault(key, []).append(job)
    size = max(1, parallel // max(1, len(by_key)))
    cut = [[_Batch(group[i:i + size]) for i in range(0, len(group), size)] for group in by_key.values()]
    return [batch for turn in itertools.zip_longest(*cut) for batch in turn if batch is not None]


NOT_INSTALLED = "is not installed on this machine"


def _missing_program(e: BaseException) -> str | None:
    """The program this machine lacks, when `e` is starting one that is not on PATH."""
    name = getattr(e, "filename", None) if isinstance(e, FileNotFoundError) else None
    if isinstance(name, str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*", name) and shutil.which(name) is None:
        return name
    return None


# A place's dump is written here as PLACE.bin: one file name, never a path.
DUMP_NAME = re.compile(r"[A-Za-z0-9_+-][A-Za-z0-9._+-]{0,199}")


class FleetRun:
    def __init__(self, address: str, where: dict[str, str], job: str, image: Path | None = None,
                 output_dir: Path | None = None, parallel: int = 8, exporter_grace: float = 30.0,
                 flash_args: Sequence[str] = (), allow: Allowlist | None = None,
                 host_command: Sequence[str] = ("amdflash",), operator: str | None = None,
                 overwrite: bool = False, hosts: Sequence[str] = (), advice: Advice = BARE):
        self.allow = allow or Allowlist({})       # the hosts the operator allows (none: nothing runs)
        self.host_command = list(host_command)   # amdflash on those hosts: the operator's, never a resource's
        # Who runs the job, as the hosts' runs record it (claimed: a host's account is its own).
        self.operator = operator
        self.address = address
        self.where = where
        self.job = job
        self.image = image
        self.output_dir = output_dir
        self.overwrite = overwrite           # dump: replace an existing DIR/PLACE.bin (as `dump --overwrite`)
        self.hosts = list(hosts)             # --hosts as given (else the config's fleet_hosts): for next steps
        self.advice = advice                 # this command line's --db and --config: for next steps
        self.parallel = max(1, parallel)
        self.exporter_grace = exporter_grace
        self.flash_args = list(flash_args)   # --force / --expect-part / --start-over, for each host's flash
        self.live: dict[str, Live] = {}      # place → its job as it goes (for the live view)
        self.notes: list[str] = []
        self.stopping = False
        self._free = self.parallel          # board slots (`--parallel`)
        self._slots = asyncio.Condition()
        self._prepare = asyncio.Lock()
        self._staged: dict[str, str] = {}   # host → the image's path there
        self._missing: dict[str, str] = {}  # place → the program this machine lacked to run its job
        self._batches: list[_Batch] = []

    async def run(self) -> FleetResult:
        coordinator = await Coordinator(self.address).open()
        rows: list[Row] = []
        jobs: list[_Job] = []
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self._on_signal)
        try:
            boards, unusable = coordinator.board_places(self.where)
            rows += [Row(name, "-", status="unavailable", error=why) for name, why in unusable.items()]
            for board in boards:
                row = Row(board.place, board.host, spec=board.spec)
                rows.append(row)
                refused = board_problem(board.cls, board.args, board.extra, self.allow, board.exporter)
                if refused:
                    # The coordinator's word is not the operator's: reported, never run.
                    row.status, row.error = "refused", f"resource refused, nothing run: {refused}"
                    self.notes.append(f"refused the board resource "
                                      f"{shown(f'{board.exporter}/{board.group}/{board.resource}')} of place "
                                      f"{shown(board.place)}: {refused}")
                    continue
                if self.job == "dump" and not DUMP_NAME.fullmatch(board.place):
                    # Its dump would be DIR/PLACE.bin: a place named `../x` or `/etc/x` would put it
                    # elsewhere. Place names are the coordinator's; `fleet places` makes `HOST-GROUP`.
                    row.status, row.error = "refused", (f"place {shown(board.place)} cannot name a dump file in "
                                                        f"{self.output_dir or '.'} (letters, digits, . _ + - only, "
                                                        "not starting with .): nothing run")
                    continue
                if self.job == "dump" and not self.overwrite and os.path.lexists(self._dump_path(board.place)):
                    # As `amdflash dump` refuses an existing file: found now, before the board is
                    # reserved, not after its dump ran (checked again, atomically, when it is copied).
                    row.status, row.error = "refused", (f"{self._dump_path(board.place)} exists (use --overwrite "
                                                        "to replace it): nothing run")
                    row.next_step = self._next_step(row, board)
                    continue
                if self.stopping:
                    row.status, row.error = "not started", "stopped by the operator before it started"
                    continue
                token, why = await coordinator.take(board, self.where)
                if why:
                    row.status, row.error = "skipped", f"not taken: {why}"
                else:
                    assert token is not None   # taken: a reservation token, no reason
                    jobs.append(_Job(board, token, row))
                    self.live[board.place] = Live(board.place, board.host)
            self._batches = batches(jobs, self.parallel)
            await self._run_batches(coordinator, jobs)
        finally:
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(signum)
            await self._give_back(coordinator, jobs)
            await coordinator.close()
        for job in jobs:
            job.row.next_step = self._next_step(job.row, job.board)
        for live in self.live.values():
            live.status = next((r.status for r in rows if r.board == live.place), live.status)
        return FleetResult(rows, self.notes)

    def _fleet_again(self, place: str, *extra: str) -> str:
        """This fleet command for one place (shell-quoted, to paste): with this run's coordinator,
        allowed hosts, --config and --db, and absolute paths, so that pasted anywhere it reaches
        the same place through the same coordinator, not whatever $LG_COORDINATOR says there."""
        words = ["fleet", self.job]
        if self.image is not None:
            words.append(os.path.abspath(self.image))
        if self.job == "dump":
            words.append(os.path.abspath(self.output_dir or "."))
            words += ["--overwrite"] if self.overwrite or "--overwrite" in extra else []
        words += ["--where", f"name={place}"]
        if self.job == "flash":
            words += ["--yes", *[a for a in self.flash_args if a != "--start-over"], *extra]
        words += ["--coordinator", self.address]
        for hosts in self.hosts:
            words += ["--hosts", hosts]
        return self.advice.command(*words)

    def _next_step(self, row: Row, board: BoardPlace) -> str | None:
        """A failed, interrupted, lost or refused row's next step, naming the host where it is
        to be run there (the host CLI's own advice carries that host's --db)."""
        host = board.host
        on_host = shlex.join(["ssh", host, *self.host_command,
                              *(["--db", str(board.args["db"])] if board.args.get("db") else [])])
        if row.status in ("interrupted", "not started"):
            resumes = " (it resumes the interrupted run)" if self.job == "flash" and row.run_id else ""
            return self._fleet_again(row.board) + resumes
        if row.status == "refused" and self.job == "dump" and "(use --overwrite" in (row.error or ""):
            return f"{self._fleet_again(row.board, '--overwrite')} (replaces the file; or move it away first)"
        if row.status == "refused" and "--start-over" in (row.error or ""):
            return (f"{self._fleet_again(row.board, '--start-over')} (a new flash; or finish the unfinished "
                    f"one on {host} as the error says)")
        if row.status in ("failed", "lost") and row.advice:
            return f"on {host}: {row.advice}"
        if row.status in ("failed", "lost") and row.run_id:
            return f"{on_host} report {shlex.quote(row.run_id)} (the run as {host} recorded it)"
        program = self._missing.get(row.board) if row.status == "refused" else None
        if program:     # a name from PATH that was not found here (never a host's words)
            again = self._fleet_again(row.board)
            return (f"install {shlex.quote(program)} on this machine (Debian: apt-get install "
                    f"{shlex.quote(program)}), then {again}")
        if row.status == "unreachable":
            again = self._fleet_again(row.board)
            return f"check that {host} answers: {shlex.join(['ssh', host, 'true'])}; then {again}"
        return None

    def _heard(self, batch: _Batch, line: str) -> None:
        """A line of a host job as it comes: a board's run id or progress, for the live view."""
        if not line.startswith("{"):
            return
        try:
            value = json.loads(line)
        except ValueError:
            return
        if not isinstance(value, dict):
            return
        job = next((j for j in batch.jobs if j.spec == value.get("board")), None)
        if job is None:
            return
        live = self.live.setdefault(job.board.place, Live(job.board.place, job.board.host))
        progress = value.get("progress")
        if isinstance(progress, dict) and isinstance(progress.get("stage"), str):
            live.stage, live.status, live.heard = progress["stage"][:20], "running", time.monotonic()
            live.done, live.total = (int(n) if (n := _number(progress.get(k))) is not None else None
                                     for k in ("done", "total"))
            live.rate, live.eta = _number(progress.get("rate")), _number(progress.get("eta"))
            live.unit = "items" if progress.get("unit") == "items" else "bytes"
        elif isinstance(value.get("status"), str):
            live.status = value["status"][:20]
        elif isinstance(value.get("run_id"), str):
            live.status = "running"
            job.row.run_id = value["run_id"]

    async def _run_batches(self, coordinator: Coordinator, jobs: list[_Job]) -> None:
        if not jobs:
            return
        watcher = asyncio.create_task(self._watch(coordinator, jobs))
        try:
            await asyncio.gather(*(self._one(coordinator, batch) for batch in self._batches))
        finally:
            watcher.cancel()
        self._coordinator_note(coordinator)

    def _on_signal(self) -> None:
        if self.stopping:   # a second signal: stop waiting; the jobs themselves go on on their hosts
            for batch in self._batches:
                if batch.proc is not None and batch.proc.returncode is None:
                    batch.proc.kill()
            return
        self.stopping = True
        for batch in self._batches:
            self._stop(batch, "stopped by the operator")

    def _stop(self, batch: _Batch, reason: str) -> None:
        proc = batch.proc
        if batch.stop_reason is None and proc is not None and proc.returncode is None and proc.stdin:
            batch.stop_reason = reason
            proc.stdin.write(b"stop\n")

    def _gone_too_long(self, coordinator: Coordinator, job: _Job, now: float) -> str | None:
        """What happened to the board, once its exporter has not published it for the grace period."""
        gone = None if coordinator.lost else coordinator.resource_state(job.board)
        if not gone:
            job.gone_since = None
            return None
        if job.gone_since is None:
            job.gone_since = now
        if now - job.gone_since < self.exporter_grace:
            return None
        return f"{gone} (for {now - job.gone_since:.0f} s)"

    async def _watch(self, coordinator: Coordinator, jobs: list[_Job]) -> None:
        while True:
            await asyncio.sleep(0.2)
            if coordinator.lost:
                continue   # nothing more can be seen; the jobs go on
            now = time.monotonic()
            for batch in self._batches:
                for job in batch.jobs:
                    gone = self._gone_too_long(coordinator, job, now)
                    if gone:
                        self._stop(batch, gone)

    async def _one(self, coordinator: Coordinator, batch: _Batch) -> None:
        size = len(batch.jobs)
        async with self._slots:
            await self._slots.wait_for(lambda: self._free >= size)
            self._free -= size
        try:
            await self._run_batch(coordinator, batch)
        finally:
            async with self._slots:
                self._free += size
                self._slots.notify_all()

    async def _run_batch(self, coordinator: Coordinator, batch: _Batch) -> None:
        if self.stopping:
            for job in batch.jobs:
                job.row.status, job.row.error = "not started", "stopped by the operator before it started"
            return
        now = time.monotonic()
        for job in list(batch.jobs):
            gone = self._gone_too_long(coordinator, job, now)
            if gone:
                job.row.status, job.row.error = "unavailable", f"not started: {gone}"
                batch.jobs.remove(job)
        if not batch.jobs:
            return
        try:
            async with self._prepare:   # labgrid's SSH connection manager is not thread-safe
                argv = await asyncio.to_thread(self._command, batch)
        except Exception as e:
            self._not_started(batch, e)
            return
        wall0 = time.monotonic()
        for attempt in (1, 2):
            try:
                stdout, stderr = await self._start(batch, argv)
            except OSError as e:     # ssh itself could not be started (missing; a command line too long)
                self._not_started(batch, e)
                return
            if started(stdout) or self.stopping or attempt == 2 or HOST_KEY_FAILED in stderr:
                break
            # The session never began (nothing ran on the boards): once more, after a pause.
            await asyncio.sleep(1.0)
        wall = time.monotonic() - wall0
        if not started(stdout):
            tail = (stderr.strip().splitlines() or ["no output"])[-1]
            for job in batch.jobs:
                job.row.status, job.row.wall_seconds = "unreachable", round(wall, 3)
                job.row.error = f"the job could not be started on {batch.host} (nothing ran): {tail}"
                if HOST_KEY_FAILED in stderr:
                    job.row.status = "refused"
                    job.row.error = (f"the SSH host key of {batch.host} is not the one known_hosts holds for it (or "
                                     "none is there): nothing ran; check its fingerprint and add it (README, "
                                     "'SSH keys')")
            return
        ended: bool | None = None
        if any(job.spec not in _reported(stdout) for job in batch.jobs):
            ended = await asyncio.to_thread(self._job_gone, batch, stdout)
        self._record(batch, stdout, stderr, wall, ended)
        if self.job == "dump":
            for job in batch.jobs:
                await self._fetch(job)

    def _not_started(self, batch: _Batch, e: Exception) -> None:
        """A batch whose job could not be started from here: the host was never asked."""
        program = _missing_program(e)
        said = str(e)
        if isinstance(e, subprocess.CalledProcessError) and e.output:
            # A program labgrid ran (rsync) failed: its own last words say why (the exception's
            # text does not carry them, and they are no longer printed on stdout).
            output = e.output.decode(errors="replace") if isinstance(e.output, bytes) else str(e.output)
            last = [line.strip() for line in output.replace("\r", "\n").splitlines() if line.strip()]
            said = f"{said}: {printable(last[-1])}" if last else said
        for job in batch.jobs:
            job.row.status, job.row.error = "unreachable", f"{batch.host}: {said}"
            if program:
                # Not the host's doing: it was never asked (labgrid copies images with rsync).
                self._missing[job.row.board] = program
                job.row.status = "refused"
                job.row.error = (f"nothing ran on {batch.host}: {program} {NOT_INSTALLED} (this machine runs "
                                 "each job over ssh and copies its image with rsync: README, 'SSH keys')")

    async def _start(self, batch: _Batch, argv: list[str]) -> tuple[str, str]:
        # Its own session: a Ctrl-C at the terminal reaches this client only, which then asks
        # the jobs to stop at a safe point; a killed ssh would leave them unstoppable.
        proc = batch.proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True, limit=1 << 24)
        if self.stopping:
            self._stop(batch, "stopped by the operator")
        assert proc.stdout is not None and proc.stderr is not None
        errors = asyncio.ensure_future(proc.stderr.read())
        lines = []
        # Line by line as the host job says them: run ids and progress reach the live view at once.
        while line := await proc.stdout.readline():
            text = line.decode(errors="replace")
            lines.append(text)
            self._heard(batch, text)
        stderr = await errors
        await proc.wait()
        return "".join(lines), stderr.decode(errors="replace")

    def _command(self, batch: _Batch) -> list[str]:
        for job in batch.jobs:
            job.driver = _driver(job.board, self.allow, self.host_command)
        first = batch.jobs[0].driver
        args = []
        if self.image is not None:
            # One copy per host serves all its boards (labgrid keeps it by content hash).
            if first.host not in self._staged:
                self._staged[first.host] = first.stage_image(self.image)
            args.append(self._staged[first.host])
        if self.job == "flash":
            args += self.flash_args
        return first.command(self.job, *args, also=[job.spec for job in batch.jobs[1:]], operator=self.operator)

    @staticmethod
    def _job_gone(batch: _Batch, stdout: str) -> bool | None:
        """Whether the host-side job that started (its first line names its pid) has ended
        there: True, it ended (killed) without reporting; False, it still runs (the
        connection dropped, not the job); None, its host cannot be reached."""
        first = json.loads(stdout.lstrip().split("\n", 1)[0])
        pid = first.get("pid")
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
            return None
        try:
            done = subprocess.run(batch.jobs[0].driver._on_host(["test", "-e", f"/proc/{pid}"]),
                                  stdin=subprocess.DEVNULL, capture_output=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return {0: False, 1: True}.get(done.returncode)

    def _record(self, batch: _Batch, stdout: str, stderr: str, wall: float, gone: bool | None = None) -> None:
        code = batch.proc.returncode if batch.proc else -1
        try:
            results = parse_results(stdout, stderr, code if code is not None else -1)
        except JobError as e:
            results, lost = {}, str(e)
        else:
            lost = "the job printed no result for this board"
        began = _announced(stdout)
        for job in batch.jobs:
            row = job.row
            result = results.get(job.spec)
            if result is None:
                row.wall_seconds, row.run_id = round(wall, 3), began.get(job.spec)
                if gone:
                    row.status = "interrupted"
                    row.error = (f"the fleet job on {batch.host} ended without reporting (exit status {code}: "
                                 "killed); " + (f"its run {row.run_id} was told to stop at a safe point and is "
                                                "recorded in that host's audit trail; the next fleet flash of "
                                                "this image resumes it" if row.run_id else
                                                "no run of this board had begun"))
                    continue
                row.status = "lost"
                row.error = (f"{lost}; lost contact with {batch.host}: the job may have gone on there and is "
                             f"recorded in that host's audit trail")
                continue
            row.status = result.get("status") or "failed"
            row.run_id = result.get("run_id")
            row.job = result.get("job")
            row.resumes = result.get("resumes")
            row.modelled_seconds = result.get("modelled_seconds")
            row.wall_seconds = result.get("wall_seconds") or round(wall, 3)
            row.error = result.get("error")
            row.output = result.get("output")
            row.lines = result.get("lines") or []
            row.advice = result.get("advice") if isinstance(result.get("advice"), str) else None
            if batch.stop_reason and row.status == "interrupted":
                row.error = f"{batch.stop_reason}: stopped at a safe point ({row.error})"

    async def _fetch(self, job: _Job) -> None:
        row = job.row
        if row.status != "succeeded" or not row.output:
            return
        if not DUMP_NAME.fullmatch(job.board.place):      # refused before its job; never a path here
            row.status, row.error = "failed", f"dump made on {job.board.host} but not copied here: place " \
                                              f"{shown(job.board.place)} cannot name a file"
            return
        local = self._dump_path(job.board.place)
        try:
            await asyncio.to_thread(job.driver.fetch, row.output, local, self.overwrite)
            row.output = str(local)
        except OutputExists as e:     # made here since the check before its job: left as it was
            row.status, row.error = "failed", (f"dump made on {job.board.host} (kept there as "
                                               f"{shown(row.output)}) but not copied here: {e}")
        except Exception as e:
            row.status, row.error = "failed", f"dump made on {job.board.host} but not copied here: {e}"

    def _dump_path(self, place: str) -> Path:
        return Path(self.output_dir or ".") / f"{place}.bin"

    def _coordinator_note(self, coordinator: Coordinator) -> None:
        if coordinator.lost and coordinator.lost_at is not None:
            at = time.strftime("%H:%M:%S", time.localtime(coordinator.lost_at))
            flooded = getattr(coordinator, "flooded", None)      # the session ended by a flood of entries
            how = f"was dropped at {at} ({flooded})" if flooded else f"stopped answering at {at}"
            self.notes.append(f"the coordinator at {self.address} {how}: from then on "
                              f"exporters and places could not be seen (a board whose exporter went away "
                              f"was not stopped); the jobs ran on and are recorded on their hosts")

    async def _give_back(self, coordinator: Coordinator, jobs: list[_Job]) -> None:
        kept = []
        for job in jobs:
            why = await coordinator.give_back(job.board, job.token)
            if why:
                kept.append(f"{shown(job.board.place)} ({why})")
        if kept:
            self.notes.append(f"could not release {', '.join(kept)}: once the coordinator answers, "
                              f"'labgrid-client -p PLACE release' each of them")
