"""The audit trail: append-only, chained per run, sealed and signed; failures stop the hardware."""
from __future__ import annotations

import json
import re
import shutil
import sqlite3
import time

import pytest

from amdflash.stages.drivers.navi31 import regs as R
from amdflash.stages.sim import Board
from amdflash.stages.sim.synth import PART_KEY
from amdflash.pipeline.engine.auditdb import host_key_path
from amdflash.store.writer.process import AuditFailure, AuditWriter
from amdflash.store.writer.recorder import Recorder
from amdflash.store.schema import PHYSICAL
from tests.pipeline.engine.conftest import flash_content
from tests.pipeline.engine.trail_check import uncovered_commands


@pytest.fixture(scope="module")
def flashed_once(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One full flash on record, made once per module (a flash costs seconds of emulation):
    the directory holding its database, anchor and backups."""
    from amdflash.pipeline.cli.main import main
    from amdflash.stages.sim import create_board
    from amdflash.stages.sim.synth import synthetic_ifwi

    where = tmp_path_factory.mktemp("flashed")
    board = create_board(where / "board", seed=1, content="blank", transport="ideal")
    (where / "image.bin").write_bytes(synthetic_ifwi(1234))
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AMDFLASH_DB", str(where / "audit.sqlite"))
        env.setenv("AMDFLASH_LOCK_DIR", str(where / "locks"))
        code = main(["-q", "flash", str(where / "image.bin"), "--yes", "--expect-part", PART_KEY,
                     "--board", f"sim:{board}"])
    assert code == 0
    return where


@pytest.fixture
def flashed(flashed_once: Path, db: Path) -> Path:
    """This test's own copy of the recorded flash (tests tamper with it): the database (its
    writer closed, nothing left in the WAL), the anchor beside it and the backups."""
    for name in ("audit.sqlite", "audit.sqlite.anchor"):
        shutil.copy2(flashed_once / name, db.parent / db.name.replace("audit.sqlite", name))
    if (flashed_once / "backups").exists():
        shutil.copytree(flashed_once / "backups", db.parent / "backups")
    return db


def test_every_write_and_verify_is_recorded(cli, flashed):
    run = json.loads(cli("runs", "--format", "json").out)[-1]
    rep = json.loads(cli("report", run["run_id"], "--format", "json").out)
    con = sqlite3.connect(flashed)
    n = con.execute("SELECT count(*), min(n), max(n) FROM register_writes WHERE run_id = ?", [run["run_id"]]).fetchone()
    assert n[0] == rep["register_writes"] == n[2] and n[1] == 1
    t = con.execute("SELECT count(*), min(n), max(n) FROM spi_transactions WHERE run_id = ?", [run["run_id"]]).fetchone()
    assert t[0] == rep["spi_transactions"] == t[2] and t[1] == 1
    assert con.execute("SELECT count(*) FROM verifies WHERE run_id = ?", [run["run_id"]]).fetchone()[0] >= 512
    stages = [r[0] for r in con.execute("SELECT DISTINCT stage FROM stages WHERE run_id = ?", [run["run_id"]])]
    for s in ("open_transport", "identify", "backup", "plan", "erase", "program", "verify", "restore"):
        assert s in stages
    assert con.execute("SELECT count(*) FROM backup_units WHERE run_id = ?", [run["run_id"]]).fetchone()[0] == 512
    sha, path = con.execute("SELECT sha256, path FROM backups WHERE run_id = ?", [run["run_id"]]).fetchone()
    import hashlib
    from pathlib import Path
    assert hashlib.sha256(Path(path).read_bytes()).hexdigest() == sha and Path(path).name == f"{sha}.bin"


def test_triggers_refuse_update_and_delete_and_views_are_read_only(flashed):
    con = sqlite3.connect(flashed)
    for sql in ("UPDATE log_spi SET command = 0 WHERE seq = (SELECT min(seq) FROM log_spi)", "DELETE FROM log_units WHERE seq > 0",
                "UPDATE runs SET command = 'x'", "DELETE FROM checkpoints", "UPDATE blobs SET data = x'00'"):
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            con.execute(sql)
    with pytest.raises(sqlite3.OperationalError, match="view"):
        con.execute("UPDATE register_writes SET value = 0 WHERE seq = 10")


def _tamper(db, sql: str, *args) -> None:  # noqa: ANN001
    """Change the database the way someone with write access to the file could."""
    con = sqlite3.connect(db)
    triggers = con.execute("SELECT name, sql FROM sqlite_master WHERE type = 'trigger'").fetchall()
    for name, _ in triggers:
        con.execute(f"DROP TRIGGER {name}")
    con.execute(sql, args)
    for _, definition in triggers:      # and puts them back, so the schema looks untouched
        con.execute(definition)
    con.commit()
    con.close()


def test_audit_verify_is_clean_and_names_the_tampered_span(cli, flashed):
    r = cli("audit", "verify")
    assert r.code == 0 and "intact" in r.out and "UNSEALED" not in r.out
    con = sqlite3.connect(flashed)
    seq = con.execute("SELECT seq FROM log_spi ORDER BY seq LIMIT 1 OFFSET 1000").fetchone()[0]
    run_id = con.execute("SELECT run_id FROM runs").fetchone()[0]
    bounds = [b for (b,) in con.execute("SELECT last_seq FROM checkpoints WHERE run_id = ? ORDER BY id", [run_id])]
    con.close()
    _tamper(flashed, "UPDATE log_spi SET command = command + 256 WHERE seq = ?", seq)
    r = cli("audit", "verify")
    assert r.code == 1 and f"run {run_id}" in r.out
    lo, hi = map(int, re.search(r"rows seq (\d+)\.\.(\d+) do not match", r.out).groups())
    assert lo <= seq <= hi and hi in bounds and (lo - 1 in bounds or lo == bounds[0] or lo < bounds[0])
    assert cli("audit", "verify", "--run", run_id).code == 1


def test_the_second_verify_thread_finds_a_change_in_its_half(cli, flashed, monkeypatch):
    from amdflash.store import verify

    monkeypatch.setattr(verify, "PARALLEL_SEGMENTS", 2)     # every database is split between two threads
    assert cli("audit", "verify").code == 0
    con = sqlite3.connect(flashed)
    last = con.execute("SELECT max(seq) FROM log_spi").fetchone()[0]     # in the later half of the segments
    con.close()
    _tamper(flashed, "UPDATE log_spi SET clock = clock + 1 WHERE seq = ?", last)
    r = cli("audit", "verify")
    assert r.code == 1 and "do not match checkpoint" in r.out


def test_a_row_added_after_a_runs_final_seal_is_found(cli, make_board, flashed):
    board = make_board(content="blank", transport="ideal")
    assert cli("info", "--board", f"sim:{board}").code == 0      # a second run: the database's checks apply
    con = sqlite3.connect(flashed)
    key, last = con.execute("SELECT r.seq, c.last_seq FROM runs r JOIN checkpoints c ON c.run = r.seq "
                            "AND c.kind = 'final' ORDER BY r.seq LIMIT 1").fetchone()
    top = con.execute("SELECT seq FROM chain_head").fetchone()[0]
    con.close()
    _tamper(flashed, "INSERT INTO log_units (seq, run, address, size, state, action, detail, clock) "
                     "VALUES (?, ?, 0, 4096, 'verified', 'skip', 'added', 0)", top + 1, key)
    r = cli("audit", "verify")
    assert r.code == 1 and "1 row(s) after its final checkpoint" in r.out and last < top
    con = sqlite3.connect(flashed)
    run_id = con.execute("SELECT run_id FROM runs WHERE seq = ?", [key]).fetchone()[0]
    con.close()
    r = cli("audit", "verify", "--run", run_id)        # the run's own check finds it too
    assert r.code == 1 and "1 row(s) after its final checkpoint" in r.out


def test_a_removed_row_is_found(cli, flashed):
    con = sqlite3.connect(flashed)
    seq = con.execute("SELECT seq FROM log_verifies ORDER BY seq LIMIT 1 OFFSET 3").fetchone()[0]
    con.close()
    _tamper(flashed, "DELETE FROM log_verifies WHERE seq = ?", seq)
    r = cli("audit", "verify")
    assert r.code == 1 and "do not match checkpoint" in r.out and "rows found" in r.out


def test_truncating_the_tail_is_found_in_the_database_and_by_the_anchor(cli, flashed, tmp_path):
    con = sqlite3.connect(flashed)
    last = con.execute("SELECT max(id) FROM checkpoints").fetchone()[0]
    con.close()
    # Remove the last checkpoint and everything it sealed, and fix up chain_head: the database
    # alone still shows it (the head names a checkpoint that is gone) ...
    _tamper(flashed, "DELETE FROM checkpoints WHERE id = ?", last)
    r = cli("audit", "verify")
    assert r.code == 1 and "chain head" in r.out
    # ... and when the head is made to agree too, the anchor file beside the database does.
    _tamper(flashed, "UPDATE chain_head SET checkpoint = ?, hash = (SELECT hash FROM checkpoints WHERE id = ?)",
            last - 1, last - 1)
    r = cli("audit", "verify")
    assert r.code == 1
    assert ("a row of run" in r.out or "after its last checkpoint" in r.out or f"checkpoint #{last}" in r.out
            or "is in rows no checkpoint seals" in r.out)


def test_a_database_replaced_whole_by_an_older_copy_is_found_by_the_anchor(cli, make_board, image, db, tmp_path):
    import shutil

    board = make_board(content="blank", transport="ideal")
    assert cli("info", "--board", f"sim:{board}").code == 0
    older = tmp_path / "older.sqlite"
    con = sqlite3.connect(db)
    con.execute(f"VACUUM INTO '{older}'")
    con.close()
    assert cli("flash", image, "--yes", "--force", "--sector-count", "4", "--board", f"sim:{board}").code == 0
    assert cli("audit", "verify").code == 0
    for suffix in ("-wal", "-shm"):
        (db.parent / (db.name + suffix)).unlink(missing_ok=True)
    shutil.copy(older, db)
    r = cli("audit", "verify")
    assert r.code == 1 and "anchor" in r.out and "does not have" in r.out
    assert cli("audit", "verify", "--anchor", tmp_path / "nothing").code == 2


def _pages_up_to(db, seq: int, work) -> int:  # noqa: ANN001
    """The pages a database holding only the rows of `db` up to `seq` (and the blobs they
    use) takes: where a database that may grow to that size fills up."""
    cut = work / "cut.sqlite"
    con = sqlite3.connect(db)
    con.execute(f"VACUUM INTO '{cut}'")
    con.close()
    con = sqlite3.connect(cut)
    for (trigger,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        con.execute(f"DROP TRIGGER {trigger}")
    for table in PHYSICAL:
        con.execute(f"DELETE FROM {table} WHERE seq > ?", [seq])
    used = " UNION ".join(f"SELECT {c} FROM {t}" for t, columns in PHYSICAL.items() for c, k in columns if k == "ref")
    con.execute(f"DELETE FROM blobs WHERE id NOT IN ({used})")
    con.commit()
    con.execute("VACUUM")
    pages = con.execute("PRAGMA page_count").fetchone()[0]
    con.close()
    return pages


@pytest.mark.slow
def test_audit_failure_mid_job_stops_hardware_writes_and_restores_registers(cli, make_board, image, db,
                                                                            monkeypatch, tmp_path):
    """The database fills up mid-job (SQLite max_page_count): the job fails, nothing more is
    written to the board but the register restore, and everything destructive the board
    received is on record."""
    import amdflash.pipeline.commands.board as commands

    # Where the database must fill up to stop the job halfway through programming: from a
    # twin run, as big as its trail up to then.
    twin = make_board(content="blank", transport="ideal")
    reference = tmp_path / "reference.sqlite"
    assert cli("--db", reference, "flash", image, "--yes", "--expect-part", PART_KEY, "--board", f"sim:{twin}").code == 0
    con = sqlite3.connect(reference)
    (start,), (end,) = con.execute("SELECT seq FROM stages WHERE stage = 'program' AND event IN ('start', 'end') "
                                   "ORDER BY seq").fetchall()
    con.close()
    limit = _pages_up_to(reference, (start + end) // 2, tmp_path)

    board = make_board(content="blank", transport="ideal")
    with Board(board) as b:
        before = {r: b.get32(r) for r in (R.GPIOPAD_MASK, R.PAGE_MIRROR_CNTL, R.ROM_CNTL)}
    writers = []

    def small_writer(args):  # noqa: ANN001
        w = AuditWriter(str(db), key_path=host_key_path(), max_pages=limit).open()   # full mid-flash
        writers.append(w)
        return w

    real_write = Board.reg_write
    writes_after: list[int] = []

    def counting(self, offset, data):  # noqa: ANN001
        if writers and writers[0].failed:
            writes_after.append(offset)
        return real_write(self, offset, data)

    monkeypatch.setattr(commands.auditdb, "open_writer", small_writer)
    monkeypatch.setattr(Board, "reg_write", counting)
    r = cli("flash", image, "--yes", "--expect-part", PART_KEY, "--board", f"sim:{board}")
    assert r.code == 1
    assert "audit" in r.err and "full" in r.err
    assert flash_content(board) not in (image.read_bytes(), b"\xff" * 0x200000)   # stopped mid-flash
    assert uncovered_commands(db, board) == []
    with Board(board) as b:
        assert {r: b.get32(r) for r in before} == before
    # Once the failure was known only the restore reached the board: at most the closing
    # write-disable transaction and the register restores.
    restores = {R.ROM_SW_STATUS, R.ROM_SW_COMMAND, R.ROM_SW_CNTL, R.ROM_CNTL, R.PAGE_MIRROR_CNTL,
                R.GPIOPAD_A, R.GPIOPAD_EN, R.GPIOPAD_MASK}
    assert len(writes_after) <= 14 and set(writes_after) <= restores


@pytest.mark.slow
def test_multi_board_one_failure_does_not_stop_the_others(cli, make_board, image):
    img = image.read_bytes()
    bad_address = next(a for a in range(0x2000, 0x200000) if img[a] == 0x00)
    boards = [make_board(content="blank", transport="ideal"),
              make_board(content="blank", transport="ideal", faults=[f"stuck-bit={bad_address:#x}:7"]),
              make_board(content="blank", transport="ideal")]
    args = [a for b in boards for a in ("--board", f"sim:{b}")]
    r = cli("flash", image, "--yes", "--expect-part", PART_KEY, *args)
    assert r.code == 1
    assert flash_content(boards[0]) == img and flash_content(boards[2]) == img
    assert flash_content(boards[1]) != img
    table = r.out[r.out.index("\nboard "):].strip().splitlines()[1:]
    assert sorted(line.split()[1] for line in table) == ["failed", "succeeded", "succeeded"]
    runs = json.loads(cli("runs", "--format", "json").out)
    assert sorted(x["status"] for x in runs[-3:]) == ["failed", "succeeded", "succeeded"]


@pytest.mark.wall_clock   # a wall-time ratio: CI runs it on its own (pytest -m wall_clock -n 0)
def test_boards_in_real_time_run_concurrently(cli_process, make_board, tmp_path):
    """Four boards take about as long in wall time as one (real-time emulation, scale 1)."""
    import os

    image = tmp_path / "dense.bin"
    image.write_bytes(b"\xaa\x55\xaa\x55" + os.urandom(0x200000 - 4))

    def wall(n: int) -> float:
        boards = [make_board(content="blank", transport="asm24", realtime_scale=1.0) for _ in range(n)]
        args = [a for b in boards for a in ("--board", f"sim:{b}")]
        start = time.perf_counter()
        r = cli_process("-q", "flash", image, "--yes", "--start-sector", "0", "--sector-count", "16", "--force", *args)
        assert r.code == 0, r.err
        return time.perf_counter() - start
    one, four = wall(1), wall(4)
    print(f"real-time wall: one board {one:.2f} s, four boards {four:.2f} s")
    assert four < 2.0 * one, (one, four)      # one after another would take about 4 ×


def test_recording_never_raises_once_the_trail_is_down_but_the_barrier_does(tmp_path):
    w = AuditWriter(str(tmp_path / "a.sqlite")).open()
    try:
        rec = Recorder(w, "run", batch_rows=1)
        w._fail("disk full")
        rec.add("stages", stage="restore", event="start", detail=None, at=None)   # must not raise
        rec.register_write(0x5A380, 1, None, 0.0)
        with pytest.raises(AuditFailure):
            rec.durable()
    finally:
        w.close()


def test_a_writer_that_dies_is_noticed(tmp_path):
    import os as _os
    import signal as _signal

    w = AuditWriter(str(tmp_path / "a.sqlite")).open()
    _os.kill(w._process.pid, _signal.SIGKILL)
    deadline = time.monotonic() + 5
    while not w.failed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert w.failed and "exited" in w.failed
    with pytest.raises(AuditFailure):
        w.barrier(timeout=5)
    w.close()


def test_a_host_leaving_without_closing_its_writer_still_exits(tmp_path):
    """The writer ignores SIGINT and SIGTERM (it must outlive the host's Ctrl-C); a host that
    leaves with it open (a Ctrl-C between its start and the caller's cleanup) must not wait
    for it forever at exit, and what it was handed is written."""
    import subprocess
    import sys
    import textwrap

    db = tmp_path / "audit.sqlite"
    code = textwrap.dedent(f"""
        from amdflash.store.writer.process import AuditWriter
        writer = AuditWriter({str(db)!r}).open()
        raise KeyboardInterrupt
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == -2 and "KeyboardInterrupt" in p.stderr     # -SIGINT: Python re-raises it
    assert db.exists()


def _vm_steps(db, run_id: str) -> dict[str, int]:  # noqa: ANN001
    """Thousands of SQLite virtual-machine steps each per-run read takes (report, its HTML
    page, verify --run): the work they do, whatever the machine's load."""
    from amdflash.store.html import render
    from amdflash.store.queries import open_readonly, report
    from amdflash.store.verify import verify_run

    reader = open_readonly(str(db))
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    reader.conn.set_progress_handler(count, 1000)
    out = {}
    try:
        for name, read in (("report", lambda: report(reader, run_id)),
                           ("html", lambda: render(reader, report(reader, run_id))),
                           ("verify --run", lambda: verify_run(reader.conn, run_id))):
            steps = 0
            read()
            out[name] = steps
    finally:
        reader.conn.close()
    return out


def test_reading_one_run_costs_that_run_whatever_was_recorded_after_it(cli, make_board, image, db):
    """report, its HTML page and verify --run read only the run's own rows and bytes: their
    work does not grow as later runs, many times its size, are recorded after it."""
    def flash(sectors: int) -> None:
        board = make_board(content=bytes(range(256)) * (0x200000 // 256), transport="ideal")
        assert cli("flash", image, "--yes", "--expect-part", PART_KEY, "--sector-count", sectors,
                   "--board", f"sim:{board}").code == 0

    flash(8)
    run_id = json.loads(cli("runs", "--format", "json").out)[0]["run_id"]
    before = _vm_steps(db, run_id)
    for _ in range(2):
        flash(64)
    after = _vm_steps(db, run_id)
    for name, steps in before.items():
        assert after[name] <= steps * 1.05 + 5, (name, before, after)


# -- rows and definitions no checkpoint vouches for --------------------------------------------

def _run_id(db) -> str:  # noqa: ANN001
    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT run_id FROM runs ORDER BY seq DESC LIMIT 1").fetchone()[0]
    finally:
        con.close()


def test_an_end_added_to_a_sealed_run_is_found_even_in_a_one_run_database(cli, flashed):
    """A plain INSERT (the triggers refuse only UPDATE and DELETE) of a later status row for a
    run sealed as ended: the database's check and the run's check say so, and its report
    shows the run marked: the added row as unverified, never as its status (issue 44)."""
    run_id = _run_id(flashed)
    con = sqlite3.connect(flashed)
    top = con.execute("SELECT seq FROM chain_head").fetchone()[0]
    con.execute("INSERT INTO run_status (seq, run_id, status, detail, at) VALUES (?, ?, 'failed', 'x', 'now')",
                [top + 1, run_id])
    con.commit()
    con.close()
    for argv in (("audit", "verify"), ("audit", "verify", "--run", run_id)):
        r = cli(*argv)
        assert r.code == 1 and "1 row(s) after its final checkpoint" in r.out, (argv, r.out)
    r = cli("report", run_id)
    assert r.code == 1 and "1 row(s) after its final checkpoint" in r.err
    assert "(flash, failed (not verified)" in r.out and "failing    seq " in r.out and "run_status 1" in r.out, r.out


def test_a_bulk_row_added_after_the_only_runs_seal_is_found(cli, flashed):
    """The whole database's count of rows against sealed spans applies with one run too."""
    con = sqlite3.connect(flashed)
    top, key = con.execute("SELECT h.seq, r.seq FROM chain_head h, runs r").fetchone()
    con.execute("INSERT INTO log_writes (seq, run, offset, value, data, clock) VALUES (?, ?, 0, 0, NULL, 0)",
                [top + 1, key])
    con.commit()
    con.close()
    r = cli("audit", "verify")
    assert r.code == 1 and "outside what their runs sealed" in r.out


def test_a_run_made_up_with_an_end_no_checkpoint_seals_is_found(cli, flashed):
    con = sqlite3.connect(flashed)
    top = con.execute("SELECT seq FROM chain_head").fetchone()[0]
    con.execute("INSERT INTO runs (seq, run_id, command, at) VALUES (?, 'made-up', 'flash', 'now')", [top + 1])
    con.execute("INSERT INTO run_status (seq, run_id, status, at) VALUES (?, 'made-up', 'succeeded', 'now')",
                [top + 2])
    con.commit()
    con.close()
    for argv in (("audit", "verify"), ("audit", "verify", "--run", "made-up")):
        r = cli(*argv)
        assert r.code == 1 and "its end ('succeeded') is in rows no checkpoint seals" in r.out, (argv, r.out)


def test_the_views_triggers_and_constant_tables_are_amdflashs_own(cli, flashed):
    """What a reviewer reads through is checked too: a redefined view, a dropped or added
    trigger and a changed constant table are each named."""
    import shutil

    pristine = flashed.with_name("pristine.sqlite")
    shutil.copy(flashed, pristine)

    def changed(*statements: str) -> str:
        shutil.copy(pristine, flashed)
        con = sqlite3.connect(flashed)
        for sql in statements:
            con.execute(sql)
        con.commit()
        con.close()
        r = cli("audit", "verify")
        assert r.code == 1, r.out
        return r.out

    assert cli("audit", "verify").code == 0
    assert "view units is not amdflash's definition" in changed(
        "DROP VIEW units", "CREATE VIEW units AS SELECT seq, 'x' AS run_id, 0 AS address, 0 AS size, "
        "'verified' AS state, 'skip' AS action, NULL AS wanted_sha256, NULL AS detail, 0 AS clock FROM log_units")
    assert "trigger log_units_no_delete is missing" in changed("DROP TRIGGER log_units_no_delete")
    assert "trigger sneaky is not part of amdflash's schema" in changed(
        "CREATE TRIGGER sneaky AFTER INSERT ON log_units BEGIN SELECT 1; END")
    trigger = "CREATE TRIGGER _byte_no_update BEFORE UPDATE ON _byte BEGIN SELECT RAISE(ABORT, " \
              "'audit rows are append-only (_byte)'); END"
    assert "table _byte, which the views decode with" in changed(
        "DROP TRIGGER _byte_no_update", "UPDATE _byte SET b = x'00' WHERE i = 7", trigger)


@pytest.mark.slow
def test_a_killed_hosts_writer_seals_every_row_it_committed(tmp_path):
    """The host dies mid-flash (the board's kill-after-writes fault); its writer outlives it and
    seals what it committed: no row is left unsealed, the chain is intact."""
    from tests.pipeline.engine.test_faults_kills import Case

    case = Case(tmp_path)
    case.kill_after(51000)                      # mid-programming
    assert case.flash().returncode != 0
    deadline = time.monotonic() + 30            # the writer finishes on its own after the host
    while True:
        r = case.cli("audit", "verify")
        if "unsealed" not in r.stdout or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert r.returncode == 0 and "intact" in r.stdout and "unsealed" not in r.stdout, r.stdout


def test_several_runs_still_being_written_are_shown_unsealed_not_broken(cli, flashed):
    """Two runs whose writers have not sealed their rows yet (no end among them): intact, and
    each is listed as unsealed."""
    con = sqlite3.connect(flashed)
    top = con.execute("SELECT seq FROM chain_head").fetchone()[0]
    for i, run_id in enumerate(("live-1", "live-2")):
        con.execute("INSERT INTO runs (seq, run_id, command, at) VALUES (?, ?, 'dump', 'now')", [top + 1 + 2 * i, run_id])
        con.execute("INSERT INTO stages (seq, run_id, stage, event, at) VALUES (?, ?, 'open_transport', 'start', 'now')",
                    [top + 2 + 2 * i, run_id])
    con.commit()
    con.close()
    r = cli("audit", "verify")
    assert r.code == 0 and "intact" in r.out, r.out
    assert "run live-1: its last 2 row(s)" in r.out and "run live-2: its last 2 row(s)" in r.out, r.out
