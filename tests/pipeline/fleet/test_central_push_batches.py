"""The first push's cost per row (issue 42): a batch is a fixed number of statements whatever
its rows (COPY per table, never per row), its rows are streamed from SQLite (memory bounded
by a part, not the trail), the database looks each blob a batch names up once — and the
checks it runs are the same: a row naming a blob the push did not send is refused, naming
the first such row. `central-setup` on a database of this version brings its checks up to
this amdflash's. The speed itself: tests/bench/bench_central_push.py."""
from __future__ import annotations

import json
import re
import shutil
import sqlite3
import tracemalloc
from pathlib import Path

import pytest
from amdflash.store import schema as host_schema
from amdflash.store.central import pushing, sending

from tests.pipeline.fleet.central_trail import central_counts, local_counts, psql
from tests.pipeline.fleet.test_central import enroll, flash, make_central, push

psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed (pip install '.[test]' brings it)")


class Counting(psycopg.Cursor):
    """A cursor that notes each statement it sends (Connection.execute uses one too)."""

    sent: list[str] = []

    def execute(self, query, *args, **kwargs):
        Counting.sent.append(" ".join(str(query).split()[:2]))
        return super().execute(query, *args, **kwargs)

    def copy(self, statement, *args, **kwargs):
        Counting.sent.append(" ".join(str(statement).split()[:2]))
        return super().copy(statement, *args, **kwargs)


def _counted_push(db: Path, url: str, monkeypatch) -> tuple[list[str], list[str], pushing.PushReport]:
    """Push `db` into `url`: (PostgreSQL statements, SQLite statements, report)."""
    Counting.sent = []
    local = host_schema.connect(str(db), readonly=True)
    lite: list[str] = []
    # (the spans of the batch go into a temporary table one by one: a local insert per span)
    local.set_trace_callback(lambda sql: None if sql.startswith("INSERT INTO _push VALUES") else lite.append(sql))
    try:
        with monkeypatch.context() as m:
            m.setattr(pushing, "connect", lambda u: psycopg.connect(u, cursor_factory=Counting))
            report = pushing.push(local, url)
    finally:
        local.close()
    return Counting.sent, lite, report


@pytest.fixture
def trails(cli, make_board, image, db, tmp_path) -> tuple[Path, Path]:
    """(a trail of one flash, a trail of three) of one host."""
    flash(cli, make_board, image)
    one = tmp_path / "one.sqlite"
    shutil.copy(db, one)
    flash(cli, make_board, image)
    flash(cli, make_board, image)
    return one, db


def test_a_push_sends_as_many_statements_for_three_flashes_as_for_one(cli, trails, postgres, tmp_path,
                                                                     monkeypatch):
    one, three = trails
    urls = [make_central(postgres), make_central(postgres)]
    for i, url in enumerate(urls):
        (tmp_path / f"c{i}").mkdir()
        enroll(cli, url, tmp_path / f"c{i}", "hosta")
    pg_one, lite_one, small = _counted_push(one, urls[0], monkeypatch)
    pg_three, lite_three, large = _counted_push(three, urls[1], monkeypatch)
    assert large.rows > 2.5 * small.rows and large.checkpoints > small.checkpoints
    # The same statements, in the same order: a COPY per table holding rows, no statement per row.
    assert pg_three == pg_one, (pg_one, pg_three)
    assert len(lite_three) == len(lite_one), (lite_one, lite_three)
    assert sum(s.startswith("COPY") for s in pg_one) <= 2 + len(host_schema.PHYSICAL) and len(pg_one) <= 30
    for url, trail in zip(urls, (one, three), strict=True):
        assert {t: n for t, n in central_counts(url).items() if t != "blobs"} == local_counts(trail)


def test_a_push_holds_a_part_of_the_rows_not_all_of_them(cli, trails, postgres, tmp_path, monkeypatch):
    """Peak memory of the push (Python's own allocations) does not grow with the trail's rows:
    with parts of 50 rows, three flashes take little more than one (before, every row of the
    batch, and every blob's bytes, were read into lists first)."""
    one, three = trails
    peaks = []
    for trail in (one, three):
        url = make_central(postgres)
        (tmp_path / trail.stem).mkdir()
        enroll(cli, url, tmp_path / trail.stem, "hosta")
        local = host_schema.connect(str(trail), readonly=True)
        monkeypatch.setattr(sending, "FETCH", 50, raising=False)
        tracemalloc.start()
        try:
            report = pushing.push(local, url)
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
            local.close()
        assert report.rows > 0
    rows = [sum(local_counts(t).values()) for t in (one, three)]
    assert rows[1] > 2.5 * rows[0]
    # A row held costs more than 150 bytes (its tuple alone); what grows is per checkpoint and
    # per blob (the batch's checkpoints, the blobs' SHA-256 the database is asked about).
    assert peaks[1] - peaks[0] < 40 * (rows[1] - rows[0]), (peaks, rows)


