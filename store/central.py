"""The central record of a line: every host's signed audit trail in one PostgreSQL database.

Each host's SQLite trail stays its write-ahead log; `amdflash audit push` copies to the
central database what it lacks of it. The database itself decides what it accepts — a
client that skips or fakes a check gains nothing — because every check runs inside it, in
the transaction of the push:

* `blobs`: a row's bytes must hash (PostgreSQL's sha256()) to its key;
* `checkpoints`: a checkpoint must be the next one of its host's chain (id one more than
  the last stored, its hash computed over its fields and the stored hash before it) and
  carry a valid Ed25519 signature by the host's *enrolled* key (checked by
  `amdflash.ed25519_verify`, a PL/Python function over python3-cryptography: PostgreSQL has
  no built-in Ed25519);
* audit rows: each must lie in a span of its run sealed by a checkpoint of the same
  transaction (nothing unsealed, nothing added later to a span already stored);
* at commit (deferred constraint triggers), each new checkpoint's span is hashed table by
  table with the canonical row text of store/chain.py, rebuilt in SQL, and the run's chain
  head and row count must match what the host signed.

Any failure raises and the whole batch is rolled back, naming the first checkpoint or row
that does not verify. Every table refuses UPDATE, DELETE and TRUNCATE (triggers, for the
owner too); the bookkeeping tables (`run_owners`, `blob_usage`) are written only by the push
checks (a run ID's owner never changes, a host's blob bytes only grow); only an
administrator enrols host keys.

Who pushes what, and who reads what, is decided by the database too:

* each host is enrolled with its key, its name and the one login that pushes for it
  (`hosts.login`); a checkpoint or blob of a host is accepted only from that login (the
  session's `session_user`, which SET ROLE cannot change) or from an administrator (a
  superuser) — a push login that holds another host's stolen key still cannot push for it;
* a run ID belongs to the host whose push stored it first (`run_owners`): another host's
  push of the same run ID is refused;
* every host has a blob quota (its own, set at enrolment, else the default set at setup):
  a push whose blobs would take the host over it is refused, naming the host and the quota;
* push logins (members of `amdflash_push`) may INSERT into the tables but not read them:
  they read their own host's rows through the `own_*` views (security-barrier views that
  keep the rows of the hosts the session may read). PostgreSQL's row-level security
  policies would say the same, but a table with row-level security refuses COPY FROM,
  which is what makes a push fast; the checks above are triggers owned by the
  administrator (SECURITY DEFINER), so they read what the pushing login may not.
  Reviewers (`amdflash_read`) read every table.

Tables mirror the host's physical tables (store/schema.py) with `host_id` added; a blob
reference is the blob's SHA-256 instead of a local id. The column names and values are the
host's, so the canonical text — and so every hash — is the same on both sides.

Beside the record, and never part of it: `progress`, what each host says its runs are doing
right now (stage, bytes, rate, ETA, and every end as the host sees it), published by the
host's follow service (`audit push --follow`, pipeline/fleet/live.py) within a second or two,
with a payload-free NOTIFY for listeners (`fleet serve`) on a channel whose random name only
reviewers read (progress_channel()). It is advisory: unsigned, the host's word. A push login
inserts rows only for the host bound to it (the same `session_user` check as the
checkpoints), never reads another host's, and cannot change or remove a row; the database
refuses a value no view could take (PROGRESS_SHAPES, PROGRESS_BOUNDS, the host's clock near
its own); the signed trail stays the truth, and every view says which it shows.
"""
from __future__ import annotations

import json
import math
import re
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from amdflash.store import schema
from amdflash.store.chain import LEGACY, Checkpoint, load_checkpoints
from amdflash.store.schema import PHYSICAL, PLAIN

NS = "amdflash"                       # the PostgreSQL schema holding everything
CENTRAL_VERSION = 3
# NOTIFY channel of progress wake-ups: this prefix and a random part made at setup, readable
# only by reviewers and administrators (progress_channel()), so a push login can neither listen
# to other hosts' activity nor wake the views (LISTEN and NOTIFY take no privilege).
PROGRESS_CHANNEL = "amdflash_progress"
# What a progress row may say (the host's own view, store.status.run_status on the host).
PROGRESS_STATES = ("running", "succeeded", "failed", "interrupted", "refused", "alive")
# What a progress row's values may be, checked by the database on every insert (CHECK
# constraints and its insert trigger): finite numbers within bounds, names of their shape (one
# pattern text for PostgreSQL and Python: \A, \Z and \x escapes mean the same to both), and
# the host's clock within minutes ahead of and days behind the server's (an end recorded while
# central was out of reach arrives late, with the time the host's trail gave it).
RUN_ID_SHAPE = r"\A[0-9]{8}T[0-9]{6}-[0-9a-f]{8}\Z"          # pipeline.runner.new_run_id
PLACE_SHAPE = r"\A[A-Za-z0-9][A-Za-z0-9._-]*\Z"         # EXPORTER-GROUP (fleet.live.places_from)
_PRINTABLE = r"\A[^\x01-\x1f\x7f]*\Z"                           # no control characters
PROGRESS_SHAPES = {
    "run_id": RUN_ID_SHAPE, "resumes": RUN_ID_SHAPE, "place": PLACE_SHAPE,
    "board": r"\A(sim|usb|pci):[^\x01-\x1f\x7f]+\Z",            # a board spec
    "command": r"\A[a-z][a-z0-9_-]{0,39}\Z", "stage": _PRINTABLE, "image_sha256": r"\A[0-9a-f]{64}\Z",
    "started": r"\A[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9:.]{5,18}(Z|[+-][0-9]{2}:?[0-9]{2})?\Z",   # ISO 8601
}
PROGRESS_BOUNDS = {"bytes_done": 1 << 40, "bytes_total": 1 << 40, "rate": float(1 << 40),   # bytes, bytes/s
                   "eta": 1e10, "checkpoint": 1 << 62}                                      # seconds; an id
# The longest text of each column (the progress table's own CHECKs, since schema version 3).
PROGRESS_LENGTHS = {"run_id": 100, "command": 40, "board": 1000, "place": 300, "stage": 100, "error": 4000,
                    "image_sha256": 64, "resumes": 100, "started": 64}
PROGRESS_AHEAD, PROGRESS_BEHIND = "5 minutes", "7 days"    # `at` against the server's clock at insert
DEFAULT_BLOB_QUOTA = 64 << 30   # bytes of blobs per host, unless set at setup or enrolment
PUSH_ROLE, READ_ROLE = "amdflash_push", "amdflash_read"
RUN_KINDS = ("commit", "final", "migrated")
_PG_TYPES = {"int": "bigint", "text": "text", "blob": "bytea", "ref": "bytea"}


class CentralError(RuntimeError):
    """The central database refused, or cannot be used (one line, for the user)."""


# -- schema ------------------------------------------------------------------------------------

# The checks run as the administrator who set the database up (push logins may not read the
# tables they check against), with a search path nobody else can add to.
_DEFINER = "SECURITY DEFINER SET search_path = pg_catalog, pg_temp"


def _q(column: str) -> str:
    """A column name quoted for PostgreSQL (`offset` is a reserved word there)."""
    return f'"{column}"'


def _pg_field(column: str, kind: str) -> str:
    """SQL: a column's canonical JSON text, exactly as store/chain.py writes it."""
    c = f"p.{_q(column)}"
    if kind == "int":
        return f"coalesce({c}::text, 'null')"
    if kind == "text":
        return f"coalesce(to_json({c})::text, 'null')"
    if kind == "blob":
        return f"CASE WHEN {c} IS NULL THEN 'null' ELSE '[\"b\",\"' || encode({c}, 'hex') || '\"]' END"
    return f"CASE WHEN {c} IS NULL THEN 'null' ELSE '\"' || encode({c}, 'hex') || '\"' END"   # ref: its SHA-256


def canonical_pg(table: str) -> str:
    """SQL: the canonical text of a row `p` of `table` (one line, newline-terminated)."""
    fields = " || ',' || ".join(_pg_field(c, k) for c, k in PHYSICAL[table])
    return f"'[\"{table}\",' || p.seq || ',' || {fields} || E']\\n'"


def _run_match(table: str, run: str, run_id: str) -> str:
    return f"p.run_id = {run_id}" if table in PLAIN else f"p.run = {run}"


def _tables_sql() -> str:
    out = []
    for table, columns in PHYSICAL.items():
        # host_id and blob references are checked per statement (the sealed_* triggers): a row
        # whose checkpoint is sealed is of an enrolled host, and every blob it names is stored.
        cols = ", ".join(f"{_q(c)} {_PG_TYPES[k]}" for c, k in columns)
        out.append(f"CREATE TABLE {NS}.{table} (host_id integer NOT NULL, seq bigint NOT NULL, "
                   f"{cols}, PRIMARY KEY (host_id, seq));")
        index = "run_id, seq" if table in PLAIN else "run, seq"
        out.append(f"CREATE INDEX {table}_by_run ON {NS}.{table} (host_id, {index});")
    return "\n".join(out)


def _segment_function() -> str:
    """The deferred check of one checkpoint's span: its rows, table by table, must hash to the
    head the host signed, and be as many as it counted."""
    steps = []
    for table in PHYSICAL:
        steps.append(f"""
    SELECT count(*), sha256(convert_to(coalesce(string_agg({canonical_pg(table)}, '' ORDER BY p.seq), ''), 'UTF8'))
      INTO n, digest FROM {NS}.{table} p
     WHERE p.host_id = NEW.host_id AND p.seq BETWEEN lo AND NEW.last_seq
       AND {_run_match(table, 'NEW.run', 'NEW.run_id')};
    total := total + n; digests := digests || digest;""")
    return f"""
CREATE FUNCTION {NS}.check_span() RETURNS trigger LANGUAGE plpgsql {_DEFINER} AS $fn$
DECLARE
    run_key bigint; prev record; lo bigint; head bytea; rows_before bigint;
    n bigint; digest bytea; digests bytea := ''::bytea; total bigint := 0;
    who text;
BEGIN
    IF NEW.kind NOT IN ('commit', 'final', 'migrated') THEN RETURN NULL; END IF;
    who := format('checkpoint #%s of host %s (run %s)', NEW.id, {NS}.host_name(NEW.host_id), NEW.run_id);
    SELECT seq INTO run_key FROM {NS}.runs WHERE host_id = NEW.host_id AND run_id = NEW.run_id ORDER BY seq LIMIT 1;
    IF run_key IS NULL OR run_key <> NEW.run THEN
        RAISE EXCEPTION 'refused: %: the runs row of its run is missing or moved (run key %, found %)',
            who, NEW.run, run_key USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    SELECT c.last_seq, c.rows, c.head INTO prev FROM {NS}.checkpoints c
     WHERE c.host_id = NEW.host_id AND c.run = NEW.run AND c.kind IN ('commit', 'final', 'migrated') AND c.id < NEW.id
     ORDER BY c.id DESC LIMIT 1;
    IF FOUND THEN
        lo := prev.last_seq + 1; head := prev.head; rows_before := prev.rows;
    ELSE
        lo := NEW.run; head := sha256(convert_to(E'amdflash run\\n' || NEW.run_id, 'UTF8')); rows_before := 0;
    END IF;
    {''.join(steps)}
    head := sha256(head || digests);
    IF head IS DISTINCT FROM NEW.head OR rows_before + total IS DISTINCT FROM NEW.rows THEN
        RAISE EXCEPTION 'refused: first bad row in seq %..% of run % (host %): those rows do not hash to the head '
                        'signed by checkpoint #% (% rows found, % sealed): a row there was changed, added or removed',
            lo, NEW.last_seq, NEW.run_id, {NS}.host_name(NEW.host_id), NEW.id, rows_before + total, NEW.rows
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NULL;
END $fn$;
"""


