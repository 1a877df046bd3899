"""Durable before it matters: after a SIGKILL at any moment — of the host alone, or of the host
and its audit writer together — every erase, page program and status-register write that
reached the emulated board (its chip's own command log) is in the committed trail: its own
row, or a durable intent of its unit."""
from __future__ import annotations

import json
import struct
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from amdflash.stages.drivers.navi31 import regs as R
from amdflash.stages.sim import command_log
from tests.pipeline.engine.conftest import ROOT
from tests.pipeline.engine.trail_check import uncovered_commands

SECTORS = 24


@pytest.fixture
def dense(tmp_path: Path) -> tuple[Path, bytes]:
    rng = random.Random(5)
    image = bytearray(rng.randbytes(0x200000))
    image[:4] = b"\xaa\x55\xaa\x55"
    path = tmp_path / "dense.bin"
    path.write_bytes(image)
    return path, rng.randbytes(0x200000)      # and the boards' content: every unit needs an erase


def _flash(db: Path, image: Path, board: Path, *extra: str, group: bool = False) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "amdflash.pipeline.cli", "-q", "--db", str(db), "flash", str(image), "--yes", "--force",
         "--sector-count", str(SECTORS), *extra, "--board", f"sim:{board}"],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        start_new_session=group)


def _writer_gone(db: Path, timeout: float = 30) -> None:
    """Wait until no process holds the database's write lock (the writer committed and left)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        con = sqlite3.connect(db, timeout=0.1)
        try:
            con.execute("BEGIN IMMEDIATE")
            con.execute("ROLLBACK")
            return
        except sqlite3.OperationalError:
            time.sleep(0.05)
        finally:
            con.close()
    pytest.fail("the audit writer still holds the database")


def _check(cli, db: Path, board: Path) -> None:  # noqa: ANN001
    destructive = command_log.read(board)
    missing = uncovered_commands(db, board)
    first = [f"{c.opcode:02x}@{c.address:#08x}" for c in missing[:5]]
    assert not missing, f"{len(missing)} of {len(destructive)} destructive commands not on record: {first}"
    r = cli("audit", "verify")
    assert r.code == 0 and "intact" in r.out, r.out


def _kill_moments(n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    return sorted(rng.uniform(0.02, 0.9) for _ in range(n))


def _commands_so_far(board: Path) -> int:
    """Destructive commands the board's chip has received (whole lines of its log)."""
    try:
        return (board / command_log.LOG_NAME).read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def _until_commands(board: Path, p: subprocess.Popen, n: int, timeout: float = 120) -> None:
    """Wait until the chip has received `n` destructive commands: the kill's moment is an event
    on the board, not a time, so a busy machine cannot let the flash run past it."""
    deadline = time.monotonic() + timeout
    while _commands_so_far(board) < n:
        if p.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"the flash ended (or stalled) before its destructive command {n}")
        time.sleep(0.002)


def _group_kills(cli, make_board, dense, db, fractions: list[float]) -> None:  # noqa: ANN001
    image, content = dense
    board = make_board(content=content, transport="ideal")
    p = _flash(db, image, board)
    p.wait()
    assert p.returncode == 0
    total = _commands_so_far(board)             # the destructive commands of a whole flash
    landed = 0
    for fraction in fractions:
        board = make_board(content=content, transport="ideal")
        p = _flash(db, image, board, group=True)
        _until_commands(board, p, max(1, int(fraction * total)))
        try:
            os.killpg(p.pid, signal.SIGKILL)       # the host and its writer, at the same instant
        except ProcessLookupError:
            pass
        p.wait()
        landed += p.returncode == -signal.SIGKILL
        _writer_gone(db)
        _check(cli, db, board)
    assert landed >= len(fractions) / 2, f"only {landed} of {len(fractions)} kills landed mid-flash"


def test_host_and_writer_killed_together_lose_nothing_destructive(cli, make_board, dense, db):
    _group_kills(cli, make_board, dense, db, [0.3, 0.7])


@pytest.mark.slow
def test_host_and_writer_killed_together_at_many_moments(cli, make_board, dense, db):
    _group_kills(cli, make_board, dense, db, _kill_moments(20, seed=9))


