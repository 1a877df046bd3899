"""Issue 27 (items 2, 3): the board's original is kept across runs, and every backup printed
can be written back by the command printed beside it.

A flash killed while it writes (the emulator's kill-after-writes fault: the host dies just
before its Nth register write, deterministic) leaves the board half written; a fresh `flash`
must not call what it then finds "the original", nor quietly overwrite a flash the operator
could resume."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import signal
from pathlib import Path

import pytest

from amdflash.stages.sim import Board, create_board
from amdflash.stages.sim.synth import PART_KEY, synthetic_ifwi
from tests.pipeline.engine.conftest import flash_content
from tests.support import cli

SEED = 5


def content(image: bytes) -> bytes:
    """What the board holds first: the image with units that need an erase, a 64 KiB block
    and a program-only unit changed (deterministic, so the kill point is too)."""
    out = bytearray(image)
    out[0x0000:0x1000] = bytes(0x1000)
    out[0x30000:0x40000] = bytes(range(256)) * 256
    out[0x1F0000:0x1F0100] = b"\xff" * 0x100
    return bytes(out)


def cli_process(*args: object) -> cli.Result:
    """amdflash as its own process (it may be killed), with this test's environment."""
    return cli.run_process("--no-progress", *args)


def run_printed(amdflash, command: str):
    """A command exactly as amdflash printed it, split as a shell would."""
    words = shlex.split(command)
    assert words[0] == "amdflash", command
    return amdflash("--no-progress", *words[1:])


def printed(text: str, after: str) -> str:
    """The command printed after `after` up to the end of its clause ('; ' or ')' or the line)."""
    found = re.search(re.escape(after) + r"(amdflash [^;)\n]*)", text)
    assert found, (after, text)
    return found.group(1).strip()


_REFERENCE_WRITES: dict[tuple[bytes, bytes], int] = {}


def reference_writes(tmp_path: Path, image: Path, first: bytes) -> int:
    """Register writes of an undisturbed flash of `image` over `first` on a board like the
    killed one (the same for every test that asks: one reference flash per process)."""
    key = (hashlib.sha256(image.read_bytes()).digest(), hashlib.sha256(first).digest())
    if key not in _REFERENCE_WRITES:
        ref = create_board(tmp_path / "reference", content=first, transport="ideal", seed=SEED)
        refdb = tmp_path / "reference.sqlite"
        assert cli.run("--no-progress", "--db", refdb, "-q", "flash", image, "--yes", "--expect-part", PART_KEY,
                       "--board", f"sim:{ref}").returncode == 0
        with Board(ref) as b:
            _REFERENCE_WRITES[key] = int(b.stats()["reg_writes"])
    return _REFERENCE_WRITES[key]


@pytest.fixture
def killed(tmp_path: Path, image: Path) -> dict:
    """A board whose flash was killed while writing units: the board, its first content, the
    killed run and the backup it made."""
    first = content(image.read_bytes())
    total = reference_writes(tmp_path, image, first)
    # Just before the end: units are being written (the backup, which reads all 512, is long over).
    board = create_board(tmp_path / "board", content=first, transport="ideal", seed=SEED,
                         faults=[f"kill-after-writes={total * 99 // 100}"])
    p = cli_process("flash", image, "--yes", "--expect-part", PART_KEY, "--board", f"sim:{board}")
    assert p.returncode == -signal.SIGKILL, p.stderr
    runs = json.loads(cli.run("--no-progress", "runs", "--format", "json").stdout)
    [backup] = list((tmp_path / "backups").glob("*.bin"))
    assert backup.read_bytes() == first
    half = flash_content(board)
    assert half != first and half != image.read_bytes()          # half written, truly
    return {"board": board, "first": first, "run": runs[-1]["run_id"], "backup": backup.resolve(), "half": half}


@pytest.mark.slow
def test_a_fresh_flash_after_a_killed_one_refuses_naming_the_resume_and_the_original(amdflash, image, killed,
                                                                                    isolated):
    board, run = killed["board"], killed["run"]
    db = isolated / "audit.sqlite"
    r = amdflash("--no-progress", "--db", db, "flash", image, "--yes", "--expect-part", PART_KEY,
                 "--board", f"sim:{board}")
    assert r.code == 2, r.err
    assert f"flash run {run} of this board never finished (interrupted" in r.err, r.err
    assert f"the board's original content: backup {killed['backup']} (run {run})" in r.err, r.err
    assert flash_content(board) == killed["half"]                 # nothing was written
    # The resume step, as printed (with the --db this command was given), finishes the flash.
    resume = printed(r.err, "Finish it: ")
    assert shlex.split(resume) == ["amdflash", "--db", str(db), "resume", "--board", f"sim:{board}", "--yes", "--", run]
    done = run_printed(amdflash, resume)
    assert done.code == 0, done.err
    assert flash_content(board) == image.read_bytes()


