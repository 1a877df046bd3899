"""`audit archive`: old runs move to a signed file that verifies on its own; the database
keeps a seal, so its chain verifies across the gap, and shrinks."""
from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

from amdflash.store import keys
from amdflash.store.schema import PHYSICAL, PLAIN


def _public_key(tmp_path: Path, host_key: Path) -> Path:
    pub = tmp_path / "host.pub"
    pub.write_text(keys.public_line(keys.public_bytes(keys.load_private(host_key))))
    return pub


def _started(db: Path, run_id: str) -> str:
    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT at FROM runs WHERE run_id = ?", [run_id]).fetchone()[0]
    finally:
        con.close()


def _rows_of(db: Path, run_ids: list[str]) -> int:
    con = sqlite3.connect(db)
    try:
        keys_ = [k for (k,) in con.execute(f"SELECT seq FROM runs WHERE run_id IN ({','.join('?' * len(run_ids))})",
                                           run_ids)]
        total = 0
        for table in PHYSICAL:
            if table in PLAIN:
                total += con.execute(f"SELECT count(*) FROM {table} WHERE run_id IN ({','.join('?' * len(run_ids))})",
                                     run_ids).fetchone()[0]
            elif keys_:
                total += con.execute(f"SELECT count(*) FROM {table} WHERE run IN ({','.join('?' * len(keys_))})",
                                     keys_).fetchone()[0]
        return total
    finally:
        con.close()


def test_archive_moves_old_runs_out_and_both_sides_verify(cli, make_board, image, db, tmp_path, host_key):
    a, b = make_board(content="blank", transport="ideal"), make_board(transport="ideal")
    assert cli("info", "--board", f"sim:{a}").code == 0
    assert cli("flash", image, "--yes", "--force", "--sector-count", "6", "--board", f"sim:{a}").code == 0
    old = [r["run_id"] for r in json.loads(cli("runs", "--format", "json").out)]
    time.sleep(0.01)
    assert cli("info", "--board", f"sim:{b}").code == 0
    newer = json.loads(cli("runs", "--format", "json").out)[-1]["run_id"]
    old_rows = _rows_of(db, old)
    backup = Path(sqlite3.connect(db).execute("SELECT path FROM backups").fetchone()[0])
    assert backup.is_file() and old_rows > 100

    out = tmp_path / "2026-archive.jsonl"
    r = cli("audit", "archive", "--before", _started(db, newer), "-o", out, "--backups", "move")
    assert r.code == 0, r.err
    assert f"archived 2 run(s), {old_rows} rows" in r.out
    # The database: only the newer run, its chain intact across the gap, the anchor accounted for.
    assert [x["run_id"] for x in json.loads(cli("runs", "--format", "json").out)] == [newer]
    assert _rows_of(db, old) == 0
    pub = _public_key(tmp_path, host_key)
    r = cli("audit", "verify", "--key", pub)
    assert r.code == 0 and "intact" in r.out and "2 run(s) were archived" in r.out and "anchor" in r.out, r.out
    assert cli("report", newer).code == 0 and cli("audit", "verify", "--run", newer, "--key", pub).code == 0
    # The archive: verifies on its own, against the host key, and holds every row that left.
    r = cli("audit", "verify", "--export", out, "--key", pub)
    assert r.code == 0 and f"archive export of {old[0]}, {old[1]}: {old_rows} rows" in r.out, r.out
    # The backup image moved beside the archive.
    assert not backup.exists() and (tmp_path / "2026-archive.jsonl.backups" / backup.name).is_file()
    # Tampering with the archive is found.
    text = out.read_text()
    out.write_text(text.replace('"state":"verified"', '"state":"failed"', 1))
    assert cli("audit", "verify", "--export", out).code == 1


def test_a_second_archive_continues_the_chain_and_nothing_to_archive_is_refused(cli, make_board, image, db,
                                                                                tmp_path):
    a = make_board(content="blank", transport="ideal")
    for _ in range(3):
        assert cli("flash", image, "--yes", "--force", "--sector-count", "2", "--board", f"sim:{a}").code == 0
        time.sleep(0.01)
    runs = [x["run_id"] for x in json.loads(cli("runs", "--format", "json").out)]
    assert cli("audit", "archive", "--before", _started(db, runs[1]), "-o", tmp_path / "one.jsonl").code == 0
    assert cli("audit", "archive", "--before", _started(db, runs[2]), "-o", tmp_path / "two.jsonl").code == 0
    assert [x["run_id"] for x in json.loads(cli("runs", "--format", "json").out)] == runs[2:]
    r = cli("audit", "verify")
    assert r.code == 0 and "archived" in r.out
    for name in ("one.jsonl", "two.jsonl"):
        assert cli("audit", "verify", "--export", tmp_path / name).code == 0
    r = cli("audit", "archive", "--before", "2000-01-01", "-o", tmp_path / "three.jsonl")
    assert r.code == 2 and "no run can be archived" in r.err and not (tmp_path / "three.jsonl").exists()


def test_a_run_whose_resume_is_newer_stays_with_it(cli, make_board, image, db, tmp_path):
    """An interrupted flash goes to an archive only together with the resume that finished it."""
    import subprocess
    import sys

    from tests.pipeline.engine.conftest import ROOT

    board = make_board(content="blank", transport="ideal", faults=["kill-after-writes=400"])
    subprocess.run([sys.executable, "-m", "amdflash.pipeline.cli", "-q", "flash", str(image), "--yes", "--force",
                    "--sector-count", "4", "--board", f"sim:{board}"], env={**__import__("os").environ,
                                                                           "PYTHONPATH": str(ROOT)})
    killed = json.loads(cli("runs", "--format", "json").out)[-1]
    assert killed["status"] == "interrupted"      # no end on record, and its process is gone
    time.sleep(0.01)
    assert cli("resume", "--yes", "--board", f"sim:{board}").code == 0
    resume = json.loads(cli("runs", "--format", "json").out)[-1]["run_id"]
    # Resumed, the killed run is over though its end was never recorded: not "running" for ever.
    shown = {r["run_id"]: r["status"] for r in json.loads(cli("runs", "--format", "json").out)}
    assert shown[killed["run_id"]] == "interrupted"
    rep = json.loads(cli("report", killed["run_id"], "--format", "json").out)
    assert rep["status"] == "interrupted" and rep["ended"] is None
    assert cli("report", killed["run_id"], "--format", "html", "-o", tmp_path / "killed.html").code == 0
    page = (tmp_path / "killed.html").read_text()
    assert "its process died mid-run" in page and "fixed by" in page and resume in page
    r = cli("audit", "archive", "--before", _started(db, resume), "-o", tmp_path / "a.jsonl")
    assert r.code == 2          # the killed run's lineage ended only with the resume, after the date
    r = cli("audit", "archive", "--before", "2999-01-01", "-o", tmp_path / "b.jsonl")
    assert r.code == 0 and "archived 2 run(s)" in r.out
