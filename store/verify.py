"""`audit verify`: recompute the chains of a database (or of one run) and check every seal.

All reads happen inside one read transaction: a writer appending meanwhile is not seen, so
an intact database is never reported broken because it grew during the check.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from amdflash.store import keys, schema
from amdflash.store.chain import (
    GENESIS,
    LEGACY,
    Broken,
    Checkpoint,
    KeyCheck,
    RunChain,
    SegmentHasher,
    canonical_expr,
    check_checkpoint_chain,
    iter_canonical,
    load_checkpoints,
    run_genesis,
    segment_head,
)
from amdflash.store.files import read_regular
from amdflash.store.read_only import connect_reader, reader_uri  # noqa: F401 - the readers' way in, used from here
from amdflash.store.schema import LOGICAL, PHYSICAL, PLAIN, RUN_END_SQL, TERMINAL
from amdflash.stages.terminal import printable

RUN_KINDS = ("commit", "final", "migrated")
ANCHOR_LIMIT = 1 << 30    # one short line per checkpoint: millions of runs fit


@dataclass
class Legacy:
    """The part of a trail an older amdflash recorded, unsigned (store.migrate): what
    verifies it is only its own version-1 chain, checked at the upgrade."""

    rows: int                  # rows its legacy checkpoints seal
    first: int                 # its seq range
    last: int
    runs: int
    migration: int             # the signed checkpoint that says where it ends

    def describe(self) -> str:
        return (f"{self.rows} legacy rows (seq {self.first}..{self.last}, {self.runs} run(s)) recorded by an "
                "older amdflash, unsigned: verified by their unsigned v1 chain only (at the upgrade, "
                f"checkpoint #{self.migration}); no signature covers them")


def legacy_part(checkpoints: list[Checkpoint], migrations: list[Checkpoint]) -> Legacy | None:
    """The legacy part sealed by `checkpoints` (LEGACY ones), None if none. They must all come
    before the signed migration checkpoint and end where it says the legacy part ends: a
    legacy checkpoint anywhere else was not made by an upgrade (Broken)."""
    legacy = [c for c in checkpoints if c.kind == LEGACY]
    if not legacy:
        return None
    if not migrations:
        raise Broken(f"checkpoint #{legacy[0].id} (run {legacy[0].run_id}) seals legacy rows (an older amdflash's, "
                     "unsigned), but no migration checkpoint says where the legacy part ends: not made by "
                     "'audit upgrade'")
    migration = migrations[0]
    try:
        end = int(json.loads(migration.detail or "{}")["v1_head_seq"])
    except (ValueError, KeyError, TypeError):
        raise Broken(f"migration checkpoint #{migration.id}: its detail does not say where the legacy part "
                     "ends (v1_head_seq)") from None
    for c in legacy:
        if c.id > migration.id or (c.last_seq or 0) > end:
            raise Broken(f"checkpoint #{c.id} (run {c.run_id}) seals legacy rows after the migration checkpoint "
                         f"#{migration.id}, which ends the legacy part at seq {end}: added after the upgrade")
    last = {c.run_id: c.rows or 0 for c in legacy}
    return Legacy(sum(last.values()), 1, end, len(last), migration.id)


@contextlib.contextmanager
def snapshot(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One consistent view of the database for everything read inside (WAL read transaction)."""
    if conn.in_transaction:
        yield conn
        return
    conn.execute("BEGIN")
    try:
        yield conn
    finally:
        if conn.in_transaction:
            conn.execute("COMMIT")


