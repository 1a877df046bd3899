"""Hash chains per run, sealed by signed checkpoints.

Every physical audit row belongs to one run. A run's rows form a chain of *segments*: a
segment is the run's rows recorded between two of its checkpoints (the writer seals a run
at least every few thousand rows and every second, at every barrier and at its end). For
segment k,

    d[T]     = sha256(canonical rows of table T in the segment, in seq order)   per table T
    head[k]  = sha256(head[k-1] || d[T1] || d[T2] || ...)    tables in the order of PHYSICAL
    head[0]  = sha256("amdflash run\\n" || run_id)

so a run verifies on its own (its rows and its checkpoints), table by table, without
reading any other run. Each checkpoint records (kind, run_id, rows so far, the last seq it
covers, head, host key, time, detail) and the hash of the checkpoint before it — one chain
over all checkpoints of the database — and is signed with the recording host's Ed25519
key. Recomputing the hashes after changing a row is easy; signing them again needs the
host's private key, which never leaves the host.

The canonical form is defined independently of Python, so an export can be checked with
any language's JSON and SHA-256 (and SQLite computes it itself, with json_array, when
verifying):

    row        = JSON array [table, seq, field, field, ...] (columns in PHYSICAL order), compact
                 (no spaces), non-ASCII as UTF-8, then "\\n"
    field      = an integer, a string, null; a BLOB as ["b", lowercase hex]; a blob reference
                 as the lowercase hex SHA-256 of the bytes it refers to
    checkpoint = "checkpoint|" field(id) "|" field(kind) "|" field(run_id) "|" field(rows) "|"
                 field(last_seq) "|" field(head) "|" field(host public key) "|" field(at) "|"
                 field(detail) "|" field(prev), where field is "n" (null), "i" decimal,
                 "s" byte length ":" text, or "b" lowercase hex; hashed with SHA-256, then signed
"""
from __future__ import annotations

import bisect
import hashlib
import json
import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import Any

from amdflash.store.schema import PHYSICAL, PLAIN

GENESIS = bytes(32)
# The kind of the checkpoints that seal rows an older amdflash recorded (schema version 1:
# a hash chain, no signatures), moved into this schema by `audit upgrade` (store.migrate).
# They are chained but never signed, and never counted as signed: nothing vouches for those
# rows but their own unsigned chain, checked once, at the upgrade. (An upgrade by amdflash
# before this rule signed them; that signature is ignored: it vouched for what it could not know.)
LEGACY = "migrated"
EMPTY = hashlib.sha256(b"").digest()
TABLE_ORDER = tuple(PHYSICAL)


def run_genesis(run_id: str) -> bytes:
    return hashlib.sha256(b"amdflash run\n" + run_id.encode()).digest()


# -- canonical encoding ------------------------------------------------------------------------

def field(value: Any) -> bytes:
    """A checkpoint field: n (null), i decimal, s length:text, b hex."""
    if value is None:
        return b"n"
    kind = type(value)
    if kind is int:
        return b"i%d" % value
    if kind is str:
        text = value.encode()
        return b"s%d:%s" % (len(text), text)
    if kind is bytes:
        return b"b" + value.hex().encode()
    raise TypeError(f"cannot chain a {kind.__name__} value")


def _json(value: Any) -> Any:
    return ["b", value.hex()] if type(value) is bytes else value


def _ref(sha: bytes | None) -> str | None:
    return None if sha is None else sha.hex()


_KINDS = {table: tuple(kind for _, kind in columns) for table, columns in PHYSICAL.items()}


