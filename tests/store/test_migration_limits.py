"""`audit upgrade` of a version-1 trail holding values no amdflash recorded (issue 41 item 7):
whoever can write a version-1 file can put anything in it and re-chain it, no key needed. A
value over the limit is refused by name — table, seq, column, its size and the limit — exit
2, before anything is opened for writing: the file and everything beside it byte-identical,
no key made. A smaller text that Python's parser cannot take (`boards.detail` was Python
text) is kept as text, as any other unreadable detail."""
from __future__ import annotations

import json
import lzma
import sqlite3
from pathlib import Path

import pytest

from amdflash.store.migrate import LEGACY_VALUE_LIMIT
from tests.pipeline.engine.test_legacy_trail import FIXTURE, rechain
from tests.support import cli


def _legacy(tmp_path: Path, *edits: tuple[str, str, str]) -> tuple[Path, dict[str, int]]:
    """The version-1 fixture in a directory of its own with the last row of each (table,
    column) set to the text given, re-chained as a forger would; the seq of each edit."""
    path = tmp_path / "trail" / "audit.sqlite"
    path.parent.mkdir()
    path.write_bytes(lzma.decompress(FIXTURE.read_bytes()))
    con = sqlite3.connect(path)
    for (trigger,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        con.execute(f"DROP TRIGGER {trigger}")
    seqs = {}
    for table, column, text in edits:
        seq = con.execute(f"SELECT max(seq) FROM {table}").fetchone()[0]
        con.execute(f"UPDATE {table} SET {column} = ? WHERE seq = ?", (text, seq))
        seqs[f"{table}.{column}"] = seq
    con.commit()
    con.close()
    rechain(path)
    return path, seqs


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.fixture(autouse=True)
def _key_and_locks(tmp_path, monkeypatch):
    monkeypatch.setenv("AMDFLASH_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("AMDFLASH_HOST_KEY", str(tmp_path / "keys" / "host_key.pem"))
    (tmp_path / "keys").mkdir()


@pytest.mark.parametrize("table, column, text", [
    # Python text of a hundred thousand unary minus signs: its parser ran out of memory on it
    ("boards", "detail", "-" * 100_000 + "1"),
    ("stages", "detail", "x" * 100_000),
    ("errors", "message", "é" * 50_000),                     # 100,000 bytes of UTF-8
], ids=["boards.detail", "stages.detail", "errors.message"])
def test_an_oversized_legacy_value_is_refused_by_name_and_nothing_changes(tmp_path, table, column, text):
    db, seqs = _legacy(tmp_path, (table, column, text))
    before = _files(db.parent)
    r = cli.run("--db", db, "audit", "upgrade")
    size = len(text.encode())
    assert r.code == 2 and r.out == "", r.err
    seq = seqs[f"{table}.{column}"]
    assert r.err == (f"error: cannot upgrade {db}: {table} seq {seq}, column {column}, holds {size} bytes, "
                     f"more than the {LEGACY_VALUE_LIMIT} one value may hold; nothing was changed\n"), r.err
    assert _files(db.parent) == before                   # the file, and no -wal, -shm or journal beside it
    assert not (tmp_path / "keys" / "host_key.pem").exists()
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    assert con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("1",)
    con.close()


def test_values_within_the_limit_upgrade_and_a_detail_python_cannot_parse_stays_text(tmp_path):
    nested = "-" * 5000 + "1"             # Python's parser: RecursionError (MemoryError from 10,000)
    at_limit = "y" * LEGACY_VALUE_LIMIT
    db, seqs = _legacy(tmp_path, ("boards", "detail", nested), ("stages", "detail", at_limit))
    r = cli.run("--db", db, "audit", "upgrade")
    assert r.code == 0 and "upgraded" in r.out, r.err
    con = sqlite3.connect(db)
    detail, emulated = con.execute("SELECT detail, emulated FROM boards WHERE seq = ?",
                                   (seqs["boards.detail"],)).fetchone()
    kept = con.execute("SELECT detail FROM stages WHERE seq = ?", (seqs["stages.detail"],)).fetchone()[0]
    con.close()
    assert json.loads(detail) == {"text": nested} and emulated == 0
    assert kept == at_limit