def _sealed_function(table: str) -> str:
    """A statement trigger: every row just inserted lies in a span sealed by a checkpoint of
    this same transaction (so the deferred check covers it)."""
    run_col = "run_id" if table in PLAIN else "run"
    first_of_run = ("(SELECT min(r.seq) FROM {ns}.runs r WHERE r.host_id = n.host_id AND r.run_id = n.run_id)"
                    if table in PLAIN else "n.run").format(ns=NS)
    refs = [c for c, k in PHYSICAL[table] if k == "ref"]
    missing = " OR ".join(f"(n.{_q(c)} IS NOT NULL AND NOT EXISTS "
                          f"(SELECT 1 FROM {NS}.blobs b WHERE b.host_id = n.host_id "
                          f"AND b.sha256 = n.{_q(c)}))" for c in refs)
    blobs_check = f"""SELECT n.seq, n.host_id INTO bad FROM new_rows n WHERE {missing} ORDER BY n.seq LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'refused: first bad row {table} seq % of host %: it refers to bytes the central '
                            'database does not hold', bad.seq, {NS}.host_name(bad.host_id)
                USING ERRCODE = 'integrity_constraint_violation';
        END IF;""" if refs else ""
    run_start = ("(SELECT min(r.seq) FROM {ns}.runs r WHERE r.host_id = g.host_id AND r.run_id = g.r)"
                 if table in PLAIN else "g.r").format(ns=NS)
    # Per run, the new rows must lie after every span stored before this transaction and
    # within the spans of its new checkpoints (a run's spans are contiguous): one grouped
    # query. Only when that fails are the rows looked at one by one, to name the first bad one.
    return f"""
CREATE FUNCTION {NS}.sealed_{table}() RETURNS trigger LANGUAGE plpgsql {_DEFINER} AS $fn$
DECLARE bad record; grp record;
BEGIN
    SELECT g.host_id, g.r INTO grp
      FROM (SELECT host_id, {run_col} AS r, min(seq) AS lo, max(seq) AS hi FROM new_rows GROUP BY 1, 2) g
      LEFT JOIN LATERAL (SELECT max(c.last_seq) FILTER (WHERE c.pushed_in <> txid_current()) AS old_last,
                                max(c.last_seq) FILTER (WHERE c.pushed_in = txid_current()) AS new_last
                           FROM {NS}.checkpoints c WHERE c.host_id = g.host_id AND c.{run_col} = g.r
                            AND c.kind IN ('commit', 'final', 'migrated')) c ON true
     WHERE c.new_last IS NULL OR g.hi > c.new_last OR g.lo <= coalesce(c.old_last, -1) OR g.lo < {run_start}
     LIMIT 1;
    IF NOT FOUND THEN
        {blobs_check}
        RETURN NULL;
    END IF;
    SELECT n.seq, n.host_id, n.{run_col}::text AS run, c.id AS cp, c.pushed_in INTO bad
      FROM (SELECT * FROM new_rows WHERE host_id = grp.host_id AND {run_col} = grp.r) n
      LEFT JOIN LATERAL (SELECT c.id, c.pushed_in FROM {NS}.checkpoints c
                          WHERE c.host_id = n.host_id AND c.{run_col} = n.{run_col} AND c.last_seq >= n.seq
                            AND c.kind IN ('commit', 'final', 'migrated')
                          ORDER BY c.last_seq LIMIT 1) c ON true
     WHERE c.id IS NULL OR c.pushed_in <> txid_current() OR n.seq < {first_of_run}
     ORDER BY n.seq LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'refused: first bad row {table} seq % of host % (run %): %', bad.seq,
            {NS}.host_name(bad.host_id), bad.run,
            CASE WHEN bad.cp IS NULL THEN 'no checkpoint seals it (an unsealed row, or one of no run)'
                 WHEN bad.pushed_in <> txid_current() THEN format('it lies in a span already sealed and stored by '
                      'checkpoint #%s: rows cannot be added to it', bad.cp)
                 ELSE 'it lies before its run began' END
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RAISE EXCEPTION 'refused: rows of {table} (host %, run %) outside the spans this push seals',
        {NS}.host_name(grp.host_id), grp.r USING ERRCODE = 'integrity_constraint_violation';
END $fn$;
CREATE TRIGGER {table}_sealed AFTER INSERT ON {NS}.{table} REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {NS}.sealed_{table}();
"""


