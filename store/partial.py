"""A run's rows as far as its signed checkpoints still vouch for them, for a run that does not
verify as a whole: what `report` shows of it (marked), and what `replay` names when it refuses.

A run's rows form segments, one per checkpoint (store.chain). Segment k is vouched for when
its checkpoint's hash and signature hold (against --key when given) and its rows rebuild that
checkpoint's head from the head of the checkpoint before it: that earlier head is itself
committed to by the signature of checkpoint k, so each segment is checked on its own, and
one changed row costs only its own segment, not every one after it. What no vouched
checkpoint covers is unverified: a segment whose head does not rebuild (or whose checkpoint
does not hold), the rows after the last checkpoint, and rows of the run outside its span.

Decisions that act on hardware (resume, restore-original, the backup kept) never read a run
this way: they use store.run_rows.open_run, which refuses the whole run.

A second copy of the run (an `audit export` file that verifies, made before the change)
names the rows that differ in a failing span: table, seq, column and both values.
"""
from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from amdflash.store.chain import (
    LEGACY,
    Broken,
    Checkpoint,
    KeyCheck,
    canonical_sql,
    check_checkpoint_chain,
    load_checkpoints,
    run_genesis,
    segment_head,
)
from amdflash.store.run_rows import RunRows, RunUnverified
from amdflash.store.schema import LOGICAL, PHYSICAL, PLAIN
from amdflash.store.verify import (
    INDEXED,
    VerifyReport,
    _acting_key,
    _base,
    _expected_schema,
    _grouped,
    _hash_before,
    _load_segments,
    _trusted,
    run_key,
)

LOGICAL_NAME = {t.physical: t.name for t in LOGICAL.values()}
MAX_DIFFERENCES = 200      # per span: a span holds at most a few thousand rows


@dataclass
class Span:
    """Rows of the run that no vouched checkpoint covers, and why."""

    first: int                      # seq range
    last: int | None                # None: to the end of the trail
    why: str
    checkpoint: int | None = None   # the checkpoint that should seal it (None: none does)
    rows_found: int = 0
    rows_sealed: int | None = None
    tables: dict[str, int] = field(default_factory=dict)    # logical table -> rows in the span now
    differences: list[dict[str, Any]] | None = None          # against a second copy, when given
    compared: str | None = None     # what the second copy said, in words

    def describe(self) -> str:
        where = f"seq {self.first}..{self.last if self.last is not None else 'end'}"
        cp = f", checkpoint #{self.checkpoint}" if self.checkpoint is not None else ""
        tables = ", ".join(f"{t} ({n})" for t, n in self.tables.items()) or "none"
        return f"{where}{cp}: {self.why}; rows there now: {tables}"

    def to_json(self) -> dict[str, Any]:
        return {"first_seq": self.first, "last_seq": self.last, "checkpoint": self.checkpoint, "why": self.why,
                "rows_found": self.rows_found, "rows_sealed": self.rows_sealed, "tables": self.tables,
                "differences": self.differences, "compared": self.compared}


@dataclass
class Partial:
    """What a run's checkpoints still vouch for (`vouched`: merged seq ranges) and what not."""

    run_id: str
    key: int
    problem: str                    # what verifying the whole run found first
    checkpoints: list[Checkpoint]
    vouched: list[tuple[int, int]]
    spans: list[Span]
    notes: list[str]
    valid: list[bool]               # per checkpoint: its hash and signature hold
    signers: dict[str, int]
    trusted: bool
    vouched_rows: int = 0

    def summary(self) -> str:
        """One line: the failing span(s), and how to name the row."""
        spans = "; ".join(s.describe() for s in self.spans) or "none"
        notes = "; ".join(self.notes)
        return f"failing span(s): {spans}" + (f"; also: {notes}" if notes else "")

    @property
    def last_vouched(self) -> int | None:
        return self.vouched[-1][1] if self.vouched else None


