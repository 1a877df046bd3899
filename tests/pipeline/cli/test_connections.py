"""A board command opens the trail few times (issue 43): one connection prepares the database for
the writer and is the trail the jobs read during the run (stranded registers, the board's
history), one reader after the run serves every board's report, the run's end and the
transparency log, and one in-memory database is the schema the trail is checked against. The
writer process's own connection is not counted (it is another process); before this, one
successful flash opened 14 in the command's process and an `info` 16."""
from __future__ import annotations

import sqlite3
import traceback
from pathlib import Path
from typing import Any

import pytest

from amdflash.stages.sim import create_board
from amdflash.stages.sim.synth import PART_KEY, synthetic_ifwi
from amdflash.store import verify
from tests.support import cli

MOST = 3


def _counted(monkeypatch: pytest.MonkeyPatch, *args: object, env: dict[str, Any]) -> tuple[cli.Result, list[str]]:
    """The command run in this process, with every SQLite connection it opens listed (where from)."""
    opened: list[str] = []
    real = sqlite3.connect

    def counting(*a: Any, **k: Any) -> sqlite3.Connection:
        here = [f for f in traceback.extract_stack()[:-1] if "/tests/" not in f.filename]
        opened.append(" <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in reversed(here[-4:])))
        return real(*a, **k)

    # As in a process of its own: the schema the trail is checked against is made once a process.
    verify._expected_schema.cache_clear()
    monkeypatch.setattr(sqlite3, "connect", counting)
    try:
        r = cli.run("--no-progress", *args, env=env)
    finally:
        monkeypatch.setattr(sqlite3, "connect", real)
    return r, opened


@pytest.fixture
def place(tmp_path: Path) -> dict[str, Any]:
    image = tmp_path / "image.bin"
    image.write_bytes(synthetic_ifwi(1234))
    board = create_board(tmp_path / "board", content="synthetic", transport="ideal", seed=3)
    env = {"AMDFLASH_LOCK_DIR": str(tmp_path / "locks"), "AMDFLASH_DB": None}
    return {"image": image, "board": f"sim:{board}", "db": tmp_path / "audit.sqlite", "env": env}


def test_a_flash_and_an_info_open_at_most_three_connections(place: dict[str, Any],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    db, env = place["db"], place["env"]
    # The first command creates the trail; the ones counted find one with a run in it.
    first = cli.run("--no-progress", "--db", db, "info", "--board", place["board"], env=env)
    assert first.code == 0, first.err
    r, opened = _counted(monkeypatch, "--db", db, "flash", place["image"], "--yes", "--expect-part", PART_KEY,
                         "--board", place["board"], env=env)
    assert r.code == 0, r.err
    assert len(opened) <= MOST, "\n".join(opened)
    r, opened = _counted(monkeypatch, "--db", db, "info", "--board", place["board"], env=env)
    assert r.code == 0, r.err
    assert "original    backup" in r.out + r.err     # the board's history was read, through the one reader
    assert len(opened) <= MOST, "\n".join(opened)