def _schema_sql() -> str:
    tables = ("hosts", "blobs", "checkpoints", "meta", *PHYSICAL)
    no_change = "\n".join(
        f"CREATE TRIGGER {t}_insert_only BEFORE UPDATE OR DELETE ON {NS}.{t} FOR EACH ROW "
        f"EXECUTE FUNCTION {NS}.refuse_change();\n"
        f"CREATE TRIGGER {t}_no_truncate BEFORE TRUNCATE ON {NS}.{t} FOR EACH STATEMENT "
        f"EXECUTE FUNCTION {NS}.refuse_change();" for t in tables)
    return f"""
CREATE EXTENSION IF NOT EXISTS plpython3u;
CREATE SCHEMA {NS};
CREATE TABLE {NS}.meta (key text PRIMARY KEY, value text);
INSERT INTO {NS}.meta VALUES ('central_version', '{CENTRAL_VERSION}'),
                            ('host_schema_version', '{schema.SCHEMA_VERSION}');
CREATE TABLE {NS}.hosts (id serial PRIMARY KEY, public_key bytea NOT NULL UNIQUE CHECK (length(public_key) = 32),
                         name text NOT NULL UNIQUE, login text NOT NULL UNIQUE,
                         blob_quota bigint CHECK (blob_quota >= 0),
                         enrolled_at timestamptz NOT NULL DEFAULT now(),
                         enrolled_by text NOT NULL DEFAULT current_user);
-- Blobs are kept per host: a host's rows refer to its own copy, its quota counts them, and
-- no push can learn from the dedup whether another host holds some bytes.
CREATE TABLE {NS}.blobs (host_id integer NOT NULL, sha256 bytea NOT NULL, data bytea NOT NULL,
                         PRIMARY KEY (host_id, sha256));
-- Bookkeeping, not record: the bytes of each host's blobs (for its quota), and which host
-- stored each run ID first.
CREATE TABLE {NS}.blob_usage (host_id integer PRIMARY KEY, bytes bigint NOT NULL);
CREATE TABLE {NS}.run_owners (run_id text PRIMARY KEY, host_id integer NOT NULL);
CREATE TABLE {NS}.checkpoints (
    host_id integer NOT NULL REFERENCES {NS}.hosts, id bigint NOT NULL, kind text NOT NULL, run bigint,
    run_id text, rows bigint, last_seq bigint, head bytea, at text NOT NULL, detail text,
    hash bytea NOT NULL, sig bytea NOT NULL,
    pushed_in bigint NOT NULL, pushed_at timestamptz NOT NULL DEFAULT now(), pushed_by text NOT NULL,
    PRIMARY KEY (host_id, id));
CREATE INDEX checkpoints_by_run ON {NS}.checkpoints (host_id, run, last_seq);
CREATE INDEX checkpoints_by_run_id ON {NS}.checkpoints (host_id, run_id, last_seq);
{_tables_sql()}

CREATE FUNCTION {NS}.refuse_change() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    RAISE EXCEPTION 'refused: the central audit tables are insert-only (% on %)', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END $fn$;
{no_change}

CREATE FUNCTION {NS}.host_name(ident integer) RETURNS text LANGUAGE sql STABLE AS
    $fn$ SELECT coalesce((SELECT name FROM {NS}.hosts WHERE id = ident), '#' || ident) $fn$;

-- Who the session is: an administrator (a superuser) may push and read for every host; a
-- login pushes for the one host bound to it; a reviewer (amdflash_read) reads every host.
CREATE FUNCTION {NS}.is_admin() RETURNS boolean LANGUAGE sql STABLE AS
    $fn$ SELECT coalesce((SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = session_user), false) $fn$;
CREATE FUNCTION {NS}.may_push(ident integer) RETURNS boolean LANGUAGE sql STABLE {_DEFINER} AS
    $fn$ SELECT {NS}.is_admin() OR EXISTS (SELECT 1 FROM {NS}.hosts WHERE id = ident AND login = session_user) $fn$;
CREATE FUNCTION {NS}.readable_hosts() RETURNS integer[] LANGUAGE sql STABLE {_DEFINER} AS $fn$
    SELECT coalesce(array_agg(id), '{{}}') FROM {NS}.hosts
     WHERE login = session_user OR {NS}.is_admin() OR pg_has_role(session_user, '{READ_ROLE}', 'MEMBER') $fn$;
CREATE FUNCTION {NS}.refused_login(ident integer) RETURNS text LANGUAGE sql STABLE {_DEFINER} AS $fn$
    SELECT format('login %s is bound to %s and may push only that host''s checkpoints and blobs', session_user,
                  coalesce('host ' || (SELECT name FROM {NS}.hosts WHERE login = session_user), 'no host')) $fn$;

-- Ed25519 (RFC 8032) signature check: PostgreSQL has none built in; python3-cryptography does it.
CREATE FUNCTION {NS}.ed25519_verify(public_key bytea, signature bytea, message bytea) RETURNS boolean
LANGUAGE plpython3u IMMUTABLE STRICT AS $fn$
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
try:
    Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
except (InvalidSignature, ValueError):
    return False
return True
$fn$;

-- The fields of a checkpoint's hashed text (store/chain.py `field`).
CREATE FUNCTION {NS}.f_int(v bigint) RETURNS bytea LANGUAGE sql IMMUTABLE AS
    $fn$ SELECT CASE WHEN v IS NULL THEN 'n'::bytea ELSE convert_to('i' || v, 'UTF8') END $fn$;
CREATE FUNCTION {NS}.f_text(v text) RETURNS bytea LANGUAGE sql IMMUTABLE AS
    $fn$ SELECT CASE WHEN v IS NULL THEN 'n'::bytea
                     ELSE convert_to('s' || octet_length(convert_to(v, 'UTF8')) || ':' || v, 'UTF8') END $fn$;
CREATE FUNCTION {NS}.f_bytes(v bytea) RETURNS bytea LANGUAGE sql IMMUTABLE AS
    $fn$ SELECT CASE WHEN v IS NULL THEN 'n'::bytea ELSE convert_to('b' || encode(v, 'hex'), 'UTF8') END $fn$;

CREATE FUNCTION {NS}.check_blob() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    IF sha256(NEW.data) IS DISTINCT FROM NEW.sha256 THEN
        RAISE EXCEPTION 'refused: blob %: its bytes do not hash to its SHA-256', encode(NEW.sha256, 'hex')
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END $fn$;
CREATE TRIGGER blobs_verified BEFORE INSERT ON {NS}.blobs FOR EACH ROW EXECUTE FUNCTION {NS}.check_blob();

-- Per statement: every new blob is of a host the session may push for, and the host stays
-- within its quota (its own, else the default).
CREATE FUNCTION {NS}.blobs_owned() RETURNS trigger LANGUAGE plpgsql {_DEFINER} AS $fn$
DECLARE grp record; quota bigint; used bigint;
BEGIN
    FOR grp IN SELECT host_id, sum(octet_length(data))::bigint AS bytes FROM new_rows GROUP BY host_id LOOP
        IF NOT {NS}.may_push(grp.host_id) THEN
            RAISE EXCEPTION 'refused: blobs of host %: %', {NS}.host_name(grp.host_id), {NS}.refused_login(grp.host_id)
                USING ERRCODE = 'insufficient_privilege';
        END IF;
        SELECT coalesce(h.blob_quota, (SELECT value::bigint FROM {NS}.meta WHERE key = 'blob_quota')) INTO quota
          FROM {NS}.hosts h WHERE h.id = grp.host_id;
        INSERT INTO {NS}.blob_usage AS u VALUES (grp.host_id, grp.bytes)
            ON CONFLICT (host_id) DO UPDATE SET bytes = u.bytes + EXCLUDED.bytes RETURNING u.bytes INTO used;
        IF quota IS NOT NULL AND used > quota THEN
            RAISE EXCEPTION 'refused: host % would hold % bytes of blobs, over its quota of % bytes (this push adds %)',
                {NS}.host_name(grp.host_id), used, quota, grp.bytes USING ERRCODE = 'program_limit_exceeded';
        END IF;
    END LOOP;
    RETURN NULL;
END $fn$;
CREATE TRIGGER blobs_owned AFTER INSERT ON {NS}.blobs REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {NS}.blobs_owned();

-- A run ID is the host's that stored it first: the first push inserts it here, any other
-- host's push of the same run ID then finds it taken (and a concurrent one waits on the key).
CREATE FUNCTION {NS}.runs_owned() RETURNS trigger LANGUAGE plpgsql {_DEFINER} AS $fn$
DECLARE bad record;
BEGIN
    INSERT INTO {NS}.run_owners (run_id, host_id)
        SELECT DISTINCT ON (run_id) run_id, host_id FROM new_rows ORDER BY run_id, seq ON CONFLICT (run_id) DO NOTHING;
    SELECT n.run_id, n.host_id, o.host_id AS owner INTO bad FROM new_rows n
      JOIN {NS}.run_owners o ON o.run_id = n.run_id WHERE o.host_id <> n.host_id ORDER BY n.seq LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'refused: run % of host %: that run ID was stored first by host %; a run ID belongs to the '
                        'host that sealed and pushed it first', bad.run_id, {NS}.host_name(bad.host_id),
            {NS}.host_name(bad.owner) USING ERRCODE = 'unique_violation';
    END IF;
    RETURN NULL;
END $fn$;
CREATE TRIGGER runs_owned AFTER INSERT ON {NS}.runs REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {NS}.runs_owned();

CREATE FUNCTION {NS}.check_checkpoint() RETURNS trigger LANGUAGE plpgsql {_DEFINER} AS $fn$
DECLARE
    key bytea; prev bytea; last_id bigint; computed bytea; who text; prior record;
BEGIN
    SELECT public_key INTO key FROM {NS}.hosts WHERE id = NEW.host_id;
    who := format('checkpoint #%s of host %s%s', NEW.id, {NS}.host_name(NEW.host_id),
                  CASE WHEN NEW.run_id IS NULL THEN '' ELSE ' (run ' || NEW.run_id || ')' END);
    IF key IS NULL THEN
        RAISE EXCEPTION 'refused: %: no enrolled host #%', who, NEW.host_id
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF NOT {NS}.may_push(NEW.host_id) THEN
        RAISE EXCEPTION 'refused: %: %', who, {NS}.refused_login(NEW.host_id) USING ERRCODE = 'insufficient_privilege';
    END IF;
    SELECT max(id) INTO last_id FROM {NS}.checkpoints WHERE host_id = NEW.host_id;
    IF NEW.id IS DISTINCT FROM coalesce(last_id, 0) + 1 THEN
        RAISE EXCEPTION 'refused: %: the host''s chain continues at #% (checkpoints missing or repeated)',
            who, coalesce(last_id, 0) + 1 USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF last_id IS NULL THEN
        prev := '\\x0000000000000000000000000000000000000000000000000000000000000000'::bytea;
    ELSE
        SELECT hash INTO prev FROM {NS}.checkpoints WHERE host_id = NEW.host_id AND id = last_id;
    END IF;
    computed := sha256('checkpoint|'::bytea || {NS}.f_int(NEW.id) || '|'::bytea || {NS}.f_text(NEW.kind)
        || '|'::bytea || {NS}.f_text(NEW.run_id) || '|'::bytea || {NS}.f_int(NEW.rows) || '|'::bytea
        || {NS}.f_int(NEW.last_seq) || '|'::bytea || {NS}.f_bytes(NEW.head) || '|'::bytea || {NS}.f_bytes(key)
        || '|'::bytea || {NS}.f_text(NEW.at) || '|'::bytea || {NS}.f_text(NEW.detail) || '|'::bytea
        || {NS}.f_bytes(prev));
    IF computed IS DISTINCT FROM NEW.hash THEN
        RAISE EXCEPTION 'refused: %: its hash does not match its fields and the stored checkpoint before it '
                        '(the host''s trail was changed or replaced after #%)', who, coalesce(last_id, 0)
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF NOT {NS}.ed25519_verify(key, NEW.sig, NEW.hash) THEN
        RAISE EXCEPTION 'refused: %: its signature does not verify under the host''s enrolled key: the chain was '
                        'recomputed without the host''s private key', who
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF NEW.kind IN ('commit', 'final', 'migrated') THEN
        IF NEW.run IS NULL OR NEW.run_id IS NULL OR NEW.last_seq IS NULL OR NEW.rows IS NULL THEN
            RAISE EXCEPTION 'refused: %: a run checkpoint without its run or span', who
                USING ERRCODE = 'integrity_constraint_violation';
        END IF;
        SELECT kind INTO prior FROM {NS}.checkpoints WHERE host_id = NEW.host_id AND run = NEW.run
            AND kind IN ('commit', 'final', 'migrated') ORDER BY id DESC LIMIT 1;
        IF FOUND AND prior.kind = 'final' THEN
            RAISE EXCEPTION 'refused: %: its run was already sealed by a final checkpoint', who
                USING ERRCODE = 'integrity_constraint_violation';
        END IF;
    END IF;
    NEW.pushed_in := txid_current();
    NEW.pushed_at := now();
    NEW.pushed_by := session_user;
    RETURN NEW;
END $fn$;
CREATE TRIGGER checkpoints_verified BEFORE INSERT ON {NS}.checkpoints FOR EACH ROW
    EXECUTE FUNCTION {NS}.check_checkpoint();
{_segment_function()}
CREATE CONSTRAINT TRIGGER checkpoints_span_verified AFTER INSERT ON {NS}.checkpoints
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {NS}.check_span();
{"".join(_sealed_function(t) for t in PHYSICAL)}
{_own_views()}
{_progress_sql()}
{_hardening_sql(existing=False)}
"""


def _progress_sql() -> str:
    """The progress table (advisory, insert-only, a host's own rows only) and its NOTIFY.
    Also what `central-setup` adds to a version 2 database."""
    states = ", ".join(f"'{s}'" for s in PROGRESS_STATES)
    return f"""
CREATE SEQUENCE {NS}.progress_id;
CREATE TABLE {NS}.progress (
    id bigint PRIMARY KEY, host_id integer NOT NULL REFERENCES {NS}.hosts,
    run_id text CHECK (length(run_id) <= 100), state text NOT NULL CHECK (state IN ({states})),
    command text CHECK (length(command) <= 40), board text CHECK (length(board) <= 1000),
    place text CHECK (length(place) <= 300), stage text CHECK (length(stage) <= 100),
    bytes_done bigint CHECK (bytes_done >= 0), bytes_total bigint CHECK (bytes_total >= 0),
    rate double precision CHECK (rate >= 0), eta double precision CHECK (eta >= 0),
    error text CHECK (length(error) <= 4000), image_sha256 text CHECK (length(image_sha256) <= 64),
    resumes text CHECK (length(resumes) <= 100), started text CHECK (length(started) <= 64),
    checkpoint bigint,                              -- the host's newest checkpoint when it said this
    at timestamptz NOT NULL,                        -- the host's clock
    received_at timestamptz NOT NULL, sent_by text NOT NULL);
CREATE INDEX progress_by_run ON {NS}.progress (host_id, run_id, id);
CREATE INDEX progress_by_time ON {NS}.progress (received_at);
CREATE INDEX progress_by_host ON {NS}.progress (host_id, id);
{_progress_functions()}
CREATE TRIGGER progress_checked BEFORE INSERT ON {NS}.progress FOR EACH ROW EXECUTE FUNCTION {NS}.check_progress();
CREATE TRIGGER progress_notify AFTER INSERT ON {NS}.progress REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {NS}.notify_progress();
CREATE TRIGGER progress_insert_only BEFORE UPDATE OR DELETE ON {NS}.progress FOR EACH ROW
    EXECUTE FUNCTION {NS}.refuse_change();
CREATE TRIGGER progress_no_truncate BEFORE TRUNCATE ON {NS}.progress FOR EACH STATEMENT
    EXECUTE FUNCTION {NS}.refuse_change();
CREATE VIEW {NS}.own_progress WITH (security_barrier) AS
    SELECT * FROM {NS}.progress WHERE host_id = ANY ((SELECT {NS}.readable_hosts())::integer[]);
"""