@dataclass(frozen=True)
class PartialRows(RunRows):
    """A RunRows whose rows are only those its vouched checkpoints seal (`ranges`): the report
    reads a run that does not verify through it. Never handed to a decision on hardware."""

    ranges: tuple[tuple[int, int], ...] = ()

    def where(self, alias: str = "", sealed_only: bool = False) -> str:
        a = f"{alias}." if alias else ""
        spans = " OR ".join(f"{a}seq BETWEEN ? AND ?" for _ in self.ranges) or "0"
        return f"{a}run_id = ? AND ({spans})"

    def params(self, sealed_only: bool = False) -> list[object]:
        return [self.run_id, *(v for r in self.ranges for v in r)]

    def unsealed(self, seq: int) -> bool:
        return not any(lo <= seq <= hi for lo, hi in self.ranges)

    @property
    def unsealed_rows(self) -> int:
        return 0


# -- the schema: what reading the run needs to be amdflash's own ------------------------------

def schema_problems(conn: sqlite3.Connection) -> tuple[str | None, list[str]]:
    """(what makes the trail unreadable, what was changed but does not change what is read).
    A view, table or constant table the views decode with that is not amdflash's: nothing read
    through it can be shown. A trigger or index dropped, redefined or added: the rows are
    still checked against their checkpoints (dropping the append-only trigger is how a row is
    changed; the segment check finds the row)."""
    objects, helpers = _expected_schema()
    found = {(t, n): sql for t, n, sql in conn.execute(
        "SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL")}
    notes: list[str] = []
    for (kind, name), sql in objects.items():
        got = found.get((kind, name))
        said = f"{kind} {name} is missing" if got is None else f"{kind} {name} was redefined" if got != sql else None
        if said is None:
            continue
        if kind in ("trigger", "index"):
            notes.append(f"{said}: amdflash's schema was changed")
        else:
            return f"{said}: amdflash's schema was changed, so nothing read through it can be shown", notes
    for kind, name in sorted(set(found) - set(objects)):
        if kind == "view" and not name.startswith("v1_"):
            notes.append(f"view {name} is not part of amdflash's schema: it was added (the report reads none)")
        elif kind == "trigger":
            notes.append(f"trigger {name} is not part of amdflash's schema: it was added")
    for helper, rows in helpers.items():
        if conn.execute(f"SELECT * FROM {helper} ORDER BY 1").fetchall() != rows:
            return f"table {helper}, which the views decode with, does not hold its constant rows", notes
    return None, notes


# -- segment by segment --------------------------------------------------------------------------

def check_segments(conn: sqlite3.Connection, run_id: str, problem: str,
                   keyfiles: list[Path] | None = None) -> Partial:
    """Each segment of the run checked on its own (call inside the caller's snapshot). Raises
    RunUnverified (with `problem`, what verifying the whole run found) where nothing can be
    shown: the views are not amdflash's, the run is a legacy one, or no checkpoint vouches
    for any of its rows."""
    fatal, notes = schema_problems(conn)
    if fatal is not None:
        raise RunUnverified(problem, problem)
    try:
        key = run_key(conn, run_id)
    except Broken as e:
        raise RunUnverified(str(e), str(e)) from None
    checkpoints = load_checkpoints(conn, "WHERE c.run = ? AND c.kind IN ('commit', 'final', ?)", (key, LEGACY))
    if any(c.kind == LEGACY for c in checkpoints):
        raise RunUnverified(problem, problem)        # unsigned by design: nothing to check segment by segment
    through, base, _ = _base(load_checkpoints(conn, "WHERE c.kind = 'archive'"))
    keys = KeyCheck(_trusted(keyfiles), _acting_key())
    valid, whys = [], []
    for cp in checkpoints:
        try:
            check_checkpoint_chain([cp], _hash_before(conn, cp.id, through, base), keys)
            valid.append(True)
            whys.append("")
        except Broken as e:
            valid.append(False)
            whys.append(str(e))
    bounds, lo = [], key
    for cp in checkpoints:
        hi = cp.last_seq if isinstance(cp.last_seq, int) else lo - 1
        bounds.append((lo, hi))
        lo = max(lo, hi + 1)
    digests, counts = _segment_digests(conn, run_id, key, bounds)
    spans: list[Span] = []
    good: list[tuple[int, int]] = []
    vouched_rows = 0
    for k, (cp, (lo, hi)) in enumerate(zip(checkpoints, bounds, strict=True)):
        prev = checkpoints[k - 1] if k else None
        head = segment_head(run_genesis(run_id) if prev is None else (prev.head or b""), digests.get(k, {}))
        found = sum(counts.get(k, {}).values())
        sealed = (cp.rows or 0) - ((prev.rows or 0) if prev is not None else 0)
        if valid[k] and head == cp.head and found == sealed:
            vouched_rows += found
            if good and good[-1][1] + 1 >= lo:
                good[-1] = (good[-1][0], hi)
            else:
                good.append((lo, hi))
            continue
        why = (f"checkpoint #{cp.id} does not hold: {whys[k]}" if not valid[k] else
               f"its rows do not rebuild the head checkpoint #{cp.id} signed ({found} rows found, {sealed} sealed): "
               "a row there was changed, added or removed")
        spans.append(Span(lo, hi, why, cp.id, found, sealed, _named(counts.get(k, {}))))
    if not good:
        raise RunUnverified(problem, problem)
    tail = bounds[-1][1] + 1 if bounds else key
    ended = bool(checkpoints) and checkpoints[-1].kind == "final" and valid[-1]
    after = _rows_from(conn, run_id, key, tail)
    if after:
        why = ("rows after its final checkpoint, which sealed its end: added after the fact" if ended else
               "rows no checkpoint seals (the run was still being written, or its writer died, or they were added)")
        spans.append(Span(tail, None, why, None, sum(after.values()), None, _named(after)))
    notes += _outside(conn, run_id, key)
    from amdflash.store.keys import fingerprint

    signers = {fingerprint(k): n for k, n in keys.signers.items()}
    return Partial(run_id, key, problem, checkpoints, good, spans, notes, valid, signers, keys.trusted is not None,
                   vouched_rows)


