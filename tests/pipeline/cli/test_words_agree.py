"""Issue 40 item 6: words that contradicted each other, each through the command line.

a. Ctrl-C before a flash wrote anything said "the flash was not changed. To finish the flash:
   amdflash resume …", and the next flash was refused as over an unfinished one (0 units
   written). A flash that changed nothing is not unfinished; one whose erase began still is.
b. A refused flash put back the registers a stranded earlier run left changed, silently.
c. A verify mismatch advised "fix the cause, then run the command again": the way is to flash
   the image.
d. After kill -9 or SIGTERM nothing printed named the backup; SIGTERM's `next:` offered only
   the resume, not the put-back a failed flash offers."""
from __future__ import annotations

import json
import os
import shlex
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from amdflash.pipeline.engine import jobs
from amdflash.stages.sim import Board, create_board
from amdflash.stages.sim.synth import PART_KEY
from amdflash.store.writer import recorder as recorder_module
from tests.pipeline.cli import test_original_across_runs as across
from tests.pipeline.engine.conftest import flash_content
from tests.support import cli

UNIT = 0x1000


def _last(amdflash) -> dict:
    return json.loads(amdflash("runs", "--json").out)[-1]


def _pasted(amdflash, command: str):
    words = shlex.split(command)
    assert words[0] == "amdflash", command
    return amdflash("--no-progress", *words[1:])


def _flash(board: Path, image: Path, *extra: object) -> tuple[object, ...]:
    return ("--no-progress", "flash", image, "--yes", "--expect-part", PART_KEY, "--board", f"sim:{board}", *extra)


def test_ctrl_c_before_the_flash_was_written_leaves_nothing_unfinished(amdflash, make_board, image, monkeypatch):
    board = make_board(content="blank", transport="ideal")
    checked = jobs.FlashJob._check_protection

    async def ctrl_c_then_check(self, dev, ident):
        os.kill(os.getpid(), signal.SIGINT)       # pressed before the backup: nothing written yet
        import anyio
        for _ in range(1000):                     # until the run's signal watcher has taken it
            if dev.stop:
                break
            await anyio.sleep(0.01)
        return await checked(self, dev, ident)

    monkeypatch.setattr(jobs.FlashJob, "_check_protection", ctrl_c_then_check)
    r = amdflash(*_flash(board, image, "--sector-count", "16"))
    monkeypatch.setattr(jobs.FlashJob, "_check_protection", checked)
    assert r.code == 130, r.err
    step = r.err_lines[-1]
    assert step.startswith("  next: the flash was not changed: nothing to finish"), r.err
    assert " resume " not in step, step
    run = _last(amdflash)
    assert run["status"] == "interrupted"
    assert json.loads(amdflash("report", run["run_id"], "--json").out)["outcome"]["next_step"] == \
        step[len("  next: "):]
    assert flash_content(board) == b"\xff" * len(flash_content(board))
    # Not unfinished: the next flash is not refused, nor does info name an unfinished flash.
    assert "unfinished flash" not in amdflash("info", "--board", f"sim:{board}").out
    again = amdflash(*_flash(board, image, "--sector-count", "16"))
    assert again.code == 0, again.err
    assert flash_content(board)[:16 * UNIT] == image.read_bytes()[:16 * UNIT]


def test_ctrl_c_once_an_erase_began_leaves_the_flash_unfinished(amdflash, make_board, image, monkeypatch):
    """The other side of the line: a unit whose intent is on record may be erased in part, so
    the flash is unfinished — the next flash is refused, and the step is the resume."""
    board = make_board(content="blank", transport="ideal")
    add = recorder_module.Recorder.add
    pressed = []

    def ctrl_c_at_the_first_intent(self, table, **row):
        add(self, table, **row)
        if table == "units" and row.get("state") == "intent" and not pressed:
            pressed.append(row["address"])
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(recorder_module.Recorder, "add", ctrl_c_at_the_first_intent)
    r = amdflash(*_flash(board, image, "--sector-count", "256"))
    monkeypatch.setattr(recorder_module.Recorder, "add", add)
    assert pressed and r.code == 130, r.err
    run = _last(amdflash)
    assert "To finish the flash: " in r.err_lines[-1] and f" resume --board sim:{board} --yes -- {run['run_id']}" in r.err_lines[-1], r.err
    again = amdflash(*_flash(board, image, "--sector-count", "256"))
    assert again.code == 2 and "never finished" in again.err, again.err


def test_a_refused_flash_says_it_put_back_what_a_stranded_run_left(amdflash, make_board, image, isolated):
    board = make_board(content="blank", transport="ideal")
    assert amdflash("sim", "fault", board, "--clear", "kill-after-writes=3000").code == 0
    p = cli.run_process("--no-progress", "dump", isolated / "d.bin", "--board", f"sim:{board}")
    assert p.returncode == -signal.SIGKILL, p.stderr
    assert amdflash("sim", "fault", board, "--clear").code == 0
    dead = _last(amdflash)["run_id"]
    r = amdflash("--no-progress", "flash", image, "--yes", "--expect-part", "NOT-THIS-BOARD", "--board", f"sim:{board}")
    assert r.code == 2, r.err
    said = f"put back the registers run {dead} left changed"
    assert said in r.err and r.err.index(said) < r.err.index("error: "), r.err
    refused = _last(amdflash)
    assert refused["status"] == "refused"
    rep = json.loads(amdflash("report", refused["run_id"], "--json").out)
    assert rep["registers_put_back"] and rep["registers_put_back"][0].startswith(said), rep["registers_put_back"]
    assert f"registers  {said}: " in amdflash("report", refused["run_id"]).out


