"""`amdflash fleet job`: a job on some boards of this host, run on this host.

The fleet client starts this over SSH (labgrid's remote execution for a network resource),
once per host and batch of boards. It drives the host's own `amdflash` command line — the
jobs in child processes, the audit queries (`runs --format json`, `report RUN --format
json`) through the same entry point — so it depends only on the command-line contract. It
prints a first line saying it started, then as the jobs go each board's run id
({"board", "run_id"}) and progress ({"board", "progress": {stage, done, total, unit, rate,
eta}}, from the jobs' --log-json events), then one JSON result line per board.

* The boards of a batch run in ONE `amdflash` process (`--board` repeated): the host's audit
  trail has a single writer, as the store is built for; separate processes writing one
  database would queue for its lock. A board whose newest flash of this very image (same
  SHA-256) never finished — killed, still "running" in the trail, or interrupted — gets its
  own `amdflash resume RUN` process instead; a dump is one process per board (one file each).
* A line "stop" on stdin asks every job to stop at its next safe point (SIGTERM, as Ctrl-C).
  End of stdin — the client or its connection went away — changes nothing: the jobs finish
  and this host's trail records them.
* If a job process is killed, this still reports its boards' runs: those left "running" in the
  trail as interrupted, and one that recorded its end before the kill with that end.
* The job is a process group of its own (this process, the boards' amdflash processes and
  their audit writers). If this process is killed, its jobs are told (SIGTERM, as on Ctrl-C)
  to stop at their next safe point: no flash goes on that nobody watches. Each board's run id
  is printed as soon as the trail has it ({"board", "run_id"}, no "status"), so the client
  names the runs of a job killed before it could report them.
"""
from __future__ import annotations

import contextlib
import ctypes
import datetime as dt
import hashlib
import io
import json
import os
import signal
import socket
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

EXIT_TO_STATUS = {0: "succeeded", 1: "failed", 2: "refused", 130: "interrupted"}

CliMain = Callable[[list[str]], int]   # amdflash's command line: argv in, exit status out


def cli_json(cli_main: CliMain, global_args: list[str], *argv: str, attempts: int = 10) -> Any:
    """Run a read-only amdflash command in this process; its JSON output, or None on refusal
    (such as no audit database yet).

    Another job of this host may be creating the audit database at this very moment (the
    first flash on a new host); a query that fails for that is tried again shortly.
    """
    for attempt in range(attempts):
        out, err = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = cli_main([*global_args, "-q", *argv])
        except sqlite3.Error:
            if attempt == attempts - 1:
                raise
            time.sleep(0.2)
            continue
        return json.loads(out.getvalue()) if code == 0 else None
    return None


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def unfinished_flash(runs: list[dict[str, Any]], spec: str, image_sha256: str) -> str | None:
    """The board's newest flash/resume run, if it did not finish and wrote this image."""
    for r in reversed(runs):
        if r["board_spec"] == spec and r["command"] in ("flash", "resume"):
            if r["status"] in ("running", "interrupted") and r["image_sha256"] == image_sha256:
                return r["run_id"]
            return None
    return None


def _modelled_clock(cli_main: CliMain, spec: str) -> float | None:
    """An emulated board's own clock (its cost model's seconds); hardware has none."""
    if not spec.startswith("sim:"):
        return None
    stats = cli_json(cli_main, [], "sim", "stats", spec[4:])
    return float(stats["modelled_seconds"]) if stats else None


PR_SET_PDEATHSIG = 1   # prctl(2): a signal for this process when its parent dies (Linux)


def _stop_with_parent(parent: int) -> None:
    """In a job process: SIGTERM when the host job (`parent`) dies, so that a killed host job
    never leaves a flash running unobserved — the job stops at its next safe point and records
    that it was interrupted. (Linux; elsewhere the job runs on and its trail records it.)"""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:      # it died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


