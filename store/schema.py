"""The audit database schema (version 2): compact physical tables, decoded views.

What a reviewer queries is a set of *logical* tables — runs, run_status, boards, stages,
register_writes, spi_transactions, register_snapshots, backup_units, backups, units,
verifies, errors, read_disagreements — with the columns listed in `LOGICAL`. Six of them
are stored as they are shown (small, text-only). The others are views that decode compact
*physical* tables:

* `log_spi`: one row per ROM_SW transaction — a write to ROM_SW_CNTL starts one — with the
  register writes that set it up since the transaction before it. The row keeps COMMAND and
  CNTL as the engine held them when it started, the TX bytes it sent (a reference into
  `blobs`), the transport clock of its start, and the *shape* of its writes: one letter per
  write, in issue order (`SHAPE_LETTERS`; NULL is the common `SCN`: STATUS←0, COMMAND←command,
  CNTL←cntl). A block write stays one letter however many registers it covers (`B`: STATUS,
  COMMAND, the reserved dword and window data in one streamed write), and window data loaded
  ahead for a later transaction (a preload) stays in the row of the writes it came with (`data`,
  the bytes written, is then not this transaction's `tx`). `register_writes` and
  `spi_transactions` re-create every write and every transaction from it. A transaction
  repeated at once with no data (the RX quirk's chained read, a status poll) shares its row:
  its writes follow in the shape and `again` is its start's clock offset.
* `log_writes`: every other register write, one row each (engine set-up and restore, PSP
  mailbox, aperture, and any write to the ROM_SW block that no shape letter describes).
* `blobs`: content-addressed bytes (TX data, backed-up units): stored once however many
  runs wrote or read the same content, found by an index on the first 8 bytes of their
  SHA-256.
* `log_units`, `log_verifies`, `log_snapshots`, `log_backup_units`, `log_disagreements`:
  the logical tables with run keys, hashes as 32-byte blobs and clocks as integer
  microseconds.

Every physical audit row has `seq` (one sequence over all of them: the order things were
recorded) and belongs to one run. Rows are never changed: triggers refuse UPDATE and
DELETE (only `audit archive` removes whole runs, see store/archive.py). Integrity comes
from `checkpoints` (store/chain.py): each run's rows form a hash chain of their own, and
each checkpoint — signed with the recording host's key — seals a run's chain head.
"""
from __future__ import annotations

import sqlite3
from amdflash.stages.files import readonly_uri
from dataclasses import dataclass

SCHEMA_VERSION = 2

# A run's status once it has ended (refused: a check failed before anything was written).
TERMINAL = ("succeeded", "failed", "interrupted", "refused")


class SchemaError(RuntimeError):
    pass


# -- logical tables: what is recorded and queried --------------------------------------------
# Column kinds: int, text; clock (seconds, stored as integer microseconds); sha (hex SHA-256,
# stored as 32 bytes); data (bytes, stored in `blobs`).

@dataclass(frozen=True)
class Table:
    name: str                     # logical name (a table or a view)
    columns: tuple[tuple[str, str], ...]
    physical: str                 # where its rows are stored
    index: tuple[str, ...] = ()   # physical columns indexed for per-run lookups

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c for c, _ in self.columns)

    @property
    def plain(self) -> bool:
        """Stored exactly as shown (run_id text, no decoding)."""
        return self.physical == self.name


def _t(name: str, physical: str | None, *columns: str, index: tuple[str, ...] = ()) -> Table:
    cols = tuple((c.split(":")[0], c.split(":")[1] if ":" in c else "text") for c in columns)
    return Table(name, cols, physical or name, index)


