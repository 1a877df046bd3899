"""audit export / audit verify --export: round trips, tampering, one run's export on its own."""
from __future__ import annotations

import csv
import json
import sqlite3
from pathlib import Path

import pytest

from amdflash.store.export import read_export
from amdflash.store.schema import PHYSICAL
from tests.pipeline.engine.conftest import cli, db  # noqa: F401 - fixtures: in-process CLI with its own database


@pytest.fixture
def trail(cli, make_board, tmp_path) -> dict[str, object]:  # noqa: F811
    """A small trail: info on one board, then one flash on two boards at once (interleaved rows)."""
    from amdflash.stages.sim.synth import PART_KEY, synthetic_ifwi

    image = tmp_path / "image.bin"
    image.write_bytes(synthetic_ifwi(21))
    a = make_board(content="blank", transport="ideal")
    b = make_board(transport="ideal", seed=99)
    assert cli("info", "--board", f"sim:{a}").code == 0
    r = cli("flash", image, "--yes", "--force", "--start-sector", "0x20", "--sector-count", "3",
            "--expect-part", PART_KEY, "--board", f"sim:{a}", "--board", f"sim:{b}")
    assert r.code == 0, r.err
    runs = json.loads(cli("runs", "--format", "json").out)
    flash = {x["board_spec"]: x["run_id"] for x in runs if x["command"] == "flash"}
    return {"runs": runs, "flash_a": flash[f"sim:{a}"], "flash_b": flash[f"sim:{b}"]}


def _export(cli, tmp_path: Path, fmt: str, *extra: str) -> Path:  # noqa: F811
    out = tmp_path / f"audit.{fmt}"
    r = cli("audit", "export", "--format", fmt, "-o", out, *extra)
    assert r.code == 0, r.err
    assert not out.with_name(out.name + ".partial").exists()
    return out


def _db_rows(path: Path) -> list[tuple[str, int]]:
    conn = sqlite3.connect(path)
    rows = [(table, seq) for table in PHYSICAL for (seq,) in conn.execute(f"SELECT seq FROM {table}")]
    conn.close()
    return sorted(rows, key=lambda x: x[1])


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_round_trip_verifies_clean_and_holds_every_row(cli, db, trail, tmp_path, fmt):  # noqa: F811
    out = _export(cli, tmp_path, fmt)
    r = cli("audit", "verify", "--export", out)
    assert r.code == 0, r.out
    records = [rec for _, rec in read_export(out)]
    rows = [(rec["table"], rec["seq"]) for rec in records if rec["record"] == "row"]
    assert rows == _db_rows(db)
    assert f"{len(rows)} rows" in r.out and "every run's chain complete" in r.out
    conn = sqlite3.connect(db)
    checkpoints = conn.execute("SELECT count(*) FROM checkpoints").fetchone()[0]
    conn.close()
    assert sum(rec["record"] == "checkpoint" for rec in records) == checkpoints
    assert records[0]["record"] == "header" and [r["record"] for r in records[-2:]] == ["end", "seal"]


def test_files_parse_with_standard_libraries(cli, trail, tmp_path):  # noqa: F811
    jsonl = [json.loads(line) for line in _export(cli, tmp_path, "jsonl").read_text().splitlines()]
    with open(_export(cli, tmp_path, "csv"), newline="") as f:
        table = list(csv.DictReader(f))
    assert [json.loads(row["json"]) for row in table] == jsonl
    assert [(r["record"], r["table"]) for r in table] == [(o["record"], o.get("table", "")) for o in jsonl]
    blob = next(o for o in jsonl if o["record"] == "blob")
    user = next(o for o in jsonl if o["record"] == "row" and o["table"] == "log_spi" and o["values"]["tx"])
    assert bytes.fromhex(blob["data"]) and set(user["values"]["tx"]) == {"sha256"}


def _rewrite(path: Path, change) -> None:  # noqa: ANN001
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(change(lines)))


def _replace_first(lines: list[str], needle: str, old: str, new: str) -> list[str]:
    n = next(i for i, line in enumerate(lines) if i > 5 and needle in line and old in line)
    return lines[:n] + [lines[n].replace(old, new, 1)] + lines[n + 1:]


def test_a_tampered_row_is_found_and_its_run_named(cli, trail, tmp_path):  # noqa: F811
    out = _export(cli, tmp_path, "jsonl")
    _rewrite(out, lambda lines: _replace_first(lines, '"table":"log_units"', '"state":"verified"', '"state":"failed"'))
    r = cli("audit", "verify", "--export", out)
    assert r.code == 1 and "export BROKEN" in r.out and "do not match checkpoint" in r.out


