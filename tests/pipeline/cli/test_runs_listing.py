"""`runs` as a new operator reads it (issue 40 item 7): `--board` takes a board the way board
commands take it, and the columns line up whatever a status says of the run that fixed (or
superseded) it."""
from __future__ import annotations

import json
import re

import pytest

from tests.pipeline.cli import test_original_across_runs as across

killed = across.killed        # the fixture: a board whose flash was killed while writing units

STARTED = re.compile(r" 20\d\d-\d\d-\d\dT\d\d:\d\d:\d\d")


def test_runs_board_takes_a_relative_sim_path_as_board_commands_do(amdflash, make_board, tmp_path):
    """`runs --board sim:b8` matched nothing while `info --board sim:b8` ran on ./b8: the spec
    is read as a board command reads it (made absolute, a link to the board is the board)."""
    make_board("b8", transport="ideal")
    other = make_board("b9", transport="ideal")
    assert amdflash("info", "--board", "sim:b8", cwd=tmp_path).code == 0
    assert amdflash("info", "--board", f"sim:{other}").code == 0
    (tmp_path / "link").symlink_to(tmp_path / "b8")
    for spec, cwd in (("sim:b8", tmp_path), ("sim:./b8/", tmp_path), (f"sim:{tmp_path}/b8", None),
                      ("sim:link", tmp_path)):
        r = amdflash("runs", "--board", spec, "--json", cwd=cwd)
        assert r.code == 0, r.err
        assert [x["board_spec"] for x in json.loads(r.out)] == [f"sim:{tmp_path}/b8"], (spec, r.out)
    r = amdflash("runs", "--board", "sim:b8", cwd=tmp_path / "b8")       # ./b8 of another directory: none
    assert r.code == 0 and r.out == "" and "no run matches" in r.err, r.out + r.err


@pytest.mark.slow
def test_runs_columns_line_up_beside_a_status_that_names_its_fix(amdflash, killed, tmp_path):
    """`interrupted (fixed by RUN)` is wider than the 12 characters the status column had: the
    start time and the board of that line stood further right than every other line's."""
    board, run = killed["board"], killed["run"]
    done = amdflash("--no-progress", "resume", run, "--board", f"sim:{board}", "--yes")
    assert done.code == 0, done.err
    assert amdflash("info", "--board", f"sim:{board}").code == 0
    lines = amdflash("runs").out.splitlines()
    assert any(f"interrupted (fixed by " in line for line in lines), lines
    starts = {STARTED.search(line).start() for line in lines}
    boards = {line.index(f"sim:{board}") for line in lines}
    commands = {line.index(line.split()[1], len(line.split()[0])) for line in lines}
    assert len(starts) == len(boards) == len(commands) == 1, "\n".join(lines)