LOGICAL: dict[str, Table] = {t.name: t for t in (
    _t("runs", None, "run_id", "command", "arguments", "operator", "operator_claimed", "host", "machine_id",
       "tool_version", "tool_revision", "clock_sync", "image_path", "image_sha256", "board_spec",
       "resumes_run_id", "at", index=("run_id",)),
    _t("run_status", None, "run_id", "status", "detail", "result_sha256", "summary", "at", index=("run_id",)),
    _t("boards", None, "run_id", "spec", "kind", "emulated:int", "bridge_serial", "pci_address", "vendor_id:int",
       "device_id:int", "jedec", "chip", "unique_id", "sr1:int", "sr2:int", "sr3:int", "protection", "sfdp",
       "detail", "at", index=("run_id",)),
    _t("stages", None, "run_id", "stage", "event", "detail", "at", index=("run_id",)),
    _t("backups", None, "run_id", "sha256", "size:int", "path", "at", index=("run_id",)),
    _t("errors", None, "run_id", "stage", "message", "address:int", "at", index=("run_id",)),
    _t("register_snapshots", "log_snapshots", "run_id", "label", "registers", "clock:clock", index=("run",)),
    _t("backup_units", "log_backup_units", "run_id", "address:int", "size:int", "data:data",
       index=("run", "address")),
    _t("units", "log_units", "run_id", "address:int", "size:int", "state", "action", "wanted_sha256:sha",
       "detail", "clock:clock", index=("run", "address")),
    _t("verifies", "log_verifies", "run_id", "address:int", "size:int", "ok:int", "attempt:int",
       "expected_sha256:sha", "actual_sha256:sha", "mismatch_address:int", "flash_byte:int", "image_byte:int",
       "clock:clock", index=("run", "address")),
    _t("read_disagreements", "log_disagreements", "run_id", "address:int", "size:int", "purpose", "reads:int",
       "differing:int", "detail", "resolved:int", "clock:clock", index=("run", "address")),
)}

# The two decoded views of the ROM_SW log (hand-written SQL below).
DECODED = {
    "register_writes": ("run_id", "n", "offset", "value", "data", "clock"),
    "spi_transactions": ("run_id", "n", "opcode", "address", "address_bytes", "tx_len", "rx_len", "clock"),
}

# -- physical tables: what is stored and chained ---------------------------------------------
# Column storage kinds: int, text, blob, ref (an id in `blobs`; chained as the blob's SHA-256).

_STORAGE = {"int": "int", "text": "text", "clock": "int", "sha": "blob", "data": "ref"}


def _physical_columns(t: Table) -> tuple[tuple[str, str], ...]:
    if t.plain:
        return tuple((c, _STORAGE[k]) for c, k in t.columns)
    return (("run", "int"),) + tuple((c, _STORAGE[k]) for c, k in t.columns if c != "run_id")


PHYSICAL: dict[str, tuple[tuple[str, str], ...]] = {t.physical: _physical_columns(t) for t in LOGICAL.values()}
# log_spi: command and cntl as the engine held them at the start (command NULL if this run
# never saw it: written before the run); tx the TX bytes sent (NULL: none, or not known); data
# the bytes a D or B write put in the window; reserved the dword a B write put between COMMAND
# and the window; shape the writes (NULL: DEFAULT_SHAPE); clock the start (µs), lead how long
# before it the row's first write was issued (NULL: 0), again the start of the repeat.
PHYSICAL["log_spi"] = (("run", "int"), ("command", "int"), ("cntl", "int"), ("tx", "ref"), ("data", "ref"),
                       ("reserved", "int"), ("shape", "text"), ("clock", "int"), ("lead", "int"), ("again", "int"))
PHYSICAL["log_writes"] = (("run", "int"), ("offset", "int"), ("value", "int"), ("data", "ref"), ("clock", "int"))

# Tables whose rows carry run_id text rather than a run key.
PLAIN = frozenset(t.physical for t in LOGICAL.values() if t.plain)

_SQL_TYPES = {"int": "INTEGER", "text": "TEXT", "blob": "BLOB", "ref": "INTEGER"}