@dataclass
class VerifyReport:
    ok: bool
    scope: str                               # "the database" or "run RUN_ID"
    rows: int = 0
    checkpoints: int = 0
    runs: int = 0
    head: Checkpoint | None = None           # the newest checkpoint checked
    signers: dict[str, int] = field(default_factory=dict)   # key fingerprint -> checkpoints
    legacy: Legacy | None = None             # rows of an older amdflash: never signed (store.migrate)
    legacy_checkpoints: int = 0              # the checkpoints that seal them (unsigned)
    unsigned: bool = False                   # --key asked for signatures the legacy rows cannot have
    trusted: bool = False                    # checked against --key
    archived: str | None = None              # what an archive seal vouches for
    anchor: str | None = None                # what the anchor file said
    ended: bool | None = None                # run scope: did the run record its end
    key: int | None = None                   # run scope: the run's key (the seq of its runs row)
    sealed: int | None = None                # run scope: the last seq its checkpoints seal (None: none)
    unsealed: dict[str, int] = field(default_factory=dict)   # run -> rows after its last checkpoint
    problem: str | None = None
    seconds: float = 0.0
    # The database's tail, when no anchor was compared (a reviewer's copy): the anchor path its
    # checkpoints record ("" if none records one). None: an anchor was compared, or not asked.
    unwitnessed: str | None = None

    @property
    def verdict(self) -> str:
        """intact (exit 0), or what it found wrong (exit 1): broken; not signed (--key and rows of
        an older amdflash); not proven (a run no checkpoint seals: no signature vouches for any of it)."""
        if self.unsigned:
            return "not signed"
        if not self.ok:
            return "broken"
        if self.key is not None and self.sealed is None:
            return "not proven"
        return "intact"

    def proven(self) -> list[str]:
        """What the check proved (store.verdicts)."""
        from amdflash.store.verdicts import proven
        return proven(self)

    def not_proven(self) -> list[str]:
        from amdflash.store.verdicts import not_proven
        return not_proven(self)

    def would_prove(self, command: str = "amdflash audit verify") -> list[str]:
        from amdflash.store.verdicts import would_prove
        return would_prove(self, command)

    def as_json(self, command: str = "amdflash audit verify") -> dict[str, Any]:
        from amdflash.store.verdicts import as_json
        return as_json(self, command)

    def describe(self, command: str | None = None) -> str:
        """The verdict in lines, one field each: a newline in a recorded value the verdict names
        (a run id INSERTed by hand) is shown escaped, never as a line that reads as the verdict's.
        With `command` (the `audit verify` line that made it), also what was proven, what was
        not, and what would prove it."""
        lines = self._lines()
        if command is not None and self.ok and not self.unsigned:
            from amdflash.store.verdicts import summary_lines
            lines += summary_lines(self, command)
        return "\n".join(printable(line) for line in lines)

    def _lines(self) -> list[str]:
        if self.unsigned:
            return [f"audit chain NOT SIGNED in {self.scope}: {self.problem}"]
        if not self.ok:
            return [f"audit chain BROKEN in {self.scope}: {self.problem}"]
        if self.verdict == "not proven":
            return [f"audit chain NOT PROVEN in {self.scope}: no checkpoint seals any of its {self.rows} row(s), so "
                    "no signature vouches for any of it (a run INSERTed by hand, or one whose process died before "
                    "its first seal)"]
        lines = [f"audit chain intact: {self.scope}, {self.rows} rows, {self.runs} run(s), "
                 f"{self.checkpoints - self.legacy_checkpoints} signed checkpoints ({self.seconds:.2f} s)"]
        if self.legacy is not None:
            lines.append(f"legacy      {self.legacy.describe()}")
        if self.head is not None:
            lines.append(f"chain head  checkpoint #{self.head.id} hash {self.head.hash.hex()}")
        signers = ", ".join(f"{fp} ({n})" for fp, n in self.signers.items()) or "none"
        how = "verified against the given --key" if self.trusted else \
            "valid under the keys recorded in the database; pass --key PUBFILE to prove who signed"
        if self.legacy is not None:
            how += " (the legacy rows above excepted)"
        lines.append(f"signatures  {how}: {signers}")
        for run_id, n in self.unsealed.items():
            lines.append(f"unsealed    run {run_id}: its last {n} row(s) are committed but not sealed yet (the run "
                         "is still being written, or its writer died before sealing them): not verifiable")
        if self.ended is not None:
            lines.append("run end     " + ("recorded and sealed" if self.ended else
                                           "not recorded (the run's host died, or it is still running)"))
        if self.archived:
            lines.append(f"archived    {self.archived}")
        if self.anchor:
            lines.append(f"anchor      {self.anchor}")
        return lines


def _base(checkpoints: list[Checkpoint]) -> tuple[int, bytes, str | None]:
    """Where the checkpoint chain of this database starts: genesis, or after the runs the
    newest archive seal took away."""
    seals = [c for c in checkpoints if c.kind == "archive"]
    if not seals:
        return 0, GENESIS, None
    seal = seals[-1]
    info = json.loads(seal.detail or "{}")
    through = int(info["through_checkpoint"])
    what = (f"checkpoints 1..{through} and {len(info.get('runs', []))} run(s) were archived to "
            f"{info.get('file')} (sha256 {info.get('file_sha256', '?')[:16]}…) by seal #{seal.id}")
    return through, bytes.fromhex(info["through_hash"]), what


def _chains(checkpoints: list[Checkpoint]) -> dict[Any, RunChain]:
    by_run: dict[str, list[Checkpoint]] = {}
    for cp in checkpoints:
        if cp.kind in RUN_KINDS and cp.run_id:
            by_run.setdefault(cp.run_id, []).append(cp)
    chains: dict[Any, RunChain] = {}
    for run_id, cps in by_run.items():
        chain = RunChain(run_id, cps)
        chains[run_id] = chain
        chains[cps[0].run] = chain
    return chains


