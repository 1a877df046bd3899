"""Every way a board command can end badly says what state the board is in and what to do
next — and the run's end is on record (issue: "every run ends with a true status")."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import anyio
import pytest

from amdflash.stages.sim.synth import synthetic_ifwi
from tests.support import cli
from tests.pipeline.cli.conftest import flash_content


def first_differing_bit(image: bytes, start: int) -> int:
    return next(a for a in range(start, len(image)) if image[a] & 0x01 == 0)


def last_run(amdflash) -> dict:  # noqa: ANN001
    return json.loads(amdflash("runs", "--format", "json").out)[-1]


def test_a_flash_that_fails_verify_says_what_is_half_written_and_how_back(amdflash, make_board, image, tmp_path):
    img = image.read_bytes()
    stuck = first_differing_bit(img, 0x100000)
    board = make_board(transport="ideal", faults=[f"stuck-bit={stuck:#x}:0"])
    r = amdflash("--no-progress", "flash", image, "--yes", "--force", "--board", f"sim:{board}")
    assert r.code == 1
    run = last_run(amdflash)
    error, advice = r.err_lines[-2], r.err_lines[-1]
    assert error.startswith("error: verify failed at") and f"(run {run['run_id']}, failed)" in error, r.err
    assert advice.startswith("  next: the flash is partly written: ") and "failed verify" in advice, r.err
    backup = next(Path(tmp_path).glob("**/backups/*.bin"))
    assert f"The original content is backup {backup.resolve()}" in advice
    db = os.environ["AMDFLASH_DB"]                  # the run's own database, named in every step
    assert f"amdflash --db {db} flash --board sim:{board} --yes --force --start-over -- {backup.resolve()}" in advice
    assert f"amdflash --db {db} resume --board sim:{board} --yes -- {run['run_id']}" in advice
    assert run["status"] == "failed"


def _transfers(board: Path) -> int:
    shown = cli.run("sim", "stats", board)
    shown.check_returncode()
    stats = json.loads(shown.stdout)
    return int(stats["control_transfers"] + stats["bulk_transfers"])


def test_a_link_lost_mid_flash_says_the_same(amdflash, make_board, image, monkeypatch):
    argv = ("--no-progress", "flash", image, "--yes", "--force", "--sector-count", "32", "--board", "usb:0")
    clean = make_board(content="blank", transport="ideal", seed=7)
    monkeypatch.setenv("AMDFLASH_SIM_USB", str(clean))
    assert amdflash(*argv).code == 0
    whole = _transfers(clean)
    # The same board and job, its bridge gone near the end (while units are written and verified).
    board = make_board(content="blank", transport="ideal", seed=7,
                       faults=[f"usb-disconnect-after={whole * 19 // 20}"])
    monkeypatch.setenv("AMDFLASH_SIM_USB", str(board))
    r = amdflash(*argv)
    assert r.code == 1, r.err
    run = last_run(amdflash)
    assert "disconnected" in r.err and run["status"] == "failed", r.err
    assert "  next: the flash is partly written" in r.err, r.err
    assert f"amdflash --db {os.environ['AMDFLASH_DB']} resume --board usb:0 --yes -- {run['run_id']}" in r.err


def test_ifwi_all_that_fails_says_a_power_cycle_is_needed(amdflash, make_board, tmp_path):
    image = tmp_path / "ifwi.bin"
    image.write_bytes(synthetic_ifwi(3))
    board = make_board(transport="ideal", faults=["psp-error=0x9:0xC"])
    r = amdflash("--no-progress", "ifwi-all", image, "--yes", "--board", f"sim:{board}")
    assert r.code == 1, r.err
    assert "  next: the PSP bootloader may hold a partial stream: power the board off and on" in r.err, r.err
    [cycle] = pasted(r.err_lines[-1])
    assert cycle == ["amdflash", "--db", os.environ["AMDFLASH_DB"], "sim", "power-cycle", "--", str(board)], cycle


@pytest.mark.slow
def test_info_after_a_killed_flash_names_the_unfinished_run_and_the_resume(amdflash, make_board, image):
    board = make_board(content="blank", transport="ideal", faults=["kill-after-writes=52000"])  # past the backup: while writing
    killed = subprocess.run([sys.executable, "-m", "amdflash", "-q", "flash", str(image), "--yes", "--force",
                             "--board", f"sim:{board}"], capture_output=True, text=True, env=dict(os.environ))
    assert killed.returncode != 0
    run = last_run(amdflash)
    r = amdflash("info", "--board", f"sim:{board}")
    assert r.code == 0, r.err
    assert (f"unfinished flash {run['run_id']} on this board" in r.out
            and f"amdflash --db {os.environ['AMDFLASH_DB']} resume --board sim:{board} --yes -- {run['run_id']}" in r.out), r.out


@pytest.mark.slow   # a long scenario: CI runs it (pytest -m slow)
def test_resume_after_the_image_moved_suggests_naming_it(amdflash, make_board, image, tmp_path):
    board = make_board(content="blank", transport="ideal", faults=["kill-after-writes=52000"])  # past the backup: while writing
    subprocess.run([sys.executable, "-m", "amdflash", "-q", "flash", str(image), "--yes", "--force",
                    "--board", f"sim:{board}"], capture_output=True, text=True, env=dict(os.environ))
    run = last_run(amdflash)["run_id"]
    moved = tmp_path / "moved.bin"
    image.rename(moved)
    r = amdflash("resume", "--yes", "--board", f"sim:{board}")
    assert r.code == 2 and f"amdflash --db {os.environ['AMDFLASH_DB']} resume --board sim:{board} --image FILE --yes -- {run}" \
        in r.err, r.err
    assert amdflash("resume", "--yes", "--image", moved, "--board", f"sim:{board}").code == 0


# -- a full disk --------------------------------------------------------------------------------------

@pytest.fixture
def small_disk(tmp_path):
    """A file system of a few MiB of its own (tmpfs; needs root)."""
    where = tmp_path / "small"
    where.mkdir()

    def mount(mib: int) -> Path:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m", "tmpfs", str(where)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs here ({done.stderr.strip()}): needs root")
        return where
    yield mount
    subprocess.run(["umount", str(where)], capture_output=True)


def test_a_nearly_full_disk_refuses_before_the_run_naming_the_database(amdflash, make_board, small_disk):
    where = small_disk(6)
    r = amdflash("info", "--board", f"sim:{make_board(transport='ideal')}", "--db", where / "audit.sqlite")
    assert r.code == 2 and f"audit database {where / 'audit.sqlite'}: the file system has" in r.err, r.err


def _fill_once_backed_up(where: Path, leave: int) -> threading.Thread:
    """Fill the file system at `where` to `leave` bytes free once a flash's backup is complete
    (its file has its final name): the disk fills while the flash writes units, whatever else
    this machine is doing — not when the trail's own growth happens to cross the line."""
    def fill() -> None:
        while not [p for p in (where / "backups").glob("*.bin") if len(p.stem) == 64]:
            time.sleep(0.005)
        st = os.statvfs(where)
        (where / "filler").write_bytes(bytes(max(0, st.f_bavail * st.f_frsize - leave)))
    filler = threading.Thread(target=fill, daemon=True)
    filler.start()
    return filler