def _segment_digests(conn: sqlite3.Connection, run_id: str, key: int, bounds: list[tuple[int, int]]) \
        -> tuple[dict[int, dict[str, bytes]], dict[int, dict[str, int]]]:
    """Per segment k: each table's digest and row count (store.verify's grouped queries)."""
    _load_segments(conn, [(k + 1, key, run_id, lo, hi) for k, (lo, hi) in enumerate(bounds)])
    digests: dict[int, dict[str, bytes]] = {}
    counts: dict[int, dict[str, int]] = {}
    try:
        for table in PHYSICAL:
            for ident, n, digest in _grouped(conn, table):
                digests.setdefault(ident - 1, {})[table] = digest
                counts.setdefault(ident - 1, {})[table] = n
    finally:
        conn.execute("DELETE FROM _segments")
    return digests, counts


def _where(table: str) -> str:
    return "run_id = ?" if table in PLAIN else "run = ?"


def _rows_from(conn: sqlite3.Connection, run_id: str, key: int, first: int) -> dict[str, int]:
    """The run's rows with seq >= `first`, counted per table."""
    out = {}
    for table in PHYSICAL:
        value = run_id if table in PLAIN else key
        if table in INDEXED:
            n = conn.execute(f"SELECT count(*) FROM {table} WHERE {_where(table)} AND seq >= ?", (value, first))
        else:
            n = conn.execute(f"SELECT count(*) FROM {table} WHERE seq >= ? AND +{_where(table)}", (first, value))
        count = n.fetchone()[0]
        if count:
            out[table] = count
    return out


def _outside(conn: sqlite3.Connection, run_id: str, key: int) -> list[str]:
    """Rows of the run before its runs row, and a second runs row with its id: outside every
    span its checkpoints seal (added after the fact)."""
    notes = [f"runs seq {seq}: a second runs row for run {run_id} (its own is seq {key}): added after the fact, "
             "not shown" for (seq,) in conn.execute("SELECT seq FROM runs WHERE run_id = ? AND seq != ?",
                                                    (run_id, key))]
    for table in PHYSICAL:
        if table == "runs" or table not in INDEXED:
            continue
        value = run_id if table in PLAIN else key
        found = conn.execute(f"SELECT count(*), min(seq) FROM {table} WHERE {_where(table)} AND seq < ?",
                             (value, key)).fetchone()
        if found[0]:
            notes.append(f"{LOGICAL_NAME.get(table, table)}: {found[0]} row(s) of the run from seq {found[1]}, before "
                         f"its first row (runs seq {key}): outside every span its checkpoints seal, not shown")
    return notes


