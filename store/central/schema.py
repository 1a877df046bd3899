"""The central record's schema: its tables and the checks that run inside the database (DDL),
the roles, `fleet central-setup` (and its upgrade in place), host enrolment, and connecting.
What the checks enforce is told in store.central's docstring."""
from __future__ import annotations

import re
from typing import Any

from amdflash.store import schema as host_schema
from amdflash.store.schema import PHYSICAL, PLAIN
from amdflash.store.central.bounds import CONTROLS, NO_CONTROLS, OWNER_ROLE, bounds_sql, guard_sql, owner_sql
from amdflash.store.central.tlog_mirror import version_5_sql

NS = "amdflash"                       # the PostgreSQL schema holding everything
CENTRAL_VERSION = 5
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
# Text a host writes holds no control or format character (Unicode Cc and Cf: C0, C1, bidi
# overrides, zero-width; bounds.CONTROLS), since schema version 4.
PROGRESS_SHAPES = {
    "run_id": RUN_ID_SHAPE, "resumes": RUN_ID_SHAPE, "place": PLACE_SHAPE,
    "board": rf"\A(sim|usb|pci):[^{CONTROLS}]+\Z",                # a board spec
    "command": r"\A[a-z][a-z0-9_-]{0,39}\Z", "stage": NO_CONTROLS, "error": NO_CONTROLS,
    "image_sha256": r"\A[0-9a-f]{64}\Z",
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
PG_TYPES = {"int": "bigint", "text": "text", "blob": "bytea", "ref": "bytea"}


class CentralError(RuntimeError):
    """The central database refused, or cannot be used (one line, for the user)."""


# The checks run as the administrator who set the database up (push logins may not read the
# tables they check against), with a search path nobody else can add to.
_DEFINER = "SECURITY DEFINER SET search_path = pg_catalog, pg_temp"


def quoted(column: str) -> str:
    """A column name quoted for PostgreSQL (`offset` is a reserved word there)."""
    return f'"{column}"'


def _pg_field(column: str, kind: str) -> str:
    """SQL: a column's canonical JSON text, exactly as store/chain.py writes it."""
    c = f"p.{quoted(column)}"
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
        cols = ", ".join(f"{quoted(c)} {PG_TYPES[k]}" for c, k in columns)
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
    missing = " OR ".join(f"(n.{quoted(c)} IS NOT NULL AND NOT EXISTS "
                          f"(SELECT 1 FROM {NS}.blobs b WHERE b.host_id = n.host_id "
                          f"AND b.sha256 = n.{quoted(c)}))" for c in refs)
    # Each blob named once (a flash names its few thousand blobs tens of thousands of times):
    # one lookup per distinct blob; the rows are read one by one only to name the first bad one.
    named = " UNION ".join(f"SELECT n.host_id, n.{quoted(c)} AS sha256 FROM new_rows n WHERE n.{quoted(c)} IS NOT NULL"
                           for c in refs)
    blobs_check = f"""PERFORM FROM ({named}) r WHERE NOT EXISTS
            (SELECT 1 FROM {NS}.blobs b WHERE b.host_id = r.host_id AND b.sha256 = r.sha256) LIMIT 1;
        IF FOUND THEN
            SELECT n.seq, n.host_id INTO bad FROM new_rows n WHERE {missing} ORDER BY n.seq LIMIT 1;
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
CREATE OR REPLACE FUNCTION {NS}.sealed_{table}() RETURNS trigger LANGUAGE plpgsql {_DEFINER} AS $fn$
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
"""


def _sealed_trigger(table: str) -> str:
    return f"""{_sealed_function(table)}
CREATE TRIGGER {table}_sealed AFTER INSERT ON {NS}.{table} REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {NS}.sealed_{table}();
"""


def refreshed_checks_sql() -> str:
    """The row checks whose text changed within version 4 without changing what they accept
    (the sealed_* blob lookups made once per distinct blob: issue 42), made again in place by
    `central-setup` on a database of version 4 (CREATE OR REPLACE keeps owner and grants)."""
    return "".join(_sealed_function(t) for t in PHYSICAL)


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
                            ('host_schema_version', '{host_schema.SCHEMA_VERSION}');
CREATE TABLE {NS}.hosts (id serial PRIMARY KEY, public_key bytea NOT NULL UNIQUE CHECK (length(public_key) = 32),
                         name text NOT NULL UNIQUE, login text NOT NULL UNIQUE,
                         blob_quota bigint CHECK (blob_quota >= 0),
                         enrolled_at timestamptz NOT NULL DEFAULT now(),
                         enrolled_by text NOT NULL DEFAULT current_user);
-- Blobs are kept per host: a host's rows refer to its own copy, its quota counts them, and
-- no push can learn from the dedup whether another host holds some bytes.
CREATE TABLE {NS}.blobs (host_id integer NOT NULL, sha256 bytea NOT NULL, data bytea NOT NULL,
                         PRIMARY KEY (host_id, sha256));
-- Bookkeeping, not record: the bytes of each host's blobs (for its quota). (A run is named by
-- its host and its run ID: each host's run IDs are its own, so no host can take another's.)
CREATE TABLE {NS}.blob_usage (host_id integer PRIMARY KEY, bytes bigint NOT NULL);
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
{"".join(_sealed_trigger(t) for t in PHYSICAL)}
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
    VALID, which checks every new row and leaves the stored ones) and the secret NOTIFY channel.
    (The bookkeeping tables' guard and the progress bounds: _version_4_sql.)"""
    not_valid = " NOT VALID" if existing else ""
    # Idempotent (whatever part a database already has is made again): DROP ... IF EXISTS first.
    constraints = ",\n".join(f"    DROP CONSTRAINT IF EXISTS progress_{c}_checked,\n"
                              f"    ADD CONSTRAINT progress_{c}_checked CHECK ({check}){not_valid}"
                              for c, check in _progress_checks().items())
    triggers = [("progress_channel", "insert_only", "UPDATE OR DELETE", "ROW", "refuse_change")]
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
ALTER TABLE {NS}.blob_usage DROP CONSTRAINT IF EXISTS blob_usage_bytes_checked,
    ADD CONSTRAINT blob_usage_bytes_checked CHECK (bytes >= 0){not_valid};
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
    everything = f"{data}, {NS}.hosts, {NS}.blob_usage"
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
        why = first_line(e)
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


def first_line(e: BaseException) -> str:
    text = (getattr(getattr(e, "diag", None), "message_primary", None) or str(e)).strip()
    return text.splitlines()[0] if text else type(e).__name__


def installed(pg: Any) -> bool:
    row = pg.execute("SELECT to_regclass(%s)", (f"{NS}.meta",)).fetchone()
    return row is not None and row[0] is not None


def setup(url: str, blob_quota: int = DEFAULT_BLOB_QUOTA) -> str:
    """Create the central schema, its checks and the roles (once, as an administrator), or
    upgrade a database of version 2, 3 or 4 in place. `blob_quota`: the bytes of blobs each host
    may store unless its enrolment says otherwise."""
    with connect(url) as pg:
        import psycopg  # connect() said so if it is missing

        if installed(pg):
            version = pg.execute(f"SELECT value FROM {NS}.meta WHERE key = 'central_version'").fetchone()
            if version is not None and version[0] in ("2", "3", "4"):
                return _upgrade(pg, int(version[0]))
            if version is not None and version[0] == str(CENTRAL_VERSION):
                return _refresh(pg)
            return f"the central database is already set up (version {version[0] if version else '?'})"
        try:
            pg.execute(_schema_sql())
            pg.execute(f"INSERT INTO {NS}.meta VALUES ('blob_quota', %s)", (str(blob_quota),))
            pg.execute(_roles_sql())
            pg.execute(_version_4_sql())
            pg.execute(_version_5_sql())
            _self_test(pg)
            pg.commit()
        except psycopg.Error as e:
            hint = ""
            if "plpython3u" in str(e) or "cryptography" in str(e):
                hint = " (the server needs PL/Python: apt-get install postgresql-plpython3-NN python3-cryptography)"
            raise CentralError(f"cannot set up the central database: {first_line(e)}{hint}") from None
    return (f"central database set up: schema {NS}, owned by role {OWNER_ROLE} (no login); roles {PUSH_ROLE} "
            f"(hosts push: INSERT, and read their own host's rows) and {READ_ROLE} (reviewers: SELECT); "
            f"{blob_quota} bytes of blobs per host; enrol each host's key and login with 'amdflash fleet enroll'")


def _version_4_sql() -> str:
    """Version 4: a run is named by its host and run ID (run_owners, which gave a run ID to
    the host that pushed it first, is dropped: each host's run IDs are its own); progress rows
    bounded per host; everything owned by a role that cannot log in, the bookkeeping written
    only from within the checks (store/central/bounds.py)."""
    return f"""
DROP TRIGGER IF EXISTS runs_owned ON {NS}.runs;
DROP FUNCTION IF EXISTS {NS}.runs_owned();
DROP TABLE IF EXISTS {NS}.run_owners;
{bounds_sql(NS, _DEFINER, READ_ROLE)}
{guard_sql(NS)}
{owner_sql(NS)}
"""


def _version_5_sql() -> str:
    """Version 5: the mirror of each host's transparency log (tree heads, cosignatures,
    receipts: store/central/tlog_mirror.py), owned like the rest."""
    return version_5_sql(NS, _DEFINER, PUSH_ROLE, READ_ROLE) + owner_sql(NS)


def _refresh(pg: Any) -> str:
    """A database of this version: its row checks made again as this amdflash writes them (the
    same checks; faster ones since issue 42). No row of the record changes."""
    import psycopg

    try:
        pg.execute(refreshed_checks_sql())
        pg.commit()
    except psycopg.Error as e:
        raise CentralError(f"cannot bring the central database's checks up to date: {first_line(e)}") from None
    return (f"the central database is already set up (version {CENTRAL_VERSION}); its row checks are this "
            "amdflash's (no row of the record changed)")


def _upgrade(pg: Any, version: int) -> str:
    """Version 2, 3 or 4 → 5, in place: what each version lacks is added (version 2: the
    progress table; a version 3 set up before its progress checks: them; then version 4's parts;
    a version 4's row checks made this amdflash's), then version 5's tables. No row of the
    record changes; progress rows already stored are not checked again (CHECK ... NOT VALID);
    run_owners is dropped. The version in `meta` is set by lifting meta's insert-only trigger
    for that one row, in the same transaction."""
    import psycopg

    try:
        if version == 2:
            pg.execute(_progress_sql())
        elif version == 3:
            pg.execute(_progress_functions())
        if version < 4:
            pg.execute(_hardening_sql(existing=version == 3))
            pg.execute(_progress_grants())
            pg.execute(_version_4_sql())
        else:
            pg.execute(refreshed_checks_sql())
        pg.execute(_version_5_sql())
        pg.execute(f"ALTER TABLE {NS}.meta DISABLE TRIGGER meta_insert_only")
        pg.execute(f"UPDATE {NS}.meta SET value = %s WHERE key = 'central_version'", (str(CENTRAL_VERSION),))
        pg.execute(f"ALTER TABLE {NS}.meta ENABLE TRIGGER meta_insert_only")
        pg.commit()
    except psycopg.Error as e:
        raise CentralError(f"cannot upgrade the central database: {first_line(e)}") from None
    added = f"table {NS}.progress (live progress, advisory) added; " if version == 2 else ""
    four = (f"runs are named by their host and run ID (run_owners dropped: no host can take another's run ID); "
            f"progress rows are checked and bounded per host ({NS}.progress_limits); " if version < 4 else "")
    return (f"central database upgraded from version {version} to {CENTRAL_VERSION}: {added}{four}each host's "
            f"transparency log is mirrored ({NS}.tlog_heads, tlog_cosignatures, tlog_receipts: tree heads checked "
            f"consistent by the database); everything is owned by role {OWNER_ROLE} (no login); "
            "no row of the record was changed")


def progress_channel(pg: Any) -> str:
    """The channel to LISTEN on for progress wake-ups (payload-free): its name is readable by
    reviewers (amdflash_read) and administrators only."""
    import psycopg

    try:
        row = pg.execute(f"SELECT name FROM {NS}.progress_channel").fetchone()
    except psycopg.Error as e:
        raise CentralError(f"cannot read the progress channel's name ({first_line(e)}): listen as a reviewer "
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

        need_schema(pg)
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
            raise CentralError(f"cannot enrol the host: {first_line(e)}") from None
    return int(row[0])


def need_schema(pg: Any) -> None:
    """CentralError unless the database holds this version of the central schema."""
    if not installed(pg):
        raise CentralError("the central database is not set up: run 'amdflash fleet central-setup URL' "
                           "as its administrator first")
    version = pg.execute(f"SELECT value FROM {NS}.meta WHERE key = 'central_version'").fetchone()
    if version is None or version[0] != str(CENTRAL_VERSION):
        if version is not None and version[0] in ("2", "3", "4"):
            raise CentralError(f"the central database has version {version[0]} of the central schema; this amdflash "
                               f"needs version {CENTRAL_VERSION} (runs named by host, bounded progress, the hosts' "
                               "transparency logs mirrored): its "
                               "administrator upgrades it in place with 'amdflash fleet central-setup URL' (no row "
                               "of the record changes)")
        raise CentralError(f"the central database has version {version[0] if version else '?'} of the central "
                           f"schema; this amdflash needs version {CENTRAL_VERSION} (host logins, per-host blobs, "
                           "live progress): set up a new central database with 'amdflash fleet central-setup'")