def canonical(table: str, seq: int, values: Iterable[Any]) -> bytes:
    """A physical row; a ref column's value is the referenced blob's SHA-256 (or None)."""
    if table == "log_spi":
        values = tuple(values)
        if _plain_spi(values):
            return canonical_spi(seq, *values)
    fields = [_ref(v) if kind == "ref" else _json(v) for kind, v in zip(_KINDS[table], values, strict=True)]
    for v in fields:
        if type(v) not in _JSON_TYPES:
            raise TypeError(f"cannot chain a {type(v).__name__} value")
    return json.dumps([table, seq, *fields], ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


_JSON_TYPES = (int, str, list, type(None))


def _plain_spi(values: tuple) -> bool:
    """Whether `canonical_spi` writes this log_spi row exactly as json.dumps would."""
    run, command, cntl, tx, data, reserved, shape, clock, lead, again = values
    return (type(run) is int and type(cntl) is int and type(clock) is int
            and all(type(v) in (int, type(None)) for v in (command, reserved, lead, again))
            and all(type(v) in (bytes, type(None)) for v in (tx, data))
            and (shape is None or (type(shape) is str and shape.isascii() and shape.isalpha())))


def _opt(value: int | None) -> bytes:
    return b"null" if value is None else b"%d" % value


def _opt_ref(sha: bytes | None) -> bytes:
    return b"null" if sha is None else b'"%s"' % sha.hex().encode()


def canonical_spi(seq: int, run: int, command: int | None, cntl: int, tx: bytes | None, data: bytes | None,
                  reserved: int | None, shape: str | None, clock: int, lead: int | None, again: int | None) -> bytes:
    """`canonical` of a log_spi row, written out: it is the bulk of every trail."""
    return b'["log_spi",%d,%d,%s,%d,%s,%s,%s,%s,%d,%s,%s]\n' % (
        seq, run, _opt(command), cntl, _opt_ref(tx), _opt_ref(data), _opt(reserved),
        b"null" if shape is None else b'"%s"' % shape.encode(), clock, _opt(lead), _opt(again))


def _sql_field(column: str, kind: str) -> str:
    if kind == "ref":
        # A reference to a missing blob yields no hash: the row cannot match.
        return f"CASE WHEN p.{column} IS NULL THEN NULL ELSE coalesce(lower(hex(b_{column}.sha256)), '?') END"
    # Any column may hold a BLOB if someone wrote one there: JSON shows it as ["b", hex].
    return f"CASE typeof(p.{column}) WHEN 'blob' THEN json_array('b', lower(hex(p.{column}))) ELSE p.{column} END"


def canonical_expr(table: str) -> tuple[str, str]:
    """(SQL expression of a row's canonical text, the joins it needs), over `{table} p`."""
    columns = PHYSICAL[table]
    fields = ", ".join(_sql_field(c, k) for c, k in columns)
    joins = "".join(f" LEFT JOIN blobs b_{c} ON b_{c}.id = p.{c}" for c, k in columns if k == "ref")
    return f"json_array('{table}', p.seq, {fields}) || char(10)", joins


def canonical_sql(table: str, where: str = "") -> str:
    """SELECT seq, run (key or run_id), canonical text — computed by SQLite itself, which is what
    makes verifying fast. `where` filters rows of `p`."""
    expr, joins = canonical_expr(table)
    run = "p.run_id" if table in PLAIN else "p.run"
    return f"SELECT p.seq, {run}, {expr} FROM {table} p{joins}{' WHERE ' + where if where else ''} ORDER BY p.seq"


def segment_head(prev: bytes, digests: dict[str, bytes]) -> bytes:
    return hashlib.sha256(prev + b"".join(digests.get(t, EMPTY) for t in TABLE_ORDER)).digest()


# -- checkpoints -------------------------------------------------------------------------------

@dataclass
class Checkpoint:
    id: int
    kind: str                 # commit | final | archive | migration | migrated (LEGACY)
    run_id: str | None
    rows: int | None          # rows of the run sealed so far
    last_seq: int | None      # the run's last sealed seq (archive: the last archived seq)
    head: bytes | None        # the run's chain head (archive: the hash of the last archived checkpoint)
    public_key: bytes         # the signing host's Ed25519 public key
    at: str
    detail: str | None
    hash: bytes = b""
    sig: bytes = b""
    run: int | None = None    # the run's key in this database (runs.seq)
    host: int | None = None   # hosts.id in this database

    def digest(self, prev: bytes) -> bytes:
        text = b"checkpoint|" + b"|".join(field(v) for v in (
            self.id, self.kind, self.run_id, self.rows, self.last_seq, self.head, self.public_key, self.at,
            self.detail, prev))
        return hashlib.sha256(text).digest()


def load_checkpoints(conn: sqlite3.Connection, where: str = "", args: tuple = ()) -> list[Checkpoint]:
    rows = conn.execute(
        "SELECT c.id, c.kind, c.run_id, c.rows, c.last_seq, c.head, h.public_key, c.at, c.detail, c.hash, c.sig, "
        f"c.run, c.host FROM checkpoints c LEFT JOIN hosts h ON h.id = c.host {where} ORDER BY c.id", args).fetchall()
    return [Checkpoint(*r) for r in rows]


# -- verification ------------------------------------------------------------------------------

class Broken(Exception):
    """The first thing that does not match, in words a reviewer can act on."""


@dataclass
class RunChain:
    """What verifying one run's rows needs: its checkpoints, in order."""

    run_id: str
    checkpoints: list[Checkpoint]
    bounds: list[int] = dc_field(default_factory=list)     # last_seq of each checkpoint

    def __post_init__(self) -> None:
        self.bounds = [c.last_seq or 0 for c in self.checkpoints]


class SegmentHasher:
    """Feeds rows (table by table, each in seq order) into the segments of several runs,
    then checks every segment's head against its checkpoint."""

    def __init__(self, chains: dict[Any, RunChain]):
        self.chains = chains                       # run key or run_id -> RunChain
        self.digests: dict[tuple[str, int, str], bytes] = {}
        self.rows: dict[str, int] = {}             # run_id -> rows fed
        self.segment_rows: dict[tuple[str, int], int] = {}
        self.rows_fed = 0

    def feed(self, table: str, rows: Iterable[tuple[int, Any, Any]]) -> None:
        """rows: (seq, run key or run_id, canonical text) of one table in seq order."""
        self.feed_many((table, seq, run, text) for seq, run, text in rows)

    def feed_many(self, rows: Iterable[tuple[str, int, Any, Any]]) -> None:
        """rows: (table, seq, run, canonical text or bytes), each table's rows of a run in seq
        order (tables may interleave)."""
        chains, digests, seg_rows = self.chains, self.digests, self.segment_rows
        current: dict[tuple[Any, str], list[Any]] = {}   # (run, table) -> [chain, segment, hasher, bound]
        count = 0
        for table, seq, run, text in rows:
            count += 1
            state = current.get((run, table))
            if state is None or seq > state[3]:
                chain = chains.get(run)
                if chain is None:
                    raise Broken(f"{table} seq {seq}: a row of a run that has no checkpoint (run {run!r}); "
                                 "rows were added, or its run was removed")
                if state is not None:
                    digests[(chain.run_id, state[1], table)] = state[2].digest()
                    k = state[1] + 1
                else:
                    k = bisect.bisect_left(chain.bounds, seq)
                while k < len(chain.bounds) and seq > chain.bounds[k]:
                    k += 1
                if k >= len(chain.bounds):
                    raise Broken(f"{table} seq {seq}: a row of run {chain.run_id} after its last checkpoint "
                                 f"(seq {chain.bounds[-1] if chain.bounds else '-'}): not sealed, so added "
                                 "after the fact")
                state = current[(run, table)] = [chain, k, hashlib.sha256(), chain.bounds[k]]
            if text is None:
                raise Broken(f"{table} seq {seq}: a value that cannot be read back (NULL in a canonical field)")
            state[2].update(text.encode() if type(text) is str else text)
            key = (state[0].run_id, state[1])
            seg_rows[key] = seg_rows.get(key, 0) + 1
        for (_, table), (chain, k, hasher, _) in current.items():
            digests[(chain.run_id, k, table)] = hasher.digest()
        self.rows_fed += count

    def check(self, chain: RunChain) -> None:
        """Recompute the run's heads from the fed rows and compare them with its checkpoints."""
        head = run_genesis(chain.run_id)
        rows = 0
        for k, cp in enumerate(chain.checkpoints):
            digests = {t: d for t in TABLE_ORDER if (d := self.digests.get((chain.run_id, k, t))) is not None}
            head = segment_head(head, digests)
            rows += self.segment_rows.get((chain.run_id, k), 0)
            if head != cp.head or rows != cp.rows:
                first = chain.bounds[k - 1] + 1 if k else None
                span = f"seq {first}..{cp.last_seq}" if first else f"up to seq {cp.last_seq}"
                raise Broken(f"run {chain.run_id}: its rows {span} do not match checkpoint #{cp.id} "
                             f"({rows} rows found, {cp.rows} sealed): a row there was changed, added or removed")


def check_checkpoint_chain(checkpoints: list[Checkpoint], base: bytes, keys: KeyCheck) -> None:
    """Each checkpoint's hash from its fields and the one before it; each signature."""
    prev = base
    for cp in checkpoints:
        if cp.digest(prev) != cp.hash:
            raise Broken(f"checkpoint #{cp.id} ({cp.kind}{' of run ' + cp.run_id if cp.run_id else ''}): its hash "
                         "does not match its fields and the checkpoint before it (changed, or one before it "
                         "was removed)")
        keys.check(cp)
        prev = cp.hash


class KeyCheck:
    """Signature checks: against trusted keys when given (--key), else against the keys the
    database records for its hosts (which proves consistency, not authenticity)."""

    def __init__(self, trusted: list[bytes] | None = None, acting: tuple[frozenset[bytes], str] | None = None):
        self.trusted = trusted
        # A board command's check (store.verify.acting_for): without --key, only this host's own
        # keys (none: it has none yet), named by the text, and not whichever keys the database lists —
        # anyone who can write the database can add a key of their own there and sign with it.
        self.acting = acting
        self.signers: dict[bytes, int] = {}
        self.legacy = 0            # legacy checkpoints seen: unsigned by design, never counted as signed

    def check(self, cp: Checkpoint) -> None:
        from amdflash.store.keys import fingerprint, verify_signature

        if cp.kind == LEGACY:
            self.legacy += 1
            return
        if not cp.public_key:
            raise Broken(f"checkpoint #{cp.id}: its host key is missing from the database")
        if self.trusted is not None and cp.public_key not in self.trusted:
            raise Broken(f"checkpoint #{cp.id} is signed by key {fingerprint(cp.public_key)}, which is not a "
                         "given --key: the trail was sealed (or re-sealed) by someone else")
        if self.trusted is None and self.acting is not None and cp.public_key not in self.acting[0]:
            raise Broken(f"checkpoint #{cp.id} is signed by key {fingerprint(cp.public_key)}, not by this host's "
                         f"key ({self.acting[1]}): a board command acts only on what this host signed")
        if not verify_signature(cp.public_key, cp.sig, cp.hash):
            raise Broken(f"checkpoint #{cp.id}: its signature does not verify under key "
                         f"{fingerprint(cp.public_key)}: it was changed without the host's private key")
        self.signers[cp.public_key] = self.signers.get(cp.public_key, 0) + 1


def iter_canonical(conn: sqlite3.Connection, table: str, where: str = "", args: tuple = (),
                   batch: int = 4096) -> Iterator[tuple[int, Any, str]]:
    cursor = conn.execute(canonical_sql(table, where), args)
    while True:
        rows = cursor.fetchmany(batch)
        if not rows:
            return
        yield from rows
