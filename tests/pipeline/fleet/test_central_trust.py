"""Who may write and read what in the central record, and the record as the trail's off-host anchor
(issue 18, attacks 3, 4, 6 and 7, their central half):

* a push login pushes only the host bound to it, even with another host's (stolen) key;
* a push login reads only its own host's rows and blobs; reviewers read everything;
* a host's blobs stay within its quota;
* a run is named by its host and run ID; `fleet report` names runs as HOST/RUN (a host pushing
  under another's run ID: test_central_bounds.py);
* `audit verify --central` and `audit push` see a trail rewritten, cut or rolled back after it
  was pushed, which the host's own checks cannot once the key is stolen.
"""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from amdflash.store import keys
from amdflash.store.chain import load_checkpoints
from amdflash.store.schema import drop_triggers

from tests.pipeline.fleet.central_trail import central_counts, psql
from tests.pipeline.fleet.test_central import flash, make_central, push
from tests.pipeline.engine.conftest import ROOT
from tests.store.test_forgery import forge

psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed (pip install '.[test]' brings it)")


@pytest.fixture
def central(postgres) -> str:
    return make_central(postgres)


def as_login(url: str, login: str) -> str:
    """The central database's URL for another login (the test cluster trusts its socket)."""
    return url.replace("postgresql://amdflash@", f"postgresql://{login}@")


def become(monkeypatch, tmp_path: Path, name: str) -> tuple[Path, Path]:
    """From now on the CLI acts as host `name`: its own audit database and host key. Returns
    (database, private key)."""
    db, key = tmp_path / f"{name}.sqlite", tmp_path / name / "host_key.pem"
    monkeypatch.setenv("AMDFLASH_DB", str(db))
    monkeypatch.setenv("AMDFLASH_HOST_KEY", str(key))
    return db, key


def enrol(cli, central: str, tmp_path: Path, name: str, *extra: str) -> Path:
    pub = tmp_path / f"{name}.pub"
    assert cli("audit", "key", "-o", pub).code == 0
    r = cli("fleet", "enroll", "--to", central, "--key", pub, "--name", name, *extra)
    assert r.code == 0, r.err
    return pub


def host_id(central: str, name: str) -> int:
    return int(psql(central, f"SELECT id FROM amdflash.hosts WHERE name = '{name}'"))


# -- attack 4: a push login is bound to one host ----------------------------------------------

def test_a_push_login_pushes_only_its_own_hosts_checkpoints(cli, make_board, image, central, tmp_path, monkeypatch):
    """hostb's login holds hosta's trail and key (stolen): it cannot push them, neither through
    `audit push` nor by a client that lies about which host it is."""
    become(monkeypatch, tmp_path, "hostb")
    enrol(cli, central, tmp_path, "hostb")
    become(monkeypatch, tmp_path, "hosta")
    flash(cli, make_board, image)
    enrol(cli, central, tmp_path, "hosta")

    r, _ = push(cli, as_login(central, "hostb"))
    assert r.code == 1
    assert "is not enrolled in the central database as a host that login hostb may push" in r.err, r.err
    assert all(n == 0 for n in central_counts(central).values())

    # A client that skips its own check: the database refuses the checkpoints and blobs itself.
    from amdflash.store.central import pushing as central_module

    hosta = host_id(central, "hosta")
    own_host = central_module._own_host
    monkeypatch.setattr(central_module, "_own_host", lambda pg, public: (hosta, "hosta"))
    r, _ = push(cli, as_login(central, "hostb"))
    assert r.code == 1
    assert "of host hosta" in r.err and "login hostb is bound to host hostb and may push only that host's" in r.err
    assert all(n == 0 for n in central_counts(central).values())
    # Only the client's check is put back: monkeypatch.undo() would also drop the test's
    # database, key and directories.
    monkeypatch.setattr(central_module, "_own_host", own_host)

    r, done = push(cli, as_login(central, "hosta"))      # hosta's own login pushes its own trail
    assert r.code == 0, r.err
    assert done["checkpoints"] > 0 and psql(central, "SELECT DISTINCT pushed_by FROM amdflash.checkpoints") == "hosta"


