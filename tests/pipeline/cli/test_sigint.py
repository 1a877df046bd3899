"""Ctrl-C at any moment: exit 130 (or 0 if the work was already done), one line, no traceback;
an interrupted flash is on record and resumes to the exact image."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from amdflash.stages.sim.synth import synthetic_ifwi
from tests.pipeline.cli.conftest import flash_content
from tests.support import cli

SCRIPT = str(Path(sys.executable).with_name("amdflash"))   # the console script, as a shell runs it


def _ctrl_c(argv: list[str], delay: float | None, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run amdflash in its own process group and press Ctrl-C (SIGINT to the group) after `delay`
    seconds; delay None: the key was pressed while the interpreter was still starting (the signal
    is pending, held back by the signal mask, when amdflash's first line runs)."""
    def pressed_while_starting() -> None:
        # In the child before exec: blocked, then sent, the signal is pending when the interpreter
        # starts, whatever the machine's load. (Sent from here after Popen returned, a busy
        # machine let the child pass amdflash's first lines first: then the Ctrl-C landed in
        # `main`, whose line carries a timestamp, and the quick run under load failed.)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        os.kill(os.getpid(), signal.SIGINT)

    p = subprocess.Popen([SCRIPT, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
                         start_new_session=True, preexec_fn=pressed_while_starting if delay is None else None)
    if delay is not None:
        time.sleep(delay)
        try:
            os.killpg(p.pid, signal.SIGINT)
        except ProcessLookupError:
            pass                                    # it had finished
    out, err = p.communicate(timeout=300)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def _before_amdflash_began(r: subprocess.CompletedProcess[str]) -> bool:
    """A Ctrl-C that lands while the interpreter itself starts (before the first line of
    amdflash's own code, which installs its handler) ends Python the way Python ends then: by
    SIGINT, silently, or with its own traceback (exit 1 from inside `site`). Only that case is
    let through: no frame of the traceback is in amdflash's code."""
    import amdflash.pipeline
    import amdflash.stages
    import amdflash.store

    if r.returncode not in (-signal.SIGINT, 1) or r.stdout:
        return False
    lines = r.stderr.strip().splitlines()
    if lines and lines[-1] != "KeyboardInterrupt":
        return False
    ours = tuple(str(Path(m.__file__).parent) + os.sep
                 for m in (amdflash, amdflash.pipeline, amdflash.stages, amdflash.store))
    return not any(f.startswith(ours) for f in re.findall(r'^  File "([^"]+)"', r.stderr, re.MULTILINE))


def test_ctrl_c_during_start_up_exits_130_with_one_line(tmp_path, make_board):
    board = make_board(transport="ideal")
    r = _ctrl_c(["info", "--board", f"sim:{board}"], None, tmp_path)
    assert r.returncode == 130 and r.stderr == "error: interrupted\n" and r.stdout == ""
    r = _ctrl_c(["--log-json", "info", "--board", f"sim:{board}"], None, tmp_path)
    assert r.returncode == 130 and json.loads(r.stderr) == {"event": "interrupted", "level": "error"}
    assert not Path(os.environ["AMDFLASH_DB"]).exists()


def _interrupt_then_finish(tmp_path: Path, make_board, delay: float) -> None:  # noqa: ANN001
    image = tmp_path / "image.bin"
    image.write_bytes(synthetic_ifwi(21))
    board = make_board(content="blank", transport="asm24", realtime_scale=1.0)
    argv = ["flash", str(image), "--yes", "--expect-part", "SYNTH-0001", "--board", f"sim:{board}", "--sector-count", "48", "--no-progress"]
    r = _ctrl_c(argv, delay, tmp_path)
    for _ in range(3):                              # it landed in the interpreter's own start-up:
        if not _before_amdflash_began(r):           # nothing of amdflash ran, press it again
            break
        assert not Path(os.environ["AMDFLASH_DB"]).exists()
        r = _ctrl_c(argv, delay, tmp_path)
    assert r.returncode in (0, 130), r.stderr
    assert "Traceback" not in r.stderr and "KeyboardInterrupt" not in r.stderr, r.stderr
    if r.returncode == 130:
        lines = r.stderr.strip().splitlines()
        if lines[-1].startswith("  next: "):          # a run was on record: how to finish it, or that none is needed
            assert (f"To finish the flash: amdflash --db {os.environ['AMDFLASH_DB']} resume " in lines[-1]
                    or "nothing to finish" in lines[-1]) and lines[-2].startswith("error: "), r.stderr
        else:
            assert lines[-1].startswith("error: "), r.stderr
        # What follows the Ctrl-C is no signal's business: this process runs it.
        listed = cli.run("runs", "--json", cwd=tmp_path)
        runs = json.loads(listed.stdout) if listed.returncode == 0 else []     # 2: no audit database yet
        if runs and "nothing to finish" not in r.stderr:     # stopped once it had changed the flash: resume it
            assert runs[-1]["status"] == "interrupted"
            assert (f"To finish the flash: amdflash --db {os.environ['AMDFLASH_DB']} resume --board sim:{board} "
                    f"--yes -- {runs[-1]['run_id']}") in r.stderr
            done = cli.run("resume", "--yes", "--board", f"sim:{board}", "-q", cwd=tmp_path)
        else:                                       # stopped before it changed anything: flash again (not refused)
            done = cli.run(*argv, "-q", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    assert flash_content(board)[:48 * 0x1000] == image.read_bytes()[:48 * 0x1000]


@pytest.mark.slow
@pytest.mark.parametrize("delay", [1.0])
def test_ctrl_c_during_a_flash_stops_it_cleanly_and_it_resumes(tmp_path, make_board, delay):
    _interrupt_then_finish(tmp_path, make_board, delay)


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.1, 0.2, 0.3, 0.5, 0.7, 1.0, 1.3, 1.7, 2.2, 2.8, 3.5, 4.5])
def test_ctrl_c_at_many_moments(tmp_path, make_board, delay):
    _interrupt_then_finish(tmp_path, make_board, delay)


