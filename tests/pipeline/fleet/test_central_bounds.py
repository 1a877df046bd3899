"""No host harms another's record, nor the line (issue 41, items 1, 4 and 6), against the
product's real PostgreSQL, each attack made as the attacker would make it:

* item 1: a run is named by its host and run ID: a host that seals and pushes a run under
  another host's run ID first takes nothing of it (the victim's push is stored, `fleet runs`,
  `fleet report` and the line view keep both apart);
* item 4: one push login's progress rows are bounded by the database (a rate, a daily quota),
  and the line view reads a bounded page of boards;
* item 6: the text a host writes holds no control or format character, and the bookkeeping
  tables take a write only from within the push checks (owned by a role nobody logs in as);
* a version 3 database is upgraded in place.
"""
from __future__ import annotations

import datetime as dt
import json
import sqlite3
import subprocess
import sys
import types
import unicodedata
from pathlib import Path

import pytest
from amdflash.store import keys

from tests.pipeline.fleet.central_trail import central_counts, new_database, psql
from tests.pipeline.fleet.test_central import flash, make_central, push
from tests.pipeline.fleet.test_central_trust import as_login, become, enrol, host_id
from tests.store.test_forgery import forge

psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed (pip install '.[test]' brings it)")

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def central(postgres) -> str:
    return make_central(postgres)


def _run(n: int) -> str:
    return f"20261207T120000-{n:08x}"


def _progress(url: str, host: int, **values) -> None:
    row = {"host_id": host, "run_id": _run(1), "state": "running", "at": dt.datetime.now(dt.UTC), **values}
    with psycopg.connect(url, autocommit=True) as pg:
        pg.execute(f"INSERT INTO amdflash.progress ({', '.join(row)}) VALUES ({', '.join(['%s'] * len(row))})",
                   list(row.values()))


def _many(url: str, host: int, n: int, state: str = "running", first: int = 0, board: bool = False) -> None:
    """`n` progress rows in one INSERT ... SELECT, as a push login running SQL of its own would."""
    spec = "'sim:/flood/' || g" if board else "NULL"
    with psycopg.connect(url, autocommit=True) as pg:
        pg.execute(f"INSERT INTO amdflash.progress (host_id, run_id, state, board, at) SELECT %s, "
                   f"'20261207T120000-' || lpad(to_hex(g), 8, '0'), %s, {spec}, now() "
                   "FROM generate_series(%s::int, %s::int) g", (host, state, first + 1, first + n))


def limits(url: str, host: int, **bounds) -> None:
    """The host's own progress bounds (the administrator's INSERT into progress_limits): the
    defaults (host 0's), but for `bounds`."""
    with psycopg.connect(url, autocommit=True) as pg:
        cur = pg.execute("SELECT * FROM amdflash.progress_limits WHERE host_id = 0")
        row = {**dict(zip([d.name for d in cur.description], cur.fetchone(), strict=True)), **bounds,
               "host_id": host}
        pg.execute(f"INSERT INTO amdflash.progress_limits ({', '.join(row)}) VALUES ({', '.join(['%s'] * len(row))})",
                   list(row.values()))


def _copy_resigned(src: Path, dst: Path, run_id: str, key: Path) -> None:
    """The attacker's trail: a copy of the victim's, every checkpoint re-signed with its own key."""
    with sqlite3.connect(src) as a, sqlite3.connect(dst) as b:
        a.backup(b)
    forge(dst, run_id, keys.load_private(key))


# -- item 1: a host cannot take another host's run ID -------------------------------------------

