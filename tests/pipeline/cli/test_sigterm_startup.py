"""SIGTERM as Ctrl-C from amdflash's first line (issue 41 item 7): sent while the program starts
— pending when the interpreter begins, or after a short delay, in the imports — it ends the
process with exit status 130 and the one line `error: interrupted`, never by the signal and
in silence. Ctrl-C is held to the same. A signal that lands in the interpreter's own start-up,
before amdflash's first line, ends Python the way Python ends then (the README says so): told
apart here by the kernel's record of whether the process had a handler for the signal when it
was sent (SigCgt in /proc/PID/status), not by guessing from the outcome."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import cli

LINE = "error: interrupted\n"


def _pending(signum: int, ctrl_c_ignored: bool = False) -> Callable[[], None]:
    """In the child before exec: the signal blocked, then sent, so it is pending when the
    interpreter starts, whatever the machine's load."""
    def preexec() -> None:
        if ctrl_c_ignored:                      # as a shell starts a background job
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signum})
        os.kill(os.getpid(), signum)
    return preexec


def _after(signum: int, delay: float, seen: Path) -> Callable[[], None]:
    """In the child before exec: a killer process that sends the signal `delay` seconds later,
    having written to `seen` whether the process then had a handler for it ("caught"), had
    none ("not caught"), or had ended ("gone")."""
    def preexec() -> None:
        target = os.getpid()                    # exec keeps the pid
        if os.fork():
            return
        try:
            os.closerange(0, 65536)             # none of the child's pipes: its reader sees their end
            time.sleep(delay)
            if os.getppid() != target:          # ended, and this process was handed on
                state = "gone"
            else:
                status = Path(f"/proc/{target}/status").read_text()
                mask = int(re.search(r"^SigCgt:\s*([0-9a-f]+)$", status, re.MULTILINE).group(1), 16)
                state = "caught" if mask >> (signum - 1) & 1 else "not caught"
            seen.write_text(state)              # before the signal: read once the process has ended
            if state != "gone":
                os.kill(target, signum)
        finally:
            os._exit(0)
    return preexec


def _in_python_start_up(r: cli.Result, signum: int, state: str) -> bool:
    """The signal landed before amdflash's first line: Python ends by the signal, or (Ctrl-C,
    for which Python itself has a handler from its own start) with its own traceback or
    'Fatal Python error' from inside `site`, no frame of which is amdflash's."""
    if r.out:
        return False
    if signum == signal.SIGTERM:
        return state == "not caught" and r.code == -signal.SIGTERM and r.err == ""
    import amdflash
    import amdflash.pipeline
    import amdflash.stages
    import amdflash.store

    ours = tuple(str(Path(m.__file__).parent) + os.sep
                 for m in (amdflash, amdflash.pipeline, amdflash.stages, amdflash.store))
    frames = re.findall(r'^  File "([^"]+)"', r.err, re.MULTILINE)
    return (r.code in (-signal.SIGINT, 1) and not any(f.startswith(ours) for f in frames)
            and (r.err == "" or r.err.rstrip().endswith("KeyboardInterrupt") or "Fatal Python error" in r.err))


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_pending_when_the_interpreter_starts_exits_130_with_one_line(tmp_path, signum):
    db = tmp_path / "audit.sqlite"
    r = cli.run_process("runs", "--db", db, cwd=tmp_path, preexec_fn=_pending(signum))
    assert (r.code, r.out, r.err) == (130, "", LINE)
    r = cli.run_process("--log-json", "runs", "--db", db, cwd=tmp_path, preexec_fn=_pending(signum))
    assert r.code == 130 and r.out == "" and json.loads(r.err) == {"event": "interrupted", "level": "error"}
    assert not db.exists()


def test_sigterm_stops_a_program_started_ignoring_ctrl_c(tmp_path):
    """A background job ignores Ctrl-C (and amdflash keeps ignoring it); a SIGTERM is for it
    all the same."""
    r = cli.run_process("runs", "--db", tmp_path / "audit.sqlite", cwd=tmp_path,
                        preexec_fn=_pending(signal.SIGTERM, ctrl_c_ignored=True))
    assert (r.code, r.out, r.err) == (130, "", LINE)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_the_imports_exits_130_with_one_line(tmp_path, signum):
    """`runs` on a database that does not exist: imports, then a refusal. The signal sent at
    several moments of that: 130 and the line (some lines before it if the refusal was being
    printed), or — sent once the outcome was decided — the refusal and its exit 2 alone."""
    db = tmp_path / "absent.sqlite"
    plain = cli.run_process("runs", "--db", db, cwd=tmp_path)
    assert plain.code == 2 and plain.err.startswith("error: no audit database"), plain.err
    began = time.monotonic()
    cli.run_process("runs", "--db", db, cwd=tmp_path)
    took = time.monotonic() - began                      # the whole command, unsignalled
    landed = []
    for fraction in (0.1, 0.25, 0.4, 0.6):
        for _ in range(4):                               # until one lands in amdflash's own code
            seen = tmp_path / "seen"
            seen.unlink(missing_ok=True)
            r = cli.run_process("runs", "--db", db, cwd=tmp_path, preexec_fn=_after(signum, fraction * took, seen))
            state = seen.read_text() if seen.exists() else "gone"
            outcome = (fraction, state, r.code, r.out, r.err)
            assert "Traceback" not in r.err or _in_python_start_up(r, signum, state), outcome
            if r.code == 130:
                assert r.out == "" and r.err.endswith(LINE), outcome
                assert all(line.startswith("error: ") for line in r.err.splitlines()), outcome
                landed.append(outcome)
                break
            if (r.code, r.err) == (2, plain.err):      # the outcome was decided: the signal changed nothing
                continue
            assert _in_python_start_up(r, signum, state), outcome     # never a silent death in amdflash
    assert not db.exists()
    assert len(landed) >= 2, landed


# The console script's way in, with a SIGTERM sent at the moment the finished runs are being
# reported (as test_sigint does for Ctrl-C, here in a process of its own: the signal's default
# would end the test run).
SIGTERM_WHILE_REPORTING = """\
import os, signal, sys
from amdflash.pipeline import launch
from amdflash.pipeline.commands import board as commands

reports = commands._reports

def sigterm_then_report(*args):
    os.kill(os.getpid(), signal.SIGTERM)
    return reports(*args)

commands._reports = sigterm_then_report
sys.argv = ["amdflash", *sys.argv[1:]]
launch.run()
"""


def test_a_sigterm_once_the_runs_are_on_record_changes_nothing(tmp_path, make_board):
    """As Ctrl-C then: the run succeeded and says so, exit 0. The runs' signal watcher left
    SIGTERM at its default, so it ended the process by the signal, without a word."""
    board = make_board(transport="ideal")
    r = subprocess.run([sys.executable, "-c", SIGTERM_WHILE_REPORTING, "--db", str(tmp_path / "audit.sqlite"),
                        "info", "--board", f"sim:{board}"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert "succeeded" in r.stdout + r.stderr and "interrupted" not in r.stderr, r.stderr
