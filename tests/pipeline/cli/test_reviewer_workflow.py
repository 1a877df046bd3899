"""The reviewer's whole workflow (issue 44, done-when): incidents made on emulated boards into
one trail on its recording host, two of its rows then edited as an insider with the file
would; the reviewer receives only the database (checkpointed: one file, no -wal) and the
host's public key, in a directory of their own with a fresh HOME, and answers every question
the issue asks with the commands docs/review.md gives, nothing else. Their home gets nothing
and the copy's bytes stay as received."""
from __future__ import annotations

import hashlib
import html
import json
import re
import shutil
import signal
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from amdflash.stages.sim import Board, create_board
from amdflash.stages.sim.synth import PART_KEY, synthetic_ifwi
from tests.pipeline.cli.test_original_across_runs import content
from tests.pipeline.cli.test_reviewer_trail import insider, reviewer_env, tree
from tests.support import cli

pytestmark = pytest.mark.slow       # about 25 s of flashes, then about 60 commands of review
DOC = Path(__file__).resolve().parents[3] / "docs" / "review.md"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The recording host: one trail, one incident per board (small ranges where the incident
    allows), then the insider's two edits. Returns the runs by incident."""
    work = tmp_path_factory.mktemp("host")
    db = work / "trail" / "audit.sqlite"
    db.parent.mkdir()
    env: dict[str, str | None] = {"AMDFLASH_DB": str(db), "AMDFLASH_LOCK_DIR": str(work / "locks"),
                                  "XDG_CONFIG_HOME": str(work / "config"), "XDG_DATA_HOME": str(work / "data"),
                                  "AMDFLASH_CONFIG": None, "AMDFLASH_SIM_USB": None}
    image = work / "image.bin"
    image.write_bytes(synthetic_ifwi(1234))
    first = content(image.read_bytes())          # what each full-flash board holds before its first flash
    runs: dict[str, str] = {}
    boards: dict[str, Path] = {}

    def amdflash(*args: object, code: int | None = 0, **extra: str) -> cli.Result:
        r = cli.run("--no-progress", *args, env={**env, **extra})
        assert code is None or r.code == code, (args, r.code, r.err)
        return r

    def board(name: str, **kw: Any) -> str:
        boards[name] = create_board(work / name, **{"content": first, "transport": "ideal", "seed": 5, **kw})
        return f"sim:{boards[name]}"

    def newest(name: str) -> None:
        runs[name] = json.loads(amdflash("runs", "--format", "json").out)[-1]["run_id"]

    flash = ("flash", image, "--yes", "--expect-part", PART_KEY)
    # A good flash (its register writes tell where to kill the next ones).
    amdflash(*flash, "--board", board("good"))
    newest("good")
    with Board(boards["good"]) as b:
        writes = int(b.stats()["reg_writes"])
    # A verify failure from an erase that did not take (sector 0).
    amdflash(*flash, "--board", board("erase", faults=["erase-fail=0"]), code=1)
    newest("erase")
    # Killed (SIGKILL, as at power loss) while writing units: one resumed, one never.
    for name in ("resumed", "abandoned"):
        spec = board(name, faults=[f"kill-after-writes={writes * 99 // 100}"])
        p = cli.run_process("--no-progress", *flash, "--board", spec, env=env)
        assert p.code == -signal.SIGKILL, p.err
        newest(name)
    amdflash("resume", runs["resumed"], "--yes", "--board", f"sim:{boards['resumed']}")
    newest("resume")
    # USB lost mid-program and mid-backup (32 sectors over the emulated USB bridge).
    usb = ("flash", image, "--yes", "--force", "--sector-count", "32", "--board", "usb:0")
    ref = create_board(work / "usb-ref", content="blank", transport="ideal", seed=7)
    amdflash("--db", work / "ref.sqlite", *usb, AMDFLASH_SIM_USB=str(ref))
    stats = json.loads(cli.run("sim", "stats", ref).out)
    whole = int(stats["control_transfers"] + stats["bulk_transfers"])
    for name, part in (("usb-program", 0.95), ("usb-backup", 0.35)):
        lost = create_board(work / name, content="blank", transport="ideal", seed=7,
                            faults=[f"usb-disconnect-after={int(whole * part)}"])
        amdflash(*usb, code=1, AMDFLASH_SIM_USB=str(lost))
        newest(name)
    # A protection refusal (SR2.CMP set, no --clear-cmp).
    amdflash(*flash, "--sector-count", "2", "--board", board("protected", cmp=True, content="synthetic", seed=6),
             code=2)
    newest("protected")
    # A wrong-part image refused, then forced.
    other = work / "other.bin"
    other.write_bytes(synthetic_ifwi(7, part_key="SYNTH-0002"))
    spec = board("wrong", content=synthetic_ifwi(1), seed=3)
    amdflash("flash", other, "--yes", "--sector-count", "2", "--board", spec, code=2)
    newest("refused")
    amdflash("flash", other, "--yes", "--force", "--sector-count", "2", "--board", spec)
    newest("forced")
    # Unstable reads (bits flip on read), confirmed by more reads.
    amdflash(*flash, "--sector-count", "16", "--board", board("unstable", seed=9, faults=["read-flip=1e-4"]))
    newest("unstable")
    # A failed flash (a bit that will not program) the insider will relabel.
    data = image.read_bytes()
    stuck = next(a for a in range(0x1000) if data[a] not in (0, 0xFF) and not data[a] & 1)
    amdflash(*flash, "--sector-count", "2", "--board", board("relabelled", faults=[f"stuck-bit={stuck:#x}:0"]),
             code=1)
    newest("relabelled")

    pub = work / "host.pub"
    amdflash("audit", "key", "-o", pub)
    # The good run's export, made at the time: the second copy a reviewer may ask for later.
    export = work / "good.jsonl"
    amdflash("audit", "export", "--run", runs["good"], "-o", export)
    # The insider: one verify row of the good flash edited, the failed flash made `succeeded`.
    insider(db, "log_verifies_no_update",
            "UPDATE log_verifies SET ok = 0, mismatch_address = address, flash_byte = 0, image_byte = 255 "
            "WHERE seq = (SELECT min(v.seq) FROM log_verifies v JOIN runs r ON r.seq = v.run WHERE r.run_id = ?)",
            params=(runs["good"],))
    insider(db, "run_status_no_update", "UPDATE run_status SET status = 'succeeded', detail = NULL "
            "WHERE run_id = ? AND status = 'failed'", params=(runs["relabelled"],))
    con = sqlite3.connect(db)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")      # a reviewer receives one file
    con.close()
    return {"db": db, "pub": pub, "export": export, "runs": runs, "boards": boards, "first": first, "env": env}


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def documented() -> list[str]:
    """The commands docs/review.md gives (its indented `amdflash ...` lines), comments dropped."""
    return [" ".join(x.split("#")[0].split()) for x in DOC.read_text(encoding="utf-8").splitlines()
            if x.startswith("    amdflash ")]