def test_a_host_pushing_first_under_another_hosts_run_id_takes_nothing_of_it(cli, make_board, image, central,
                                                                            tmp_path, monkeypatch):
    """hostb (compromised: its own key and login) seals and pushes a run under hosta's run ID
    before hosta pushes it: hosta's push is still stored, and every reader keeps the two runs
    apart by host."""
    from amdflash.pipeline.fleet.serve.line import window_rows
    from amdflash.store.central import connect, signed_status

    db_a, _ = become(monkeypatch, tmp_path, "hosta")
    run_id = flash(cli, make_board, image)
    enrol(cli, central, tmp_path, "hosta")                   # hosta has not pushed yet
    db_b, key_b = become(monkeypatch, tmp_path, "hostb")
    enrol(cli, central, tmp_path, "hostb")
    _copy_resigned(db_a, db_b, run_id, key_b)
    r, _ = push(cli, as_login(central, "hostb"))            # the attacker pushes first
    assert r.code == 0, r.err

    become(monkeypatch, tmp_path, "hosta")
    r, done = push(cli, as_login(central, "hosta"))          # the victim's push: stored, as its own
    assert r.code == 0, r.err
    assert done["checkpoints"] > 0
    assert cli("audit", "verify", "--central", as_login(central, "hosta")).code == 0

    listed = json.loads(cli("fleet", "runs", "--from", central, "--format", "json").out)
    assert sorted((x["host"], x["run_id"]) for x in listed) == [("hosta", run_id), ("hostb", run_id)]
    r = cli("fleet", "report", run_id, "--from", central)    # ambiguous: the hosts named, and how to choose
    assert r.code == 2 and "matches runs of hosts hosta, hostb" in r.err and f"hosta/{run_id}" in r.err, r.err
    for how in ((f"hosta/{run_id}",), (run_id, "--host", "hosta")):
        r = cli("fleet", "report", *how, "--from", central, "--key", tmp_path / "hosta.pub", "--format", "json")
        assert r.code == 0 and json.loads(r.out)["run_id"] == run_id, r.err
    r = cli("fleet", "report", f"hosta/{run_id}", "--from", central, "--key", tmp_path / "hostb.pub")
    assert r.code == 1 and "does not verify" in r.err, r.err  # hosta's run is signed by hosta's key only

    # The line view: each host's row of the run ID is its own, read and keyed by (host, run).
    a, b = host_id(central, "hosta"), host_id(central, "hostb")
    _progress(as_login(central, "hosta"), a, run_id=run_id, state="failed", board="sim:/a/0", error="it broke")
    _progress(as_login(central, "hostb"), b, run_id=run_id, state="succeeded", board="sim:/b/0")
    with connect(central, autocommit=True) as pg:
        rows = {x["host"]: x for x in window_rows(pg, 1.0)}
        assert rows["hosta"]["unreadable"] is None and rows["hosta"]["state"] == "failed"
        assert rows["hostb"]["unreadable"] is None
        assert set(signed_status(pg, [(a, run_id), (b, run_id)])) == {(a, run_id), (b, run_id)}


# -- item 4: one push login cannot flood the line ---------------------------------------------------

@pytest.mark.slow
def test_one_push_login_cannot_flood_the_progress_rows(cli, central, tmp_path, monkeypatch):
    """hosta's login inserts 20,000 failed rows in one statement (the issue's flood), then rows
    a hundred at a time: the database refuses past its rate, its ends' rate and its daily quota,
    naming the bound; hostb's rows are not held back by hosta's."""
    for name in ("hosta", "hostb"):
        become(monkeypatch, tmp_path, name)
        enrol(cli, central, tmp_path, name)
    a, b = host_id(central, "hosta"), host_id(central, "hostb")
    as_a = as_login(central, "hosta")

    with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="refused: progress of host hosta: 20000 row"):
        _many(as_a, a, 20000, "failed")
    assert psql(central, "SELECT count(*) FROM amdflash.progress") == "0"

    # Smaller bounds of hosta's own (an administrator's INSERT), refilled slowly: the test does not race the clock.
    limits(central, a, rows_per_second=0.001, rows_burst=300, ends_per_second=0.001, ends_burst=50)
    for i in range(5):
        _many(as_a, a, 10, "failed", first=10 * i)
    with pytest.raises(psycopg.errors.ProgramLimitExceeded, match=r"10 end\(s\) at once, over its rate of ends"):
        _many(as_a, a, 10, "failed", first=50)
    for i in range(25):
        _many(as_a, a, 10, first=100 + 10 * i)
    with pytest.raises(psycopg.errors.ProgramLimitExceeded, match=r"over its rate \(0.001 rows a second, at most 300"):
        _many(as_a, a, 10, first=400)
    _many(as_login(central, "hostb"), b, 100)                # another host's bucket is its own
    assert psql(central, "SELECT host_id, count(*) FROM amdflash.progress GROUP BY 1 ORDER BY 1") == \
        f"{a}|300\n{b}|100"

    limits(central, b, rows_per_day=150)
    with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="over its quota of 150 rows a day"):
        _many(as_login(central, "hostb"), b, 51)
    with pytest.raises(psycopg.Error, match="kept by the push checks only"):
        psql(central, "UPDATE amdflash.progress_usage SET day_rows = 0")    # the administrator too


