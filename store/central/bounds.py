"""What keeps one host within bounds in the central record (central schema version 4), as
DDL the schema module runs at setup and when it upgrades a database in place:

* the text a host writes carries no control or format character (Unicode categories Cc and
  Cf: C0, C1, bidi overrides and isolates, zero-width characters), as one regex class that
  PostgreSQL and Python read alike (CONTROLS);
* a host's progress rows are bounded by the database itself, per host: a rate (a token bucket
  of rows, and one of ends, which are what notifications are sent for), a quota of rows a day,
  and a quota of rows stored, reached only after the host's oldest rows (older than
  keep_days) are dropped to make room (progress_limits: a default row, host 0, and any host's
  own; progress_usage: the buckets and counts), so one push login can neither flood the view
  and its notifications nor fill the disk every host shares;
* everything in the schema belongs to a role that cannot log in (OWNER_ROLE): the checks
  run as it (SECURITY DEFINER), and the bookkeeping tables (blob_usage, progress_usage) take
  a write only from within them — not from a trigger or statement of anyone else's, whoever
  owns what. A superuser can still become any role, or drop a trigger (docs/threat-model.md).
"""
from __future__ import annotations

OWNER_ROLE = "amdflash_owner"

# Every code point of Unicode categories Cc and Cf (Unicode 15.1), as ranges of \u/\U escapes:
# PostgreSQL's regular expressions and Python's re read them alike. NUL is left out: no text
# value holds it in PostgreSQL. (Written out rather than derived from unicodedata, so the
# database's checks do not change with the Python that set them up; a test compares them.)
_CONTROL_RANGES = (
    (0x1, 0x1F), (0x7F, 0x9F), (0xAD, 0xAD), (0x600, 0x605), (0x61C, 0x61C), (0x6DD, 0x6DD), (0x70F, 0x70F),
    (0x890, 0x891), (0x8E2, 0x8E2), (0x180E, 0x180E), (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x2064),
    (0x2066, 0x206F), (0xFEFF, 0xFEFF), (0xFFF9, 0xFFFB), (0x110BD, 0x110BD), (0x110CD, 0x110CD),
    (0x13430, 0x1343F), (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A), (0xE0001, 0xE0001), (0xE0020, 0xE007F),
)


def _escape(cp: int) -> str:
    return f"\\u{cp:04x}" if cp <= 0xFFFF else f"\\U{cp:08x}"


CONTROLS = "".join(_escape(a) if a == b else f"{_escape(a)}-{_escape(b)}" for a, b in _CONTROL_RANGES)
NO_CONTROLS = rf"\A[^{CONTROLS}]*\Z"          # a text without any of them


def control_ranges() -> tuple[tuple[int, int], ...]:
    return _CONTROL_RANGES


# The default bounds of a host's progress rows (progress_limits' host 0). An honest host sends
# a running run's row at most once a second and every end once (pipeline/fleet/live.py): a
# host of 16 boards flashing without a pause sends about 16 rows a second and 1.4 million a day.
# Rows stored: an honest host of 16 boards keeps under half of it in keep_days, so its oldest rows
# make room long before the quota refuses anything; a flood is held at about 3 GB a host.
PROGRESS_LIMITS = {"rows_per_second": 30.0, "rows_burst": 3000, "ends_per_second": 2.0, "ends_burst": 100,
                   "rows_per_day": 2_000_000, "rows_stored": 10_000_000, "keep_days": 3.0}
# The line view shows at most this many boards of one host, and this many in all (the newest).
BOARDS_PER_HOST, BOARDS_PAGE = 256, 2000


