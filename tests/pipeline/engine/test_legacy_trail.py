"""Nothing amdflash reads can make it vouch for a legacy trail (issue 28, item 1).

The first trail format (schema version 1) had a hash chain and no signature: whoever can
write the file edits a run (a failed flash turned "succeeded", the operator renamed) and
re-chains it, no key needed. Reading such a file — runs, report, replay, audit verify,
sim create --from-run — must never upgrade it, sign it or create a key; a board command
refuses it; only its owner's `audit upgrade` upgrades it, and its rows stay "recorded by an
older amdflash, unsigned" everywhere after (never signed, `report --key` exits 1). A trail
of another user, read by root, is read without writing anything beside it.
"""
from __future__ import annotations

import hashlib
import heapq
import json
import lzma
import os
import sqlite3
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from amdflash.pipeline.cli.main import main
from amdflash.store import keys
from amdflash.store.migrate import V1_TABLES, _v1_field

FIXTURE = Path(__file__).resolve().parents[2] / "store" / "data" / "audit-v1.sqlite.xz"
FAILED = "20261130T160706-6dca7996"       # the fixture's flash that failed on a stuck bit
CLEAN = "20261130T160706-81ca7fc3"        # a flash that succeeded (replay reproduces it)


def rechain(db: Path) -> None:
    """What a forger does after editing rows: recompute every version-1 hash (no key needed)."""
    con = sqlite3.connect(db)
    rows = heapq.merge(*([(r[0], t, r) for r in con.execute(
        f"SELECT seq, {', '.join(cols)} FROM {t} ORDER BY seq").fetchall()] for t, cols in V1_TABLES.items()),
        key=lambda x: x[0])
    prev = "0" * 64
    for seq, table, row in rows:
        canonical = b"|".join([table.encode(), b"%d" % seq, *map(_v1_field, row[1:])])
        prev = hashlib.sha256(prev.encode() + canonical).hexdigest()
        con.execute(f"UPDATE {table} SET hash = ? WHERE seq = ?", (prev, seq))
    con.execute("UPDATE chain_head SET seq = ?, hash = ? WHERE id = 1", (seq, prev))
    con.commit()
    con.close()


