"""Kill campaigns: a flash killed anywhere — in every phase, at random moments, during its
resume — resumes to exactly the image, with the registers and the backup as they should be.

The kill points are register writes of an undisturbed reference flash, classified by the
phase they belong to (from the reference run's own audit trail): backup, erase, program,
verify and restore. `kill-after-writes=N` makes the host die just before its Nth write.
"""
from __future__ import annotations

import hashlib
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from amdflash.stages.drivers.navi31.regs import ROM_SW_CNTL
from amdflash.stages.restore import RESTORABLE
from amdflash.stages.sim import Board, create_board
from tests.pipeline.engine.test_faults_matrix import damaged, image
from tests.support import cli

ROOT = Path(__file__).resolve().parents[3]
PHASES = ("backup", "erase", "program", "verify", "restore")
PER_PHASE = 9                           # kill points per phase (restore: as many as it has writes)
ERASES, PROGRAM, WREN = {0x20, 0x52, 0xD8}, 0x02, 0x06
STATUS = {0x05, 0x35, 0x15}


class Case:
    def __init__(self, work: Path):
        work.mkdir(parents=True, exist_ok=True)
        self.work = work
        self.image_path = work / "image.bin"
        self.image_path.write_bytes(image())
        self.content = damaged(image())
        self.board = create_board(work / "board", content=self.content, transport="ideal", seed=5)
        self.db = work / "audit.sqlite"
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "AMDFLASH_DB": str(self.db),
                    "AMDFLASH_LOCK_DIR": str(work / "locks")}
        self.before = self.registers()
        self.kill_set = False

    def cli(self, *args: object) -> cli.Result:
        """The command line in this process, or, while a kill-after-writes fault is set and has
        not fired (it fires once: the host dies), as a process of its own."""
        if not self.kill_set:
            return cli.run("--no-progress", *args, env=self.env, timeout=600)
        p = cli.run_process("--no-progress", *args, env=self.env, timeout=600, module="amdflash.pipeline.cli")
        self.kill_set = p.code != -signal.SIGKILL
        return p

    def flash(self) -> cli.Result:
        # The board holds a damaged IFWI (the bricked case): the operator vouches for its part.
        return self.cli("flash", self.image_path, "--yes", "--expect-part", "SYNTH-0001", "--board", f"sim:{self.board}")

    def resume(self) -> cli.Result:
        return self.cli("resume", "--yes", "--board", f"sim:{self.board}")

    def kill_after(self, n: int) -> None:
        assert self.cli("sim", "fault", self.board, "--clear", f"kill-after-writes={n}").returncode == 0
        self.kill_set = True

    def registers(self) -> dict[int, int]:
        with Board(self.board) as b:
            return {r: b.get32(r) for r in RESTORABLE}

    def writes(self) -> float:
        with Board(self.board) as b:
            return b.stats()["reg_writes"]

    def check_finished(self, label: object) -> None:
        """The flash holds the image, the registers are as before the first run, the chain is
        intact, and the backup of the original content is one complete file (no .partial)."""
        assert (self.board / "flash.bin").read_bytes() == image(), label
        assert self.registers() == self.before, label
        chain = self.cli("audit", "verify")
        assert chain.returncode == 0 and "intact" in chain.stdout, (label, chain.stdout)
        backups = self.db.parent / "backups"
        assert not list(backups.glob(".*partial*")), (label, list(backups.iterdir()))
        want = hashlib.sha256(self.content).hexdigest()
        assert (backups / f"{want}.bin").read_bytes() == self.content, label


def phase_of_writes(db: Path) -> dict[str, list[int]]:
    """Register write numbers (n) of the newest run, by the phase they belong to.

    Each SPI transaction owns the writes issued since the previous one, up to its own
    ROM_SW_CNTL write, which starts it (the k-th write that reaches CNTL starts the k-th
    transaction). A write enable (and the status read that checks it) belongs to the
    operation it enables; other status reads are the busy polls of the operation before them."""
    con = sqlite3.connect(db)
    try:
        run_id = con.execute("SELECT run_id FROM runs ORDER BY seq DESC LIMIT 1").fetchone()[0]
        stages = {(s, e): seq for s, e, seq in con.execute(
            "SELECT stage, event, min(seq) FROM stages WHERE run_id = ? GROUP BY stage, event", [run_id])}
        writes = con.execute("SELECT seq, n, offset, coalesce(length(data), 4) FROM register_writes "
                             "WHERE run_id = ? ORDER BY n", [run_id]).fetchall()
        transactions = iter(con.execute("SELECT seq, opcode FROM spi_transactions WHERE run_id = ? ORDER BY n",
                                        [run_id]).fetchall())
    finally:
        con.close()
    out: dict[str, list[int]] = {p: [] for p in PHASES}
    owned: list[int] = []
    enabling: list[int] = []
    last: str | None = None
    for seq, n, offset, size in writes:
        if seq > stages["restore", "start"]:
            out["restore"].append(n)
            continue
        owned.append(n)
        if not offset <= ROM_SW_CNTL < offset + size:
            continue
        started, value = next(transactions)
        if value == WREN or (value in STATUS and enabling):
            enabling += owned
        elif value in STATUS:
            if last:
                out[last] += owned
        else:
            if stages["backup", "start"] < started < stages["backup", "end"]:
                last = "backup"
            elif started > stages["backup", "end"]:
                last = "erase" if value in ERASES else "program" if value == PROGRAM else "verify"
            else:
                last = None           # identification
            if last:
                out[last] += enabling + owned
            enabling = []
        owned = []
    return out