def test_a_reviewer_with_only_the_database_and_the_key_answers_every_question(recorded, tmp_path):
    runs = recorded["runs"]
    home, case = tmp_path / "home", tmp_path / "case"
    home.mkdir()
    case.mkdir()
    db = case / "received.sqlite"
    shutil.copyfile(recorded["db"], db)
    shutil.copyfile(recorded["pub"], case / "host.pub")
    assert sorted(p.name for p in case.iterdir()) == ["host.pub", "received.sqlite"]
    received = sha(db)
    typed: list[str] = []

    def amdflash(*argv: object, code: int | None = 0) -> cli.Result:
        """A command as the reviewer types it, in their directory, with names relative to it."""
        typed.append(" ".join(["amdflash", *map(str, argv)]))
        r = cli.run(*argv, env={**reviewer_env(home), "AMDFLASH_LOCK_DIR": None}, cwd=case)
        assert code is None or r.code == code, (argv, r.code, r.out, r.err)
        return r

    D = ("--db", "received.sqlite")

    # 2. The verdict without the anchor: the insider's edit is BROKEN, named (never the
    #    anchor's absence); each run the insider left alone is intact on its own, its end
    #    proven where sealed, and the killed run's tail said not proven, with what would prove it.
    whole = amdflash(*D, "audit", "verify", "--key", "host.pub", code=1)
    head = whole.out.splitlines()[0]
    assert head.startswith("audit chain BROKEN") and runs["good"] in head and "anchor" not in head, whole.out
    verdict = json.loads(amdflash(*D, "audit", "verify", "--key", "host.pub", "--format", "json", code=1).out)
    assert verdict["verdict"] == "broken" and runs["good"] in verdict["problem"], verdict
    for name, run in runs.items():
        one = amdflash(*D, "audit", "verify", "--run", run, "--key", "host.pub", code=None)
        if name in ("good", "relabelled"):
            assert one.code == 1 and one.out.startswith(f"audit chain BROKEN in run {run}"), one.out
            continue
        assert one.code == 0 and one.out.startswith(f"audit chain intact: run {run}"), (name, one.out)
        assert "verified against the given --key" in one.out, one.out
        if name in ("resumed", "abandoned"):
            assert "not proven  that the run has no rows after seq" in one.out, one.out
            assert any(x.startswith("would prove the anchor file") for x in one.out.splitlines()), one.out
        else:
            assert "proven      the run's end: recorded and sealed by its final checkpoint" in one.out, (name, one.out)

    # 3. The runs: the relabelled flash is shown as not verified and never listed as succeeded.
    listed = amdflash(*D, "runs").out
    [line] = [x for x in listed.splitlines() if x.startswith(runs["relabelled"])]
    assert "succeeded (not verified)" in line, listed
    succeeded = [x["run_id"] for x in json.loads(amdflash(*D, "runs", "--status", "succeeded", "--format",
                                                          "json").out)]
    assert runs["relabelled"] not in succeeded and runs["forced"] in succeeded, succeeded
    failed = {x["run_id"]: x for x in json.loads(amdflash(*D, "runs", "--status", "failed", "--format",
                                                          "json").out)}
    assert set(failed) == {runs["erase"], runs["usb-program"], runs["usb-backup"]}, failed
    assert all(x["status_verified"] for x in failed.values())

    # 4. Every run's report, with the key: how each ended, and each incident's facts.
    reports: dict[str, dict[str, Any]] = {}
    texts: dict[str, str] = {}
    for name, run in runs.items():
        bad = name in ("good", "relabelled")
        texts[name] = amdflash(*D, "report", run, "--key", "host.pub", code=1 if bad else 0).out
        reports[name] = json.loads(amdflash(*D, "report", run, "--key", "host.pub", "--format", "json",
                                            code=1 if bad else 0).out)
    how = {name: (r["facts"]["ended"]["how"], r["facts"]["ended"].get("status")) for name, r in reports.items()}
    assert how["resumed"][0] == how["abandoned"][0] == "killed", how
    # The relabelled run's end is the forged row: not said to be killed, nor to have succeeded.
    assert how["relabelled"] == ("not verified", "succeeded"), how
    for name in ("good", "erase", "resume", "usb-program", "usb-backup", "protected", "refused", "forced",
                 "unstable"):
        want = {"erase": "failed", "usb-program": "failed", "usb-backup": "failed", "protected": "refused",
                "refused": "refused"}.get(name, "succeeded")
        assert how[name] == ("recorded", want), (name, how[name])

    def words(name: str, key: str) -> str:
        said = [w["text"] for w in reports[name]["facts"]["words"] if w["key"] == key]
        assert said and f"{said[0]}" in texts[name], (name, key, texts[name])
        return said[0]

    # The edited verify row: the run is shown marked, the failing span named with its tables.
    good = reports["good"]
    assert good["chain"]["ok"] is False and good["unverified"]["spans"], good["unverified"]
    assert "verifies" in good["unverified"]["spans"][0]["tables"], good["unverified"]
    assert "chain      BROKEN: run " + runs["good"] in texts["good"], texts["good"]
    # The relabelled run: its status not verified, what the row says now beside it.
    forged = reports["relabelled"]
    assert (forged["status"], forged["status_verified"], forged["recorded_status"]) == \
        ("succeeded (not verified)", False, "succeeded"), forged["status"]
    assert words("relabelled", "ended").startswith("its end does not verify: the trail says it ended succeeded"), \
        words("relabelled", "ended")
    # The verify failure in the chip's terms.
    diagnosis = words("erase", "diagnosis")
    assert "bits that should be 1 read 0 at 0x000000" in diagnosis and "the erase did not take" in diagnosis
    assert reports["erase"]["facts"]["verify_diagnosis"] == diagnosis
    # The registers the killed, never-resumed run left changed, from its sealed writes; replay says the same.
    regs = reports["abandoned"]["facts"]["registers"]
    left = {c["register"]: c for c in regs["left_changed"]}
    assert regs["left_from"] == "sealed writes" and "ROM_CNTL" in left, regs
    assert left["ROM_CNTL"]["before"] == regs["before"]["ROM_CNTL"] != left["ROM_CNTL"]["left"]
    said = words("abandoned", "registers-left")
    assert "no later run on record has put them back" in said, said
    replayed = amdflash(*D, "replay", runs["abandoned"])
    assert f"note       registers {said}" in replayed.out.splitlines(), replayed.out
    # The resumed one: fixed by its resume, which keeps the flash's backup.
    assert reports["resumed"]["fixed_by"] == runs["resume"], reports["resumed"]["fixed_by"]
    assert words("resume", "backup-held").startswith(f"kept from run {runs['resumed']}, which it resumes")
    # The force and both part numbers; the refusal before it names them too.
    assert "; --force overrode the part number)" in texts["forced"].splitlines()[0], texts["forced"]
    [force] = reports["forced"]["facts"]["overrides"]
    assert (force["option"], force["image_part"], force["board_part"]) == \
        ("--force", "SYNTH-0002-102", f"{PART_KEY}-102"), force
    assert "image part SYNTH-0002-102, board part SYNTH-0001-102" in words("forced", "override--force")
    assert "SYNTH-0002-102" in reports["refused"]["error"] and f"{PART_KEY}-102" in reports["refused"]["error"]
    # The protection refusal, what protected the chip.
    assert "SR2.CMP is set" in reports["protected"]["error"] and "--clear-cmp" in reports["protected"]["error"]
    # The backup and whether the trail holds it: a full flash's 512 units, a range's own.
    backup = reports["erase"]["facts"]["backup"]
    assert backup["in_trail"] is True and backup["units_in_trail"] == 512, backup
    assert "the trail holds its content: 512 sealed backup units rebuild it" in words("erase", "backup-held")
    assert reports["usb-program"]["facts"]["backup"]["units_in_trail"] == 32
    # USB lost: mid-program the flash is partly written; mid-backup it was not changed.
    assert "disconnected" in reports["usb-program"]["error"] and "partly written" in texts["usb-program"]
    assert reports["usb-backup"]["error"].startswith("backup of unit") and "disconnected" in \
        reports["usb-backup"]["error"] and "the flash was not changed" in texts["usb-backup"]
    # What the lost link left in the registers: its writes from the loss on never reached the
    # board (the restore's among them), so they are not what it left.
    for name in ("usb-program", "usb-backup"):
        lost = reports[name]["facts"]["registers"]
        assert lost["left_from"] == "sealed writes before the link was lost", lost
        assert {c["register"]: c["left"] for c in lost["left_changed"]}.get("ROM_CNTL") == "0x18000008", lost
        assert "ROM_CNTL=0x18000008?" in reports[name]["error"]         # as its error says
        assert "the writes after it did not reach the board" in words(name, "registers-left")
    stopped = reports["usb-backup"]["facts"]["backup"]
    assert stopped["path"] is None and 0 < stopped["units_in_trail"] < 32 and stopped["in_trail"] is False, stopped
    assert words("usb-backup", "backup-held").startswith(
        f"none made: the run stopped while backing up; the trail holds the {stopped['units_in_trail']} sealed "
        "backup units it read"), words("usb-backup", "backup-held")
    # Unstable reads: reads that disagreed, each settled by more reads.
    reads = reports["unstable"]["reads"]
    assert reads["disagreed_reads"] > 0 and reads["unresolved_reads"] == 0 and reads["confirmed"], reads
    # The same facts in the HTML page (one run, to a file the reviewer names).
    amdflash(*D, "report", runs["abandoned"], "--format", "html", "-o", f"{runs['abandoned']}.html")
    page = html.unescape((case / f"{runs['abandoned']}.html").read_text(encoding="utf-8"))
    assert f'data-field="fact-registers-left">{said}</td>' in page, said

    # A run's evidence in one file, checked without the database.
    exported = amdflash(*D, "audit", "export", "--run", runs["erase"], "-o", f"{runs['erase']}.jsonl")
    [one_off] = re.findall(r"sealed with a one-off key, (amdflash-ed25519 [0-9a-f]{64})", exported.out + exported.err)
    (case / "export.pub").write_text(one_off + "\n")       # the reviewer saves the line, as it says
    checked = amdflash("audit", "verify", "--export", f"{runs['erase']}.jsonl", "--key", "host.pub",
                       "--key", "export.pub")
    assert checked.out.startswith("export intact") and "verified against the given --key" in checked.out, checked.out

    # 5. The original back: the bundle of the killed, never-resumed run rebuilds the board's
    #    content from before its first flash, and checks offline.
    made = amdflash(*D, "audit", "bundle", "--run", runs["abandoned"], "-o", "bundle")
    assert "original.bin: the whole flash" in made.out, made.out
    assert (case / "bundle" / "original.bin").read_bytes() == recorded["first"]
    offline = amdflash("audit", "verify", "--bundle", "bundle", "--key", "host.pub")
    assert offline.out.startswith("bundle intact") and "the given --key" in offline.out, offline.out

    # Lost mid-backup: no backup file was made, but the units it read are sealed in the trail.
    partial = amdflash(*D, "audit", "bundle", "--run", runs["usb-backup"], "-o", "partial")
    held = re.search(r"original-partial\.bin: (\d+) of 512 units", partial.out)
    assert held and 0 < int(held.group(1)) < 32, partial.out
    assert not (case / "partial" / "original.bin").exists()

    # Review never wrote: nothing in the home, the copy as received.
    assert tree(home) == []
    assert sha(db) == received and not Path(f"{db}-wal").exists() and not Path(f"{db}-shm").exists()

    # Later the reviewer asks for the export made at the time: the exact row the insider changed.
    shutil.copyfile(recorded["export"], case / "good.jsonl")
    against = json.loads(amdflash(*D, "report", runs["good"], "--against", "good.jsonl", "--format", "json",
                                  code=1).out)
    [span] = against["unverified"]["spans"]
    changed = {(d["table"], d["column"], d["trail"], d["copy"]) for d in span["differences"]}
    assert ("verifies", "ok", 0, 1) in changed, span["differences"]
    text = amdflash(*D, "report", runs["good"], "--against", "good.jsonl", code=1).out
    assert re.search(r"differs  verifies seq \d+ column ok: the trail says 0, the copy 1", text), text
    assert tree(home) == [] and sha(db) == received

    # The operator, on the recording host, writes the bundle's original back to the board.
    restored = cli.run("--no-progress", "restore-original", "--board", f"sim:{recorded['boards']['abandoned']}",
                       "--from-bundle", case / "bundle", "--yes", env=recorded["env"])
    assert restored.code == 0, restored.err
    assert (recorded["boards"]["abandoned"] / "flash.bin").read_bytes() == recorded["first"]
    typed.append("amdflash restore-original --board SPEC --from-bundle DIR --yes")

    # Every command docs/review.md gives was typed here (but the operator's `audit key`).
    def shape(command: str) -> str:
        for run in runs.values():
            command = command.replace(run, "RUN")
        command = re.sub(r"-o (bundle|partial)\b", "-o DIR", command).replace("--bundle bundle", "--bundle DIR")
        return command.replace("--against good.jsonl", "--against COPY")

    shapes = {shape(c) for c in typed}
    missing = [c for c in documented() if " audit key " not in c and not any(
        _covers(c, s) for s in shapes)]
    assert missing == [], missing


def _covers(doc: str, typed: str) -> bool:
    """The documented command `doc` was typed: the same words, RUN/DIR/SPEC standing for a run,
    a bundle's directory and a board, in any order after the command's name."""
    return sorted(doc.split()) == sorted(typed.split())