# Register offsets of a ROM_SW transaction, as the views re-create its writes. Kept here
# (not imported from the drivers) so the store needs nothing above it.
ROM_SW_CNTL, ROM_SW_STATUS, ROM_SW_COMMAND, ROM_SW_DATA = 0x5A3A0, 0x5A3A4, 0x5A3A8, 0x5A3B0
ROM_SW_RETURN_DATA_ENABLE = 0x80000

# The shape of a transaction's writes, one letter per write (a `log_spi` row's `shape`):
SHAPE_LETTERS = {
    "S": "ROM_SW_STATUS ← 0 (a register write)",
    "s": "ROM_SW_STATUS ← 0 (a 4-byte block write)",
    "C": "ROM_SW_COMMAND ← command (a register write)",
    "c": "ROM_SW_COMMAND ← command (a 4-byte block write)",
    "H": "ROM_SW_STATUS, ROM_SW_COMMAND ← 0, command (one 8-byte block write)",
    "B": "ROM_SW_STATUS, ROM_SW_COMMAND, reserved, window ← 0, command, reserved, data (one block write)",
    "D": "the data window ← data (one block write)",
    "N": "ROM_SW_CNTL ← cntl (a register write: starts the transaction)",
    "n": "ROM_SW_CNTL ← cntl (a 4-byte block write: starts the transaction)",
}
DEFAULT_SHAPE = "SCN"
MAX_SHAPE = 32                 # letters in one row (a longer run of writes goes to log_writes)
STARTS = ("N", "n")            # the letters that start a transaction

# The other tables: not audit rows of a run, but what makes them verifiable.
_SUPPORT = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE blobs (id INTEGER PRIMARY KEY, sha256 BLOB NOT NULL, data BLOB NOT NULL);
CREATE INDEX blobs_by_hash ON blobs (substr(sha256, 1, 8));
CREATE TABLE hosts (id INTEGER PRIMARY KEY, public_key BLOB NOT NULL UNIQUE, hostname TEXT, machine_id TEXT,
                    first_seen TEXT);
CREATE TABLE checkpoints (id INTEGER PRIMARY KEY, kind TEXT NOT NULL, run INTEGER, run_id TEXT, rows INTEGER,
                          last_seq INTEGER, head BLOB, host INTEGER NOT NULL, at TEXT NOT NULL, detail TEXT,
                          hash BLOB NOT NULL, sig BLOB NOT NULL);
CREATE INDEX checkpoints_run ON checkpoints (run, id);
CREATE TABLE chain_head (id INTEGER PRIMARY KEY CHECK (id = 1), seq INTEGER NOT NULL, checkpoint INTEGER NOT NULL,
                         hash BLOB);