def test_a_hosts_stored_progress_rows_are_bounded_its_oldest_making_room(cli, central, tmp_path, monkeypatch):
    """The disk: hosta may keep 100 rows (its own bounds): the 101st is refused while none is old
    enough to go; once its oldest are older than keep_days, new rows take their place."""
    import time

    become(monkeypatch, tmp_path, "hosta")
    enrol(cli, central, tmp_path, "hosta")
    a, as_a = host_id(central, "hosta"), as_login(central, "hosta")
    limits(central, a, rows_stored=100, keep_days=1000.0)
    _many(as_a, a, 100)
    with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="over its quota of 100 rows stored"):
        _many(as_a, a, 1, first=100)
    psql(central, f"UPDATE amdflash.progress_limits SET keep_days = 0.00001 WHERE host_id = {a}")   # 0.86 s
    time.sleep(1.5)
    _many(as_a, a, 40, first=100)
    assert psql(central, "SELECT count(*), min(run_id) FROM amdflash.progress") == f"100|{_run(41)}"
    with pytest.raises(psycopg.Error, match="insert-only"):
        psql(central, "DELETE FROM amdflash.progress")      # the pruning is the bounds' own


def test_the_follow_service_sends_a_backlog_within_the_bounds(cli, central, tmp_path, monkeypatch):
    """An honest host's backlog (ends recorded while central was out of reach) over the bound of
    ends at once: what fits is stored, the rest stays to send, nothing is sent twice."""
    from amdflash.store.central import connect, publish_progress

    become(monkeypatch, tmp_path, "hosta")
    enrol(cli, central, tmp_path, "hosta")
    a = host_id(central, "hosta")
    now = dt.datetime.now(dt.UTC).isoformat()
    backlog = [{"run_id": _run(i), "state": "failed", "error": f"line {i}\nsecond line", "at": now}
               for i in range(150)]
    with connect(as_login(central, "hosta"), autocommit=True) as pg:
        with pytest.raises(psycopg.errors.ProgramLimitExceeded):
            publish_progress(pg, a, backlog, None)
    assert len(backlog) == 50                                # 100 stored (the bucket of ends), 50 left
    assert psql(central, "SELECT count(DISTINCT run_id), count(*) FROM amdflash.progress") == "100|100"
    assert psql(central, "SELECT error FROM amdflash.progress ORDER BY id LIMIT 1") == "line 0 second line"