class ForkedCli:
    """The amdflash command line in a child process, forked from this one.

    This process has already imported the command line for its queries, so a fork starts
    the job without a second interpreter start-up and import (a quarter of a CPU second, which
    a host with many boards pays once per board). The child is an ordinary process: it can
    be signalled or killed on its own, and its output comes back through pipes.
    """

    def __init__(self, cli_main: CliMain, argv: list[str], on_err_line: Callable[[str], None] | None = None):
        self._on_err_line = on_err_line   # called with each line of its stderr as it comes
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:   # the child: run the command line, never return into the caller
            code = 1
            try:
                os.close(out_r)
                os.close(err_r)
                os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
                os.dup2(out_w, 1)
                os.dup2(err_w, 2)
                # Whatever the job writes (a dump waiting in the temp dir for the client) is this
                # user's alone: the command line's outputs are 0644 less the umask.
                os.umask(0o077)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.default_int_handler)
                _stop_with_parent(parent)
                code = cli_main(argv)
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                with contextlib.suppress(Exception):
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(code if isinstance(code, int) else 1)
        os.close(out_w)
        os.close(err_w)
        self.pid = pid
        self.returncode: int | None = None
        self._pipes = (out_r, err_r)

    def poll(self) -> int | None:
        if self.returncode is None:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def communicate(self) -> tuple[bytes, bytes]:
        """Wait for the child; its stdout and stderr (drained meanwhile, so it never blocks)."""
        chunks: dict[int, list[bytes]] = {fd: [] for fd in self._pipes}

        def drain(fd: int) -> None:
            pending = b""
            while data := os.read(fd, 65536):
                chunks[fd].append(data)
                if fd == self._pipes[1] and self._on_err_line is not None:
                    *lines, pending = (pending + data).split(b"\n")
                    for line in lines:
                        with contextlib.suppress(Exception):   # a listener's fault never stops the drain
                            self._on_err_line(line.decode(errors="replace"))
            os.close(fd)

        readers = [threading.Thread(target=drain, args=(fd,), daemon=True) for fd in self._pipes]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join()
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return b"".join(chunks[self._pipes[0]]), b"".join(chunks[self._pipes[1]])


def _watch_stdin(procs: list[ForkedCli]) -> None:
    try:
        for line in sys.stdin:
            if line.strip() == "stop":
                for proc in procs:
                    proc.send_signal(signal.SIGTERM)
    except (OSError, ValueError):   # no readable stdin (closed, or not a stream): nobody to say stop
        pass


def _spec_as_recorded(spec: str) -> str:
    # The command line records sim boards by absolute path.
    return f"sim:{os.path.abspath(spec[4:])}" if spec.startswith("sim:") else spec


def _seconds(report: dict[str, Any]) -> float | None:
    try:
        return round((dt.datetime.fromisoformat(report["ended"])
                      - dt.datetime.fromisoformat(report["started"])).total_seconds(), 3)
    except (KeyError, TypeError, ValueError):
        return None


def _plan(specs: list[str], before: list[dict[str, Any]], job: str,
          image: str | None, results: dict[str, dict[str, Any]],
          flash_args: Sequence[str] = ()) -> list[tuple[list[str], list[str]]]:
    """The command-line processes to run: (their boards, their amdflash arguments)."""
    if job == "flash":
        assert image is not None
        sha = _sha256(image)
        groups: list[tuple[list[str], list[str]]] = []
        fresh = []
        # --start-over: the operator asked for new flashes, not for the unfinished ones to be resumed.
        start_over = "--start-over" in flash_args
        for spec in specs:
            resumes = None if start_over else unfinished_flash(before, spec, sha)
            if resumes:
                results[spec].update(job="resume", resumes=resumes)
                groups.append(([spec], ["resume", resumes, "--yes", "--image", image]))
            else:
                fresh.append(spec)
        return ([(fresh, ["flash", image, "--yes", *flash_args])] if fresh else []) + groups
    if job == "verify":
        assert image is not None
        return [(specs, ["verify", image])]
    if job == "info":
        return [(specs, ["info"])]
    if job == "dump":
        groups = []
        for spec in specs:
            fd, output = tempfile.mkstemp(prefix="amdflash-fleet-dump-", suffix=".bin")
            os.close(fd)
            results[spec]["output"] = output
            # The name is ours (made new, 0600, O_EXCL|O_NOFOLLOW, in the sticky temp dir): the dump
            # replaces it with a file it makes new under a name of its own, 0600 by the job's umask.
            groups.append(([spec], ["dump", output, "--overwrite"]))
        return groups
    raise ValueError(f"unknown job {job!r}")


