"""The central record keeps its word (issue 28, items 2, 3, 10 and 13, the database's side):

* a progress row is checked by PostgreSQL itself: finite numbers within bounds, names of their
  shape, the host's clock near the server's; a row no view could read is refused, naming the field;
* a push login can neither listen to the progress wake-ups nor send one: their channel's name is
  the reviewers' to read, and a wake-up carries nothing;
* `run_owners` and `blob_usage` change only by the push checks: the owner's own UPDATE, DELETE,
  INSERT or TRUNCATE is refused, so no run ID is reopened and no quota count lowered.
"""
from __future__ import annotations

import datetime as dt
import os
import sqlite3
import time

import pytest
from amdflash.store import keys

from tests.pipeline.fleet.central_trail import central_counts, psql
from tests.pipeline.fleet.test_central import flash, make_central, push
from tests.pipeline.fleet.test_central_trust import as_login, become, enrol, host_id
from tests.store.test_forgery import forge

psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed (pip install '.[test]' brings it)")

RUN = "20261203T120000-0123abcd"


@pytest.fixture
def central(postgres) -> str:
    return make_central(postgres)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _insert(url: str, host: int, **values) -> None:
    row = {"host_id": host, "run_id": RUN, "state": "running", "at": _now(), **values}
    with psycopg.connect(url, autocommit=True) as pg:
        pg.execute(f"INSERT INTO amdflash.progress ({', '.join(row)}) VALUES ({', '.join(['%s'] * len(row))})",
                   list(row.values()))


def _reviewer(url: str) -> str:
    name = f"reviewer_{os.getpid()}_{time.monotonic_ns()}"    # roles are the cluster's, shared by every test
    psql(url, f"CREATE ROLE {name} LOGIN IN ROLE amdflash_read")
    return as_login(url, name)


# Each value a host's login could write that the line view cannot take (item 2: a number that is
# no number; item 3: a time no reader can load), or that is not of its documented shape.
REFUSED = [
    ("rate", "Infinity"), ("rate", "NaN"), ("eta", "NaN"), ("eta", "Infinity"), ("eta", 1e300),
    ("bytes_total", 1 << 62), ("checkpoint", -5),
    ("at", "infinity"), ("at", "-infinity"), ("at", "10000-01-01T00:00:00Z"), ("at", "0001-01-01T00:00:00Z"),
    ("at", "now+1h"), ("at", "now-8d"),
    ("run_id", "javascript:alert(3)"), ("run_id", RUN + "\n"), ("resumes", "../../etc"),
    ("place", "<script>alert(1)</script>"), ("place", "hosta-sim-0\u202e"), ("board", "file:/etc/passwd"),
    ("board", "sim:/a\x1b[2J"), ("command", "flash; rm"), ("stage", "program\r\n"), ("image_sha256", "xyz"),
    ("started", "infinity"),
]


@pytest.mark.parametrize(("column", "value"), REFUSED, ids=[f"{c}={v!r}" for c, v in REFUSED])
def test_a_progress_row_no_view_could_take_is_refused_naming_its_field(cli, central, tmp_path, monkeypatch,
                                                                        column, value):
    become(monkeypatch, tmp_path, "hosta")
    enrol(cli, central, tmp_path, "hosta")
    a, as_a = host_id(central, "hosta"), as_login(central, "hosta")
    if isinstance(value, str) and value.startswith("now"):
        value = _now() + (dt.timedelta(hours=1) if value == "now+1h" else -dt.timedelta(days=8))
    with pytest.raises(psycopg.errors.CheckViolation, match=rf"progress_{column}_check|its {column} = "):
        _insert(as_a, a, **{column: value})
    with pytest.raises(psycopg.errors.CheckViolation):
        _insert(central, a, **{column: value})          # nor from the administrator
    assert psql(central, "SELECT count(*) FROM amdflash.progress") == "0"


def test_a_row_as_the_follow_service_sends_it_is_taken(cli, central, tmp_path, monkeypatch):
    """What an honest host says passes every check: a running row, an end recorded days ago
    while central was out of reach, a heartbeat; a value of the host's that is not of its shape
    (a place after an unusual host name) costs that value only, not the batch (publish_progress)."""
    from amdflash.store.central import connect, publish_progress

    become(monkeypatch, tmp_path, "hosta")
    enrol(cli, central, tmp_path, "hosta")
    a = host_id(central, "hosta")
    running = {"run_id": RUN, "state": "running", "command": "hardware-report", "board": "sim:/line/hosta/board 0",
               "place": "Host A-sim-0", "stage": "program", "bytes_done": 4096, "bytes_total": 2 << 20,
               "rate": 40960.5, "eta": 50.1, "image_sha256": "ab" * 32, "resumes": "20261202T235959-ffffffff",
               "started": "2026-12-03T12:00:00.123+00:00", "at": _now().isoformat()}
    ended = {"run_id": "20261201T000000-00000001", "state": "failed", "error": "verify failed\nat 0x1000",
             "rate": float("nan"), "at": (_now() - dt.timedelta(days=6)).isoformat()}
    alive = {"run_id": None, "state": "alive", "at": (_now() + dt.timedelta(minutes=4)).isoformat()}
    with connect(as_login(central, "hosta"), autocommit=True) as pg:
        publish_progress(pg, a, [running, ended, alive], 12)
    rows = psql(central, "SELECT state, place, rate, stage, error IS NOT NULL FROM amdflash.progress ORDER BY id")
    assert rows.splitlines() == ["running||40960.5|program|False", "failed||||True", "alive||||False"]