def _host_kills(cli, make_board, dense, db, fractions: list[float]) -> None:  # noqa: ANN001
    """kill-after-writes: the host dies at its Nth register write (before it reaches the board);
    the writer, left alone, commits what it was handed and exits. N is spread over a whole flash."""
    image, content = dense
    board = make_board(content=content, transport="ideal")
    assert _flash(db, image, board).wait() == 0
    total = json.loads(cli("runs", "--format", "json").out)[-1]["run_id"]
    total = json.loads(cli("report", total, "--format", "json").out)["register_writes"]
    for fraction in fractions:
        n = int(total * fraction)
        board = make_board(content=content, transport="ideal", faults=[f"kill-after-writes={n}"])
        p = _flash(db, image, board)
        p.wait()
        assert p.returncode == -signal.SIGKILL
        _writer_gone(db)
        _check(cli, db, board)
        # The gap: writes 1..n-1 reached the board; all but the last few hundred are on record.
        # The nth is on record too when the batch it closed was handed over just before the host
        # died sending it (a write is recorded before it is sent).
        killed = json.loads(cli("runs", "--format", "json").out)[-1]["run_id"]
        recorded = json.loads(cli("report", killed, "--format", "json").out)["register_writes"]
        assert -1 <= n - 1 - recorded <= 512 + 3, (n, recorded)


def test_host_killed_alone_loses_nothing_destructive(cli, make_board, dense, db):
    _host_kills(cli, make_board, dense, db, [0.3, 0.75])


@pytest.mark.slow
def test_host_killed_alone_at_forty_points(cli, make_board, dense, db):
    _host_kills(cli, make_board, dense, db, [(i + 0.5) / 40 for i in range(40)])


def test_a_status_register_write_is_on_record_before_it_reaches_the_board(cli, make_board, dense, db, image):
    """Clearing CMP writes SR2: the host is killed at the very next register write; the WRSR the
    chip received is in the committed trail as its own row (no unit intent covers it)."""
    twin = make_board(content="synthetic", transport="ideal", cmp=True, seed=3)
    assert cli("flash", image, "--yes", "--force", "--clear-cmp", "--sector-count", "2", "--board", f"sim:{twin}").code == 0
    run = json.loads(cli("runs", "--format", "json").out)[-1]["run_id"]
    con = sqlite3.connect(db)
    wrsr = con.execute("SELECT max(w.n) FROM register_writes w JOIN spi_transactions t ON t.seq = w.seq "
                       "AND t.run_id = w.run_id WHERE w.run_id = ? AND t.opcode = 1", [run]).fetchone()[0]
    # The default driver streams it: STATUS, COMMAND, the reserved dword and the new status
    # bytes in one block write, then CNTL. The gate must see the opcode in that block.
    (shape,) = con.execute("SELECT s.shape FROM log_spi s JOIN spi_transactions t ON t.seq = s.seq "
                           "WHERE t.run_id = ? AND t.opcode = 1", [run]).fetchall()
    con.close()
    assert shape == ("BN",)
    board = make_board(content="synthetic", transport="ideal", cmp=True, seed=3,
                       faults=[f"kill-after-writes={wrsr + 1}"])
    p = subprocess.run([sys.executable, "-m", "amdflash.pipeline.cli", "-q", "--db", str(db), "flash", str(image),
                        "--yes", "--force", "--clear-cmp", "--sector-count", "2", "--board", f"sim:{board}"],
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True)
    assert p.returncode == -signal.SIGKILL
    _writer_gone(db)
    assert [c.opcode for c in command_log.read(board)] == [0x01]    # the WRSR reached the chip, nothing after it
    _check(cli, db, board)


class _Recorder:
    """What the gate asks of the trail, and when."""

    failed = None

    def __init__(self, events: list[str]):
        self.events = events

    def register_write(self, offset, value, data, clock):  # noqa: ANN001
        self.events.append(f"record {offset:#x}")

    def covers(self, start: int, size: int) -> bool:
        return False

    def durable(self) -> None:
        self.events.append("durable")