def _trusted(keyfiles: list[Path] | None) -> list[bytes] | None:
    return [keys.read_public(p) for p in keyfiles] if keyfiles else None


# The host key file of a command that acts on a board (pipeline.commands.board), while it runs:
# what it reads of the trail to decide — what is unfinished, what a resume keeps, which backup
# is the original — counts as signed only under this host's own key.
_acting: ContextVar[tuple[Path, ...] | None] = ContextVar("amdflash_acting_key", default=None)


@contextlib.contextmanager
def acting_for(key_paths: Sequence[Path]) -> Iterator[None]:
    """Checks made inside (without --key) accept only the keys at `key_paths` (this account's
    own: pipeline.engine.auditdb.own_key_paths), read at each check (a command's first run
    creates the first of them)."""
    token = _acting.set(tuple(key_paths))
    try:
        yield
    finally:
        _acting.reset(token)


def _acting_key() -> tuple[frozenset[bytes], str] | None:
    paths = _acting.get()
    if paths is None:
        return None
    found: list[tuple[bytes | None, str]] = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            found.append((None, f"no key at {path}"))
            continue
        found.append(_public_at(path, st.st_ino, st.st_mtime_ns, st.st_size, st.st_mode))
    publics = frozenset(public for public, _ in found if public)
    return publics, " or ".join(text for _, text in found) if found else "it has no key"


@functools.lru_cache(maxsize=4)
def _public_at(path: Path, inode: int, mtime: int, size: int, mode: int) -> tuple[bytes | None, str]:
    """The key file's public half, read once per version of the file (a decision verifies
    every run it looks at)."""
    public = keys.public_of(path)
    return public, keys.fingerprint(public) if public else f"no usable key at {path}"


def _checked(report: VerifyReport, keyfiles: list[Path] | None, body: Callable[[KeyCheck], None]) -> VerifyReport:
    """Run a check, recording its outcome, the signers seen and the time it took."""
    started = time.perf_counter()
    check = KeyCheck(_trusted(keyfiles), _acting_key())
    report.trusted = check.trusted is not None
    try:
        body(check)
        report.ok = True
    except Broken as e:
        report.problem = str(e)
    report.signers = {keys.fingerprint(k): n for k, n in check.signers.items()}
    report.legacy_checkpoints = check.legacy
    report.seconds = time.perf_counter() - started
    return report


def verify_database(conn: sqlite3.Connection, keyfiles: list[Path] | None = None,
                    anchor: Path | None = None) -> VerifyReport:
    report = VerifyReport(False, "the database")

    # The anchor is read before the database: an entry is appended only after its checkpoint
    # is committed, so everything read here must be in the snapshot read next.
    anchored = read_anchor(anchor)

    def body(check: KeyCheck) -> None:
        with snapshot(conn):
            check_schema(conn)
            checkpoints = load_checkpoints(conn)
            report.checkpoints = len(checkpoints)
            through, base, report.archived = _base(checkpoints)
            if checkpoints and checkpoints[0].id != through + 1:
                raise Broken(f"the first checkpoint is #{checkpoints[0].id}, expected #{through + 1}: "
                             "checkpoints were removed")
            check_checkpoint_chain(checkpoints, base, check)
            _check_head(conn, checkpoints)
            report.legacy = legacy_part(checkpoints, [c for c in checkpoints if c.kind == "migration"])
            by_id = {c.run_id: c for c in _chains(checkpoints).values()}
            runs: dict[str, int] = {}
            for run_id, key in conn.execute("SELECT run_id, seq FROM runs ORDER BY seq"):
                chain = by_id.get(run_id)
                # A run has one runs row: the one its checkpoints name (check_runs names any other).
                if run_id not in runs or (chain is not None and key == chain.checkpoints[0].run):
                    runs[run_id] = key
            for run_id, chain in by_id.items():
                if runs.get(run_id) != chain.checkpoints[0].run:
                    raise Broken(f"run {run_id} has checkpoints but its runs row is missing or moved")
            report.rows, report.unsealed = check_runs(conn, runs, by_id, whole=True)
            _check_blobs(conn, "SELECT id, sha256, data FROM blobs")
            report.runs = len(runs)
            report.head = checkpoints[-1] if checkpoints else None
        claims = anchor_claims([c for c in checkpoints if c.id > through])
        if anchor is not None and anchored is None and not anchor_expected(anchor, claims):
            # A copy away from the recording host's files: nothing here can say whether its tail
            # is complete (store.verdicts says what would), and no file is missing where the
            # database says it should be.
            report.unwitnessed = claims[-1][1] if claims else ""
        else:
            report.anchor = check_anchor(anchor, anchored, checkpoints, through)

    return _checked(report, keyfiles, body)