def test_a_push_login_can_neither_listen_to_nor_send_progress_wake_ups(cli, central, tmp_path, monkeypatch):
    from amdflash.store.central import CentralError, progress_channel

    for name in ("hosta", "hostb"):
        become(monkeypatch, tmp_path, name)
        enrol(cli, central, tmp_path, name)
    as_a, b = as_login(central, "hosta"), host_id(central, "hostb")
    with psycopg.connect(as_a, autocommit=True) as spy, psycopg.connect(_reviewer(central), autocommit=True) as view:
        with pytest.raises(CentralError, match="listen as a reviewer login"):
            progress_channel(spy)                               # the channel's name is not a push login's
        spy.execute("LISTEN amdflash_progress")                 # the documented name carries nothing
        channel = progress_channel(view)
        view.execute(f"LISTEN {channel}")
        _insert(as_login(central, "hostb"), b)
        heard = list(view.notifies(timeout=5, stop_after=1))
        assert [n.payload for n in heard] == [""]               # a wake-up, no row id, no host
        assert list(spy.notifies(timeout=1, stop_after=1)) == []
        spy.execute("NOTIFY amdflash_progress, 'wake up'")      # a push login cannot wake the views either
        assert list(view.notifies(timeout=1, stop_after=1)) == []
    with pytest.raises(psycopg.Error, match="insert-only"):
        psql(central, "UPDATE amdflash.progress_channel SET name = 'amdflash_progress_' || repeat('0', 32)")


def test_run_owners_and_blob_usage_refuse_change_even_from_their_owner(cli, make_board, image, central, tmp_path,
                                                                       monkeypatch):
    """Item 13: the administrator (a superuser, the tables' owner) empties run_owners, then hostb
    pushes a copy of hosta's run re-signed with its own key: still refused, naming hosta."""
    db_a, _ = become(monkeypatch, tmp_path, "hosta")
    run_id = flash(cli, make_board, image)
    enrol(cli, central, tmp_path, "hosta")
    assert push(cli, central)[0].code == 0
    owners, usage = (psql(central, f"SELECT * FROM amdflash.{t} ORDER BY 1") for t in ("run_owners", "blob_usage"))
    assert owners and usage
    for sql in ("TRUNCATE amdflash.run_owners", "DELETE FROM amdflash.run_owners", "UPDATE amdflash.run_owners "
                "SET host_id = host_id + 1", "INSERT INTO amdflash.run_owners VALUES ('20991231T000000-00000000', 1)",
                "TRUNCATE amdflash.blob_usage", "DELETE FROM amdflash.blob_usage", "UPDATE amdflash.blob_usage "
                "SET bytes = 0", "INSERT INTO amdflash.blob_usage VALUES (99, -1)"):
        with pytest.raises(psycopg.Error, match="refused: .*(insert-only|kept by the push checks only)"):
            psql(central, sql)
    assert [psql(central, f"SELECT * FROM amdflash.{t} ORDER BY 1") for t in ("run_owners", "blob_usage")] == \
        [owners, usage]

    db_b, key_b = become(monkeypatch, tmp_path, "hostb")
    enrol(cli, central, tmp_path, "hostb")
    with sqlite3.connect(db_a) as src, sqlite3.connect(db_b) as dst:
        src.backup(dst)
    forge(db_b, run_id, keys.load_private(key_b))
    before = central_counts(central)
    r, _ = push(cli, as_login(central, "hostb"))
    assert r.code == 1 and f"run {run_id} of host hostb: that run ID was stored first by host hosta" in r.err, r.err
    assert central_counts(central) == before


def test_a_version_3_database_set_up_before_the_checks_is_brought_up_to_date(cli, central, tmp_path, monkeypatch):
    """`fleet central-setup` again on a database set up before these checks adds them in place
    (the progress rows it holds are kept as they are)."""
    psql(central, "DROP TRIGGER run_owners_kept ON amdflash.run_owners;"
                  "DROP TRIGGER run_owners_no_truncate ON amdflash.run_owners;"
                  "ALTER TABLE amdflash.progress DROP CONSTRAINT progress_rate_checked")
    become(monkeypatch, tmp_path, "hosta")
    enrol(cli, central, tmp_path, "hosta")
    a = host_id(central, "hosta")
    _insert(central, a, rate="NaN")                   # stored before the checks
    done = cli("fleet", "central-setup", central)
    assert done.code == 0 and "brought up to date" in done.out, done
    with pytest.raises(psycopg.errors.CheckViolation, match="progress_rate_checked"):
        _insert(central, a, rate="Infinity")
    with pytest.raises(psycopg.Error, match="refused: the central audit tables are insert-only"):
        psql(central, "TRUNCATE amdflash.run_owners")
    assert psql(central, "SELECT count(*) FROM amdflash.progress WHERE rate = 'NaN'") == "1"
    assert "already set up" in cli("fleet", "central-setup", central).out