@pytest.mark.slow
def test_a_flash_whose_resume_was_killed_too_is_finished_from_either_run(amdflash, image, killed):
    """The flash killed while writing units, then its resume killed before it wrote: both
    reports say what the flash holds (the flash's half-written units: the resume's own rows
    only plan them) and name the resume that carries on from the newest run; and `resume` of
    the first run, the step its report printed before, goes on from there too (it was
    refused as overwriting what the resume wrote)."""
    board, first = killed["board"], killed["run"]
    assert amdflash("sim", "fault", board, "--clear", "kill-after-writes=3000").code == 0
    p = cli_process("resume", first, "--yes", "--board", f"sim:{board}")
    assert p.returncode == -signal.SIGKILL, p.stderr
    assert flash_content(board) == killed["half"]
    second = json.loads(amdflash("runs", "--format", "json").out)[-1]
    assert second["command"] == "resume" and second["status"] == "interrupted", second
    assert amdflash("sim", "fault", board, "--clear").code == 0
    for run in (first, second["run_id"]):
        end = json.loads(amdflash("report", run, "--format", "json").out)["outcome"]
        assert end["state"].startswith("the flash is partly written: "), (run, end)
        resume = printed(end["next_step"], "To finish the flash: ")
        assert shlex.split(resume)[3:] == ["resume", "--board", f"sim:{board}", "--yes", "--", second["run_id"]], resume
    done = amdflash("--no-progress", "resume", first, "--yes", "--board", f"sim:{board}")
    assert done.code == 0, done.err
    assert flash_content(board) == image.read_bytes()
    runs = json.loads(amdflash("runs", "--format", "json").out)
    assert [(r["command"], r["status"]) for r in runs] == [("flash", "interrupted"), ("resume", "interrupted"),
                                                           ("resume", "succeeded")], runs
    assert runs[-1]["resumes_run_id"] == second["run_id"]


@pytest.mark.slow
def test_start_over_says_which_backup_holds_the_original_and_restore_original_puts_it_back(amdflash, image,
                                                                                        killed, tmp_path):
    board, run = killed["board"], killed["run"]
    r = amdflash("--no-progress", "flash", image, "--yes", "--expect-part", PART_KEY, "--board", f"sim:{board}",
                 "--start-over")
    assert r.code == 0, r.err
    assert flash_content(board) == image.read_bytes()
    [line] = [x for x in r.out.splitlines() if x.startswith("backup of")]
    assert line.startswith("backup of the content as found: ") and "original content" not in line, line
    assert re.search(rf"\(\d+ units? written by run {run}, which did not finish\)", line), line
    assert f"the board's original: {killed['backup']} (run {run}" in line, line
    # The record says so too: the new run's own sealed rows name the original's backup.
    new_run = json.loads(amdflash("runs", "--format", "json").out)[-1]["run_id"]
    report = json.loads(amdflash("report", new_run, "--format", "json").out)
    [row] = [s for s in report["stages"] if s["stage"] == "backup" and s["event"] == "original"]
    said = json.loads(row["detail"])
    assert said["original"]["run_id"] == run and said["original"]["path"] == str(killed["backup"])
    assert said["this_backup"] == "content as found" and said["unfinished"]["run_id"] == run
    # The original, put back by the command printed beside it.
    back = run_printed(amdflash, printed(line, "the board's original: " + str(killed["backup"]) + f" (run {run}; "
                                         "to put it back: "))
    assert back.code == 0, back.err
    assert flash_content(board) == killed["first"]
    # And the half-written content, by the command printed beside its own backup.
    back = run_printed(amdflash, printed(line, "to put it back: "))
    assert back.code == 0, back.err
    assert flash_content(board) == killed["half"]


def test_info_names_the_unfinished_flash_its_original_and_the_resume(amdflash, killed):
    r = amdflash("info", "--board", f"sim:{killed['board']}")
    assert r.code == 0, r.err
    [line] = [x for x in r.out.splitlines() if x.startswith("unfinished flash")]
    assert f"unfinished flash {killed['run']} on this board (interrupted, " in line, line
    assert f"the board's original: backup {killed['backup']} (run {killed['run']})" in line, line
    assert f"amdflash --db {os.environ['AMDFLASH_DB']} resume --board sim:{killed['board']} --yes -- {killed['run']}" \
        in line, line
    assert f"original    backup {killed['backup']} (run {killed['run']}, intact)" in r.out, r.out


