"""Killed and interrupted flashes resume to exactly the image, with an intact audit chain."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amdflash.stages.drivers.navi31 import regs as R
from amdflash.stages.sim import Board, create_board
from amdflash.stages.sim.synth import PART_KEY, synthetic_ifwi
from tests.pipeline.engine.conftest import ROOT, flash_content
from tests.support import cli as command_line

SAVED = (R.GPIOPAD_MASK, R.GPIOPAD_A, R.GPIOPAD_EN, R.PAGE_MIRROR_CNTL, R.ROM_CNTL)


def registers(path) -> dict[int, int]:  # noqa: ANN001
    with Board(path) as b:
        return {r: b.get32(r) for r in SAVED}


def damaged(image: bytes) -> bytes:
    """The image with a few units broken in different ways: erase and program-only work."""
    out = bytearray(image)
    out[0x0000:0x1000] = bytes(0x1000)              # needs an erase
    out[0x30000:0x40000] = os.urandom(0x10000)      # a whole 64K block
    out[0x1F0000:0x1F0100] = b"\xff" * 0x100        # programmable without erase
    return bytes(out)


class KillSetup:
    def __init__(self, work, image: bytes, content: bytes, total: int):  # noqa: ANN001
        self.work, self.image, self.content, self.total = work, image, content, total

    def __repr__(self) -> str:
        return f"KillSetup(total={self.total})"


@pytest.fixture(scope="module")
def kill_setup(tmp_path_factory) -> KillSetup:
    """The image, the board content, and how many register writes an undisturbed flash makes."""
    work = tmp_path_factory.mktemp("kill")
    image = synthetic_ifwi(99)
    (work / "image.bin").write_bytes(image)
    content = damaged(image)
    ref = create_board(work / "reference", content=content, transport="ideal", seed=5)
    env = {"AMDFLASH_DB": str(work / "ref.sqlite"), "AMDFLASH_LOCK_DIR": str(work / "locks")}
    command_line.run("-q", "flash", work / "image.bin", "--yes", "--expect-part", PART_KEY, "--board", f"sim:{ref}",
                     env=env).check_returncode()
    with Board(ref) as b:
        total = int(b.stats()["reg_writes"])
    return KillSetup(work, image, content, total)


def run(args: list[str], env: dict[str, str]) -> command_line.Result:
    """A command that may be killed: a process of its own."""
    return command_line.run_process("-q", *args, env=env, module="amdflash.pipeline.cli")


@pytest.mark.slow   # a long scenario: CI runs it (pytest -m slow)
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fraction=st.floats(0.0, 1.0))
def test_a_flash_killed_at_any_register_write_resumes_to_the_image(kill_setup, tmp_path_factory, fraction):
    work, image, content, total = kill_setup.work, kill_setup.image, kill_setup.content, kill_setup.total
    n = max(1, min(total, int(fraction * total)))
    case = tmp_path_factory.mktemp(f"kill{n}")
    board = create_board(case / "board", content=content, transport="ideal", seed=5,
                         faults=[f"kill-after-writes={n}"])
    before = registers(board)
    env = {"PYTHONPATH": str(ROOT), "AMDFLASH_DB": str(case / "audit.sqlite"), "AMDFLASH_LOCK_DIR": str(case / "locks")}
    killed = run(["flash", str(work / "image.bin"), "--yes", "--expect-part", PART_KEY, "--board", f"sim:{board}"], env)
    assert killed.returncode == -signal.SIGKILL, (n, killed.stderr)
    resumed = command_line.run("-q", "resume", "--board", f"sim:{board}", "--yes", env=env)
    assert resumed.returncode == 0, (n, resumed.stderr)
    assert flash_content(board) == image
    assert registers(board) == before                     # put back as before the killed run
    chain = command_line.run("-q", "audit", "verify", env=env)
    assert chain.returncode == 0 and "intact" in chain.stdout


@pytest.mark.slow
def test_resume_refuses_another_board_and_another_image(cli, make_board, image, tmp_path):
    board = make_board(content=damaged(image.read_bytes()), transport="ideal", faults=["kill-after-writes=19000"])
    p = run(["flash", str(image), "--yes", "--expect-part", PART_KEY, "--board", f"sim:{board}"],
            {"PYTHONPATH": str(ROOT)})
    assert p.returncode == -signal.SIGKILL
    runs = json.loads(cli("runs", "--format", "json").out)
    run_id = runs[-1]["run_id"]
    other = make_board(content=damaged(image.read_bytes()), transport="ideal")
    r = cli("resume", run_id, "--board", f"sim:{other}", "--yes")
    assert r.code == 2 and "not the board" in r.err
    wrong = tmp_path / "wrong.bin"
    wrong.write_bytes(synthetic_ifwi(1))
    r = cli("resume", run_id, "--board", f"sim:{board}", "--yes", "--image", wrong)
    assert r.code == 2 and "not the image" in r.err
    assert cli("resume", run_id, "--board", f"sim:{board}").code == 2            # --yes
    assert cli("resume", run_id, "--board", f"sim:{board}", "--yes").code == 0
    assert flash_content(board) == image.read_bytes()
    assert cli("resume", run_id, "--board", f"sim:{board}", "--yes").code == 2   # nothing left to do


@pytest.mark.slow   # a long scenario: CI runs it (pytest -m slow)
def test_sigint_mid_flash_restores_registers_marks_interrupted_and_resumes(make_board, tmp_path):
    image = bytearray(os.urandom(0x200000))
    image[:4] = b"\xaa\x55\xaa\x55"
    (tmp_path / "dense.bin").write_bytes(image)
    board = make_board(content="blank", transport="ideal")
    before = registers(board)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AMDFLASH_DB": str(tmp_path / "audit.sqlite"),
           "AMDFLASH_LOCK_DIR": str(tmp_path / "locks")}
    proc = subprocess.Popen([sys.executable, "-m", "amdflash.pipeline.cli", "flash", str(tmp_path / "dense.bin"), "--yes",
                             "--force", "--board", f"sim:{board}"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    # Wait until programming is under way (the flash content starts to change), then interrupt.
    deadline = time.monotonic() + 120
    while flash_content(board)[:0x1000] == b"\xff" * 0x1000:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert registers(board) == before
    assert flash_content(board) != bytes(image)
    runs = command_line.run("runs", "--format", "json", env=env)
    assert json.loads(runs.stdout)[-1]["status"] == "interrupted"
    resumed = command_line.run("-q", "resume", "--board", f"sim:{board}", "--yes", env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert flash_content(board) == bytes(image)
    assert registers(board) == before


def _killed_flash(board, image, env) -> str:  # noqa: ANN001
    p = run(["flash", str(image), "--yes", "--expect-part", PART_KEY, "--board", f"sim:{board}"], env)
    assert p.returncode == -signal.SIGKILL
    runs = command_line.run("runs", "--format", "json", env=env)
    return json.loads(runs.stdout)[-1]["run_id"]


@pytest.mark.slow
def test_resume_refuses_when_another_run_wrote_the_board_since(cli, make_board, image, tmp_path):
    # Killed once it writes units (its backup, about 48,400 writes, is over): a flash killed
    # before it changed anything is not unfinished, and a new flash would not be refused.
    board = make_board(content=damaged(image.read_bytes()), transport="ideal", faults=["kill-after-writes=49100"])
    env = {"PYTHONPATH": str(ROOT)}
    killed = _killed_flash(board, image, env)
    assert flash_content(board) != damaged(image.read_bytes())
    other = tmp_path / "other.bin"
    other.write_bytes(synthetic_ifwi(4321))
    # A new flash of a board with an unfinished one is an override (the default refuses, naming the resume).
    assert cli("flash", other, "--yes", "--expect-part", PART_KEY, "--board", f"sim:{board}").code == 2
    assert cli("flash", other, "--yes", "--expect-part", PART_KEY, "--board", f"sim:{board}", "--start-over").code == 0
    r = cli("resume", killed, "--board", f"sim:{board}", "--yes")
    assert r.code == 2 and "wrote this board after" in r.err
    assert flash_content(board) == other.read_bytes()


@pytest.mark.slow   # a long scenario: CI runs it (pytest -m slow)
def test_resume_rereads_units_an_earlier_run_verified(cli, make_board, image):
    """Something outside amdflash changed a verified unit: resume reads it and puts it right."""
    board = make_board(content=damaged(image.read_bytes()), transport="ideal", faults=["kill-after-writes=19000"])
    env = {"PYTHONPATH": str(ROOT)}
    killed = _killed_flash(board, image, env)
    with Board(board) as b:
        b.files.flash[0x5000:0x5010] = bytes(16)      # as if another tool wrote it
    r = cli("resume", killed, "--board", f"sim:{board}", "--yes")
    assert r.code == 0, r.err
    assert flash_content(board) == image.read_bytes()


@pytest.mark.slow   # a long scenario: CI runs it (pytest -m slow)
def test_resume_with_restore_each_puts_back_the_original_registers(make_board, image, tmp_path):
    board = make_board(content=damaged(image.read_bytes()), transport="ideal", faults=["kill-after-writes=5002"])
    before = registers(board)
    env = {"PYTHONPATH": str(ROOT), "AMDFLASH_DB": str(tmp_path / "a.sqlite"),
           "AMDFLASH_LOCK_DIR": str(tmp_path / "locks")}
    p = run(["flash", str(image), "--yes", "--restore-each", "--expect-part", PART_KEY, "--board", f"sim:{board}"], env)
    assert p.returncode == -signal.SIGKILL
    assert registers(board) != before                  # killed inside a transaction
    r = command_line.run("-q", "resume", "--board", f"sim:{board}", "--yes", env=env)
    assert r.returncode == 0, r.stderr
    assert flash_content(board) == image.read_bytes()
    assert registers(board) == before


def test_sigint_during_an_aperture_dump_stops_restores_and_writes_no_file(make_board, tmp_path):
    from amdflash.stages.sim.synth import synthetic_ifwi as synth

    board = make_board(content=synth(5))
    with Board(board) as b:
        cntl, index = b.get32(R.ROM_CNTL), b.get32(R.ROM_INDEX)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AMDFLASH_DB": str(tmp_path / "a.sqlite"),
           "AMDFLASH_LOCK_DIR": str(tmp_path / "locks")}
    out = tmp_path / "dump.bin"
    proc = subprocess.Popen([sys.executable, "-m", "amdflash.pipeline.cli", "dump", str(out), "--via", "aperture",
                             "--board", f"sim:{board}"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 60
    while True:                                        # wait until the dump is under way
        with Board(board) as b:
            if b.stats()["reg_reads"] > 20000:
                break
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert not out.exists()
    swap = lambda v: int.from_bytes(v.to_bytes(4, "little"), "big")  # noqa: E731
    with Board(board) as b:                            # restored the way the validated client does
        assert (b.get32(R.ROM_CNTL), b.get32(R.ROM_INDEX)) == (swap(cntl), swap(index))
