"""Compliance export of the audit trail, and verification of an exported file.

An export is a stream of records, one per audit row in seq order, each carrying its table,
seq, every column and both chain hashes (`prev_hash`, `hash`), so that any row can be
checked on its own with `chain.link` long after the database is gone. The last record is
the chain head at export time (table `chain_head`, with `run_id` naming the exported run or
null for the whole trail, and `rows` counting the audit rows written): a file that lost its
end, or rows from its middle, no longer matches it.

Values are reconstructed exactly as SQLite returned them (int, float, str, None, bytes),
because the hash covers their Python repr:

* JSONL: one JSON object per line; a blob is `{"hex": "..."}` (no other value is an object).
* CSV: columns `table, seq, prev_hash, hash, types, rows` then every audit column by name;
  `types` gives, in the table's schema column order, one letter per value (i int, f float,
  s str, b bytes, n null), because a CSV cell alone cannot tell None from "" or 5 from "5".
  A blob cell reads `hex:...`; a float is written as its repr, which reads back exactly.
"""
from __future__ import annotations

import csv
import heapq
import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, TextIO

from amdflash.store.chain import link
from amdflash.store.schema import AUDIT_TABLES, GENESIS

FORMATS = ("jsonl", "csv")
HEAD = "chain_head"
JSON_BLOB_KEY = "hex"
CSV_BLOB_PREFIX = "hex:"
CSV_FIXED = ("table", "seq", "prev_hash", "hash", "types", "rows")
TERMINAL = ("succeeded", "failed", "interrupted", "refused")

_COLUMNS: dict[str, tuple[str, ...]] = {t: tuple(cols) for t, cols in AUDIT_TABLES.items()}
# Every audit column once, in first-seen schema order: the CSV's value columns.
CSV_VALUE_COLUMNS: tuple[str, ...] = tuple(dict.fromkeys(c for cols in _COLUMNS.values() for c in cols))
_TYPE_LETTERS = {int: "i", float: "f", str: "s", bytes: "b", type(None): "n"}


class ExportFormatError(ValueError):
    """A record that cannot be read back; names its line."""

    def __init__(self, line: int, message: str):
        super().__init__(f"line {line}: {message}")
        self.line = line
        self.reason = message


@dataclass
class Record:
    """One audit row (or the chain head record) as exported."""

    table: str
    seq: int
    hash: str
    prev_hash: str | None = None
    values: dict[str, Any] = field(default_factory=dict)
    run_id: str | None = None     # chain head record: the exported run, None for the whole trail
    rows: int | None = None       # chain head record: audit rows in the export
    line: int = 0

    @property
    def where(self) -> str:
        return f"line {self.line} ({self.table} seq {self.seq})"


# -- reading the database --------------------------------------------------------------------

@dataclass
class ExportSummary:
    rows: int
    first_seq: int | None
    last_seq: int | None
    head_seq: int
    head_hash: str
    run_id: str | None


def _hash_at(conn: sqlite3.Connection, seq: int) -> str:
    if seq < 1:
        return GENESIS
    for table in _COLUMNS:
        row = conn.execute(f"SELECT hash FROM {table} WHERE seq = ?", (seq,)).fetchone()
        if row:
            return row[0]
    raise RuntimeError(f"no audit row has seq {seq}: the chain is broken there ('amdflash audit verify')")


