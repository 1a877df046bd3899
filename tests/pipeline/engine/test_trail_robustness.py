"""The trail under stress: a host that dies in the middle of handing over a row, readers that
run while a writer appends, and the facts a run records about itself."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from amdflash.store.writer.frames import FrameReader, frame
from tests.pipeline.engine.conftest import ROOT

HOST = """
import os, sys, time
from amdflash.store.writer.process import AuditWriter
from amdflash.store.writer.recorder import Recorder
w = AuditWriter(sys.argv[1], key_path=sys.argv[2]).open()
print(w._process.pid, flush=True)
rec = Recorder(w, "run-1", batch_rows=64)
rec.add("runs", command="flash", at="now")
rec.durable()
print("durable", flush=True)
n = 0
while True:      # hand over rows until killed; big ones, so that the pipe fills mid-row
    n += 1
    rec.add("backup_units", address=n * 4096 % 0x200000, size=4096, data=os.urandom(4096))
    if n == 200:
        print("going", flush=True)
"""


def test_frames_split_anywhere_come_out_whole_and_a_torn_one_never():
    rows = [("stages", "r", "s", "start", None, None), ("write", "r", 0x5A3A4, 0, None, 12), ("x", b"\0" * 5000)]
    data = b"".join(map(frame, rows))
    for cut in (1, 3, 4, 5, 17, len(data) - 1):
        reader = FrameReader()
        assert reader.feed(data[:cut]) + reader.feed(data[cut:]) == rows
    reader = FrameReader()
    assert reader.feed(data[:-1]) == rows[:2] and reader.buffer   # the torn last row waits, never comes out


def test_a_host_killed_mid_row_never_crashes_the_writer(tmp_path: Path, host_key: Path):
    """The writer is paused, the host fills the pipe and is killed in the middle of a row; the
    writer then commits and seals every complete row it received, drops the torn one and
    exits cleanly."""
    db = tmp_path / "audit.sqlite"
    host = subprocess.Popen([sys.executable, "-c", HOST, str(db), str(host_key)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    writer = int(host.stdout.readline())
    assert host.stdout.readline().strip() == "durable"
    assert host.stdout.readline().strip() == "going"
    os.kill(writer, signal.SIGSTOP)
    time.sleep(1.0)                  # the pipe fills; the host blocks in the middle of a row
    host.kill()
    host.wait()
    os.kill(writer, signal.SIGCONT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(writer, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the writer did not exit after its host died")
    stderr = host.stderr.read()
    assert "Traceback" not in stderr and "Error" not in stderr, stderr
    con = sqlite3.connect(db)
    rows = con.execute("SELECT count(*) FROM log_backup_units").fetchone()[0]
    sealed = con.execute("SELECT rows, kind FROM checkpoints WHERE run_id = 'run-1' ORDER BY id DESC LIMIT 1").fetchone()
    con.close()
    assert rows > 0 and sealed == (rows + 1, "commit"), (rows, sealed)   # every row received, and the runs row
    from amdflash.store.schema import connect
    from amdflash.store.verify import verify_database

    report = verify_database(connect(str(db), readonly=True))
    assert report.ok and not report.unsealed, report.describe()


@pytest.mark.slow   # a long scenario: CI runs it (pytest -m slow)
def test_a_ctrl_c_inside_the_status_readers_start_leaves_a_writer_the_exit_handler_closes(tmp_path: Path,
                                                                                          host_key: Path,
                                                                                          monkeypatch):
    """A Ctrl-C that landed inside the status reader's Thread.start() (which waits for the
    thread to run) left a reader that close() joined: 'cannot join thread before it is
    started', a traceback from the exit handler (a slow run under load,
    test_ctrl_c_at_many_moments[0.5]). The exit handler closes the writer without it."""
    import threading

    from amdflash.store.writer import process

    real = threading.Thread.start

    def start(self: threading.Thread) -> None:
        if self.name == "audit-status":
            raise KeyboardInterrupt          # as it lands before the thread has run
        real(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    writer = process.AuditWriter(str(tmp_path / "audit.sqlite"), key_path=host_key)
    with pytest.raises(KeyboardInterrupt):
        writer.open()
    monkeypatch.undo()
    started = writer._process
    assert started is not None and writer in process._STARTED
    process._close_started()                 # what the exit handler runs
    assert writer._process is None and started.exitcode == 0 and writer not in process._STARTED


@pytest.mark.slow
def test_readers_never_see_a_torn_chain_while_a_writer_appends(cli_process, cli, make_board, db, tmp_path):
    """audit verify, runs, report and export run again and again beside a flash that is writing
    the same database: every answer is intact."""
    image = tmp_path / "dense.bin"
    image.write_bytes(b"\xaa\x55\xaa\x55" + os.urandom(0x200000 - 4))
    first = make_board(content="blank", transport="ideal")
    assert cli("info", "--board", f"sim:{first}").code == 0
    board = make_board(content="blank", transport="ideal")
    flash = subprocess.Popen([sys.executable, "-m", "amdflash.pipeline.cli", "-q", "flash", str(image), "--yes", "--force",
                              "--sector-count", "160", "--board", f"sim:{board}"],
                             env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    checks = 0
    try:
        while flash.poll() is None or checks < 4:
            r = cli("audit", "verify")
            assert r.code == 0 and "intact" in r.out, r.out
            runs = json.loads(cli("runs", "--format", "json").out)
            for run in runs:
                r = cli("report", run["run_id"], "--format", "json")
                assert r.code == 0 and json.loads(r.out)["chain"]["ok"], r.out
            out = tmp_path / f"export-{checks}.jsonl"
            assert cli("audit", "export", "-o", out).code == 0
            r = cli("audit", "verify", "--export", out)
            assert r.code == 0, r.out
            checks += 1
    finally:
        flash.wait(timeout=300)
    assert flash.returncode == 0, flash.stderr.read()
    assert checks >= 4
    r = cli("audit", "verify")
    assert r.code == 0 and "unsealed" not in r.out


def test_a_run_records_facts_not_claims(cli, make_board, db, monkeypatch):
    import pwd
    from importlib import metadata

    monkeypatch.setenv("LOGNAME", "Jane Auditor")
    monkeypatch.setenv("USER", "Jane Auditor")
    board = make_board(content="blank", transport="ideal")
    assert cli("--operator", "J. Auditor (QA)", "info", "--board", f"sim:{board}").code == 0
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    run = dict(con.execute("SELECT * FROM runs").fetchone())
    board_row = dict(con.execute("SELECT * FROM boards").fetchone())
    con.close()
    assert run["operator"] == pwd.getpwuid(os.getuid()).pw_name != "Jane Auditor"
    assert run["operator_claimed"] == "J. Auditor (QA)"
    assert run["tool_version"] == metadata.version("amdflash")
    from amdflash.pipeline.engine import run_facts

    if (Path(run_facts.__file__).resolve().parents[2] / ".git").exists():    # run from a checkout
        assert run["tool_revision"].startswith("git ") and len(run["tool_revision"].split()[1].split("-")[0]) == 40
    else:                                                                    # an installed copy
        assert run["tool_revision"] is None
    machine_id = Path("/etc/machine-id")
    if machine_id.exists() and machine_id.read_text().strip():
        assert run["machine_id"] == machine_id.read_text().strip()
    # Linux always answers adjtimex: what the kernel says is recorded, never "unknown".
    assert run["clock_sync"] in ("synchronised (kernel adjtimex)", "unsynchronised (kernel adjtimex)")
    assert run["at"].endswith("+00:00")
    assert json.loads(board_row["detail"]) == {"emulated": True, "profile": "ideal"} and board_row["emulated"] == 1
    rep = json.loads(cli("report", run["run_id"], "--format", "json").out)
    assert rep["emulated"] is True and rep["operator_claimed"] == "J. Auditor (QA)"
    text = cli("report", run["run_id"]).out
    assert "[EMULATED BOARD]" in text and "claims to be J. Auditor (QA)" in text
    assert json.loads(cli("runs", "--format", "json").out)[0]["emulated"] == 1


def test_audit_key_is_made_once_private_and_printed_public(cli, tmp_path, monkeypatch):
    from amdflash.store import keys

    path = tmp_path / "data" / "host_key.pem"
    monkeypatch.setenv("AMDFLASH_HOST_KEY", str(path))
    r = cli("audit", "key", "-o", tmp_path / "host.pub")
    assert r.code == 0 and r.out.startswith("amdflash-ed25519 ") and len(r.out.split()[1]) == 64
    assert path.stat().st_mode & 0o777 == 0o600
    assert keys.read_public(tmp_path / "host.pub") == bytes.fromhex(r.out.split()[1])
    assert cli("audit", "key").out == r.out                       # the same key the second time
    path.chmod(0o644)
    r = cli("audit", "key")
    assert r.code == 2 and "readable by others" in r.err


def test_the_key_is_the_account_s_own_in_its_data_directory(monkeypatch, tmp_path):
    """One key per account (issue 40): a database named by $AMDFLASH_DB is signed by the data
    directory's key, as one named by --db is; only a key this account made beside a database
    (an older amdflash did, under $AMDFLASH_DB) goes on signing that database."""
    from amdflash.pipeline.engine.auditdb import host_key_path

    monkeypatch.delenv("AMDFLASH_HOST_KEY", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("AMDFLASH_DB", str(tmp_path / "somewhere" / "audit.sqlite"))
    assert host_key_path() == tmp_path / "data" / "amdflash" / "host_key.pem"
    (tmp_path / "somewhere").mkdir()
    beside = tmp_path / "somewhere" / "host_key.pem"
    beside.touch(mode=0o600)
    assert host_key_path() == beside
    beside.chmod(0o640)              # one others may read was not made by amdflash: not taken
    assert host_key_path() == tmp_path / "data" / "amdflash" / "host_key.pem"


def test_runs_that_never_identify_the_flash_still_say_the_board_is_emulated(cli, make_board, db):
    board = make_board(transport="ideal", seed=77)
    assert cli("probe", "--board", f"sim:{board}").code == 0
    run = json.loads(cli("runs", "--format", "json").out)[-1]
    assert run["command"] == "probe" and run["emulated"] == 1
    assert json.loads(cli("report", run["run_id"], "--format", "json").out)["emulated"] is True
