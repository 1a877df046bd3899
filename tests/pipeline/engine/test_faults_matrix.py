"""Every fault kind against every board command, through the CLI as a user runs it.

Each cell ends in a correct result, or exit 1 with one line naming what failed (or the
host killed, for kill-after-writes) — never a wrong byte kept (a dump, a flash or a verify
that passes checks its result against the board); the registers are put back, or the error says which
are left changed; the audit chain is intact; and where the fault was transient, a later
run — after the fault is cleared, as after a re-plug or a flaky moment — reaches the
target with the registers as the board had them before the first run.

`python -m tests.pipeline.engine.test_faults_matrix` prints the whole matrix with each cell's
outcome (it takes a few minutes).
"""
from __future__ import annotations

import json
import sqlite3
import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path

import pytest

from amdflash.stages.restore import NAMES, RESTORABLE
from amdflash.stages.sim import Board, create_board
from amdflash.stages.sim.synth import synthetic_ifwi
from tests.support import cli

ROOT = Path(__file__).resolve().parents[3]
UNIT = 0x1000
SEED = 77
COMMANDS = ("dump", "verify", "flash", "resume", "ifwi-all")
ALL_FAULTS = ("read-flip=1e-6", "read-flip=1e-4", "read-flip=1e-2", "stuck-bit", "erase-fail", "stall-after",
          "usb-disconnect-after", "kill-after-writes", "psp-error", "silent-rx=1e-2", "stale-done=1e-2", "busy-read")
FAULTS = tuple(f for f in ALL_FAULTS if f in os.environ.get("MATRIX_FAULTS", ",".join(ALL_FAULTS)).split(","))
DAMAGED_BLOCK = 0x100000     # the flash commands must erase and program this 64 KiB block (it holds data)
DAMAGED_BULK = 0xC0000       # ... and erase the first 12 blocks (three hold data) before they reach it
TRANSIENT = {"stall-after", "usb-disconnect-after", "kill-after-writes", "psp-error"}


def image() -> bytes:
    return synthetic_ifwi(SEED)


def damaged(img: bytes) -> bytes:
    """The board content the flash commands start from: erase and program-only work."""
    out = bytearray(img)
    out[0:DAMAGED_BULK] = bytes(DAMAGED_BULK)
    out[DAMAGED_BLOCK:DAMAGED_BLOCK + 0x10000] = bytes(0x10000)
    out[0x1F0000:0x1F0100] = b"\xff" * 0x100
    return bytes(out)


def stuck_address(img: bytes) -> int:
    """A bit the image wants 0: a flash must program it (and cannot), a dump reads it as 1."""
    return next(a for a in range(0x2345, len(img)) if not img[a] & 1)


@dataclass
class Run:
    code: int
    out: str
    err: str

    @property
    def errors(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.startswith("error:")]


class Rig:
    """One cell's board, database and environment."""

    def __init__(self, work: Path, command: str, via_usb: bool):
        self.work = work
        self.command = command
        work.mkdir(parents=True, exist_ok=True)
        self.image_path = work / "image.bin"
        self.image_path.write_bytes(image())
        content = image() if command in ("dump", "verify", "ifwi-all") else damaged(image())
        self.board = create_board(work / "board", content=content, transport="ideal", seed=SEED)
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "AMDFLASH_DB": str(work / "audit.sqlite"),
                    "AMDFLASH_LOCK_DIR": str(work / "locks")}
        self.spec = f"sim:{self.board}"
        if via_usb:
            self.env["AMDFLASH_SIM_USB"] = str(self.board)
            self.spec = "usb:" + json.loads((self.board / "board.json").read_text())["serial"]
        self.registers_before = self.registers()
        self.kill_set = False

    def cli(self, *args: object, timeout: float = 600) -> Run:
        """The command line in this process, or, while a kill-after-writes fault is set and has
        not fired (it fires once: the host dies), as a process of its own."""
        if self.kill_set:
            p = cli.run_process("--no-progress", *args, env=self.env, cwd=self.work, timeout=timeout,
                                module="amdflash.pipeline.cli")
            self.kill_set = p.code != -signal.SIGKILL
        else:
            p = cli.run("--no-progress", *args, env=self.env, cwd=self.work, timeout=timeout)
        return Run(p.code, p.out, p.err)

    def job(self) -> Run:
        """The cell's command (resume: of the latest unfinished flash of the board)."""
        args = {"dump": ["dump", self.work / "dump.bin"], "verify": ["verify", self.image_path],
                "flash": ["flash", self.image_path, "--yes", "--expect-part", "SYNTH-0001"], "resume": ["resume", "--yes"],
                "ifwi-all": ["ifwi-all", self.image_path, "--yes"]}[self.command]
        return self.cli(*args, "--board", self.spec)

    def fault(self, *specs: str) -> None:
        r = self.cli("sim", "fault", self.board, "--clear", *specs)
        assert r.code == 0, r.err
        self.kill_set = any(spec.startswith("kill-after-writes") for spec in specs)

    def registers(self) -> dict[int, int]:
        with Board(self.board) as b:
            return {r: b.get32(r) for r in RESTORABLE}

    def as_read(self) -> bytes:
        """The flash as the chip reads it (stuck bits read 1)."""
        with Board(self.board) as b:
            return bytes(b.chip._array(0, 0x200000))

    def counts(self) -> dict[str, float]:
        with Board(self.board) as b:
            return b.stats()

    def target_reached(self, run: Run) -> bool:
        if run.code != 0:
            return False
        if self.command == "dump":
            return (self.work / "dump.bin").read_bytes() == self.as_read()
        if self.command == "verify":
            return "flash equals the image" in run.out
        if self.command in ("flash", "resume"):
            return (self.board / "flash.bin").read_bytes() == image()
        return "IFWI stream complete" in run.out

    def chain_intact(self) -> bool:
        r = self.cli("audit", "verify")
        return r.code == 0 and "intact" in r.out


