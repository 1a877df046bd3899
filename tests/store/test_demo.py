"""amdflash demo: a whole recovery on an emulated board, end to end, in-process."""
from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from amdflash.pipeline.cli.main import main
from amdflash.pipeline.commands.demo import DEFAULT_SEED, MARKER, prepare_dir
from amdflash.pipeline.errors import Refusal
from amdflash.stages.sim.synth import damage, synthetic_ifwi
from amdflash.store.verify import verify_database


@pytest.fixture
def env(tmp_path: Path, monkeypatch) -> Path:
    """A user whose own audit database must stay untouched by the demo."""
    user_db = tmp_path / "user" / "audit.sqlite"
    monkeypatch.setenv("AMDFLASH_DB", str(user_db))
    monkeypatch.setenv("AMDFLASH_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.chdir(tmp_path)
    return user_db


def test_demo_recovers_the_board_into_its_own_directory(env, tmp_path, capsys):
    demo = tmp_path / "amdflash-demo"
    # An earlier demo: --fresh must remove it, and say what it removed.
    demo.mkdir()
    (demo / MARKER).write_text("earlier demo")
    (demo / "old-run").mkdir()
    (demo / "stale.bin").write_bytes(b"x")

    started = time.monotonic()
    code = main(["demo", "--fresh"])          # the default directory, ./amdflash-demo
    elapsed = time.monotonic() - started
    out = capsys.readouterr().out
    assert code == 0, out

    clean = synthetic_ifwi(DEFAULT_SEED)
    assert (demo / "board" / "flash.bin").read_bytes() == clean
    assert (demo / "known-good.bin").read_bytes() == clean
    assert (demo / "backup.bin").read_bytes() == damage(clean, DEFAULT_SEED)   # the damaged flash, as found
    assert not (demo / "old-run").exists() and not (demo / "stale.bin").exists()
    assert "removed the earlier demo" in out and "old-run/" in out and "stale.bin" in out

    assert not env.exists(), "the demo wrote to the user's audit database"
    conn = sqlite3.connect(demo / "audit.sqlite")
    runs = conn.execute("""SELECT r.command, r.run_id, (SELECT status FROM run_status s WHERE s.run_id = r.run_id
                           ORDER BY seq DESC LIMIT 1) FROM runs r ORDER BY r.seq""").fetchall()
    flash = conn.execute("SELECT arguments FROM runs WHERE command = 'flash'").fetchone()[0]
    assert verify_database(conn).ok
    conn.close()
    assert [(c, s) for c, _, s in runs] == [("info", "succeeded"), ("dump", "succeeded"),
                                            ("flash", "succeeded"), ("verify", "succeeded")]
    assert '"clear_cmp": true' in flash

    flash_run = runs[2][1]
    assert "SYNTHETIC" in out and "CMP=set" in out
    assert f"run        {flash_run}  (flash, succeeded; --clear-cmp overrode the protection)" in out   # its report, as text
    for command in ("runs", f"report {flash_run} --format html", f"replay {flash_run}", "audit verify"):
        assert f"--db {demo / 'audit.sqlite'} {command}" in out
    assert elapsed < 60


def test_demo_refuses_a_non_empty_directory(env, tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    for fresh in ([], ["--fresh"]):      # --fresh only removes what an earlier demo made
        assert main(["demo", "--dir", str(mine), *fresh]) == 2
        assert "not made by 'amdflash demo'" in capsys.readouterr().err
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    (mine / MARKER).write_text("")
    assert main(["demo", "--dir", str(mine)]) == 2
    assert "add --fresh to remove everything in it (2 entries: .amdflash-demo, notes.txt)" in capsys.readouterr().err
    assert (mine / "notes.txt").read_text() == "keep me"


def test_prepare_dir_keeps_the_marker_and_lists_what_it_removed(tmp_path):
    demo = tmp_path / "d"
    assert prepare_dir(demo, fresh=False) == []
    (demo / "board").mkdir()
    (demo / "audit.sqlite").write_text("")
    with pytest.raises(Refusal):
        prepare_dir(demo, fresh=False)
    assert prepare_dir(demo, fresh=True) == [MARKER, "audit.sqlite", "board/"]
    assert [p.name for p in demo.iterdir()] == [MARKER]


def test_demo_stops_with_the_failing_steps_exit_code(env, tmp_path, capsys, monkeypatch):
    import amdflash.stages.sim as sim

    real = sim.create_board
    # An engine that never completes a transaction: the first step (info) fails.
    monkeypatch.setattr(sim, "create_board", lambda *a, **k: real(*a, **k, faults=["stall-after=0"]))
    db = tmp_path / "explicit.sqlite"
    code = main(["--db", str(db), "demo", "--dir", str(tmp_path / "d")])
    out = capsys.readouterr().out
    assert code == 1
    assert "demo stopped: step 1 (identify the flash) exited 1" in out
    assert "Recovered" not in out
    assert db.exists() and not (tmp_path / "d" / "audit.sqlite").exists()   # --db is honoured
