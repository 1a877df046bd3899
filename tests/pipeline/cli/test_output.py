"""Output discipline: results on stdout, messages on stderr, -q silent, -v/-vv every layer,
--log-json pure JSON, global options anywhere, --json per board, quiet broken pipes."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from amdflash.pipeline.cli.main import build_parser
from tests.pipeline.cli.conftest import flash_content
from tests.support import cli


def test_quiet_flash_prints_nothing_on_success(amdflash, make_board, image):
    board = make_board(content="blank", transport="ideal")
    r = amdflash("flash", image, "--yes", "--expect-part", "SYNTH-0001", "--board", f"sim:{board}", "-q")
    assert r.code == 0 and r.out == "" and r.err == ""
    assert flash_content(board) == image.read_bytes()


def test_without_q_the_result_is_on_stdout_and_the_run_on_stderr(amdflash, make_board, image):
    board = make_board(content="blank", transport="ideal")
    r = amdflash("flash", image, "--yes", "--expect-part", "SYNTH-0001", "--board", f"sim:{board}", "--no-progress")
    assert r.code == 0
    assert "part number check: expected" in r.out
    assert r.out.splitlines()[-1].startswith("flashed 512 units:")
    # On stderr: the backup, named the moment it is complete (a run killed after it said it), then the run.
    [backup, line] = r.err_lines
    assert backup.startswith(f"sim:{board}: backup of the original content: "), backup
    assert line.startswith("run ") and line.endswith(": succeeded")


def test_quiet_still_shows_what_was_asked_for(amdflash, make_board):
    board = make_board(transport="ideal")
    r = amdflash("-q", "info", "--board", f"sim:{board}")
    assert r.code == 0 and "JEDEC capture c8 60 15" in r.out and r.err == ""


def test_global_options_are_accepted_after_the_command(amdflash, make_board, image, tmp_path):
    board = make_board(content="blank", transport="ideal")
    db = tmp_path / "elsewhere.sqlite"
    r = amdflash("verify", image, "--board", f"sim:{board}", "--db", db, "-q", "--no-progress")
    assert r.code == 1 and r.out == ""
    assert db.exists()
    assert amdflash("runs", "--db", db, "-q").out.split()[1:3] == ["verify", "failed"]
    assert amdflash("audit", "verify", "--db", db).code == 0


def test_v_and_q_contradict(amdflash):
    r = amdflash("-v", "runs", "-q")
    assert r.code == 2 and "contradict" in r.err


def test_verbose_shows_debug_events_from_every_layer(amdflash, make_board, image):
    board = make_board(content="blank", transport="ideal")
    r = amdflash("flash", image, "--yes", "--expect-part", "SYNTH-0001", "--board", f"sim:{board}", "-v", "--no-progress", "--sector-count", "2")
    assert r.code == 0, r.err
    layers = {line.split("layer=")[1].split()[0] for line in r.err_lines if "layer=" in line}
    assert {"run", "stage", "identify", "navi31", "flash"} <= layers, layers
    assert not any("layer=transport" in line or "layer=rom_sw" in line for line in r.err_lines)
    rr = amdflash("info", "--board", f"sim:{board}", "-vv", "--no-progress")
    assert any("register write" in line and "layer=transport" in line and "offset=0x5a" in line
               for line in rr.err_lines)
    assert any("spi transaction" in line and "layer=rom_sw" in line and "opcode=0x9f" in line
               for line in rr.err_lines)


def test_log_json_makes_stderr_pure_json_lines(amdflash, make_board, image):
    board = make_board(content="blank", transport="ideal")
    good = amdflash("--log-json", "flash", image, "--yes", "--expect-part", "SYNTH-0001", "--board", f"sim:{board}")
    bad = amdflash("--log-json", "flash", image, "--board", f"sim:{board}")            # no --yes
    missing = amdflash("--log-json", "info", "--board", "usb:zz")
    typo = amdflash("--log-json", "flsh")
    for r in (good, bad, missing, typo):
        events = [json.loads(line) for line in r.err_lines]      # every line parses
        assert events, r
    progress = [e for e in (json.loads(x) for x in good.err_lines) if e["event"] == "progress" and "stage" in e]
    assert progress and all(isinstance(e["done"], int) and isinstance(e["total"], int) for e in progress)
    assert {e["stage"] for e in progress} == {"backup", "erase", "program", "verify"}
    [error] = [json.loads(x) for x in bad.err_lines]
    assert error["level"] == "error" and "--yes" in error["event"] and bad.code == 2
    assert json.loads(typo.err_lines[0])["event"].startswith("unknown command 'flsh'; did you mean 'flash'?")


@pytest.mark.slow   # a long scenario: CI runs it (pytest -m slow)
def test_json_is_one_object_per_board_with_the_report_keys(amdflash, make_board, image):
    boards = [make_board(content="blank", transport="ideal") for _ in range(2)]
    specs = [a for b in boards for a in ("--board", f"sim:{b}")]
    r = amdflash("flash", image, "--yes", "--expect-part", "SYNTH-0001", *specs, "--json", "--no-progress")
    assert r.code == 0, r.err
    objects = [json.loads(line) for line in r.out.splitlines()]
    assert [o["board"]["spec"] for o in objects] == [f"sim:{b}" for b in boards]
    report = json.loads(amdflash("report", objects[0]["run_id"], "--format", "json").out)
    assert objects[0] == report
    for command in (("info",), ("verify", image), ("dump", "--help")):
        if command[-1] == "--help":
            continue
        out = amdflash(*command, "--board", f"sim:{boards[0]}", "--json", "-q").out
        assert set(json.loads(out)) == set(report)


def test_version_comes_from_the_installed_metadata(amdflash):
    from importlib.metadata import version

    r = amdflash("--version")
    assert r.code == 0 and r.out.strip() == f"amdflash {version('amdflash')}"
    assert amdflash("runs", "--version").out == r.out


@pytest.mark.parametrize("typed,suggestion", [
    (("verfy", "x.bin"), "did you mean 'verify'?"),
    (("runs", "--fromat", "json"), "did you mean '--format'?"),
    (("flash", "x.bin", "--yse"), "did you mean '--yes'?"),
    (("sim", "creat", "x"), "did you mean 'create'?"),
])
def test_typos_get_a_suggestion(amdflash, typed, suggestion):
    r = amdflash(*typed)
    assert r.code == 2 and suggestion in r.err and len(r.err_lines) == 1


@pytest.mark.slow   # a long scenario: CI runs it (pytest -m slow)
def test_a_closed_pipe_ends_output_quietly(make_board, tmp_path):
    board = make_board(transport="ideal")
    for _ in range(3):
        cli.run("info", "--board", f"sim:{board}", "-q").check_returncode()
    reader = subprocess.Popen([sys.executable, "-m", "amdflash", "read", "0", "0x200000", "--board", f"sim:{board}",
                               "-q"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert reader.stdout is not None and reader.stderr is not None
    reader.stdout.readline()
    reader.stdout.close()                            # like `| head -1`
    err = reader.stderr.read().decode()
    assert reader.wait(timeout=120) == 0, err
    assert err == ""


def _actions(parser: argparse.ArgumentParser, path: str = "amdflash"):  # noqa: ANN202
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _actions(child, f"{path} {name}")
        else:
            yield path, action


def test_every_argument_has_help_text():
    missing = [f"{path} {action.dest}" for path, action in _actions(build_parser())
               if not action.help and action.dest != "help"]
    assert missing == []


# -- words a technician reads at 3 a.m. (issue 27, item 10) -----------------------------------------

@pytest.mark.slow
def test_the_final_progress_line_says_each_stage_once(amdflash, make_board, image, tmp_path):
    board = make_board(content="blank", transport="ideal")
    img = bytearray(image.read_bytes())
    assert amdflash("-q", "flash", image, "--yes", "--expect-part", "SYNTH-0001", "--board", f"sim:{board}").code == 0
    at = next(a for a in range(0x100000, len(img)) if img[a] != 0xFF)
    img[at] = 0xFF                   # a 0 bit back to 1: one unit to erase and program again
    changed = tmp_path / "changed.bin"
    changed.write_bytes(img)
    r = amdflash("flash", changed, "--yes", "--board", f"sim:{board}")
    assert r.code == 0, r.err
    # Off a terminal a line comes every 5 s while the run lasts (on a busy machine, one or more
    # before the end): the run's final line is the last.
    lines = [line for line in r.err_lines if line.startswith(f"sim:{board}: backup")]
    final = lines[-1]
    assert not any(line.endswith("; done") for line in lines[:-1]), lines
    assert final == (f"sim:{board}: backup 2.00 MiB/2.00 MiB; erase 2.00 MiB/2.00 MiB (4 KiB erased); "
                     "program 2.00 MiB/2.00 MiB; verify 2.00 MiB/2.00 MiB; done"), final


def test_counts_are_said_in_the_singular_for_one():
    from amdflash.pipeline.engine.next_step import flash_state
    from amdflash.store.read_checks import describe

    assert flash_state({"units": [{"state": "erased"}, {"state": "programmed"}, {"state": "programmed"}]}) == \
        "the flash is partly written: 1 unit erased (or about to be) and not programmed, 2 units programmed and " \
        "not verified"
    one = {"units": 1, "matched": 1, "mixed": 0, "agreeing": 0, "single": 0, "matched_what": "the image"}
    line = describe({"policy": "2 agreeing reads", "confirmation": {"backup": one}, "disagreed_reads": 0})
    assert "backup: 1 unit matched the image" in line, line


@pytest.mark.slow
def test_reports_round_numbers_and_explain_an_unsynchronised_clock_once(amdflash, make_board, image, tmp_path,
                                                                       monkeypatch):
    from amdflash.pipeline.engine import run_facts

    monkeypatch.setattr(run_facts, "clock_sync", lambda: "unsynchronised (kernel adjtimex)")
    board = make_board(content="blank", transport="ideal")
    assert amdflash("-q", "flash", image, "--yes", "--expect-part", "SYNTH-0001", "--board", f"sim:{board}").code == 0
    run = json.loads(amdflash("runs", "--format", "json").out)[-1]["run_id"]
    page = tmp_path / "run.html"
    assert amdflash("-q", "report", run, "--format", "html", "-o", page).code == 0
    text = amdflash("report", run).out
    import re

    for shown in (page.read_text(), text):
        assert not re.search(r"\d\.\d{7,}", shown), re.search(r".{40}\d\.\d{7,}", shown)   # 0.28800000000000003
        assert shown.count("timestamps may be off from real time") == 1
    assert "maximum s 0.288" in page.read_text()
    assert "clock" not in amdflash("runs").out


def _depth(text: str) -> int:
    deepest = depth = 0
    for c in text:
        depth += {"(": 1, ")": -1}.get(c, 0)
        deepest = max(deepest, depth)
    return deepest


def test_the_part_number_refusal_says_one_fact_per_clause(amdflash, make_board, image):
    board = make_board(content="blank", transport="ideal")
    r = amdflash("--no-progress", "flash", image, "--yes", "--board", f"sim:{board}")
    assert r.code == 2, r.err
    [line] = r.err_lines
    assert line.startswith("error: the board's flash is blank: the EFS reads all FF, as erased. "), line
    assert "If it is, pass --expect-part SYNTH-0001, or --force" in line, line
    assert _depth(line) == 1, line          # only "(run …, refused)": nothing nested
