"""The central record's mirror of each host's transparency log (central schema version 5):
its signed tree heads, the witnesses' cosignatures of them, and its runs' receipts.

* DDL (version_5_sql): tables `tlog_heads` (size, root, the signed note), `tlog_cosignatures`
  (a witness's line per head) and `tlog_receipts` (a run's DSSE envelope and its leaf index),
  insert-only, written only by the login bound to the host, with `own_*` views. The database
  checks every new tree head itself: its note says its size and root; a head of a size it
  holds must be the same tree; a smaller one after a larger is refused; a larger one must
  carry an RFC 9162 consistency proof from the largest it holds, checked by `consistent`
  below (the same function, run by PL/Python) — a host log rolled back or forked is refused.
* what a host sends (send): the heads, cosignatures and receipts the database lacks.
* what `audit verify --central` checks (check_local): the central's newest head against this
  host's own log.
* what the readers show (witness_states): a run's receipt witnessed by k of n.

No import of store.central.schema (it imports this): the schema's name is passed in."""
from __future__ import annotations

import base64
import inspect
import json
import os
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from amdflash.store.tlog import HASH, Log, LogError

DASH = "\u2014"


def consistent(first: int, second: int, first_hash: bytes, second_hash: bytes, proof: list[bytes]) -> bool:
    """RFC 9162 §2.1.4.2: does `proof` show the tree of `first` leaves (root `first_hash`) is a
    prefix of the tree of `second` leaves (root `second_hash`)? (Self-contained: the database
    runs this very text in PL/Python.)"""
    import hashlib

    def node(left: bytes, right: bytes) -> bytes:
        return hashlib.sha256(b"\x01" + left + right).digest()

    if first > second or first < 0:
        return False
    if first == second:
        return not proof and first_hash == second_hash
    if first == 0:
        return not proof
    if not proof:
        return False
    path = list(proof)
    if first & (first - 1) == 0:          # a power of two: the old root is the first node
        path = [first_hash, *path]
    fn, sn = first - 1, second - 1
    while fn & 1:
        fn, sn = fn >> 1, sn >> 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr, sr = node(c, fr), node(c, sr)
            while not fn & 1 and fn != 0:
                fn, sn = fn >> 1, sn >> 1
        else:
            sr = node(sr, c)
        fn, sn = fn >> 1, sn >> 1
    return fr == first_hash and sr == second_hash and sn == 0


def _plpython_consistent() -> str:
    source = textwrap.dedent(inspect.getsource(consistent))
    return (f"{source}\nreturn consistent(first, second, first_hash, second_hash, "
            f"[proof[i:i + {HASH}] for i in range(0, len(proof), {HASH})])")


TABLES = ("tlog_heads", "tlog_cosignatures", "tlog_receipts")


