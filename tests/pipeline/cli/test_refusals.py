"""Refused before anything runs: exit 2, one `error:` line, no traceback, the board untouched."""
from __future__ import annotations

import os
import resource
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from amdflash.stages.drivers.navi31 import regs as R
from amdflash.stages.sim import Board
from tests.pipeline.cli.conftest import Result, flash_content

REGISTERS = (R.GPIOPAD_MASK, R.GPIOPAD_A, R.GPIOPAD_EN, R.PAGE_MIRROR_CNTL, R.ROM_CNTL)


def untouched(board: Path) -> tuple[bytes, dict[int, int], int]:
    with Board(board) as b:
        return flash_content(board), {r: b.get32(r) for r in REGISTERS}, int(b.stats()["reg_writes"])


def refused(r, needle: str) -> None:  # noqa: ANN001
    assert r.code == 2, (r.code, r.err)
    assert r.err_lines == [r.err_lines[0]] and r.err.startswith("error: "), r.err
    assert needle in r.err, r.err
    assert "Traceback" not in r.err


@pytest.mark.parametrize("spec,why", [
    ("usb:zz", "usb:N (index from 0) or usb:SERIAL"),
    ("usb:-1", "usb:N (index from 0) or usb:SERIAL"),
    ("pci:garbage", "pci:DDDD:BB:DD.F or pci:BB:DD.F"),
    ("pci:", "nothing after 'pci:'"),
    ("fpga:0", "unknown kind 'fpga'"),
    ("auto:1", "'auto' takes no selector"),
])
def test_malformed_board_specs_name_the_grammar(amdflash, spec, why):
    r = amdflash("info", "--board", spec)
    refused(r, why)
    assert "a board spec is auto | usb | usb:N | usb:SERIAL" in r.err
    assert not Path(os.environ["AMDFLASH_DB"]).exists()      # refused before the audit trail is opened


def test_an_image_that_is_a_device_is_refused_unread(amdflash, make_board):
    board = make_board(transport="ideal")
    before = untouched(board)
    refused(amdflash("verify", "/dev/zero", "--board", f"sim:{board}"), "is a character device, not a regular file")
    refused(amdflash("flash", "/dev/zero", "--yes", "--board", f"sim:{board}"), "character device")
    assert untouched(board) == before


def test_an_image_that_is_a_fifo_is_refused_without_blocking(amdflash_process, make_board, tmp_path):
    board = make_board(transport="ideal")
    fifo = tmp_path / "image.fifo"
    os.mkfifo(fifo)
    r = amdflash_process("flash", fifo, "--yes", "--board", f"sim:{board}", timeout=30)
    refused(r, "is a FIFO, not a regular file")


def test_images_of_the_wrong_size_or_kind_are_refused_by_stat(amdflash, make_board, tmp_path):
    board = make_board(transport="ideal")
    before = untouched(board)
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        f.truncate(1 << 30)                      # sparse: reading it would cost a gigabyte
    refused(amdflash("verify", big, "--board", f"sim:{board}"), "is 0x40000000 bytes; a Navi31 flash image is exactly 0x200000")
    refused(amdflash("verify", tmp_path, "--board", f"sim:{board}"), "is a directory")
    refused(amdflash("verify", tmp_path / "missing.bin", "--board", f"sim:{board}"), "No such file or directory")
    refused(amdflash("sim", "create", tmp_path / "new", "--image", "/dev/zero"), "character device")
    assert untouched(board) == before