def test_a_disk_that_fills_during_a_flash_fails_the_run_on_record(amdflash, make_board, image, small_disk):
    where = small_disk(12)
    db = where / "audit.sqlite"
    # Other synthetic content (every unit is rewritten), in about 4 s of wall time after the backup.
    board = make_board(transport="ideal", realtime_scale=0.25)
    filler = _fill_once_backed_up(where, 3 << 20)       # below the 4 MiB the writer keeps for a run's end
    r = amdflash("--no-progress", "flash", image, "--yes", "--force", "--board", f"sim:{board}", "--db", db)
    filler.join(timeout=10)
    assert r.code == 1, r.err
    assert f"audit database {db}: the file system has" in r.err and "free some space" in r.err, r.err
    [run] = json.loads(amdflash("runs", "--format", "json", "--db", db).out)
    assert run["status"] == "failed"
    assert "  next: " in r.err and f"amdflash --db {db} resume --board sim:{board} --yes -- {run['run_id']}" in r.err


def test_sim_power_cycle_restarts_the_bootloader_after_ifwi_all(amdflash, make_board, tmp_path):
    image = tmp_path / "ifwi.bin"
    image.write_bytes(synthetic_ifwi(3))
    board = make_board(transport="ideal")
    assert amdflash("--no-progress", "ifwi-all", image, "--yes", "--board", f"sim:{board}").code == 0
    r = amdflash("probe", "--board", f"sim:{board}")
    assert "error 0x11" in r.out and " sim power-cycle " in r.out, r.out
    [cycle] = pasted(r.out)                       # the step as printed, run elsewhere
    assert cycle == ["amdflash", "--db", os.environ["AMDFLASH_DB"], "sim", "power-cycle", "--", str(board)], cycle
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = run_pasted(cycle, elsewhere)
    assert done.returncode == 0, done.stderr
    r = amdflash("probe", "--board", f"sim:{board}")
    assert "the bootloader requests item 0x01, phase 1" in r.out and "power-cycle" not in r.out, r.out


