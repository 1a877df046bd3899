"""An emulated board's directory and files against another local user (docs/threat-model.md):
root's `sim create` in a directory someone else made, and links planted at a board's files."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from amdflash.pipeline.cli.main import main
from amdflash.stages.sim import create_board
from amdflash.stages.drivers.flash.geometry import FLASH_SIZE
from amdflash.stages.sim.state import BAR5_SIZE, create_files

NOBODY = 65534


def sim(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str]:
    code = main(["sim", *map(str, args)])
    return code, capsys.readouterr().err


@pytest.mark.skipif(os.getuid() != 0, reason="giving a directory to another user needs root")
def test_sim_create_refuses_an_empty_directory_another_user_made(tmp_path: Path, capsys) -> None:
    """The attack of issue 28 item 5: an empty directory another user made (and can write to)
    in /tmp; they would link state.bin or board.json to a file of root's between its writes."""
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o777)
    os.chmod(theirs, 0o777)
    os.chown(theirs, NOBODY, NOBODY)
    code, err = sim(capsys, "create", theirs, "--seed", 1)
    assert code == 2, err
    assert f"{theirs} is owned by uid {NOBODY}, not by this user" in err
    assert list(theirs.iterdir()) == []          # nothing was written into it


def test_sim_create_refuses_a_link_or_a_directory_with_files(tmp_path: Path, capsys) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = tmp_path / "link"
    link.symlink_to(elsewhere)                   # an empty directory of ours, but reached through a link
    code, err = sim(capsys, "create", link, "--seed", 1)
    assert code == 2 and f"{link} already exists and is not a directory" in err
    assert list(elsewhere.iterdir()) == []
    full = tmp_path / "full"
    full.mkdir()
    (full / "note").write_text("x")
    code, err = sim(capsys, "create", full, "--seed", 1)
    assert code == 2 and f"{full} already exists and is not an empty directory" in err
    # A new directory, and an empty one of our own, are what it takes.
    assert sim(capsys, "create", tmp_path / "new" / "board", "--seed", 1)[0] == 0
    (tmp_path / "empty").mkdir()
    assert sim(capsys, "create", tmp_path / "empty", "--seed", 1)[0] == 0


def test_a_link_planted_while_a_board_is_made_is_not_written_through(tmp_path: Path) -> None:
    """The race of the issue: flash.bin is written, then state.bin already names a link to
    another file. The board's files are created new: the creation fails, naming the file."""
    board = tmp_path / "board"
    board.mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (board / "state.bin").symlink_to(victim)
    with pytest.raises(FileExistsError, match="state.bin"):
        create_files(board, {"format": 1}, b"\xff" * FLASH_SIZE, bytes(BAR5_SIZE))
    assert victim.read_bytes() == b"precious"
    assert not (board / "board.json").exists()   # no half-made board looks like a board


def test_a_link_planted_at_a_board_s_state_file_is_refused_not_followed(tmp_path: Path, capsys) -> None:
    """state.bin replaced by a link to another file of the same size: `sim fault` and
    `sim stats --reset` would write into that file. They refuse, naming the link."""
    board = create_board(tmp_path / "board", seed=3, transport="ideal")
    victim = tmp_path / "victim.bin"
    shutil.copy(board / "state.bin", victim)
    before = victim.read_bytes()
    (board / "state.bin").unlink()
    (board / "state.bin").symlink_to(victim)
    for args in (("fault", board, "kill-after-writes=5"), ("stats", board, "--reset")):
        code, err = sim(capsys, *args)
        assert code == 2, (args, err)
        assert f"{board / 'state.bin'} is a symbolic link" in err, err
    assert main(["info", "--board", f"sim:{board}", "--db", str(tmp_path / "audit.sqlite")]) != 0
    assert f"{board / 'state.bin'} is a symbolic link" in capsys.readouterr().err
    assert victim.read_bytes() == before


def test_changing_a_board_s_faults_never_writes_through_a_planted_link(tmp_path: Path, capsys) -> None:
    """`sim fault` rewrites board.json; the temporary name it used (board.json.tmp) could be a
    link another user planted. The new board.json is made under a name nobody can guess."""
    board = create_board(tmp_path / "board", seed=3, transport="ideal")
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (board / "board.json.tmp").symlink_to(victim)
    code, err = sim(capsys, "fault", board, "kill-after-writes=5")
    assert code == 0, err
    assert victim.read_text() == "precious\n"
    assert not (board / "board.json").is_symlink() and "kill_after_writes" in (board / "board.json").read_text()