def verify_run(conn: sqlite3.Connection, run_id: str, keyfiles: list[Path] | None = None) -> VerifyReport:
    """One run's rows and its checkpoints, reading nothing of other runs: O(that run)."""
    report = VerifyReport(False, f"run {run_id}")

    def body(check: KeyCheck) -> None:
        with snapshot(conn):
            check_schema(conn)
            key = report.key = run_key(conn, run_id)
            checkpoints = load_checkpoints(conn, "WHERE c.run = ?", (key,))
            through, base, _ = _base(load_checkpoints(conn, "WHERE c.kind = 'archive'"))
            for cp in checkpoints:
                check_checkpoint_chain([cp], _hash_before(conn, cp.id, through, base), check)
            if any(c.kind == LEGACY for c in checkpoints):
                migrations = load_checkpoints(conn, "WHERE c.kind = 'migration'")
                legacy = report.legacy = legacy_part(checkpoints, migrations)
                if check.trusted is not None and legacy is not None:
                    report.unsigned = True
                    raise Broken(f"run {run_id} was recorded by an older amdflash, unsigned: its rows are verified "
                                 f"only by their version-1 chain, checked when the trail was upgraded (checkpoint "
                                 f"#{legacy.migration}); no signature of it can be checked against --key")
                for cp in migrations[:1]:     # the signed checkpoint that says where the legacy part ends
                    check_checkpoint_chain([cp], _hash_before(conn, cp.id, through, base), check)
            chains = {run_id: RunChain(run_id, checkpoints)} if checkpoints else {}
            report.rows, report.unsealed = check_runs(conn, {run_id: key}, chains)
            # The bytes its rows refer to: the run's rows lie between its runs row and its end
            # (the bulk tables carry no run index), so this reads that span, not the rest.
            end = conn.execute(f"SELECT {RUN_END_SQL} FROM runs r WHERE r.seq = ?", (key,)).fetchone()[0]
            for table, columns in PHYSICAL.items():
                for c, kind in columns:
                    if kind == "ref":
                        _check_blobs(conn, f"SELECT b.id, b.sha256, b.data FROM {table} p JOIN blobs b ON b.id = p.{c} "
                                           "WHERE p.seq BETWEEN ? AND ? AND p.run = ?", (key, end, key))
            report.runs = 1
            report.checkpoints, report.head = len(checkpoints), checkpoints[-1] if checkpoints else None
            report.sealed = checkpoints[-1].last_seq if checkpoints else None
            report.ended = bool(checkpoints) and checkpoints[-1].kind == "final"

    return _checked(report, keyfiles, body)


def run_key(conn: sqlite3.Connection, run_id: str) -> int:
    """The seq of the run's runs row: the one its checkpoints name, or its only one (check_runs
    names any other)."""
    keys = [k for (k,) in conn.execute("SELECT seq FROM runs WHERE run_id = ? ORDER BY seq", (run_id,))]
    if not keys:
        raise Broken(f"no run {run_id} in the database")
    if len(keys) > 1:
        named = {k for (k,) in conn.execute(
            f"SELECT DISTINCT run FROM checkpoints WHERE run IN ({', '.join('?' * len(keys))})", keys)}
        keys = sorted(named & set(keys)) or keys
    return keys[0]