def test_sim_power_cycle_brings_back_a_chip_left_in_deep_power_down(amdflash, make_board):
    from amdflash.stages.sim import Board

    board = make_board(transport="ideal")
    with Board(board) as b:
        b.chip.transaction(b"\xb9", 0, b.clock.now())       # deep power-down: only ABh is heard
    r = amdflash("info", "--board", f"sim:{board}")
    assert r.code == 1 and "ff ff ff" in r.err, r.err
    assert amdflash("sim", "power-cycle", board).code == 0
    assert amdflash("info", "--board", f"sim:{board}").code == 0


def test_sim_power_cycle_waits_for_a_job(amdflash, make_board):
    from amdflash.stages.transport.lock import sim_lock

    board = make_board(transport="ideal")
    with sim_lock(board):
        r = amdflash("sim", "power-cycle", board)
    assert r.code == 2 and "board busy" in r.err


# -- next steps that work when pasted (issue 27, item 1) -------------------------------------------

def pasted(text: str) -> list[list[str]]:
    """Every amdflash command in `text`, split as a shell splits it: from 'amdflash' to the end
    of its clause (a shell's ';' or ')', or the end of the line)."""
    import shlex

    found = []
    for line in text.splitlines():
        at = line.find("amdflash ")
        while at >= 0:
            lexer = shlex.shlex(line[at:], posix=True, punctuation_chars=";()")
            lexer.whitespace_split = True
            words = []
            for token in lexer:
                if token in (";", "(", ")"):
                    break
                words.append(token)
            found.append(words)
            at = line.find("amdflash ", at + 1)
    return found


def run_pasted(words: list[str], cwd: Path) -> cli.Result:
    """A pasted command, run by a shell's rules in another directory (`amdflash` is this one)."""
    assert words[0] == "amdflash", words
    return cli.run("--no-progress", *words[1:], cwd=cwd)


@pytest.mark.slow
def test_the_steps_after_a_failed_flash_work_pasted_elsewhere_with_their_db(amdflash, make_board, image, tmp_path,
                                                                           monkeypatch):
    img = image.read_bytes()
    stuck = first_differing_bit(img, 0x100000)
    board = make_board(transport="ideal", faults=[f"stuck-bit={stuck:#x}:0"])
    (tmp_path / "my runs").mkdir()
    monkeypatch.chdir(tmp_path)
    db = "my runs/audit db.sqlite"               # relative, with spaces: the run's own, not $AMDFLASH_DB
    r = amdflash("--no-progress", "--db", db, "flash", image, "--yes", "--force", "--board", f"sim:{board}")
    assert r.code == 1, r.err
    advice = r.err_lines[-1]
    [put_back, resume] = pasted(advice)
    assert resume[:4] == ["amdflash", "--db", str(tmp_path / db), "resume"], resume
    assert put_back[:4] == ["amdflash", "--db", str(tmp_path / db), "flash"], put_back
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert amdflash("sim", "fault", board, "--clear").code == 0
    done = run_pasted(resume, elsewhere)
    assert done.returncode == 0, done.stderr
    assert flash_content(board) == img                         # it finished the flash
    runs = json.loads(amdflash("--db", tmp_path / db, "runs", "--format", "json").out)
    assert [(x["command"], x["status"]) for x in runs] == [("flash", "failed"), ("resume", "succeeded")]
    done = run_pasted(put_back, elsewhere)
    assert done.returncode == 0, done.stderr
    assert put_back[-2] == "--"
    assert flash_content(board) == Path(put_back[-1]).read_bytes()   # and this put the backup back


