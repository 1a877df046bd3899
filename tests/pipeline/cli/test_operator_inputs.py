"""What a new operator types wrong, and what amdflash says back: nothing lost, refused before
anything runs (exit 2) with the file or key named, and results in the form asked for."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest


def runs(amdflash) -> list[dict]:  # noqa: ANN001
    r = amdflash("runs", "--format", "json")
    return json.loads(r.out) if r.code == 0 else []


# -- nothing the user did not ask to lose is overwritten ------------------------------------------

def test_dump_refuses_an_existing_file_unless_overwrite(amdflash, make_board, tmp_path):
    board = make_board(transport="ideal")
    known_good = tmp_path / "s1.bin"
    known_good.write_bytes(b"known good image")
    r = amdflash("dump", known_good, "--reads", "1", "--board", f"sim:{board}")
    assert r.code == 2 and f"{known_good} exists" in r.err and "--overwrite" in r.err, r.err
    assert known_good.read_bytes() == b"known good image" and runs(amdflash) == []
    r = amdflash("dump", known_good, "--reads", "1", "--overwrite", "--board", f"sim:{board}")
    assert r.code == 0, r.err
    assert known_good.stat().st_size == 0x200000


@pytest.mark.parametrize("argv", [
    ("read", "0", "16", "-o", "{out}", "--board", "sim:{board}"),
    ("report", "{run}", "-o", "{out}"),
    ("audit", "export", "-o", "{out}"),
    ("audit", "key", "-o", "{out}"),
    ("audit", "datasette-metadata", "-o", "{out}"),
    ("man", "-o", "{out}"),
    ("sim", "image", "{board}", "-o", "{out}"),
    ("sim", "synth", "-o", "{out}"),
])
def test_every_output_refuses_an_existing_file_unless_overwrite(amdflash, make_board, tmp_path, argv):
    board = make_board(transport="ideal")
    assert amdflash("info", "--board", f"sim:{board}").code == 0
    run = runs(amdflash)[0]["run_id"]
    out = tmp_path / "taken"
    out.write_text("keep me")
    filled = [a.format(out=out, board=board, run=run) for a in argv]
    r = amdflash(*filled)
    assert r.code == 2 and "exists" in r.err and "--overwrite" in r.err, (r.code, r.err)
    assert out.read_text() == "keep me"
    r = amdflash(*filled, "--overwrite")
    assert r.code == 0, r.err
    assert out.read_bytes() != b"keep me"


# -- names the trail cannot record or the file system cannot hold ----------------------------------

def test_a_path_that_is_not_utf8_is_refused_before_anything_runs(amdflash, make_board, image, tmp_path):
    board = make_board(transport="ideal")
    odd = os.fsdecode(bytes(tmp_path) + b"/dump-\xff.bin")
    r = amdflash("dump", odd, "--board", f"sim:{board}")
    assert r.code == 2 and "not valid UTF-8" in r.err and "\\xff" in r.err, r.err
    assert not os.path.exists(odd) and runs(amdflash) == []
    odd_image = os.fsdecode(bytes(tmp_path) + b"/image-\xfe.bin")
    Path(odd_image).write_bytes(image.read_bytes())
    r = amdflash("flash", odd_image, "--yes", "--board", f"sim:{board}")
    assert r.code == 2 and "not valid UTF-8" in r.err and "\\xfe" in r.err, r.err
    assert runs(amdflash) == []


def test_a_name_too_long_for_the_file_system_is_refused_before_the_run(amdflash, make_board, tmp_path):
    r = amdflash("dump", tmp_path / ("d" * 300 + ".bin"), "--board", f"sim:{make_board(transport='ideal')}")
    assert r.code == 2 and "file name is 304 bytes long" in r.err, r.err
    assert runs(amdflash) == []


def test_a_database_in_a_missing_directory_is_refused_not_created(amdflash, make_board, tmp_path):
    where = tmp_path / "nonexistent" / "dir" / "a.sqlite"
    r = amdflash("info", "--board", f"sim:{make_board(transport='ideal')}", "--db", where)
    assert r.code == 2 and "does not exist" in r.err and str(where.parent) in r.err, r.err
    assert not (tmp_path / "nonexistent").exists()


# -- the config file, named -------------------------------------------------------------------------

@pytest.mark.parametrize("line, says", [
    ("prescale = 99", "prescale = 99: must be 0..15"),
    ('rx_mode = "prime"', "rx_mode = 'prime': must be 'chained' or 'primed'"),
    ('prescale = "fast"', "prescale = 'fast': must be a whole number"),
    ("reads = true", "reads = True: must be a whole number"),
])
def test_a_bad_config_value_names_the_file_and_the_key(amdflash, make_board, tmp_path, line, says):
    config = tmp_path / "amdflash.toml"
    config.write_text(line + "\n")
    r = amdflash("info", "--board", f"sim:{make_board(transport='ideal')}", "--config", config)
    assert r.code == 2 and f"config file {config}: {says}" in r.err, r.err
    assert "--prescale" not in r.err and "--rx-mode" not in r.err


# -- the command line -----------------------------------------------------------------------------

def test_an_option_before_the_command_says_where_it_goes(amdflash):
    r = amdflash("--board", "sim:b1", "info")
    assert r.code == 2 and "--board goes after the command" in r.err and "unknown command" not in r.err, r.err


def test_log_json_ends_each_run_with_a_structured_event(amdflash, make_board):
    board = make_board(transport="ideal")
    r = amdflash("--log-json", "info", "--board", f"sim:{board}")
    assert r.code == 0, r.err
    events = [json.loads(line) for line in r.err.splitlines()]
    [end] = [e for e in events if e.get("event_kind") == "run_end"]
    assert end["status"] == "succeeded" and end["exit_code"] == 0 and end["run_id"] == runs(amdflash)[0]["run_id"]
    assert end["report"] == f"amdflash --db {os.environ['AMDFLASH_DB']} report -- {end['run_id']}" and end["board"] == f"sim:{board}"
    assert not any(str(e.get("event", "")).startswith("run ") and "succeeded" in e["event"] for e in events)


def test_read_json_prints_the_bytes_with_the_run(amdflash, make_board):
    board = make_board(transport="ideal")
    r = amdflash("read", "0", "16", "--json", "--board", f"sim:{board}")
    assert r.code == 0, r.err
    shown = json.loads(r.out)
    assert shown["command"] == "read" and shown["status"] == "succeeded"
    as_text = amdflash("read", "0", "16", "--board", f"sim:{board}")
    assert len(bytes.fromhex(shown["data"])) == 16 and shown["data"] == as_text.out.strip()


def test_aperture_dump_on_a_board_without_the_raw_controller_is_refused(amdflash, make_board, tmp_path):
    board = make_board(transport="ideal", no_raw_rom=True)
    r = amdflash("dump", tmp_path / "a.bin", "--via", "aperture", "--board", f"sim:{board}")
    assert r.code == 2 and "raw SMUIO ROM controller is unavailable" in r.err and "--via rom-sw" in r.err, r.err
    assert not (tmp_path / "a.bin").exists()
    assert runs(amdflash)[0]["status"] == "refused"


def test_a_missing_extra_is_a_usage_error_naming_it(amdflash, monkeypatch):
    """labgrid (the fleet commands) and psycopg (the central record) come with the `fleet`
    extra; without either, the command says what to install and exits 2, the same way."""
    import sys

    monkeypatch.setitem(sys.modules, "labgrid", None)
    monkeypatch.setitem(sys.modules, "psycopg", None)
    for argv, extra in ((("fleet", "info", "--hosts", "hosta"), "labgrid"),
                        (("fleet", "runs", "--from", "postgresql:///central"), "psycopg")):
        r = amdflash(*argv)
        assert r.code == 2 and extra in r.err and "pip install 'amdflash[fleet]'" in r.err, (argv, r.err)


@pytest.mark.parametrize("name", ["eve\nresult     sha256 FORGED", "\x1b[2Jclean", "x" * 257, "",
                                  "admin\u202egnp.exe"])
def test_an_operator_name_the_trail_cannot_show_as_one_line_is_refused_before_the_run(amdflash, make_board, tmp_path,
                                                                                       name):
    """--operator is shown in every report of the run and carried to each host by a fleet job: a
    newline would forge a report line, an escape repaint a terminal (a review of the fleet's
    operator claim)."""
    db = tmp_path / "op.sqlite"
    said = amdflash("--db", db, "--operator", name, "info", "--board", f"sim:{make_board()}")
    assert said.code == 2 and "--operator" in said.err and "one line of printable text" in said.err, said
    assert not db.exists()                        # refused before the trail was opened
    assert amdflash("--db", db, "--operator", "J. Auditor (QA), ticket #4711", "info",
                    "--board", f"sim:{make_board()}").code == 0


def test_the_fleet_client_refuses_the_same_names() -> None:
    import argparse

    from amdflash.pipeline.cli.fleet import _operator
    from amdflash.pipeline.errors import Refusal

    with pytest.raises(Refusal, match="one line of printable text"):
        _operator(argparse.Namespace(operator="a" * 300))