def check_runs(conn: sqlite3.Connection, runs: dict[str, int], chains: dict[str, RunChain],
               whole: bool = False) -> tuple[int, dict[str, int]]:
    """Recompute the heads of `runs` (run_id -> key) from their rows and compare them with
    their checkpoints (`chains`). Returns (rows checked, unsealed rows by run). `whole`:
    `runs` are all the database's, so every row of every table must lie in one of them.

    SQLite builds each segment's canonical text itself (one grouped query per table over all
    segments); a run whose heads do not match is then checked again row by row, which names
    the segment that differs. Rows after a run's last checkpoint are counted: the writer
    seals a run's end with the row that records it, so a run sealed as ended has none, and
    an end no checkpoint seals was not written by it."""
    for run_id, key in runs.items():
        _outside_before(conn, run_id, key)
    segments: list[tuple[int, str, int, int, int]] = []   # (id, run_id, k, lo, hi)
    tails: dict[str, int] = {}                              # run_id -> first unsealed seq
    ended = {r for r, c in chains.items() if r in runs and c.checkpoints[-1].kind == "final"}
    for run_id, key in runs.items():
        chain = chains.get(run_id)
        lo = key
        for k, hi in enumerate(chain.bounds if chain else []):
            segments.append((len(segments) + 1, run_id, k, lo, hi))
            lo = hi + 1
        tails[run_id] = lo
    rows = [(i, runs[r], r, lo, hi) for i, r, _, lo, hi in segments]
    where = {i: (r, k) for i, r, k, _, _ in segments}
    digests: dict[tuple[str, int, str], bytes] = {}
    counts: dict[tuple[str, int], int] = {}
    seen: dict[str, int] = {}
    unsealed: dict[str, int] = {}
    # The bulk table's second half is hashed by a second connection in a thread of its own:
    # SQLite builds the text without the interpreter lock, so both cores work. Its snapshot
    # may be newer, which changes nothing in sealed spans of an append-only trail; should it
    # differ anyway (an archive meanwhile), the run is checked again on this snapshot below.
    path = conn.execute("PRAGMA database_list").fetchone()[2]
    half = len(rows) // 2 if path and len(rows) >= PARALLEL_SEGMENTS else len(rows)
    helper = _Helper(path, rows[half:]) if half < len(rows) else None
    _load_segments(conn, rows)
    try:
        for table in PHYSICAL:
            if table == BULK and helper is not None:
                results = _grouped(conn, table, rows[half - 1][0]) + helper.result()
            else:
                results = _grouped(conn, table)
            for ident, n, digest in results:
                run_id, k = where[ident]
                digests[(run_id, k, table)] = digest
                counts[(run_id, k)] = counts.get((run_id, k), 0) + n
                seen[table] = seen.get(table, 0) + n
            for run_id, lo in tails.items():
                column, value = ("run_id", run_id) if table in PLAIN else ("run", runs[run_id])
                if run_id in ended:
                    # A run sealed as ended: its index finds any row added after (a table
                    # without one, the bulk log, is left to the whole database's count).
                    if table not in INDEXED:
                        continue
                    sql = f"SELECT count(*) FROM {table} WHERE {column} = ? AND seq >= ?"
                    n = conn.execute(sql, (value, lo)).fetchone()[0]
                else:
                    n = conn.execute(f"SELECT count(*) FROM {table} WHERE seq >= ? AND +{column} = ?",
                                     (lo, value)).fetchone()[0]
                if n:
                    unsealed[run_id] = unsealed.get(run_id, 0) + n
                    seen[table] = seen.get(table, 0) + n
        if whole:
            _no_strays(conn, seen)
    finally:
        conn.execute("DELETE FROM _segments")
    for run_id, n in unsealed.items():
        if run_id in ended:
            raise Broken(f"run {run_id}: {n} row(s) after its final checkpoint #{chains[run_id].checkpoints[-1].id}, "
                         "which sealed its end: added after the fact")
        end = conn.execute(f"SELECT status FROM run_status WHERE run_id = ? AND seq >= ? "
                           f"AND status IN ({', '.join('?' * len(TERMINAL))}) LIMIT 1",
                           (run_id, tails[run_id], *TERMINAL)).fetchone()
        if end:
            raise Broken(f"run {run_id}: its end ('{end[0]}') is in rows no checkpoint seals; amdflash "
                         "seals a run's end as it records it: added after the fact")
    total = 0
    for run_id, key in runs.items():
        chain = chains.get(run_id)
        if chain is None:
            continue
        checked = _heads(chain, digests, counts)
        if checked is None:
            checked = _exact(conn, run_id, key, chain)
        total += checked
    return total + sum(unsealed.values()), unsealed


def _outside_before(conn: sqlite3.Connection, run_id: str, key: int) -> None:
    """A run's rows begin with its runs row (seq `key`): its first span starts there, so a row
    of the run with a lower seq (or a second runs row) lies outside every span it sealed —
    added after the fact, whatever its seq. Found through each table's per-run index, at the
    cost of that run; the bulk tables have none, and no per-run read sees their rows outside
    the run's seq span (the views walk it), so the whole database's count finds those."""
    other = conn.execute("SELECT seq FROM runs WHERE run_id = ? AND seq != ? ORDER BY seq LIMIT 1",
                         (run_id, key)).fetchone()
    if other:
        raise Broken(f"runs seq {other[0]}: a second runs row for run {run_id} (its own is seq {key}): "
                     "added after the fact")
    first: tuple[int, str] | None = None
    for table in PHYSICAL:
        if table == "runs" or table not in INDEXED:
            continue
        column, value = ("run_id", run_id) if table in PLAIN else ("run", key)
        seq = conn.execute(f"SELECT min(seq) FROM {table} WHERE {column} = ? AND seq < ?", (value, key)).fetchone()[0]
        if seq is not None and (first is None or seq < first[0]):
            first = seq, table
    if first is not None:
        raise Broken(f"{first[1]} seq {first[0]}: a row of run {run_id} before its first row (runs seq {key}), "
                     "outside every span its checkpoints seal: added after the fact")