def _progress_functions() -> str:
    """The progress table's insert check and its NOTIFY (replaced in place by an upgrade)."""
    return f"""
-- The database, not the client, says which host, when and who: a login inserts only for the
-- host bound to it (session_user, as for checkpoints), and the row's id and arrival are its own.
-- The host's clock (`at`) must be near the server's: a time no reader can load ('infinity',
-- year 10000) or one far off is refused, naming it.
CREATE OR REPLACE FUNCTION {NS}.check_progress() RETURNS trigger LANGUAGE plpgsql {_DEFINER} AS $fn$
BEGIN
    IF NOT {NS}.may_push(NEW.host_id) THEN
        RAISE EXCEPTION 'refused: progress of host %: %', {NS}.host_name(NEW.host_id),
            replace({NS}.refused_login(NEW.host_id), 'checkpoints and blobs', 'checkpoints, blobs and progress')
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    NEW.id := nextval('{NS}.progress_id');
    NEW.received_at := clock_timestamp();
    NEW.sent_by := session_user;
    IF NEW.at IS NOT NULL AND NOT NEW.at BETWEEN NEW.received_at - interval '{PROGRESS_BEHIND}'
                                             AND NEW.received_at + interval '{PROGRESS_AHEAD}' THEN
        RAISE EXCEPTION 'refused: progress of host % (run %): its at = % is not within {PROGRESS_BEHIND} before '
                        'and {PROGRESS_AHEAD} after the central database''s clock (%)', {NS}.host_name(NEW.host_id),
            coalesce(NEW.run_id, 'none'), NEW.at, NEW.received_at USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $fn$;
-- A wake-up without payload, on the channel only reviewers can read the name of: listeners
-- read the rows themselves (as their login may), and no push login learns another's activity.
CREATE OR REPLACE FUNCTION {NS}.notify_progress() RETURNS trigger LANGUAGE plpgsql {_DEFINER} AS $fn$
BEGIN
    PERFORM pg_notify((SELECT name FROM {NS}.progress_channel), '');
    RETURN NULL;
END $fn$;
"""


def _progress_checks() -> dict[str, str]:
    """{column: the CHECK its value must pass} (a NULL passes). An upper bound also refuses NaN
    and Infinity: PostgreSQL orders NaN above every number (so `rate >= 0` admits it)."""
    checks = {c: f"{c} >= 0 AND {c} <= {bound!r}" for c, bound in PROGRESS_BOUNDS.items()}
    checks.update({c: f"{c} ~ '{shape}'" for c, shape in PROGRESS_SHAPES.items()})
    return checks


def _hardening_sql(existing: bool) -> str:
    """What keeps the central record's word beyond the record's own tables: progress values
    checked (CHECK constraints named `progress_<column>_checked`; on an existing table NOT
    VALID, which checks every new row and leaves the stored ones), the secret NOTIFY channel,
    and the bookkeeping tables (`run_owners`, `blob_usage`) changed only by the push checks."""
    not_valid = " NOT VALID" if existing else ""
    # Idempotent (whatever part a database already has is made again): DROP ... IF EXISTS first.
    constraints = ",\n".join(f"    DROP CONSTRAINT IF EXISTS progress_{c}_checked,\n"
                              f"    ADD CONSTRAINT progress_{c}_checked CHECK ({check}){not_valid}"
                              for c, check in _progress_checks().items())
    triggers = [("run_owners", "kept", "INSERT OR UPDATE OR DELETE", "ROW", "bookkeeping_only"),
                ("blob_usage", "kept", "INSERT OR UPDATE OR DELETE", "ROW", "bookkeeping_only"),
                ("progress_channel", "insert_only", "UPDATE OR DELETE", "ROW", "refuse_change")]
    triggers += [(t, "no_truncate", "TRUNCATE", "STATEMENT", "refuse_change") for t, *_ in triggers]
    made = "\n".join(f"DROP TRIGGER IF EXISTS {t}_{name} ON {NS}.{t};\n"
                      f"CREATE TRIGGER {t}_{name} BEFORE {ops} ON {NS}.{t} FOR EACH {each} "
                      f"EXECUTE FUNCTION {NS}.{function}();" for t, name, ops, each, function in triggers)
    return f"""
ALTER TABLE {NS}.progress
{constraints};
CREATE TABLE IF NOT EXISTS {NS}.progress_channel (
    name text NOT NULL CHECK (name ~ '\\A{PROGRESS_CHANNEL}_[0-9a-f]{{32}}\\Z'));
INSERT INTO {NS}.progress_channel SELECT '{PROGRESS_CHANNEL}_' || replace(gen_random_uuid()::text, '-', '')
    WHERE NOT EXISTS (SELECT FROM {NS}.progress_channel);
-- Which host owns a run ID, and the bytes each host's blobs take: written only by the push
-- checks (runs_owned, blobs_owned: a statement run from within a trigger), never by a
-- statement of anyone's own, the owner's too; a run ID's owner never changes, and a quota
-- count only grows, so neither can reopen a run ID or a quota.
ALTER TABLE {NS}.blob_usage DROP CONSTRAINT IF EXISTS blob_usage_bytes_checked,
    ADD CONSTRAINT blob_usage_bytes_checked CHECK (bytes >= 0){not_valid};
CREATE OR REPLACE FUNCTION {NS}.bookkeeping_only() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE kept boolean := pg_trigger_depth() >= 2 AND TG_OP <> 'DELETE';
BEGIN
    IF kept AND TG_OP = 'UPDATE' THEN      -- (only blob_usage has bytes: tested apart)
        kept := TG_TABLE_NAME = 'blob_usage';
        IF kept THEN
            kept := NEW.host_id = OLD.host_id AND NEW.bytes >= OLD.bytes;
        END IF;
    END IF;
    IF NOT kept THEN
        RAISE EXCEPTION 'refused: % on %: it is kept by the push checks only (a run ID stays the host''s that '
                        'pushed it first; a host''s blob bytes only grow)', TG_OP, TG_TABLE_NAME
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END $fn$;
{made}
"""


def _progress_grants() -> str:
    return f"""REVOKE ALL ON {NS}.progress, {NS}.own_progress, {NS}.progress_channel FROM PUBLIC;
GRANT SELECT ON {NS}.progress, {NS}.progress_channel TO {READ_ROLE};
GRANT SELECT ON {NS}.own_progress TO {PUSH_ROLE}, {READ_ROLE};
GRANT INSERT ON {NS}.progress TO {PUSH_ROLE};
"""


def _own_views() -> str:
    """`own_T`: the rows of T of the hosts the session may read (a push login: its own host's)."""
    mine = f"= ANY ((SELECT {NS}.readable_hosts())::integer[])"   # one call per query (an InitPlan)
    views = [f"CREATE VIEW {NS}.own_hosts WITH (security_barrier) AS "
             f"SELECT id, name, login, public_key, blob_quota FROM {NS}.hosts WHERE id {mine};",
             f"CREATE VIEW {NS}.own_blob_usage WITH (security_barrier) AS "
             f"SELECT * FROM {NS}.blob_usage WHERE host_id {mine};"]
    views += [f"CREATE VIEW {NS}.own_{t} WITH (security_barrier) AS SELECT * FROM {NS}.{t} WHERE host_id {mine};"
              for t in ("blobs", "checkpoints", *PHYSICAL)]
    return "\n".join(views)


def _roles_sql() -> str:
    data = ", ".join(f"{NS}.{t}" for t in ("blobs", "checkpoints", *PHYSICAL))
    everything = f"{data}, {NS}.hosts, {NS}.blob_usage, {NS}.run_owners"
    own = ", ".join(f"{NS}.own_{t}" for t in ("hosts", "blob_usage", "blobs", "checkpoints", *PHYSICAL))
    create = "\n".join(f"""DO $do$ BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{role}') THEN CREATE ROLE {role} NOLOGIN; END IF;
END $do$;""" for role in (PUSH_ROLE, READ_ROLE))
    # Push logins insert but never read the tables: their own host's rows, through own_*.
    return f"""{create}
REVOKE ALL ON ALL TABLES IN SCHEMA {NS} FROM PUBLIC;
GRANT USAGE ON SCHEMA {NS} TO {PUSH_ROLE}, {READ_ROLE};
GRANT SELECT ON {NS}.meta, {own} TO {PUSH_ROLE}, {READ_ROLE};
GRANT SELECT ON {everything} TO {READ_ROLE};
GRANT INSERT ON {data} TO {PUSH_ROLE};
{_progress_grants()}"""


def connect(url: str, autocommit: bool = False, timeout: int = 20) -> Any:
    """A psycopg connection to the central database (CentralError if it cannot be had)."""
    try:
        import psycopg
    except ImportError:
        raise CentralError("the central database needs psycopg: pip install 'amdflash[fleet]'") from None
    try:
        return psycopg.connect(url, autocommit=autocommit, connect_timeout=timeout)
    except psycopg.Error as e:
        why = _first_line(e)
        if "no password supplied" in why:   # libpq's fe_sendauth: the server asks for one, none was found
            why += "; " + _password_hint(url)
        raise CentralError(f"cannot connect to the central database: {why}") from None


def _password_hint(url: str) -> str:
    """Where libpq looks for the login's password: the line to add, and the file."""
    import os

    from psycopg.conninfo import conninfo_to_dict

    try:
        params = conninfo_to_dict(url)
    except Exception:
        params = {}
    entry = ":".join(str(params.get(k) or d) for k, d in
                     (("host", "localhost"), ("port", 5432), ("dbname", "*"), ("user", "LOGIN")))
    where = os.environ.get("PGPASSFILE") or os.path.expanduser("~/.pgpass")
    return (f"put the login's password in {where} (mode 0600) as the line '{entry}:PASSWORD' — for a host's "
            "push and follow services that is ~amdflash/.pgpass — or give PGPASSFILE")


def _first_line(e: BaseException) -> str:
    text = (getattr(getattr(e, "diag", None), "message_primary", None) or str(e)).strip()
    return text.splitlines()[0] if text else type(e).__name__


def installed(pg: Any) -> bool:
    row = pg.execute("SELECT to_regclass(%s)", (f"{NS}.meta",)).fetchone()
    return row is not None and row[0] is not None


def setup(url: str, blob_quota: int = DEFAULT_BLOB_QUOTA) -> str:
    """Create the central schema, its checks and the roles (once, as an administrator).
    `blob_quota`: the bytes of blobs each host may store unless its enrolment says otherwise."""
    with connect(url) as pg:
        import psycopg  # connect() said so if it is missing

        if installed(pg):
            version = pg.execute(f"SELECT value FROM {NS}.meta WHERE key = 'central_version'").fetchone()
            if version is not None and version[0] == "2":
                return _upgrade_from_2(pg)
            if version is not None and version[0] == "3" and not _hardened(pg):
                return _harden_in_place(pg)
            return f"the central database is already set up (version {version[0] if version else '?'})"
        try:
            pg.execute(_schema_sql())
            pg.execute(f"INSERT INTO {NS}.meta VALUES ('blob_quota', %s)", (str(blob_quota),))
            pg.execute(_roles_sql())
            _self_test(pg)
            pg.commit()
        except psycopg.Error as e:
            hint = ""
            if "plpython3u" in str(e) or "cryptography" in str(e):
                hint = " (the server needs PL/Python: apt-get install postgresql-plpython3-NN python3-cryptography)"
            raise CentralError(f"cannot set up the central database: {_first_line(e)}{hint}") from None
    return (f"central database set up: schema {NS}, roles {PUSH_ROLE} (hosts push: INSERT, and read their own "
            f"host's rows) and {READ_ROLE} (reviewers: SELECT); {blob_quota} bytes of blobs per host; enrol each "
            "host's key and login with 'amdflash fleet enroll'")