def bounds_sql(ns: str, definer: str, read_role: str) -> str:
    """The progress bounds: their tables (made if missing, the default row put if missing), the
    statement trigger that enforces them, and who may read them."""
    names, values = ", ".join(PROGRESS_LIMITS), ", ".join(repr(v) for v in PROGRESS_LIMITS.values())
    return f"""
-- How many progress rows a host may send: host 0's row for every host without its own. The
-- administrator changes them with UPDATE (or INSERT a host's own row).
CREATE TABLE IF NOT EXISTS {ns}.progress_limits (
    host_id integer PRIMARY KEY CHECK (host_id >= 0),
    rows_per_second double precision NOT NULL CHECK (rows_per_second > 0 AND rows_per_second < 1e6),
    rows_burst bigint NOT NULL CHECK (rows_burst >= 20),
    ends_per_second double precision NOT NULL CHECK (ends_per_second > 0 AND ends_per_second < 1e6),
    ends_burst bigint NOT NULL CHECK (ends_burst >= 20),          -- pushing.PUBLISH_BATCH at least
    rows_per_day bigint NOT NULL CHECK (rows_per_day > 0),
    rows_stored bigint NOT NULL CHECK (rows_stored > 0),
    keep_days double precision NOT NULL CHECK (keep_days > 0 AND keep_days < 1e5));
INSERT INTO {ns}.progress_limits ({names}, host_id) VALUES ({values}, 0) ON CONFLICT DO NOTHING;
-- Bookkeeping: each host's buckets (rows and ends left, as of refilled_at), its rows today
-- (UTC) and its rows stored.
CREATE TABLE IF NOT EXISTS {ns}.progress_usage (
    host_id integer PRIMARY KEY, rows_left double precision NOT NULL, ends_left double precision NOT NULL,
    refilled_at timestamptz NOT NULL, day date NOT NULL, day_rows bigint NOT NULL CHECK (day_rows >= 0),
    stored bigint NOT NULL CHECK (stored >= 0));
CREATE OR REPLACE FUNCTION {ns}.progress_bounded() RETURNS trigger LANGUAGE plpgsql {definer} AS $fn$
DECLARE
    grp record; lim record; u record; now_at timestamptz := clock_timestamp(); today date; elapsed double precision;
    rows_now double precision; ends_now double precision; used bigint; kept_rows bigint; pruned bigint;
BEGIN
    today := (now_at AT TIME ZONE 'UTC')::date;
    FOR grp IN SELECT host_id, count(*) AS n, count(*) FILTER (WHERE state NOT IN ('running', 'alive')) AS ends
                 FROM new_rows GROUP BY host_id ORDER BY host_id LOOP
        SELECT * INTO lim FROM {ns}.progress_limits WHERE host_id IN (grp.host_id, 0) ORDER BY host_id DESC LIMIT 1;
        INSERT INTO {ns}.progress_usage VALUES (grp.host_id, lim.rows_burst, lim.ends_burst, now_at, today, 0,
            (SELECT count(*) FROM {ns}.progress WHERE host_id = grp.host_id) - grp.n) ON CONFLICT (host_id) DO NOTHING;
        SELECT * INTO u FROM {ns}.progress_usage WHERE host_id = grp.host_id FOR UPDATE;
        elapsed := greatest(0, extract(epoch FROM now_at - u.refilled_at));
        rows_now := least(lim.rows_burst, u.rows_left + elapsed * lim.rows_per_second);
        ends_now := least(lim.ends_burst, u.ends_left + elapsed * lim.ends_per_second);
        used := CASE WHEN u.day = today THEN u.day_rows ELSE 0 END;
        IF grp.n > rows_now THEN
            RAISE EXCEPTION 'refused: progress of host %: % row(s) at once, over its rate (% rows a second, at most '
                            '% at once; % may be sent now)', {ns}.host_name(grp.host_id), grp.n, lim.rows_per_second,
                lim.rows_burst, floor(rows_now) USING ERRCODE = 'program_limit_exceeded';
        END IF;
        IF grp.ends > ends_now THEN
            RAISE EXCEPTION 'refused: progress of host %: % end(s) at once, over its rate of ends (% a second, at '
                            'most % at once; % may be sent now)', {ns}.host_name(grp.host_id), grp.ends,
                lim.ends_per_second, lim.ends_burst, floor(ends_now) USING ERRCODE = 'program_limit_exceeded';
        END IF;
        IF used + grp.n > lim.rows_per_day THEN
            RAISE EXCEPTION 'refused: progress of host %: over its quota of % rows a day (% sent today, UTC)',
                {ns}.host_name(grp.host_id), lim.rows_per_day, used USING ERRCODE = 'program_limit_exceeded';
        END IF;
        kept_rows := u.stored;
        IF kept_rows + grp.n > lim.rows_stored THEN      -- room made from the host's own oldest rows
            WITH gone AS (DELETE FROM {ns}.progress WHERE id IN (
                SELECT id FROM {ns}.progress WHERE host_id = grp.host_id
                   AND received_at < now_at - make_interval(secs => lim.keep_days * 86400)
                 ORDER BY id LIMIT kept_rows + grp.n - lim.rows_stored) RETURNING 1)
            SELECT count(*) INTO pruned FROM gone;
            kept_rows := kept_rows - pruned;
        END IF;
        IF kept_rows + grp.n > lim.rows_stored THEN
            RAISE EXCEPTION 'refused: progress of host %: over its quota of % rows stored (% stored, none older than '
                            '% days to make room)', {ns}.host_name(grp.host_id), lim.rows_stored, kept_rows,
                lim.keep_days USING ERRCODE = 'program_limit_exceeded';
        END IF;
        UPDATE {ns}.progress_usage SET rows_left = rows_now - grp.n, ends_left = ends_now - grp.ends,
               refilled_at = now_at, day = today, day_rows = used + grp.n, stored = kept_rows + grp.n
         WHERE host_id = grp.host_id;
    END LOOP;
    RETURN NULL;
END $fn$;
-- Progress is insert-only, but for the bounds' own pruning (a DELETE from within them).
CREATE OR REPLACE FUNCTION {ns}.progress_kept() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_OP = 'DELETE' AND current_user = '{OWNER_ROLE}' AND pg_trigger_depth() >= 2 THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'refused: the central audit tables are insert-only (% on %)', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END $fn$;
DROP TRIGGER IF EXISTS progress_insert_only ON {ns}.progress;
CREATE TRIGGER progress_insert_only BEFORE UPDATE OR DELETE ON {ns}.progress FOR EACH ROW
    EXECUTE FUNCTION {ns}.progress_kept();
DROP TRIGGER IF EXISTS progress_bounded ON {ns}.progress;
CREATE TRIGGER progress_bounded AFTER INSERT ON {ns}.progress REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {ns}.progress_bounded();
REVOKE ALL ON {ns}.progress_limits, {ns}.progress_usage FROM PUBLIC;
GRANT SELECT ON {ns}.progress_limits, {ns}.progress_usage TO {read_role};
"""


