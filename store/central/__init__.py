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
owner too). Everything in the schema belongs to `amdflash_owner`, a role nobody can log in
as; the checks run as it (SECURITY DEFINER), and the bookkeeping tables (`blob_usage`,
`progress_usage`) take a write only from within them (a host's blob bytes only grow); only
an administrator enrols host keys (bounds.py).

Who pushes what, and who reads what, is decided by the database too:

* each host is enrolled with its key, its name and the one login that pushes for it
  (`hosts.login`); a checkpoint or blob of a host is accepted only from that login (the
  session's `session_user`, which SET ROLE cannot change) or from an administrator (a
  superuser) — a push login that holds another host's stolen key still cannot push for it;
* a run is named by its host and its run ID: each host's run IDs are its own (a host pushing
  a run ID another host also used names its own run, never the other's), and every reader —
  `fleet runs`, `fleet report HOST/RUN`, the line view, its notifications — keys runs so;
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
refuses a value no view could take (PROGRESS_SHAPES, PROGRESS_BOUNDS, no control or format
character, the host's clock near its own), and keeps each host within a rate, a daily quota
of rows and a quota of rows stored, for which it drops the host's own oldest rows
(progress_limits, bounds.py); the signed trail stays the truth, and every view says which it
shows.

The package is split by what each part does — schema (the DDL, the roles, central-setup,
enrolment, connecting), pushing (what a host sends, and the host's checks before the
database's own), reading (fleet runs, fleet report, the queries fleet serve asks) — and names
every public name of the three here: the fleet modules use the central record as one thing.
"""
from __future__ import annotations

from amdflash.store.central.bounds import BOARDS_PAGE, BOARDS_PER_HOST, CONTROLS, OWNER_ROLE, PROGRESS_LIMITS
from amdflash.store.central.schema import (
    CENTRAL_VERSION, DEFAULT_BLOB_QUOTA, NS, PLACE_SHAPE, PROGRESS_AHEAD, PROGRESS_BEHIND, PROGRESS_BOUNDS,
    PROGRESS_CHANNEL, PROGRESS_LENGTHS, PROGRESS_SHAPES, PROGRESS_STATES, PUSH_ROLE, READ_ROLE, RUN_ID_SHAPE,
    RUN_KINDS, CentralError, canonical_pg, connect, enroll, installed, need_schema, progress_channel, setup,
)
from amdflash.store.central.pushing import (
    PROGRESS_COLUMNS, Comparison, PushReport, archived_through, central_checkpoints, compare, host_for_trail,
    publish_progress, publishable, published_ends, push, push_log, verify_against, verify_log_against,
)
from amdflash.store.central.tlog_mirror import witness_states, witness_words
from amdflash.store.central.reading import (
    AmbiguousRun, hosts_health, image_parts, last_progress_id, line_progress, line_totals, materialize,
    materialized_host, not_a_reader, progress_after, resolve, runs, select_runs, shown_url, signed_status, split_run,
)

__all__ = [
    "NS", "CENTRAL_VERSION", "PROGRESS_CHANNEL", "PROGRESS_STATES", "RUN_ID_SHAPE", "PLACE_SHAPE",
    "PROGRESS_SHAPES", "PROGRESS_BOUNDS", "PROGRESS_LENGTHS", "PROGRESS_AHEAD", "PROGRESS_BEHIND",
    "DEFAULT_BLOB_QUOTA", "PUSH_ROLE", "READ_ROLE", "RUN_KINDS", "CentralError", "canonical_pg", "connect",
    "installed", "setup", "progress_channel", "enroll", "need_schema", "PushReport", "push", "archived_through",
    "central_checkpoints", "Comparison", "compare", "verify_against", "PROGRESS_COLUMNS", "host_for_trail",
    "publishable", "publish_progress", "published_ends", "runs", "select_runs", "image_parts", "shown_url",
    "not_a_reader", "line_progress", "progress_after", "last_progress_id", "signed_status", "hosts_health",
    "line_totals", "AmbiguousRun", "split_run", "resolve", "materialize", "materialized_host", "BOARDS_PAGE",
    "BOARDS_PER_HOST", "CONTROLS", "OWNER_ROLE", "PROGRESS_LIMITS", "push_log", "verify_log_against",
    "witness_states", "witness_words",
]