def forge(db: Path) -> None:
    """The failed flash rewritten as succeeded, by another operator, and re-chained."""
    con = sqlite3.connect(db)
    for (trigger,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        con.execute(f"DROP TRIGGER {trigger}")
    con.execute("UPDATE run_status SET status = 'succeeded', detail = NULL WHERE run_id = ? AND status = 'failed'",
                (FAILED,))
    con.execute("UPDATE runs SET operator = 'alice' WHERE run_id = ?", (FAILED,))
    con.commit()
    con.close()
    rechain(db)


@pytest.fixture
def trail(tmp_path: Path, monkeypatch) -> Path:
    """A forged version-1 trail in a directory of its own; the host key is a path of its own
    that does not exist yet (no command here may create it, except the upgrade)."""
    path = tmp_path / "trail" / "audit.sqlite"
    path.parent.mkdir()
    path.write_bytes(lzma.decompress(FIXTURE.read_bytes()))
    forge(path)
    monkeypatch.setenv("AMDFLASH_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("AMDFLASH_HOST_KEY", str(tmp_path / "keys" / "host_key.pem"))
    (tmp_path / "keys").mkdir()
    return path


def amdflash(db: Path, capsys, *args: object) -> tuple[int, str, str]:
    code = main(["-q", "--db", str(db), *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def state(db: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every file beside the trail (its -wal, -shm, anchor too): owner, mtime, bytes."""
    out = {}
    for f in sorted(db.parent.iterdir()):
        st = f.stat()
        out[f.name] = (st.st_uid, st.st_mtime_ns, f.read_bytes())
    return out


def host_key() -> Path:
    return Path(os.environ["AMDFLASH_HOST_KEY"])


def public_key_file(tmp_path: Path) -> Path:
    pub = tmp_path / "host.pub"
    pub.write_text(keys.public_line(keys.public_bytes(keys.load_private(host_key()))))
    return pub


READS = [("runs",), ("runs", "--format", "json"), ("report", FAILED), ("report", FAILED, "--format", "json"),
         ("audit", "verify"), ("audit", "verify", "--run", FAILED), ("replay", CLEAN)]


def test_reading_a_forged_version_1_trail_changes_nothing_and_creates_no_key(trail: Path, capsys, tmp_path):
    before = state(trail)
    for args in READS:
        code, out, err = amdflash(trail, capsys, *args)
        assert code in (0, 2), (args, out, err)
        if code == 2:      # refused: it names the one command that upgrades it
            assert f"amdflash --db {trail} audit upgrade" in err, (args, err)
        assert state(trail) == before, args
        assert not host_key().exists(), args
    code, _, err = amdflash(trail, capsys, "sim", "create", tmp_path / "made", "--from-run", trail, FAILED)
    assert code == 2 and "audit upgrade" in err
    assert state(trail) == before and not host_key().exists()


def test_audit_verify_of_a_version_1_trail_never_says_signed(trail: Path, capsys, tmp_path):
    code, out, _ = amdflash(trail, capsys, "audit", "verify")
    assert code == 0 and "5787 legacy rows (seq 1..5787, 8 run(s)) verified by their unsigned v1 chain only" in out
    assert "signed checkpoints" not in out and "signatures" not in out
    other = tmp_path / "other.pub"
    other.write_text(keys.public_line(keys.public_bytes(Ed25519PrivateKey.generate())))
    code, out, _ = amdflash(trail, capsys, "audit", "verify", "--key", other)
    assert code == 1 and "NOT SIGNED" in out and "verified against" not in out
    assert not host_key().exists()


def test_a_board_command_refuses_a_version_1_trail(trail: Path, capsys, make_board):
    before = state(trail)
    code, _, err = amdflash(trail, capsys, "info", "--board", f"sim:{make_board(transport='ideal')}")
    assert code == 2 and f"amdflash --db {trail} audit upgrade" in err
    assert state(trail) == before and not host_key().exists()


def test_after_the_upgrade_the_legacy_runs_are_never_shown_as_signed(trail: Path, capsys, tmp_path, make_board):
    code, out, _ = amdflash(trail, capsys, "audit", "upgrade")
    assert code == 0 and "stay recorded by an older amdflash, unsigned" in out
    pub = public_key_file(tmp_path)
    # A run recorded after the upgrade is signed as any other.
    board = make_board(transport="ideal")
    assert amdflash(trail, capsys, "info", "--board", f"sim:{board}")[0] == 0
    runs = json.loads(amdflash(trail, capsys, "runs", "--format", "json")[1])
    assert [r["legacy"] for r in runs] == [True] * 8 + [False]
    new = runs[-1]["run_id"]
    assert "[legacy: recorded by an older amdflash, unsigned]" in amdflash(trail, capsys, "runs")[1].splitlines()[2]

    con = sqlite3.connect(trail)
    signed = con.execute("SELECT count(*) FROM checkpoints WHERE kind != 'migrated'").fetchone()[0]
    assert con.execute("SELECT count(*) FROM checkpoints").fetchone()[0] == signed + 8
    con.close()
    code, out, _ = amdflash(trail, capsys, "audit", "verify", "--key", pub)
    assert code == 0 and f"9 run(s), {signed} signed checkpoints" in out, out
    assert "legacy rows (seq 1..5787, 8 run(s)) recorded by an older amdflash, unsigned: verified by their " \
           "unsigned v1 chain only" in out

    # The forged run: shown as legacy, unsigned, in text, JSON and HTML; with --key refused (exit 1).
    code, out, _ = amdflash(trail, capsys, "report", FAILED)
    assert code == 0 and "legacy     recorded by an older amdflash, unsigned" in out
    assert "signature  none: recorded by an older amdflash, unsigned" in out and "signed by nobody" in out
    rep = json.loads(amdflash(trail, capsys, "report", FAILED, "--format", "json")[1])
    assert rep["chain"]["legacy"].startswith("recorded by an older amdflash, unsigned")
    assert rep["chain"]["signed_by"] is None and rep["status"] == "succeeded"     # what the forger wrote, unvouched
    page = tmp_path / "page.html"
    assert amdflash(trail, capsys, "report", FAILED, "--format", "html", "-o", page)[0] == 0
    assert 'data-field="legacy"' in page.read_text() and "older amdflash, unsigned" in page.read_text()
    assert 'data-field="legacy-badge"' in page.read_text()        # beside the (forged) status
    code, out, err = amdflash(trail, capsys, "report", FAILED, "--key", pub)
    assert code == 1 and not out and "older amdflash, unsigned" in err
    code, out, _ = amdflash(trail, capsys, "audit", "verify", "--run", FAILED, "--key", pub)
    assert code == 1 and "NOT SIGNED" in out
    # The run recorded after the upgrade verifies against the key.
    assert amdflash(trail, capsys, "report", new, "--key", pub)[0] == 0


def test_a_legacy_checkpoint_after_the_upgrade_is_refused(trail: Path, capsys, tmp_path):
    """A forger cannot pass new rows off as legacy after the signed migration checkpoint."""
    from amdflash.store.chain import Checkpoint

    assert amdflash(trail, capsys, "audit", "upgrade")[0] == 0
    con = sqlite3.connect(trail)
    last = con.execute("SELECT id, hash, host FROM checkpoints ORDER BY id DESC LIMIT 1").fetchone()
    first = con.execute("SELECT id, run, run_id, rows, last_seq, head, at FROM checkpoints ORDER BY id").fetchone()
    public = con.execute("SELECT public_key FROM hosts WHERE id = ?", (last[2],)).fetchone()[0]
    cp = Checkpoint(last[0] + 1, "migrated", first[2], first[3], first[4], first[5], public, first[6], None)
    cp.hash = cp.digest(last[1])
    con.execute("INSERT INTO checkpoints (id, kind, run, run_id, rows, last_seq, head, host, at, detail, hash, sig) "
                "VALUES (?, 'migrated', ?, ?, ?, ?, ?, ?, ?, NULL, ?, x'')",
                (cp.id, first[1], cp.run_id, cp.rows, cp.last_seq, cp.head, last[2], cp.at, cp.hash))
    con.execute("UPDATE chain_head SET checkpoint = ?, hash = ? WHERE id = 1", (cp.id, cp.hash))
    con.commit()
    con.close()
    code, out, _ = amdflash(trail, capsys, "audit", "verify")
    assert code == 1 and "seals legacy rows after the migration checkpoint" in out, out


def test_an_upgrade_is_its_owners_alone(trail: Path, capsys):
    if os.geteuid() != 0:
        pytest.skip("needs root to give the trail to another user")
    os.chown(trail, 65534, 65534)
    before = state(trail)
    code, _, err = amdflash(trail, capsys, "audit", "upgrade")
    assert code == 2 and "belongs to uid 65534" in err
    assert state(trail) == before and not host_key().exists()


def test_root_reads_another_users_trail_without_writing_beside_it(trail: Path, capsys, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to read another user's trail")
    assert amdflash(trail, capsys, "audit", "upgrade")[0] == 0
    for f in trail.parent.iterdir():      # the owner's reads leave a -wal/-shm; a closed trail has none
        if f.name.endswith(("-wal", "-shm")):
            f.unlink()
    os.remove(host_key())
    for f in (trail.parent, *trail.parent.iterdir()):
        os.chown(f, 65534, 65534)
    before = state(trail)
    for args in READS:
        code, out, err = amdflash(trail, capsys, *args)
        assert code == 0, (args, out, err)
        assert state(trail) == before, args
        assert not host_key().exists(), args
