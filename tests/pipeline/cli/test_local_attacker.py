"""What another local user can do to a root run, and what a board, an image or a file name can
make amdflash do (docs/threat-model.md, "another local user" and "strings from outside").

Each test stages the attack as the attacker would (a planted link, a name with escape
sequences, a bridge that lies about its serial) and runs the real command against it.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from amdflash.stages.files import OutputExists, write_new
from amdflash.stages.transport import discovery
from amdflash.stages.transport.lock import BoardBusy, BoardLock, LockUnsafe, sim_lock
from amdflash.stages.sim import create_board

ESC = "\x1b"
HOSTILE = f"x{ESC}]0;pwned{ESC}\\{ESC}[2J\x07\u202e"   # title, clear screen, bell, bidi override


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# -- locks ------------------------------------------------------------------------------------

def test_a_link_planted_where_the_lock_used_to_be_written_is_never_followed(amdflash, make_board, tmp_path,
                                                                          monkeypatch):
    """The attack of the issue: a user pre-creates root's lock directory in the temp dir with a
    link named like a board's lock, pointing at a file root owns. Root's `info` must leave that
    file alone (amdflash used to truncate it and write its pid into it)."""
    board = make_board(transport="ideal")
    temp = tmp_path / "tmp"
    planted = temp / f"amdflash-locks-{os.getuid()}"
    planted.mkdir(parents=True)
    victim = tmp_path / "root-owned.conf"
    victim.write_text("precious\n")
    key = f"sim:{Path(board).resolve()}"
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in key)[:60]
    for name in (f"{safe}-{hashlib.sha1(key.encode()).hexdigest()[:12]}.lock",):   # the name amdflash used
        (planted / name).symlink_to(victim)
    monkeypatch.delenv("AMDFLASH_LOCK_DIR")
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(temp))
    tempfile.tempdir = None        # gettempdir() reads TMPDIR again
    try:
        r = amdflash("info", "--board", f"sim:{board}")
    finally:
        tempfile.tempdir = None
    assert r.code == 0, r.err
    assert victim.read_text() == "precious\n"


def test_a_lock_file_that_is_a_link_is_refused_not_followed(tmp_path, monkeypatch):
    locks = tmp_path / "locks"
    locks.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("keep")
    monkeypatch.setenv("AMDFLASH_LOCK_DIR", str(locks))
    lock = BoardLock("usb:bus1-port2")             # no object of its own: a lock file
    lock.path.symlink_to(victim)
    with pytest.raises(LockUnsafe, match="symbolic link"):
        lock.acquire()
    assert victim.read_text() == "keep"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the directory to another user")
def test_a_lock_directory_made_by_another_user_is_refused(tmp_path, monkeypatch):
    locks = tmp_path / "locks"
    locks.mkdir(mode=0o755)
    os.chown(locks, 65534, 65534)
    monkeypatch.setenv("AMDFLASH_LOCK_DIR", str(locks))
    with pytest.raises(LockUnsafe, match="belongs to uid 65534"):
        BoardLock("usb:bus1-port2").acquire()
    assert list(locks.iterdir()) == []


def test_a_lock_directory_others_can_write_is_refused(tmp_path, monkeypatch):
    locks = tmp_path / "locks"
    locks.mkdir()
    os.chmod(locks, 0o777)
    monkeypatch.setenv("AMDFLASH_LOCK_DIR", str(locks))
    with pytest.raises(LockUnsafe, match="writable by others"):
        BoardLock("usb:bus1-port2").acquire()


HOLD = """
import sys
from amdflash.stages.transport.lock import sim_lock
lock = sim_lock(sys.argv[1]).acquire()
print("locked", flush=True)
sys.stdin.read()
"""


def _holder(board: Path, env: dict[str, str], **kw: object) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(board)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env, **kw)  # type: ignore[call-overload]
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc


def test_one_board_is_one_lock_whatever_each_user_s_lock_directory(amdflash, make_board, tmp_path):
    """Locks used to live in a directory per user: root and a user flashing the same board did not
    exclude each other. Another process with its own lock and runtime directories (as another
    user has) holds the board; this one is refused, through a symlinked path and through the
    emulated USB bridge in front of the same board."""
    board = make_board(transport="ideal")
    env = {**os.environ, "AMDFLASH_LOCK_DIR": str(tmp_path / "other-user-locks"),
           "XDG_RUNTIME_DIR": str(tmp_path / "other-user-run")}
    link = tmp_path / "link-to-board"
    link.symlink_to(board)
    proc = _holder(board, env)
    try:
        r = amdflash("info", "--board", f"sim:{link}")
        assert r.code == 2 and f"board busy (pid {proc.pid})" in r.err, r.err
        os.environ[discovery.ENV_SIM_USB] = str(board)
        try:
            r = amdflash("info", "--board", "usb:0")
        finally:
            del os.environ[discovery.ENV_SIM_USB]
        assert r.code == 2 and f"board busy (pid {proc.pid})" in r.err, r.err
    finally:
        proc.communicate("")
    assert amdflash("info", "--board", f"sim:{link}").code == 0


def test_the_lock_of_a_sim_board_is_its_directory(make_board):
    board = make_board()
    with sim_lock(board):
        with pytest.raises(BoardBusy):
            BoardLock("another name for it", board).acquire()


# -- file modes -------------------------------------------------------------------------------

def test_the_trail_backups_and_keys_are_the_owner_s_alone(amdflash, make_board, image, tmp_path, monkeypatch):
    """Full flash content (backups) and the record used to be world-readable (0644 in 0755)."""
    monkeypatch.delenv("AMDFLASH_DB")
    monkeypatch.delenv("AMDFLASH_HOST_KEY")      # the default key, beside the default database
    old = os.umask(0o022)
    try:
        board = make_board(transport="ideal", content="blank")
        r = amdflash("flash", image, "--yes", "--force", "--board", f"sim:{board}")
    finally:
        os.umask(old)
    assert r.code == 0, r.err
    data = tmp_path / "data" / "amdflash"
    assert mode(data) == 0o700
    for name in ("audit.sqlite", "audit.sqlite-wal", "audit.sqlite-shm", "audit.sqlite.anchor", "host_key.pem"):
        if (data / name).exists():
            assert mode(data / name) == 0o600, name
    assert (data / "audit.sqlite.anchor").exists()
    assert mode(data / "backups") == 0o700
    backups = list((data / "backups").glob("*.bin"))
    assert backups and all(mode(b) == 0o600 for b in backups)


def test_a_data_directory_left_open_by_an_older_amdflash_is_narrowed(amdflash, make_board, tmp_path, monkeypatch):
    monkeypatch.delenv("AMDFLASH_DB")
    data = tmp_path / "data" / "amdflash"
    data.mkdir(parents=True, mode=0o755)
    os.chmod(data, 0o755)
    assert amdflash("info", "--board", f"sim:{make_board(transport='ideal')}").code == 0
    assert mode(data) == 0o700 and mode(data / "audit.sqlite") == 0o600


def test_a_dump_is_never_more_open_than_0644(amdflash, make_board, tmp_path):
    old = os.umask(0)
    try:
        r = amdflash("dump", tmp_path / "d.bin", "--reads", "1", "--board", f"sim:{make_board(transport='ideal')}")
    finally:
        os.umask(old)
    assert r.code == 0, r.err
    assert mode(tmp_path / "d.bin") == 0o644


def test_a_dump_into_a_shared_directory_never_writes_through_a_planted_link(amdflash, make_board, tmp_path):
    """The dump used to be assembled in '.NAME.partial' beside it: a link planted under that
    name in /tmp made root write the flash into the link's target."""
    shared = tmp_path / "shared"
    shared.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (shared / ".d.bin.partial").symlink_to(victim)
    r = amdflash("dump", shared / "d.bin", "--reads", "1", "--board", f"sim:{make_board(transport='ideal')}")
    assert r.code == 0, r.err
    assert victim.read_text() == "keep" and (shared / "d.bin").stat().st_size == 0x200000