@pytest.fixture(scope="module")
def reference_phases(tmp_path_factory) -> dict[str, list[int]]:
    """The register writes of an undisturbed flash, by phase."""
    ref = Case(tmp_path_factory.mktemp("kill-reference"))
    done = ref.flash()
    assert done.returncode == 0, done.stderr
    return phase_of_writes(ref.db)


@pytest.fixture(scope="module")
def kill_points(reference_phases) -> dict[str, list[int]]:
    phases = reference_phases
    points = {}
    for phase, writes in phases.items():
        assert writes, phase
        step = max(1, len(writes) // PER_PHASE)
        points[phase] = writes[step // 2::step][:PER_PHASE]
    return points


def test_kill_points_cover_every_phase(kill_points):
    assert set(kill_points) == set(PHASES)
    assert all(kill_points[p] for p in PHASES)
    assert sum(len(v) for v in kill_points.values()) >= 40


@pytest.mark.slow
@pytest.mark.parametrize("phase", PHASES)
def test_a_flash_killed_in_each_phase_resumes_to_the_image(tmp_path, kill_points, reference_phases, phase):
    reference_total = max(n for writes in reference_phases.values() for n in writes)
    for point in kill_points[phase]:
        n = point
        for attempt in range(3):
            # Named by the kill point, not by n: a point moved for a retry (below) can land on
            # another point's number (restore's points are consecutive writes), and the board
            # of that name was made already (a slow run under load).
            case = Case(tmp_path / f"{phase}-{point}-{attempt}")
            case.kill_after(n)
            killed = case.flash()
            if killed.returncode != 0:
                break
            # This flash issued fewer writes than the reference (its busy polls follow the
            # host's timing) and ended before the point: the same point, counted from the end.
            n -= int(reference_total - case.writes())
        assert killed.returncode == -signal.SIGKILL, (phase, n, killed.stderr)
        resumed = case.resume()
        assert resumed.returncode == 0, (phase, n, resumed.stderr)
        case.check_finished((phase, n))


@pytest.mark.slow
def test_a_flash_killed_while_erasing_and_its_resume_killed_too_finish(tmp_path, kill_points):
    """A kill during resume: the second resume puts back the registers the first flash found."""
    case = Case(tmp_path / "twice")
    case.kill_after(kill_points["erase"][len(kill_points["erase"]) // 2])
    assert case.flash().returncode == -signal.SIGKILL
    case.kill_after(kill_points["program"][0] // 2)
    killed = case.resume()
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    case.kill_after(10 ** 9)              # disarmed: counts on, never fires
    resumed = case.resume()
    assert resumed.returncode == 0, resumed.stderr
    assert "put back the registers" in resumed.stdout
    case.check_finished("resume killed")


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
def test_a_flash_sigkilled_at_a_random_moment_resumes_to_the_image(tmp_path, seed):
    case = Case(tmp_path / f"random-{seed}")
    proc = subprocess.Popen([sys.executable, "-m", "amdflash.pipeline.cli", "-q", "flash", str(case.image_path),
                             "--yes", "--expect-part", "SYNTH-0001", "--board", f"sim:{case.board}"], env=case.env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while proc.poll() is None and case.writes() == 0:     # the run has started touching the board
        assert time.monotonic() < deadline
        time.sleep(0.02)
    time.sleep(random.Random(seed).uniform(0.0, 2.5))     # then a random moment of it (≈ 3 s long)
    proc.send_signal(signal.SIGKILL)
    code = proc.wait(timeout=600)
    if code == 0:                          # finished before the kill: nothing to resume
        case.check_finished(seed)
        return
    resumed = case.resume()
    if "no unfinished flash run" in resumed.stderr:
        # Killed before the run was on record (nothing was written yet): flash anew.
        resumed = case.flash()
    assert resumed.returncode == 0, (seed, resumed.stderr)
    case.check_finished(seed)


@pytest.mark.slow   # a long scenario: CI runs it (pytest -m slow)
def test_the_backup_is_complete_before_the_first_erase_and_rebuilt_on_resume_if_lost(tmp_path, reference_phases):
    case = Case(tmp_path / "first-erase")
    # The first write of the erase phase (the first erase's write enable): up to there the
    # flash only reads, so its count of writes does not depend on the host's timing (busy
    # polls do, and a point inside the phase may fall after the first erase on another run).
    case.kill_after(reference_phases["erase"][0])
    assert case.flash().returncode == -signal.SIGKILL
    assert (case.board / "flash.bin").read_bytes() == case.content        # nothing erased yet
    want = hashlib.sha256(case.content).hexdigest()
    backup = case.db.parent / "backups" / f"{want}.bin"
    assert backup.read_bytes() == case.content
    con = sqlite3.connect(case.db)
    try:
        assert con.execute("SELECT sha256 FROM backups").fetchall() == [(want,)]
    finally:
        con.close()
    backup.unlink()                       # lost: the resume rebuilds it from the recorded units
    resumed = case.resume()
    assert resumed.returncode == 0, resumed.stderr
    assert "rebuilt from the recorded units" in resumed.stdout
    case.check_finished("backup rebuilt")


@pytest.mark.slow
def test_a_backup_lost_mid_programming_is_rebuilt_on_resume(tmp_path, kill_points):
    case = Case(tmp_path / "lost-backup")
    case.kill_after(kill_points["program"][len(kill_points["program"]) // 2])
    assert case.flash().returncode == -signal.SIGKILL
    for f in (case.db.parent / "backups").iterdir():
        f.unlink()
    resumed = case.resume()
    assert resumed.returncode == 0, resumed.stderr
    assert "rebuilt from the recorded units" in resumed.stdout
    case.check_finished("backup rebuilt")
