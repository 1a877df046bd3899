"""The reviewer who holds only the trail (issue 44): a copy of the audit database, the host's
public key, no anchor. `audit verify` says what it proved and what it could not, and exits 0
when nothing it checked is wrong; a run nothing seals is not intact; a status that does not
verify is never listed as fact. Trails made with emulated boards, edited as an insider with
the file would (a trigger dropped and re-created, a status UPDATEd, an error DELETEd)."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from amdflash.stages.sim import create_board
from amdflash.stages.sim.synth import PART_KEY, synthetic_ifwi
from tests.support import cli


def _run(*args: object, **kw: Any) -> cli.Result:
    return cli.run(*args, **kw)


@pytest.fixture(scope="module")
def trail(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A trail on its recording host: a flash that failed verify (a stuck bit) and an info run."""
    work = tmp_path_factory.mktemp("recorded")
    env = {"AMDFLASH_LOCK_DIR": str(work / "locks"), "AMDFLASH_DB": None}
    image = work / "image.bin"
    image.write_bytes(synthetic_ifwi(1234))
    img = image.read_bytes()
    good = create_board(work / "good", content="synthetic", transport="ideal", seed=3)
    # A stuck bit in the first unit the flash rewrites (few do: the board holds a near copy).
    held = (good / "flash.bin").read_bytes()
    unit = next(u for u in range(0, len(img), 4096) if img[u:u + 4096] != held[u:u + 4096])
    stuck = next(a for a in range(unit, unit + 4096) if img[a] & 0x01 == 0)
    bad = create_board(work / "bad", content="synthetic", transport="ideal", seed=3,
                       faults=[f"stuck-bit={stuck:#x}:0"])
    db = work / "trail" / "audit.sqlite"
    db.parent.mkdir()
    r = _run("--no-progress", "--db", db, "flash", image, "--yes", "--expect-part", PART_KEY, "--board", f"sim:{bad}",
             env=env)
    assert r.code == 1, r.err
    assert _run("--db", db, "info", "--board", f"sim:{good}", env=env).code == 0
    pub = work / "host.pub"
    assert _run("--db", db, "audit", "key", "-o", pub, env=env).code == 0
    listed = json.loads(_run("--db", db, "runs", "--json", env=env).out)
    assert [x["status"] for x in listed] == ["failed", "succeeded"], listed
    return {"db": db, "pub": pub, "failed": listed[0]["run_id"], "info": listed[1]["run_id"]}


def received(trail: dict[str, Any], where: Path) -> Path:
    """What the reviewer gets: the database alone, in a directory of their own."""
    where.mkdir(parents=True, exist_ok=True)
    copy = where / "received.sqlite"
    shutil.copyfile(trail["db"], copy)
    return copy


def insider(db: Path, trigger: str, *sql: str, params: tuple = ()) -> None:
    """Edit the trail as someone with the file would: drop the append-only trigger, change a
    row, and put the trigger back as it was."""
    con = sqlite3.connect(db)
    [(definition,)] = con.execute("SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = ?", (trigger,))
    con.execute(f"DROP TRIGGER {trigger}")
    for statement in sql:
        con.execute(statement, params)
    con.execute(definition)
    con.commit()
    con.close()


# -- a verdict without the anchor -------------------------------------------------------------

def test_an_untampered_copy_without_its_anchor_is_intact_and_says_what_is_not_proven(trail, tmp_path):
    """Was: `audit chain BROKEN ... a database whose tail was cut looks like this`, exit 1."""
    copy = received(trail, tmp_path / "review")
    r = _run("--db", copy, "audit", "verify", "--key", trail["pub"])
    assert r.code == 0, r.out + r.err
    assert r.out.startswith("audit chain intact: the database") and "BROKEN" not in r.out, r.out
    lines = r.out.splitlines()
    assert any(x.startswith("proven      every row under a checkpoint signed by the given --key verifies")
               for x in lines), r.out
    [tail] = [x for x in lines if x.startswith("not proven  that the trail is complete after")]
    assert str(trail["db"]) + ".anchor" in tail, tail          # where the anchor was, on the recording host
    would = [x for x in lines if x.startswith("would prove ")]
    assert any(f"--db {copy} audit verify --key {trail['pub']} --anchor FILE" in x for x in would), would
    assert any("--central URL" in x for x in would) and any("audit bundle" in x for x in would), would

    j = _run("--db", copy, "audit", "verify", "--key", trail["pub"], "--format", "json")
    assert j.code == 0, j.err
    verdict = json.loads(j.out)
    assert verdict["verdict"] == "intact" and verdict["trusted_key"] is True
    assert verdict["proven"] and verdict["not_proven"] and verdict["would_prove"]
    assert verdict["anchor_recorded"] == str(trail["db"]) + ".anchor"
    assert [x[len("not proven  "):] for x in lines if x.startswith("not proven")] == verdict["not_proven"]