BULK = "log_spi"
INDEXED = {t.physical for t in LOGICAL.values() if t.index}   # tables with a per-run index
PARALLEL_SEGMENTS = 64     # from this many segments on, a second thread hashes half of the bulk table


def _load_segments(conn: sqlite3.Connection, rows: list[tuple[int, int, str, int, int]]) -> None:
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS _segments (id INTEGER PRIMARY KEY, run INTEGER, run_id TEXT, "
                 "lo INTEGER, hi INTEGER)")
    conn.execute("DELETE FROM _segments")
    conn.executemany("INSERT INTO _segments VALUES (?, ?, ?, ?, ?)", rows)


def _grouped(conn: sqlite3.Connection, table: str, last: int = 2 ** 62) -> list[tuple[int, int, bytes]]:
    """(segment id, rows, digest of the rows' canonical text) of `table`, for every segment in
    _segments (up to id `last`) that holds rows of it."""
    expr, joins = canonical_expr(table)
    # The seq range is the way in (unary + keeps SQLite from indexing run instead).
    on = ("p.run_id = g.run_id AND p.seq BETWEEN g.lo AND g.hi" if table in PLAIN else
          "p.seq BETWEEN g.lo AND g.hi AND +p.run = g.run")
    out = []
    for ident, n, text in conn.execute(f"SELECT g.id, count(*), group_concat({expr}, '') FROM _segments g "
                                       f"CROSS JOIN {table} p ON {on}{joins} WHERE g.id <= ? GROUP BY g.id", (last,)):
        # A NULL canonical field makes the whole text NULL: it cannot match.
        out.append((ident, n, hashlib.sha256(text.encode() if text is not None else b"\x00").digest()))
    return out


class _Helper:
    """The bulk table's rows of some segments, hashed on a connection and thread of their own."""

    def __init__(self, path: str, rows: list[tuple[int, int, str, int, int]]):
        self.done: list[tuple[int, int, bytes]] | BaseException = []
        self.thread = threading.Thread(target=self._run, args=(path, rows), name="verify-helper", daemon=True)
        self.thread.start()

    def _run(self, path: str, rows: list[tuple[int, int, str, int, int]]) -> None:
        try:
            conn = connect_reader(path)
            try:
                conn.execute("BEGIN")
                _load_segments(conn, rows)
                self.done = _grouped(conn, BULK)
                conn.execute("COMMIT")
            finally:
                conn.close()
        except BaseException as e:  # handed to the caller
            self.done = e

    def result(self) -> list[tuple[int, int, bytes]]:
        self.thread.join()
        if isinstance(self.done, BaseException):
            raise self.done
        return self.done


def _heads(chain: RunChain, digests: dict[tuple[str, int, str], bytes],
           counts: dict[tuple[str, int], int]) -> int | None:
    """The rows of the run if every head matches its checkpoint, else None."""
    head, rows = run_genesis(chain.run_id), 0
    for k, cp in enumerate(chain.checkpoints):
        head = segment_head(head, {t: d for t in PHYSICAL if (d := digests.get((chain.run_id, k, t))) is not None})
        rows += counts.get((chain.run_id, k), 0)
        if head != cp.head or rows != cp.rows:
            return None
    return rows


def _exact(conn: sqlite3.Connection, run_id: str, key: int, chain: RunChain) -> int:
    """The run checked row by row (raises Broken naming the first segment that differs)."""
    hasher = SegmentHasher({run_id: chain, key: chain})
    last = chain.bounds[-1]
    for table in PHYSICAL:
        if table in PLAIN:
            hasher.feed(table, iter_canonical(conn, table, "p.run_id = ? AND p.seq <= ?", (run_id, last)))
        else:
            hasher.feed(table, iter_canonical(conn, table, "p.seq BETWEEN ? AND ? AND p.run = ?", (key, last, key)))
    hasher.check(chain)
    return hasher.rows_fed


def _no_strays(conn: sqlite3.Connection, seen: dict[str, int]) -> None:
    """Every row belongs to a run of the database: each table holds no more rows than the
    runs' spans held (and if it does, the first stray one is named)."""
    for table in PHYSICAL:
        total = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        if total == seen.get(table, 0):
            continue
        column, ref = ("run_id", "run_id") if table in PLAIN else ("run", "seq")
        row = conn.execute(f"SELECT seq FROM {table} WHERE {column} NOT IN (SELECT {ref} FROM runs) LIMIT 1").fetchone()
        if row:
            raise Broken(f"{table} seq {row[0]}: a row of no run in the database (its run was removed)")
        raise Broken(f"{table}: {total - seen.get(table, 0)} row(s) outside what their runs sealed (before a run "
                     "began, or after its final checkpoint): added after the fact")