@pytest.mark.parametrize("damage, message", [
    (lambda lines: _replace_first(lines, '"record":"blob"', '"data":"', '"data":"00'), "blob bytes do not match"),
    (lambda lines: _replace_first(lines, '"record":"checkpoint"', '"rows":', '"rows":1'), "its hash does not match"),
    (lambda lines: [line for i, line in enumerate(lines) if not (i > 5 and '"record":"row"' in line and i % 7 == 0)],
     "counts"),
    (lambda lines: lines[:-3], "truncated"),
    (lambda lines: [line for line in lines if '"record":"checkpoint"' not in line or '"id":2,' not in line],
     "counts"),
], ids=["blob-changed", "checkpoint-changed", "rows-removed", "end-cut", "checkpoint-removed"])
def test_damage_is_named(cli, trail, tmp_path, damage, message):  # noqa: F811
    out = _export(cli, tmp_path, "jsonl")
    _rewrite(out, damage)
    r = cli("audit", "verify", "--export", out)
    assert r.code == 1 and "BROKEN" in r.out and message in r.out, r.out


def test_removed_rows_are_found_even_when_the_end_record_is_fixed(cli, trail, tmp_path):  # noqa: F811
    out = _export(cli, tmp_path, "jsonl")
    lines = out.read_text().splitlines(keepends=True)
    kept = [line for i, line in enumerate(lines) if not (i > 5 and '"table":"log_spi"' in line and i % 5 == 0)]
    end = json.loads(kept[-2])
    end["rows"] = sum('"record":"row"' in line for line in kept)
    kept[-2] = json.dumps(end, separators=(",", ":")) + "\n"
    out.write_text("".join(kept))
    r = cli("audit", "verify", "--export", out)
    assert r.code == 1 and "do not match checkpoint" in r.out


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_single_run_export_of_interleaved_runs_verifies_on_its_own(cli, db, trail, tmp_path, fmt):  # noqa: F811
    run_id = trail["flash_a"]
    out = _export(cli, tmp_path, fmt, "--run", run_id[:20])
    records = [rec for _, rec in read_export(out)]
    rows = [rec for rec in records if rec["record"] == "row"]
    conn = sqlite3.connect(db)
    key = conn.execute("SELECT seq FROM runs WHERE run_id = ?", [run_id]).fetchone()[0]
    other = conn.execute("SELECT seq FROM runs WHERE run_id = ?", [trail["flash_b"]]).fetchone()[0]
    interleaved = conn.execute("SELECT count(*) FROM log_spi WHERE run = ? AND seq BETWEEN ? AND ?",
                               [other, rows[0]["seq"], rows[-1]["seq"]]).fetchone()[0]
    conn.close()
    assert interleaved > 0, "the two boards' rows should interleave"
    assert {r["values"].get("run", r["values"].get("run_id")) for r in rows} == {key, run_id}
    r = cli("audit", "verify", "--export", out)
    assert r.code == 0, r.out
    assert "PARTIAL" not in r.out and f"run export of {run_id}" in r.out and "chain complete" in r.out
    # One changed byte of one page program's row is found.
    text = out.read_text()
    victim = next(rec for rec in rows[20:] if rec["table"] == "log_spi")
    q = '"' if fmt == "jsonl" else '""'    # CSV doubles the quotes of its JSON cell
    old = f'{q}command{q}:{victim["values"]["command"]},'
    assert text.count(old) >= 1
    out.write_text(text.replace(old, f'{q}command{q}:{victim["values"]["command"] ^ 0x100},', 1))
    r = cli("audit", "verify", "--export", out)
    assert r.code == 1 and f"run {run_id}" in r.out


def test_export_of_an_unknown_run_is_refused(cli, trail):  # noqa: F811
    r = cli("audit", "export", "--run", "nosuchrun")
    assert r.code == 2 and "no run" in r.err


def test_an_export_is_checked_against_a_trusted_key(cli, trail, tmp_path, host_key):  # noqa: F811
    from amdflash.store import keys

    out = _export(cli, tmp_path, "jsonl", "--run", trail["flash_a"])
    good, other = tmp_path / "host.pub", tmp_path / "other.pub"
    good.write_text(keys.public_line(keys.public_bytes(keys.load_private(host_key))))
    other.write_text(keys.public_line(bytes(32)))
    r = cli("audit", "verify", "--export", out, "--key", good)
    assert r.code == 0 and "verified against the given --key" in r.out
    r = cli("audit", "verify", "--export", out, "--key", other)
    assert r.code == 1 and "not a given --key" in r.out
