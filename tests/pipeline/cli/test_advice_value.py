"""The commands suggested to the operator name the places of the session or command line that
suggests them (issue 43: advice built once and passed as a value, no module global). Two API
sessions of different audit databases in one process, and command lines run in the same
process between them, each name their own database: a global set by one would leak into the
next (or, as the API had it, name none)."""
from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

from amdflash import api
from tests.support.cli import run

# Whole flashes through the API and the command line, ten seconds each: in CI's slow set.
pytestmark = pytest.mark.slow


def _differing(tmp_path: Path) -> Path:
    other = tmp_path / "other.bin"
    other.write_bytes(bytes(0x200000))        # not what any emulated board holds: verify fails
    return other


def _db_named(step: str) -> str | None:
    """The --db a suggested command names (the command after 'to write the image: ')."""
    words = shlex.split(step.rsplit(": ", 1)[1])
    return words[words.index("--db") + 1] if "--db" in words else None


def test_two_api_sessions_each_name_their_own_database(make_board, tmp_path: Path) -> None:
    other = _differing(tmp_path)
    a, b = f"sim:{make_board(transport='ideal')}", f"sim:{make_board(transport='ideal')}"
    db_a, db_b = tmp_path / "a" / "trail.sqlite", tmp_path / "b" / "trail.sqlite"
    db_a.parent.mkdir()
    db_b.parent.mkdir()
    said = []
    for board, db in ((a, db_a), (b, db_b), (a, db_a)):
        result = api.verify(other, board=board, db=db)
        assert result.status == "failed" and result.advice, result
        said.append(_db_named(result.advice))
        assert f"flash --board {board} --yes -- {other}" in result.advice, result.advice
    assert said == [os.path.realpath(db_a), os.path.realpath(db_b), os.path.realpath(db_a)]


def test_command_lines_and_api_calls_in_one_process_name_their_own_database(make_board, tmp_path: Path) -> None:
    other = _differing(tmp_path)
    board = f"sim:{make_board(transport='ideal')}"
    db_cli, db_api = tmp_path / "cli.sqlite", tmp_path / "api.sqlite"
    first = run("--db", db_cli, "verify", "--board", board, "--no-progress", other)
    assert first.code == 1, first.err
    step = next(line for line in first.err_lines if "to write the image" in line)
    assert _db_named(step) == os.path.realpath(db_cli), step
    # The API after it: its own database, not the command line's that ran before.
    result = api.verify(other, board=board, db=db_api)
    assert result.advice and _db_named(result.advice) == os.path.realpath(db_api), result.advice
    # A command line on the default database after both: no --db at all.
    again = run("verify", "--board", board, "--no-progress", other, env={"AMDFLASH_DB": None})
    assert again.code == 1, again.err
    step = next(line for line in again.err_lines if "to write the image" in line)
    assert _db_named(step) is None and "amdflash flash --board" in step, step
