"""audit export / audit verify --export: round trips, tampering, single-run partial chains."""
from __future__ import annotations

import csv
import json
import re
import sqlite3
from pathlib import Path

import pytest

from amdflash.store.chain import link
from amdflash.store.export import HEAD, Record, _CsvWriter, _JsonlWriter, read_export, verify_export
from amdflash.store.schema import AUDIT_TABLES, GENESIS
from tests.pipeline.conftest import cli, db  # noqa: F401 - fixtures: in-process CLI with its own database

MiB2 = 0x200000


@pytest.fixture
def trail(cli, make_board, tmp_path) -> dict[str, object]:  # noqa: F811
    """A small trail: info on one board, then one flash on two boards at once (interleaved rows)."""
    from amdflash.stages.transport.sim.synth import PART_KEY, synthetic_ifwi

    image = tmp_path / "image.bin"
    image.write_bytes(synthetic_ifwi(21))
    a = make_board(content="blank", transport="ideal")
    b = make_board(transport="ideal", seed=99)
    assert cli("info", "--board", f"sim:{a}").code == 0
    r = cli("flash", image, "--yes", "--start-sector", "0x20", "--sector-count", "3",
            "--expect-part", PART_KEY, "--board", f"sim:{a}", "--board", f"sim:{b}")
    assert r.code == 0, r.err
    runs = json.loads(cli("runs", "--format", "json").out)
    flash_a = next(x["run_id"] for x in runs if x["command"] == "flash" and x["board_spec"] == f"sim:{a}")
    return {"runs": runs, "flash_a": flash_a}


def _export(cli, tmp_path: Path, fmt: str, *extra: str) -> Path:  # noqa: F811
    out = tmp_path / f"audit.{fmt}"
    r = cli("audit", "export", "--format", fmt, "-o", out, *extra)
    assert r.code == 0, r.err
    assert not out.with_name(out.name + ".partial").exists()
    return out


def _db_rows(path: Path) -> list[tuple[str, int, tuple, str]]:
    conn = sqlite3.connect(path)
    rows = []
    for table, columns in AUDIT_TABLES.items():
        for r in conn.execute(f"SELECT seq, {', '.join(columns)}, hash FROM {table}"):
            rows.append((table, r[0], tuple(r[1:-1]), r[-1]))
    conn.close()
    return sorted(rows, key=lambda x: x[1])


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_round_trip_verifies_clean_and_reconstructs_every_value(cli, db, trail, tmp_path, fmt):  # noqa: F811
    out = _export(cli, tmp_path, fmt)
    r = cli("audit", "verify", "--export", out)
    assert r.code == 0, r.out
    db_rows = _db_rows(db)
    assert f"complete chain of {len(db_rows)} rows" in r.out

    exported = [rec for rec in read_export(out) if rec.table != HEAD]
    # Exact: same types as SQLite returns (repr distinguishes 5/5.0/'5', None/'', bytes/str).
    assert [(e.table, e.seq, repr(tuple(e.values.values())), e.hash) for e in exported] == \
           [(t, s, repr(v), h) for t, s, v, h in db_rows]
    types = {type(v) for e in exported for v in e.values.values()}
    assert {int, float, str, bytes, type(None)} <= types
    assert exported[0].prev_hash == GENESIS
    assert all(x.prev_hash == y.hash for y, x in zip(exported, exported[1:]))


def test_database_verify_is_unchanged_without_export(cli, trail):  # noqa: F811
    r = cli("audit", "verify")
    assert r.code == 0 and r.out.startswith("audit chain intact")


def test_files_parse_with_standard_libraries(cli, trail, tmp_path):  # noqa: F811
    jsonl = [json.loads(line) for line in _export(cli, tmp_path, "jsonl").read_text().splitlines()]
    with open(_export(cli, tmp_path, "csv"), newline="") as f:
        table = list(csv.DictReader(f))
    assert len(jsonl) == len(table)
    assert [(o["table"], int(o["seq"]), o["hash"]) for o in jsonl] == [(r["table"], int(r["seq"]), r["hash"]) for r in table]
    assert jsonl[-1]["table"] == table[-1]["table"] == HEAD
    assert jsonl[-1]["rows"] == int(table[-1]["rows"]) == len(jsonl) - 1
    blob_j = next(o for o in jsonl if o["table"] == "register_writes" and o["data"] is not None)
    blob_c = next(r for r in table if r["table"] == "register_writes" and r["data"])
    assert set(blob_j["data"]) == {"hex"} and bytes.fromhex(blob_j["data"]["hex"])
    assert blob_c["data"].startswith("hex:") and blob_c["types"][4] == "b"


