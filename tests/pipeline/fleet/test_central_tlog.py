"""The central record mirrors each host's transparency log (issue 45 item 7): `audit push` sends
its tree heads, the witnesses' cosignatures of them and its receipts; the database refuses a
tree head that is not consistent with the largest it holds (a host log rolled back or forked);
`audit verify --central` checks the central's newest tree head against the log here; the readers
show a run's witness state. Through the command line, with the throwaway PostgreSQL of the
fleet tests and the test witnesses (tests/support/witness_server.py)."""
from __future__ import annotations

import base64
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from amdflash.stages.sim import create_board
from amdflash.stages.sim.synth import PART_KEY
from amdflash.store import keys, tlog

from tests.pipeline.fleet.central_trail import psql
from tests.pipeline.fleet.test_central import enroll, make_central, push
from tests.support.witness_server import WitnessServer

psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed (pip install '.[test]' brings it)")

ORIGIN = "test.example/amdflash-central"


@pytest.fixture
def central(postgres) -> str:
    return make_central(postgres)


@pytest.fixture
def witnesses(db: Path) -> Iterator[list[WitnessServer]]:
    key = keys.load_or_create(tlog.log_key_path(Path(os.environ["AMDFLASH_HOST_KEY"])))
    log_key = tlog.vkey(ORIGIN, keys.public_bytes(key))
    started = [WitnessServer(name=f"w{i}.test/witness", logs={ORIGIN: [log_key]}).start() for i in range(2)]
    yield started
    for s in started:
        s.stop()


def configure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, servers: list[WitnessServer]) -> None:
    lines = [f'log_origin = "{ORIGIN}"', f"witness_quorum = {len(servers) or 1}", "witness_timeout = 2", ""]
    for s in servers:
        lines += ["[[witnesses]]", f'url = "{s.url}"', f'key = "{s.vkey}"', ""]
    if not servers:
        lines = [f'log_origin = "{ORIGIN}"']
    config = tmp_path / "config.toml"
    config.write_text("\n".join(lines) + "\n")
    config.chmod(0o600)
    monkeypatch.setenv("AMDFLASH_CONFIG", str(config))


def flash(cli, tmp_path: Path, image: Path) -> str:
    """A three-sector flash on an ideal emulated board (a flash's end, seconds sooner); its run id."""
    board = tmp_path / "board"
    if not board.exists():
        create_board(board, transport="ideal", seed=7)
    small = tmp_path / "three sectors.bin"
    small.write_bytes(image.read_bytes()[:3 * 4096])
    r = cli("flash", small, "--board", f"sim:{board}", "--yes", "--force", "--start-sector", "0",
            "--sector-count", "3", "--expect-part", PART_KEY)
    assert r.code == 0, r.err
    return json.loads(cli("runs", "--format", "json").out)[-1]["run_id"]


def heads_here(db: Path) -> list[dict]:
    return [json.loads(line) for line in (tlog.log_dir(str(db)) / "heads").read_text().splitlines()]


def held(url: str, sql: str) -> list[list[str]]:
    text = psql(url, sql)
    return [row.split("|") for row in text.splitlines()] if text else []