@pytest.mark.slow
def test_a_verify_mismatch_says_to_flash_the_image(amdflash, image, tmp_path):
    found = bytearray(image.read_bytes())
    found[0x1F0000:0x1F0100] = b"\xff" * 0x100      # a board of the same part, holding something else
    board = create_board(tmp_path / "board", content=bytes(found), transport="ideal", seed=3)
    r = amdflash("--no-progress", "verify", image, "--board", f"sim:{board}")
    assert r.code == 1, r.err
    step = r.err_lines[-1]
    assert "fix the cause" not in step, step
    flash = step.split("to write the image: ", 1)[1]
    assert shlex.split(flash) == ["amdflash", "--db", os.environ["AMDFLASH_DB"], "flash", "--board", f"sim:{board}",
                                  "--yes", "--", str(image.resolve())], flash
    done = _pasted(amdflash, flash)
    assert done.code == 0, done.err
    assert amdflash("--no-progress", "verify", image, "--board", f"sim:{board}").code == 0


@pytest.mark.slow
def test_a_killed_flash_named_its_backup_before_it_died(amdflash, image, tmp_path):
    first = across.content(image.read_bytes())
    total = across.reference_writes(tmp_path, image, first)
    board = create_board(tmp_path / "board", content=first, transport="ideal", seed=across.SEED,
                         faults=[f"kill-after-writes={total * 99 // 100}"])
    p = cli.run_process("--no-progress", "flash", image, "--yes", "--expect-part", PART_KEY, "--board",
                        f"sim:{board}", env={"PYTHONUNBUFFERED": None})
    assert p.returncode == -signal.SIGKILL, p.stderr
    [backup] = list((tmp_path / "backups").glob("*.bin"))
    assert f"backup of the original content: {backup.resolve()}" in p.stderr, p.stderr
    put_back = across.printed(p.stderr, "to put it back: ")
    assert "--start-over" in shlex.split(put_back), put_back      # this very run is unfinished now
    done = _pasted(amdflash, put_back)
    assert done.code == 0, done.err
    assert flash_content(board) == first


def _wait_until_a_unit_is_erased(db: Path) -> None:
    """Until the running flash has erased a unit (its intent sealed before): it changed the flash."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            if con.execute("SELECT 1 FROM units WHERE state = 'erased' LIMIT 1").fetchone():
                return
        except sqlite3.OperationalError:
            pass
        finally:
            con.close()
        time.sleep(0.02)
    raise AssertionError("the flash erased nothing in 120 s")


@pytest.mark.parametrize("signum", [signal.SIGTERM])
def test_sigterm_offers_the_resume_and_the_put_back(amdflash, image, tmp_path, signum):
    first = across.content(image.read_bytes())
    board = create_board(tmp_path / "board", content=first, transport="ideal", seed=across.SEED,
                         realtime_scale=1.0)
    other = tmp_path / "other.bin"          # every unit differs: erases and programs, in real time
    other.write_bytes(bytes(b ^ 0x5A for b in image.read_bytes()))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    p = subprocess.Popen(cli.command("--no-progress", "flash", other, "--yes", "--force", "--sector-count", "64",
                                     "--board", f"sim:{board}"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    assert p.stderr is not None
    seen = []
    for line in p.stderr:               # the backup is named as soon as it is complete, off a terminal too
        seen.append(line)
        if "backup of the original content: " in line:
            break
    assert seen and "backup of the original content: " in seen[-1], seen
    _wait_until_a_unit_is_erased(Path(os.environ["AMDFLASH_DB"]))
    p.send_signal(signum)
    out, rest = p.communicate(timeout=120)
    err = "".join(seen) + rest
    assert p.returncode == 130, err
    run = _last(amdflash)
    [backup] = list((tmp_path / "backups").glob("*.bin"))
    step = [x for x in err.splitlines() if x.startswith("  next: ")][-1]
    assert "not changed" not in step and "nothing to finish" not in step, step
    resume = across.printed(step, "To finish the flash: ")
    assert shlex.split(resume)[3] == "resume" and shlex.split(resume)[-2:] == ["--", run["run_id"]], resume
    put_back = across.printed(step, f"or put back the original content, backup {backup.resolve()} "
                                    f"(run {run['run_id']}): ")
    assert "--start-over" in shlex.split(put_back), put_back
    done = _pasted(amdflash, put_back)
    assert done.code == 0, done.err
    assert flash_content(board)[:64 * UNIT] == first[:64 * UNIT]
    with Board(board) as b:
        assert b.stats()["reg_writes"] > 0