def test_the_line_view_reads_a_bounded_page_of_boards(cli, central, tmp_path, monkeypatch):
    """5,000 boards of hostb stored (as before the bounds existed: the administrator's insert, the
    bound off) and one of hosta: the view reads at most BOARDS_PER_HOST of hostb's, and hosta's."""
    from amdflash.pipeline.fleet.serve.line import Line, window_rows
    from amdflash.store.central import connect

    for name in ("hosta", "hostb"):
        become(monkeypatch, tmp_path, name)
        enrol(cli, central, tmp_path, name)
    a, b = host_id(central, "hosta"), host_id(central, "hostb")
    with psycopg.connect(central) as pg:
        pg.execute("DO $$ BEGIN IF EXISTS (SELECT FROM pg_trigger WHERE tgname = 'progress_bounded') THEN "
                   "ALTER TABLE amdflash.progress DISABLE TRIGGER progress_bounded; END IF; END $$")
        pg.execute("INSERT INTO amdflash.progress (host_id, run_id, state, board, at) SELECT %s, "
                   "'20261207T120000-' || lpad(to_hex(g), 8, '0'), 'failed', 'sim:/flood/' || g, now() "
                   "FROM generate_series(1, 5000) g", (b,))
        pg.commit()
    _progress(as_login(central, "hosta"), a, board="sim:/a/0")
    from amdflash.store import central as record

    per_host = getattr(record, "BOARDS_PER_HOST", 256)

    with connect(central, autocommit=True) as pg:
        rows = window_rows(pg, 1.0)
        assert len(rows) == per_host + 1, len(rows)
        assert {x["host"] for x in rows} == {"hosta", "hostb"}
        line = Line(central, log=lambda m: None)
        try:
            line.load(pg)
            assert len(line.boards) == per_host + 1, len(line.boards)
            pg.execute("ALTER TABLE amdflash.progress DISABLE TRIGGER progress_bounded")
            pg.execute("INSERT INTO amdflash.progress (host_id, run_id, state, board, at) SELECT %s, "
                       "'20261207T130000-' || lpad(to_hex(g), 8, '0'), 'failed', 'sim:/more/' || g, now() "
                       "FROM generate_series(1, 1000) g", (b,))
            line._poll(pg)                                   # new boards of hostb push out its oldest
            assert len(line.boards) == per_host + 1 and (a, "sim:/a/0") in line.boards, len(line.boards)
        finally:
            line.close()


# -- item 6: the central record's text, and who writes its bookkeeping ---------------------------