@dataclass
class Cell:
    command: str
    fault: str
    outcome: str          # ok | failed: <the error line> | killed
    registers: str
    chain: bool
    later: str

    def row(self) -> str:
        return f"| {self.fault} | {self.command} | {self.outcome} | {self.registers} | " \
               f"{'intact' if self.chain else 'BROKEN'} | {self.later} |"


def fault_spec(rig: Rig, fault: str, reference: dict[str, float]) -> list[str]:
    """The fault for this cell; counted faults land half-way through the command."""
    img = image()
    if fault.startswith(("read-flip", "silent-rx", "stale-done")):
        return [fault]
    if fault == "busy-read":
        # A unit that holds data: its first read finds the chip busy and reads all 0xFF.
        return [f"busy-read={DAMAGED_BLOCK:#x}"]
    if fault == "stuck-bit":
        return [f"stuck-bit={stuck_address(img):#x}:0"]
    if fault == "erase-fail":
        return [f"erase-fail={DAMAGED_BLOCK // UNIT + 3}"]
    if fault == "stall-after":
        return [f"stall-after={max(1, int(reference['spi_transactions'] * 0.5))}"]
    if fault == "usb-disconnect-after":
        return [f"usb-disconnect-after={int(reference['usb_transfers'] * 0.5)}"]
    if fault == "kill-after-writes" and rig.command == "flash":
        # Half-way through the erases and programs: a flash killed in its backup (most of its
        # writes) changed nothing, and is not unfinished (a new flash goes ahead).
        whole, reads = flash_writes(rig.work.parent, rig.spec.startswith("usb:"))
        return [f"kill-after-writes={int(reads + (whole - reads) * 0.5)}"]
    if fault == "kill-after-writes":
        return [f"kill-after-writes={max(1, int(reference['reg_writes'] * 0.5))}"]
    return ["psp-error=0x8:0xc"]


def reference_counts(work: Path, command: str, via_usb: bool) -> dict[str, float]:
    """What an undisturbed run of the command costs the board (resume: after a kill)."""
    rig = Rig(work, command, via_usb)
    if command == "resume":
        kill_flash_half_way(rig)
    before = rig.counts()
    run = rig.job()
    assert run.code == 0, run.err
    after = rig.counts()
    with Board(rig.board) as b:
        usb = float(b.fault_state[2])
    return {"spi_transactions": after["spi_transactions"] - before["spi_transactions"],
            "reg_writes": after["reg_writes"] - before["reg_writes"], "usb_transfers": usb}


_FLASH_WRITES: dict[bool, tuple[float, float]] = {}