@pytest.mark.parametrize("code", [errno.EPERM, errno.EOPNOTSUPP])
def test_a_dump_onto_a_file_system_without_hard_links_is_written_and_never_replaces(amdflash, make_board,
                                                                                   tmp_path, monkeypatch, code):
    """Without --overwrite the new file took its name by a hard link, which FAT and exFAT (a USB
    stick) and some network mounts refuse: the dump was read, then failed at its last step
    (an attack review, on `fleet dump` using it too). There the name is taken by a rename that
    refuses to replace: the same promise, never a file replaced, nothing left beside it."""
    def no_links(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "link", no_links)
    board = f"sim:{make_board(transport='ideal')}"
    out = tmp_path / "stick"
    out.mkdir()
    r = amdflash("dump", out / "d.bin", "--reads", "1", "--board", board)
    assert r.code == 0, r.err
    assert (out / "d.bin").stat().st_size == 0x200000 and sorted(p.name for p in out.iterdir()) == ["d.bin"]
    # A file that appears at the name after the checks before the run (as in a shared DIR):
    # the placing itself refuses it, as the link does.
    (out / "d.bin").write_bytes(b"yesterday")
    with pytest.raises(OutputExists, match="exists"):
        write_new(out / "d.bin", b"today", overwrite=False)
    assert (out / "d.bin").read_bytes() == b"yesterday" and sorted(p.name for p in out.iterdir()) == ["d.bin"]


# -- strings from boards, images, file names ---------------------------------------------------

def test_a_serial_cannot_lead_a_dump_out_of_its_directory(amdflash, make_board, tmp_path):
    board = make_board(transport="ideal")
    config = json.loads((board / "board.json").read_text())
    config["serial"] = "../../escaped"
    (board / "board.json").write_text(json.dumps(config))
    out = tmp_path / "dumps"
    out.mkdir()
    r = amdflash("dump", out / "{serial}.bin", "--reads", "1", "--board", f"sim:{board}")
    assert r.code == 0, r.err
    assert not (tmp_path.parent / "escaped.bin").exists() and not (tmp_path / "escaped.bin").exists()
    [written] = list(out.iterdir())
    assert written.name == "escaped.bin"          # '.', '/' and '_' trimmed: a plain name in DIR


