"""An emulated board's directory against whoever can write to its parent (issue 41 item 5), and
board names the trail cannot record (issue 40 item 5): `sim create` and `--board sim:PATH`.

`sim create` made its directory, then created the board's files by path: swapping the new
directory for a link the moment after mkdir sent root's files into a directory of the
attacker's choosing; a board command locked the board a `sim:` link named, then opened the
files through the link again, wherever it pointed by then.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from amdflash.stages import open_transport
from amdflash.stages.sim import create_board
from amdflash.stages.sim.state import BoardFiles


def test_sim_create_never_writes_into_a_directory_swapped_for_a_link_after_mkdir(amdflash, tmp_path, monkeypatch):
    """The race of the issue, won every time: the moment `sim create` has made the board's
    directory, the owner of its parent moves it away and puts a link to a directory of theirs
    (one of root's, say) in its place. Nothing is written there, nor anywhere through the link."""
    shared = tmp_path / "shared"          # the attacker's: they may rename what is in it
    shared.mkdir()
    target = tmp_path / "chosen"          # where they want root's files to land
    target.mkdir()
    board = shared / "board"
    real_mkdir = os.mkdir

    def mkdir_then_swap(path, mode=0o777, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        real_mkdir(path, mode, *args, **kwargs)
        if os.path.abspath(path) == str(board):
            os.rename(board, shared / "moved-away")
            board.symlink_to(target)

    monkeypatch.setattr(os, "mkdir", mkdir_then_swap)
    r = amdflash("sim", "create", board, "--seed", 1, "--transport", "ideal")
    monkeypatch.undo()
    assert r.code == 2, r.err
    assert r.err_lines == [f"error: {board} is no longer the directory just made (a link or a file is there now: "
                           f"another user who can write to {shared}?): nothing was written"], r.err
    assert list(target.iterdir()) == []                    # nothing through the link
    assert list((shared / "moved-away").iterdir()) == []   # and no half-made board


def test_a_board_command_uses_the_board_its_link_named_when_it_was_locked(amdflash, make_board, tmp_path,
                                                                          monkeypatch):
    """`--board sim:LINK` (allowed: the board is the directory the link names, and so is its
    lock). Whoever owns the link points it at another directory the moment the board is
    locked: the run still drives the board it locked, never the one the link names by then."""
    locked = make_board(transport="ideal")
    other = make_board(transport="ideal")
    link = tmp_path / "link"
    link.symlink_to(locked)
    real_lock = open_transport.sim_lock

    class Swapping:
        def __init__(self, path):  # noqa: ANN001
            self.lock = real_lock(path)

        def acquire(self):  # noqa: ANN202
            held = self.lock.acquire()
            link.unlink()
            link.symlink_to(other)
            return held

    monkeypatch.setattr(open_transport, "sim_lock", Swapping)
    r = amdflash("info", "--board", f"sim:{link}", "--json")
    assert r.code == 0, r.err
    driven = json.loads(r.out)["board"]["bridge_serial"]
    assert driven == json.loads((locked / "board.json").read_text())["serial"] != \
        json.loads((other / "board.json").read_text())["serial"]


def test_a_board_directory_swapped_for_a_link_once_resolved_is_refused(make_board, tmp_path, monkeypatch):
    """The board's directory is resolved once; a link found on the way after that was put there
    since, and the board's files are never opened through it."""
    board = make_board(transport="ideal")
    decoy = make_board(transport="ideal")
    monkeypatch.setattr(os.path, "realpath", lambda p, *a, **k: str(board))   # resolved: before the swap
    os.rename(board, tmp_path / "moved")
    board.symlink_to(decoy)
    with pytest.raises(ValueError, match="is a symbolic link: a directory reached without following links"):
        BoardFiles(board)


@pytest.mark.parametrize("command", [("sim", "create"), ("sim", "create", "--blank")])
def test_sim_create_refuses_a_name_that_is_not_utf8_in_one_line(amdflash, tmp_path, command):
    """It printed a Python codec error ('utf-8' codec can't encode character '\\udcff'): the
    board's spec is recorded as text. One line, exit 2, nothing made."""
    name = tmp_path / "board-\udcff"
    r = amdflash(*command, name, "--seed", 1)
    assert r.code == 2
    assert r.err_lines == [f"error: {tmp_path}/board-\\xff: the name is not valid UTF-8, and the audit trail "
                           "records a board's spec (sim:PATH) as text; choose a UTF-8 name"], r.err
    assert not os.path.lexists(name)


def test_a_board_spec_that_is_not_utf8_is_refused_before_the_run(amdflash, make_board, tmp_path):
    """A board renamed to a name that is not UTF-8: `--board sim:` that name failed its run
    with the writer's codec error (exit 1); it is a bad spec, refused before any run (exit 2)."""
    board = make_board(transport="ideal")
    name = tmp_path / "board-\udcfe"
    os.rename(board, name)
    db = Path(os.environ["AMDFLASH_DB"])
    r = amdflash("info", "--board", f"sim:{name}")
    assert r.code == 2, r.err
    assert r.err_lines == [f"error: board spec sim:{tmp_path}/board-\\xfe: the name is not valid UTF-8, and the "
                           "audit trail records a board's spec as text; rename the board directory"], r.err
    link = tmp_path / "board-link"          # a link's own name is not enough: the run records the board's
    link.symlink_to(name)
    r = amdflash("info", "--board", f"sim:{link}")
    assert r.code == 2, r.err
    assert r.err_lines == [f"error: board spec sim:{link}: the board directory it names, {tmp_path}/board-\\xfe, is "
                           "not valid UTF-8, and the audit trail records a board's spec as text; rename the board "
                           "directory"], r.err
    assert not db.exists()
    os.rename(name, tmp_path / "board-renamed")         # the remedy the refusal names works
    assert amdflash("info", "--board", f"sim:{tmp_path / 'board-renamed'}").code == 0


def test_sim_create_from_a_trail_whose_name_is_not_utf8_is_refused_creating_nothing(amdflash, make_board,
                                                                                     tmp_path):
    """--from-run TRAIL with a name that is not UTF-8 exited 1 with SQLite's decoding error
    and left the trail's -wal and -shm files behind."""
    board = make_board(transport="ideal")
    assert amdflash("info", "--board", f"sim:{board}").code == 0
    trail = tmp_path / "trail-\udcff.sqlite"
    os.rename(os.environ["AMDFLASH_DB"], trail)
    before = sorted(os.listdir(tmp_path))
    r = amdflash("sim", "create", tmp_path / "new", "--from-run", trail, "x")
    assert r.code == 2, r.err
    assert r.err_lines == [f"error: --from-run {tmp_path}/trail-\\xff.sqlite: the name is not valid UTF-8; "
                           "rename the file (or link it under a UTF-8 name)"], r.err
    assert sorted(os.listdir(tmp_path)) == before


def test_a_board_made_and_used_the_usual_way_still_works(amdflash, tmp_path):
    """Opening by descriptor changes nothing for an ordinary board: made, reached through a
    link (the same board and the same lock), its faults changed and counted."""
    board = tmp_path / "b"
    assert amdflash("sim", "create", board, "--seed", 2, "--transport", "ideal").code == 0
    link = tmp_path / "via-link"
    link.symlink_to(board)
    assert amdflash("info", "--board", f"sim:{link}").code == 0
    r = amdflash("sim", "fault", link, "kill-after-writes=50")
    assert r.code == 0, r.err
    assert "kill_after_writes" in (board / "board.json").read_text()
    assert not (board / "board.json").is_symlink()
    assert sorted(p.name for p in board.iterdir()) == ["board.json", "flash.bin", "regs.bin", "state.bin"]
    assert create_board(tmp_path / "c", seed=3, transport="ideal").is_dir()
