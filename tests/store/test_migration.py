"""A database made by amdflash with audit schema version 1 (tests/store/data, made at commit
4b7a341) is upgraded by its owner's `audit upgrade`, never on open: every recorded value
stays queryable under the same names, its runs stay legacy (sealed by unsigned checkpoints,
the first signed one marking where they end), replay still reproduces them, and a broken
version-1 chain is refused untouched."""
from __future__ import annotations

import json
import lzma
import sqlite3
from pathlib import Path

import pytest

from amdflash.pipeline.cli.main import main

FIXTURE = Path(__file__).with_name("data") / "audit-v1.sqlite.xz"

# What each logical table holds, as version 1 stored it (clocks to the microsecond).
CONTENT = {
    "runs": "seq, run_id, command, arguments, operator, host, tool_version, image_path, image_sha256, board_spec, "
            "resumes_run_id, at",
    "run_status": "seq, run_id, status, detail, result_sha256, summary, at",
    "boards": "seq, run_id, spec, kind, bridge_serial, pci_address, vendor_id, device_id, jedec, chip, unique_id, "
              "sr1, sr2, sr3, protection, sfdp, at",
    "stages": "seq, run_id, stage, event, detail, at",
    "register_writes": "run_id, n, offset, value, data, round(clock, 6)",
    "spi_transactions": "run_id, n, opcode, address, address_bytes, tx_len, rx_len, round(clock, 6)",
    "register_snapshots": "seq, run_id, label, registers, round(clock, 6)",
    "backup_units": "seq, run_id, address, size, sha256, data",
    "backups": "seq, run_id, sha256, size, path, at",
    "units": "seq, run_id, address, size, state, action, wanted_sha256, detail, round(clock, 6)",
    "verifies": "seq, run_id, address, size, ok, attempt, expected_sha256, actual_sha256, mismatch_address, "
                "flash_byte, image_byte, round(clock, 6)",
    "errors": "seq, run_id, stage, message, address, at",
}


def _content(path: Path) -> dict[str, list[tuple]]:
    con = sqlite3.connect(path)
    try:
        return {t: con.execute(f"SELECT {cols} FROM {t} ORDER BY run_id, {'n' if ' n,' in cols else 'seq'}").fetchall()
                for t, cols in CONTENT.items()}
    finally:
        con.close()


@pytest.fixture
def v1(tmp_path: Path, monkeypatch) -> Path:
    path = tmp_path / "audit.sqlite"
    path.write_bytes(lzma.decompress(FIXTURE.read_bytes()))
    monkeypatch.setenv("AMDFLASH_LOCK_DIR", str(tmp_path / "locks"))
    return path


def amdflash(db: Path, capsys, *args: object) -> tuple[int, str, str]:  # noqa: ANN001
    code = main(["-q", "--db", str(db), *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_version_1_database_is_upgraded_by_audit_upgrade_and_keeps_every_value(v1: Path, capsys, tmp_path,
                                                                                   host_key):
    from amdflash.store import keys

    before = _content(v1)
    assert len(before["register_writes"]) > 4000 and len(before["spi_transactions"]) > 1000
    size = v1.stat().st_size
    code, _, err = amdflash(v1, capsys, "runs", "--format", "json")
    assert code == 2 and f"amdflash --db {v1} audit upgrade" in err and "upgrading" not in err
    code, out, err = amdflash(v1, capsys, "audit", "upgrade")
    assert code == 0 and "upgrading audit database" in err and "5787" in out, out + err
    code, out, err = amdflash(v1, capsys, "runs", "--format", "json")
    assert code == 0, err
    runs = json.loads(out)
    assert len(runs) == 8 and {r["command"] for r in runs} == {"info", "flash", "read", "resume"}
    assert all(r["legacy"] for r in runs)
    con = sqlite3.connect(v1)
    assert con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("2",)
    kinds = [(k, bool(sig)) for (k, sig) in con.execute("SELECT kind, sig FROM checkpoints ORDER BY id")]
    migration = json.loads(con.execute("SELECT detail FROM checkpoints WHERE kind = 'migration'").fetchone()[0])
    detail, emulated = con.execute("SELECT detail, emulated FROM boards ORDER BY seq LIMIT 1").fetchone()
    con.close()
    # The legacy runs are sealed unsigned; the one signed checkpoint says where they end.
    assert kinds == [("migrated", False)] * 8 + [("migration", True)]
    assert migration["from_schema"] == 1 and migration["v1_head_seq"] == 5787 and len(migration["v1_head_hash"]) == 64
    assert migration["legacy_seq"] == [1, 5787] and migration["legacy_checkpoints"] == 8
    assert json.loads(detail) == {"emulated": True, "profile": "ideal"} and emulated == 1
    # Same content under the same names, much smaller.
    assert _content(v1) == before
    assert v1.stat().st_size < size / 2
    # The upgrade's checkpoint is signed by this host; the legacy rows by nobody.
    pub = tmp_path / "host.pub"
    pub.write_text(keys.public_line(keys.public_bytes(keys.load_private(host_key))))
    code, out, _ = amdflash(v1, capsys, "audit", "verify", "--key", pub)
    assert code == 0 and "8 run(s), 1 signed checkpoints" in out, out
    assert f"{migration['legacy_rows']} legacy rows (seq 1..5787, 8 run(s))" in out
    assert "verified by their unsigned v1 chain only" in out


def test_replay_still_reproduces_the_migrated_runs(v1: Path, capsys):
    assert amdflash(v1, capsys, "audit", "upgrade")[0] == 0
    runs = {r["board_spec"].rsplit("/", 1)[-1] + ":" + r["command"]: r["run_id"]
            for r in json.loads(amdflash(v1, capsys, "runs", "--format", "json")[1])}
    code, out, _ = amdflash(v1, capsys, "replay", runs["clean:flash"], "--format", "json")
    clean = json.loads(out)
    assert code == 0 and clean["identical"] and clean["writes_applied"] == clean["writes_total"] > 500
    code, out, _ = amdflash(v1, capsys, "replay", runs["stuck:flash"], "--format", "json")
    stuck = json.loads(out)
    assert code == 1 and stuck["divergences"][0]["unit"] == 0x2000
    assert stuck["divergences"][0]["recorded_byte"] == stuck["divergences"][0]["replayed_byte"] | 1
    code, out, _ = amdflash(v1, capsys, "replay", runs["killed:resume"], "--format", "json")
    assert code == 0 and json.loads(out)["identical"]


def test_a_broken_version_1_chain_is_refused_and_left_untouched(v1: Path, capsys):
    con = sqlite3.connect(v1)
    con.execute("DROP TRIGGER units_no_update")
    con.execute("UPDATE units SET state = 'verified' WHERE seq = (SELECT max(seq) FROM units WHERE state = 'failed')")
    con.commit()
    con.close()
    before = _content(v1)
    code, out, _ = amdflash(v1, capsys, "audit", "verify")
    assert code == 1 and "BROKEN" in out and "version-1 chain is broken: units seq" in out
    code, _, err = amdflash(v1, capsys, "audit", "upgrade")
    assert code == 2 and "version-1 chain is broken: units seq" in err
    con = sqlite3.connect(v1)
    assert con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("1",)
    con.close()
    assert _content(v1) == before