CONTROL_TEXT = [
    ("error", "\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\"), ("error", "ring\x07"),
    ("error", "two\nlines"), ("error", "C1 \x85 next line"), ("error", "\u202egnp.exe"), ("error", "a\u2066b"),
    ("error", "zero\u200bwidth"), ("error", "\ufeffbom"), ("error", "tag \U000e0041"),
    ("board", "sim:/a\u202e"), ("board", "sim:/a\x9b2J"), ("board", "sim:/a\u200d"),
    ("stage", "program\u200f"), ("stage", "\x85"),
]


@pytest.mark.parametrize(("column", "value"), CONTROL_TEXT, ids=[f"{c}={v!r}" for c, v in CONTROL_TEXT])
def test_progress_text_with_a_control_or_format_character_is_refused(cli, central, tmp_path, monkeypatch,
                                                                      column, value):
    become(monkeypatch, tmp_path, "hosta")
    enrol(cli, central, tmp_path, "hosta")
    a = host_id(central, "hosta")
    for url in (as_login(central, "hosta"), central):        # the host's login, and the administrator
        with pytest.raises(psycopg.errors.CheckViolation, match=f"progress_{column}_checked"):
            _progress(url, a, **{column: value})
    assert psql(central, "SELECT count(*) FROM amdflash.progress") == "0"


def test_the_control_class_is_every_cc_and_cf_character():
    from amdflash.store.central import CONTROLS
    from amdflash.store.central.bounds import control_ranges

    inside = {cp for lo, hi in control_ranges() for cp in range(lo, hi + 1)}
    wanted = {cp for cp in range(1, 0x110000) if unicodedata.category(chr(cp)) in ("Cc", "Cf")}
    assert wanted <= inside                                  # (a newer Unicode's additions beyond: none lost)
    assert all(unicodedata.category(chr(cp)) in ("Cc", "Cf", "Cn") for cp in inside)
    import re

    assert re.fullmatch(f"[^{CONTROLS}]*", "Host A-sim-0 é 日本 ✓") and not re.search(f"[{CONTROLS}]", "plain")


def test_the_bookkeeping_is_written_only_through_the_push_checks(cli, make_board, image, central, tmp_path,
                                                               monkeypatch):
    """Everything in the schema is owned by a role nobody logs in as; a push login cannot write
    the bookkeeping directly, and neither can a trigger of anyone else's (here the administrator's
    own, on a table of its own, which today's depth check let through)."""
    become(monkeypatch, tmp_path, "hosta")
    flash(cli, make_board, image)
    enrol(cli, central, tmp_path, "hosta")
    assert push(cli, as_login(central, "hosta"))[0].code == 0
    usage = psql(central, "SELECT * FROM amdflash.blob_usage")
    assert usage

    # The administrator's trigger, on a table of its own: a write at trigger depth 2, which fills
    # hosta's quota (its pushes refused from then on).
    psql(central, """CREATE TABLE public.lever (n int);
        CREATE FUNCTION public.pull() RETURNS trigger LANGUAGE plpgsql AS $fn$
        BEGIN UPDATE amdflash.blob_usage SET bytes = bytes + 1000000000000; RETURN NEW; END $fn$;
        CREATE TRIGGER pull BEFORE INSERT ON public.lever FOR EACH ROW EXECUTE FUNCTION public.pull();""")
    with pytest.raises(psycopg.Error, match="kept by the push checks only"):
        psql(central, "INSERT INTO public.lever VALUES (1)")
    assert psql(central, "SELECT * FROM amdflash.blob_usage") == usage

    owners = psql(central, "SELECT DISTINCT pg_get_userbyid(relowner) FROM pg_class WHERE relnamespace = "
                           "'amdflash'::regnamespace AND relkind IN ('r', 'v', 'S')")
    assert owners == "amdflash_owner"
    assert psql(central, "SELECT DISTINCT pg_get_userbyid(proowner) FROM pg_proc WHERE pronamespace = "
                         "'amdflash'::regnamespace AND proname NOT IN ('ed25519_verify', 'tlog_consistent')") \
        == "amdflash_owner"          # (PL/Python functions: only a superuser may own one)
    assert psql(central, "SELECT rolcanlogin, rolsuper FROM pg_roles WHERE rolname = 'amdflash_owner'") == \
        "False|False"
    assert psql(central, "SELECT count(*) FROM pg_auth_members WHERE roleid = 'amdflash_owner'::regrole") == "0"

    for sql in ("INSERT INTO amdflash.blob_usage VALUES (99, 0)", "UPDATE amdflash.blob_usage SET bytes = 0",
                "INSERT INTO amdflash.progress_usage VALUES (99, 1e9, 1e9, now(), current_date, 0, 0)"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            psql(as_login(central, "hosta"), sql)            # a push login's own SQL



# -- the upgrade of a version 3 database ---------------------------------------------------------

def _version_3_schema() -> types.ModuleType:
    """store/central/schema.py as it was at version 3 (this repository's history)."""
    try:
        source = subprocess.run(["git", "show", "f804de2:store/central/schema.py"], cwd=ROOT, capture_output=True,
                                text=True, check=True, timeout=60).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"the version 3 schema is not in this checkout's history: {e}")
    module = types.ModuleType("central_schema_v3")
    sys.modules[module.__name__] = module
    exec(compile(source, "central_schema_v3.py", "exec"), module.__dict__)
    return module


def test_a_version_3_database_is_upgraded_in_place(cli, make_board, image, postgres, tmp_path, monkeypatch):
    """A database set up and pushed to at version 3 (run IDs given to the first host to push
    them): `fleet central-setup` upgrades it, every row kept; then hostb's run under hosta's run
    ID is stored, and the new checks hold."""
    import amdflash.store.central.schema as schema

    old = _version_3_schema()
    url = new_database(postgres)
    if psql(url, "SELECT count(*) FROM pg_available_extensions WHERE name = 'plpython3u'") == "0":
        pytest.skip("the PostgreSQL server has no PL/Python")
    old.setup(url)
    db_a, _ = become(monkeypatch, tmp_path, "hosta")
    run_id = flash(cli, make_board, image)
    pubs = {}
    for name in ("hosta", "hostb"):
        db, _ = become(monkeypatch, tmp_path, name)
        pubs[name] = tmp_path / f"{name}.pub"
        assert cli("audit", "key", "-o", pubs[name]).code == 0
        old.enroll(url, keys.read_public(pubs[name]), name)
    become(monkeypatch, tmp_path, "hosta")
    with monkeypatch.context() as m:                         # hosta pushes while central is at version 3
        m.setattr(schema, "CENTRAL_VERSION", 3)
        m.setattr("amdflash.pipeline.cli.central._push_log", lambda args, url: (None, None))   # (no log then)
        assert push(cli, as_login(url, "hosta"))[0].code == 0
    assert psql(url, f"SELECT host_id FROM amdflash.run_owners WHERE run_id = '{run_id}'") == str(host_id(url, "hosta"))
    _progress(url, host_id(url, "hosta"), error="stored before: \x1b[31mred")
    before = central_counts(url)

    # A role of that name made before, with a member (roles are the cluster's): nobody may become it.
    psql(url, "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'amdflash_owner') THEN "
              "CREATE ROLE amdflash_owner; END IF; END $$; GRANT amdflash_owner TO hosta")
    r, _ = push(cli, as_login(url, "hosta"))
    assert r.code == 1 and "version 3 of the central schema" in r.err and "central-setup" in r.err, r.err
    done = cli("fleet", "central-setup", url)
    assert done.code == 0 and "upgraded from version 3 to 5" in done.out, done
    assert central_counts(url) == before                     # no row of the record changed
    assert psql(url, "SELECT value FROM amdflash.meta WHERE key = 'central_version'") == "5"
    assert psql(url, "SELECT to_regclass('amdflash.run_owners') IS NULL") == "True"
    assert psql(url, "SELECT count(*) FROM amdflash.progress WHERE error LIKE 'stored before%'") == "1"
    with pytest.raises(psycopg.errors.CheckViolation, match="progress_error_checked"):
        _progress(url, host_id(url, "hosta"), error="\x1b[31mred")
    assert psql(url, "SELECT DISTINCT pg_get_userbyid(relowner) FROM pg_class WHERE relnamespace = "
                     "'amdflash'::regnamespace AND relkind IN ('r', 'v')") == "amdflash_owner"
    assert psql(url, "SELECT count(*) FROM pg_auth_members WHERE roleid = 'amdflash_owner'::regrole") == "0"

    db_b, key_b = become(monkeypatch, tmp_path, "hostb")     # hostb's run under hosta's run ID: its own
    _copy_resigned(db_a, db_b, run_id, key_b)
    r, _ = push(cli, as_login(url, "hostb"))
    assert r.code == 0, r.err
    listed = json.loads(cli("fleet", "runs", "--from", url, "--format", "json").out)
    assert sorted(x["host"] for x in listed if x["run_id"] == run_id) == ["hosta", "hostb"]
    assert "already set up (version 5)" in cli("fleet", "central-setup", url).out


# -- the signed record's own text ------------------------------------------------------------------

def test_the_signed_records_text_is_kept_as_signed_and_shown_printable(cli, make_board, image, central, tmp_path,
                                                                     monkeypatch):
    """A host (its account and key) signs a board spec with an escape sequence and a bidi
    override into its trail and pushes it: the record keeps it as signed (refusing it would
    strand every later checkpoint of the host), and the readers show it made printable."""
    from amdflash.store.schema import drop_triggers

    db, key = become(monkeypatch, tmp_path, "hosta")
    run_id = flash(cli, make_board, image)
    hostile = "sim:/x\x1b]8;;https://evil.example/\x07\u202egnp.exe"
    con = sqlite3.connect(db, isolation_level=None)
    con.execute("BEGIN")
    drop_triggers(con)
    con.execute("UPDATE runs SET board_spec = ? WHERE run_id = ?", (hostile, run_id))
    con.execute("COMMIT")
    con.close()
    forge(db, run_id, keys.load_private(key), anchor=Path(f"{db}.anchor"))
    enrol(cli, central, tmp_path, "hosta")
    r, _ = push(cli, as_login(central, "hosta"))
    assert r.code == 0, r.err
    assert psql(central, "SELECT board_spec FROM amdflash.runs") == hostile
    for shown in (cli("fleet", "runs", "--from", central), cli("fleet", "report", run_id, "--from", central)):
        assert run_id in shown.out, shown.err
        assert not any(c in shown.out for c in "\x1b\x07\u202e"), shown.out