def _upgrade_from_2(pg: Any) -> str:
    """Version 2 → 3: the progress table, its checks and grants are added; nothing stored
    changes but the version in `meta` (the administrator lifts meta's insert-only trigger for
    that one row, in the same transaction)."""
    import psycopg

    try:
        pg.execute(_progress_sql())
        pg.execute(_hardening_sql(existing=False))
        pg.execute(_progress_grants())
        pg.execute(f"ALTER TABLE {NS}.meta DISABLE TRIGGER meta_insert_only")
        pg.execute(f"UPDATE {NS}.meta SET value = %s WHERE key = 'central_version'", (str(CENTRAL_VERSION),))
        pg.execute(f"ALTER TABLE {NS}.meta ENABLE TRIGGER meta_insert_only")
        pg.commit()
    except psycopg.Error as e:
        raise CentralError(f"cannot upgrade the central database: {_first_line(e)}") from None
    return (f"central database upgraded from version 2 to {CENTRAL_VERSION}: table {NS}.progress added (live "
            "progress, advisory; insert-only, each push login only its own host's); nothing stored was changed")


def _hardened(pg: Any) -> bool:
    """Whether this version 3 database has the progress checks, the secret NOTIFY channel and
    the kept bookkeeping tables (a database set up before them lacks all three)."""
    return bool(pg.execute(
        "SELECT to_regclass(%s) IS NOT NULL AND EXISTS (SELECT FROM pg_trigger WHERE tgname = 'run_owners_kept') "
        "AND EXISTS (SELECT FROM pg_constraint WHERE conname = 'progress_rate_checked')",
        (f"{NS}.progress_channel",)).fetchone()[0])


def _harden_in_place(pg: Any) -> str:
    """A version 3 database set up before its progress rows were checked: the checks, the
    channel and the bookkeeping triggers are added; nothing stored changes (progress rows
    already stored are not checked again: CHECK ... NOT VALID)."""
    import psycopg

    try:
        pg.execute(_progress_functions())
        pg.execute(_hardening_sql(existing=True))
        pg.execute(_progress_grants())
        pg.commit()
    except psycopg.Error as e:
        raise CentralError(f"cannot bring the central database up to date: {_first_line(e)}") from None
    return ("central database (version 3) brought up to date: progress rows are checked (finite numbers, names of "
            "their shape, the host's clock near the server's), progress wake-ups go to a channel only reviewers "
            "know, and run_owners and blob_usage are changed only by the push checks; nothing stored was changed")


def progress_channel(pg: Any) -> str:
    """The channel to LISTEN on for progress wake-ups (payload-free): its name is readable by
    reviewers (amdflash_read) and administrators only."""
    import psycopg

    try:
        row = pg.execute(f"SELECT name FROM {NS}.progress_channel").fetchone()
    except psycopg.Error as e:
        raise CentralError(f"cannot read the progress channel's name ({_first_line(e)}): listen as a reviewer "
                           f"login (in {READ_ROLE}); on a database set up before it, run 'amdflash fleet "
                           "central-setup URL' again") from None
    if row is None or not re.fullmatch(rf"{PROGRESS_CHANNEL}_[0-9a-f]{{32}}", row[0]):
        raise CentralError(f"the central database's progress channel is missing or malformed: {row!r}")
    return str(row[0])


def _self_test(pg: Any) -> None:
    """The server's Ed25519 check accepts a good signature and rejects a changed one."""
    from amdflash.store.keys import public_bytes
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    message = b"amdflash central self-test"
    good = pg.execute(f"SELECT {NS}.ed25519_verify(%s, %s, %s), {NS}.ed25519_verify(%s, %s, %s)",
                      (public_bytes(key), key.sign(message), message,
                       public_bytes(key), key.sign(message), message + b"!")).fetchone()
    if tuple(good) != (True, False):
        raise CentralError(f"the server's Ed25519 check does not work (answered {tuple(good)})")


def enroll(url: str, public_key: bytes, name: str, login: str | None = None, blob_quota: int | None = None) -> int:
    """Trust a host's public key under `name` and bind it to the one login that pushes for it
    (default: a role named like the host; made, LOGIN and in amdflash_push, if it does not
    exist — its password or other authentication is the administrator's to set). An
    administrator's act: the push role cannot do it. `blob_quota`: this host's, in bytes
    (default: the database's)."""
    login = login or name
    with connect(url) as pg:
        import psycopg
        from psycopg import sql

        _need_schema(pg)
        taken = pg.execute(f"SELECT name, login, public_key = %s FROM {NS}.hosts WHERE name = %s OR login = %s "
                           "OR public_key = %s", (public_key, name, login, public_key)).fetchone()
        if taken:
            what = ("this key" if taken[2] else f"host name {name!r}" if taken[0] == name else f"login {login!r}")
            raise CentralError(f"{what} is already enrolled (host {taken[0]}, login {taken[1]})")
        try:
            role = sql.Identifier(login)
            if pg.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (login,)).fetchone() is None:
                pg.execute(sql.SQL("CREATE ROLE {} LOGIN IN ROLE {}").format(role, sql.Identifier(PUSH_ROLE)))
            else:
                pg.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(PUSH_ROLE), role))
            row = pg.execute(f"INSERT INTO {NS}.hosts (public_key, name, login, blob_quota) VALUES (%s, %s, %s, %s) "
                             "RETURNING id", (public_key, name, login, blob_quota)).fetchone()
            pg.commit()
        except psycopg.Error as e:
            raise CentralError(f"cannot enrol the host: {_first_line(e)}") from None
    return int(row[0])


def need_schema(pg: Any) -> None:
    """CentralError unless the database holds this version of the central schema."""
    _need_schema(pg)


def _need_schema(pg: Any) -> None:
    if not installed(pg):
        raise CentralError("the central database is not set up: run 'amdflash fleet central-setup URL' "
                           "as its administrator first")
    version = pg.execute(f"SELECT value FROM {NS}.meta WHERE key = 'central_version'").fetchone()
    if version is None or version[0] != str(CENTRAL_VERSION):
        if version is not None and version[0] == "2":
            raise CentralError(f"the central database has version 2 of the central schema; this amdflash needs "
                               f"version {CENTRAL_VERSION} (live progress): its administrator upgrades it in place "
                               "with 'amdflash fleet central-setup URL' (adds a table, changes nothing stored)")
        raise CentralError(f"the central database has version {version[0] if version else '?'} of the central "
                           f"schema; this amdflash needs version {CENTRAL_VERSION} (host logins, per-host blobs, "
                           "live progress): set up a new central database with 'amdflash fleet central-setup'")


# -- push --------------------------------------------------------------------------------------

@dataclass
class PushReport:
    host: str = ""
    checkpoints: int = 0
    rows: int = 0
    blobs: int = 0
    blob_bytes: int = 0            # bytes of the blobs sent
    through: int = 0               # the host's last checkpoint now stored centrally
    held_back: int = 0             # rows after their run's last checkpoint: not sealed yet, not sent
    seconds: float = 0.0
    by_table: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        if not self.checkpoints:
            return (f"central database already holds host {self.host}'s trail through checkpoint #{self.through}: "
                    f"nothing to push ({self.seconds:.2f} s)")
        text = (f"pushed host {self.host}: {self.checkpoints} checkpoints, {self.rows} rows, {self.blobs} blobs "
                f"({self.blob_bytes / 1e6:.1f} MB) in {self.seconds:.2f} s; verified and stored by the central "
                f"database through checkpoint #{self.through}")
        if self.held_back:
            text += f"\n{self.held_back} row(s) of running runs are not sealed yet: the next push sends them"
        return text


def _signing_key(checkpoints: list[Checkpoint]) -> bytes:
    signers = {c.public_key for c in checkpoints}
    if len(signers) != 1:
        raise CentralError(f"this audit database's checkpoints are signed by {len(signers)} keys; a push sends the "
                           "trail of one host key")
    return signers.pop()


def push(local: sqlite3.Connection, url: str, batch_rows: int = 500_000) -> PushReport:
    """Send what the central database lacks of this trail: the checkpoints after the last one
    it holds for this host, the rows they seal and the blobs those rows refer to; in batches
    of whole checkpoints, each one transaction that the database verifies before it commits.
    Refuses (CentralError, nothing sent) when this trail contradicts what the central database
    already holds for the host: a checkpoint rewritten, or the tail it holds missing here."""
    started = time.perf_counter()
    report = PushReport()
    with connect(url) as pg:
        import psycopg

        _need_schema(pg)
        local.execute("BEGIN")      # one snapshot of the host's trail for the whole push
        try:
            every = load_checkpoints(local)
            if not every:
                raise CentralError("this audit database has no checkpoints: nothing to push")
            host_id, report.host = _own_host(pg, _signing_key(every))
            _refuse_contradiction(pg, host_id, report.host, every)
            while True:
                # Two pushes of one host (the timer's and the follow service's) take turns: the
                # second waits for the first's batch, then finds it stored.
                pg.execute("SELECT pg_advisory_xact_lock(%s::integer, %s::integer)", (_PUSH_LOCK, host_id))
                stored = pg.execute(f"SELECT coalesce(max(id), 0) FROM {NS}.own_checkpoints WHERE host_id = %s",
                                    (host_id,)).fetchone()[0]
                report.through = stored
                todo = [c for c in every if c.id > stored]
                if not todo:
                    pg.commit()
                    break
                if todo[0].id != stored + 1:
                    raise CentralError(f"the central database holds this host's checkpoints through #{stored}, and "
                                       f"this database's next is #{todo[0].id} (the ones between were archived "
                                       "away before they were pushed): not pushable")
                batch = _batch(every, todo, batch_rows)
                try:
                    _send(local, pg, host_id, every, batch, report)
                    pg.commit()
                except psycopg.Error as e:
                    pg.rollback()
                    raise CentralError(_first_line(e) + " — nothing of this batch was stored") from None
            report.held_back = _unsealed(local, every)
        finally:
            local.execute("COMMIT")
    report.seconds = time.perf_counter() - started
    return report


_PUSH_LOCK = 0x616D64   # the advisory lock class of pushes (with the host's id)


def _own_host(pg: Any, public: bytes) -> tuple[int, str]:
    """(id, name) of the host enrolled with this key, if this session may push for it."""
    from amdflash.store.keys import fingerprint

    row = pg.execute(f"SELECT id, name FROM {NS}.own_hosts WHERE public_key = %s", (public,)).fetchone()
    if row is None:
        login = pg.execute("SELECT session_user").fetchone()[0]
        raise CentralError(f"this trail's key {fingerprint(public)} is not enrolled in the central database as a host "
                           f"that login {login} may push or read: its administrator enrols the key and binds it to "
                           "this host's login ('amdflash fleet enroll --key FILE --name HOST --login LOGIN', FILE "
                           "from 'amdflash audit key')")
    return int(row[0]), str(row[1])