def version_5_sql(ns: str, definer: str, push_role: str, read_role: str) -> str:
    """The mirror's tables, checks, views and grants: at setup, or by the upgrade of an older
    database (idempotent: whatever part a database already has is made again or kept)."""
    no_change = "\n".join(
        f"DROP TRIGGER IF EXISTS {t}_insert_only ON {ns}.{t};\n"
        f"DROP TRIGGER IF EXISTS {t}_no_truncate ON {ns}.{t};\n"
        f"CREATE TRIGGER {t}_insert_only BEFORE UPDATE OR DELETE ON {ns}.{t} FOR EACH ROW "
        f"EXECUTE FUNCTION {ns}.refuse_change();\n"
        f"CREATE TRIGGER {t}_no_truncate BEFORE TRUNCATE ON {ns}.{t} FOR EACH STATEMENT "
        f"EXECUTE FUNCTION {ns}.refuse_change();" for t in TABLES)
    mine = f"= ANY ((SELECT {ns}.readable_hosts())::integer[])"
    views = "\n".join(f"CREATE OR REPLACE VIEW {ns}.own_{t} WITH (security_barrier) AS SELECT * FROM {ns}.{t} "
                      f"WHERE host_id {mine};" for t in TABLES)
    tables = ", ".join(f"{ns}.{t}" for t in TABLES)
    own = ", ".join(f"{ns}.own_{t}" for t in TABLES)
    return f"""
CREATE TABLE IF NOT EXISTS {ns}.tlog_heads (
    host_id integer NOT NULL REFERENCES {ns}.hosts, size bigint NOT NULL CHECK (size >= 0),
    root bytea NOT NULL CHECK (length(root) = {HASH}), note text NOT NULL CHECK (length(note) <= 65536),
    proof bytea CHECK (length(proof) % {HASH} = 0 AND length(proof) <= 64 * {HASH}),
    witnesses integer CHECK (witnesses BETWEEN 0 AND 1000),  -- the host's configured witnesses (its word)
    pushed_at timestamptz NOT NULL DEFAULT now(), pushed_by text NOT NULL,
    PRIMARY KEY (host_id, size));
CREATE TABLE IF NOT EXISTS {ns}.tlog_cosignatures (
    host_id integer NOT NULL, size bigint NOT NULL, witness text NOT NULL
        CHECK (length(witness) <= 300 AND witness ~ '\\A[^\\s+]+\\Z'),
    line text NOT NULL CHECK (length(line) <= 1000),
    pushed_at timestamptz NOT NULL DEFAULT now(), pushed_by text NOT NULL,
    PRIMARY KEY (host_id, size, witness), FOREIGN KEY (host_id, size) REFERENCES {ns}.tlog_heads);
CREATE TABLE IF NOT EXISTS {ns}.tlog_receipts (
    host_id integer NOT NULL REFERENCES {ns}.hosts, run_id text NOT NULL CHECK (length(run_id) <= 100),
    leaf_index bigint NOT NULL CHECK (leaf_index >= 0), envelope bytea NOT NULL CHECK (length(envelope) <= 1048576),
    sha256 bytea NOT NULL, pushed_at timestamptz NOT NULL DEFAULT now(), pushed_by text NOT NULL,
    PRIMARY KEY (host_id, run_id), UNIQUE (host_id, leaf_index));
CREATE INDEX IF NOT EXISTS tlog_cosignatures_by_size ON {ns}.tlog_cosignatures (host_id, size);

CREATE OR REPLACE FUNCTION {ns}.tlog_consistent(first bigint, second bigint, first_hash bytea, second_hash bytea,
                                                proof bytea)
RETURNS boolean LANGUAGE plpython3u IMMUTABLE STRICT AS $fn$
{_plpython_consistent()}
$fn$;

-- A tree head: of a host this login pushes for; its note says its size and root; the tree the
-- central record holds at that size, or one its largest head is a prefix of (the proof).
CREATE OR REPLACE FUNCTION {ns}.check_tlog_head() RETURNS trigger LANGUAGE plpgsql {definer} AS $fn$
DECLARE prev record; same record; who text;
BEGIN
    who := format('tree head of %s leaves of host %s', NEW.size, {ns}.host_name(NEW.host_id));
    IF NOT {ns}.may_push(NEW.host_id) THEN
        RAISE EXCEPTION 'refused: %: %', who, {ns}.refused_login(NEW.host_id) USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF split_part(NEW.note, E'\\n', 2) IS DISTINCT FROM NEW.size::text
       OR decode(split_part(NEW.note, E'\\n', 3), 'base64') IS DISTINCT FROM NEW.root THEN
        RAISE EXCEPTION 'refused: %: its note does not say that size and root', who
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    SELECT size, root, note, pushed_at INTO same FROM {ns}.tlog_heads WHERE host_id = NEW.host_id AND size = NEW.size;
    IF FOUND THEN
        IF same.root = NEW.root THEN RETURN NULL; END IF;       -- held already: nothing new
        RAISE EXCEPTION 'refused: %: root % differs from root % the central record holds for that size (pushed %): '
                        'the host''s transparency log forked, or was rolled back and re-grown', who,
            encode(NEW.root, 'hex'), encode(same.root, 'hex'), same.pushed_at
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    SELECT size, root, pushed_at INTO prev FROM {ns}.tlog_heads WHERE host_id = NEW.host_id
     ORDER BY size DESC LIMIT 1;
    IF FOUND AND prev.size > NEW.size THEN
        RAISE EXCEPTION 'refused: %: the central record already holds a larger tree of this host''s log (% leaves, '
                        'root %, pushed %): the log was rolled back', who, prev.size, encode(prev.root, 'hex'),
            prev.pushed_at USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF FOUND AND NOT {ns}.tlog_consistent(prev.size, NEW.size, prev.root, NEW.root, coalesce(NEW.proof, ''::bytea)) THEN
        RAISE EXCEPTION 'refused: %: root % is not consistent with the % leaves the central record holds (root %, '
                        'pushed %): the host''s transparency log forked, or was rolled back and re-grown', who,
            encode(NEW.root, 'hex'), prev.size, encode(prev.root, 'hex'), prev.pushed_at
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    NEW.pushed_at := now();
    NEW.pushed_by := session_user;
    RETURN NEW;
END $fn$;
DROP TRIGGER IF EXISTS tlog_heads_checked ON {ns}.tlog_heads;
CREATE TRIGGER tlog_heads_checked BEFORE INSERT ON {ns}.tlog_heads FOR EACH ROW EXECUTE FUNCTION {ns}.check_tlog_head();

-- A cosignature or a receipt: of a host this login pushes for, its line naming its witness,
-- the receipt's bytes hashing to its SHA-256.
CREATE OR REPLACE FUNCTION {ns}.check_tlog_part() RETURNS trigger LANGUAGE plpgsql {definer} AS $fn$
BEGIN
    IF NOT {ns}.may_push(NEW.host_id) THEN
        RAISE EXCEPTION 'refused: % of host %: %', TG_TABLE_NAME, {ns}.host_name(NEW.host_id),
            {ns}.refused_login(NEW.host_id) USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF TG_TABLE_NAME = 'tlog_cosignatures' THEN
        IF left(NEW.line, length(NEW.witness) + 3) IS DISTINCT FROM E'\\u2014 ' || NEW.witness || ' ' THEN
            RAISE EXCEPTION 'refused: a cosignature of host %''s tree head of % leaves: its line is not witness %''s',
                {ns}.host_name(NEW.host_id), NEW.size, NEW.witness USING ERRCODE = 'integrity_constraint_violation';
        END IF;
    ELSIF sha256(NEW.envelope) IS DISTINCT FROM NEW.sha256 THEN
        RAISE EXCEPTION 'refused: receipt of run % of host %: its bytes do not hash to its SHA-256', NEW.run_id,
            {ns}.host_name(NEW.host_id) USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    NEW.pushed_at := now();
    NEW.pushed_by := session_user;
    RETURN NEW;
END $fn$;
DROP TRIGGER IF EXISTS tlog_cosignatures_checked ON {ns}.tlog_cosignatures;
CREATE TRIGGER tlog_cosignatures_checked BEFORE INSERT ON {ns}.tlog_cosignatures FOR EACH ROW
    EXECUTE FUNCTION {ns}.check_tlog_part();
DROP TRIGGER IF EXISTS tlog_receipts_checked ON {ns}.tlog_receipts;
CREATE TRIGGER tlog_receipts_checked BEFORE INSERT ON {ns}.tlog_receipts FOR EACH ROW
    EXECUTE FUNCTION {ns}.check_tlog_part();
{no_change}
{views}
REVOKE ALL ON {tables}, {own} FROM PUBLIC;
GRANT SELECT ON {own} TO {push_role}, {read_role};
GRANT SELECT ON {tables} TO {read_role};
GRANT INSERT ON {tables} TO {push_role};
"""


