"""The central record keeps its word (issue 28, items 2, 3, 10 and 13, the database's side):

* a progress row is checked by PostgreSQL itself: finite numbers within bounds, names of their
  shape, the host's clock near the server's; a row no view could read is refused, naming the field;
* a push login can neither listen to the progress wake-ups nor send one: their channel's name is
  the reviewers' to read, and a wake-up carries nothing;
* `blob_usage` and `progress_usage` change only by the push checks: the administrator's own
  UPDATE, DELETE, INSERT or TRUNCATE is refused, so no quota count is lowered (the upgrade of a
  version 3 database: test_central_bounds.py).
"""
from __future__ import annotations

import datetime as dt
import os
import time

import pytest

from tests.pipeline.fleet.central_trail import psql
from tests.pipeline.fleet.test_central import flash, make_central, push
from tests.pipeline.fleet.test_central_trust import as_login, become, enrol, host_id

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


def test_the_bookkeeping_refuses_change_even_from_the_administrator(cli, make_board, image, central, tmp_path,
                                                                     monkeypatch):
    """Item 13: the administrator (a superuser) cannot lower a host's blob count or refill its
    progress buckets by a statement of its own: only the push checks write them."""
    become(monkeypatch, tmp_path, "hosta")
    flash(cli, make_board, image)
    enrol(cli, central, tmp_path, "hosta")
    assert push(cli, central)[0].code == 0
    _insert(central, host_id(central, "hosta"))
    tables = ("blob_usage", "progress_usage")
    kept = [psql(central, f"SELECT * FROM amdflash.{t} ORDER BY 1") for t in tables]
    assert all(kept)
    for sql in ("TRUNCATE amdflash.blob_usage", "DELETE FROM amdflash.blob_usage", "UPDATE amdflash.blob_usage "
                "SET bytes = 0", "INSERT INTO amdflash.blob_usage VALUES (99, -1)",
                "TRUNCATE amdflash.progress_usage", "DELETE FROM amdflash.progress_usage",
                "UPDATE amdflash.progress_usage SET rows_left = 1e9, day_rows = 0",
                "INSERT INTO amdflash.progress_usage VALUES (99, 1e9, 1e9, now(), current_date, 0, 0)"):
        with pytest.raises(psycopg.Error, match="refused: .*(insert-only|kept by the push checks only)"):
            psql(central, sql)
    assert [psql(central, f"SELECT * FROM amdflash.{t} ORDER BY 1") for t in tables] == kept