def _refuse_contradiction(pg: Any, host_id: int, host: str, every: list[Checkpoint]) -> None:
    """Refuse to push a trail that contradicts what the central database holds for the host.

    Each checkpoint's hash covers the one before it, so when the newest checkpoint stored
    centrally is here unchanged, so is everything before it: one row answers the common case.
    Otherwise every stored checkpoint is compared, to name the first that differs."""
    last = pg.execute(f"SELECT id, hash FROM {NS}.own_checkpoints WHERE host_id = %s ORDER BY id DESC LIMIT 1",
                      (host_id,)).fetchone()
    if last is None:
        return
    through, through_hash = archived_through(every)
    mine = {c.id: c.hash for c in every}
    ident, digest = int(last[0]), bytes(last[1])
    if mine.get(ident) == digest or (ident == through and through_hash == digest) or ident < through:
        return   # (archived before it was pushed: the push loop says so)
    found = compare(every, central_checkpoints(pg, host_id), host)
    if not found.ok:
        raise CentralError(f"refused: this trail contradicts the central record: {found.problem}; nothing was pushed")


def archived_through(checkpoints: list[Checkpoint]) -> tuple[int, bytes | None]:
    """(the last checkpoint `audit archive` took out of this database, its hash), or (0, None)."""
    seals = [c for c in checkpoints if c.kind == "archive"]
    if not seals:
        return 0, None
    info = json.loads(seals[-1].detail or "{}")
    return int(info["through_checkpoint"]), bytes.fromhex(info["through_hash"])


def central_checkpoints(pg: Any, host_id: int) -> list[tuple[int, bytes, str]]:
    """(id, hash, when it was pushed) of every checkpoint the central database holds for the host."""
    return [(int(i), bytes(h), str(at)) for i, h, at in pg.execute(
        f"SELECT id, hash, pushed_at::text FROM {NS}.own_checkpoints WHERE host_id = %s ORDER BY id", (host_id,))]


@dataclass
class Comparison:
    """This trail against what the central database holds for its host (the off-host anchor)."""

    host: str
    problem: str | None = None     # the first contradiction, naming its checkpoint
    first: int | None = None       # the first checkpoint that differs or is missing here
    matched: int = 0               # central checkpoints that this database holds unchanged (or archived)
    central_last: int = 0          # the newest checkpoint central holds for the host
    unpushed: int = 0              # checkpoints here after it: not pushed yet

    @property
    def ok(self) -> bool:
        return self.problem is None

    def describe(self, where: str) -> str:
        if not self.ok:
            return f"audit chain BROKEN against the central record ({where}): {self.problem}"
        if not self.central_last:
            return (f"central     {where}: holds no checkpoint of host {self.host} yet (nothing to compare); "
                    f"{self.unpushed} checkpoint(s) here not pushed yet")
        return (f"central     {where}: host {self.host}'s checkpoints 1..#{self.central_last} as pushed "
                f"({self.matched} compared) are all in this database unchanged; {self.unpushed} newer checkpoint(s) "
                "here not pushed yet")


def compare(local: list[Checkpoint], central: list[tuple[int, bytes, str]], host: str) -> Comparison:
    """Every checkpoint central holds for the host must be in this database unchanged (a
    checkpoint `audit archive` took away: its seal's hash of the last one archived); the
    first that is not is named. Checkpoints here after central's newest are not pushed yet."""
    found = Comparison(host, central_last=central[-1][0] if central else 0)
    mine = {c.id: c.hash for c in local}
    through, through_hash = archived_through(local)
    last_here = max(mine, default=through)
    for ident, digest, pushed in central:
        if ident < through:
            found.matched += 1            # archived here; the seal vouches for them through #through
            continue
        here = mine.get(ident, through_hash if ident == through else None)
        if here == digest:
            found.matched += 1
            continue
        found.first = ident
        if here is not None:
            found.problem = (f"checkpoint #{ident} differs from the one the central database holds for host {host} "
                             f"(pushed {pushed}): this trail was rewritten after it was pushed")
        elif ident > last_here:
            found.problem = (f"the central database holds host {host}'s checkpoints through #{found.central_last} "
                             f"and this database's last is #{last_here}: checkpoint #{ident} (pushed {pushed}) and "
                             "the ones after it are missing here: its tail was cut, or it was rolled back to an "
                             "older copy")
        else:
            found.problem = (f"checkpoint #{ident}, which the central database holds for host {host} (pushed "
                             f"{pushed}), is missing from this database: it was removed")
        return found
    found.unpushed = sum(1 for ident in mine if ident > found.central_last)
    return found


def verify_against(local: sqlite3.Connection, url: str, host_key: bytes | None = None) -> Comparison:
    """Compare this trail's every checkpoint with what the central database holds for its host
    (the host its checkpoints' key is enrolled as; for a trail with none, `host_key`'s)."""
    local.execute("BEGIN")
    try:
        every = load_checkpoints(local)
    finally:
        local.execute("COMMIT")
    public = _signing_key(every) if every else host_key
    if public is None:
        raise CentralError("this audit database has no checkpoints and there is no host key to name its host: "
                           "nothing to compare")
    with connect(url) as pg:
        _need_schema(pg)
        host_id, host = _own_host(pg, public)
        return compare(every, central_checkpoints(pg, host_id), host)


def _batch(every: list[Checkpoint], todo: list[Checkpoint], batch_rows: int) -> list[Checkpoint]:
    """The next checkpoints to send together: at least one, about `batch_rows` rows at most."""
    rows_before: dict[Any, int] = {}
    for c in every:
        if c.id >= todo[0].id:
            break
        if c.kind in RUN_KINDS:
            rows_before[c.run] = c.rows or 0
    out: list[Checkpoint] = []
    total = 0
    for c in todo:
        n = (c.rows or 0) - rows_before.get(c.run, 0) if c.kind in RUN_KINDS else 0
        if out and total + n > batch_rows:
            break
        if c.kind in RUN_KINDS:
            rows_before[c.run] = c.rows or 0
        out.append(c)
        total += n
    return out


def _spans(every: list[Checkpoint], batch: list[Checkpoint], run_keys: dict[str, int]) -> list[tuple]:
    """(run key, run_id, first seq, last seq) of the spans that the batch's checkpoints seal."""
    last: dict[Any, Any] = {}
    spans = []
    wanted = {c.id for c in batch}
    for c in every:
        if c.kind not in RUN_KINDS:
            continue
        lo = last.get(c.run, run_keys.get(c.run_id or "", c.run))
        if c.id in wanted:
            spans.append((c.run, c.run_id, lo, c.last_seq))
        last[c.run] = (c.last_seq or 0) + 1
    return spans


def _send(local: sqlite3.Connection, pg: Any, host_id: int, every: list[Checkpoint], batch: list[Checkpoint],
          report: PushReport) -> None:
    run_keys = dict(local.execute("SELECT run_id, seq FROM runs").fetchall())
    spans = _spans(every, batch, run_keys)
    local.execute("CREATE TEMP TABLE IF NOT EXISTS _push (run INTEGER, run_id TEXT, lo INTEGER, hi INTEGER)")
    local.execute("DELETE FROM _push")
    local.executemany("INSERT INTO _push VALUES (?, ?, ?, ?)", spans)
    # Rows come out of SQLite as they are sent: the host's central id first, blob references
    # already replaced by the blobs' SHA-256 (SQLite does the joins).
    rows: dict[str, list[tuple]] = {}
    referenced = []
    for table, columns in PHYSICAL.items():
        names = ", ".join(f"b_{c}.sha256" if k == "ref" else f"p.{c}" for c, k in columns)
        joins = "".join(f" LEFT JOIN blobs b_{c} ON b_{c}.id = p.{c}" for c, k in columns if k == "ref")
        on = ("p.run_id = s.run_id AND p.seq BETWEEN s.lo AND s.hi" if table in PLAIN
              else "p.seq BETWEEN s.lo AND s.hi AND +p.run = s.run")
        spans_rows = f"FROM _push s CROSS JOIN {table} p ON {on}"
        rows[table] = local.execute(f"SELECT {host_id}, p.seq, {names} {spans_rows}{joins} ORDER BY p.seq").fetchall()
        referenced += [f"SELECT p.{c} {spans_rows}" for c, k in columns if k == "ref"]
    blobs: list[tuple[int, bytes, bytes]] = []
    if referenced:
        local_blobs = local.execute(f"SELECT sha256, data FROM blobs WHERE id IN ({' UNION '.join(referenced)})"
                                    ).fetchall()
        have = {bytes(r[0]) for r in pg.execute(f"SELECT sha256 FROM {NS}.own_blobs WHERE host_id = %s AND "
                                                "sha256 = ANY(%s)", (host_id, [s for s, _ in local_blobs]))}
        blobs = [(host_id, s, d) for s, d in local_blobs if s not in have]
    with pg.cursor() as cur:
        if blobs:
            with cur.copy(f"COPY {NS}.blobs (host_id, sha256, data) FROM STDIN (FORMAT BINARY)") as copy:
                copy.set_types(["int4", "bytea", "bytea"])
                for b in blobs:
                    copy.write_row(b)
            report.blobs += len(blobs)
            report.blob_bytes += sum(len(d) for _, _, d in blobs)
        with cur.copy(f"COPY {NS}.checkpoints (host_id, id, kind, run, run_id, rows, last_seq, head, at, detail, "
                      "hash, sig, pushed_in, pushed_by) FROM STDIN") as copy:
            for c in batch:
                # pushed_in/pushed_by are set by the database itself (its trigger overrides these).
                copy.write_row((host_id, c.id, c.kind, c.run, c.run_id, c.rows, c.last_seq, c.head, c.at, c.detail,
                                c.hash, c.sig, 0, ""))
        for table, columns in PHYSICAL.items():
            found = rows[table]
            if not found:
                continue
            names = ", ".join(_q(c) for c, _ in columns)
            with cur.copy(f"COPY {NS}.{table} (host_id, seq, {names}) FROM STDIN (FORMAT BINARY)") as copy:
                copy.set_types(["int4", "int8", *(_PG_TYPES[k] for _, k in columns)])
                for r in found:
                    copy.write_row(r)
            report.rows += len(found)
            report.by_table[table] = report.by_table.get(table, 0) + len(found)
        cur.execute("SET CONSTRAINTS ALL IMMEDIATE")     # the span checks, now rather than at COMMIT
    report.checkpoints += len(batch)
    report.through = batch[-1].id


def _unsealed(local: sqlite3.Connection, every: list[Checkpoint]) -> int:
    """Rows recorded after their run's last checkpoint (a run still being written)."""
    ends = {}
    for c in every:
        if c.kind in RUN_KINDS:
            ends[c.run] = (c.kind, c.last_seq)
    runs = dict(local.execute("SELECT seq, run_id FROM runs").fetchall())
    n = 0
    for key, run_id in runs.items():
        kind, last = ends.get(key, (None, key - 1))
        if kind == "final":
            continue
        for table in PHYSICAL:
            column, value = ("run_id", run_id) if table in PLAIN else ("run", key)
            n += local.execute(f"SELECT count(*) FROM {table} WHERE seq > ? AND +{column} = ?",
                               (last, value)).fetchone()[0]
    return n


