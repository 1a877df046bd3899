"""Issue 44, "every report tells every fact": what the trail holds of a run, said by `report` in
text, JSON and HTML alike — the registers before, after restore and left changed (also by a run
killed and never resumed, from its sealed writes); each override and what it overrode (a
--force past a part mismatch, with both part numbers); the image and the backup and whether the
trail holds the backup's content; the VBIOS part before and after; each unit's times; how the
run ended (killed, its host went down); a verify failure in the flash chip's terms; and the one
database the report was read from, which its 'next' commands name."""
from __future__ import annotations

import html
import json
import re
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from amdflash.stages.sim import create_board
from amdflash.stages.sim.synth import PART_KEY, synthetic_ifwi
from amdflash.store import status
from tests.pipeline.cli import test_original_across_runs as across
from tests.support import cli

killed = across.killed        # a board whose flash was killed (SIGKILL) while writing units, never resumed


def amdflash(*args: object, env: dict[str, str] | None = None) -> cli.Result:
    return cli.run("--no-progress", *args, env=env)


def reports(run: str, *db: object, env: dict[str, str] | None = None) -> tuple[str, dict, str]:
    """The run's report in text, JSON and HTML (each must exit 0)."""
    said = [amdflash(*db, "report", run, "--format", fmt, env=env) for fmt in ("text", "json", "html")]
    for r in said:
        assert r.code == 0, r.err
    return said[0].out, json.loads(said[1].out), said[2].out


def fact(page: str, key: str) -> str:
    """The text of the HTML report's fact `key` (data-field fact-KEY), tags dropped."""
    found = re.search(rf'data-field="fact-{re.escape(key)}"[^>]*>(.*?)</td>', page, re.DOTALL)
    assert found, (key, page[:1000])
    return html.unescape(re.sub(r"<[^>]+>", "", found.group(1)))


def said(rep: dict, key: str) -> str:
    found = [w["text"] for w in rep["facts"]["words"] if w["key"] == key]
    assert found, (key, rep["facts"]["words"])
    return found[0]


def line(text: str, label: str, *having: str) -> str:
    """The text report's line with `label` that holds every one of `having`."""
    found = [x for x in text.splitlines() if x.startswith(f"{label} ") and all(h in x for h in having)]
    assert found, (label, having, text)
    return found[0]


def last_run(env: dict[str, str] | None = None) -> str:
    return json.loads(amdflash("runs", "--format", "json", env=env).out)[-1]["run_id"]