def test_restore_original_refuses_a_backup_that_no_longer_matches_its_record(amdflash, killed):
    board = killed["board"]
    killed["backup"].chmod(0o600)
    data = bytearray(killed["backup"].read_bytes())
    data[0x1000] ^= 0x01                                          # one bit flipped on disk
    killed["backup"].write_bytes(bytes(data))
    r = amdflash("restore-original", "--board", f"sim:{board}", "--yes")
    assert r.code == 2, r.err
    assert str(killed["backup"]) in r.err and "no longer matches the sha256 on record" in r.err, r.err
    assert flash_content(board) == killed["half"]


@pytest.mark.slow
def test_a_range_flash_backup_is_put_back_by_the_command_printed_beside_it(amdflash, make_board, tmp_path):
    board = make_board(transport="ideal")
    first = flash_content(board)
    other = tmp_path / "other.bin"
    other.write_bytes(synthetic_ifwi(77))
    r = amdflash("--no-progress", "flash", other, "--yes", "--force", "--start-sector", "256", "--sector-count", "2",
                 "--board", f"sim:{board}")
    assert r.code == 0, r.err
    assert flash_content(board) != first
    [line] = [x for x in r.out.splitlines() if x.startswith("backup of the original content: ")]
    back = run_printed(amdflash, printed(line, "to put it back: "))
    assert back.code == 0, back.err
    assert flash_content(board) == first
    # restore-original does the same from the record alone, after a range flash and then a whole
    # one: the whole flash's backup holds the range as the range flash left it, so the range's
    # own backup is written after it.
    assert amdflash("flash", other, "--yes", "--force", "--start-sector", "256", "--sector-count", "2",
                    "--board", f"sim:{board}").code == 0
    assert amdflash("flash", other, "--yes", "--force", "--board", f"sim:{board}").code == 0
    assert flash_content(board) == other.read_bytes() != first
    r = amdflash("restore-original", "--board", f"sim:{board}", "--yes")
    assert r.code == 0, r.err
    assert flash_content(board) == first


@pytest.mark.slow
def test_a_flash_that_failed_after_writing_is_refused_too_and_its_advice_puts_the_original_back(amdflash,
                                                                                              make_board, image):
    img = image.read_bytes()
    stuck = next(a for a in range(0x100000, len(img)) if img[a] & 0x01 == 0)    # a bit the image needs at 0
    board = make_board(transport="ideal", faults=[f"stuck-bit={stuck:#x}:0"])
    first = flash_content(board)
    r = amdflash("--no-progress", "flash", image, "--yes", "--force", "--board", f"sim:{board}")
    assert r.code == 1, r.err
    run = json.loads(amdflash("runs", "--format", "json").out)[-1]["run_id"]
    again = amdflash("flash", image, "--yes", "--force", "--board", f"sim:{board}")
    assert again.code == 2 and f"flash run {run} of this board never finished (failed; " in again.err, again.err
    # The failed run's advice names the original and a command that writes it back as printed.
    back = run_printed(amdflash, printed(r.err_lines[-1], "to put it back, "))
    assert back.code == 0, back.err
    assert flash_content(board) == first


@pytest.mark.slow
def test_a_started_over_flash_that_fails_names_the_first_original_and_its_resume_says_so(amdflash, image,
                                                                                       killed):
    board, run, img = killed["board"], killed["run"], image.read_bytes()
    # A bit the rest of the flash needs at 0, stuck at 1: the started-over flash fails after writing.
    unit = next(a for a in range(0, len(img), 0x1000) if killed["half"][a:a + 0x1000] != img[a:a + 0x1000])
    stuck = next(a for a in range(unit, unit + 0x1000) if img[a] & 0x01 == 0)
    assert amdflash("sim", "fault", board, "--clear", f"stuck-bit={stuck:#x}:0").code == 0
    r = amdflash("--no-progress", "flash", image, "--yes", "--expect-part", PART_KEY, "--board", f"sim:{board}",
                 "--start-over")
    assert r.code == 1, r.err
    advice = r.err_lines[-1]
    assert f"The original content is backup {killed['backup']} (run {run})" in advice, advice
    over = json.loads(amdflash("runs", "--format", "json").out)[-1]["run_id"]
    assert amdflash("sim", "fault", board, "--clear").code == 0
    done = amdflash("--no-progress", "resume", over, "--board", f"sim:{board}", "--yes")
    assert done.code == 0, done.err
    [line] = [x for x in done.out.splitlines() if x.startswith("backup of")]
    assert line.startswith(f"backup of the content as found by run {over}: "), line
    assert f"the board's original: {killed['backup']} (run {run}" in line, line
    assert flash_content(board) == img
    # The failed run's put-back, as printed, writes the original back.
    back = run_printed(amdflash, printed(advice, "to put it back, "))
    assert back.code == 0, back.err
    assert flash_content(board) == killed["first"]