# -- live progress (advisory) ------------------------------------------------------------------

PROGRESS_COLUMNS = ("run_id", "state", "command", "board", "place", "stage", "bytes_done", "bytes_total", "rate",
                    "eta", "error", "image_sha256", "resumes", "started", "at")


def host_for_trail(pg: Any, db: str | None, host_key: bytes | None = None) -> tuple[int, str]:
    """(id, name) of the enrolled host whose key signs this trail (for a trail with no checkpoint
    yet, or none at all, `host_key`'s), if this session may push for it."""
    from amdflash.store import schema as host_schema

    row = None
    if db is not None:
        local = host_schema.connect(db, readonly=True)
        try:
            row = local.execute("SELECT h.public_key FROM checkpoints c JOIN hosts h ON h.id = c.host "
                                "ORDER BY c.id DESC LIMIT 1").fetchone()
        finally:
            local.close()
    public = bytes(row[0]) if row else host_key
    if public is None:
        raise CentralError("this audit database has no checkpoints and there is no host key to name its host")
    return _own_host(pg, public)


def publishable(row: dict[str, Any]) -> dict[str, Any]:
    """The row with each value the database would refuse (a number not finite or out of
    bounds, a name not of its shape) left out, so that one odd value of the host's — a place
    named after an unusual host name — costs that value, not the whole batch of rows."""
    out = dict(row)
    for column, bound in PROGRESS_BOUNDS.items():
        value = out.get(column)
        if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value)
                                      and 0 <= value <= bound):
            out[column] = None
    for column, shape in PROGRESS_SHAPES.items():
        value = out.get(column)
        if value is not None and not (isinstance(value, str) and re.search(shape, value)):
            out[column] = None
    for column, longest in PROGRESS_LENGTHS.items():
        value = out.get(column)
        if isinstance(value, str) and len(value) > longest:
            out[column] = value[:longest - 1] + "…" if column == "error" else None
    return out


def publish_progress(pg: Any, host_id: int, rows: list[dict[str, Any]], checkpoint: int | None) -> None:
    """Insert progress rows for the host (one statement: one NOTIFY); the database checks that
    this login may speak for the host, and stamps each row's arrival and sender itself."""
    if not rows:
        return
    rows = [publishable(r) for r in rows]
    names = ", ".join(PROGRESS_COLUMNS)
    one = "(" + ", ".join(["%s"] * (len(PROGRESS_COLUMNS) + 2)) + ", 0, now(), '')"
    values = [v for r in rows for v in (host_id, checkpoint, *(r.get(c) for c in PROGRESS_COLUMNS))]
    # id, received_at, sent_by: set by the database's trigger (whatever a client sends)
    pg.execute(f"INSERT INTO {NS}.progress (host_id, checkpoint, {names}, id, received_at, sent_by) "
               f"VALUES {', '.join([one] * len(rows))}", values)


def published_ends(pg: Any, host_id: int, run_ids: list[str]) -> set[str]:
    """The runs among `run_ids` whose end the host has already published."""
    return {r for (r,) in pg.execute(f"SELECT DISTINCT run_id FROM {NS}.own_progress WHERE host_id = %s AND "
                                     "run_id = ANY(%s) AND state NOT IN ('running', 'alive')", (host_id, run_ids))}


# -- reading -----------------------------------------------------------------------------------

def runs(url: str, host: str | None = None) -> list[dict[str, Any]]:
    """Every run of every host (or of `host`), in the row shape of the local `runs`
    (store.queries.runs), with the host's enrolled name added. A run's status is the one the
    host's own `runs` shows (store.status.run_status: resumed and never ended is interrupted),
    and so are its reason and the resume that fixed it (store.queries.fixed_by, per host: a
    run resumes a run of its own host)."""
    from amdflash.store.queries import fixed_by

    with connect(url) as pg:
        _need_schema(pg)
        rows = select_runs(pg, host=host)
    of_host: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        r["reason"] = r["reason"] if r["status"] != "succeeded" else None
        of_host.setdefault(r.pop("host_id"), []).append(r)
    for host_rows in of_host.values():
        fixed = fixed_by(host_rows)
        for r in host_rows:
            r["fixed_by"] = fixed.get(r["run_id"])
    return rows


def select_runs(pg: Any, host: str | None = None, board: str | None = None, since: str | None = None,
                until: str | None = None, limit: int | None = None, newest_first: bool = False,
                host_id: int | None = None, run_ids: list[str] | None = None) -> list[dict[str, Any]]:
    """Runs of the signed record (filters: host name or id, board spec or unique ID substring,
    start time from `since` and before `until`, given run ids), each with its status as
    store.status.run_status decides it, its last status row's detail (`reason`) and its host's
    id and name."""
    from amdflash.store.status import ENDS, PROCESS_STAGE, run_status

    where = ["(%(host)s::text IS NULL OR h.name = %(host)s)", "(%(host_id)s::int IS NULL OR r.host_id = %(host_id)s)",
             "(%(since)s::text IS NULL OR r.at >= %(since)s)", "(%(until)s::text IS NULL OR r.at < %(until)s)",
             "(%(run_ids)s::text[] IS NULL OR r.run_id = ANY(%(run_ids)s))",
             "(%(board)s::text IS NULL OR strpos(r.board_spec, %(board)s) > 0 OR strpos(b.unique_id, %(board)s) > 0)"]
    cur = pg.execute(f"""
        SELECT r.run_id, r.command, r.board_spec, r.at AS started, r.image_sha256, r.resumes_run_id,
               s.status, s.at AS updated, s.detail AS reason, b.unique_id, b.emulated, h.name AS host, r.host_id,
               r.machine_id, CASE WHEN s.status IN ({", ".join(f"'{e}'" for e in ENDS)}) THEN NULL ELSE
                 (SELECT p.detail FROM {NS}.stages p WHERE p.host_id = r.host_id AND p.run_id = r.run_id
                  AND p.stage = '{PROCESS_STAGE}' ORDER BY p.seq LIMIT 1) END AS process,
               EXISTS (SELECT 1 FROM {NS}.runs x WHERE x.host_id = r.host_id AND x.resumes_run_id = r.run_id)
                   AS resumed,
               EXISTS (SELECT 1 FROM {NS}.checkpoints c WHERE c.host_id = r.host_id AND c.run_id = r.run_id
                       AND c.kind = '{LEGACY}') AS legacy
        FROM {NS}.runs r JOIN {NS}.hosts h ON h.id = r.host_id
        LEFT JOIN LATERAL (SELECT status, at, detail FROM {NS}.run_status s WHERE s.host_id = r.host_id
                           AND s.run_id = r.run_id ORDER BY s.seq DESC LIMIT 1) s ON true
        LEFT JOIN LATERAL (SELECT unique_id, emulated FROM {NS}.boards b WHERE b.host_id = r.host_id
                           AND b.run_id = r.run_id ORDER BY b.seq LIMIT 1) b ON true
        WHERE {" AND ".join(where)}
        ORDER BY r.at {"DESC" if newest_first else ""}, h.name, r.seq {"DESC" if newest_first else ""}
        {"LIMIT %(limit)s" if limit else ""}""",
                     {"host": host, "host_id": host_id, "since": since, "until": until, "board": board,
                      "run_ids": run_ids, "limit": limit})
    names = [d.name for d in cur.description]
    rows = [dict(zip(names, row, strict=True)) for row in cur]
    for r in rows:
        # As the host's own `runs` decides (and `fleet report`, through it): the process a run with
        # no end recorded can be seen only on its own machine; elsewhere it runs until resumed.
        r["status"] = run_status(r["status"], bool(r.pop("resumed")), r.pop("process"), r.pop("machine_id"))
    return rows


def image_parts(pg: Any, runs: list[tuple[int, str]]) -> dict[tuple[int, str], str]:
    """{(host id, run id): the image's VBIOS part number} as each run's part check recorded it."""
    if not runs:
        return {}
    found: dict[tuple[int, str], str] = {}
    for host_id, run_id, detail in pg.execute(
            f"SELECT host_id, run_id, detail FROM {NS}.stages WHERE stage = 'part_number' AND "
            "(host_id, run_id) IN (SELECT * FROM unnest(%s::int[], %s::text[])) ORDER BY seq",
            ([h for h, _ in runs], [r for _, r in runs])):
        try:
            part = json.loads(detail or "{}").get("image_part")
        except (ValueError, AttributeError):
            continue
        if isinstance(part, str) and (host_id, run_id) not in found:
            found[(host_id, run_id)] = part
    return found


def shown_url(url: str) -> str:
    """The central database for a message: its URL without a password."""
    return re.sub(r"(://[^:/@]*):[^@/]*@", r"\1@", url)


def not_a_reader(pg: Any) -> str | None:
    """Why this session is not a read-only reviewer (a login in amdflash_read that may write
    nothing), or None."""
    user, superuser, reads, writes = pg.execute(
        f"SELECT session_user, r.rolsuper, pg_has_role(session_user, '{READ_ROLE}', 'MEMBER'), "
        f"has_table_privilege('{NS}.checkpoints', 'INSERT') OR has_table_privilege('{NS}.progress', 'INSERT') "
        "FROM pg_roles r WHERE r.rolname = session_user").fetchone()
    if superuser:
        return f"login {user} is a superuser"
    if writes:
        return f"login {user} may insert into the record (it is a push login)"
    if not reads:
        return f"login {user} is not in {READ_ROLE}"
    return None


def line_progress(pg: Any, hours: float) -> list[dict[str, Any]]:
    """The newest progress row of every board that said anything in the last `hours`."""
    cur = pg.execute(f"""
        SELECT DISTINCT ON (p.host_id, coalesce(p.board, p.run_id)) p.*, h.name AS host
        FROM {NS}.progress p JOIN {NS}.hosts h ON h.id = p.host_id
        WHERE p.received_at > now() - make_interval(secs => %s) AND p.run_id IS NOT NULL
        ORDER BY p.host_id, coalesce(p.board, p.run_id), p.id DESC""", (hours * 3600,))
    names = [d.name for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur]


def progress_after(pg: Any, last_id: int, limit: int = 20000) -> list[dict[str, Any]]:
    """Progress rows newer than `last_id` (every host's, oldest first)."""
    cur = pg.execute(f"SELECT p.*, h.name AS host FROM {NS}.progress p JOIN {NS}.hosts h ON h.id = p.host_id "
                     "WHERE p.id > %s ORDER BY p.id LIMIT %s", (last_id, limit))
    names = [d.name for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur]


def last_progress_id(pg: Any) -> int:
    return int(pg.execute(f"SELECT coalesce(max(id), 0) FROM {NS}.progress").fetchone()[0])


