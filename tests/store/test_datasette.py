"""The datasette metadata: its canned queries, run with plain sqlite3 as datasette would run them."""
from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest

from amdflash.pipeline.cli.main import main
from amdflash.stages.sim import create_board
from amdflash.stages.sim.synth import PART_KEY, synthetic_ifwi
from amdflash.store.schema import DECODED, LOGICAL, PHYSICAL

ROOT = Path(__file__).resolve().parents[2]
METADATA = ROOT / "store" / "datasette_metadata.json"
UNIT = 0x1000


@pytest.fixture(scope="module")
def trail(tmp_path_factory) -> dict[str, object]:
    """One good flash and one stuck-bit flash on two boards, in one database (built once: ~3 s)."""
    tmp = tmp_path_factory.mktemp("datasette")
    db = tmp / "audit.sqlite"
    image = tmp / "image.bin"
    img = synthetic_ifwi(1234)
    image.write_bytes(img)
    stuck = next(a for a in range(0x2000, len(img)) if img[a] & 0x01 == 0)
    good = create_board(tmp / "good", content="blank", transport="ideal", seed=1)
    bad = create_board(tmp / "bad", content="blank", transport="ideal", seed=2, faults=[f"stuck-bit={stuck:#x}:0"])
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AMDFLASH_LOCK_DIR", str(tmp / "locks"))

        def cli(*args: str) -> int:
            return main(["-q", "--db", str(db), *args])

        sector = stuck // UNIT
        assert cli("flash", str(image), "--yes", "--start-sector", str(sector), "--sector-count", "2",
                   "--expect-part", PART_KEY, "--board", f"sim:{good}") == 0
        assert cli("flash", str(image), "--yes", "--start-sector", str(sector), "--sector-count", "2",
                   "--expect-part", PART_KEY, "--board", f"sim:{bad}") == 1
    conn = sqlite3.connect(db)
    runs = {spec: run_id for run_id, spec in conn.execute("SELECT run_id, board_spec FROM runs")}
    uid = {spec: u for spec, u in conn.execute(
        "SELECT r.board_spec, b.unique_id FROM runs r JOIN boards b USING (run_id)")}
    conn.close()
    return {"db": db, "good": runs[f"sim:{good}"], "bad": runs[f"sim:{bad}"], "good_spec": f"sim:{good}",
            "bad_uid": uid[f"sim:{bad}"], "failed_unit": stuck - stuck % UNIT}


def metadata() -> dict:
    return json.loads(METADATA.read_text())


def query(db: Path, name: str, **params: str) -> list[dict]:
    """Run a canned query the way datasette does: every :param present, '' when not given."""
    sql = metadata()["databases"]["audit"]["queries"][name]["sql"]
    names = set(re.findall(r"(?<!:):(\w+)", re.sub(r"'[^']*'", "", sql)))
    assert set(params) <= names, f"{name} takes {names}"
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(sql, {n: params.get(n, "") for n in names})]
    finally:
        conn.close()


def test_every_table_and_column_is_described(trail):
    tables = metadata()["databases"]["audit"]["tables"]
    conn = sqlite3.connect(trail["db"])
    in_db = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view') "
                                              "AND name NOT LIKE 'sqlite_%'")}
    assert set(tables) == in_db
    assert set(LOGICAL) | set(DECODED) | set(PHYSICAL) <= in_db
    for table in in_db:
        columns = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
        assert tables[table]["description"], table
        assert set(tables[table]["columns"]) == columns, table
        assert all(tables[table]["columns"].values()), table
    conn.close()


def test_runs_by_status_gives_the_latest_status_failed_first(trail):
    rows = query(trail["db"], "runs_by_status")
    assert [(r["run_id"], r["status"]) for r in rows] == [(trail["bad"], "failed"), (trail["good"], "succeeded")]
    assert "verify failed at" in rows[0]["detail"] and {r["emulated"] for r in rows} == {1}
    assert [r["run_id"] for r in query(trail["db"], "runs_by_status", status="succeeded")] == [trail["good"]]
    assert query(trail["db"], "runs_by_status", status="interrupted") == []


def test_failed_unit_of_a_stuck_bit_run_appears_with_its_last_attempt(trail):
    rows = query(trail["db"], "failed_units")
    assert rows and {r["run_id"] for r in rows} == {trail["bad"]}
    assert {r["unit"] for r in rows} == {f"{trail['failed_unit']:#08x}"}
    assert "flash=" in rows[0]["failure"] and "image=" in rows[0]["failure"]
    seqs = [r["transaction_seq"] for r in rows]
    assert seqs == sorted(seqs) and all(s < rows[0]["failed_seq"] for s in seqs)
    commands = [r["command"] for r in rows]
    # The last retry: erase the unit, program it, read it back.
    assert "SE 4K" in commands and "PP" in commands and commands[-1] == "READ"
    assert {r["address"] for r in rows if r["command"] in ("SE 4K", "PP")} <= {
        f"{a:#08x}" for a in range(trail["failed_unit"], trail["failed_unit"] + UNIT, 0x100)}
    assert query(trail["db"], "failed_units", run_id=trail["good"]) == []


def test_board_history_by_unique_id_or_spec(trail):
    by_uid = query(trail["db"], "board_history", board=trail["bad_uid"])
    assert [(r["run_id"], r["status"]) for r in by_uid] == [(trail["bad"], "failed")]
    by_spec = query(trail["db"], "board_history", board=trail["good_spec"])
    assert [r["run_id"] for r in by_spec] == [trail["good"]]
    assert by_spec[0]["sr1_sr2_sr3"] and by_spec[0]["chip"]
    assert query(trail["db"], "board_history") == []