def _lines_for(text: str, spec: str, alone: bool) -> list[str]:
    """The output lines about one board: all of them when it ran alone, else its "[spec] " ones."""
    if alone:
        return text.splitlines()
    prefix = f"[{spec}] "
    return [line[len(prefix):] for line in text.splitlines() if line.startswith(prefix)]


def _json_events(text: str) -> list[dict[str, Any]]:
    """The JSON events of a job's stderr (it runs with --log-json)."""
    events = []
    for line in text.splitlines():
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if isinstance(event, dict):
                    events.append(event)
    return events


def _errors(text: str, spec: str) -> list[tuple[str, str | None]]:
    """The errors about one board ("[spec] …" with several boards), then the ones about the
    whole command (a refusal before any run): (message, the next step the CLI advised)."""
    own, common = [], []
    for event in _json_events(text):
        message, advice = str(event.get("event", "")), event.get("advice")
        if event.get("level") != "error":
            continue
        if message.startswith(f"[{spec}] "):
            own.append((message[len(f"[{spec}] "):], advice))
        elif not message.startswith("["):
            common.append((message, advice))
    return own + common


PROGRESS_FIELDS = ("stage", "done", "total", "unit", "rate", "eta")


def _progress_of(line: str, boards: list[str]) -> tuple[str, dict[str, Any]] | None:
    """(board, its progress) from a job's --log-json progress event, else None."""
    if not line.startswith("{") or '"progress"' not in line:
        return None
    try:
        event = json.loads(line)
    except ValueError:
        return None
    if not isinstance(event, dict) or event.get("event") != "progress" or "stage" not in event:
        return None
    board = str(event.get("board") or "")
    if board not in boards:
        board = _spec_as_recorded(board) if board.startswith("sim:") else board
    if board not in boards:
        if len(boards) != 1:
            return None
        board = boards[0]
    return board, {k: event.get(k) for k in PROGRESS_FIELDS}


def host_name(line_name: str | None) -> tuple[str, str]:
    """(the host's name for results, how messages name it): the line's name for this host, with
    the OS host name beside it when they differ."""
    os_name = socket.gethostname()
    if not line_name or line_name == os_name:
        return os_name, os_name
    return line_name, f"{line_name} (OS host name {os_name})"


def _announcer(cli_main: CliMain, global_args: list[str], specs: list[str], known: set[str],
               say: Callable[[str, str], None]) -> Callable[[], bool]:
    """A call that says (`say(spec, run_id)`) each board's new run once the trail has it;
    it returns whether every board's run is said."""
    said: set[str] = set()

    def announce() -> bool:
        for r in cli_json(cli_main, global_args, "runs", "--format", "json") or []:
            spec = r["board_spec"]
            if spec in specs and spec not in said and r["run_id"] not in known:
                said.add(spec)
                say(spec, r["run_id"])
        return len(said) == len(specs)

    return announce


@contextlib.contextmanager
def _named(line_name: str | None) -> Any:
    """The runs of the job record the host as the line names it (run_facts.host_name)."""
    from amdflash.pipeline.engine.run_facts import LINE_NAME

    before = os.environ.get(LINE_NAME)
    if line_name:
        os.environ[LINE_NAME] = line_name
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(LINE_NAME, None)
        else:
            os.environ[LINE_NAME] = before


def run(cli_main: CliMain, specs: list[str], db: str | None, job: str, image: str | None,
        flash_args: Sequence[str] = (), line_name: str | None = None,
        on_run: Callable[[str, str], None] | None = None,
        on_progress: Callable[[str, dict[str, Any]], None] | None = None,
        operator: str | None = None) -> list[dict[str, Any]]:
    """Run the job; `on_run(spec, run_id)` is called as each board's run appears in the trail,
    `on_progress(spec, {stage, done, total, unit, rate, eta})` as its stages progress. Its runs
    record the host by `line_name` when given (the line's name for it), as its results do, and
    `operator` as who claims to run them (the fleet client's --operator, or its account)."""
    with _named(line_name):
        return _run(cli_main, specs, db, job, image, flash_args, line_name, on_run, on_progress, operator)