def guard_sql(ns: str) -> str:
    """The bookkeeping tables' guard: a write only from within the checks (a trigger running as
    OWNER_ROLE, which nobody can log in as), never a delete; blob bytes only grow."""
    tables = ("blob_usage", "progress_usage")
    made = "\n".join(f"DROP TRIGGER IF EXISTS {t}_kept ON {ns}.{t};\n"
                     f"CREATE TRIGGER {t}_kept BEFORE INSERT OR UPDATE OR DELETE ON {ns}.{t} FOR EACH ROW "
                     f"EXECUTE FUNCTION {ns}.bookkeeping_only();\n"
                     f"DROP TRIGGER IF EXISTS {t}_no_truncate ON {ns}.{t};\n"
                     f"CREATE TRIGGER {t}_no_truncate BEFORE TRUNCATE ON {ns}.{t} FOR EACH STATEMENT "
                     f"EXECUTE FUNCTION {ns}.refuse_change();" for t in tables)
    return f"""
-- current_user is {OWNER_ROLE} only inside a SECURITY DEFINER function it owns (the checks):
-- a statement, function or trigger of anyone else's — a table owner's, a superuser's — is not it.
CREATE OR REPLACE FUNCTION {ns}.bookkeeping_only() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE kept boolean := current_user = '{OWNER_ROLE}' AND pg_trigger_depth() >= 2 AND TG_OP <> 'DELETE';
BEGIN
    IF kept AND TG_OP = 'UPDATE' THEN
        kept := NEW.host_id = OLD.host_id;
        IF kept AND TG_TABLE_NAME = 'blob_usage' THEN    -- (a field only its rows have)
            kept := NEW.bytes >= OLD.bytes;
        END IF;
    END IF;
    IF NOT kept THEN
        RAISE EXCEPTION 'refused: % on %: it is kept by the push checks only (a host''s blob bytes only grow; its '
                        'progress buckets are the database''s)', TG_OP, TG_TABLE_NAME
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END $fn$;
{made}
"""


def owner_sql(ns: str) -> str:
    """Everything in the schema made OWNER_ROLE's (a role that cannot log in), but functions
    in an untrusted language (ed25519_verify: only a superuser may own one)."""
    return f"""
DO $do$ BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{OWNER_ROLE}') THEN
        CREATE ROLE {OWNER_ROLE} NOLOGIN;
    END IF;
END $do$;
ALTER ROLE {OWNER_ROLE} NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS;
DO $do$
DECLARE r record;
BEGIN
    -- Nobody may become it (SET ROLE), but a superuser, who may become anyone.
    FOR r IN SELECT member::regrole AS name FROM pg_auth_members WHERE roleid = '{OWNER_ROLE}'::regrole LOOP
        EXECUTE format('REVOKE {OWNER_ROLE} FROM %s', r.name);
    END LOOP;
    FOR r IN SELECT c.oid::regclass AS name, c.relkind FROM pg_class c
              WHERE c.relnamespace = '{ns}'::regnamespace AND c.relkind IN ('r', 'v', 'S')
                AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                                   AND d.deptype IN ('a', 'i')) LOOP
        EXECUTE format('ALTER %s %s OWNER TO {OWNER_ROLE}',
                       CASE r.relkind WHEN 'v' THEN 'VIEW' WHEN 'S' THEN 'SEQUENCE' ELSE 'TABLE' END, r.name);
    END LOOP;
    FOR r IN SELECT p.oid::regprocedure AS name FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
              WHERE p.pronamespace = '{ns}'::regnamespace AND l.lanpltrusted LOOP
        EXECUTE format('ALTER FUNCTION %s OWNER TO {OWNER_ROLE}', r.name);
    END LOOP;
END $do$;
ALTER SCHEMA {ns} OWNER TO {OWNER_ROLE};
"""