# -- attack 6: each push login reads its own host only; a quota on blobs ----------------------

def test_a_push_login_reads_only_its_own_hosts_rows_and_blobs(cli, make_board, image, central, tmp_path,
                                                              monkeypatch):
    for name in ("hosta", "hostb"):
        become(monkeypatch, tmp_path, name)
        flash(cli, make_board, image)
        enrol(cli, central, tmp_path, name)
        assert push(cli, as_login(central, name))[0].code == 0
    reader = f"reviewer_{os.getpid()}_{time.monotonic_ns()}"   # roles are the cluster's, shared by every test database
    psql(central, f"CREATE ROLE {reader} LOGIN IN ROLE amdflash_read")
    a, b = host_id(central, "hosta"), host_id(central, "hostb")

    for table in ("runs", "log_spi", "blobs", "checkpoints", "hosts", "blob_usage", "progress_usage"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            psql(as_login(central, "hosta"), f"SELECT count(*) FROM amdflash.{table}")
    for view in ("own_runs", "own_log_spi", "own_blobs", "own_checkpoints", "own_blob_usage"):
        assert psql(as_login(central, "hosta"), f"SELECT DISTINCT host_id FROM amdflash.{view}") == str(a), view
        assert psql(as_login(central, "hostb"), f"SELECT DISTINCT host_id FROM amdflash.{view}") == str(b), view
        assert psql(as_login(central, reader), f"SELECT DISTINCT host_id FROM amdflash.{view} ORDER BY 1"
                    ) == f"{a}\n{b}", view
    assert psql(as_login(central, "hosta"), "SELECT name FROM amdflash.own_hosts") == "hosta"
    # SET ROLE to the shared group does not widen what a login reads: the rows follow session_user.
    assert psql(as_login(central, "hosta"), "SELECT count(DISTINCT host_id) FROM amdflash.own_runs",
                role="amdflash_push") == "1"
    reviewer = as_login(central, reader)                 # reviewers read every host, table and view
    assert psql(reviewer, "SELECT count(DISTINCT host_id) FROM amdflash.blobs") == "2"
    assert sorted(r["host"] for r in json.loads(cli("fleet", "runs", "--from", reviewer, "--format", "json").out)) \
        == ["hosta", "hostb"]
    r = cli("fleet", "runs", "--from", reviewer, "--host", "hostb", "--format", "json")
    assert [row["host"] for row in json.loads(r.out)] == ["hostb"]


def test_a_push_over_the_hosts_blob_quota_is_refused_naming_host_and_quota(cli, make_board, image, postgres,
                                                                          tmp_path, monkeypatch):
    url = make_central(postgres)
    psql(url, "DROP SCHEMA amdflash CASCADE")                # set up again, with a default quota of 1 MiB
    assert cli("fleet", "central-setup", url, "--blob-quota", "1M").code == 0
    assert psql(url, "SELECT value FROM amdflash.meta WHERE key = 'blob_quota'") == str(1 << 20)

    db, _ = become(monkeypatch, tmp_path, "hosta")
    flash(cli, make_board, image)
    size = sqlite3.connect(db).execute("SELECT sum(length(data)) FROM blobs").fetchone()[0]
    enrol(cli, url, tmp_path, "hosta", "--blob-quota", str(size - 1))
    r, _ = push(cli, as_login(url, "hosta"))
    assert r.code == 1
    assert f"refused: host hosta would hold {size} bytes of blobs, over its quota of {size - 1} bytes" in r.err, r.err
    assert "nothing of this batch was stored" in r.err
    assert all(n == 0 for n in central_counts(url).values())

    db, _ = become(monkeypatch, tmp_path, "hostb")           # the default quota: pushed
    flash(cli, make_board, image)
    enrol(cli, url, tmp_path, "hostb")
    r, done = push(cli, as_login(url, "hostb"))
    assert r.code == 0 and done["blob_bytes"] < 1 << 20, r.err
    assert psql(url, "SELECT bytes FROM amdflash.blob_usage") == str(done["blob_bytes"])


# -- attack 7: runs are named by their host --------------------------------------------------------

def test_fleet_report_names_runs_by_host(cli, make_board, image, central, tmp_path, monkeypatch):
    runs = {}
    for name in ("hosta", "hostb"):
        become(monkeypatch, tmp_path, name)
        runs[name] = flash(cli, make_board, image)
        enrol(cli, central, tmp_path, name)
        assert push(cli, as_login(central, name))[0].code == 0
    prefix = os.path.commonprefix(list(runs.values()))
    assert prefix                                            # run IDs start with their time: a shared prefix

    r = cli("fleet", "report", prefix, "--from", central)
    assert r.code == 2 and "matches runs of hosts hosta, hostb" in r.err and "HOST/RUN" in r.err, r.err
    for name, run_id in runs.items():
        for how in ((f"{name}/{prefix}",), (prefix, "--host", name)):
            r = cli("fleet", "report", *how, "--from", central, "--format", "json")
            assert r.code == 0, r.err
            assert json.loads(r.out)["run_id"] == run_id
    r = cli("fleet", "report", f"hostb/{runs['hosta']}", "--from", central)
    assert r.code == 1 and f"no run '{runs['hosta']}' of host hostb" in r.err


# -- issue 19: the central views agree with the host's ------------------------------------------

@pytest.mark.slow
def test_fleet_runs_shows_a_killed_then_resumed_run_as_interrupted(cli, make_board, image, db, central, tmp_path):
    board = make_board(transport="ideal", content="blank", faults=["kill-after-writes=40000"])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    killed = subprocess.run([sys.executable, "-m", "amdflash.pipeline.cli", "-q", "flash", str(image), "--yes",
                             "--force", "--board", f"sim:{board}"], env=env, capture_output=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 30                         # the killed host's writer seals what it committed
    while "unsealed" in cli("audit", "verify").out and time.monotonic() < deadline:
        time.sleep(0.2)
    assert cli("resume", "--board", f"sim:{board}", "--yes").code == 0
    enrol(cli, central, tmp_path, "hosta")
    assert push(cli, central)[0].code == 0

    here = {r["run_id"]: r["status"] for r in json.loads(cli("runs", "--format", "json").out)}
    assert sorted(here.values()) == ["interrupted", "succeeded"]
    there = {r["run_id"]: r["status"] for r in json.loads(cli("fleet", "runs", "--from", central, "--format",
                                                               "json").out)}
    assert there == here


def test_fleet_report_with_a_wrong_key_exits_1(cli, make_board, image, central, tmp_path):
    run_id = flash(cli, make_board, image)
    enrol(cli, central, tmp_path, "hosta")
    assert push(cli, central)[0].code == 0
    wrong = tmp_path / "wrong.pub"
    wrong.write_text(keys.public_line(keys.public_bytes(keys.Ed25519PrivateKey.generate())) + "\n")
    r = cli("fleet", "report", run_id, "--from", central, "--key", wrong)
    # The run does not verify under that key: refused (not rendered), naming why.
    assert r.code == 1 and "does not verify" in r.err and "not a given --key" in r.err, (r.code, r.err)
    # ... and where to check it: its own trail, on its host (the copy read here is a temporary
    # file, gone when the command ends: the check named it, with --db).
    assert f"amdflash audit verify --run {run_id} on hosta checks its own trail" in r.err, r.err
    assert "amdflash-central-" not in r.err and "--db" not in r.err, r.err
    assert cli("fleet", "report", run_id, "--from", central, "--key", tmp_path / "hosta.pub").code == 0


# -- attack 3: the central record is the off-host anchor -----------------------------------------

def snapshot(db: Path, to: Path) -> None:
    """A consistent copy of the database, and of its anchor file (the pair an attacker restores)."""
    with sqlite3.connect(db) as src, sqlite3.connect(to) as dst:
        src.backup(dst)
    anchor = Path(f"{db}.anchor")
    if anchor.exists():
        Path(f"{to}.anchor").write_bytes(anchor.read_bytes())


def restore(copy: Path, db: Path) -> None:
    for suffix in ("", "-wal", "-shm", ".anchor"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    snapshot(copy, db)


def test_a_trail_rolled_back_after_it_was_pushed_is_broken_against_central(cli, make_board, image, db, central,
                                                                           tmp_path):
    flash(cli, make_board, image)
    older = tmp_path / "older.sqlite"
    snapshot(db, older)
    kept = len(load_checkpoints(sqlite3.connect(older)))
    flash(cli, make_board, image)
    enrol(cli, central, tmp_path, "hosta")
    assert push(cli, central)[0].code == 0
    flash(cli, make_board, image)                            # a third run, not pushed yet
    r = cli("audit", "verify", "--central", central)
    assert r.code == 0, r.out + r.err
    assert "all in this database unchanged" in r.out and "not pushed yet" in r.out

    restore(older, db)                                       # the database and its anchor, as they were
    assert cli("audit", "verify").code == 0                  # the host's own check: consistent, intact
    r = cli("audit", "verify", "--central", central)
    assert r.code == 1
    assert "BROKEN against the central record" in r.out and f"this database's last is #{kept}" in r.out, r.out
    assert f"checkpoint #{kept + 1} " in r.out and "rolled back" in r.out

    before = central_counts(central)
    r, _ = push(cli, central)                                # not "nothing to push": refused, and why
    assert r.code == 1
    assert "contradicts the central record" in r.err and f"this database's last is #{kept}" in r.err, r.err
    assert central_counts(central) == before


def test_a_trail_rewritten_and_resigned_with_the_stolen_key_is_broken_against_central(
        cli, make_board, image, db, central, tmp_path, host_key):
    run_id = flash(cli, make_board, image)
    flash(cli, make_board, image)
    pub = enrol(cli, central, tmp_path, "hosta")
    assert push(cli, central)[0].code == 0
    honest = {c.id: c.hash for c in load_checkpoints(sqlite3.connect(db))}

    con = sqlite3.connect(db, isolation_level=None)          # whoever has the account and the key
    con.execute("BEGIN")
    drop_triggers(con)
    con.execute("UPDATE runs SET operator = 'someone else' WHERE run_id = ?", (run_id,))
    con.execute("COMMIT")
    con.close()
    forge(db, run_id, keys.load_private(host_key), anchor=Path(f"{db}.anchor"))
    first = min(i for i, c in ((c.id, c) for c in load_checkpoints(sqlite3.connect(db))) if honest[i] != c.hash)
    assert cli("audit", "verify", "--key", pub).code == 0    # re-signed by the host's own key: locally intact

    r = cli("audit", "verify", "--key", pub, "--central", central)
    assert r.code == 1
    assert "BROKEN against the central record" in r.out and f"checkpoint #{first} differs" in r.out, r.out
    assert "rewritten after it was pushed" in r.out
    r, _ = push(cli, central)
    assert r.code == 1 and f"checkpoint #{first} differs" in r.err, r.err


def test_verify_against_central_needs_an_enrolled_host(cli, make_board, image, db, central, tmp_path):
    flash(cli, make_board, image)
    r = cli("audit", "verify", "--central", central)
    assert r.code == 1 and "is not enrolled in the central database" in r.err, r.err
    enrol(cli, central, tmp_path, "hosta")
    r = cli("audit", "verify", "--central", central)         # enrolled, nothing pushed yet
    assert r.code == 0 and "holds no checkpoint of host hosta yet" in r.out, r.out
