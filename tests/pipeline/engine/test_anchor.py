"""Issue 18, attack 3: the anchor file was the only thing that remembered a trail's tail, and
it sits beside the database. Deleting it (or emptying it) together with cutting the
database's tail verified intact, exit 0, "no anchor file (nothing to compare)".

Now the database itself remembers that it is anchored: the newest checkpoint of every seal
records, signed, the anchor it is appended to. Once anchored, a missing anchor, or one
shorter than the trail (by more than the newest seal, which may still be on its way), is
BROKEN. What stays out of reach of any local check — someone who owns both files cutting
both to match — is said in the README's audit section."""
from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

from amdflash.store.schema import PHYSICAL, add_triggers, drop_triggers


@pytest.fixture
def anchored_trail(cli, make_board, db) -> Path:  # noqa: ANN001
    board = make_board(content="blank", transport="ideal")
    for _ in range(4):
        assert cli("info", "--board", f"sim:{board}").code == 0
    r = cli("audit", "verify")
    assert r.code == 0 and "all in the database unchanged" in r.out, r.out
    return db


def _anchor(db: Path) -> Path:
    return Path(str(db) + ".anchor")


def _cut_after_run(db: Path, keep: int) -> None:
    """Remove every run after the first `keep` with everything they sealed, and make the chain
    head agree: the database as it was before them (a rollback)."""
    con = sqlite3.connect(db)
    drop_triggers(con)
    first_gone = con.execute("SELECT seq FROM runs ORDER BY seq LIMIT 1 OFFSET ?", [keep]).fetchone()[0]
    for table in PHYSICAL:
        con.execute(f"DELETE FROM {table} WHERE seq >= ?", [first_gone])
    con.execute("DELETE FROM checkpoints WHERE last_seq >= ?", [first_gone])
    con.execute("UPDATE chain_head SET seq = ?, checkpoint = (SELECT max(id) FROM checkpoints), "
                "hash = (SELECT hash FROM checkpoints ORDER BY id DESC LIMIT 1)", [first_gone - 1])
    add_triggers(con)
    con.commit()
    con.close()


def test_every_seals_newest_checkpoint_records_the_anchor(anchored_trail):
    con = sqlite3.connect(anchored_trail)
    details = [d for (d,) in con.execute("SELECT detail FROM checkpoints ORDER BY id")]
    con.close()
    anchored = [json.loads(d)["anchor"] for d in details if d]
    assert anchored and set(anchored) == {os.path.abspath(_anchor(anchored_trail))}
    lines = [json.loads(x)["checkpoint"] for x in _anchor(anchored_trail).read_text().splitlines()]
    assert len(anchored) == len(lines)          # one recorded per entry appended


def test_a_deleted_anchor_and_a_cut_tail_are_broken(cli, anchored_trail):
    """The issue's attack, exactly: the last run cut from the database, the anchor deleted."""
    _cut_after_run(anchored_trail, 3)
    _anchor(anchored_trail).unlink()
    r = cli("audit", "verify")
    assert r.code == 1 and "no anchor file at" in r.out and "but the trail is anchored" in r.out, r.out


def test_a_deleted_anchor_alone_is_broken(cli, anchored_trail):
    _anchor(anchored_trail).unlink()
    r = cli("audit", "verify")
    assert r.code == 1 and "the trail is anchored" in r.out, r.out


@pytest.mark.parametrize("kept_lines", [0, 1])
def test_a_trimmed_anchor_and_a_cut_tail_are_broken(cli, anchored_trail, kept_lines):
    """The anchor emptied (or cut to its first entry) and the database's last run cut: the
    anchor no longer reaches the trail's newest seals."""
    _cut_after_run(anchored_trail, 3)
    anchor = _anchor(anchored_trail)
    anchor.write_text("".join(anchor.read_text().splitlines(keepends=True)[:kept_lines]))
    r = cli("audit", "verify")
    assert r.code == 1 and "is shorter than the trail" in r.out, r.out


@pytest.mark.parametrize("cut, broken", [(2, True), (1, False)], ids=["two-seals", "only-the-newest"])
def test_an_anchor_trimmed_alone(cli, anchored_trail, cut, broken):
    """Two seals cut from the anchor's end: BROKEN. Only the newest: not a break — a writer
    appends a seal's entry just after committing it, so killed in between, or still on its
    way while a reader looks, the anchor lacks exactly that one."""
    anchor = _anchor(anchored_trail)
    lines = anchor.read_text().splitlines(keepends=True)
    anchor.write_text("".join(lines[:-cut]))
    r = cli("audit", "verify")
    if broken:
        assert r.code == 1 and "is shorter than the trail" in r.out, r.out
    else:
        assert r.code == 0 and "intact" in r.out, r.out


def test_an_anchor_whose_entry_differs_is_broken(cli, anchored_trail):
    anchor = _anchor(anchored_trail)
    lines = anchor.read_text().splitlines()
    entry = json.loads(lines[1])
    entry["hash"] = "00" * 32
    lines[1] = json.dumps(entry)
    anchor.write_text("\n".join(lines) + "\n")
    r = cli("audit", "verify")
    assert r.code == 1 and "differs from the one witnessed" in r.out, r.out


def test_the_witness_seam_compares_any_witness_with_the_local_checkpoints(anchored_trail):
    """store.verify.local_checkpoints and compare_witness: what `audit verify --central` is to
    use with what the central record holds for this host. Shown here with the anchor's entries
    as the witness: a rolled-back database is named, an intact one is not."""
    from amdflash.store.chain import Broken
    from amdflash.store.schema import connect
    from amdflash.store.verify import Witnessed, compare_witness, local_checkpoints

    seen = [Witnessed(f"witness entry {n}", e["checkpoint"], bytes.fromhex(e["hash"]), e["at"])
            for n, e in enumerate(map(json.loads, _anchor(anchored_trail).read_text().splitlines()), 1)]

    def compare() -> int:
        conn = connect(str(anchored_trail), readonly=True)
        try:
            through, checkpoints = local_checkpoints(conn)
        finally:
            conn.close()
        return compare_witness(seen, checkpoints, through)

    assert compare() == seen[-1].id
    _cut_after_run(anchored_trail, 3)
    with pytest.raises(Broken, match=r"witness entry \d+ names checkpoint #\d+ .* does not have"):
        compare()