@pytest.fixture(scope="module")
def forced(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A wrong-part image refused, then flashed with --force over a board of another part: one
    trail, read by every test that only reads it."""
    work = tmp_path_factory.mktemp("forced")
    env = {"AMDFLASH_DB": str(work / "audit.sqlite"), "AMDFLASH_LOCK_DIR": str(work / "locks"),
           "XDG_CONFIG_HOME": str(work / "config"), "XDG_DATA_HOME": str(work / "data"), "AMDFLASH_CONFIG": None}
    board = create_board(work / "board", content=synthetic_ifwi(1), transport="ideal", seed=3)
    image = work / "other.bin"
    image.write_bytes(synthetic_ifwi(7, part_key="SYNTH-0002"))
    assert amdflash("flash", image, "--yes", "--board", f"sim:{board}", env=env).code == 2
    done = amdflash("flash", image, "--yes", "--force", "--board", f"sim:{board}", env=env)
    assert done.code == 0, done.err
    return {"board": board, "image": image, "run": last_run(env), "env": env, "backups": work / "backups"}


def test_text_json_and_html_say_the_same_facts_of_one_run(forced):
    text, rep, page = reports(forced["run"], env=forced["env"])
    words = rep["facts"]["words"]
    keys = {w["key"] for w in words}
    assert {"registers-before", "registers-after", "registers-left", "override--force", "image-held",
            "backup-held", "vbios", "unit-clock", "ended", "database"} <= keys, keys
    for w in words:
        assert f"{w['label']:<10} {w['text']}" in text.splitlines(), (w, text)
        assert fact(page, w["key"]) == w["text"], w
    # The words are the structured facts', not a second story.
    f = rep["facts"]
    assert f["backup"]["path"] in said(rep, "backup-held") and f["backup"]["sha256"] in said(rep, "backup-held")
    assert f["registers"]["before"]["ROM_CNTL"] in said(rep, "registers-before")
    assert all(u["start_s"] is not None and u["start_s"] <= u["end_s"] for u in rep["units"]), rep["units"][:3]


def test_a_forced_wrong_part_flash_says_the_force_both_part_numbers_and_the_vbios_before_and_after(forced):
    text, rep, page = reports(forced["run"], env=forced["env"])
    head = text.splitlines()[0]
    assert "(flash, succeeded; --force overrode the part number)" in head, head
    [force] = rep["facts"]["overrides"]
    assert (force["option"], force["overrode"]) == ("--force", "part number")
    assert (force["image_part"], force["board_part"]) == ("SYNTH-0002-102", f"{PART_KEY}-102"), force
    words = line(text, "override", "--force overrode the part-number check")
    assert "image part SYNTH-0002-102" in words and f"board part {PART_KEY}-102" in words, words
    vbios = rep["facts"]["vbios"]
    assert (vbios["before"], vbios["after"]) == (f"{PART_KEY}-102", "SYNTH-0002-102"), vbios
    assert vbios["after_version"] and "derived from the image written" in vbios["after_from"], vbios
    assert "after SYNTH-0002-102" in fact(page, "vbios")


def test_a_successful_run_names_its_backup_and_whether_the_trail_holds_it(forced):
    text, rep, _ = reports(forced["run"], env=forced["env"])
    [backup] = list(forced["backups"].glob("*.bin"))
    b = rep["facts"]["backup"]
    assert b["path"] == str(backup.resolve()) and b["in_trail"] is True and b["units_in_trail"] == 512, b
    words = line(text, "backup", str(backup.resolve()))
    assert "the trail holds its content: 512 sealed backup units rebuild it (sha256 matches)" in words, words
    assert "the trail holds its hash only" in line(text, "image", rep["image_sha256"], "the trail holds")


def test_registers_before_and_after_restore_and_each_units_times(forced):
    text, rep, page = reports(forced["run"], env=forced["env"])
    before = rep["facts"]["registers"]["before"]
    assert before["ROM_CNTL"] and rep["facts"]["registers"]["after_restore"] == before
    assert line(text, "registers", "before: ").count("=0x") == len(before)
    assert "after restore: as before" in fact(page, "registers-after")
    assert "left changed: none (from its after-restore snapshot)" in fact(page, "registers-left")
    written = [u for u in rep["units"] if u["action"] != "skip"]
    assert written, rep["units"]
    u = written[0]
    assert line(text, "unit", f"{u['address']:#08x} {u['action']} {u['state']} +{u['start_s']:.3f} s .. "
                              f"+{u['end_s']:.3f} s")
    # The emulator's clock is modelled: its seconds are never passed off as wall-clock time.
    assert u["start"] is None and "not wall-clock time" in fact(page, "unit-clock")


@pytest.mark.slow     # a reference flash and a flash killed (SIGKILL) while it writes: CI runs it
def test_a_killed_never_resumed_run_reports_the_registers_it_left_and_how_it_ended(killed, tmp_path, monkeypatch):
    run = killed["run"]
    text, rep, page = reports(run)
    regs = rep["facts"]["registers"]
    assert regs["after_restore"] is None and regs["left_from"] == "sealed writes", regs
    changed = {c["register"]: (c["before"], c["left"]) for c in regs["left_changed"]}
    assert "ROM_CNTL" in changed and changed["ROM_CNTL"][0] == regs["before"]["ROM_CNTL"], changed
    left = line(text, "registers", "left changed (from its last sealed register writes")
    assert f"ROM_CNTL {changed['ROM_CNTL'][0]} -> {changed['ROM_CNTL'][1]}" in left, left
    assert "no later run on record has put them back" in left and fact(page, "registers-left") == left[11:]
    replayed = amdflash("replay", run)         # replay says them too, in the same words
    assert replayed.code == 0 and f"note       registers {left[11:]}" in replayed.out.splitlines(), replayed.out
    # Killed: no end, its process gone, the host (the same boot) still up.
    assert rep["facts"]["ended"]["how"] == "killed"
    assert line(text, "ended", "killed: no end recorded, its lock is no longer held and the host kept running")
    # The host has booted since: said so, with both boot ids.
    boot = tmp_path / "boot_id"
    boot.write_text("00000000-0000-4000-8000-000000000001\n")
    monkeypatch.setattr(status, "BOOT_ID", boot)
    _, rep, _ = reports(run)
    assert (rep["facts"]["ended"]["how"], rep["facts"]["ended"]["later_boot_id"]) == \
        ("host down", "00000000-0000-4000-8000-000000000001"), rep["facts"]["ended"]
    # The next run on the board (under the new boot) puts the registers back: the killed run's
    # report then names it, what it found and what it put back, and the boot id it recorded.
    assert amdflash("info", "--board", f"sim:{killed['board']}").code == 0
    fixer = last_run()
    text, rep, page = reports(run)
    put = rep["facts"]["registers"]["put_back_by"]
    assert put["run_id"] == fixer and put["put_back"]["ROM_CNTL"][1] == regs["before"]["ROM_CNTL"], put
    assert rep["facts"]["registers"]["found_by_next"]["ROM_CNTL"] == put["put_back"]["ROM_CNTL"][0]
    assert f"run {fixer} found them as " in fact(page, "registers-left")
    ended = rep["facts"]["ended"]
    assert (ended["how"], ended["later_run"]) == ("host down", fixer) and ended["boot_id"] != ended["later_boot_id"]
    words = line(text, "ended", "its host went down (or restarted) before the run ended", fixer)
    assert fact(page, "ended") == words[11:]
    # Its resume succeeds: the resume's report names the backup it keeps, the flash's.
    assert amdflash("resume", run, "--yes", "--board", f"sim:{killed['board']}").code == 0
    text, rep, page = reports(last_run())
    assert rep["facts"]["backup"]["run_id"] == run and rep["facts"]["backup"]["path"] == str(killed["backup"])
    assert fact(page, "backup-held") == line(text, "backup", f"kept from run {run}, which it resumes")[11:]


def _differs(image: bytes, tmp_path: Path, fault: str, code: int = 1) -> tuple[dict, str]:
    """A flash of the first two sectors over a board whose first 4 KiB are zero (that unit is
    erased and programmed) with `fault`, failing its verify: the report in text and JSON."""
    board = create_board(tmp_path / "board", content=across.content(image), transport="ideal", seed=5,
                         faults=[fault])
    r = amdflash("flash", tmp_path / "image.bin", "--yes", "--expect-part", PART_KEY, "--sector-count", "2",
                 "--board", f"sim:{board}")
    assert r.code == code, r.err
    text, rep, _ = reports(last_run())
    return rep, text


def test_a_verify_failure_from_an_erase_that_did_not_take_is_said_in_the_chips_terms(image, tmp_path, isolated):
    rep, text = _differs(image.read_bytes(), tmp_path, "erase-fail=0")
    first = rep["verifies"]["failed"][0]
    words = line(text, "diagnosis", "bits that should be 1 read 0", "the erase did not take")
    assert f"at {first['mismatch_address']:#08x}" in words, words
    assert rep["facts"]["verify_diagnosis"] == words[len("diagnosis  "):]
    # One report, one place: a reviewer's copy of the trail is the database the report names,
    # its 'next' commands name that copy, and the error is said to be quoted as recorded.
    copy = tmp_path / "review" / "copy.sqlite"
    copy.parent.mkdir()
    shutil.copy(isolated / "audit.sqlite", copy)
    text, rep, page = reports(rep["run_id"], "--db", copy)
    words = line(text, "database", f"read from {copy}")
    assert "the commands a 'next' line gives name it" in words and "the error is quoted as run" in words, words
    assert f"--db {copy} " in line(text, "next") and str(isolated / "audit.sqlite") not in line(text, "next")
    assert fact(page, "database") == words[len("database   "):]


def test_a_verify_failure_from_a_program_that_did_not_take_is_said_in_the_chips_terms(image, tmp_path):
    data = image.read_bytes()
    address = next(a for a in range(0x1000) if data[a] not in (0, 0xFF) and not data[a] & 1)
    rep, text = _differs(data, tmp_path, f"stuck-bit={address:#x}:0")
    words = line(text, "diagnosis", "bits that should be 0 read 1", "the program did not take")
    assert f"at {address:#08x}" in words, words


def test_a_verify_failure_a_retry_then_fixed_is_said_so(image, tmp_path):
    data = image.read_bytes()
    address = next(a for a in range(0x1000) if data[a] not in (0, 0xFF) and not data[a] & 1)
    rep, text = _differs(data, tmp_path, f"weak-bit={address:#x}:0", code=0)
    assert rep["status"] == "succeeded" and rep["verifies"]["failed"], rep["verifies"]
    words = line(text, "diagnosis", "bits that should be 0 read 1", "the program did not take")
    assert words.endswith("; a later attempt then verified the unit"), words


def test_a_protection_override_is_said_with_what_it_overrode(image, tmp_path):
    """--clear-cmp past SR2.CMP: the run's line and its override line say what was protected and
    that CMP was cleared; a range flash does not claim the image's VBIOS as the board's after."""
    board = create_board(tmp_path / "board", cmp=True, transport="ideal", seed=6)
    r = amdflash("flash", image, "--yes", "--clear-cmp", "--sector-count", "2", "--board", f"sim:{board}")
    assert r.code == 0, r.err
    text, rep, page = reports(last_run())
    assert "; --clear-cmp overrode the protection)" in text.splitlines()[0], text.splitlines()[0]
    [o] = rep["facts"]["overrides"]
    assert o["option"] == "--clear-cmp" and "CMP=1" in o["protection"] and "CMP cleared" in o["result"], o
    assert fact(page, "override--clear-cmp") == line(text, "override", "--clear-cmp overrode protection")[11:]
    assert rep["facts"]["vbios"]["after"] is None
    assert "after not known (the run wrote a range of sectors" in fact(page, "vbios")


def test_a_run_still_running_is_said_to_be_running(image, tmp_path, isolated):
    """Read while its flash runs (its process alive here, holding the board's lock): still running."""
    board = create_board(tmp_path / "board", content="blank", transport="ideal", seed=8, realtime_scale=1.0)
    script = str(Path(sys.executable).with_name("amdflash"))
    p = subprocess.Popen([script, "--no-progress", "-q", "flash", str(image), "--yes", "--expect-part", PART_KEY,
                          "--board", f"sim:{board}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    try:
        deadline, rep = time.monotonic() + 60, None
        while time.monotonic() < deadline and p.poll() is None:
            listed = amdflash("runs", "--format", "json") if (isolated / "audit.sqlite").exists() else None
            runs = json.loads(listed.out) if listed is not None and listed.code == 0 else []
            if runs and runs[-1]["status"] == "running":
                r = amdflash("report", runs[-1]["run_id"], "--format", "json")
                if r.code == 0:
                    rep = json.loads(r.out)
                    if rep["facts"]["ended"]["how"] == "running":
                        break
            time.sleep(0.2)
        assert p.poll() is None, "the flash ended before it was seen running"
        assert rep is not None and rep["facts"]["ended"]["how"] == "running", rep and rep["facts"]["ended"]
        assert said(rep, "ended").startswith("still running: no end recorded, and its process lives on this host")
    finally:
        os.killpg(p.pid, signal.SIGKILL)      # the process this test started
        p.wait(timeout=60)


def test_on_hardware_each_units_times_are_wall_clock_times(forced):
    """A board whose clock is the host's monotonic clock (hardware): each unit's start and end
    are wall-clock times, its board-clock seconds after the wall time of the run's "before"
    snapshot (the emulator's clock is modelled, so this is checked on its arithmetic)."""
    import datetime as dt

    from amdflash.store import facts
    from amdflash.store.queries import open_readonly, report

    db = open_readonly(forced["env"]["AMDFLASH_DB"])
    try:
        rep = report(db, forced["run"])
        times = facts._unit_times(db.conn, rep.rows, {**rep, "emulated": False})
        anchor = facts._anchor(db.conn, rep.rows)
    finally:
        db.conn.close()
    assert anchor is not None and times
    for t in times.values():
        start = dt.datetime.fromisoformat(t["start"])
        assert abs((start - anchor[1]).total_seconds() - t["start_s"]) < 0.002, t
        assert dt.datetime.fromisoformat(t["end"]) >= start
    started = dt.datetime.fromisoformat(rep["started"])
    assert min(dt.datetime.fromisoformat(t["start"]) for t in times.values()) >= started