"""
APPEND_ONLY = ("blobs", "hosts", "checkpoints")


def _view_columns(t: Table, alias: str = "p") -> str:
    out = []
    for c, kind in t.columns:
        if c == "run_id":
            out.append("r.run_id")
        elif kind == "clock":
            out.append(f"{alias}.{c} / 1e6 AS {c}")
        elif kind == "sha":
            out.append(f"CASE WHEN {alias}.{c} IS NOT NULL THEN lower(hex({alias}.{c})) END AS {c}")
        elif kind == "data":
            out.append(f"b_{c}.data AS {c}")
        else:
            out.append(f"{alias}.{c}")
    return ", ".join(out)


def _logical_view(t: Table) -> str:
    joins = "".join(f" LEFT JOIN blobs b_{c} ON b_{c}.id = p.{c}" for c, k in t.columns if k == "data")
    extra = ""
    if t.name == "backup_units":
        # sha256 of a backed-up unit is its blob's content address.
        extra = ", lower(hex(b_data.sha256)) AS sha256"
    cols = _view_columns(t)
    if extra:
        # keep the recorded column order: run_id, address, size, sha256, data
        cols = "r.run_id, p.address, p.size, lower(hex(b_data.sha256)) AS sha256, b_data.data AS data"
    return (f"CREATE VIEW {t.name} AS SELECT p.seq, {cols} FROM {t.physical} p "
            f"JOIN runs r ON r.seq = p.run{joins}")


# A run's ROM_SW rows lie between its runs row and its final checkpoint (or, for a run that
# recorded no end, the last row there is): the views walk that seq range (the bulk tables
# carry no run index), so a query for one run costs that run.
RUN_END_SQL = ("coalesce((SELECT c.last_seq FROM checkpoints c WHERE c.run = r.seq AND c.kind = 'final'), "
               "(SELECT h.seq FROM chain_head h WHERE h.id = 1))")
_SPAN = "JOIN {table} s ON s.seq BETWEEN r.seq AND " + RUN_END_SQL + " AND s.run = r.seq"

def _le32(column: str) -> str:
    """SQL: the 4 little-endian bytes of an integer column (SQLite 3.40 has no unhex)."""
    parts = " || ".join(f"(SELECT b FROM _byte WHERE i = ({column} >> {8 * k}) & 255)" for k in range(4))
    return f"CAST({parts} AS BLOB)"


_SHAPE = f"coalesce(s.shape, '{DEFAULT_SHAPE}')"

_VIEWS = f"""
CREATE TABLE IF NOT EXISTS _repeat (i INTEGER PRIMARY KEY);
CREATE TABLE IF NOT EXISTS _byte (i INTEGER PRIMARY KEY, b BLOB NOT NULL);
CREATE VIEW spi_transactions AS
SELECT s.seq, r.run_id, row_number() OVER (PARTITION BY r.run_id ORDER BY s.seq, rep.i) AS n,
       s.command & 255 AS opcode,
       (s.command >> (8 + 8 * (3 - ((s.cntl >> 16) & 3)))) & (16777215 >> (8 * (3 - ((s.cntl >> 16) & 3))))
           AS address,
       (s.cntl >> 16) & 7 AS address_bytes,
       CASE WHEN s.cntl & {ROM_SW_RETURN_DATA_ENABLE} THEN 0 ELSE s.cntl & 65535 END AS tx_len,
       CASE WHEN s.cntl & {ROM_SW_RETURN_DATA_ENABLE} THEN s.cntl & 65535 ELSE 0 END AS rx_len,
       (s.clock + rep.i * coalesce(s.again, 0)) / 1e6 AS clock
FROM runs r {_SPAN.format(table="log_spi")}
JOIN _repeat rep ON rep.i = 0 OR (rep.i = 1 AND s.again IS NOT NULL);

CREATE VIEW register_writes AS
SELECT seq, run_id, row_number() OVER (PARTITION BY run_id ORDER BY seq, sub) AS n,
       CASE WHEN w IN ('S', 's', 'H', 'B') THEN {ROM_SW_STATUS} WHEN w IN ('C', 'c') THEN {ROM_SW_COMMAND}
            WHEN w = 'D' THEN {ROM_SW_DATA} WHEN w IN ('N', 'n') THEN {ROM_SW_CNTL} ELSE offset END AS offset,
       CASE w WHEN 'S' THEN 0 WHEN 'C' THEN command WHEN 'N' THEN cntl WHEN '' THEN value END AS value,
       CASE w WHEN 's' THEN x'00000000' WHEN 'c' THEN {_le32("command")} WHEN 'n' THEN {_le32("cntl")}
              WHEN 'H' THEN CAST(x'00000000' || {_le32("command")} AS BLOB)
              WHEN 'B' THEN CAST(x'00000000' || {_le32("command")} || {_le32("reserved")} || data AS BLOB)
              WHEN 'D' THEN data WHEN '' THEN data END AS data,
       clock