@functools.cache
def _expected_schema() -> tuple[dict[tuple[str, str], str], dict[str, list[tuple]]]:
    """amdflash's own schema objects ((type, name) -> SQL) and its constant tables' rows, as
    this version creates them."""
    fresh = sqlite3.connect(":memory:")
    try:
        schema.create(fresh)
        objects = {(t, n): sql for t, n, sql in fresh.execute(
            "SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL")}
        helpers = {h: fresh.execute(f"SELECT * FROM {h} ORDER BY 1").fetchall() for h in schema.HELPERS}
    finally:
        fresh.close()
    return objects, helpers


def check_schema(conn: sqlite3.Connection) -> None:
    """The views a reviewer reads the trail through, the triggers that keep it append-only
    and the constant tables the views decode with are amdflash's own: none was redefined,
    dropped or added (rows are chained and signed; these definitions are checked here)."""
    objects, helpers = _expected_schema()
    found = {(t, n): sql for t, n, sql in conn.execute(
        "SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL")}
    for (kind, name), sql in objects.items():
        got = found.get((kind, name))
        if got is None:
            raise Broken(f"{kind} {name} is missing: amdflash's schema was changed")
        if got != sql:
            raise Broken(f"{kind} {name} is not amdflash's definition of it: it was redefined")
    for kind, name in sorted(set(found) - set(objects)):
        if kind in ("view", "trigger") and not name.startswith("v1_"):
            raise Broken(f"{kind} {name} is not part of amdflash's schema: it was added")
    for helper, rows in helpers.items():
        if conn.execute(f"SELECT * FROM {helper} ORDER BY 1").fetchall() != rows:
            raise Broken(f"table {helper}, which the views decode with, does not hold its constant rows")


def _hash_before(conn: sqlite3.Connection, ident: int, through: int, base: bytes) -> bytes:
    if ident == through + 1:
        return base
    row = conn.execute("SELECT hash FROM checkpoints WHERE id = ?", (ident - 1,)).fetchone()
    if row is None:
        raise Broken(f"checkpoint #{ident - 1}, before the run's checkpoint #{ident}, is missing")
    return row[0]


def _check_head(conn: sqlite3.Connection, checkpoints: list[Checkpoint]) -> None:
    head = conn.execute("SELECT checkpoint, hash FROM chain_head WHERE id = 1").fetchone()
    last = checkpoints[-1] if checkpoints else None
    if head is None or head[0] != (last.id if last else 0) or (last and head[1] != last.hash):
        raise Broken(f"chain head: recorded checkpoint #{head[0] if head else '?'} is not the last one "
                     f"(#{last.id if last else 0}): checkpoints were removed from the end")


def _check_blobs(conn: sqlite3.Connection, sql: str, args: tuple = ()) -> None:
    for ident, sha, data in conn.execute(sql, args):
        if hashlib.sha256(data).digest() != sha:
            raise Broken(f"blob {ident}: its bytes do not match their SHA-256 (content changed)")


def read_anchor(path: Path | None) -> list[tuple[int, dict[str, Any]]] | None:
    """(line, entry) of the anchor file; None when there is none."""
    if path is None or not path.exists():
        return None
    entries = []
    content = read_regular(path, ANCHOR_LIMIT).decode("utf-8", errors="replace")
    for n, text in enumerate(content.splitlines(), 1):
        if text.strip():
            try:
                entries.append((n, json.loads(text)))
            except ValueError:
                entries.append((n, {}))
    return entries


# -- witnesses of the chain: the anchor file (here), the central record (store.central) ---------

def local_checkpoints(conn: sqlite3.Connection) -> tuple[int, list[Checkpoint]]:
    """(the last checkpoint archive seals took away, the checkpoints after it) of this
    database, in one snapshot: what a witness of the chain compares with what it saw — the
    anchor file (check_anchor), or an off-host record (`audit verify --central`)."""
    with snapshot(conn):
        checkpoints = load_checkpoints(conn)
    return _base(checkpoints)[0], checkpoints


@dataclass(frozen=True)
class Witnessed:
    """One checkpoint as a witness saw it."""

    where: str          # e.g. "anchor FILE line N"
    id: int
    hash: bytes
    at: str | None = None


