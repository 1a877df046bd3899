"""The attack the signatures exist for: someone who can write the database file drops the
triggers, rewrites a failed run as succeeded and recomputes every hash (and, to be thorough,
the anchor file too). Without the host's private key they cannot sign: `audit verify --key`
with the host's public key rejects the result."""
from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from amdflash.store import keys
from amdflash.store.chain import GENESIS, iter_canonical, load_checkpoints, run_genesis, segment_head
from amdflash.store.schema import PHYSICAL, PLAIN, add_triggers, drop_triggers
from tests.pipeline.engine.conftest import cli, db, image  # noqa: F401 - fixtures: in-process CLI with its own database


def forge(db: Path, run_id: str, attacker: Ed25519PrivateKey | None, anchor: Path | None = None) -> None:
    """Rewrite `run_id` as succeeded and recompute every chain head, checkpoint hash and the
    chain head; sign with `attacker` (whose public key replaces the host's) or keep the old
    signatures; rewrite the anchor file to match."""
    con = sqlite3.connect(db, isolation_level=None)
    con.execute("BEGIN")
    drop_triggers(con)
    con.execute("UPDATE run_status SET status = 'succeeded', detail = NULL WHERE run_id = ? AND status = 'failed'",
                [run_id])
    con.execute("UPDATE log_units SET state = 'verified' WHERE state = 'failed'")
    # Every run's heads, recomputed from its rows exactly as the writer computes them.
    checkpoints = load_checkpoints(con)
    runs = dict(con.execute("SELECT run_id, seq FROM runs").fetchall())
    for rid, key in runs.items():
        head, lo = run_genesis(rid), key
        for cp in [c for c in checkpoints if c.run_id == rid]:
            digests = {}
            for table in PHYSICAL:
                where, args = (("p.run_id = ? AND p.seq BETWEEN ? AND ?", (rid, lo, cp.last_seq)) if table in PLAIN
                               else ("p.run = ? AND p.seq BETWEEN ? AND ?", (key, lo, cp.last_seq)))
                text = "".join(t for _, _, t in iter_canonical(con, table, where, args))
                if text:
                    digests[table] = hashlib.sha256(text.encode()).digest()
            head = segment_head(head, digests)
            con.execute("UPDATE checkpoints SET head = ? WHERE id = ?", [head, cp.id])
            lo = cp.last_seq + 1
    if attacker is not None:
        public = keys.public_bytes(attacker)
        con.execute("UPDATE hosts SET public_key = ?", [public])
    prev, lines = GENESIS, []
    for cp in load_checkpoints(con):
        cp.hash = cp.digest(prev)
        if attacker is not None:
            cp.sig = attacker.sign(cp.hash)
        con.execute("UPDATE checkpoints SET hash = ?, sig = ? WHERE id = ?", [cp.hash, cp.sig, cp.id])
        lines.append(json.dumps({"checkpoint": cp.id, "hash": cp.hash.hex(), "sig": cp.sig.hex(),
                                 "key": keys.fingerprint(cp.public_key), "at": cp.at}))
        prev = cp.hash
    con.execute("UPDATE chain_head SET hash = ? WHERE id = 1", [prev])
    add_triggers(con)                  # the forger covers the tracks: the schema is amdflash's again
    con.execute("COMMIT")
    con.close()
    if anchor is not None:
        anchor.write_text("\n".join(lines) + "\n")


def test_a_recomputed_chain_is_rejected_by_the_host_key(cli, make_board, image, db, tmp_path, host_key, capsys):
    img = image.read_bytes()
    stuck = next(a for a in range(0x2000, 0x4000) if img[a] == 0x00)
    board = make_board(content="blank", transport="ideal", faults=[f"stuck-bit={stuck:#x}:7"])
    assert cli("flash", image, "--yes", "--force", "--sector-count", "4", "--board", f"sim:{board}").code == 1
    run_id = json.loads(cli("runs", "--format", "json").out)[-1]["run_id"]
    pub = tmp_path / "host.pub"
    assert cli("audit", "key", "-o", pub).code == 0
    assert cli("audit", "verify", "--key", pub).code == 0

    forge(db, run_id, Ed25519PrivateKey.generate(), anchor=Path(str(db) + ".anchor"))
    assert json.loads(cli("runs", "--format", "json").out)[-1]["status"] == "succeeded"   # the lie
    without_key = cli("audit", "verify")
    with_key = cli("audit", "verify", "--key", pub)
    report = cli("report", run_id, "--key", pub)
    with capsys.disabled():
        print("\n--- forged database: amdflash audit verify\n" + without_key.out +
              "--- forged database: amdflash audit verify --key host.pub\n" + with_key.out +
              "--- forged database: amdflash report RUN --key host.pub\n" + report.err)
    # Self-consistent, so without the key all that shows is a signer that is not this host...
    assert without_key.code == 0 and keys.fingerprint(keys.public_bytes(keys.load_private(host_key))) \
        not in without_key.out
    # ... and with the host's public key the forgery is rejected.
    assert with_key.code == 1 and "not a given --key" in with_key.out
    # ... and the report refuses to show it.
    assert report.code == 1 and not report.out and "does not verify" in report.err and "not a given --key" in report.err


def _flash_and_change(cli, make_board, image, db) -> str:  # noqa: ANN001
    """A good two-sector flash, then one recorded value changed behind the triggers' back."""
    board = make_board(content="blank", transport="ideal")
    assert cli("flash", image, "--yes", "--force", "--sector-count", "2", "--board", f"sim:{board}").code == 0
    con = sqlite3.connect(db)
    con.execute("DROP TRIGGER log_units_no_update")
    con.execute("UPDATE log_units SET detail = 'x' WHERE seq = (SELECT max(seq) FROM log_units)")
    con.execute("CREATE TRIGGER log_units_no_update BEFORE UPDATE ON log_units "
                "BEGIN SELECT RAISE(ABORT, 'audit rows are append-only (log_units)'); END")
    con.commit()
    con.close()
    return json.loads(cli("runs", "--format", "json").out)[-1]["run_id"]


def test_forged_signatures_fail_even_without_the_key(cli, make_board, image, db):
    forge(db, _flash_and_change(cli, make_board, image, db), None)   # hashes recomputed, old signatures kept
    r = cli("audit", "verify")
    assert r.code == 1 and "signature does not verify" in r.out


def test_a_resigned_database_with_its_anchor_left_alone_is_caught_by_the_anchor(cli, make_board, image, db):
    forge(db, _flash_and_change(cli, make_board, image, db), Ed25519PrivateKey.generate())
    r = cli("audit", "verify")
    assert r.code == 1 and "anchor" in r.out and "was rewritten" in r.out