def run_seq_range(conn: sqlite3.Connection, run_id: str, head_seq: int) -> tuple[int, int]:
    """The seq span holding a run's rows: from its runs row to its final status row.

    Rows of concurrent runs interleave inside the span, so callers still filter by run_id;
    the span only spares a scan of the whole bulk tables, which carry no run_id index.
    """
    row = conn.execute("SELECT seq FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    if row is None:
        raise LookupError(f"no run {run_id!r} in the audit database")
    last = conn.execute("SELECT seq, status FROM run_status WHERE run_id = ? ORDER BY seq DESC LIMIT 1",
                        (run_id,)).fetchone()
    # A run that never recorded its outcome (the host died) may have rows up to the head.
    end = last[0] if last and last[1] in TERMINAL else head_seq
    return row[0], end


def _rows_between(conn: sqlite3.Connection, lo: int, hi: int) -> Iterator[tuple[int, str, sqlite3.Row]]:
    def table_rows(table: str) -> Iterator[tuple[int, str, sqlite3.Row]]:
        cur = conn.execute(f"SELECT * FROM {table} WHERE seq BETWEEN ? AND ? ORDER BY seq", (lo, hi))
        for r in cur:
            yield r["seq"], table, r

    return heapq.merge(*(table_rows(t) for t in _COLUMNS), key=lambda x: x[0])


def iter_records(conn: sqlite3.Connection, run_id: str | None = None) -> Iterator[Record]:
    """Audit rows in seq order with their prev_hash, then the chain head record.

    Runs inside one read transaction, so the head matches the rows even while a writer
    appends (WAL readers see a snapshot).
    """
    conn.row_factory = sqlite3.Row
    conn.execute("BEGIN")
    try:
        head_seq, head_hash = conn.execute("SELECT seq, hash FROM chain_head WHERE id = 1").fetchone()
        lo, hi = run_seq_range(conn, run_id, head_seq) if run_id else (1, head_seq)
        prev = _hash_at(conn, lo - 1)
        count = 0
        for seq, table, row in _rows_between(conn, lo, hi):
            if run_id is None or row["run_id"] == run_id:
                count += 1
                yield Record(table, seq, row["hash"], prev, {c: row[c] for c in _COLUMNS[table]})
            prev = row["hash"]
        yield Record(HEAD, head_seq, head_hash, run_id=run_id, rows=count)
    finally:
        conn.execute("COMMIT")
        conn.row_factory = None


# -- writing ---------------------------------------------------------------------------------

def _json_value(value: Any) -> Any:
    return {JSON_BLOB_KEY: bytes(value).hex()} if isinstance(value, (bytes, bytearray, memoryview)) else value


def _csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return CSV_BLOB_PREFIX + bytes(value).hex()
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _type_letters(values: dict[str, Any]) -> str:
    try:
        return "".join(_TYPE_LETTERS[type(v)] for v in values.values())
    except KeyError as e:
        raise TypeError(f"cannot export a value of type {e.args[0].__name__}") from None


class _JsonlWriter:
    def __init__(self, out: TextIO):
        self.out = out

    def write(self, r: Record) -> None:
        if r.table == HEAD:
            obj: dict[str, Any] = {"table": HEAD, "seq": r.seq, "hash": r.hash, "run_id": r.run_id, "rows": r.rows}
        else:
            obj = {"table": r.table, "seq": r.seq, "prev_hash": r.prev_hash, "hash": r.hash,
                   **{k: _json_value(v) for k, v in r.values.items()}}
        self.out.write(json.dumps(obj, separators=(",", ":")) + "\n")


class _CsvWriter:
    def __init__(self, out: TextIO):
        self.writer = csv.writer(out, lineterminator="\n")
        self.writer.writerow(CSV_FIXED + CSV_VALUE_COLUMNS)

    def write(self, r: Record) -> None:
        if r.table == HEAD:
            cells = {"run_id": r.run_id or ""}
            fixed = [HEAD, str(r.seq), "", r.hash, "", str(r.rows)]
        else:
            cells = {k: _csv_cell(v) for k, v in r.values.items()}
            fixed = [r.table, str(r.seq), r.prev_hash or "", r.hash, _type_letters(r.values), ""]
        self.writer.writerow(fixed + [cells.get(c, "") for c in CSV_VALUE_COLUMNS])


def export(conn: sqlite3.Connection, out: TextIO, fmt: str, run_id: str | None = None) -> ExportSummary:
    """Write the trail (or one run's rows) to `out`; the text stream must use newline=''."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r} (one of {', '.join(FORMATS)})")
    writer = _JsonlWriter(out) if fmt == "jsonl" else _CsvWriter(out)
    first = last = None
    for r in iter_records(conn, run_id):
        writer.write(r)
        if r.table == HEAD:
            return ExportSummary(r.rows or 0, first, last, r.seq, r.hash, run_id)
        first = r.seq if first is None else first
        last = r.seq
    raise AssertionError("iter_records ends with the chain head record")


# -- reading an export -----------------------------------------------------------------------

def _sniff(path: Path) -> str:
    with open(path, encoding="utf-8", newline="") as f:
        start = f.read(64).lstrip("\ufeff \t\r\n")
    if start.startswith("{"):
        return "jsonl"
    if start.startswith(",".join(CSV_FIXED[:2])):
        return "csv"
    raise ExportFormatError(1, "neither an amdflash JSONL export (a JSON object per line) nor a CSV export "
                               f"(header starting '{','.join(CSV_FIXED)}')")


def _json_decode(line: int, column: str, value: Any) -> Any:
    if value is None or type(value) in (int, float, str):
        return value
    if isinstance(value, dict) and set(value) == {JSON_BLOB_KEY} and isinstance(value[JSON_BLOB_KEY], str):
        try:
            return bytes.fromhex(value[JSON_BLOB_KEY])
        except ValueError:
            raise ExportFormatError(line, f"column {column}: blob is not hex") from None
    raise ExportFormatError(line, f"column {column}: {type(value).__name__} is not an audit value")


def _str_field(line: int, obj: dict[str, Any], key: str, optional: bool = False) -> str | None:
    value = obj.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise ExportFormatError(line, f"{key!r} is missing or not a string")
    return value


def _int_field(line: int, value: Any, key: str) -> int:
    if type(value) is int:
        return value
    if isinstance(value, str):
        try:
            return int(value, 10)
        except ValueError:
            pass
    raise ExportFormatError(line, f"{key!r} is missing or not an integer")


def _read_jsonl(f: Iterable[str]) -> Iterator[Record]:
    for n, text in enumerate(f, 1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise ExportFormatError(n, f"not valid JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise ExportFormatError(n, "not a JSON object")
        table = _str_field(n, obj, "table")
        seq = _int_field(n, obj.get("seq"), "seq")
        digest = _str_field(n, obj, "hash")
        if table == HEAD:
            rows = obj.get("rows")
            yield Record(HEAD, seq, digest, run_id=_str_field(n, obj, "run_id", optional=True),
                         rows=_int_field(n, rows, "rows"), line=n)
            continue
        values = {k: _json_decode(n, k, v) for k, v in obj.items() if k not in ("table", "seq", "prev_hash", "hash")}
        yield Record(table, seq, digest, _str_field(n, obj, "prev_hash"), values, line=n)


def _csv_decode(line: int, column: str, letter: str, cell: str) -> Any:
    try:
        if letter == "n":
            if cell:
                raise ValueError("null with a value")
            return None
        if letter == "i":
            return int(cell)
        if letter == "f":
            return float(cell)
        if letter == "s":
            return cell
        if letter == "b" and cell.startswith(CSV_BLOB_PREFIX):
            return bytes.fromhex(cell[len(CSV_BLOB_PREFIX):])
    except ValueError:
        pass
    raise ExportFormatError(line, f"column {column}: {cell[:40]!r} is not a value of type {letter!r}")


def _read_csv(f: Iterable[str]) -> Iterator[Record]:
    reader = csv.reader(f)
    header = next(reader, None)
    if header is None or tuple(header[:len(CSV_FIXED)]) != CSV_FIXED:
        raise ExportFormatError(1, f"CSV header must start with {','.join(CSV_FIXED)}")
    names = header[len(CSV_FIXED):]
    for cells in reader:
        n = reader.line_num
        if len(cells) != len(header):
            raise ExportFormatError(n, f"{len(cells)} cells, the header has {len(header)}")
        table, seq_text, prev, digest, types, rows = cells[:len(CSV_FIXED)]
        by_name = dict(zip(names, cells[len(CSV_FIXED):]))
        seq = _int_field(n, seq_text, "seq")
        if table == HEAD:
            yield Record(HEAD, seq, digest, run_id=by_name.get("run_id") or None, rows=_int_field(n, rows, "rows"),
                         line=n)
            continue
        columns = _COLUMNS.get(table)
        if columns is None:
            raise ExportFormatError(n, f"unknown table {table!r}")
        if len(types) != len(columns):
            raise ExportFormatError(n, f"types {types!r} has {len(types)} letters; {table} has {len(columns)} columns")
        stray = [c for c, v in by_name.items() if v and c not in columns]
        if stray:
            raise ExportFormatError(n, f"values in columns that {table} does not have: {', '.join(stray)}")
        missing = [c for c in columns if c not in by_name]
        if missing:
            raise ExportFormatError(n, f"the header lacks columns of {table}: {', '.join(missing)}")
        values = {c: _csv_decode(n, c, t, by_name[c]) for c, t in zip(columns, types)}
        yield Record(table, seq, digest, prev, values, line=n)


def read_export(path: Path) -> Iterator[Record]:
    """The records of an exported file (JSONL or CSV, told apart by content)."""
    fmt = _sniff(path)
    with open(path, encoding="utf-8", newline="") as f:
        yield from (_read_jsonl(f) if fmt == "jsonl" else _read_csv(f))


# -- verification ----------------------------------------------------------------------------

@dataclass
class ExportReport:
    ok: bool
    rows: int
    partial: bool = False
    run_id: str | None = None
    first_seq: int | None = None
    last_seq: int | None = None
    head_seq: int | None = None
    head_hash: str | None = None
    first_bad: str | None = None

    def describe(self) -> str:
        if not self.ok:
            return f"export BROKEN at {self.first_bad} (checked {self.rows} rows before it)"
        head = f"chain head at export: seq {self.head_seq} hash {self.head_hash}"
        if not self.partial:
            span = f", seq 1..{self.last_seq}" if self.rows else ""
            return f"export intact: complete chain of {self.rows} rows{span}, ending at the chain head\n{head}"
        span = f"seq {self.first_seq}..{self.last_seq}" if self.rows else "no rows"
        return (f"export intact as a PARTIAL chain: {self.rows} rows of run {self.run_id} ({span}).\n"
                "Each row's hash was recomputed from its content and its recorded prev_hash, and rows adjacent "
                "in seq were linked to each other; the rows of other runs between them are not in this file, "
                "so the chain across those gaps can only be checked against the full trail "
                "('amdflash audit verify', or a full export).\n" + head)


class _Broken(Exception):
    def __init__(self, where: str, reason: str):
        super().__init__(f"{where}: {reason}")


def _values(r: Record) -> tuple[Any, ...]:
    columns = _COLUMNS.get(r.table)
    if columns is None:
        raise _Broken(r.where, f"unknown table {r.table!r}")
    if set(r.values) != set(columns):
        extra, missing = set(r.values) - set(columns), set(columns) - set(r.values)
        raise _Broken(r.where, "columns do not match the schema"
                      + (f"; unknown: {', '.join(sorted(extra))}" if extra else "")
                      + (f"; missing: {', '.join(sorted(missing))}" if missing else ""))
    return tuple(r.values[c] for c in columns)


def _last_record(path: Path) -> Record:
    """The file's final record, read from its tail: the export's scope is needed up front."""
    truncated = _Broken("end of file", "the last record is not the chain_head record: "
                                       "the export is truncated or incomplete")
    with open(path, "rb") as f:
        header = f.readline()
        f.seek(0, 2)
        f.seek(max(0, f.tell() - 65536))
        lines = [line for line in f.read().splitlines() if line.strip()]
    if not lines:
        raise truncated
    text = lines[-1].decode("utf-8", "replace")
    source = [text] if header.lstrip().startswith(b"{") else [header.decode("utf-8", "replace"), text]
    try:
        record = next((_read_jsonl if len(source) == 1 else _read_csv)(iter(source)), None)
    except ExportFormatError:
        raise truncated from None
    if record is None or record.table != HEAD:
        raise truncated
    return record


def verify_export(path: Path) -> ExportReport:
    """Recompute every exported row's hash; name the first record that does not match.

    A whole-trail export must be the complete chain from genesis to the head it records;
    a single-run export is a partial chain: each row is checked against its own prev_hash,
    rows adjacent in seq against each other, and every row must belong to the run.
    """
    checked = 0
    prev: Record | None = None
    first: Record | None = None
    head: Record | None = None
    try:
        _sniff(path)
        scope = _last_record(path).run_id
        for r in read_export(path):
            if head is not None:
                raise _Broken(r.where, "a record after the chain_head record")
            if r.table == HEAD:
                head = r
                continue
            values = _values(r)
            if r.prev_hash is None or link(r.prev_hash, r.table, r.seq, values) != r.hash:
                raise _Broken(r.where, "stored hash does not match its content and prev_hash")
            if scope is not None and r.values["run_id"] != scope:
                raise _Broken(r.where, f"a row of run {r.values['run_id']!r} in the export of run {scope}")
            if prev is None:
                first = r
                if r.seq == 1 and r.prev_hash != GENESIS:
                    raise _Broken(r.where, "the first row of the chain does not start from the genesis hash")
                if scope is None and r.seq != 1:
                    raise _Broken(r.where, f"rows seq 1..{r.seq - 1} are missing")
            elif r.seq <= prev.seq:
                raise _Broken(r.where, f"out of order: follows seq {prev.seq}")
            elif r.seq == prev.seq + 1 and r.prev_hash != prev.hash:
                raise _Broken(r.where, f"prev_hash is not the hash of the row before it (seq {prev.seq})")
            elif r.seq > prev.seq + 1 and scope is None:
                raise _Broken(r.where, f"rows seq {prev.seq + 1}..{r.seq - 1} are missing")
            prev = r
            checked += 1
        assert head is not None  # _last_record found it
        if head.rows != checked:
            raise _Broken(head.where, f"the export records {head.rows} rows but holds {checked}")
        last = (prev.seq, prev.hash) if prev else (0, GENESIS)
        if scope is None and last != (head.seq, head.hash):
            raise _Broken(head.where, f"the last row (seq {last[0]}) is not the recorded chain head: "
                                      "rows are missing from the end")
    except ExportFormatError as e:
        return ExportReport(False, checked, first_bad=f"line {e.line}: {e.reason}")
    except UnicodeDecodeError as e:
        return ExportReport(False, checked, first_bad=f"byte {e.start}: the file is not UTF-8 text")
    except csv.Error as e:
        return ExportReport(False, checked, first_bad=f"record after {checked} rows: unreadable CSV ({e})")
    except _Broken as e:
        return ExportReport(False, checked, first_bad=str(e))
    return ExportReport(True, checked, partial=scope is not None, run_id=scope,
                        first_seq=first.seq if first else None, last_seq=prev.seq if prev else None,
                        head_seq=head.seq, head_hash=head.hash)