def test_a_row_naming_a_blob_the_push_did_not_send_is_refused_naming_the_first(cli, make_board, image, db, postgres,
                                                                                tmp_path, monkeypatch):
    """A client that sends the rows but withholds one blob they name: the database refuses the
    batch, naming the first row that names it (the check looks each blob up once, and reads
    the rows one by one only to name that row), and stores nothing."""
    flash(cli, make_board, image)
    url = make_central(postgres)
    enroll(cli, url, tmp_path, "hosta")
    conn = sqlite3.connect(db)
    withheld, table, seq = None, None, None
    for name, columns in host_schema.PHYSICAL.items():
        for column, kind in columns:
            if kind != "ref":
                continue
            found = conn.execute(f"SELECT p.seq, b.sha256 FROM {name} p JOIN blobs b ON b.id = p.{column} "
                                 "ORDER BY p.seq LIMIT 1").fetchone()
            if found and (seq is None or found[0] < seq):
                seq, withheld, table = found[0], bytes(found[1]), name
    conn.close()
    assert withheld is not None
    sent = sending.send_blobs

    def rogue(local, cur, host_id, report):
        local.execute("DELETE FROM _push_blobs WHERE id IN (SELECT id FROM blobs WHERE sha256 = ?)", (withheld,))
        sent(local, cur, host_id, report)

    with monkeypatch.context() as m:
        m.setattr(sending, "send_blobs", rogue)
        r, _ = push(cli, url)
    assert r.code == 1
    assert re.search(rf"refused: first bad row {table} seq {seq} of host hosta: it refers to bytes the central "
                     "database does not hold", r.err), r.err
    assert all(n == 0 for n in central_counts(url).values())
    r, _ = push(cli, url)
    assert r.code == 0, r.err


def test_central_setup_on_this_version_brings_its_row_checks_up_to_date(cli, make_board, image, db, postgres,
                                                                        tmp_path):
    """A database of this version whose row checks an earlier amdflash wrote (before issue 42 each
    blob reference was looked up row by row): `central-setup` again makes them this amdflash's,
    keeping every row and the owner of each check; pushes go on."""
    url = make_central(postgres)
    flash(cli, make_board, image)
    enroll(cli, url, tmp_path, "hosta")
    assert push(cli, url)[0].code == 0
    before = central_counts(url)
    definition = psql(url, "SELECT pg_get_functiondef('amdflash.sealed_log_spi'::regproc)")
    assert "PERFORM FROM" in definition
    # Another text of the same check, as an earlier amdflash left it.
    older = definition.replace("PERFORM FROM (", "PERFORM FROM (VALUES (1)) AS earlier, (", 1)
    psql(url, older)
    assert "AS earlier" in psql(url, "SELECT pg_get_functiondef('amdflash.sealed_log_spi'::regproc)")
    done = cli("fleet", "central-setup", url)
    assert done.code == 0 and "already set up (version 5); its row checks are this amdflash's" in done.out, done
    assert psql(url, "SELECT pg_get_functiondef('amdflash.sealed_log_spi'::regproc)") == definition
    assert central_counts(url) == before
    assert psql(url, "SELECT DISTINCT pg_get_userbyid(proowner) FROM pg_proc WHERE proname LIKE 'sealed_%' "
                     "AND pronamespace = 'amdflash'::regnamespace") == "amdflash_owner"
    flash(cli, make_board, image)
    r, done_push = push(cli, url)
    assert r.code == 0 and done_push["rows"] > 0, r.err



def test_a_push_in_many_batches_stores_the_trail_once_and_each_blob_once(cli, trails, postgres, tmp_path):
    """`--batch-rows` small: each batch (whole checkpoints, one transaction) looks up the blobs
    the ones before it stored and sends only the rest; the record ends as one batch leaves it,
    and a second push sends nothing."""
    _, three = trails
    url = make_central(postgres)
    enroll(cli, url, tmp_path, "hosta")
    r = cli("--db", three, "audit", "push", "--to", url, "--batch-rows", "300", "--format", "json")
    assert r.code == 0, r.err
    done = json.loads(r.out)
    conn = sqlite3.connect(three)
    referenced = conn.execute(" UNION ".join(f"SELECT {c} FROM {t} WHERE {c} IS NOT NULL"
                                             for t, cols in host_schema.PHYSICAL.items()
                                             for c, k in cols if k == "ref")).fetchall()
    conn.close()
    assert done["checkpoints"] == local_counts(three)["checkpoints"] > 10
    assert done["blobs"] == len(referenced) == central_counts(url)["blobs"]
    assert {t: n for t, n in central_counts(url).items() if t != "blobs"} == local_counts(three)
    r, again = push(cli, url)
    assert r.code == 0 and again["checkpoints"] == 0 and again["rows"] == 0, r.err