def test_a_bridge_whose_serial_is_not_the_firmware_s_is_not_used(make_board, tmp_path, monkeypatch, amdflash):
    """The firmware reports 8 lowercase hex digits; a device that says '../../x' (with escapes)
    is shown escaped and never opened, so its string names no file and no lock."""
    board = make_board(transport="ideal", bridge={"serial_string": f"../../{ESC}[2Jx"})
    monkeypatch.setenv(discovery.ENV_SIM_USB, str(board))
    listed = amdflash("list", "--format", "json")
    [entry] = json.loads(listed.out)
    assert entry["serial"] is None and "not the 8 lowercase hex digits" in entry["error"]
    assert "\\x1b" in entry["error"] and ESC not in entry["error"]
    r = amdflash("dump", tmp_path / "{serial}.bin", "--board", "usb:0")
    assert r.code != 0 and not list(tmp_path.glob("*.bin"))


def test_a_bridge_s_product_string_is_one_escaped_field_of_the_listing(make_board, monkeypatch, amdflash):
    """A device that calls itself `custom…` passes for the firmware, but its product string is
    still anyone's: a newline in it forged a second line of `amdflash list` (an attack review)."""
    board = make_board(transport="ideal", bridge={"product": f"custom\n{{{{ 7*7 }}}}{ESC}[31mX  spec=usb:9"})
    monkeypatch.setenv(discovery.ENV_SIM_USB, str(board))
    listed = amdflash("list")
    assert listed.code == 0 and len(listed.out.splitlines()) == 1, listed.out
    assert "custom\\n{{ 7*7 }}\\x1b[31mX" in listed.out and ESC not in listed.out


def test_escape_sequences_from_names_and_the_trail_never_reach_the_terminal(amdflash, make_board, tmp_path):
    board = make_board(HOSTILE, transport="ideal")
    runs = [amdflash("info", "--board", f"sim:{board}"),
            amdflash("verify", tmp_path / f"image{HOSTILE}.bin", "--board", f"sim:{board}"),
            amdflash("dump", tmp_path / f"no-such-dir{HOSTILE}" / "d.bin", "--board", f"sim:{board}"),
            # an operator name is refused, not kept (it would be shown in every report), and said escaped
            amdflash("info", "--board", f"sim:{board}", "--operator", HOSTILE)]
    listed = amdflash("runs")
    for r in [*runs, listed]:
        for text in (r.out, r.err):
            assert ESC not in text and "\x07" not in text and "\u202e" not in text, text
    assert runs[0].code == 0 and "\\x1b]0;pwned" in runs[0].out
    assert runs[1].code == 2 and "\\x1b[2J" in runs[1].err
    assert runs[3].code == 2 and "--operator x\\x1b]0;pwned" in runs[3].err
    run_id = json.loads(amdflash("runs", "--format", "json").out)[0]["run_id"]
    report = amdflash("report", run_id)
    assert report.code == 0 and ESC not in report.out and "\\x1b" in report.out


def test_the_html_report_shows_names_from_the_field_escaped(amdflash, make_board, tmp_path):
    """A browser obeys no markup from the trail (test_html.py), and neither a bidi override
    (U+202E shows the rest of a name reversed) nor a control character: shown as escapes."""
    board = make_board(HOSTILE, transport="ideal")
    assert amdflash("info", "--board", f"sim:{board}").code == 0
    run_id = json.loads(amdflash("runs", "--format", "json").out)[0]["run_id"]
    page = tmp_path / "report.html"
    assert amdflash("report", run_id, "--format", "html", "-o", page).code == 0
    text = page.read_text()
    assert [text.count(c) for c in (ESC, "\x07", "\u202e")] == [0, 0, 0]
    assert "x\\x1b]0;pwned\\x1b\\\\x1b[2J\\x07\\u202e" in text     # the board's path, escaped


def test_a_database_name_with_uri_characters_opens_that_file(amdflash, make_board, tmp_path):
    """`--db 'audit#1.sqlite'` used to open 'audit' for reading (the URI fragment was dropped)."""
    board = make_board(transport="ideal")
    assert amdflash("info", "--board", f"sim:{board}", "--db", tmp_path / "audit").code == 0
    assert amdflash("dump", tmp_path / "d.bin", "--reads", "1", "--board", f"sim:{board}",
                    "--db", tmp_path / "audit#1.sqlite").code == 0
    for name, command in (("audit#1.sqlite", "dump"), ("audit", "info")):
        r = amdflash("runs", "--format", "json", "--db", tmp_path / name)
        assert r.code == 0, r.err
        assert [x["command"] for x in json.loads(r.out)] == [command]