def test_without_a_key_who_signed_is_not_proven_and_the_key_would_prove_it(trail, tmp_path):
    copy = received(trail, tmp_path / "review")
    r = _run("--db", copy, "audit", "verify")
    assert r.code == 0, r.out
    assert "not proven  who signed" in r.out and f"--db {copy} audit verify --key host.pub" in r.out, r.out


def test_the_anchor_given_later_proves_the_tail_and_finds_a_cut_copy(trail, tmp_path):
    """The anchor the reviewer obtains afterwards settles the tail: the intact copy's tail is
    proven; a copy whose last run was cut is BROKEN."""
    anchor = Path(str(trail["db"]) + ".anchor")
    copy = received(trail, tmp_path / "review")
    r = _run("--db", copy, "audit", "verify", "--key", trail["pub"], "--anchor", anchor)
    assert r.code == 0 and "proven      nothing the anchor saw was removed or changed" in r.out, r.out
    assert "not proven  that the trail is complete" not in r.out, r.out

    con = sqlite3.connect(copy)
    from amdflash.store.schema import PHYSICAL, add_triggers, drop_triggers

    drop_triggers(con)
    gone = con.execute("SELECT seq FROM runs WHERE run_id = ?", (trail["info"],)).fetchone()[0]
    for table in PHYSICAL:
        con.execute(f"DELETE FROM {table} WHERE seq >= ?", (gone,))
    con.execute("DELETE FROM checkpoints WHERE last_seq >= ?", (gone,))
    con.execute("UPDATE chain_head SET seq = ?, checkpoint = (SELECT max(id) FROM checkpoints), "
                "hash = (SELECT hash FROM checkpoints ORDER BY id DESC LIMIT 1)", (gone - 1,))
    add_triggers(con)
    con.commit()
    con.close()
    alone = _run("--db", copy, "audit", "verify", "--key", trail["pub"])
    assert alone.code == 0 and "not proven  that the trail is complete" in alone.out, alone.out   # what it cannot know
    cut = _run("--db", copy, "audit", "verify", "--key", trail["pub"], "--anchor", anchor)
    assert cut.code == 1 and cut.out.startswith("audit chain BROKEN") and "does not have" in cut.out, cut.out
    j = json.loads(_run("--db", copy, "audit", "verify", "--anchor", anchor, "--format", "json").out)
    assert j["verdict"] == "broken" and j["problem"] and j["proven"] == [], j


def test_a_deleted_error_row_is_broken_on_the_copy_and_named(trail, tmp_path):
    copy = received(trail, tmp_path / "review")
    insider(copy, "errors_no_delete", "DELETE FROM errors WHERE run_id = ?", params=(trail["failed"],))
    r = _run("--db", copy, "audit", "verify", "--key", trail["pub"])
    assert r.code == 1 and r.out.startswith("audit chain BROKEN") and trail["failed"] in r.out, r.out
    assert "anchor" not in r.out.splitlines()[0], r.out
    j = json.loads(_run("--db", copy, "audit", "verify", "--format", "json").out)
    assert j["verdict"] == "broken" and trail["failed"] in j["problem"], j


# -- a run no checkpoint seals ------------------------------------------------------------------