@pytest.mark.slow
@pytest.mark.parametrize("chosen", ["environment", "config file"])
def test_the_steps_name_a_database_chosen_by_the_environment_or_the_config_file(amdflash, make_board, image, tmp_path,
                                                                               monkeypatch, chosen):
    """A database chosen by $AMDFLASH_DB, or by `db` in the config file $AMDFLASH_CONFIG names,
    is named in the printed steps as one given by --db is: pasted into a shell without that
    variable (a new terminal, another user's) they reach the run's trail, not the default one."""
    img = image.read_bytes()
    board = make_board(transport="ideal", faults=[f"stuck-bit={first_differing_bit(img, 0x100000):#x}:0"])
    db = tmp_path / "line" / "line's db.sqlite"
    db.parent.mkdir()
    if chosen == "environment":
        monkeypatch.setenv("AMDFLASH_DB", str(db))
        unset, named = "AMDFLASH_DB", ["--db", str(db)]
    else:
        config = tmp_path / "line" / "line config.toml"
        config.write_text(f'db = "{db}"\n')
        monkeypatch.delenv("AMDFLASH_DB")
        monkeypatch.setenv("AMDFLASH_CONFIG", str(config))
        unset, named = "AMDFLASH_CONFIG", ["--db", str(db), "--config", str(config)]
    r = amdflash("--no-progress", "flash", image, "--yes", "--force", "--board", f"sim:{board}")
    assert r.code == 1, r.err
    [put_back, resume] = pasted(r.err_lines[-1])
    assert resume[:1 + len(named)] == ["amdflash", *named] and resume[1 + len(named)] == "resume", resume
    assert put_back[:1 + len(named)] == ["amdflash", *named], put_back
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert amdflash("sim", "fault", board, "--clear").code == 0
    done = cli.run("--no-progress", *resume[1:], cwd=elsewhere, env={unset: None})
    assert done.returncode == 0, done.stderr
    assert flash_content(board) == img
    runs = json.loads(amdflash("--db", db, "runs", "--format", "json").out)
    assert [(x["command"], x["status"]) for x in runs] == [("flash", "failed"), ("resume", "succeeded")]
    assert not (tmp_path / "data" / "amdflash").exists()       # the default trail ($XDG_DATA_HOME) never made


@pytest.mark.slow
def test_info_names_a_resume_that_works_pasted_elsewhere(amdflash, make_board, image, tmp_path):
    board = make_board(content="blank", transport="ideal", faults=["kill-after-writes=52000"])  # past the backup: while writing
    db = tmp_path / "a dir" / "trail's db.sqlite"              # a space and a quote to survive the shell
    db.parent.mkdir()
    subprocess.run([sys.executable, "-m", "amdflash", "-q", "--db", str(db), "flash", str(image), "--yes",
                    "--force", "--board", f"sim:{board}"], capture_output=True, text=True, env=dict(os.environ))
    assert amdflash("sim", "fault", board, "--clear").code == 0
    config = db.parent / "my config.toml"
    config.write_text("progress = false\n")
    r = amdflash("--db", db, "--config", config, "info", "--board", f"sim:{board}")
    [line] = [x for x in r.out.splitlines() if x.startswith("unfinished flash")]
    [resume] = pasted(line)
    assert resume[:6] == ["amdflash", "--db", str(db), "--config", str(config), "resume"], resume
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = run_pasted(resume, elsewhere)
    assert done.returncode == 0, done.stderr
    assert flash_content(board) == image.read_bytes()