# -- what a host sends ---------------------------------------------------------------------------

@dataclass
class LogPush:
    heads: int = 0
    cosignatures: int = 0
    receipts: int = 0
    size: int = 0              # the largest tree head the central record now holds of this host's log

    def describe(self) -> str:
        if not (self.heads or self.cosignatures or self.receipts):
            return (f"central database already holds this host's transparency log through its tree head of "
                    f"{self.size} leaves, with its cosignatures and receipts: nothing to push")
        return (f"pushed this host's transparency log: {self.heads} tree head(s), {self.cosignatures} "
                f"cosignature(s), {self.receipts} receipt(s); the central record holds its tree head of "
                f"{self.size} leaves")


def local_heads(directory: Path) -> list[dict[str, Any]]:
    """Every signed tree head of the log, in order ({size, root, note}); a torn last line is none."""
    try:
        raw = (Path(directory) / "heads").read_bytes()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in raw.split(b"\n")[:-1]]


def _cosignature_lines(db: str, head: dict[str, Any]) -> dict[str, str]:
    """{witness: its cosignature line} of the head of that size kept beside the anchor (the
    log's own signature, which the head's note carries, left out)."""
    from amdflash.store import witness

    kept = witness.stored(db, int(head["size"]))
    if kept is None or kept.body != head["note"].split("\n\n", 1)[0] + "\n":
        return {}
    own = set(head["note"].split("\n\n", 1)[1].splitlines())
    return {line.split(" ")[1]: line for line in kept.signatures if line not in own and line.startswith(DASH + " ")}


