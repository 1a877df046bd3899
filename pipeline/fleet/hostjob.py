"""`amdflash fleet job`: one board's job, run on the host that owns the board.

The fleet client starts this over SSH (labgrid's remote execution for a network resource).
It drives the host's own `amdflash` command line — the job as a child process, the
audit queries (`runs --format json`, `report RUN --format json`) through the same entry
point — so it depends only on the command-line contract, and prints one JSON line.

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
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

EXIT_TO_STATUS = {0: "succeeded", 1: "failed", 2: "refused", 130: "interrupted"}


def cli_json(global_args: list[str], *argv: str) -> Any:
    """Run a read-only amdflash command in this process; its JSON output, or None on refusal."""
    from amdflash.pipeline.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([*global_args, "-q", *argv])
    if code != 0:
        return None
    return json.loads(out.getvalue())


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


def _watch_stdin(proc: subprocess.Popen[bytes]) -> None:
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
    proc = subprocess.Popen([sys.executable, "-m", "amdflash.pipeline.cli", *global_args, "-q", *argv,
                             "--board", spec], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
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
    result = run(spec, db, job, image)
    with contextlib.suppress(BrokenPipeError, OSError):
        print(json.dumps(result, sort_keys=True), flush=True)
    return int(result["exit_code"]) if result["exit_code"] in (0, 1, 2, 130) else 1