def test_no_such_run_names_the_database_searched(amdflash, make_board, tmp_path):
    board = make_board(transport="ideal")
    db = tmp_path / "other.sqlite"
    assert amdflash("--db", db, "info", "--board", f"sim:{board}").code == 0
    r = amdflash("--db", db, "resume", "20260101T000000-00000000", "--yes", "--board", f"sim:{board}")
    assert r.code == 2 and f"no run '20260101T000000-00000000' in the audit database {db}" in r.err, r.err


def test_a_failed_dump_says_the_flash_was_not_changed(amdflash, make_board, tmp_path):
    board = make_board(transport="ideal", faults=["stall-after=300"])
    r = amdflash("--no-progress", "dump", tmp_path / "out.bin", "--board", f"sim:{board}")
    assert r.code == 1, r.err
    assert r.err_lines[-1] == "  next: the flash was not changed (dump only reads it); fix the cause, then run " \
                              "the command again", r.err


def test_registers_left_changed_name_a_restore_that_works_pasted(amdflash, make_board, tmp_path, monkeypatch):
    from amdflash.stages.drivers.navi31 import regs as R
    from amdflash.stages.transport import discovery
    from amdflash.stages.sim import Board

    def registers(board: Path) -> dict[int, int]:
        with Board(board) as b:
            return {r: b.get32(r) for r in (R.ROM_CNTL, R.PAGE_MIRROR_CNTL, R.GPIOPAD_MASK, R.GPIOPAD_A)}

    board = make_board(transport="ideal", faults=["usb-disconnect-after=30000"])
    before = registers(board)
    monkeypatch.setenv(discovery.ENV_SIM_USB, str(board))
    db = tmp_path / "a trail" / "audit.sqlite"
    db.parent.mkdir()
    r = amdflash("--no-progress", "--db", db, "dump", tmp_path / "d.bin", "--board", "usb")
    assert r.code == 1 and "registers not put back" in r.err, r.err
    assert registers(board) != before
    [restore] = [words for words in pasted(r.err) if "restore" in words]
    assert restore[:4] == ["amdflash", "--db", str(db), "restore"], restore
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = run_pasted(restore, elsewhere)
    assert done.returncode == 0, done.stderr
    assert registers(board) == before
    assert json.loads(amdflash("--db", db, "runs", "--format", "json").out)[-1]["command"] == "restore"


def test_a_disk_that_fills_as_a_run_ends_leaves_it_as_its_record_says(amdflash, make_board, small_disk):
    """The disk crossed the line the writer keeps for a run's end only after the job's work:
    the end ("succeeded") was committed and fsynced, and then the barrier that waited for it
    said the disk was low — the command line called the run failed (exit 1, with a resume
    step) while its record says it succeeded (a load-dependent failure of the test above).
    The run is what its record says; the low disk is a warning, and the next run refuses."""
    from amdflash.pipeline.engine import auditdb
    from amdflash.pipeline.engine.runner import RunInfo, new_run_id, run_boards
    from amdflash.stages.open_transport import parse_spec

    where = small_disk(12)
    db = where / "audit.sqlite"
    board = make_board(transport="ideal")

    async def body(dev, info):  # noqa: ANN001, ANN202 - the job's work is done; then the disk fills
        st = os.statvfs(where)
        (where / "filler").write_bytes(bytes(st.f_bavail * st.f_frsize - (3 << 20)))
        return {}

    writer = auditdb.open_writer(str(db))
    try:
        [result] = anyio.run(run_boards, lambda spec: (body, RunInfo(new_run_id(), spec, "info", {}, None)),
                             [parse_spec(f"sim:{board}")], writer, False)
    finally:
        writer.close()
    [run] = json.loads(amdflash("runs", "--format", "json", "--db", db).out)
    assert (result.status, result.exit_code, run["status"]) == ("succeeded", 0, "succeeded"), (result, run)
    assert [line for line in result.output if line.startswith("warning: ") and "free some space" in line]
    refused = amdflash("info", "--board", f"sim:{board}", "--db", db)
    assert refused.code == 2 and "free some space" in refused.err, refused.err
