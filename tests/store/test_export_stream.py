"""audit export / verify --export on a trail of many runs (issue 42): memory bounded by one run,
not the trail; gzip-compressed exports; whole runs chosen by their start time."""
from __future__ import annotations

import gzip
import json
import sqlite3
import tracemalloc
from pathlib import Path

import pytest

from amdflash.store.export import read_export, verify_export
from tests.pipeline.engine.conftest import cli, db  # noqa: F401 - fixtures: in-process CLI with its own database


def _flash(cli, make_board, image: Path) -> None:  # noqa: F811
    from amdflash.stages.sim.synth import PART_KEY

    board = make_board(content="blank", transport="ideal")
    r = cli("flash", image, "--yes", "--force", "--start-sector", "0x20", "--sector-count", "16",
            "--expect-part", PART_KEY, "--board", f"sim:{board}")
    assert r.code == 0, r.err


def _image(tmp_path: Path) -> Path:
    from amdflash.stages.sim.synth import synthetic_ifwi

    image = tmp_path / "image.bin"
    image.write_bytes(synthetic_ifwi(21))
    return image


def _verify_peak(path: Path) -> int:
    """Python's peak allocation while verifying `path` (bytes)."""
    tracemalloc.start()
    try:
        report = verify_export(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert report.ok, report.first_bad
    return peak


def _rows(path: Path) -> int:
    return sum(1 for _, r in read_export(path) if r["record"] == "row")


@pytest.mark.slow
def test_verifying_an_export_holds_no_more_for_many_runs_than_for_few(cli, make_board, tmp_path):  # noqa: F811
    image = _image(tmp_path)
    for _ in range(2):
        _flash(cli, make_board, image)
    few = tmp_path / "few.jsonl"
    assert cli("audit", "export", "-o", few).code == 0
    for _ in range(6):
        _flash(cli, make_board, image)
    many = tmp_path / "many.jsonl"
    assert cli("audit", "export", "-o", many).code == 0
    assert _rows(many) > 3.5 * _rows(few)
    verify_export(few)                   # warm: imports and caches are not what is measured
    small, large = _verify_peak(few), _verify_peak(many)
    # Holding the rows (as before) grows with them: 4x the rows, about 4x the peak. A margin
    # of 1.25x and 200 kB keeps the test from flaking on allocator noise.
    assert large < 1.25 * small + 200_000, (small, large)


def test_a_compressed_export_verifies_as_it_is_and_holds_the_same_records(cli, make_board, tmp_path):  # noqa: F811
    _flash(cli, make_board, _image(tmp_path))
    plain, packed = tmp_path / "audit.jsonl", tmp_path / "audit.jsonl.gz"
    assert cli("audit", "export", "-o", plain).code == 0
    r = cli("audit", "export", "-o", packed)                # by its name
    assert r.code == 0, r.err
    assert packed.read_bytes()[:2] == b"\x1f\x8b"
    assert gzip.decompress(packed.read_bytes()) == plain.read_bytes()
    csv_packed = tmp_path / "audit.csv.z"
    assert cli("audit", "export", "--format", "csv", "--compress", "-o", csv_packed).code == 0   # by --compress
    for path in (packed, csv_packed):
        r = cli("audit", "verify", "--export", path)
        assert r.code == 0 and "export intact" in r.out, r.out
    # Tampered inside the compression: found, as in a plain file.
    text = plain.read_text()
    changed = tmp_path / "changed.jsonl.gz"
    changed.write_bytes(gzip.compress(text.replace('"state":"verified"', '"state":"failed"', 1).encode()))
    r = cli("audit", "verify", "--export", changed)
    assert r.code == 1 and "do not match checkpoint" in r.out, r.out
    # Cut short: BROKEN (exit 1), as a truncated plain export is; bytes that are not gzip: exit 2.
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(packed.read_bytes()[: len(packed.read_bytes()) // 2])
    r = cli("audit", "verify", "--export", cut)
    assert r.code == 1 and "truncated" in r.out, r.out
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(b"\x1f\x8b" + b"\x00" * 64)
    r = cli("audit", "verify", "--export", bad)
    assert r.code == 2 and r.err.startswith("error: ") and "gzip" in r.err, r.err
    # zstd is not built in: refused before anything is written.
    r = cli("audit", "export", "-o", tmp_path / "audit.jsonl.zst")
    assert r.code == 2 and "zstd" in r.err and not (tmp_path / "audit.jsonl.zst").exists()


def _started(db: Path) -> list[tuple[str, str]]:  # noqa: F811
    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT run_id, at FROM runs ORDER BY seq").fetchall()
    finally:
        con.close()


def test_since_and_until_export_whole_runs_by_their_start_time(cli, db, make_board, tmp_path):  # noqa: F811
    image = _image(tmp_path)
    for _ in range(3):
        _flash(cli, make_board, image)
    (first, _), (second, at2), (third, at3) = _started(db)
    out = tmp_path / "window.jsonl"
    r = cli("audit", "export", "--since", at2, "--until", at3, "-o", out)
    assert r.code == 0, r.err
    header = next(rec for _, rec in read_export(out))
    assert header["scope"] == "run" and header["runs"] == [second]
    assert {rec["values"].get("run_id") for _, rec in read_export(out) if rec["record"] == "row"} <= {second, None}
    assert cli("audit", "verify", "--export", out).code == 0
    r = cli("audit", "export", "--since", at2, "-o", tmp_path / "since.jsonl")
    assert r.code == 0 and next(rec for _, rec in read_export(tmp_path / "since.jsonl"))["runs"] == [second, third]
    r = cli("audit", "export", "--until", at2, "-o", tmp_path / "until.jsonl")
    assert r.code == 0 and next(rec for _, rec in read_export(tmp_path / "until.jsonl"))["runs"] == [first]
    # Refusals: before anything is written.
    for args in (("--since", "2999-01-01"), ("--since", "yesterday"), ("--since", at3, "--until", at2),
                 ("--run", first, "--since", at2)):
        r = cli("audit", "export", *args, "-o", tmp_path / "refused.jsonl")
        assert r.code == 2 and r.err.startswith("error: "), (args, r.err)
        assert not (tmp_path / "refused.jsonl").exists()
    assert "start time" in cli("audit", "export", "--help").out


def test_the_blob_set_spills_to_disk_and_still_finds_a_missing_blob(cli, make_board, tmp_path, monkeypatch):  # noqa: F811
    from amdflash.store import export as export_module

    _flash(cli, make_board, _image(tmp_path))
    out = tmp_path / "audit.jsonl"
    assert cli("audit", "export", "-o", out).code == 0
    monkeypatch.setattr(export_module._Shas, "LIMIT", 4)     # every few blobs go to the temporary file
    assert verify_export(out).ok
    # A blob record removed (and the counts and seal left as they were): its first use is named.
    lines = out.read_text().splitlines(keepends=True)
    blobs = [i for i, line in enumerate(lines) if line.startswith('{"record":"blob"')]
    assert len(blobs) > 8
    del lines[blobs[6]]
    out.write_text("".join(lines))
    report = verify_export(out)
    assert not report.ok and "refers to bytes not in the file" in report.first_bad, report.first_bad
    assert json.loads(lines[0])["record"] == "header"


def test_audit_verify_since_and_until_verify_the_runs_that_started_then(cli, db, make_board, tmp_path):  # noqa: F811
    image = _image(tmp_path)
    for _ in range(3):
        _flash(cli, make_board, image)
    (first, _), (second, at2), (third, at3) = _started(db)
    r = cli("audit", "verify", "--since", at2)
    assert r.code == 0 and "2 run(s) started" in r.out and "every one intact" in r.out, r.out
    assert second in r.out and third in r.out and first not in r.out
    # A row of the third run changed: only a window holding it says so.
    con = sqlite3.connect(db)
    key = con.execute("SELECT seq FROM runs WHERE run_id = ?", (third,)).fetchone()[0]
    con.execute("DROP TRIGGER log_units_no_update")
    con.execute("UPDATE log_units SET state = 'failed' WHERE seq = (SELECT min(seq) FROM log_units WHERE run = ?)",
                (key,))
    con.execute("CREATE TRIGGER log_units_no_update BEFORE UPDATE ON log_units "
                "BEGIN SELECT RAISE(ABORT, 'audit rows are append-only (log_units)'); END")
    con.commit()
    con.close()
    r = cli("audit", "verify", "--since", at3)
    assert r.code == 1 and "1 BROKEN" in r.out and third in r.out, r.out
    assert cli("audit", "verify", "--until", at3).code == 0
    for args in (("--since", "2999-01-01"), ("--since", at2, "--run", first), ("--until", "soon")):
        r = cli("audit", "verify", *args)
        assert r.code == 2 and r.err.startswith("error: "), (args, r.err)
    assert "start time" in cli("audit", "verify", "--help").out


def test_each_row_is_written_as_json_dumps_wrote_it_whatever_its_values(tmp_path):
    """SQLite writes a row's JSON text where it can be exactly what the Python encoder wrote
    before (byte-for-byte compatible exports); any other row is left to the Python encoder."""
    from amdflash.store import export_rows, schema

    con = sqlite3.connect(tmp_path / "t.sqlite", isolation_level=None)
    con.execute("BEGIN")
    schema.create(con)
    schema.drop_triggers(con)
    con.execute("INSERT INTO blobs VALUES (1, ?, ?)", (b"\x01" * 32, b"data"))
    texts = ["plain", "", 'quote " and \\ backslash', "é non-ASCII", "tab\there", "nl\nthere", "del\x7f", "\x01ctl",
             "\u2028", "emoji \U0001F600", "%s %d printf"]
    for i, text in enumerate(texts):
        con.execute("INSERT INTO stages (seq, run_id, stage, event, detail, at) VALUES (?, ?, ?, ?, ?, ?)",
                    (10 + i, f"run-{i}", text, "start", None, text))
    odd = [(1.5, None), (1e20, "x"), (b"\x00\xff", 3), (-7, "y"), (2**62, "z")]
    for i, (value, state) in enumerate(odd):      # a REAL, a BLOB or a big int where an int belongs
        con.execute("INSERT INTO log_units (seq, run, address, size, state, action, wanted_sha256, detail, clock) "
                    "VALUES (?, 1, ?, 4096, ?, 'write', ?, NULL, 5)", (100 + i, value, state, b"\xab" * 32))
    con.execute("INSERT INTO log_writes (seq, run, offset, value, data, clock) VALUES (200, 1, 5, 6, 1, 7)")
    con.execute("INSERT INTO log_writes (seq, run, offset, value, data, clock) VALUES (201, 1, 5, 6, NULL, 7)")
    con.execute("COMMIT")

    def as_before(table: str, seq: int) -> str:       # the export's encoder before issue 42, verbatim
        columns = schema.PHYSICAL[table]
        row = con.execute(f"SELECT {', '.join(c for c, _ in columns)} FROM {table} WHERE seq = ?", (seq,)).fetchone()
        values = {}
        for (column, kind), value in zip(columns, row, strict=True):
            if kind == "ref" and value is not None:
                value = {"sha256": bytes(con.execute("SELECT sha256 FROM blobs WHERE id = ?", (value,))
                                         .fetchone()[0]).hex()}
            values[column] = {"hex": bytes(value).hex()} if isinstance(value, bytes) else value
        return json.dumps({"record": "row", "table": table, "seq": seq, "values": values}, separators=(",", ":"))

    written = list(export_rows.rows(con, None))
    assert [r[0] for r in written] == sorted(r[0] for r in written) and len(written) == len(texts) + len(odd) + 2
    by_sqlite = 0
    for seq, _, text, table, *_ in written:
        if export_rows.PYTHON in text:
            text = export_rows.python_row(con, table, seq)
        else:
            by_sqlite += 1
        assert text == as_before(table, seq), (table, seq)
    assert by_sqlite >= 6        # the plain rows: SQLite wrote them


def test_a_file_replaced_between_the_two_readings_is_named(cli, db, make_board, tmp_path, monkeypatch):  # noqa: F811
    from amdflash.store import export as export_module

    image = _image(tmp_path)
    for _ in range(2):
        _flash(cli, make_board, image)
    (first, _), (second, _) = _started(db)
    one, other = tmp_path / "one.jsonl", tmp_path / "other.jsonl"
    assert cli("audit", "export", "--run", first, "-o", one).code == 0
    assert cli("audit", "export", "--run", second, "-o", other).code == 0
    real = export_module._prescan

    def prescan_then_swap(path: Path):
        found = real(path)
        path.write_bytes(other.read_bytes())      # a whole, valid export: but not the one first read
        return found

    monkeypatch.setattr(export_module, "_prescan", prescan_then_swap)
    report = verify_export(one)
    assert not report.ok and "the file changed while it was being verified" in report.first_bad, report.first_bad