def test_verify_run_of_a_run_no_checkpoint_seals_is_not_proven(trail, tmp_path):
    """Was: `audit chain intact: run made-up, 2 rows, 1 run(s), 0 signed checkpoints`, exit 0,
    also with --key."""
    copy = received(trail, tmp_path / "review")
    con = sqlite3.connect(copy)
    top = con.execute("SELECT seq FROM chain_head").fetchone()[0]
    con.execute("INSERT INTO runs (seq, run_id, command, at) VALUES (?, 'made-up', 'flash', 'now')", [top + 1])
    con.execute("INSERT INTO run_status (seq, run_id, status, at) VALUES (?, 'made-up', 'running', 'now')",
                [top + 2])
    con.commit()
    con.close()
    for key in ((), ("--key", trail["pub"])):
        r = _run("--db", copy, "audit", "verify", "--run", "made-up", *key)
        assert r.code == 1, r.out
        assert r.out.startswith("audit chain NOT PROVEN in run made-up") and "no signature vouches" in r.out, r.out
    j = json.loads(_run("--db", copy, "audit", "verify", "--run", "made-up", "--format", "json").out)
    assert j["verdict"] == "not proven" and j["proven"] == [] and j["not_proven"], j
    listed = {x["run_id"]: x for x in json.loads(_run("--db", copy, "runs", "--json").out)}
    assert listed["made-up"]["status_verified"] is False, listed["made-up"]


# -- statuses that do not verify are never shown as fact ---------------------------------------

def test_a_failed_flash_relabelled_succeeded_is_not_listed_as_succeeded(trail, tmp_path):
    copy = received(trail, tmp_path / "review")
    insider(copy, "run_status_no_update", "UPDATE run_status SET status = 'succeeded', detail = NULL "
            "WHERE run_id = ? AND status = 'failed'", params=(trail["failed"],))
    listed = {x["run_id"]: x for x in json.loads(_run("--db", copy, "runs", "--json").out)}
    forged, honest = listed[trail["failed"]], listed[trail["info"]]
    assert forged["status"] == "succeeded (not verified)" and forged["status_verified"] is False, forged
    assert forged["recorded_status"] == "succeeded", forged
    assert honest["status"] == "succeeded" and honest["status_verified"] is True, honest
    text = _run("--db", copy, "runs").out
    [line] = [x for x in text.splitlines() if x.startswith(trail["failed"])]
    assert "succeeded (not verified)" in line, text
    only = json.loads(_run("--db", copy, "runs", "--status", "succeeded", "--json").out)
    assert [x["run_id"] for x in only] == [trail["info"]], only
    # Untouched, the same listing says what was recorded, verified.
    original = {x["run_id"]: x for x in json.loads(_run("--db", trail["db"], "runs", "--json").out)}
    assert original[trail["failed"]]["status"] == "failed" and original[trail["failed"]]["status_verified"] is True


def test_exporting_a_run_that_does_not_verify_says_so_and_exits_1(trail, tmp_path):
    """Was: the relabelled run exported with exit 0 and no word."""
    copy = received(trail, tmp_path / "review")
    insider(copy, "run_status_no_update", "UPDATE run_status SET status = 'succeeded' WHERE run_id = ? "
            "AND status = 'failed'", params=(trail["failed"],))
    r = _run("--db", copy, "audit", "export", "--run", trail["failed"], "-o", tmp_path / "x.jsonl")
    assert r.code == 1 and f"warning: run {trail['failed']} does not verify: " in r.err, r.err
    assert (tmp_path / "x.jsonl").is_file()       # the evidence as recorded
    fine = _run("--db", copy, "audit", "export", "--run", trail["info"], "-o", tmp_path / "y.jsonl")
    assert fine.code == 0 and "warning" not in fine.err, fine.err


def test_a_status_inserted_after_the_seals_is_marked_in_datasette_too(trail, tmp_path):
    """A new status row after the run's final checkpoint: `runs` says not verified; datasette's
    canned queries, which can only use SQL, say not sealed (and never list it as succeeded)."""
    from tests.pipeline.cli.test_run_end import canned

    copy = received(trail, tmp_path / "review")
    con = sqlite3.connect(copy)
    top = con.execute("SELECT max(seq) FROM run_status").fetchone()[0]
    con.execute("INSERT INTO run_status (seq, run_id, status, at) VALUES (?, ?, 'succeeded', 'now')",
                [top + 1000, trail["failed"]])
    con.commit()
    con.close()
    listed = {x["run_id"]: x for x in json.loads(_run("--db", copy, "runs", "--json").out)}
    assert listed[trail["failed"]]["status"] == "succeeded (not verified)", listed[trail["failed"]]
    by_status = {r["run_id"]: r["status"] for r in canned(copy, "runs_by_status")}
    assert by_status[trail["failed"]] == "succeeded (not sealed)" and by_status[trail["info"]] == "succeeded"
    assert [r["run_id"] for r in canned(copy, "runs_by_status", status="succeeded")] == [trail["info"]]