def _run(cli_main: CliMain, specs: list[str], db: str | None, job: str, image: str | None,
         flash_args: Sequence[str], line_name: str | None, on_run: Callable[[str, str], None] | None,
         on_progress: Callable[[str, dict[str, Any]], None] | None, operator: str | None) -> list[dict[str, Any]]:
    global_args = ["--db", db] if db else []
    claimed = [f"--operator={operator}"] if operator else []
    specs = [_spec_as_recorded(s) for s in specs]
    host, said = host_name(line_name)
    before = cli_json(cli_main, global_args, "runs", "--format", "json") or []
    known = {r["run_id"] for r in before}
    results: dict[str, dict[str, Any]] = {
        spec: {"board": spec, "host": host, "job": job, "run_id": None, "resumes": None, "status": None,
               "error": None, "advice": None, "output": None, "exit_code": None} for spec in specs}
    groups = _plan(specs, before, job, image, results, flash_args)

    clocks0 = {spec: _modelled_clock(cli_main, spec) for spec in specs}
    wall0 = time.monotonic()
    def listener(boards: list[str]) -> Callable[[str], None] | None:
        if on_progress is None:
            return None

        def heard(line: str) -> None:
            found = _progress_of(line, boards)
            if found:
                on_progress(*found)
        return heard

    # --log-json: the jobs' progress (numeric done/total/rate/eta) and errors (with the next step
    # the CLI advises) come as JSON events on their stderr, read as they come.
    procs = [ForkedCli(cli_main, [*global_args, *claimed, "--log-json", *argv,
                                  *[a for s in boards for a in ("--board", s)]],
                       listener(boards))
             for boards, argv in groups]
    threading.Thread(target=_watch_stdin, args=(procs,), daemon=True).start()

    def forward(signum: int, _frame: object) -> None:
        for proc in procs:
            proc.send_signal(signum)

    # A stop is passed on to the jobs until their results are read; the caller's handlers after.
    before = {signum: signal.signal(signum, forward) for signum in (signal.SIGTERM, signal.SIGINT)}
    outputs: list[tuple[bytes, bytes]] = [(b"", b"")] * len(procs)

    def wait(i: int) -> None:
        outputs[i] = procs[i].communicate()

    waiters = [threading.Thread(target=wait, args=(i,)) for i in range(len(procs))]
    for w in waiters:
        w.start()
    announce = _announcer(cli_main, global_args, specs, known, on_run) if on_run else None
    pause = 0.2
    while alive := [w for w in waiters if w.is_alive()]:
        if announce is not None and announce():
            announce = None
        alive[0].join(pause)
        pause = min(pause * 1.5, 5.0)     # a board that never gets a run (refused) is asked about less and less
    wall = round(time.monotonic() - wall0, 3)

    after = [r for r in (cli_json(cli_main, global_args, "runs", "--format", "json") or []) if r["run_id"] not in known]
    for (boards, _argv), proc, (stdout, stderr) in zip(groups, procs, outputs):
        code = proc.returncode
        assert code is not None
        out_text, err_text = stdout.decode(errors="replace"), stderr.decode(errors="replace")
        for spec in boards:
            result = results[spec]
            alone = len(boards) == 1
            errors = _errors(err_text, spec)
            ours = [r for r in after if r["board_spec"] == spec]
            report: dict[str, Any] = {}
            if ours:
                result["run_id"] = ours[-1]["run_id"]
                report = cli_json(cli_main, global_args, "report", result["run_id"], "--format", "json") or {}
                result.update(status=report.get("status"), error=report.get("error"),
                              result_sha256=report.get("result_sha256"))
            # The host CLI's next step, as it told it (its commands carry this host's --db).
            result["advice"] = ((report.get("outcome") or {}).get("next_step")
                                or (errors[0][1] if errors else None))
            result["wall_seconds"] = _seconds(report) or wall
            if code < 0 and result["status"] in (None, "running", "interrupted"):
                # A run that recorded its end before the process was killed keeps that end: the
                # trail, not the process's fate, says how the run went.
                name = signal.Signals(-code).name
                result.update(status="interrupted",
                              error=f"the amdflash process was killed ({name}) on {said}; its run stays unfinished "
                                    "in that host's audit trail and the next fleet flash of this image resumes it")
            elif not ours:
                result["status"] = "refused" if code == 2 else EXIT_TO_STATUS.get(code, "failed")
                result["error"] = errors[0][0] if errors else f"amdflash exited {code} without a run"
            elif code == 2 and result["status"] == "failed":
                result["status"] = "refused"   # e.g. board busy: nothing was written
            result["exit_code"] = {v: k for k, v in EXIT_TO_STATUS.items()}.get(result["status"], 1)
            if job == "info":
                result["lines"] = _lines_for(out_text, spec, alone)
    for spec in specs:
        clock0, clock1 = clocks0[spec], _modelled_clock(cli_main, spec)
        results[spec]["modelled_seconds"] = (round(clock1 - clock0, 3)
                                             if clock0 is not None and clock1 is not None else None)
        if job == "dump" and results[spec]["status"] != "succeeded" and results[spec]["output"]:
            with contextlib.suppress(OSError):
                os.unlink(results[spec]["output"])
            results[spec]["output"] = None
    for signum, handler in before.items():
        signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
    return [results[spec] for spec in specs]


