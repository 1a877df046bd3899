"""Live progress in the central record (issue 22): the progress table a push login may write only
for its own host, and the host's follow service (`audit push --follow`) that publishes its
runs' stage, bytes, rate, ETA and every end from the trail within about two seconds, pushes
the signed trail after every end, and catches up after central was out of reach."""
from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.pipeline.fleet.central_trail import new_database, psql
from tests.pipeline.fleet.lab import wait_for
from tests.pipeline.fleet.test_central import make_central
from tests.pipeline.fleet.test_central_trust import as_login, become, enrol, host_id
from tests.pipeline.engine.conftest import ROOT

psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed (pip install '.[test]' brings it)")


@pytest.fixture
def central(postgres) -> str:
    return make_central(postgres)


def progress(url: str, where: str = "true") -> list[dict]:
    with psycopg.connect(url, autocommit=True) as pg:
        cur = pg.execute(f"SELECT * FROM amdflash.progress WHERE {where} ORDER BY id")
        names = [d.name for d in cur.description]
        return [dict(zip(names, r)) for r in cur]


def insert(url: str, host: int, run_id: str = "20260101T000000-00000000", state: str = "running", **extra) -> None:
    # `at` is the host's clock, which the database takes only within minutes of its own
    columns = {"host_id": host, "run_id": run_id, "state": state, "at": dt.datetime.now(dt.UTC), **extra}
    names = ", ".join(columns)
    with psycopg.connect(url, autocommit=True) as pg:
        pg.execute(f"INSERT INTO amdflash.progress ({names}) VALUES ({', '.join(['%s'] * len(columns))})",
                   list(columns.values()))


def test_a_push_login_publishes_and_reads_progress_of_its_own_host_only(cli, central, tmp_path, monkeypatch):
    become(monkeypatch, tmp_path, "hosta")
    enrol(cli, central, tmp_path, "hosta")
    become(monkeypatch, tmp_path, "hostb")
    enrol(cli, central, tmp_path, "hostb")
    a, b = host_id(central, "hosta"), host_id(central, "hostb")
    as_a = as_login(central, "hosta")

    insert(as_a, a, stage="program", bytes_done=4096, bytes_total=8192, id=1, sent_by="hostb",
           received_at="2000-01-01T00:00:00Z")
    with pytest.raises(psycopg.errors.InsufficientPrivilege,
                       match="progress of host hostb: login hosta is bound to host hosta"):
        insert(as_a, b)                               # another host's progress: refused by the database
    insert(central, b, run_id="20260101T000000-11111111")   # the administrator may speak for any host
    mine = progress(central)
    assert [(r["host_id"], r["sent_by"]) for r in mine] == [(a, "hosta"), (b, "amdflash")]
    # arrival and sender are the database's own, whatever the client sent
    assert mine[0]["received_at"].year > 2000 and mine[0]["sent_by"] == "hosta"

    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        psql(as_a, "SELECT * FROM amdflash.progress")               # not the table itself
    assert psql(as_a, "SELECT DISTINCT host_id FROM amdflash.own_progress") == str(a)   # only its own rows
    reader = f"reviewer_{os.getpid()}_{time.monotonic_ns()}"   # roles are the cluster's, shared by every test database
    psql(central, f"CREATE ROLE {reader} LOGIN IN ROLE amdflash_read")
    assert psql(as_login(central, reader), "SELECT count(*) FROM amdflash.progress") == "2"
    with pytest.raises(psycopg.errors.InsufficientPrivilege):      # reviewers read, never write
        insert(as_login(central, reader), a)
    for sql in ("UPDATE amdflash.progress SET state = 'succeeded'", "DELETE FROM amdflash.progress",
                "TRUNCATE amdflash.progress"):
        with pytest.raises(psycopg.Error, match="insert-only"):
            psql(central, sql)                                       # not even its owner
    assert len(progress(central)) == 2


