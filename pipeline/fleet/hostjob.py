"""`amdflash fleet job`: one board's job, run on the host that owns the board.

The fleet client starts this over SSH (labgrid's remote execution for a network resource).
It drives the host's own `amdflash` command line — the job in a child process, the audit
queries (`runs --format json`, `report RUN --format json`) through the same entry point —
so it depends only on the command-line contract, and prints one JSON line.

* flash: when the board's newest flash of this very image (same SHA-256) never finished
  (the process was killed: still "running" in the trail; or it was interrupted), the job
  is `amdflash resume RUN` instead of a new flash;
* a line "stop" on stdin asks the job to stop at its next safe point (SIGTERM, as Ctrl-C);
  end of stdin — the client or its connection went away — changes nothing: the job
  finishes and its host's trail records it;
* if the job process is killed, this still reports its run (left "running" in the trail)
  as interrupted.
"""
from __future__ import annotations

import contextlib
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
from typing import Any

EXIT_TO_STATUS = {0: "succeeded", 1: "failed", 2: "refused", 130: "interrupted"}


def cli_json(global_args: list[str], *argv: str, attempts: int = 10) -> Any:
    """Run a read-only amdflash command in this process; its JSON output, or None on refusal
    (such as no audit database yet).

    Another job of this host may be creating the audit database at this very moment (the
    first flash on a new host); a query that fails for that is tried again shortly.
    """
    from amdflash.pipeline.cli import main

    for attempt in range(attempts):
        out, err = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = main([*global_args, "-q", *argv])
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


def _modelled_clock(spec: str) -> float | None:
    """An emulated board's own clock (its cost model's seconds); hardware has none."""
    if not spec.startswith("sim:"):
        return None
    stats = cli_json([], "sim", "stats", spec[4:])
    return float(stats["modelled_seconds"]) if stats else None


class ForkedCli:
    """The amdflash command line in a child process, forked from this one.

    This process has already imported the command line for its queries, so a fork starts
    the job without a second interpreter start-up and import (a quarter of a CPU second, which
    a host with many boards pays once per board). The child is an ordinary process: it can
    be signalled or killed on its own, and its output comes back through pipes.
    """

    def __init__(self, argv: list[str]):
        from amdflash.pipeline.cli import main

        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:   # the child: run the command line, never return into the caller
            code = 1
            try:
                os.close(out_r)
                os.close(err_r)
                os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
                os.dup2(out_w, 1)
                os.dup2(err_w, 2)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.default_int_handler)
                code = main(argv)
            except BaseException:  # noqa: BLE001 - whatever happens, the child exits here
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
        chunks: dict[int, list[bytes]] = {fd: [] for fd in self._pipes}

        def drain(fd: int) -> None:
            while data := os.read(fd, 65536):
                chunks[fd].append(data)
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


def _watch_stdin(proc: ForkedCli) -> None:
    for line in sys.stdin:
        if line.strip() == "stop" and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)


def _spec_as_recorded(spec: str) -> str:
    # The command line records sim boards by absolute path.
    return f"sim:{os.path.abspath(spec[4:])}" if spec.startswith("sim:") else spec


def run(spec: str, db: str | None, job: str, image: str | None) -> dict[str, Any]:
    global_args = ["--db", db] if db else []
    spec = _spec_as_recorded(spec)
    before = cli_json(global_args, "runs", "--format", "json") or []
    known = {r["run_id"] for r in before}
    result: dict[str, Any] = {"board": spec, "host": socket.gethostname(), "job": job, "run_id": None,
                              "resumes": None, "status": None, "error": None, "output": None}
    argv: list[str]
    if job == "flash":
        assert image is not None
        resumes = unfinished_flash(before, spec, _sha256(image))
        if resumes:
            result.update(job="resume", resumes=resumes)
            argv = ["resume", resumes, "--yes", "--image", image]
        else:
            argv = ["flash", image, "--yes"]
    elif job == "verify":
        assert image is not None
        argv = ["verify", image]
    elif job == "dump":
        fd, output = tempfile.mkstemp(prefix="amdflash-fleet-dump-", suffix=".bin")
        os.close(fd)
        result["output"] = output
        argv = ["dump", output]
    elif job == "info":
        argv = ["info"]
    else:
        raise ValueError(f"unknown job {job!r}")

    clock0 = _modelled_clock(spec)
    wall0 = time.monotonic()
    proc = ForkedCli([*global_args, "-q", *argv, "--board", spec])
    threading.Thread(target=_watch_stdin, args=(proc,), daemon=True).start()

    def forward(signum: int, _frame: object) -> None:
        if proc.poll() is None:
            proc.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    stdout, stderr = proc.communicate()
    result["wall_seconds"] = round(time.monotonic() - wall0, 3)
    clock1 = _modelled_clock(spec)
    result["modelled_seconds"] = round(clock1 - clock0, 3) if clock0 is not None and clock1 is not None else None

    code = proc.returncode
    result["exit_code"] = code
    ours = [r for r in (cli_json(global_args, "runs", "--format", "json") or [])
            if r["run_id"] not in known and r["board_spec"] == spec]
    if ours:
        run_id = ours[-1]["run_id"]
        result["run_id"] = run_id
        report = cli_json(global_args, "report", run_id, "--format", "json") or {}
        result.update(status=report.get("status"), error=report.get("error"),
                      result_sha256=report.get("result_sha256"))
    errors = [line[len("error: "):] for line in stderr.decode(errors="replace").splitlines()
              if line.startswith("error: ")]
    if code < 0:
        name = signal.Signals(-code).name
        result.update(status="interrupted", exit_code=130,
                      error=f"the amdflash process was killed ({name}); its run stays unfinished in "
                            f"{socket.gethostname()}'s audit trail and the next flash of this image resumes it")
    elif code in (2, 130) or not ours:
        result["status"] = EXIT_TO_STATUS.get(code, "failed")
        result["error"] = result["error"] or (errors[-1] if errors else None)
    if result["status"] is None:
        result["status"] = EXIT_TO_STATUS.get(code, "failed")
    if job == "info":
        result["lines"] = stdout.decode(errors="replace").splitlines()
    if job == "dump" and result["status"] != "succeeded":
        with contextlib.suppress(OSError):
            os.unlink(result["output"])
        result["output"] = None
    return result


def main(spec: str, db: str | None, job: str, image: str | None) -> int:
    # The client's connection may drop; the job goes on (its trail is here) and a write to
    # the dead pipe must not kill us before the run is recorded.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    # First line: the job has begun here (so a client that hears nothing more knows that
    # something may have run, and one that hears not even this knows that nothing did).
    with contextlib.suppress(BrokenPipeError, OSError):
        print(json.dumps({"started": True, "pid": os.getpid()}), flush=True)
    try:
        result = run(spec, db, job, image)
    except Exception as e:  # noqa: BLE001 - the client gets a result whatever happened here
        result = {"board": spec, "host": socket.gethostname(), "job": job, "status": "failed", "exit_code": 1,
                  "error": f"the fleet job failed on {socket.gethostname()}: {type(e).__name__}: {e}"}
    with contextlib.suppress(BrokenPipeError, OSError):
        print(json.dumps(result, sort_keys=True), flush=True)
    return int(result["exit_code"]) if result["exit_code"] in (0, 1, 2, 130) else 1