def test_seals_name_each_runs_last_checkpoint(trail):
    rows = {r["run_id"]: r for r in query(trail["db"], "seals")}
    conn = sqlite3.connect(trail["db"])
    for run_id in (trail["good"], trail["bad"]):
        last = conn.execute("SELECT id, rows, hex(head) FROM checkpoints WHERE run_id = ? ORDER BY id DESC LIMIT 1",
                            [run_id]).fetchone()
        assert (rows[run_id]["checkpoint"], rows[run_id]["rows"], rows[run_id]["head"]) == last
        assert rows[run_id]["kind"] == "final" and rows[run_id]["checkpoints"] >= 1
    conn.close()


def test_metadata_command_names_the_database_by_its_file_stem(tmp_path, capsys):
    out = tmp_path / "meta.json"
    assert main(["--db", str(tmp_path / "records.sqlite"), "audit", "datasette-metadata", "-o", str(out)]) == 0
    written = json.loads(out.read_text())
    assert list(written["databases"]) == ["records"]
    assert written["databases"]["records"] == metadata()["databases"]["audit"]
    assert "datasette" in capsys.readouterr().err


def test_the_product_never_imports_datasette():
    sources = [p for d in ("pipeline", "stages", "store") for p in (ROOT / d).rglob("*.py")]
    assert sources
    assert not [p for p in sources if re.search(r"^\s*(import|from)\s+datasette", p.read_text(), re.M)]


def test_failed_units_numbers_transactions_as_the_spi_transactions_view(trail):
    rows = query(trail["db"], "failed_units")
    conn = sqlite3.connect(trail["db"])
    n_of = {}
    for seq, n in conn.execute("SELECT seq, n FROM spi_transactions WHERE run_id = ? ORDER BY n", [trail["bad"]]):
        n_of.setdefault(seq, []).append(n)
    conn.close()
    assert rows and all(r["transaction_n"] in n_of[r["transaction_seq"]] for r in rows)


# -- datasette itself, on its own time limit ----------------------------------------------------------

datasette_app = pytest.importorskip("datasette.app", reason="datasette is not installed (pip install datasette)")
LIMIT_MS = 200


def _grow(source: Path, target: Path, copies: int) -> None:
    """`target`: the runs of `source` repeated `copies` times under new run ids and seqs, as
    many flashes leave it (the rows are not re-signed: this is a database to time queries on)."""
    import shutil

    shutil.copy(source, target)
    conn = sqlite3.connect(target)
    top = conn.execute("SELECT max(seq) FROM runs").fetchone()[0]
    span = max(conn.execute(f"SELECT max(seq) FROM {t}").fetchone()[0] or 0
               for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'log_%'"))
    span = max(span, top) + 1
    tables = [t for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
              if "run" in {c[1] for c in conn.execute(f"PRAGMA table_info({t})")} and t.startswith("log_")]
    for k in range(1, copies):
        shift = k * span
        conn.execute(f"INSERT INTO runs SELECT seq + {shift}, run_id || '-{k}', command, arguments, operator, "
                     "operator_claimed, host, machine_id, tool_version, tool_revision, clock_sync, image_path, "
                     f"image_sha256, board_spec, resumes_run_id, at FROM runs WHERE seq <= {top}")
        for t in tables:
            cols = [c[1] for c in conn.execute(f"PRAGMA table_info({t})")]
            shown = ", ".join(f"seq + {shift}" if c == "seq" else f"run + {shift}" if c == "run" else c
                              for c in cols)
            conn.execute(f"INSERT INTO {t} ({', '.join(cols)}) SELECT {shown} FROM {t} WHERE seq < {span}")
    conn.commit()
    conn.close()


def _every_canned_query_within_the_limit(db: Path, run_id: str) -> None:
    import anyio

    meta = metadata()
    meta["databases"] = {db.stem: meta["databases"]["audit"]}
    ds = datasette_app.Datasette([str(db)], metadata=meta, settings={"sql_time_limit_ms": LIMIT_MS})

    async def fetch_all() -> dict[str, object]:
        answers = {}
        for name in meta["databases"][db.stem]["queries"]:
            response = await ds.client.get(f"/{db.stem}/{name}.json?_shape=array&run_id={run_id}&status=&board=")
            answers[name] = (response.status_code, response.text[:300])
        return answers

    for name, (status, text) in anyio.run(fetch_all).items():
        assert status == 200 and "SQL Interrupted" not in text, (name, status, text)


def test_every_canned_query_answers_within_datasettes_limit(trail, tmp_path):
    db = tmp_path / "audit.sqlite"
    import shutil

    shutil.copy(trail["db"], db)
    _every_canned_query_within_the_limit(db, "")
    _every_canned_query_within_the_limit(db, trail["bad"])


@pytest.mark.slow
def test_every_canned_query_answers_within_datasettes_limit_on_100_flashes(trail, tmp_path):
    db = tmp_path / "audit.sqlite"
    _grow(Path(trail["db"]), db, 50)         # 100 flashes, half of them with a failed unit
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 100
    conn.close()
    _every_canned_query_within_the_limit(db, "")
    _every_canned_query_within_the_limit(db, trail["bad"])