def _kept_sizes(db: str) -> set[int]:
    """The sizes of the tree heads kept cosigned beside the anchor (one listing, not a look per head)."""
    from amdflash.store import witness

    try:
        names = os.listdir(witness.witnessed_dir(db))
    except OSError:
        return set()
    return {int(n.split(".", 1)[1]) for n in names if n.startswith("checkpoint.") and n.split(".", 1)[1].isdigit()}


def send(pg: Any, ns: str, host_id: int, db: str, witnesses: int | None) -> LogPush:
    """Insert what the central record lacks of this host's log (the caller commits): every
    head from the largest it holds on (that one again: a different tree of its size is
    refused by the database), each with a consistency proof from the one before; the
    cosignatures kept beside the anchor; the logged receipts."""
    from amdflash.store import tlog, trail_log

    directory = tlog.log_dir(db)
    out = LogPush()
    heads = local_heads(directory)
    row = pg.execute(f"SELECT size, root FROM {ns}.own_tlog_heads WHERE host_id = %s ORDER BY size DESC LIMIT 1",
                     (host_id,)).fetchone()
    held = int(row[0]) if row else -1
    out.size = max(held, 0)
    log = Log(directory)
    prev = held
    with pg.cursor() as cur:
        for h in heads:                      # in the order signed: sizes only grow
            size = int(h["size"])
            if size < held:
                continue
            # The one of the size held is sent again: the database skips the same tree and
            # refuses another; each larger one carries its proof from the one before.
            proof = b"".join(log.consistency(prev, size)) if 0 < prev < size else None
            cur.execute(f"INSERT INTO {ns}.tlog_heads (host_id, size, root, note, proof, witnesses, pushed_by) "
                        "VALUES (%s, %s, %s, %s, %s, %s, '')",
                        (host_id, size, bytes.fromhex(h["root"]), h["note"], proof, witnesses))
            if size > held:
                out.heads += 1
                out.size = prev = size
        cosigned = _kept_sizes(db)
        stored = {(int(s), str(w)) for s, w in pg.execute(
            f"SELECT size, witness FROM {ns}.own_tlog_cosignatures WHERE host_id = %s", (host_id,))}
        roots = {int(s): bytes(r).hex() for s, r in pg.execute(
            f"SELECT size, root FROM {ns}.own_tlog_heads WHERE host_id = %s", (host_id,))}
        for h in heads:
            # Only the heads the central record holds as this tree, and kept cosigned here: a
            # cosignature of another tree of that size never lands on the one it holds.
            if roots.get(int(h["size"])) != h["root"] or int(h["size"]) not in cosigned:
                continue
            for name, line in _cosignature_lines(db, h).items():
                if (int(h["size"]), name) not in stored:
                    cur.execute(f"INSERT INTO {ns}.tlog_cosignatures (host_id, size, witness, line, pushed_by) "
                                "VALUES (%s, %s, %s, %s, '')", (host_id, int(h["size"]), name, line))
                    out.cosignatures += 1
        have = {str(r) for (r,) in pg.execute(f"SELECT run_id FROM {ns}.own_tlog_receipts WHERE host_id = %s",
                                              (host_id,))}
        for entry in log.entries():
            if entry.get("kind") != "receipt" or entry.get("run") in have:
                continue
            got = trail_log.logged_receipt(directory, str(entry["run"]))
            if got is None:
                continue       # its copy is lost: put back when the run's receipt is built again
            cur.execute(f"INSERT INTO {ns}.tlog_receipts (host_id, run_id, leaf_index, envelope, sha256, pushed_by) "
                        "VALUES (%s, %s, %s, %s, %s, '')",
                        (host_id, str(entry["run"]), int(entry["i"]), got[1], bytes.fromhex(str(entry["sha256"]))))
            out.receipts += 1
    return out