def main(cli_main: CliMain, specs: list[str], db: str | None, job: str, image: str | None,
         flash_args: Sequence[str] = (), line_name: str | None = None, operator: str | None = None) -> int:
    """The host side of a fleet job. `cli_main` is amdflash's command line (`pipeline.cli.main`),
    handed down by it so that this module never imports back up to it."""
    # The client's connection may drop; the jobs go on (their trail is here) and a write to
    # the dead pipe must not kill us before the runs are recorded.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    # A process group of its own (under sshd it is one already, as a session's leader): the job
    # and every process it starts can be signalled together.
    if os.getpgrp() != os.getpid():
        with contextlib.suppress(OSError):
            os.setpgid(0, 0)
    # First line: the job has begun here (so a client that hears nothing more knows that
    # something may have run, and one that hears not even this knows that nothing did).
    # The client's stream, held here: the queries this job makes of its own command line
    # (cli_json) swap sys.stdout for the whole process while they run, and a progress line that
    # a reader thread printed then would end up inside a query's JSON instead of with the client.
    client = sys.stdout
    with contextlib.suppress(BrokenPipeError, OSError):
        print(json.dumps({"started": True, "pid": os.getpid()}), file=client, flush=True)
    lock = threading.Lock()   # progress comes from the jobs' reader threads: one line at a time

    def say(spec: str, run_id: str) -> None:
        with lock, contextlib.suppress(BrokenPipeError, OSError):
            print(json.dumps({"board": spec, "run_id": run_id}), file=client, flush=True)

    def progress(spec: str, stage: dict[str, Any]) -> None:
        with lock, contextlib.suppress(BrokenPipeError, OSError):
            print(json.dumps({"board": spec, "progress": stage}), file=client, flush=True)

    try:
        results = run(cli_main, specs, db, job, image, flash_args, line_name, on_run=say, on_progress=progress,
                      operator=operator)
    except Exception as e:
        host, said = host_name(line_name)
        results = [{"board": spec, "host": host, "job": job, "status": "failed", "exit_code": 1,
                    "error": f"the fleet job failed on {said}: {type(e).__name__}: {e}"}
                   for spec in specs]
    with contextlib.suppress(BrokenPipeError, OSError):
        for result in results:
            print(json.dumps(result, sort_keys=True), file=client, flush=True)
    codes = {r["exit_code"] for r in results}
    for code in (130, 1, 2):
        if code in codes:
            return code
    return 0