# -- review never writes --------------------------------------------------------------------------
# `runs`, `report`, `replay`, `audit verify`, `audit export` and `audit bundle` create no key, no
# config and no directory in the reviewer's home, and leave the database's files — its -wal and
# -shm included, and no new one beside it — byte-identical: as the owner of a copy, on a
# read-only copy (0444 in a 0555 directory), as another user, and on a copy taken with the -wal
# a killed writer left (read through a private copy, store/read_only.py).

def files(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def tree(home: Path) -> list[str]:
    return sorted(str(p.relative_to(home)) for p in home.rglob("*"))


def reviewer_env(home: Path) -> dict[str, str | None]:
    """A fresh account: its own HOME, no XDG directories, no key or database named for it."""
    return {"HOME": str(home), "XDG_CONFIG_HOME": None, "XDG_DATA_HOME": None, "XDG_STATE_HOME": None,
            "XDG_CACHE_HOME": None, "AMDFLASH_HOST_KEY": None, "AMDFLASH_DB": None, "AMDFLASH_CONFIG": None,
            "AMDFLASH_ANCHOR": None}


def review(db: Path, facts: dict[str, Any], out: Path, run: Any, full: bool = False) -> list[Any]:
    """Every reviewing command, as the reviewer types them. Returns those that did not end as
    they should (each must succeed; the failed flash's replay may say where it diverged: exit
    1), for the caller to assert after it has checked what they wrote."""
    failed, key = facts["failed"], facts["pub"]
    wrong = []
    every = [(("runs",), {0}), (("report", failed, "--format", "json"), {0}), (("audit", "verify", "--key", key), {0}),
             (("audit", "export", "--run", failed, "-o", out / "export.jsonl"), {0})]
    if full:
        every += [(("runs", "--json"), {0}), (("report", failed), {0}), (("replay", failed), {0, 1}),
                  (("audit", "verify", "--run", failed, "--key", key), {0}),
                  (("audit", "bundle", "--run", failed, "-o", out / "bundle"), {0})]
    for argv, codes in every:
        r = run("--db", db, *argv)
        if r.code not in codes:
            wrong.append((argv, r.code, r.out, r.err))
    (out / "export.jsonl").unlink(missing_ok=True)
    shutil.rmtree(out / "bundle", ignore_errors=True)
    return wrong


@pytest.mark.slow      # several whole commands, five seconds or more: in CI's slow set
def test_a_reviewer_s_copy_and_home_are_left_as_they_were(trail, tmp_path):
    """Was: `audit export` made a host key in the reviewer's home; every read made -wal and -shm
    beside the copy."""
    home, place, out = tmp_path / "home", tmp_path / "received", tmp_path / "out"
    for d in (home, place, out):
        d.mkdir()
    db = place / "received.sqlite"
    shutil.copyfile(trail["db"], db)
    before = files(place)
    wrong = review(db, trail, out, lambda *a: cli.run(*a, env=reviewer_env(home)), full=True)
    assert files(place) == before
    assert tree(home) == []
    assert wrong == []


def test_a_read_only_copy_is_read_as_it_is(trail, tmp_path):
    home, place, out = tmp_path / "home", tmp_path / "received", tmp_path / "out"
    for d in (home, place, out):
        d.mkdir()
    db = place / "received.sqlite"
    shutil.copyfile(trail["db"], db)
    os.chmod(db, 0o444)
    os.chmod(place, 0o555)
    try:
        before = files(place)
        wrong = review(db, trail, out, lambda *a: cli.run(*a, env=reviewer_env(home)))
        assert files(place) == before
        assert tree(home) == []
        assert wrong == []
    finally:
        os.chmod(place, 0o755)


def copy_with_wal(trail_db: Path, work: Path, place: Path) -> Path:
    """The trail copied into `place` with a -wal holding frames, as a copy taken while a writer
    had it open leaves it (nobody holds it now)."""
    source = work / "source.sqlite"
    shutil.copyfile(trail_db, source)
    writer = sqlite3.connect(source, isolation_level=None)
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('wal-probe', 'x')")
    db = place / "received.sqlite"
    shutil.copyfile(source, db)
    shutil.copyfile(f"{source}-wal", f"{db}-wal")          # taken while the writer had it open
    writer.close()
    return db


def test_a_copy_with_the_wal_a_killed_writer_left_is_read_through_a_private_copy(trail, tmp_path, monkeypatch):
    """A -wal holding frames and nobody holding it: SQLite would make (or change) a -shm
    beside it; the reader copies both aside instead, and what the WAL holds is read."""
    home, place, out, temp = tmp_path / "home", tmp_path / "received", tmp_path / "out", tmp_path / "tmp"
    for d in (home, place, out, temp):
        d.mkdir()
    db = copy_with_wal(trail["db"], tmp_path, place)
    assert os.path.getsize(f"{db}-wal") > 0
    before = files(place)
    # Private copies made in a temporary directory of this test's own: other tests' readers,
    # running beside it, make theirs in the common one.
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    wrong = review(db, trail, out, lambda *a: cli.run(*a, env=reviewer_env(home)))
    assert files(place) == before and not Path(f"{db}-shm").exists()
    assert tree(home) == []
    assert wrong == []
    assert list(temp.glob("amdflash-read-*")) == []      # the private copies are gone


def test_a_trail_read_through_a_private_copy_is_named_by_its_own_path(trail, tmp_path):
    """Was: read through a private copy (a -wal a killed writer left, nobody holding it), the
    report said it was read from the copy, gone once read, and its check command named it; the
    bundle looked for the transparency log beside the copy. Every word names the trail itself."""
    home, place = tmp_path / "home", tmp_path / "received"
    for d in (home, place):
        d.mkdir()
    db = copy_with_wal(trail["db"], tmp_path, place)
    r = cli.run("--db", db, "report", trail["failed"], env=reviewer_env(home))
    assert f"database   read from {db}:" in r.out, r.out
    assert "amdflash-read-" not in r.out + r.err
    r = cli.run("--db", db, "report", trail["failed"], "--format", "json", env=reviewer_env(home))
    assert "amdflash-read-" not in r.out + r.err and str(db) in r.out


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
def test_another_user_reading_a_trail_changes_nothing(trail):
    """The trail readable by all (0644 in a 0755 directory, root's), read by uid 65534 with a
    home of its own, each command as its own process."""
    top = Path(tempfile.mkdtemp(prefix="amdflash-other-"))
    try:
        os.chmod(top, 0o755)
        place, home, out = top / "received", top / "home", top / "out"
        for d in (place, home, out):
            d.mkdir()
        os.chown(home, 65534, 65534)
        os.chown(out, 65534, 65534)
        db = place / "received.sqlite"
        shutil.copyfile(trail["db"], db)
        os.chmod(db, 0o644)
        key = top / "host.pub"
        shutil.copyfile(trail["pub"], key)
        os.chmod(key, 0o644)
        before = files(place)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AMDFLASH_", "XDG_"))}
        env.update(HOME=str(home), PYTHONDONTWRITEBYTECODE="1")

        def as_other(*argv: object) -> cli.Result:
            p = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                *cli.command(*argv)], capture_output=True, text=True, env=env, cwd=top, timeout=120)
            return cli.Result(p.returncode, p.stdout, p.stderr)

        wrong = []
        for argv in (("runs",), ("report", trail["failed"]), ("audit", "verify", "--key", key),
                     ("audit", "export", "--run", trail["failed"], "-o", out / "export.jsonl")):
            r = as_other("--db", db, *argv)
            if r.code:
                wrong.append((argv, r.out, r.err))
        assert files(place) == before
        assert tree(home) == []
        assert wrong == []
        assert stat.S_IMODE(os.stat(db).st_mode) == 0o644
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_root_reading_another_user_s_trail_changes_nothing(trail, tmp_path):
    """The other way round: the trail and its directory belong to uid 65534; root (or the
    tests' user) reads it."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give the trail to another user")
    home, place, out = tmp_path / "home", tmp_path / "received", tmp_path / "out"
    for d in (home, place, out):
        d.mkdir()
    db = place / "received.sqlite"
    shutil.copyfile(trail["db"], db)
    os.chown(db, 65534, 65534)
    os.chown(place, 65534, 65534)
    before = files(place)
    wrong = review(db, trail, out, lambda *a: cli.run(*a, env=reviewer_env(home)))
    assert files(place) == before
    assert tree(home) == []
    assert wrong == []


def test_a_trail_a_writer_has_open_is_read_through_its_wal(trail, tmp_path):
    """While a writer has the trail open, what it committed is still in its -wal: a reader
    must read through the -wal and -shm (found open in /proc/locks), never `immutable`, which
    would not see it."""
    db = received(trail, tmp_path / "live")
    writer = sqlite3.connect(db, isolation_level=None)
    try:
        writer.execute("PRAGMA wal_autocheckpoint=0")
        top = writer.execute("SELECT seq FROM chain_head").fetchone()[0]
        writer.execute("INSERT INTO runs (seq, run_id, command, at) VALUES (?, 'in-the-wal', 'info', 'now')",
                       [top + 1])
        assert os.path.getsize(f"{db}-wal") > 0
        listed = [x["run_id"] for x in json.loads(_run("--db", db, "runs", "--json").out)]
        assert "in-the-wal" in listed, listed
    finally:
        writer.close()


@pytest.mark.slow      # several whole commands, five seconds or more: in CI's slow set
def test_the_commands_docs_review_gives_work_on_a_received_copy(trail, tmp_path):
    """docs/review.md, typed as it stands by a reviewer holding only the database and the key,
    in a fresh home: every command it shows works (the operator's `audit key` excepted: it
    runs on the recording host), and nothing appears in the home or beside the copy. Lines
    naming a bundle's directory, a board, a second copy or a saved one-off key (DIR, SPEC,
    COPY, export.pub) need what only test_reviewer_workflow.py makes, and are typed there."""
    doc = Path(__file__).resolve().parents[3] / "docs" / "review.md"
    lines = [x.split("#")[0].split()[1:] for x in doc.read_text(encoding="utf-8").splitlines()
             if x.startswith("    amdflash ") and " audit key " not in x
             and not {"DIR", "SPEC", "COPY", "export.pub"} & set(x.split())]
    assert len(lines) >= 6, lines
    home, here = tmp_path / "home", tmp_path / "review"
    home.mkdir()
    here.mkdir()
    shutil.copyfile(trail["db"], here / "received.sqlite")
    shutil.copyfile(trail["pub"], here / "host.pub")
    before = files(here)
    for argv in lines:
        argv = [trail["failed"] if a == "RUN" else a.replace("RUN.", f"{trail['failed']}.") for a in argv]
        r = cli.run(*argv, env=reviewer_env(home), cwd=here)
        assert r.code in ((0, 1) if "replay" in argv else (0,)), (argv, r.out, r.err)
    for made in (".html", ".jsonl"):
        (here / f"{trail['failed']}{made}").unlink()
    assert files(here) == before and tree(home) == []


def test_the_status_seals_of_many_runs_are_checked_on_two_connections_alike(trail, tmp_path, monkeypatch):
    """From many runs on (verify.PARALLEL_SEGMENTS), a second connection hashes half of the bulk
    table: the forged status is found the same way (here from the first run on)."""
    from amdflash.store import verify

    monkeypatch.setattr(verify, "PARALLEL_SEGMENTS", 1)
    copy = received(trail, tmp_path / "review")
    insider(copy, "run_status_no_update", "UPDATE run_status SET status = 'succeeded' WHERE run_id = ? "
            "AND status = 'failed'", params=(trail["failed"],))
    listed = {x["run_id"]: x["status_verified"] for x in json.loads(_run("--db", copy, "runs", "--json").out)}
    assert listed == {trail["failed"]: False, trail["info"]: True}


def test_a_private_copy_that_cannot_be_made_is_one_line_and_nothing_beside_the_trail(trail, tmp_path, monkeypatch):
    """The -wal a killed writer left must be read through a private copy; with no room for it
    the reader says so in one line (exit 2) and still makes no -shm beside the trail."""
    place = tmp_path / "received"
    place.mkdir()
    db = copy_with_wal(trail["db"], tmp_path, place)
    before = files(place)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-directory"))
    r = _run("--db", db, "runs")
    assert r.code == 2 and len(r.err_lines) == 1 and "private copy" in r.err and "TMPDIR" in r.err, r.err
    assert files(place) == before