def flash_writes(work: Path, via_usb: bool) -> tuple[float, float]:
    """Register writes of an undisturbed flash from the damaged content: (in all, before the first
    erase). The second is a flash of the board that already holds the image: reads, no writes.
    (The number of status polls, and so of writes, depends a little on the host's timing.)"""
    if via_usb not in _FLASH_WRITES:
        counts = []
        for start in ("flash", "verify"):         # the damaged content; the image
            rig = Rig(work / f"flash-writes-{via_usb}-{start}", start, via_usb)
            before = rig.counts()["reg_writes"]
            run = rig.cli("flash", rig.image_path, "--yes", "--expect-part", "SYNTH-0001", "--board", rig.spec)
            assert run.code == 0, run.err
            counts.append(rig.counts()["reg_writes"] - before)
        _FLASH_WRITES[via_usb] = (counts[0], counts[1])
    return _FLASH_WRITES[via_usb]


def kill_flash_half_way(rig: Rig) -> None:
    """The resume cells start from a flash killed half-way through its erases and programs (the
    host dies at a register write): the bulk partly done, DAMAGED_BLOCK not yet begun."""
    whole, reads = flash_writes(rig.work.parent, rig.spec.startswith("usb:"))
    rig.fault(f"kill-after-writes={int(reads + (whole - reads) * 0.3)}")
    killed = rig.cli("flash", rig.image_path, "--yes", "--expect-part", "SYNTH-0001", "--board", rig.spec)
    assert killed.code == -signal.SIGKILL, killed.err
    rig.fault()
    flash, img = (rig.board / "flash.bin").read_bytes(), image()
    assert flash[:UNIT] == img[:UNIT], "the kill came before the first unit was written"
    assert flash[DAMAGED_BLOCK:DAMAGED_BLOCK + UNIT] != img[DAMAGED_BLOCK:DAMAGED_BLOCK + UNIT], \
        "the kill came after DAMAGED_BLOCK was written"


def run_cell(work: Path, command: str, fault: str, reference: dict[str, float]) -> Cell:
    via_usb = fault == "usb-disconnect-after"
    rig = Rig(work, command, via_usb)
    if command == "resume":
        kill_flash_half_way(rig)
    rig.fault(*fault_spec(rig, fault, reference))
    run = rig.job()
    assert "Traceback" not in run.err, run.err
    if run.code == -signal.SIGKILL:
        outcome = "killed"
    elif run.code == 0:
        assert rig.target_reached(run), (command, fault, run.out, run.err)
        outcome = "ok"
    else:
        assert run.code == 1, (command, fault, run.code, run.err)
        assert len(run.errors) == 1, run.err                  # one line naming what failed
        outcome = "failed: " + run.errors[0][len("error: "):]
    left = rig.registers() != rig.registers_before
    if outcome == "killed":
        registers = "left changed (host killed)" if left else "as before"
    elif run.errors and "left changed" in run.errors[0]:     # its own error line: not the line that says it
        # put back what the killed flash before it left changed (a resume cell's settle)
        names = [NAMES[r] for r in RESTORABLE if NAMES[r] + "=" in run.errors[0]]
        assert names, run.err
        registers = f"reported stranded ({len(names)} named)"
    else:
        assert not left, (command, fault, run.err)
        registers = "restored"
    chain = rig.chain_intact()
    assert chain
    later = "-"
    if outcome != "ok" and fault in TRANSIENT:
        rig.fault()
        again = rig.job()
        if command == "flash" and outcome == "killed":
            # A flash left unfinished is finished by resume: a new flash refuses, naming it.
            assert again.code == 2 and "amdflash" in again.err and "resume" in again.err, again.err
            again = rig.cli("resume", "--yes", "--board", rig.spec)
        assert rig.target_reached(again) or command == "ifwi-all", (command, fault, again.err)
        if again.code == 0:
            assert rig.registers() == rig.registers_before, (command, fault)
            put_back = "registers put back, " if "put back the registers" in again.out else ""
            later = f"{put_back}target reached"
        else:
            assert len(again.errors) == 1, again.err
            later = "failed: " + again.errors[0][len("error: "):]
        assert rig.chain_intact()
    elif outcome != "ok":
        later = "n/a (the fault is permanent)"
    return Cell(command, fault, outcome, registers, chain, later)


# -- the tests --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def references(tmp_path_factory) -> dict[tuple[str, bool], dict[str, float]]:
    cache: dict[tuple[str, bool], dict[str, float]] = {}

    def get(command: str, via_usb: bool) -> dict[str, float]:
        if (command, via_usb) not in cache:
            cache[command, via_usb] = reference_counts(
                tmp_path_factory.mktemp(f"ref-{command}-{via_usb}"), command, via_usb)
        return cache[command, via_usb]
    return get  # type: ignore[return-value]