def compare_witness(seen: list[Witnessed], checkpoints: list[Checkpoint], through: int) -> int:
    """Every checkpoint a witness saw must still be in the database, unchanged (those an
    archive seal took away excepted: the seal vouches for them). Returns the newest id seen."""
    by_id = {c.id: c for c in checkpoints}
    newest = 0
    for w in seen:
        newest = max(newest, w.id)
        if w.id <= through:
            continue
        cp = by_id.get(w.id)
        if cp is None:
            raise Broken(f"{w.where} names checkpoint #{w.id} ({w.at}), which the database does not have: its tail "
                         "was removed or it was replaced by an older copy")
        if cp.hash != w.hash:
            raise Broken(f"{w.where}: checkpoint #{w.id} in the database differs from the one witnessed at {w.at}: "
                         "the database was rewritten")
    return newest


def anchor_claims(checkpoints: list[Checkpoint]) -> list[tuple[Checkpoint, str]]:
    """The checkpoints that record (signed, in their detail) that they were appended to an
    anchor file, with its path: the newest of every seal a writer with an anchor made, and
    archive seals. They are how the database remembers that it is anchored."""
    out = []
    for cp in checkpoints:
        if cp.detail and '"anchor"' in cp.detail:
            try:
                recorded = json.loads(cp.detail).get("anchor")
            except (ValueError, AttributeError):
                continue
            if isinstance(recorded, str):
                out.append((cp, recorded))
    return out


def anchor_expected(path: Path, claims: list[tuple[Checkpoint, str]]) -> bool:
    """Whether the anchor must be at `path`: the trail's signed checkpoints record that they
    were appended to the anchor at that very path (the operator's trail, on its host, where the
    writer keeps it beside the database). A copy elsewhere (a reviewer's) expects none there;
    an explicit --anchor is refused earlier if missing."""
    if not claims:
        return False
    recorded = claims[-1][1]
    here = os.path.abspath(path)
    return recorded == here or os.path.realpath(recorded) == os.path.realpath(here)


ANCHOR_SETTLE = (0.05, 0.1, 0.25, 0.5)   # seconds between re-reads of an anchor that looks short


def check_anchor(path: Path | None, entries: list[tuple[int, dict[str, Any]]] | None,
                 checkpoints: list[Checkpoint], through: int) -> str | None:
    """The anchor file against the database: every checkpoint it saw must still be there,
    unchanged; and once the trail has been anchored (its checkpoints say so), the anchor
    must exist and reach the newest seal but one (the newest may still be on its way: the
    writer appends it just after committing it)."""
    if path is None:
        return None
    claims = anchor_claims([c for c in checkpoints if c.id > through])
    if entries is None:
        if claims:
            cp, recorded = claims[-1]
            raise Broken(f"no anchor file at {path}, but the trail is anchored: checkpoint #{cp.id} records that it "
                         f"was appended to {recorded}. The anchor was deleted or moved (a database whose tail was "
                         "cut looks like this); pass --anchor FILE if it is elsewhere")
        return f"{path}: no anchor file (nothing to compare; no checkpoint records an anchor)"
    newest = compare_witness(_witnessed(path, entries), checkpoints, through)
    if len(claims) >= 2 and newest < claims[-2][0].id:
        newest = _settled_newest(path, checkpoints, claims[-2][0].id, newest)
        if newest < claims[-2][0].id:
            cp, recorded = claims[-2]
            raise Broken(f"anchor {path} is shorter than the trail: its newest entry is checkpoint #{newest or '-'}, "
                         f"but checkpoints #{cp.id} and #{claims[-1][0].id} record that they were appended to "
                         f"{recorded}: it was trimmed or replaced by an older copy (or appending to it failed)")
    return f"{path}: {len(entries)} entries, the newest checkpoint #{newest}, all in the database unchanged"


def _witnessed(path: Path, entries: list[tuple[int, dict[str, Any]]]) -> list[Witnessed]:
    out = []
    for n, entry in entries:
        try:
            out.append(Witnessed(f"anchor {path} line {n}", int(entry["checkpoint"]), bytes.fromhex(entry["hash"]),
                                 entry.get("at")))
        except (ValueError, KeyError, TypeError):
            raise Broken(f"anchor {path} line {n} is not an anchor entry") from None
    return out


def _settled_newest(path: Path, checkpoints: list[Checkpoint], needed: int, newest: int) -> int:
    """The anchor read again, after the database: a writer appends a seal's entry just after
    committing it, so one read before the snapshot may lag it. Entries that match the
    snapshot, or are newer than it, count."""
    by_id = {c.id: c.hash for c in checkpoints}
    top = checkpoints[-1].id if checkpoints else 0
    for pause in ANCHOR_SETTLE:
        entries = read_anchor(path) or []
        for w in _witnessed(path, entries):
            if w.id > top or by_id.get(w.id) == w.hash:
                newest = max(newest, w.id)
        if newest >= needed:
            break
        time.sleep(pause)
    return newest
