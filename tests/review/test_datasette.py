"""The datasette metadata: its canned queries, run with plain sqlite3 as datasette would run them."""
from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest

from amdflash.pipeline.cli import main
from amdflash.stages.transport.sim import create_board
from amdflash.stages.transport.sim.synth import PART_KEY, synthetic_ifwi
from amdflash.store.chain import verify
from amdflash.store.schema import AUDIT_TABLES

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


def test_every_table_and_column_is_described():
    tables = metadata()["databases"]["audit"]["tables"]
    assert set(tables) == set(AUDIT_TABLES) | {"meta", "chain_head"}
    for table, columns in AUDIT_TABLES.items():
        assert tables[table]["description"]
        assert set(tables[table]["columns"]) == {"seq", *columns, "hash"}, table
        assert all(tables[table]["columns"].values())


def test_runs_by_status_gives_the_latest_status_failed_first(trail):
    rows = query(trail["db"], "runs_by_status")
    assert [(r["run_id"], r["status"]) for r in rows] == [(trail["bad"], "failed"), (trail["good"], "succeeded")]
    assert "verify failed at" in rows[0]["detail"]
    assert [r["run_id"] for r in query(trail["db"], "runs_by_status", status="succeeded")] == [trail["good"]]
    assert query(trail["db"], "runs_by_status", status="interrupted") == []


def test_failed_unit_of_a_stuck_bit_run_appears_with_its_last_register_writes(trail):
    rows = query(trail["db"], "failed_units")
    assert rows and {r["run_id"] for r in rows} == {trail["bad"]}
    assert {r["unit"] for r in rows} == {f"{trail['failed_unit']:#08x}"}
    assert "flash=" in rows[0]["failure"] and "image=" in rows[0]["failure"]
    assert 1 < len(rows) <= 32
    seqs = [r["write_seq"] for r in rows]
    assert seqs == sorted(seqs) and all(s < rows[0]["failed_seq"] for s in seqs)
    conn = sqlite3.connect(trail["db"])
    owners = {run for (run,) in conn.execute(
        f"SELECT run_id FROM register_writes WHERE seq IN ({','.join('?' * len(seqs))})", seqs)}
    # The writes are the run's last 32 before the failure: none of that run lies between them and it.
    later = conn.execute("SELECT count(*) FROM register_writes WHERE run_id = ? AND seq > ? AND seq < ?",
                         (trail["bad"], seqs[-1], rows[0]["failed_seq"])).fetchone()[0]
    conn.close()
    assert owners == {trail["bad"]} and later == 0
    assert "ROM_SW_COMMAND" in {r["register"] for r in rows}
    assert query(trail["db"], "failed_units", run_id=trail["good"]) == []


def test_board_history_by_unique_id_or_spec(trail):
    by_uid = query(trail["db"], "board_history", board=trail["bad_uid"])
    assert [(r["run_id"], r["status"]) for r in by_uid] == [(trail["bad"], "failed")]
    by_spec = query(trail["db"], "board_history", board=trail["good_spec"])
    assert [r["run_id"] for r in by_spec] == [trail["good"]]
    assert by_spec[0]["sr1_sr2_sr3"] and by_spec[0]["chip"]
    assert query(trail["db"], "board_history") == []


def test_chain_head_and_counts_match_the_chain(trail):
    rows = {r["source"]: r for r in query(trail["db"], "chain_head_and_counts")}
    conn = sqlite3.connect(trail["db"])
    for table in AUDIT_TABLES:
        assert rows[table]["row_count"] == conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0], table
    chain = verify(conn)
    conn.close()
    assert rows["chain_head"]["last_seq"] == rows["all audit tables"]["row_count"] == chain.head_seq
    assert rows["chain_head"]["hash"] == chain.head_hash


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