# What each cell must end in. "ok": the command reaches its target despite the fault;
# "failed": exit 1 naming the failure; "killed": the host dies (and a later run recovers).
EXPECTED = {
    **{(c, f): "ok" for c in COMMANDS for f in FAULTS},
    **{(c, "kill-after-writes"): "killed" for c in COMMANDS},
    **{(c, "usb-disconnect-after"): "failed" for c in COMMANDS},
    **{(c, "stall-after"): "failed" for c in ("dump", "verify", "flash", "resume")},
    ("verify", "stuck-bit"): "failed", ("flash", "stuck-bit"): "failed", ("resume", "stuck-bit"): "failed",
    ("flash", "erase-fail"): "failed", ("resume", "erase-fail"): "failed",
    ("ifwi-all", "psp-error"): "failed",
}

# In the quick run, one cell keeps the harness honest; test_confirmed_reads and test_restore_registers
# have quick tests of read-flip, kills and lost links of their own.
FAST = [("dump", "kill-after-writes")]


def _check(tmp_path, references, command: str, fault: str) -> None:
    reference = references(command, fault == "usb-disconnect-after")
    cell = run_cell(tmp_path / "cell", command, fault, reference)
    want = EXPECTED[command, fault]
    assert cell.outcome.split(":")[0] == want, cell
    if want == "failed" and fault == "stuck-bit":
        assert f"{stuck_address(image()):#08x}" in cell.outcome
    if want == "failed" and fault == "erase-fail":
        assert f"verify failed at {DAMAGED_BLOCK + 3 * UNIT:#08x}" in cell.outcome


@pytest.mark.slow   # a long scenario: CI runs it (pytest -m slow)
@pytest.mark.parametrize("command,fault", FAST)
def test_fault_cell(tmp_path, references, command, fault):
    _check(tmp_path, references, command, fault)


@pytest.mark.slow
@pytest.mark.parametrize("command,fault", [(c, f) for f in FAULTS for c in COMMANDS if (c, f) not in FAST])
def test_fault_cell_slow(tmp_path, references, command, fault):
    _check(tmp_path, references, command, fault)


def main() -> None:
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="amdflash-faults-"))
    refs: dict[tuple[str, bool], dict[str, float]] = {}
    print("| fault | command | outcome | registers | chain | later run |")
    print("|---|---|---|---|---|---|")
    for fault in FAULTS:
        for command in COMMANDS:
            key = (command, fault == "usb-disconnect-after")
            if key not in refs:
                refs[key] = reference_counts(work / f"ref-{key[0]}-{key[1]}", *key)
            try:
                cell = run_cell(work / f"{fault}-{command}", command, fault, refs[key])
                print(cell.row(), flush=True)
            except AssertionError as e:
                what = re.sub(r"\s+", " ", str(e))[:300]
                print(f"| {fault} | {command} | ASSERTION FAILED: {what} | | | |", flush=True)


if __name__ == "__main__":
    main()


@pytest.mark.slow   # a long scenario: CI runs it (pytest -m slow)
def test_writes_a_disconnected_bridge_never_took_are_marked_not_sent(tmp_path):
    """The bridge goes away mid-flash: the trail records each write before sending it, so the
    writes that failed (the last one, then the restore's) are on record; a `stages` row says
    of each that it did not reach the board, and those rows make up the difference between
    the writes on record and the writes the board counted."""
    rig = Rig(tmp_path, "flash", via_usb=True)
    rig.fault("usb-disconnect-after=20000")
    run = rig.job()
    assert run.code == 1, run.err
    con = sqlite3.connect(tmp_path / "audit.sqlite")
    run_id = con.execute("SELECT run_id FROM runs ORDER BY seq DESC LIMIT 1").fetchone()[0]
    recorded = con.execute("SELECT count(*) FROM register_writes WHERE run_id = ?", [run_id]).fetchone()[0]
    not_sent = con.execute("SELECT count(*) FROM stages WHERE run_id = ? AND stage = 'transport' "
                           "AND event = 'write failed'", [run_id]).fetchone()[0]
    con.close()
    with Board(rig.board) as b:
        received = int(b.stats()["reg_writes"])
    assert not_sent >= 1 and recorded - not_sent == received, (recorded, not_sent, received)