def signed_status(pg: Any, runs: list[tuple[int, str]]) -> dict[tuple[int, str], str]:
    """{(host id, run id): status} of the given runs that the signed record holds (the status
    every view shows, store.status.run_status); a run not pushed yet is not in it."""
    if not runs:
        return {}
    from amdflash.store.status import run_status

    hosts, ids = [h for h, _ in runs], [r for _, r in runs]
    resumed = {(h, r) for h, r in pg.execute(
        f"SELECT DISTINCT host_id, resumes_run_id FROM {NS}.runs WHERE (host_id, resumes_run_id) IN "
        "(SELECT * FROM unnest(%s::int[], %s::text[]))", (hosts, ids))}
    out = {}
    for host_id, run_id, status in pg.execute(f"""
            SELECT r.host_id, r.run_id, (SELECT status FROM {NS}.run_status s WHERE s.host_id = r.host_id
                                         AND s.run_id = r.run_id ORDER BY s.seq DESC LIMIT 1)
            FROM {NS}.runs r WHERE (r.host_id, r.run_id) IN (SELECT * FROM unnest(%s::int[], %s::text[]))""",
                                          (hosts, ids)):
        out[(host_id, run_id)] = run_status(status, (host_id, run_id) in resumed)
    return out


def hosts_health(pg: Any) -> list[dict[str, Any]]:
    """Per enrolled host: its newest checkpoint in the record and when it was pushed, its newest
    progress row (when, and the newest checkpoint the host said it had then)."""
    cur = pg.execute(f"""
        SELECT h.id, h.name, c.id AS checkpoint, c.pushed_at, c.kind, p.received_at AS last_heard,
               p.checkpoint AS host_checkpoint, p.state AS last_state,
               (SELECT count(*) FROM {NS}.checkpoints x WHERE x.host_id = h.id) AS checkpoints
        FROM {NS}.hosts h
        LEFT JOIN LATERAL (SELECT id, pushed_at, kind FROM {NS}.checkpoints c WHERE c.host_id = h.id
                           ORDER BY c.id DESC LIMIT 1) c ON true
        LEFT JOIN LATERAL (SELECT received_at, checkpoint, state FROM {NS}.progress p WHERE p.host_id = h.id
                           ORDER BY p.id DESC LIMIT 1) p ON true
        ORDER BY h.name""")
    names = [d.name for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur]


def line_totals(pg: Any) -> dict[str, Any]:
    """Sums over the signed record for metrics: bytes programmed and read disagreements per host."""
    written = dict(pg.execute(f"SELECT h.name, coalesce(sum(u.size), 0) FROM {NS}.hosts h LEFT JOIN {NS}.log_units u "
                              "ON u.host_id = h.id AND u.state = 'programmed' GROUP BY h.name").fetchall())
    disagreements = dict(pg.execute(f"SELECT h.name, count(d.seq) FROM {NS}.hosts h LEFT JOIN "
                                    f"{NS}.log_disagreements d ON d.host_id = h.id GROUP BY h.name").fetchall())
    return {"bytes_written": written, "read_disagreements": disagreements}


class AmbiguousRun(CentralError):
    """A run named by an ID or prefix that runs of several hosts match."""


def split_run(name: str, host: str | None = None) -> tuple[str | None, str]:
    """(host, run id or prefix) from `HOST/RUN` or `RUN` (with `--host HOST`)."""
    if "/" in name:
        named, _, name = name.partition("/")
        if host is not None and host != named:
            raise AmbiguousRun(f"run {named}/{name} names host {named}, and --host says {host}")
        host = named
    return host, name


def resolve(pg: Any, run_id: str, host: str | None = None) -> tuple[int, str, int]:
    """(host id, run id, run key) of a run named by a unique prefix (`HOST/RUN`, or `host`)."""
    host, run_id = split_run(run_id, host)
    found = pg.execute(f"SELECT r.host_id, r.run_id, r.seq, h.name FROM {NS}.runs r JOIN {NS}.hosts h "
                       "ON h.id = r.host_id WHERE left(r.run_id, %s) = %s AND (%s::text IS NULL OR h.name = %s) "
                       "ORDER BY r.run_id, h.name", (len(run_id), run_id, host, host)).fetchall()
    exact = [r for r in found if r[1] == run_id]
    if exact:
        found = exact
    where = f" of host {host}" if host else ""
    if not found:
        raise CentralError(f"no run {run_id!r}{where} in the central database")
    if len(found) > 1:
        hosts = sorted({r[3] for r in found})
        if len(hosts) > 1:
            raise AmbiguousRun(f"run id {run_id!r} matches runs of hosts {', '.join(hosts)} in the central "
                               f"database: name one as HOST/RUN (e.g. {hosts[0]}/{found[0][1]}) or with --host")
        raise AmbiguousRun(f"run id {run_id!r} is ambiguous{where} in the central database ({len(found)} runs match)")
    return found[0][:3]


# Tables copied whole for the run's host: the report follows resumes and their outcome.
_HOST_WIDE = ("runs", "run_status", "boards")


def _related(run_id: str, runs: list[dict[str, Any]], boards: list[dict[str, Any]]) -> dict[str, int]:
    """{run id: run key} of the runs a report of `run_id` reads whole, each of which must verify
    as on the host: the run, the runs linked to it by resumes (those it resumes, those that
    resume it, and so on: its status, fixed-by and backup come from them), and the flashes of
    its board (store.originals finds the board's original among their backups)."""
    from amdflash.store.originals import WRITES, BoardKey

    key_of = {r["run_id"]: r["seq"] for r in runs}
    linked: dict[str, set[str]] = {}
    for r in runs:
        if r["resumes_run_id"]:
            linked.setdefault(r["run_id"], set()).add(r["resumes_run_id"])
            linked.setdefault(r["resumes_run_id"], set()).add(r["run_id"])
    found, todo = {run_id}, [run_id]
    while todo:
        for other in linked.get(todo.pop(), ()):
            if other not in found and other in key_of:
                found.add(other)
                todo.append(other)
    # The board as store.originals knows it across runs: by its flash's unique ID and chip, else its spec.
    mine = next((b for b in boards if b["run_id"] == run_id and b["chip"]), None)
    spec = next(r["board_spec"] for r in runs if r["run_id"] == run_id)
    board = BoardKey(mine["unique_id"] or "", mine["chip"] or "", spec) if mine else None
    if board is not None and board.by_uid:
        same = {b["run_id"] for b in boards if (b["unique_id"], b["chip"]) == (board.unique_id, board.chip)}
    else:
        same = {r["run_id"] for r in runs if r["board_spec"] == spec}
    found |= {r["run_id"] for r in runs if r["run_id"] in same and r["command"] in WRITES}
    return {r: key_of[r] for r in sorted(found, key=key_of.__getitem__)}


def materialize(url: str, run_id: str, path: Path, host: str | None = None) -> str:
    """Copy one run — its rows, blobs and checkpoints (with the one before each, which its hash
    chains to) and the host's run list — from the central database into a new SQLite audit
    database at `path`, in the host's own schema, so the local report code reads it as it reads
    a host's trail (and checks the run's chain and signatures again). The runs the report
    speaks of are copied whole with it (_related: its resumes and the runs they resume, and the
    board's flashes, whose backups hold its original), so each verifies as it does on the host.
    Returns the run id."""
    with connect(url) as pg:
        _need_schema(pg)
        host_id, run_id, _ = resolve(pg, run_id, host)
        local = schema.connect(str(path))
        try:
            local.execute("BEGIN")
            schema.create(local)
            public, name, enrolled = pg.execute(f"SELECT public_key, name, enrolled_at::text FROM {NS}.hosts "
                                                "WHERE id = %s", (host_id,)).fetchone()
            local.execute("INSERT INTO hosts (id, public_key, hostname, first_seen) VALUES (?, ?, ?, ?)",
                          (host_id, public, name, enrolled))
            blob_ids: dict[bytes, int] = {}
            last_seq = 0
            copied: dict[str, list[dict[str, Any]]] = {}
            keys: dict[str, int] = {}
            for table, columns in PHYSICAL.items():     # the host-wide tables come first
                names = ", ".join(_q(c) for c, _ in columns)
                args: tuple[Any, ...]
                if table not in _HOST_WIDE and not keys:
                    keys = _related(run_id, copied["runs"], copied["boards"])
                if table in _HOST_WIDE:
                    where, args = "host_id = %s", (host_id,)
                elif table in PLAIN:
                    where, args = "host_id = %s AND run_id = ANY(%s)", (host_id, list(keys))
                else:
                    where, args = ("host_id = %s AND run = ANY(%s) AND seq >= %s",
                                   (host_id, list(keys.values()), min(keys.values())))
                found = pg.execute(f"SELECT seq, {names} FROM {NS}.{table} WHERE {where} ORDER BY seq", args).fetchall()
                if table in _HOST_WIDE:
                    copied[table] = [dict(zip(["seq", *(c for c, _ in columns)], r, strict=True)) for r in found]
                refs = [i for i, (_, k) in enumerate(columns, 1) if k == "ref"]
                out = []
                for r in found:
                    r = list(r)
                    for i in refs:
                        if r[i] is not None:
                            r[i] = blob_ids.setdefault(bytes(r[i]), len(blob_ids) + 1)
                    out.append(r)
                    last_seq = max(last_seq, r[0])
                marks = ", ".join("?" * (len(columns) + 1))
                local.executemany(f"INSERT INTO {table} (seq, {names}) VALUES ({marks})", out)
            if blob_ids:
                data = dict(pg.execute(f"SELECT sha256, data FROM {NS}.blobs WHERE host_id = %s AND sha256 = ANY(%s)",
                                       (host_id, list(blob_ids))).fetchall())
                local.executemany("INSERT INTO blobs (id, sha256, data) VALUES (?, ?, ?)",
                                  ((i, sha, data.get(sha)) for sha, i in blob_ids.items()))
            cps = pg.execute(f"""
                SELECT c.id, c.kind, c.run, c.run_id, c.rows, c.last_seq, c.head, c.at, c.detail, c.hash, c.sig
                FROM {NS}.checkpoints c WHERE c.host_id = %s AND (c.run = ANY(%s) OR c.id + 1 IN
                    (SELECT id FROM {NS}.checkpoints WHERE host_id = %s AND run = ANY(%s))) ORDER BY c.id""",
                             (host_id, list(keys.values()), host_id, list(keys.values()))).fetchall()
            local.executemany("INSERT INTO checkpoints (id, kind, run, run_id, rows, last_seq, head, host, at, detail, "
                              "hash, sig) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                              [(*c[:7], host_id, *c[7:]) for c in cps])
            if cps:
                local.execute("UPDATE chain_head SET seq = ?, checkpoint = ?, hash = ? WHERE id = 1",
                              (max(last_seq, cps[-1][5] or 0), cps[-1][0], cps[-1][9]))
            local.execute("COMMIT")
        finally:
            local.close()
    return run_id