def test_a_ctrl_c_once_the_run_is_on_record_changes_nothing(tmp_path, make_board, amdflash, monkeypatch):
    """The key pressed while the finished run is being reported (the test presses it at that
    very moment, in-process): the run succeeded and says so, exit 0 — not "interrupted"."""
    from amdflash.pipeline.commands import board as commands

    reports = commands._reports

    def press_ctrl_c_then_report(*args):  # noqa: ANN002, ANN202
        os.kill(os.getpid(), signal.SIGINT)
        return reports(*args)

    monkeypatch.setattr(commands, "_reports", press_ctrl_c_then_report)
    image = tmp_path / "image.bin"
    image.write_bytes(synthetic_ifwi(21))
    board = make_board(content="blank", transport="ideal")
    r = amdflash("flash", str(image), "--yes", "--expect-part", "SYNTH-0001", "--board", f"sim:{board}",
                 "--sector-count", "4", "--no-progress")
    assert r.code == 0, r.err
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler   # Ctrl-C back for what follows
    assert flash_content(board)[:4 * 0x1000] == image.read_bytes()[:4 * 0x1000]


def test_a_program_using_the_api_keeps_its_ctrl_c(make_board, tmp_path):
    """Only the command line holds back a late Ctrl-C: after an API call the caller's own
    Ctrl-C still raises KeyboardInterrupt."""
    from amdflash import api

    board = make_board(content="blank", transport="ideal")
    api.dump(tmp_path / "d.bin", board=f"sim:{board}")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


FINALISER = """\
import signal, sys, time
from amdflash.pipeline import launch  # noqa: F401 - its hook for what a finaliser raises
signal.signal(signal.SIGINT, signal.default_int_handler)   # as main() takes Ctrl-C: raised where the program is

class Finaliser:
    def __del__(self):
        raise KeyboardInterrupt     # a Ctrl-C that landed while a finaliser ran

Finaliser()
try:
    for _ in range(100):
        time.sleep(0.1)
    print("not interrupted")
except KeyboardInterrupt:
    print("interrupted outside the finaliser")
"""


def test_a_ctrl_c_that_lands_in_a_finaliser_is_pressed_again_outside_it(tmp_path):
    """launch's hook presses a Ctrl-C that a finaliser swallowed again from outside it. It did
    so from a threading.Thread, whose start() waits for the thread, which pressed at once: the
    Ctrl-C landed in that wait, inside the hook — a traceback on stderr ("Exception ignored in
    sys.unraisablehook"), and the Ctrl-C lost (a slow run under load: the flash interrupted at
    0.1 s went on to succeed). Every time, not under load only, once main() holds Ctrl-C."""
    script = tmp_path / "finaliser.py"
    script.write_text(FINALISER)
    for _ in range(3):
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
        assert done.stdout == "interrupted outside the finaliser\n", (done.stdout, done.stderr)
        assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