def _named(counts: dict[str, int]) -> dict[str, int]:
    return {LOGICAL_NAME.get(t, t): n for t, n in counts.items()}


def rows_view(partial: Partial, check: VerifyReport) -> PartialRows:
    """The report's view of the run: only the rows its vouched checkpoints seal."""
    return PartialRows(partial.run_id, partial.key, partial.last_vouched, check, tuple(partial.vouched))


def with_spans(conn: sqlite3.Connection, run_id: str, error: RunUnverified,
            keyfiles: list[Path] | None = None) -> RunUnverified:
    """`error` (open_run's refusal) with every failing span named, and how to see the rest and
    name the row: for a command that refuses to act on a run that does not verify."""
    try:
        partial = check_segments(conn, run_id, error.problem, keyfiles)
    except RunUnverified:
        return error
    partial.notes = [n for n in partial.notes if n != error.problem]
    return RunUnverified(f"{error}; {partial.summary()}; what its checkpoints still vouch for, marked: amdflash "
                         f"report {run_id} (written to a file with --unverified); the rows that changed: amdflash "
                         f"report {run_id} --against EXPORT (a copy made before, by audit export)", error.problem)


# -- a second copy: an export ---------------------------------------------------------------------

def _trail_rows(conn: sqlite3.Connection, table: str, run_id: str, key: int, lo: int, hi: int | None) \
        -> dict[int, list[Any]]:
    where = f"p.{'run_id' if table in PLAIN else 'run'} = ? AND p.seq BETWEEN ? AND ?"
    value = run_id if table in PLAIN else key
    out: dict[int, list[Any]] = {}
    for seq, _, text in conn.execute(canonical_sql(table, where), (value, lo, hi if hi is not None else 2 ** 62)):
        # A row SQLite cannot write canonically (verify names it) differs from any copy: '?'.
        out[seq] = json.loads(text)[2:] if text is not None else ["?"] * len(PHYSICAL[table])
    return out


def _copy_value(kind: str, value: Any) -> Any:
    """An export's value as the canonical form holds it (a blob as ["b", hex], a reference as
    its SHA-256 in hex)."""
    if isinstance(value, dict) and kind == "blob":
        return ["b", value.get("hex")]
    if isinstance(value, dict) and kind == "ref":
        return value.get("sha256")
    return value


def compare_with_export(partial: Partial, conn: sqlite3.Connection, path: Path,
                        keyfiles: list[Path] | None = None) -> str:
    """Name the rows that differ between the trail and the export at `path`, in every failing
    span (Span.differences). The export must verify (its rows rebuild its signed checkpoints,
    under --key when given) and hold the run; else ValueError naming why. Returns a line
    saying what the copy is."""
    from amdflash.store.export import ExportFormatError, read_records, verify_export

    try:
        checked = verify_export(path, keyfiles)
    except ExportFormatError as e:
        raise ValueError(f"--against {path}: not an amdflash export: {e}") from None
    except OSError as e:
        raise ValueError(f"--against {path}: {e.strerror or e}") from None
    if not checked.ok:
        raise ValueError(f"--against {path}: the export does not verify, so it names nothing: {checked.first_bad}")
    if partial.run_id not in checked.runs:
        raise ValueError(f"--against {path}: the export does not hold run {partial.run_id}")
    copy_key: int | None = None
    wanted = partial.spans
    copy: dict[tuple[str, int], list[Any]] = {}
    copy_cps: dict[int, str] = {}
    for _, r, _ in read_records(path):
        if r["record"] == "row" and r["table"] == "runs" and r["values"].get("run_id") == partial.run_id:
            copy_key = r["seq"]
        if r["record"] == "checkpoint" and r.get("run_id") == partial.run_id:
            copy_cps[r["id"]] = r["hash"]
    for _, r, _ in read_records(path):
        if r["record"] != "row" or r["table"] not in PHYSICAL:
            continue
        table, seq, values = r["table"], r["seq"], r["values"]
        owner = values.get("run_id") if table in PLAIN else values.get("run")
        if owner != (partial.run_id if table in PLAIN else copy_key):
            continue
        if any(s.first <= seq <= (s.last if s.last is not None else 2 ** 62) for s in wanted):
            copy[(table, seq)] = [_copy_value(k, values.get(c)) for c, k in PHYSICAL[table]]

    def rows_of(table: str, lo: int, hi: int | None) -> dict[int, list[Any]]:
        top = hi if hi is not None else 2 ** 62
        return {seq: v for (t, seq), v in copy.items() if t == table and lo <= seq <= top}

    _diff(partial, conn, rows_of, copy_cps)
    return f"{path}: an export that verifies ({checked.rows} rows, sealed by {checked.sealed_by})"