@pytest.mark.slow
def test_a_run_that_never_identified_its_board_names_no_original(amdflash, make_board, image, monkeypatch):
    """`usb:0` reaches whichever bridge is first today. A flash through it recorded board P's
    original; the next day a flash through `usb:0` reached another board whose link never came
    up, so the run identified nothing — and its report named P's backup as "the board's
    original", with a `--force` flash of it to `usb:0` to put it back (an attack review): pasted,
    P's content goes onto another board. A run that knows its board only by an index spec
    names no original."""
    first = make_board("p")
    monkeypatch.setenv("AMDFLASH_SIM_USB", str(first))
    assert amdflash("flash", image, "--yes", "--expect-part", PART_KEY, "--board", "usb:0").code == 0
    other = make_board("n", bridge={"pcie_on_at_boot": False, "link_trains": False})
    monkeypatch.setenv("AMDFLASH_SIM_USB", str(other))
    failed = amdflash("flash", image, "--yes", "--expect-part", PART_KEY, "--board", "usb:0")
    assert failed.code == 1, failed.err
    run_id = json.loads(amdflash("runs", "--format", "json").out)[-1]["run_id"]
    report = amdflash("report", run_id)
    said = failed.out + failed.err + report.out
    assert report.code == 0 and "backups/" not in said and "original" not in said, said
    assert "--force" not in said, said


@pytest.mark.slow
def test_restore_original_knows_the_board_only_from_rows_a_checkpoint_seals(amdflash, make_board, image,
                                                                          monkeypatch):
    """`restore-original --board usb:0` takes the board's identity from the newest run that
    identified a board there. A `boards` row INSERTed without the key, with a blank unique ID,
    made the board known by its spec alone — and so no unique-ID check before writing board
    P's original onto whatever `usb:0` reaches now (an attack review). Only sealed rows count:
    the other board is refused and keeps its content."""
    first = make_board("p")
    monkeypatch.setenv("AMDFLASH_SIM_USB", str(first))
    assert amdflash("flash", image, "--yes", "--expect-part", PART_KEY, "--board", "usb:0").code == 0
    other = make_board("q")
    before = flash_content(other)
    db = os.environ["AMDFLASH_DB"]
    import sqlite3
    con = sqlite3.connect(db)
    chip = con.execute("SELECT chip FROM boards WHERE chip IS NOT NULL LIMIT 1").fetchone()[0]
    at = "2099-12-31T23:59:59+00:00"
    con.execute("INSERT INTO runs (run_id, command, arguments, operator, host, board_spec, at) "
                "VALUES ('20991231T235959-0badb0a7', 'info', '{}', 'root', 'hosta', 'usb:0', ?)", (at,))
    con.execute("INSERT INTO boards (run_id, spec, unique_id, chip, at) "
                "VALUES ('20991231T235959-0badb0a7', 'usb:0', '', ?, ?)", (chip, at))
    con.commit()
    con.close()
    monkeypatch.setenv("AMDFLASH_SIM_USB", str(other))
    r = amdflash("restore-original", "--board", "usb:0", "--yes")
    assert r.code != 0, r.out
    assert flash_content(other) == before


@pytest.mark.slow
def test_info_counts_as_written_since_only_runs_that_wrote(amdflash, image, killed):
    """After the killed flash, a new flash of the board is refused (it wrote nothing); `info`
    named it as the last run that wrote the board since its original (an attack review). A
    refused run is not counted; the resume that finished the flash is."""
    board, run = killed["board"], killed["run"]
    refused = amdflash("--no-progress", "flash", image, "--yes", "--expect-part", PART_KEY, "--board", f"sim:{board}")
    assert refused.code == 2 and "never finished" in refused.err, refused.err
    info = amdflash("info", "--board", f"sim:{board}")
    assert info.code == 0 and f"original    backup {killed['backup']} (run {run}, intact)\n" in info.out, info.out
    assert amdflash("resume", run, "--board", f"sim:{board}", "--yes").code == 0
    resume = json.loads(amdflash("runs", "--format", "json").out)[-1]["run_id"]
    info = amdflash("info", "--board", f"sim:{board}")
    assert f"(run {run}, intact); written since by 1 flash run, the last {resume}\n" in info.out, info.out