# -- what audit verify --central checks ----------------------------------------------------------

@dataclass
class LogCheck:
    ok: bool
    words: str


def check_local(pg: Any, ns: str, host_id: int, host: str, db: str) -> LogCheck:
    """The central's newest tree head of this host's log against the log here: the same root
    at the same size, or a consistency proof from its size to this log's newest verifies."""
    from amdflash.store import tlog

    row = pg.execute(f"SELECT size, root, pushed_at::text FROM {ns}.own_tlog_heads WHERE host_id = %s "
                     "ORDER BY size DESC LIMIT 1", (host_id,)).fetchone()
    if row is None:
        return LogCheck(True, f"central     holds no tree head of host {host}'s transparency log yet")
    size, root, pushed = int(row[0]), bytes(row[1]), str(row[2])
    log = Log(tlog.log_dir(db))
    last = log.last_head()
    theirs = f"{size} leaves, root {base64.b64encode(root).decode()} (pushed {pushed})"
    if last is None or last.size < size:
        here = f"{last.size} leaves, root {base64.b64encode(last.root).decode()}" if last else "no tree head"
        return LogCheck(False, f"transparency log BROKEN against the central record: the central record holds host "
                               f"{host}'s tree head of {theirs}, and this host's log has {here}: the log was "
                               "rolled back")
    try:
        proof = log.consistency(size, last.size)
    except (LogError, OSError) as e:
        proof, why = [], str(e)
    else:
        why = ""
    if not consistent(size, last.size, root, last.root, proof):
        return LogCheck(False, f"transparency log BROKEN against the central record: the central record's tree "
                               f"head of host {host} ({theirs}) is not consistent with this host's log of "
                               f"{last.size} leaves, root {base64.b64encode(last.root).decode()}: the log forked, or "
                               f"was rolled back and re-grown{f' ({why})' if why else ''}")
    how = "the same tree" if size == last.size else f"a prefix of this log's {last.size} leaves (consistency proof)"
    return LogCheck(True, f"central     tree head of host {host}'s transparency log ({theirs}) is {how}")


# -- what the readers show -----------------------------------------------------------------------

def witness_states(pg: Any, ns: str, runs: list[tuple[int, str]]) -> dict[tuple[int, str], tuple[int, int | None]]:
    """{(host_id, run_id): (k, n)} of the runs whose receipt the central record holds: k the
    most witnesses that cosigned one tree head holding it, n the witnesses its host had
    configured (None if it said none). A run without a receipt there is left out."""
    if not runs:
        return {}
    hosts = [h for h, _ in runs]
    run_ids = [r for _, r in runs]
    rows = pg.execute(f"""
        SELECT r.host_id, r.run_id,
               coalesce((SELECT max(n) FROM (SELECT count(*) AS n FROM {ns}.tlog_cosignatures c
                                              WHERE c.host_id = r.host_id AND c.size > r.leaf_index
                                              GROUP BY c.size) k), 0),
               (SELECT h.witnesses FROM {ns}.tlog_heads h WHERE h.host_id = r.host_id ORDER BY h.size DESC LIMIT 1)
          FROM {ns}.tlog_receipts r
          JOIN unnest(%s::integer[], %s::text[]) AS w(host_id, run_id) USING (host_id, run_id)""",
                      (hosts, run_ids)).fetchall()
    return {(int(h), str(r)): (int(k), None if n is None else int(n)) for h, r, k, n in rows}


def witness_words(state: tuple[int, int | None] | None) -> str:
    """A run's witness state in words, as the readers show it."""
    if state is None:
        return "no receipt in the central record"
    k, n = state
    if k == 0:
        return "not yet witnessed" if n else "not witnessed (its host names no witness)"
    return f"witnessed {k} of {n}" if n else f"witnessed by {k}"