def compare_with_trail(partial: Partial, conn: sqlite3.Connection, copy: sqlite3.Connection, name: str,
                       keyfiles: list[Path] | None = None) -> str:
    """As compare_with_export, against another audit database's copy of the run (the central
    record's, materialized by store.central): its copy must verify (under --key when given)."""
    from amdflash.store.verify import verify_run

    checked = verify_run(copy, partial.run_id, keyfiles)
    if not checked.ok or checked.key is None:
        raise ValueError(f"{name}: its copy of run {partial.run_id} does not verify, so it names nothing: "
                         f"{checked.problem}")
    key = checked.key
    copy_cps = {c.id: c.hash.hex() for c in load_checkpoints(copy, "WHERE c.run = ?", (key,))}

    def rows_of(table: str, lo: int, hi: int | None) -> dict[int, list[Any]]:
        return _trail_rows(copy, table, partial.run_id, key, lo, hi)

    _diff(partial, conn, rows_of, copy_cps)
    return f"{name}: its copy of the run verifies ({checked.rows} rows, {checked.checkpoints} signed checkpoints)"


def _diff(partial: Partial, conn: sqlite3.Connection, copy_rows: Callable[[str, int, int | None], dict[int, list[Any]]],
          copy_cps: dict[int, str]) -> None:
    """Each failing span's rows here against the copy's (Span.differences, Span.compared)."""
    own = {c.id: c.hash.hex() for c in partial.checkpoints}
    for span in partial.spans:
        span.differences = []
        for table, columns in PHYSICAL.items():
            here = _trail_rows(conn, table, partial.run_id, partial.key, span.first, span.last)
            there = copy_rows(table, span.first, span.last)
            names = [c for c, _ in columns]
            for seq in sorted(set(here) | set(there)):
                a, b = here.get(seq), there.get(seq)
                name = LOGICAL_NAME.get(table, table)
                if b is None:
                    span.differences.append({"table": name, "seq": seq, "change": "added",
                                             "trail": dict(zip(names, a or [], strict=False)), "copy": None})
                elif a is None:
                    span.differences.append({"table": name, "seq": seq, "change": "removed", "trail": None,
                                             "copy": dict(zip(names, b, strict=False))})
                else:
                    for column, x, y in zip(names, a, b, strict=False):
                        if x != y:
                            span.differences.append({"table": name, "seq": seq, "change": "changed",
                                                     "column": column, "trail": x, "copy": y})
        span.differences.sort(key=lambda d: d["seq"])
        del span.differences[MAX_DIFFERENCES:]
        held = span.checkpoint is not None and copy_cps.get(span.checkpoint) == own.get(span.checkpoint)
        span.compared = (f"the copy holds checkpoint #{span.checkpoint} as the trail does, and its rows rebuild it: "
                         "the copy's values are the ones it signed" if held else
                         "no checkpoint seals these rows in either copy: they are only compared"
                         if span.checkpoint is None else
                         f"the copy's checkpoint #{span.checkpoint} differs from the trail's: compared only")


def difference_words(d: dict[str, Any]) -> str:
    """One difference, in a line."""
    if d["change"] == "changed":
        return (f"{d['table']} seq {d['seq']} column {d['column']}: the trail says {json.dumps(d['trail'])}, "
                f"the copy {json.dumps(d['copy'])}")
    if d["change"] == "removed":
        return f"{d['table']} seq {d['seq']}: removed from the trail; the copy holds {json.dumps(d['copy'])}"
    return f"{d['table']} seq {d['seq']}: in the trail, not in the copy (added): {json.dumps(d['trail'])}"