def test_every_insert_notifies_listeners(central, cli, tmp_path, monkeypatch):
    from amdflash.store.central import progress_channel

    become(monkeypatch, tmp_path, "hosta")
    enrol(cli, central, tmp_path, "hosta")
    with psycopg.connect(central, autocommit=True) as listener:
        listener.execute(f"LISTEN {progress_channel(listener)}")
        insert(as_login(central, "hosta"), host_id(central, "hosta"))
        heard = list(listener.notifies(timeout=5, stop_after=1))
    assert heard and heard[0].payload == ""          # a wake-up only: the listener reads the rows


def _follow(db: Path, url: str, key: Path, log: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AMDFLASH_HOST_KEY": str(key), "AMDFLASH_DB": str(db),
           "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "amdflash.pipeline.cli", "audit", "push", "--follow", "--to", url,
                             "--interval", "0.2", *extra], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


def _amdflash(db: Path, key: Path, *args: object) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AMDFLASH_HOST_KEY": str(key), "AMDFLASH_DB": str(db)}
    return subprocess.Popen([sys.executable, "-m", "amdflash.pipeline.cli", "-q", *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _ended(db: Path, run_id: str) -> dt.datetime:
    """When the host's trail recorded the run's end (its run_status row)."""
    import sqlite3

    con = sqlite3.connect(db)
    try:
        at = con.execute("SELECT at FROM run_status WHERE run_id = ? ORDER BY seq DESC LIMIT 1", (run_id,)).fetchone()[0]
    finally:
        con.close()
    return dt.datetime.fromisoformat(at)


def _runs(cli) -> list[dict]:
    return json.loads(cli("runs", "--format", "json").out)


@pytest.mark.slow   # a long scenario: CI runs it (pytest -m slow)
@pytest.mark.wall_clock   # its 2-second target: CI runs it on its own (pytest -m wall_clock -n 0)
def test_the_follow_service_publishes_progress_and_every_end_within_two_seconds(cli, make_board, image, central, db,
                                                                               tmp_path, monkeypatch):
    """Three flashes on one host: one succeeds, one fails on a stuck bit, one is SIGKILLed. The
    host's follow service puts each one's progress (stage, bytes) and its end, as the host's own
    `runs` says it, into the central record within two seconds of the trail recording it, and
    pushes the signed trail after each end."""
    key = tmp_path / "hosta" / "host_key.pem"
    monkeypatch.setenv("AMDFLASH_HOST_KEY", str(key))
    enrol(cli, central, tmp_path, "hosta")
    as_a = as_login(central, "hosta")
    assert cli("info", "--board", f"sim:{make_board(transport='ideal')}").code == 0    # the trail exists
    follower = _follow(db, as_a, key, tmp_path / "follow.log")
    try:
        # The service is up (its first "alive" row) before the first flash starts: a flash of
        # a second would otherwise end before the service has read the trail at all.
        wait_for(lambda: progress(central, "state = 'alive'"), 60, "the follow service to start")
        img = image.read_bytes()
        stuck = next(a for a in range(0x10000, 0x20000) if not img[a] & 1)
        good = make_board(transport="ideal", realtime_scale=0.3)
        bad = make_board(transport="ideal", faults=[f"stuck-bit={stuck:#x}:0"])
        killed = make_board(transport="ideal", realtime_scale=0.5)

        done = _amdflash(db, key, "flash", image, "--yes", "--sector-count", "64", "--board", f"sim:{good}")
        # Progress arrives while the flash runs: a stage and bytes done of bytes planned.
        wait_for(lambda: [r for r in progress(central, "state = 'running' AND bytes_total > 0")], 60,
                 "a running row with bytes")
        assert done.wait(120) == 0, done.stderr.read()
        ok = _runs(cli)[-1]
        row = wait_for(lambda: progress(central, f"run_id = '{ok['run_id']}' AND state = 'succeeded'"), 30, "its end")[0]
        assert row["bytes_done"] == row["bytes_total"] == 64 * 0x1000 and row["board"] == f"sim:{good}"
        assert (row["received_at"] - _ended(db, ok["run_id"])).total_seconds() < 2.0, row
        assert {r["stage"] for r in progress(central, f"run_id = '{ok['run_id']}' AND state = 'running'")} - {None}
        # The signed trail follows the end: the run is in the record, verified by the database.
        wait_for(lambda: psql(central, f"SELECT status FROM amdflash.run_status WHERE run_id = '{ok['run_id']}' "
                 "ORDER BY seq DESC LIMIT 1")
                 == "succeeded", 30, "the end pushed")

        assert _amdflash(db, key, "flash", image, "--yes", "--board", f"sim:{bad}").wait(120) == 1
        failed = _runs(cli)[-1]
        row = wait_for(lambda: progress(central, f"run_id = '{failed['run_id']}' AND state = 'failed'"), 30,
                       "the failure")[0]
        assert (row["received_at"] - _ended(db, failed["run_id"])).total_seconds() < 2.0, row
        assert f"{stuck:#08x}" in row["error"] or f"{stuck:#x}" in row["error"], row["error"]

        victim = _amdflash(db, key, "flash", image, "--yes", "--board", f"sim:{killed}")
        wait_for(lambda: progress(central, "state = 'running' AND bytes_done > 0 AND board = "
                                  f"'sim:{killed}'"), 60, "the flash to get going")
        os.killpg(victim.pid, signal.SIGKILL)
        killed_at = time.time()
        victim.wait()
        lost = _runs(cli)[-1]
        assert lost["status"] == "interrupted"       # the host's own view: no end, process gone
        row = wait_for(lambda: progress(central, f"run_id = '{lost['run_id']}' AND state = 'interrupted'"), 30,
                       "the kill")[0]
        assert row["received_at"].timestamp() - killed_at < 2.0
        assert "no end recorded" in row["error"]
    finally:
        follower.send_signal(signal.SIGTERM)
        assert follower.wait(30) == 0, (tmp_path / "follow.log").read_text()
    # Every row says the same host, by the login bound to it.
    assert {(r["host_id"], r["sent_by"]) for r in progress(central)} == {(host_id(central, "hosta"), "hosta")}


def test_a_host_that_cannot_reach_central_keeps_flashing_and_catches_up(cli, make_board, image, db, postgres,
                                                                        tmp_path, monkeypatch):
    """The follow service starts while the central database does not exist yet: the flash goes on
    untouched; once central is there, the run's end and its signed trail arrive."""
    key = tmp_path / "hosta" / "host_key.pem"
    monkeypatch.setenv("AMDFLASH_HOST_KEY", str(key))
    url = new_database(postgres)
    missing = url.replace("/central_", "/later_")
    assert cli("info", "--board", f"sim:{make_board(transport='ideal')}").code == 0
    follower = _follow(db, missing, key, tmp_path / "follow.log")
    try:
        board = make_board(transport="ideal")
        started = time.monotonic()
        assert cli("flash", image, "--yes", "--sector-count", "16", "--board", f"sim:{board}").code == 0
        assert time.monotonic() - started < 60
        run_id = _runs(cli)[-1]["run_id"]
        wait_for(lambda: "central database not reachable" in (tmp_path / "follow.log").read_text(), 30,
                 "the follow service to say central is out of reach")
        # central comes up: set up, the host enrolled
        psql(postgres.dsn, f"CREATE DATABASE {missing.split('@/')[1].split('?')[0]}")
        assert cli("fleet", "central-setup", missing).code == 0
        enrol(cli, missing, tmp_path, "hosta")
        row = wait_for(lambda: progress(missing, f"run_id = '{run_id}' AND state = 'succeeded'"), 60,
                       "the end, caught up")[0]
        assert row["at"] < row["received_at"]        # said with the host's own time, sent later
        wait_for(lambda: psql(missing, f"SELECT status FROM amdflash.run_status WHERE run_id = '{run_id}' "
                 "ORDER BY seq DESC LIMIT 1")
                 == "succeeded", 60, "the signed trail")
    finally:
        follower.send_signal(signal.SIGTERM)
        follower.wait(30)
    log = (tmp_path / "follow.log").read_text()
    assert "reachable again" in log and "Traceback" not in log, log


def test_a_version_2_central_database_is_refused_then_upgraded_in_place(cli, make_board, image, central, db,
                                                                         tmp_path):
    """A database set up before progress existed (version 2: the same, less the progress table)
    is refused with the command that upgrades it; the upgrade keeps every stored row."""
    from tests.pipeline.fleet.test_central import enroll, flash, push

    flash(cli, make_board, image)
    enroll(cli, central, tmp_path)
    assert push(cli, central)[0].code == 0
    before = psql(central, "SELECT count(*) FROM amdflash.runs") + psql(central, "SELECT count(*) FROM "
                                                                        "amdflash.checkpoints")
    psql(central, "DROP VIEW amdflash.own_progress; DROP TABLE amdflash.progress; DROP SEQUENCE amdflash.progress_id;"
                  "DROP FUNCTION amdflash.check_progress(), amdflash.notify_progress();"
                  "ALTER TABLE amdflash.meta DISABLE TRIGGER meta_insert_only;"
                  "UPDATE amdflash.meta SET value = '2' WHERE key = 'central_version';"
                  "ALTER TABLE amdflash.meta ENABLE TRIGGER meta_insert_only")
    refused = cli("fleet", "runs", "--from", central)
    assert refused.code == 2 or refused.code == 1
    assert "version 2" in refused.err and "fleet central-setup" in refused.err, refused.err
    upgraded = cli("fleet", "central-setup", central)
    assert upgraded.code == 0 and "upgraded from version 2 to 5" in upgraded.out, upgraded
    assert psql(central, "SELECT count(*) FROM amdflash.runs") + psql(central, "SELECT count(*) FROM "
                                                                      "amdflash.checkpoints") == before
    assert cli("fleet", "runs", "--from", central).code == 0
    insert(as_login(central, "hosta"), host_id(central, "hosta"))
    with pytest.raises(psycopg.Error, match="insert-only"):
        psql(central, "UPDATE amdflash.meta SET value = '9'")      # meta is insert-only again


def test_a_board_plugged_in_while_the_follow_service_runs_is_named_by_its_place(cli, make_board, central, db,
                                                                                tmp_path, monkeypatch):
    """Issue 27 item 3: a board plugged in makes the exporter write its board list afresh; the
    follow service, still running, names the new board's runs by their place (as the line knows
    them), not by their spec, with no restart."""
    from amdflash.pipeline.fleet.live import Follower, places_from

    key = tmp_path / "hosta" / "host_key.pem"
    monkeypatch.setenv("AMDFLASH_HOST_KEY", str(key))
    enrol(cli, central, tmp_path, "hosta")
    config = tmp_path / "exporter.yaml"
    first = make_board(transport="ideal")

    def board_list(*boards: Path) -> None:       # as the exporter's start writes it (amdflash-exporter.service)
        sims = [a for b in boards for a in ("--sim", str(b))]
        assert cli("fleet", "exporter-config", "--no-hardware", *sims, "-o", config).code == 0

    board_list(first)
    assert cli("info", "--board", f"sim:{first}").code == 0
    follower = Follower(str(db), central, push=False, exporter_config=config, host_name="hosta",
                        log=lambda line: None)
    try:
        follower.tick()
        plugged = make_board(transport="ideal")
        board_list(first, plugged)
        assert cli("info", "--board", f"sim:{plugged}").code == 0
        for _ in range(2):
            follower.tick()
    finally:
        follower.watch.close()
        follower.pg.close()
    place = places_from(config, "hosta")[f"sim:{plugged}"]
    [row] = progress(central, f"board = 'sim:{plugged}'")
    assert row["place"] == place and place.startswith("hosta-"), row