FROM (
  SELECT seq, run_id, sub, w, command, cntl, reserved, data, NULL AS offset, NULL AS value,
         (start + nth * coalesce(again, 0) - CASE WHEN w IN ('N', 'n') THEN 0 ELSE coalesce(lead, 0) END) / 1e6
             AS clock
  FROM (
    SELECT s.seq, r.run_id, k.i AS sub, substr({_SHAPE}, k.i + 1, 1) AS w,
           k.i - length(replace(replace(substr({_SHAPE}, 1, k.i), 'N', ''), 'n', '')) AS nth,
           s.command, s.cntl, s.reserved, b.data, s.clock AS start, s.lead, s.again
    FROM runs r {_SPAN.format(table="log_spi")}
    JOIN _repeat k ON k.i < length({_SHAPE})
    LEFT JOIN blobs b ON b.id = s.data
  )
  UNION ALL
  SELECT s.seq, r.run_id, 0, '', NULL, NULL, NULL, b.data, s.offset, s.value, s.clock / 1e6
  FROM runs r {_SPAN.format(table="log_writes")}
  LEFT JOIN blobs b ON b.id = s.data
);
"""
HELPERS = ("_repeat", "_byte")     # constant tables the views decode with


def create(conn: sqlite3.Connection) -> None:
    """Create the version-2 schema in an empty database (inside the caller's transaction)."""
    for statement in _split(_SUPPORT):
        conn.execute(statement)
    conn.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
    conn.execute("INSERT INTO chain_head VALUES (1, 0, 0, NULL)")
    for table, columns in PHYSICAL.items():
        cols = ", ".join(f"{c} {_SQL_TYPES[k]}" for c, k in columns)
        conn.execute(f"CREATE TABLE {table} (seq INTEGER PRIMARY KEY, {cols})")
    for t in LOGICAL.values():
        if t.index:
            conn.execute(f"CREATE INDEX {t.physical}_by_run ON {t.physical} ({', '.join(t.index)})")
        if not t.plain:
            conn.execute(_logical_view(t))
    for statement in _split(_VIEWS):
        conn.execute(statement)
    conn.executemany("INSERT INTO _repeat VALUES (?)", [(i,) for i in range(MAX_SHAPE)])
    conn.executemany("INSERT INTO _byte VALUES (?, ?)", [(i, bytes((i,))) for i in range(256)])
    add_triggers(conn)


def add_triggers(conn: sqlite3.Connection) -> None:
    for table in (*PHYSICAL, *APPEND_ONLY, *HELPERS):
        for op in ("UPDATE", "DELETE"):
            conn.execute(f"CREATE TRIGGER {table}_no_{op.lower()} BEFORE {op} ON {table} "
                         f"BEGIN SELECT RAISE(ABORT, 'audit rows are append-only ({table})'); END")


def drop_triggers(conn: sqlite3.Connection) -> None:
    """Only for `audit archive`, inside its transaction, which re-adds them before it commits."""
    for table in (*PHYSICAL, *APPEND_ONLY, *HELPERS):
        for op in ("update", "delete"):
            conn.execute(f"DROP TRIGGER IF EXISTS {table}_no_{op}")


def _split(script: str) -> list[str]:
    """Statements of a script (none of ours has a ';' inside a statement)."""
    return [s.strip() for s in script.split(";") if s.strip()]


def connect(path: str, readonly: bool = False) -> sqlite3.Connection:
    """A connection in autocommit mode: every transaction is explicit (BEGIN ... COMMIT)."""
    if readonly:
        conn = sqlite3.connect(readonly_uri(path), uri=True, timeout=30.0, isolation_level=None,
                               check_same_thread=False)
    else:
        conn = sqlite3.connect(path, timeout=30.0, check_same_thread=False, isolation_level=None)
        # WAL lets readers (reports, datasette) run beside the writer on one snapshot each.
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
    return conn


def version(conn: sqlite3.Connection) -> int | None:
    """The schema version, 0 for an empty database, None for a database that is not amdflash's."""
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
    if not tables:
        return 0
    if "meta" not in tables:
        return None
    row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    try:
        return int(row[0]) if row else None
    except ValueError:
        return None