def test_a_foreign_sqlite_database_is_refused_and_left_as_it_was(amdflash, make_board, image, tmp_path):
    board = make_board(transport="ideal")
    foreign = tmp_path / "photos.db"
    con = sqlite3.connect(foreign)
    con.execute("CREATE TABLE albums (id INTEGER PRIMARY KEY, name TEXT)")
    con.commit()
    con.close()
    before = foreign.read_bytes()
    refused(amdflash("--db", foreign, "info", "--board", f"sim:{board}"), "is not an amdflash audit database")
    refused(amdflash("--db", foreign, "runs"), "is not an amdflash audit database")
    con = sqlite3.connect(foreign)
    assert [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")] == ["albums"]
    con.close()
    assert foreign.read_bytes() == before


def test_the_store_itself_never_adds_tables_to_a_foreign_database(tmp_path):
    from amdflash.store.schema import SchemaError
    from amdflash.store.migrate import prepare

    foreign = tmp_path / "other.db"
    con = sqlite3.connect(foreign)
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()
    with pytest.raises(SchemaError, match="another application"):
        prepare(str(foreign), tmp_path / "key.pem")
    con = sqlite3.connect(foreign)
    assert [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")] == ["t"]
    con.close()


READ_ONLY_MOUNT = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"'


def _read_only(path: Path) -> list[str]:
    """A command prefix under which `path` is read-only: permissions for a normal user; for
    root (whom permissions do not stop), a read-only bind mount in a private mount namespace."""
    if os.geteuid() != 0:
        os.chmod(path, 0o555 if path.is_dir() else 0o444)
        return []
    probe = subprocess.run(["unshare", "-m", "sh", "-c", READ_ONLY_MOUNT, "sh", str(path), "true"],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"running as root and cannot make a read-only mount here: {probe.stderr.decode().strip()}")
    return ["unshare", "-m", "sh", "-c", READ_ONLY_MOUNT, "sh", str(path)]


@pytest.mark.parametrize("what", ["file", "directory"])
def test_a_read_only_database_is_refused_before_the_run(amdflash, make_board, tmp_path, what):
    board = make_board(transport="ideal")
    db = tmp_path / "dbdir" / "audit.sqlite"
    db.parent.mkdir()
    assert amdflash("--db", db, "info", "--board", f"sim:{board}").code == 0   # an existing, good trail
    runs_before = sqlite3.connect(db).execute("SELECT count(*) FROM runs").fetchone()[0]
    prefix = _read_only(db if what == "file" else db.parent)
    before = untouched(board)
    p = subprocess.run([*prefix, sys.executable, "-m", "amdflash", "--db", str(db), "info", "--board", f"sim:{board}"],
                       capture_output=True, text=True, timeout=120)
    refused(Result(p.returncode, p.stdout, p.stderr), "not writable")
    assert untouched(board) == before
    assert sqlite3.connect(db).execute("SELECT count(*) FROM runs").fetchone()[0] == runs_before


def test_an_unwritable_output_is_refused_before_the_run(amdflash, make_board, tmp_path):
    board = make_board(transport="ideal")
    before = untouched(board)
    refused(amdflash("dump", tmp_path / "no" / "such" / "dir.bin", "--board", f"sim:{board}"), "does not exist")
    refused(amdflash("dump", tmp_path, "--board", f"sim:{board}"), "is a directory")
    refused(amdflash("read", "0", "16", "-o", "/dev/null/x", "--board", f"sim:{board}"), "cannot write output")
    assert untouched(board) == before
    assert not Path(os.environ["AMDFLASH_DB"]).exists()


@pytest.mark.parametrize("argv,needle", [
    (("read", "0x200000", "1"), "outside the 2 MiB flash"),
    (("read", "0x1fffff", "2"), "runs past the end"),
    (("read", "0", "0"), "at least 1 byte"),
    (("read", "zz", "1"), "'zz' is not a number"),
    (("info", "--prescale", "99"), "--prescale: 99 is not in 0..15"),
    (("read", "0", "1", "--prescale", "-1"), "--prescale: -1 is not in 0..15"),
    (("dump", "x.bin", "--via", "rom"), "unknown value 'rom'; did you mean 'rom-sw'?"),
])
def test_bad_arguments_are_one_line_usage_errors(amdflash, make_board, argv, needle):
    board = make_board(transport="ideal")
    before = untouched(board)
    refused(amdflash(*argv, "--board", f"sim:{board}"), needle)
    assert untouched(board) == before


def test_a_busy_board_is_a_refused_run_on_record(amdflash, make_board):
    from amdflash.stages.transport.lock import sim_lock

    board = make_board(transport="ideal")
    with sim_lock(board):
        r = amdflash("info", "--board", f"sim:{board}")
    refused(r, f"board busy (pid {os.getpid()})")
    runs = amdflash("runs", "--json")
    [run] = __import__("json").loads(runs.out)
    assert run["status"] == "refused" and run["command"] == "info"
    rep = __import__("json").loads(amdflash("report", run["run_id"], "--json").out)
    assert rep["status"] == "refused" and "board busy" in rep["error"]


def test_ctrl_c_while_parsing_or_checking_exits_130_without_a_traceback(amdflash, monkeypatch, make_board):
    from amdflash.pipeline.commands import checks

    board = make_board(transport="ideal")

    def interrupted(*args):  # noqa: ANN002, ANN202
        raise KeyboardInterrupt

    monkeypatch.setattr(checks, "board_specs", interrupted)
    # Threads an earlier test of this worker left winding down (anyio's idle workers, a
    # server's) are not this command's: it must leave none of its own (it failed in a run of
    # several test folders in one worker, with 4 threads alive: no order is promised).
    before = set(threading.enumerate())
    r = amdflash("info", "--board", f"sim:{board}")
    assert r.code == 130 and r.err == "error: interrupted\n"
    assert set(threading.enumerate()) <= before, set(threading.enumerate()) - before


def test_errors_inside_task_groups_are_unwrapped_to_their_cause(amdflash, monkeypatch):
    from amdflash.pipeline.commands import board as commands
    from amdflash.pipeline.errors import Refusal

    def grouped(*args):  # noqa: ANN002, ANN202
        raise ExceptionGroup("unhandled errors in a TaskGroup",
                             [ExceptionGroup("inner", [Refusal("--prescale must be 0..15")]), ValueError("other")])

    monkeypatch.setattr(commands, "runs", grouped)
    r = amdflash("runs")
    assert r.code == 2 and r.err == "error: --prescale must be 0..15\n"

    def failed(*args):  # noqa: ANN002, ANN202
        raise ExceptionGroup("unhandled errors in a TaskGroup", [OSError("USB bridge 1234abcd: disconnected")])

    monkeypatch.setattr(commands, "runs", failed)
    r = amdflash("runs")
    assert r.code == 1 and r.err == "error: USB bridge 1234abcd: disconnected\n"

    def bug(*args):  # noqa: ANN002, ANN202
        return {}["missing"]

    monkeypatch.setattr(commands, "runs", bug)
    r = amdflash("runs")
    assert r.code == 1 and r.err_lines == ["error: internal error KeyError: 'missing' (-v shows where)"]
    r = amdflash("runs", "-v")
    assert "Traceback" in r.err      # asked for: -v shows where


# Every option that names a file to write, with what it needs to get that far.
OUTPUT_OPTIONS = [
    ("man", "-o"), ("report", "latest", "-o"), ("audit", "export", "-o"), ("audit", "datasette-metadata", "-o"),
    ("audit", "key", "-o"), ("audit", "archive", "--before", "2020-01-01", "-o"), ("sim", "image", "sim:x", "-o"),
    ("sim", "synth", "-o"), ("fleet", "report", "--from", "postgresql://nowhere/x", "-o"),
    ("read", "0", "16", "-o"), ("dump",),
]


@pytest.mark.parametrize("argv", OUTPUT_OPTIONS, ids=lambda a: " ".join(a))
def test_an_output_that_is_a_fifo_or_directory_is_never_replaced(amdflash, tmp_path, argv):
    # Writers create a new file and rename it into place: given a device or a FIFO, that
    # would replace the node itself (as root, `man -o /dev/zero` used to replace /dev/zero).
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    refused(amdflash(*argv, fifo), "is a FIFO; give the name of a regular file to write")
    assert fifo.is_fifo()
    refused(amdflash(*argv, tmp_path), "is a directory; give the name of a regular file to write")


def _memory_cap() -> None:
    # Reading /dev/zero never ends: should a regression read it, the process fails at 2 GiB
    # instead of taking the machine's memory.
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


@pytest.mark.parametrize("option", ["--key", "--anchor"])
def test_key_and_anchor_files_that_are_fifos_or_devices_are_refused_unread(amdflash, amdflash_process, make_board,
                                                                           tmp_path, option):
    assert amdflash("info", "--board", f"sim:{make_board(transport='ideal')}").code == 0   # a database to verify
    fifo = tmp_path / "key.fifo"
    os.mkfifo(fifo)
    r = amdflash_process("audit", "verify", option, fifo, timeout=30)     # would block in open()
    refused(r, "not a regular file")
    r = amdflash_process("audit", "verify", option, "/dev/zero", timeout=30, preexec_fn=_memory_cap)
    refused(r, "not a regular file")


def test_image_info_reads_only_regular_files(amdflash_process, tmp_path):
    fifo = tmp_path / "image.fifo"
    os.mkfifo(fifo)
    refused(amdflash_process("image", "info", fifo, timeout=30), "is a FIFO, not a regular file")
    refused(amdflash_process("image", "info", "/dev/zero", timeout=30, preexec_fn=_memory_cap),
            "is a character device, not a regular file")


@pytest.mark.parametrize("make,needle", [
    (lambda p: os.mkfifo(p), "is not a regular file"),
    (lambda p: p.mkdir(), "is not a regular file"),
    (lambda p: p.write_bytes(b"\xaa\x55" * 8), "is not UTF-8 text (byte 0)"),
    (lambda p: p.write_bytes(b"# " + b"x" * (2 << 20)), "is larger than"),
])
def test_a_config_file_that_is_no_settings_file_is_a_usage_error(amdflash, amdflash_process, tmp_path, make, needle):
    config = tmp_path / "config.toml"
    make(config)
    # A FIFO would block a wrong open() for good: that one runs as a process, under a timeout.
    run = amdflash_process if config.is_fifo() else amdflash
    refused(run("--config", config, "runs", timeout=30), needle)
    r = amdflash_process("--config", "/dev/zero", "runs", timeout=30, preexec_fn=_memory_cap)
    refused(r, "is not a regular file")


def test_fleet_dump_into_something_that_is_not_a_directory_is_refused(amdflash, tmp_path):
    target = tmp_path / "dumps"
    target.write_bytes(b"keep me")
    refused(amdflash("fleet", "dump", target), "exists and is not a directory")
    assert target.read_bytes() == b"keep me"


# -- errors with a path and a state (issue 27, item 8) ----------------------------------------------

def test_a_misspelled_command_is_named_before_any_option_hint(amdflash, tmp_path):
    r = amdflash("flsh", tmp_path / "img.bin", "--yes")
    refused(r, "unknown command 'flsh'; did you mean 'flash'?")
    assert "goes after the command" not in r.err


def test_a_misspelled_global_option_suggests_the_right_one(amdflash):
    refused(amdflash("--versoin"), "unknown option '--versoin'; did you mean '--version'?")


@pytest.fixture
def tmpfs(tmp_path):
    """mount(MiB, read_only) -> a directory on a file system of its own (tmpfs; needs root)."""
    mounted: list[Path] = []

    def mount(mib: int, read_only: bool = False) -> Path:
        where = tmp_path / f"fs{len(mounted)}"
        where.mkdir()
        options = f"size={mib}m" + (",ro" if read_only else "")
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs here ({done.stderr.strip()}): needs root")
        mounted.append(where)
        return where
    yield mount
    for where in mounted:
        subprocess.run(["umount", str(where)], capture_output=True)


def _dump_refused(amdflash, make_board, output: Path, needle: str) -> None:
    board = make_board(transport="ideal")
    before = untouched(board)
    r = amdflash("--no-progress", "dump", output, "--board", f"sim:{board}")
    refused(r, f"cannot write dump {output}: ")
    assert needle in r.err, r.err
    assert untouched(board) == before and not Path(os.environ["AMDFLASH_DB"]).exists()   # no run was started
    assert not [p for p in output.parent.iterdir() if p.name.startswith(".amdflash-")]


def test_a_dump_that_cannot_fit_is_refused_before_the_run(amdflash, make_board, tmpfs):
    where = tmpfs(1)
    _dump_refused(amdflash, make_board, where / "x.bin", f"{where} has 1024 KiB free on its file system, "
                                                          "2048 KiB are needed")


def test_a_dump_onto_a_read_only_mount_is_called_that(amdflash, make_board, tmpfs):
    where = tmpfs(4, read_only=True)
    _dump_refused(amdflash, make_board, where / "x.bin", f"{where} is on a read-only file system (mounted ro)")


def test_a_dump_into_proc_is_refused_before_the_run(amdflash, make_board):
    board = make_board(transport="ideal")
    r = amdflash("--no-progress", "dump", "/proc/x.bin", "--board", f"sim:{board}")
    refused(r, "cannot write dump /proc/x.bin: /proc is on a proc file system")
    assert ".partial" not in r.err and "Errno" not in r.err


def test_a_disk_that_fills_while_a_file_is_written_names_the_file_not_its_partial(tmpfs):
    from amdflash.pipeline.errors import one_line
    from amdflash.stages.files import write_new

    where = tmpfs(1)
    with pytest.raises(OSError) as raised:
        write_new(where / "out.bin", bytes(2 << 20))
    assert one_line(raised.value) == f"writing {where / 'out.bin'}: no space left on the file system (ENOSPC)"
    assert list(where.iterdir()) == []          # the partial file is gone


def test_an_audit_database_on_a_read_only_mount_is_called_that(amdflash, make_board, tmpfs):
    where = tmpfs(4, read_only=True)
    board = make_board(transport="ideal")
    r = amdflash("--db", where / "audit.sqlite", "info", "--board", f"sim:{board}")
    refused(r, f"audit database {where / 'audit.sqlite'} is not writable: {where} is on a read-only file system "
               "(mounted ro)")


@pytest.mark.parametrize("command", [["runs"], ["report", "20261204T000000-00000000"], ["audit", "verify"]])
def test_no_database_names_the_line_s_trail_where_this_machine_has_one(amdflash, tmp_path, monkeypatch, command):
    """On a line host the units write /var/lib/amdflash/audit.sqlite; the host's account running
    `amdflash runs` without --db looks in its own data directory, and is told where the trail is
    (a line brought up from the README)."""
    from amdflash.pipeline import config

    missing = tmp_path / "nowhere" / "audit.sqlite"
    line_db = tmp_path / "var-lib-amdflash" / "audit.sqlite"
    monkeypatch.setattr(config, "LINE_DB", str(line_db))
    said = amdflash("--db", str(missing), *command)
    assert said.code == 2 and f"no audit database at {missing}" in said.err and str(line_db) not in said.err
    line_db.parent.mkdir()
    line_db.write_bytes(b"")
    said = amdflash("--db", str(missing), *command)
    assert said.code == 2 and f"line services write theirs at {line_db} (--db {line_db})" in said.err, said.err