def _tamper_line(path: Path, predicate, change) -> tuple[int, int]:  # noqa: ANN001
    """Apply `change` to the first line after the first 10 that `predicate` accepts."""
    lines = path.read_text().splitlines(keepends=True)
    n = next(i for i, line in enumerate(lines) if i > 10 and predicate(line))
    lines[n] = change(lines[n])
    path.write_text("".join(lines))
    return n + 1, int(re.search(r'"seq":(\d+)', lines[n]).group(1)) if lines[n].startswith("{") else \
        int(lines[n].split(",")[1])


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_a_tampered_line_is_found_and_named(cli, trail, tmp_path, fmt):  # noqa: F811
    out = _export(cli, tmp_path, fmt)
    if fmt == "jsonl":
        line, seq = _tamper_line(out, lambda s: '"table":"units"' in s and '"state":"verified"' in s,
                                 lambda s: s.replace('"state":"verified"', '"state":"failed"'))
    else:
        line, seq = _tamper_line(out, lambda s: s.startswith("units,") and ",verified," in s,
                                 lambda s: s.replace(",verified,", ",failed,"))
    r = cli("audit", "verify", "--export", out)
    assert r.code == 1
    assert f"export BROKEN at line {line} (units seq {seq}): stored hash does not match" in r.out
    assert f"checked {seq - 1} rows before it" in r.out


@pytest.mark.parametrize("damage, message", [
    (lambda lines: lines[:15] + lines[16:], "are missing"),                 # a row removed from the middle
    (lambda lines: lines[:-3], "truncated"),                                # the end cut off
    (lambda lines: lines[:-3] + lines[-1:], "not the recorded chain head"),  # rows removed, head kept
    (lambda lines: lines[:10] + [lines[9]] + lines[10:], "out of order"),   # a row repeated
], ids=["row-removed", "end-cut", "end-rows-removed", "row-repeated"])
def test_missing_or_reordered_rows_are_named(cli, trail, tmp_path, damage, message):  # noqa: F811
    out = _export(cli, tmp_path, "jsonl")
    lines = out.read_text().splitlines(keepends=True)
    kept = damage(lines)
    if kept[-1] == lines[-1] and len(kept) < len(lines):
        # Keep the row count right, so that the check under test is the one that fires.
        head = json.loads(lines[-1])
        head["rows"] = len(kept) - 1
        kept[-1] = json.dumps(head, separators=(",", ":")) + "\n"
    out.write_text("".join(kept))
    r = cli("audit", "verify", "--export", out)
    assert r.code == 1 and "BROKEN" in r.out and message in r.out, r.out


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_single_run_export_verifies_as_a_partial_chain(cli, trail, tmp_path, fmt):  # noqa: F811
    run_id = trail["flash_a"]
    out = _export(cli, tmp_path, fmt, "--run", run_id[:20])
    records = [r for r in read_export(out) if r.table != HEAD]
    assert records and {r.values["run_id"] for r in records} == {run_id}
    seqs = [r.seq for r in records]
    assert any(b - a > 1 for a, b in zip(seqs, seqs[1:])), "the two boards' rows should interleave"

    r = cli("audit", "verify", "--export", out)
    assert r.code == 0, r.out
    assert "PARTIAL chain" in r.out and f"{len(records)} rows of run {run_id}" in r.out

    text = out.read_text()
    victim = next(r for r in records[5:] if r.table == "register_writes" and r.values["value"] is not None)
    n, offset, value = (victim.values[k] for k in ("n", "offset", "value"))
    row = '"n":{},"offset":{},"value":{}' if fmt == "jsonl" else ",{},{},{},"
    assert text.count(row.format(n, offset, value)) == 1
    out.write_text(text.replace(row.format(n, offset, value), row.format(n, offset, value ^ 1)))
    r = cli("audit", "verify", "--export", out)
    assert r.code == 1 and f"(register_writes seq {victim.seq})" in r.out


def test_export_of_an_unknown_run_is_refused(cli, trail):  # noqa: F811
    r = cli("audit", "export", "--run", "nosuchrun")
    assert r.code == 2 and "no run" in r.err


TRICKY = [
    ("errors", {"run_id": "", "stage": None, "message": 'hex:00, "quoted"\nnew line é', "address": 2**62, "at": "5"}),
    ("register_writes", {"run_id": "r", "n": -1, "offset": 0, "value": None, "data": b"", "clock": -0.0}),
    ("register_writes", {"run_id": "r", "n": 2, "offset": 4, "value": 0, "data": b"\x00\xff", "clock": 0.1}),
    ("verifies", {"run_id": "r", "address": 0, "size": 1, "ok": 0, "attempt": 1, "expected_sha256": "",
                  "actual_sha256": None, "mismatch_address": None, "flash_byte": 255, "image_byte": 0,
                  "clock": 1e-300}),
]


@pytest.mark.parametrize("writer", [_JsonlWriter, _CsvWriter])
def test_values_round_trip_exactly(tmp_path, writer):
    """None vs '', bytes vs 'hex:' text, -0.0, tiny floats and big ints all hash as written."""
    path = tmp_path / "x"
    prev, written = GENESIS, []
    with open(path, "w", newline="") as f:
        w = writer(f)
        for seq, (table, values) in enumerate(TRICKY, 1):
            digest = link(prev, table, seq, tuple(values.values()))
            w.write(Record(table, seq, digest, prev, values))
            written.append((table, seq, repr(tuple(values.values()))))
            prev = digest
        w.write(Record(HEAD, len(TRICKY), prev, run_id=None, rows=len(TRICKY)))
    back = [(r.table, r.seq, repr(tuple(r.values.values()))) for r in read_export(path) if r.table != HEAD]
    assert back == written
    assert verify_export(path).ok
