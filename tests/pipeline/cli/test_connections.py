"""A board command opens the trail few times (issue 43): one connection prepares the database for
the writer and is the trail the jobs read during the run (stranded registers, the board's
history), one reader after the run serves every board's report, the run's end and the
transparency log, and one in-memory database is the schema the trail is checked against. The
writer process's own connection is not counted (it is another process); before this, one
successful flash opened 14 in the command's process and an `info` 16."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from amdflash.stages.sim import create_board
from amdflash.stages.sim.synth import PART_KEY, synthetic_ifwi
from tests.support import cli
from tests.support.connections import counted

# A flash and an info counted whole, a few seconds each: in CI's slow set.
pytestmark = pytest.mark.slow

MOST = 3


def _counted(*args: object, env: dict[str, Any]) -> tuple[cli.Result, list[str]]:
    """The command run in this process, with every SQLite connection it opens listed (where from)."""
    with counted() as opened:
        r = cli.run("--no-progress", *args, env=env)
    return r, opened


@pytest.fixture
def place(tmp_path: Path) -> dict[str, Any]:
    image = tmp_path / "image.bin"
    image.write_bytes(synthetic_ifwi(1234))
    board = create_board(tmp_path / "board", content="synthetic", transport="ideal", seed=3)
    env = {"AMDFLASH_LOCK_DIR": str(tmp_path / "locks"), "AMDFLASH_DB": None}
    return {"image": image, "board": f"sim:{board}", "db": tmp_path / "audit.sqlite", "env": env}


def test_a_flash_and_an_info_open_at_most_three_connections(place: dict[str, Any]) -> None:
    db, env = place["db"], place["env"]
    # The first command creates the trail; the ones counted find one with a run in it.
    first = cli.run("--no-progress", "--db", db, "info", "--board", place["board"], env=env)
    assert first.code == 0, first.err
    r, opened = _counted("--db", db, "flash", place["image"], "--yes", "--expect-part", PART_KEY,
                         "--board", place["board"], env=env)
    assert r.code == 0, r.err
    assert len(opened) <= MOST, "\n".join(opened)
    r, opened = _counted("--db", db, "info", "--board", place["board"], env=env)
    assert r.code == 0, r.err
    assert "original    backup" in r.out + r.err     # the board's history was read, through the one reader
    assert len(opened) <= MOST, "\n".join(opened)


def test_a_failed_flash_names_its_original_through_the_same_reader(tmp_path: Path, place: dict[str, Any]) -> None:
    """A flash that fails verify reads the board's history after the run (the backup that holds
    its original, for the advice) through the reader of its report, not one more of its own."""
    img = place["image"].read_bytes()
    held = (create_board(tmp_path / "probe", content="synthetic", transport="ideal", seed=3) / "flash.bin").read_bytes()
    unit = next(u for u in range(0, len(img), 4096) if img[u:u + 4096] != held[u:u + 4096])
    stuck = next(a for a in range(unit, unit + 4096) if img[a] & 0x01 == 0)
    bad = create_board(tmp_path / "bad", content="synthetic", transport="ideal", seed=3,
                       faults=[f"stuck-bit={stuck:#x}:0"])
    r, opened = _counted("--db", place["db"], "flash", place["image"], "--yes", "--expect-part", PART_KEY,
                         "--board", f"sim:{bad}", env=place["env"])
    assert r.code == 1, r.err
    assert "next: the flash is partly written" in r.err and "The original content is backup" in r.err, r.err
    assert len(opened) <= MOST, "\n".join(opened)