def test_push_mirrors_tree_heads_cosignatures_and_receipts_and_a_second_push_sends_none(
        cli, db, image, central, tmp_path, monkeypatch, witnesses):
    configure(tmp_path, monkeypatch, witnesses)
    runs = [flash(cli, tmp_path, image) for _ in range(2)]
    enroll(cli, central, tmp_path)
    r, done = push(cli, central)
    assert r.code == 0, r.err
    heads = heads_here(db)
    assert done["log"] == {"heads": len(heads), "cosignatures": 2 * len(heads), "receipts": 2,
                           "size": heads[-1]["size"]} and done["log_refused"] is None, done
    stored = held(central, "SELECT size, encode(root, 'hex'), encode(convert_to(note, 'UTF8'), 'hex'), witnesses "
                           "FROM amdflash.tlog_heads ORDER BY size")
    assert stored == [[str(h["size"]), h["root"], h["note"].encode().hex(), "2"] for h in heads]
    cosigned = held(central, "SELECT size, witness FROM amdflash.tlog_cosignatures ORDER BY size, witness")
    assert cosigned == [[str(h["size"]), w] for h in heads for w in ("w0.test/witness", "w1.test/witness")]
    receipts = held(central, "SELECT run_id, leaf_index, encode(sha256(envelope), 'hex') FROM amdflash.tlog_receipts "
                             "ORDER BY leaf_index")
    entries = {e["run"]: e for e in tlog.Log(tlog.log_dir(str(db))).entries() if e["kind"] == "receipt"}
    assert receipts == [[run, str(entries[run]["i"]), entries[run]["sha256"]] for run in runs]

    r, again = push(cli, central)
    assert r.code == 0, r.err
    assert again["log"] == {"heads": 0, "cosignatures": 0, "receipts": 0, "size": heads[-1]["size"]}, again
    text = cli("audit", "push", "--to", central)
    assert text.code == 0 and "transparency log through its tree head of" in text.out, text
    checked = cli("audit", "verify", "--central", central)
    assert checked.code == 0, checked
    assert f"tree head of host hosta's transparency log ({heads[-1]['size']} leaves" in checked.out
    assert "is the same tree" in checked.out, checked.out

    listed = json.loads(cli("fleet", "runs", "--from", central, "--format", "json").out)
    assert {x["run_id"]: x["witnessed"] for x in listed} == {run: [2, 2] for run in runs}, listed

    from tests.pipeline.fleet.test_serve import _client, _line

    pytest.importorskip("starlette", reason="starlette is not installed (pip install '.[test]' brings it)")
    from tests.pipeline.fleet.test_central_trust import as_login, host_id
    from tests.pipeline.fleet.test_live import insert

    insert(as_login(central, "hosta"), host_id(central, "hosta"), run_id=runs[-1], state="succeeded",
           board="sim:/a/0", place="hosta-sim-0", command="flash")
    line = _line(central)
    try:
        with _client(line, central) as client:
            page = client.get("/history").text
            board = client.get("/").text
    finally:
        line.close()
    shown = dict(re.findall(r'<tr data-run="([^"]+)".*?<td data-field="witnessed">([^<]*)</td></tr>', page))
    assert shown == {run: "witnessed 2 of 2" for run in runs}, page
    assert re.findall(r'<tr class="s-succeeded"[^>]* data-run="([^"]+)"[^>]* data-witnessed="([^"]*)">', board) \
        == [(runs[-1], "witnessed 2 of 2")], board


def test_a_forked_log_is_refused_by_the_central_database_and_verify_central_says_so(
        cli, db, image, central, tmp_path, monkeypatch):
    configure(tmp_path, monkeypatch, [])
    flash(cli, tmp_path, image)
    enroll(cli, central, tmp_path)
    assert push(cli, central)[0].code == 0
    directory = tlog.log_dir(str(db))
    saved = tmp_path / "saved.tlog"
    shutil.copytree(directory, saved)
    flash(cli, tmp_path, image)
    r, done = push(cli, central)
    assert r.code == 0 and done["log"]["heads"] == 1, (r.err, done)
    size, root = heads_here(db)[-1]["size"], heads_here(db)[-1]["root"]
    shown = base64.b64encode(bytes.fromhex(root)).decode()

    # The host's log alone put back as it was after the first run: the central holds a larger tree.
    shutil.rmtree(directory)
    shutil.copytree(saved, directory)
    old = heads_here(db)[-1]
    checked = cli("audit", "verify", "--central", central)
    assert checked.code == 1, checked
    assert (f"transparency log BROKEN against the central record: the central record holds host hosta's tree head "
            f"of {size} leaves, root {shown}") in checked.out, checked.out
    assert f"this host's log has {old['size']} leaves" in checked.out and "rolled back" in checked.out

    # ... and re-grown differently (the second run's receipt is no longer in it): refused.
    flash(cli, tmp_path, image)
    forked = heads_here(db)[-1]
    assert forked["size"] > size
    r, _ = push(cli, central)
    assert r.code == 1, r
    assert "the central database refused this host's transparency log: refused: tree head of " \
           f"{forked['size']} leaves of host hosta: root {forked['root']} is not consistent with the {size} leaves " \
           f"the central record holds (root {root}" in r.err, r.err
    assert "forked, or was rolled back and re-grown — nothing of it was stored" in r.err
    assert held(central, "SELECT max(size) FROM amdflash.tlog_heads") == [[str(size)]]
    checked = cli("audit", "verify", "--central", central)
    assert checked.code == 1, checked
    theirs = base64.b64encode(bytes.fromhex(forked["root"])).decode()
    assert (f"the central record's tree head of host hosta ({size} leaves, root {shown}" in checked.out
            and f"is not consistent with this host's log of {forked['size']} leaves, root {theirs}: the log forked"
            in checked.out), checked.out