class _Raw:
    def __init__(self, events: list[str], command: int = 0):
        from amdflash.stages.sim.clock import SimClock  # noqa: F401 - only its interface is used

        self.events = events
        self.command = command       # what the board's ROM_SW_COMMAND holds
        self.clock = type("Clock", (), {"now": staticmethod(lambda: 0.0)})()
        self.identity = None

    def write32(self, offset: int, value: int) -> None:
        self.events.append(f"write {offset:#x}")

    def write_block(self, offset: int, data: bytes) -> None:
        self.events.append(f"block {offset:#x}")

    def read_block(self, offset: int, size: int) -> bytes:
        self.events.append(f"read {offset:#x}")
        return self.command.to_bytes(4, "little")[:size] if offset == R.ROM_SW_COMMAND else bytes(size)


def _gated(*writes, command: int = 0) -> list[str]:  # noqa: ANN002
    from amdflash.stages.open_transport import AuditedBar

    events: list[str] = []
    bar = AuditedBar(_Raw(events, command), _Recorder(events))
    for write in writes:
        write(bar)
    return events


def _streamed(opcode: int, tx: bytes):  # noqa: ANN202
    """STATUS, COMMAND, the reserved dword and TX data in one block write, as the driver streams them."""
    return lambda bar: bar.write_block(R.ROM_SW_STATUS, struct.pack("<III", 0, opcode, 0) + tx)


def test_a_streamed_command_is_gated_at_its_cntl_write():
    """A status-register write whose COMMAND came in a streamed block: its CNTL write reaches the
    board only after its own row is durable; a harmless command is not held up."""
    cntl = lambda bar: bar.write32(R.ROM_SW_CNTL, 2)  # noqa: E731
    events = _gated(lambda bar: bar.write32(R.ROM_SW_COMMAND, 0x06), _streamed(0x01, b"\x00\x02\x00\x00"), cntl)
    assert events[-3:] == [f"record {R.ROM_SW_CNTL:#x}", "durable", f"write {R.ROM_SW_CNTL:#x}"]
    events = _gated(lambda bar: bar.write32(R.ROM_SW_COMMAND, 0x01), _streamed(0x06, b""), cntl)
    assert "durable" not in events


def test_a_cntl_write_sent_as_a_block_is_gated_too():
    """The validated sequence sends every register as a one-dword stream: a CNTL write that is a
    block write starts the transaction all the same, and is gated all the same."""
    events = _gated(lambda bar: bar.write_block(R.ROM_SW_COMMAND, struct.pack("<I", 0x20 | 0x1000 << 8)),
                    lambda bar: bar.write_block(R.ROM_SW_CNTL, struct.pack("<I", 3 << 16)))
    assert events[-3:] == [f"record {R.ROM_SW_CNTL:#x}", "durable", f"block {R.ROM_SW_CNTL:#x}"]


def test_a_command_the_run_never_wrote_is_read_before_the_gate_decides():
    """A CNTL = 0 clear before any COMMAND write re-sends whatever COMMAND held: the gate reads it."""
    events = _gated(lambda bar: bar.write32(R.ROM_SW_CNTL, 0))
    assert events == [f"record {R.ROM_SW_CNTL:#x}", f"read {R.ROM_SW_COMMAND:#x}", f"write {R.ROM_SW_CNTL:#x}"]


def test_a_block_that_writes_part_of_command_keeps_the_opcode_the_board_holds():
    """A block that covers only COMMAND's address bytes leaves its opcode byte as the board
    holds it (here a page program): the gate reads it rather than taking it for 0, so the
    program's CNTL write still waits for its durable row."""
    events = _gated(lambda bar: bar.write_block(R.ROM_SW_COMMAND + 1, b"\x00\x10\x00"),
                    lambda bar: bar.write32(R.ROM_SW_CNTL, 3 << 16 | 4),
                    command=0x02)
    assert events == [f"record {R.ROM_SW_COMMAND + 1:#x}", f"read {R.ROM_SW_COMMAND:#x}",
                      f"block {R.ROM_SW_COMMAND + 1:#x}",
                      f"record {R.ROM_SW_CNTL:#x}", "durable", f"write {R.ROM_SW_CNTL:#x}"]
