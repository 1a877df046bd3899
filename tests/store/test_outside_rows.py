"""Issue 18, attack 2: rows INSERTed outside every span a run's checkpoints seal — with a seq
below the run's first row (negative, or in an earlier run's span), or a second runs row —
needed no key and were read as the run's own by `audit verify --run` (intact), `report`, the
HTML page (a fake first error, a fake sign-off under "signature: verified against the given
key") and `resume` (a forged backups row pointing at an attacker's file, kept as "verified").

A run's rows are exactly those its sealed spans cover: each of these now refuses, exit 1,
naming the row (table and seq). The triggers refuse only UPDATE and DELETE, so every attack
here is a plain INSERT by someone who can write the database file but has no host key."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import sqlite3
from pathlib import Path

import pytest

from amdflash.stages.sim.synth import PART_KEY
from tests.pipeline.engine.conftest import cli, cli_shown, db, flash_content, image  # noqa: F401 - fixtures: in-process CLI, own database

FAKE_ERROR = "bench power lost, not a board defect"
FAKE_SIGN_OFF = "reviewed and signed off by QA: " + FAKE_ERROR


@pytest.fixture
def failed(cli, make_board, image, db, tmp_path):  # noqa: F811
    """A flash that failed (a stuck bit fails a unit's verify), the board's fault then cleared
    so it can be resumed; the host's public key kept apart. (run_id, board, public key file)."""
    img = image.read_bytes()
    stuck = next(a for a in range(0x2000, 0x4000) if img[a] == 0x00)
    board = make_board(content="blank", transport="ideal", faults=[f"stuck-bit={stuck:#x}:7"])
    assert cli("info", "--board", f"sim:{board}").code == 0          # a run before it
    assert cli("flash", image, "--yes", "--expect-part", PART_KEY, "--sector-count", "8",
               "--board", f"sim:{board}").code == 1
    assert cli("sim", "fault", board, "--clear").code == 0
    run_id = json.loads(cli("runs", "--format", "json").out)[-1]["run_id"]
    pub = tmp_path / "host.pub"
    assert cli("audit", "key", "-o", pub).code == 0
    assert cli("audit", "verify", "--run", run_id, "--key", pub).code == 0
    return run_id, board, pub


def _insert(db: Path, sql: str, *args: object) -> None:  # noqa: F811
    con = sqlite3.connect(db)
    con.execute(sql, args)
    con.commit()
    con.close()


def _key(db: Path, run_id: str) -> int:  # noqa: F811
    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT seq FROM runs WHERE run_id = ?", [run_id]).fetchone()[0]
    finally:
        con.close()


def _forge_a_resume(db: Path, forged: str, run_id: str, board: Path, at: str) -> None:  # noqa: F811
    """Rows INSERTed without the key: a `resume` run `forged` of `run_id` that succeeded on the
    same board (its unique ID and chip, as the real run recorded them)."""
    con = sqlite3.connect(db)
    uid, chip = con.execute("SELECT unique_id, chip FROM boards WHERE run_id = ? LIMIT 1", [run_id]).fetchone()
    con.close()
    _insert(db, "INSERT INTO runs (run_id, command, arguments, operator, host, board_spec, resumes_run_id, at) "
                "VALUES (?, 'resume', '{}', 'root', 'hosta', ?, ?, ?)", forged, f"sim:{board}", run_id, at)
    _insert(db, "INSERT INTO boards (run_id, spec, unique_id, chip, at) VALUES (?, ?, ?, ?, ?)",
            forged, f"sim:{board}", uid, chip, at)
    _insert(db, "INSERT INTO run_status (run_id, status, detail, summary, at) VALUES (?, 'succeeded', '', '{}', ?)",
            forged, at)


def _fake_first_error(db: Path, run_id: str, seq: int) -> None:  # noqa: F811
    _insert(db, "INSERT INTO errors (seq, run_id, stage, message, address, at) VALUES (?, ?, 'erase', ?, NULL, ?)",
            seq, run_id, FAKE_ERROR, "2026-01-01T00:00:00+00:00")


def _refused(r, table: str, seq: int) -> None:  # noqa: ANN001
    assert r.code == 1, (r.code, r.out, r.err)
    assert f"{table} seq {seq}:" in r.err + r.out, r.err + r.out
    assert FAKE_ERROR not in r.out


@pytest.mark.parametrize("where", ["negative", "in-an-earlier-run"])
def test_a_row_below_the_runs_first_row_is_named_by_verify_run_with_the_key(cli, make_board, failed, db, where):  # noqa: F811
    run_id, _, pub = failed
    # "in-an-earlier-run": a positive seq inside the span of the run before it (an info run).
    seq = -5 if where == "negative" else _key(db, run_id) - 1
    _fake_first_error(db, run_id, seq)
    r = cli("audit", "verify", "--run", run_id, "--key", pub)
    assert r.code == 1 and "BROKEN" in r.out and f"errors seq {seq}: a row of run {run_id} before its first row" \
        in r.out, r.out
    r = cli("audit", "verify", "--key", pub)             # the whole database's check names it too
    assert r.code == 1 and f"errors seq {seq}:" in r.out, r.out


@pytest.mark.parametrize("fmt", ["text", "json", "html"])
def test_report_refuses_a_run_with_a_fake_first_error(cli, failed, db, tmp_path, fmt):  # noqa: F811
    run_id, _, pub = failed
    _fake_first_error(db, run_id, -5)
    out = tmp_path / f"report.{fmt}"
    r = cli("report", run_id, "--format", fmt, "--key", pub, "-o", out)
    _refused(r, "errors", -5)
    assert not out.exists()
    # The check it prints names this database, wherever it is pasted (it dropped --db).
    assert f"(check it: amdflash --db {db} audit verify --run {run_id})" in r.err, r.err


def test_the_html_page_shows_no_fake_sign_off_under_a_verified_signature(cli, failed, db, tmp_path):  # noqa: F811
    """The issue's page: a fake first error and a fake sign-off, rendered under "signature:
    verified against the given key". Neither is rendered now: the page is refused."""
    run_id, _, pub = failed
    _fake_first_error(db, run_id, -5)
    _insert(db, "INSERT INTO stages (seq, run_id, stage, event, detail, at) VALUES (?, ?, 'sign-off', 'fail', ?, ?)",
            -4, run_id, FAKE_SIGN_OFF, "2026-01-01T00:00:01+00:00")
    out = tmp_path / "report.html"
    r = cli("report", run_id, "--format", "html", "--key", pub, "-o", out)
    _refused(r, "errors", -5)
    assert not out.exists()


def test_a_second_runs_row_is_named(cli, failed, db):  # noqa: F811
    """A runs row with the run's id at another seq (its operator, image, board claimed anew)."""
    run_id, _, pub = failed
    con = sqlite3.connect(db)
    row = list(con.execute("SELECT * FROM runs WHERE run_id = ?", [run_id]).fetchone())
    con.close()
    row[0], row[4] = -9, "attacker"      # seq, operator
    _insert(db, f"INSERT INTO runs VALUES ({', '.join('?' * len(row))})", *row)
    for argv in (("audit", "verify", "--run", run_id, "--key", pub), ("report", run_id, "--key", pub),
                 ("audit", "verify", "--key", pub)):
        r = cli(*argv)
        assert r.code == 1 and f"runs seq -9: a second runs row for run {run_id}" in r.out + r.err, (argv, r.out, r.err)
        assert "attacker" not in r.out


def test_resume_does_not_keep_a_forged_backup(cli_shown, failed, db, tmp_path):  # noqa: F811
    """A backups row pointing at the attacker's file, with its true SHA-256: the resume used
    to keep it as "the backup of the original content (kept, verified)"."""
    run_id, board, _ = failed
    evil = tmp_path / "evil.bin"
    evil.write_bytes(b"\x41" * 0x200000)
    sha = hashlib.sha256(evil.read_bytes()).hexdigest()
    _insert(db, "INSERT INTO backups (seq, run_id, sha256, size, path, at) VALUES (?, ?, ?, ?, ?, ?)",
            -3, run_id, sha, 0x200000, str(evil), "2026-01-01T00:00:00+00:00")
    r = cli_shown("resume", "--yes", "--board", f"sim:{board}")
    assert r.code == 1, (r.code, r.out, r.err)
    assert "backups seq -3:" in r.err and str(evil) not in r.out
    assert json.loads(cli_shown("runs", "--format", "json").out)[-1]["run_id"] == run_id   # no resume run began


def test_replay_refuses_a_run_with_an_outside_row(cli, failed, db):  # noqa: F811
    run_id, _, _ = failed
    _insert(db, "INSERT INTO log_verifies (seq, run, address, size, ok, attempt, expected_sha256, actual_sha256, "
                "mismatch_address, flash_byte, image_byte, clock) VALUES (-6, ?, 0, 4096, 1, 1, NULL, NULL, NULL, "
                "NULL, NULL, 0)", _key(db, run_id))
    r = cli("replay", run_id)
    assert r.code == 1 and "log_verifies seq -6:" in r.err, (r.code, r.out, r.err)


def test_a_bulk_row_outside_the_runs_span_is_never_read_by_its_views(cli, failed, db):  # noqa: F811
    """log_spi and log_writes have no per-run index: the views read a run's seq span, so a
    row of the run outside it is not read at all (the report's counts do not change); the
    whole database's check names it."""
    run_id, _, pub = failed
    before = json.loads(cli("report", run_id, "--json").out)
    _insert(db, "INSERT INTO log_writes (seq, run, offset, value, data, clock) VALUES (-8, ?, 0x5a3a0, 1, NULL, 0)",
            _key(db, run_id))
    after = json.loads(cli("report", run_id, "--json").out)
    assert after["register_writes"] == before["register_writes"]
    r = cli("audit", "verify", "--key", pub)
    assert r.code == 1 and "log_writes" in r.out and "outside what their runs sealed" in r.out


def test_an_unsealed_tail_is_still_shown_as_not_verified(cli, failed, db):  # noqa: F811
    """What stays legitimate: rows after the last checkpoint of a run that recorded no end (its
    host died with its writer) are shown, and said to be unverified. Made here by removing
    the run's final checkpoint, as a power loss before the seal would leave it."""
    from amdflash.store.schema import add_triggers, drop_triggers

    run_id, _, _ = failed
    con = sqlite3.connect(db)
    drop_triggers(con)
    last = con.execute("SELECT max(id) FROM checkpoints").fetchone()[0]
    final = con.execute("SELECT last_seq FROM checkpoints WHERE id = ?", [last]).fetchone()[0]
    end = con.execute("SELECT max(seq) FROM run_status WHERE run_id = ?", [run_id]).fetchone()[0]
    con.execute("DELETE FROM run_status WHERE seq = ?", [end])      # the end row, lost with its seal
    # The writer seals a run's rows just before its end, in the same transaction: a power loss
    # before that commit loses both seals, leaving the rows the previous commits wrote unsealed.
    con.execute("DELETE FROM checkpoints WHERE id >= ?", [last - 1])
    con.execute("UPDATE chain_head SET checkpoint = ?, hash = (SELECT hash FROM checkpoints WHERE id = ?)",
                [last - 2, last - 2])
    add_triggers(con)
    con.commit()
    con.close()
    assert final >= end
    r = cli("audit", "verify", "--run", run_id)
    assert r.code == 0 and "unsealed" in r.out, r.out
    rep = json.loads(cli("report", run_id, "--json").out)
    assert rep["chain"]["unsealed_rows"] > 0 and "not sealed" in rep["chain"]["signature"]


@pytest.mark.parametrize("forgery", ["unsealed", "fake checkpoint", "borrowed id"])
def test_a_run_the_key_did_not_seal_never_resumes_fixes_or_hides_another(cli, failed, db, image, forgery):  # noqa: F811
    """Rows INSERTed without the key claimed that a resume finished the failed flash: a `runs`
    row naming it as the run it resumes, with a `succeeded` status and the board's identity
    (unique ID, chip) — with no checkpoint, with a checkpoint row that is no signature, or with
    the id of a real sealed run (the `info` before it). Each made `runs` say "fixed by", and
    `info`, the new-flash guard and a bare `resume` take the flash as finished (an attack
    review). A run speaks only through its own sealed, verified rows."""
    run_id, board, pub = failed
    at = "2099-12-31T23:59:59+00:00"
    con = sqlite3.connect(db)
    earlier = con.execute("SELECT run_id FROM runs WHERE command = 'info' ORDER BY seq LIMIT 1").fetchone()[0]
    con.close()
    forged = earlier if forgery == "borrowed id" else "20991231T235959-0badc0de"
    _forge_a_resume(db, forged, run_id, board, at)
    if forgery == "fake checkpoint":
        _insert(db, "INSERT INTO checkpoints (kind, run, run_id, rows, last_seq, host, at, hash, sig) "
                    "VALUES ('commit', (SELECT max(seq) FROM runs), ?, 3, (SELECT max(seq) FROM run_status), 1, ?, "
                    "x'00', x'00')", forged, at)
    shown = cli("report", run_id, "--format", "json")
    assert shown.code == 0, shown.err
    report = json.loads(shown.out)
    assert report["status"] == "failed" and report.get("finished_by") is None, report
    assert not any(r["verified"] for r in report["resumed_by"]), report["resumed_by"]
    listed = [r for r in json.loads(cli("runs", "--format", "json").out) if r["run_id"] == run_id]
    assert [(r["status"], r.get("fixed_by")) for r in listed] == [("failed", None)], listed
    if forgery == "fake checkpoint":
        return      # the writer appends to no chain another wrote into: this trail takes no run any more
    # The board is never taken as finished: the flash is named unfinished, or the run that
    # claims to have written since is named as one whose record does not verify.
    info = cli("info", "--board", f"sim:{board}")
    named = re.search(r"unfinished flash (\S+) on this board \(([^)]*)", info.out)
    assert info.code == 0 and named, info.out
    assert named[1] == run_id or "its record does not verify" in named[2], named[0]
    if named[1] != run_id:      # the check it prints, pasted as printed: names what does not match
        check = shlex.split(named[2].split("its record does not verify: ", 1)[1].split("; ", 1)[0])
        assert check[:5] == ["amdflash", "--db", os.environ["AMDFLASH_DB"], "audit", "verify"], check   # as run
        checked = cli(*check[1:])
        assert checked.code == 1 and named[1] in checked.out + checked.err, (checked.out, checked.err)
    again = cli("flash", image, "--yes", "--expect-part", PART_KEY, "--sector-count", "8", "--board", f"sim:{board}")
    assert again.code == 2 and "never finished" in again.err and "--start-over" in again.err, again.err
    resumed = cli("resume", "--board", f"sim:{board}", "--yes")            # never the forged run's
    if resumed.code == 0:
        assert json.loads(cli("runs", "--format", "json").out)[-1]["resumes_run_id"] == run_id
    else:      # refused, saying why: a run on record as writing since, or a record that does not verify
        assert resumed.code in (1, 2) and resumed.err.startswith("error: "), resumed.err
    named = cli("resume", run_id, "--board", f"sim:{board}", "--yes")        # the failed run, by name
    for said in (resumed, named):
        if said.code and forged in said.err:      # never said to have written: named as not verifying
            assert "does not verify" in said.err and "wrote this board" not in said.err, said.err


def test_runs_lists_a_row_of_any_type_instead_of_crashing(cli, make_board, db):  # noqa: F811
    """`runs` formatted each recorded value to a width, so a runs row INSERTed with a BLOB run
    id, a number or NULLs (no key needed) made every listing an internal error, and `--since`
    one with an unreadable start time (seen, left alone in an earlier session): the listing is
    where one looks first, so it shows such a row as what it holds."""
    board = make_board()
    assert cli("info", "--board", f"sim:{board}").code == 0
    _insert(db, "INSERT INTO runs (run_id, command, board_spec, at) VALUES (?, 'resume', NULL, ?)",
            b"<i>forged</i>", "2026-01-01T00:00:01+00:00")
    _insert(db, "INSERT INTO runs (run_id, command, board_spec, at) VALUES (7, x'00', x'41', 'not a time')")
    _insert(db, "INSERT INTO runs (run_id, command, at) VALUES (NULL, NULL, NULL)")
    forged_line = "20260101T000000-0badc0de flash     failed (fixed by 20260101T000001-0badc0de)"
    _insert(db, "INSERT INTO runs (run_id, command, at) VALUES (?, 'flash', ?)", f"x\n{forged_line}",
            "2026-01-01T00:00:02+00:00")
    listed = cli("runs")
    assert listed.code == 0, listed.err
    lines = listed.out.splitlines()
    assert len(lines) == 5 and lines[0].split()[1:3] == ["info", "succeeded"], lines   # one line per run
    assert lines[1].startswith("b'<i>forged</i>'") and lines[2].split()[:2] == ["7", r"b'\x00'"], lines
    assert lines[3].split()[:2] == ["-", "-"], lines
    assert lines[4].startswith(r"x\x0a20260101T000000-0badc0de"), lines
    since = cli("runs", "--since", "2000-01-01")      # a row with no readable start is not "since"
    assert since.code == 0 and len(since.out.splitlines()) == 3, since.out + since.err
    assert cli("runs", "--command", "resume").code == 0
    assert len(json.loads(cli("runs", "--format", "json").out)) == 5


@pytest.mark.parametrize("forgery", ["blob id", "no end", "refused end on a real flash"])
def test_a_resume_is_refused_in_true_words_by_a_later_run_that_vouches_for_nothing(
        cli, failed, db, image, forgery):  # noqa: F811
    """A later run on record as writing the board stops a resume (it may have written); what is
    said of it must be what the trail shows (an attack review): a BLOB run id crashed the
    refusal, a run no checkpoint seals was said not to verify while its check passed, and a
    `refused` end INSERTed for a real flash hid it from the check (the resume then failed
    later, recorded as a failed run)."""
    run_id, board, _ = failed
    con = sqlite3.connect(db)
    uid, chip = con.execute("SELECT unique_id, chip FROM boards WHERE run_id = ? LIMIT 1", [run_id]).fetchone()
    con.close()
    at = "2099-12-31T23:59:59+00:00"
    if forgery == "refused end on a real flash":
        assert cli("flash", image, "--yes", "--expect-part", PART_KEY, "--sector-count", "8", "--start-over",
                   "--board", f"sim:{board}").code == 0
        later = json.loads(cli("runs", "--format", "json").out)[-1]["run_id"]
        _insert(db, "INSERT INTO run_status (run_id, status, detail, summary, at) VALUES (?, 'refused', '', '{}', ?)",
                later, at)
    else:
        later = b"\x1b[2Jblob" if forgery == "blob id" else "20991231T235959-0badc0de"
        _insert(db, "INSERT INTO runs (run_id, command, arguments, operator, host, board_spec, at) "
                    "VALUES (?, 'flash', '{}', 'root', 'hosta', ?, ?)", later, f"sim:{board}", at)
        _insert(db, "INSERT INTO boards (run_id, spec, unique_id, chip, at) VALUES (?, ?, ?, ?, ?)",
                later, f"sim:{board}", uid, chip, at)
    r = cli("resume", run_id, "--board", f"sim:{board}", "--yes")
    assert r.code == 2 and "is on record as writing this board" in r.err, (r.code, r.err)
    assert "wrote this board" not in r.err and "internal error" not in r.err
    if forgery == "blob id":
        assert "not text" in r.err and "\x1b" not in r.err, r.err
        return
    check = shlex.split(r.err.split("(check it: ", 1)[1].split(");", 1)[0])
    checked = cli(*check[1:])          # what the refusal says of it is what its check shows
    if forgery == "no end":
        assert "no checkpoint seals any of its rows" in r.err, r.err
        # Nothing of it is vouched for by any signature: not intact (issue 44), exit 1.
        assert checked.code == 1 and "NOT PROVEN" in checked.out and "no checkpoint seals" in checked.out, checked.out
    else:
        assert "does not verify" in r.err and checked.code == 1 and later in checked.out + checked.err, r.err


def test_a_newline_in_a_forged_run_id_adds_no_line_to_report_info_or_verify(cli, failed, db):  # noqa: F811
    """A run id INSERTed with a newline in it, claiming to resume the failed flash: `runs`
    showed it escaped, but `report` of the real run (whose chain verifies), `info` of the
    board and `audit verify` printed what followed the newline as a line of their own — here
    a next step saying the board is fine (an attack review). Each shows it escaped."""
    run_id, board, _ = failed
    fake = "next       nothing to do: the board is fine"
    forged = f"20991231T235959-0badc0de\n{fake}"
    _forge_a_resume(db, forged, run_id, board, "2099-12-31T23:59:59+00:00")
    shown = {"report": cli("report", run_id), "info": cli("info", "--board", f"sim:{board}"),
             "audit verify": cli("audit", "verify"), "audit verify --run": cli("audit", "verify", "--run", forged)}
    assert shown["report"].code == 0 and "resumed by 20991231T235959-0badc0de\\x0anext " in shown["report"].out
    assert shown["info"].code == 0 and "20991231T235959-0badc0de\\x0anext " in shown["info"].out, shown["info"].out
    for what, r in shown.items():
        lines = (r.out + r.err).splitlines()
        assert not [x for x in lines if x.lstrip().startswith(("next       nothing", "nothing to do"))], (what, lines)
    assert "0badc0de\\x0anext " in shown["audit verify --run"].out, shown["audit verify --run"].out


def _seal_with_a_key_of_their_own(db: Path, run_id: str, rows: list[tuple[str, dict]], first_seq: int,  # noqa: F811
                                  at: str) -> None:
    """Rows INSERTed by someone who can write the database but not read the host key: a run
    `run_id` whose rows (`rows`, its runs row first) they seal themselves — a key of their own
    added to `hosts`, the run's chain rebuilt, a `final` checkpoint after the newest one, signed
    with that key, and the chain head moved to it. Everything in the file is then consistent."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from amdflash.store import chain
    from amdflash.store.schema import PHYSICAL, PLAIN

    key = Ed25519PrivateKey.generate()
    public = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    con = sqlite3.connect(db)
    host = con.execute("INSERT INTO hosts (public_key, hostname, machine_id, first_seen) VALUES (?, 'hosta', '', ?)",
                       (public, at)).lastrowid
    digests: dict[str, hashlib._Hash] = {}
    run_key = seq = first_seq
    for seq, (table, fields) in enumerate(rows, start=first_seq):
        columns = [c for c, _ in PHYSICAL[table]]
        values = [fields.get(c) if table in PLAIN or c != "run" else run_key for c in columns]
        con.execute(f"INSERT INTO {table} (seq, {', '.join(columns)}) VALUES (?{', ?' * len(columns)})", [seq, *values])
        digests.setdefault(table, hashlib.sha256()).update(chain.canonical(table, seq, values))
    head = chain.segment_head(chain.run_genesis(run_id), {t: h.digest() for t, h in digests.items()})
    newest, previous = con.execute("SELECT checkpoint, hash FROM chain_head WHERE id = 1").fetchone()
    cp = chain.Checkpoint(newest + 1, "final", run_id, len(rows), seq, head, public, at, None)
    cp.hash = cp.digest(previous)
    con.execute("INSERT INTO checkpoints (id, kind, run, run_id, rows, last_seq, head, host, at, detail, hash, sig) "
                "VALUES (?, 'final', ?, ?, ?, ?, ?, ?, ?, NULL, ?, ?)",
                (cp.id, run_key, run_id, len(rows), seq, head, host, at, cp.hash, key.sign(cp.hash)))
    con.execute("UPDATE chain_head SET seq = max(seq, ?), checkpoint = ?, hash = ? WHERE id = 1", (seq, cp.id, cp.hash))
    con.commit()
    con.close()


def _recorded(db: Path, table: str, run_id: str) -> dict:  # noqa: F811
    con = sqlite3.connect(db)
    try:
        cursor = con.execute(f"SELECT * FROM {table} WHERE run_id = ? ORDER BY seq LIMIT 1", [run_id])
        return {k[0]: v for k, v in zip(cursor.description, cursor.fetchone()) if k[0] != "seq"}
    finally:
        con.close()


def test_a_run_sealed_with_a_key_added_to_the_database_is_not_acted_on(cli, failed, db, image):  # noqa: F811
    """Someone who can write the database added an Ed25519 key of their own to `hosts` and
    sealed, with it, a resume of the failed flash that "succeeded": every signature in the file
    then verified, and `info` no longer named the unfinished flash, a bare `resume` had nothing
    to resume and `resume RUN` said the flash was already completed — over a half-written board
    (an attack review). A board command trusts only this host's own key."""
    run_id, board, pub = failed
    at = "2099-12-31T23:59:59+00:00"
    forged = "20991231T235959-5ea1ed00"
    con = sqlite3.connect(db)
    after = con.execute("SELECT seq FROM chain_head").fetchone()[0] + 1
    con.close()
    started = _recorded(db, "runs", run_id)
    _seal_with_a_key_of_their_own(db, forged, [
        ("runs", {**started, "run_id": forged, "command": "resume", "resumes_run_id": run_id, "at": at}),
        ("boards", {**_recorded(db, "boards", run_id), "run_id": forged, "at": at}),
        ("run_status", {"run_id": forged, "status": "running", "at": at}),
        ("run_status", {"run_id": forged, "status": "succeeded", "summary": "{}", "at": at})], after, at)
    assert cli("audit", "verify", "--run", forged).code == 0                 # consistent: not who signed it
    assert cli("audit", "verify", "--run", forged, "--key", pub).code == 1    # the host's key says so
    info = cli("info", "--board", f"sim:{board}")        # the flash unfinished, or the claim not verified
    named = re.search(r"unfinished flash (\S+) on this board \(([^)]*)", info.out)
    assert info.code == 0 and named, info.out
    assert named[1] == run_id or (named[1] == forged and "its record does not verify" in named[2]), named[0]
    again = cli("flash", image, "--yes", "--expect-part", PART_KEY, "--sector-count", "8", "--board", f"sim:{board}")
    assert again.code == 2 and "never finished" in again.err, again.err
    for resumed in (cli("resume", "--board", f"sim:{board}", "--yes"), cli("resume", run_id, "--board",
                                                                          f"sim:{board}", "--yes")):
        if resumed.code == 0:       # the failed flash, finished
            assert json.loads(cli("runs", "--format", "json").out)[-1]["resumes_run_id"] == run_id
            assert cli("verify", image, "--sector-count", "8", "--board", f"sim:{board}").code == 0
        else:                       # or refused, naming the claim as signed by a key not this host's
            assert resumed.code in (1, 2) and "already completed" not in resumed.err, resumed.err
            assert forged in resumed.err and "does not verify" in resumed.err, resumed.err
            assert "not by this host's key" in resumed.err, resumed.err


def test_a_backup_sealed_with_a_key_added_to_the_database_is_never_the_original(cli, failed, db, tmp_path):  # noqa: F811
    """The same attacker sealed, with their own key, a flash run of the board older than any
    real one (seq below the first), whose backup row names a file of zeros of theirs: it
    became "the original", and `restore-original` wrote it onto the board and exited 0 (an
    attack review). It is not acted on: the board gets back only what this host backed up."""
    run_id, board, pub = failed
    before = flash_content(board)
    evil = tmp_path / "theirs.bin"
    evil.write_bytes(bytes(len(before)))
    at = "2000-01-01T00:00:00+00:00"
    forged = "20000101T000000-0f1e1a1d"
    _seal_with_a_key_of_their_own(db, forged, [
        ("runs", {**_recorded(db, "runs", run_id), "run_id": forged, "at": at}),
        ("boards", {**_recorded(db, "boards", run_id), "run_id": forged, "at": at}),
        ("run_status", {"run_id": forged, "status": "running", "at": at}),
        ("backups", {"run_id": forged, "sha256": hashlib.sha256(evil.read_bytes()).hexdigest(),
                     "size": len(before), "path": str(evil), "at": at}),
        ("run_status", {"run_id": forged, "status": "succeeded", "summary": "{}", "at": at})], -100, at)
    assert cli("audit", "verify", "--run", forged).code == 0
    info = cli("info", "--board", f"sim:{board}")
    assert info.code == 0 and str(evil) not in info.out, info.out
    restored = cli("restore-original", "--board", f"sim:{board}", "--yes")
    assert str(evil) not in restored.out + restored.err, restored.out + restored.err
    assert flash_content(board) != bytes(len(before))