def test_the_database_itself_refuses_a_smaller_or_different_tree_head(cli, db, image, central, tmp_path,
                                                                      monkeypatch):
    """Whatever a client sends: the host's login inserting a head straight into the table."""
    configure(tmp_path, monkeypatch, [])
    flash(cli, tmp_path, image)
    flash(cli, tmp_path, image)
    enroll(cli, central, tmp_path)
    assert push(cli, central)[0].code == 0
    first, last = heads_here(db)[0], heads_here(db)[-1]
    host = psql(central, "SELECT id FROM amdflash.hosts WHERE name = 'hosta'")
    with psycopg.connect(central, autocommit=True) as pg:
        pg.execute("SET SESSION AUTHORIZATION hosta")
        for size, root, note, why in (
                (last["size"], bytes(32), last["note"], "its note does not say that size and root"),
                (first["size"] - 1, bytes(32), f"{ORIGIN}\n{first['size'] - 1}\n{base64.b64encode(bytes(32)).decode()}"
                 "\n\n— x y\n", "already holds a larger tree"),
                (last["size"] + 1, bytes(32), f"{ORIGIN}\n{last['size'] + 1}\n{base64.b64encode(bytes(32)).decode()}"
                 "\n\n— x y\n", "is not consistent with the")):
            with pytest.raises(psycopg.Error, match=why):
                pg.execute("INSERT INTO amdflash.tlog_heads (host_id, size, root, note, pushed_by) "
                           "VALUES (%s, %s, %s, %s, '')", (host, size, root, note))
        pg.execute("RESET SESSION AUTHORIZATION")          # not even an administrator changes one
        with pytest.raises(psycopg.Error, match="insert-only"):
            pg.execute("DELETE FROM amdflash.tlog_heads")


def test_a_version_4_database_is_upgraded_in_place_and_then_mirrors_the_log(cli, db, image, postgres, tmp_path,
                                                                           monkeypatch):
    import amdflash.store.central.schema as schema
    from tests.pipeline.fleet.central_trail import central_counts, new_database

    url = new_database(postgres)
    if psql(url, "SELECT count(*) FROM pg_available_extensions WHERE name = 'plpython3u'") == "0":
        pytest.skip("the PostgreSQL server has no PL/Python")
    configure(tmp_path, monkeypatch, [])
    with monkeypatch.context() as m:            # set up and pushed to as version 4 was
        m.setattr(schema, "CENTRAL_VERSION", 4)
        m.setattr(schema, "_version_5_sql", lambda: "")
        assert cli("fleet", "central-setup", url).code == 0
        flash(cli, tmp_path, image)
        enroll(cli, url, tmp_path)
        m.setattr("amdflash.pipeline.cli.central._push_log", lambda args, url: (None, None))
        assert push(cli, url)[0].code == 0
    before = central_counts(url)
    refused = cli("audit", "push", "--to", url)
    assert refused.code == 1 and "version 4 of the central schema" in refused.err, refused
    done = cli("fleet", "central-setup", url)
    assert done.code == 0 and "upgraded from version 4 to 5" in done.out and "tlog_heads" in done.out, done
    assert central_counts(url) == before
    assert psql(url, "SELECT DISTINCT pg_get_userbyid(relowner) FROM pg_class WHERE relnamespace = "
                     "'amdflash'::regnamespace AND relkind IN ('r', 'v')") == "amdflash_owner"
    r, pushed = push(cli, url)
    assert r.code == 0 and pushed["log"]["heads"] == len(heads_here(db)) and pushed["log"]["receipts"] == 1, r
    assert "already set up (version 5)" in cli("fleet", "central-setup", url).out


def test_the_follow_service_mirrors_the_log_after_each_push(cli, db, image, central, tmp_path, monkeypatch,
                                                            witnesses):
    """`audit push --follow`'s pusher (pipeline/fleet/live.py): the trail, the witnesses asked,
    then the log, with what they cosigned; said once, nothing sent again."""
    from amdflash.pipeline.fleet.live import Follower

    configure(tmp_path, monkeypatch, witnesses)
    run = flash(cli, tmp_path, image)
    enroll(cli, central, tmp_path)
    heard: list[str] = []
    follower = Follower(str(db), central, log=heard.append)
    for _ in range(2):
        follower.push_once()
        follower.witness_once()
        follower.push_log_once()
    heads = heads_here(db)
    said = [line for line in heard if "transparency log" in line]
    assert said == [f"pushed this host's transparency log: {len(heads)} tree head(s), {2 * len(heads)} "
                    f"cosignature(s), 1 receipt(s); the central record holds its tree head of {heads[-1]['size']} "
                    "leaves"], heard
    listed = json.loads(cli("fleet", "runs", "--from", central, "--format", "json").out)
    assert [(x["run_id"], x["witnessed"]) for x in listed] == [(run, [2, 2])]
