"""Exports of the audit trail (one run, the whole database, or an archive), and their
verification without the database.

An export is a stream of records, one JSON object per line (JSONL); the CSV form has the
same records, one per row, in the columns `record, table, seq, json` (the JSON cell holding
the record exactly as the JSONL line would). Records, in order:

    header      format, version, scope (run | database | archive), the runs it holds, and
                the checkpoint chain's starting point (checkpoint id and hash)
    host        a signing host: id, Ed25519 public key (hex), hostname, machine-id
    blob        content-addressed bytes: sha256 and data (hex), before the first row using them
    row         a physical audit row: table, seq, values by column (a blob is {"hex": ...},
                a blob reference {"sha256": ...})
    checkpoint  a seal: every field, the hash of the checkpoint before it (prev), its hash and
                its signature (hex)
    end         how many rows, blobs and checkpoints the file holds (and how many rows were
                left out because no checkpoint sealed them yet)
    seal        the export's own signature, by the exporting host's key: the SHA-256 of the
                records of each kind (header, host, blob, row, checkpoint, end), each record
                as its JSON text (the JSONL line, the CSV json cell) followed by "\n", in file
                order; the public key; and an Ed25519 signature over
                "amdflash-export-seal|header:HEX|host:HEX|blob:HEX|row:HEX|checkpoint:HEX|end:HEX|KEYHEX"

Everything needed to recompute each run's chain (store.chain) and check each signature is
in the file, so an export verifies on its own, and one run's export is a complete record of
that run: its rows and every checkpoint that sealed them. Rows and checkpoints are vouched
for by the recording hosts' signatures; the header (scope, runs, where the chain starts),
the host records and the end counts by the seal, so an edit of any field is named.

An export is written as its rows are read and verified a line at a time (memory does not grow
with the trail); a gzip-compressed one (audit export --compress, or FILE.gz) is read as it is.

A file that cannot be read as an export (not UTF-8, not JSON, a record of unknown kind, a
missing field or one of the wrong type) is malformed: ExportFormatError, which the command
line shows as `error: ...` with exit 2. A well-formed file that does not match its
signatures, hashes or counts is BROKEN (exit 1), naming the first record that does not.
"""
from __future__ import annotations

import csv
import datetime as dt
import gzip
import hashlib
import io
import json
import operator
import re
import sqlite3
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from amdflash.store import export_rows, keys
from amdflash.store.chain import (
    GENESIS,
    Broken,
    Checkpoint,
    KeyCheck,
    RunChain,
    SegmentHasher,
    canonical,
    check_checkpoint_chain,
    load_checkpoints,
)
from amdflash.store.schema import PHYSICAL, SCHEMA_VERSION
from amdflash.store.verify import RUN_KINDS, _base, snapshot

FORMATS = ("jsonl", "csv")
FORMAT_NAME = "amdflash-audit-export"
CSV_COLUMNS = ("record", "table", "seq", "json")
SCOPES = ("run", "database", "archive")
SEALED = ("header", "host", "blob", "row", "checkpoint", "end")     # record kinds the seal covers
SEAL_PREFIX = "amdflash-export-seal"


class ExportFormatError(ValueError):
    """A record that cannot be read back; names its line."""

    def __init__(self, line: int, message: str):
        super().__init__(f"line {line}: {message}" if line else message)
        self.line = line
        self.reason = message


@dataclass
class ExportSummary:
    rows: int = 0
    blobs: int = 0
    checkpoints: int = 0
    runs: list[str] = field(default_factory=list)
    head: Checkpoint | None = None
    unsealed: int = 0        # rows recorded after their run's last checkpoint: not exported
    blob_ids: Bits = field(default_factory=lambda: Bits())     # the blobs written (their ids here)


# -- writing ---------------------------------------------------------------------------------------

def checkpoint_record(cp: Checkpoint, prev: bytes) -> dict[str, Any]:
    return {"record": "checkpoint", "id": cp.id, "kind": cp.kind, "run_id": cp.run_id, "rows": cp.rows,
            "last_seq": cp.last_seq, "head": cp.head.hex() if cp.head else None, "public_key": cp.public_key.hex(),
            "at": cp.at, "detail": cp.detail, "prev": prev.hex(), "hash": cp.hash.hex(), "sig": cp.sig.hex()}


def seal_message(digests: dict[str, str], public_key: bytes) -> bytes:
    """What an export's seal signs: the digest of each kind of record, and the signing key."""
    return "|".join([SEAL_PREFIX, *(f"{kind}:{digests[kind]}" for kind in SEALED), public_key.hex()]).encode()


_TEXT = operator.itemgetter(2)


class _Out:
    def __init__(self, out: TextIO, fmt: str):
        if fmt not in FORMATS:
            raise ValueError(f"unknown export format {fmt!r} (one of {', '.join(FORMATS)})")
        self.out = out
        self.csv = csv.writer(out, lineterminator="\n") if fmt == "csv" else None
        if self.csv:
            self.csv.writerow(CSV_COLUMNS)
        self.digests = {kind: hashlib.sha256() for kind in SEALED}

    def write(self, record: dict[str, Any]) -> None:
        self.write_text(record["record"], json.dumps(record, separators=(",", ":")), record)

    def write_text(self, kind: str, text: str, record: dict[str, Any] | None = None) -> None:
        """A record already written as JSON text (a row's table and seq go to the CSV columns)."""
        self.digests[kind].update(text.encode() + b"\n")
        if self.csv:
            record = record or {}
            self.csv.writerow([kind, record.get("table", ""), record.get("seq", ""), text])
        else:
            self.out.write(text + "\n")

    def rows(self, rows: list[tuple]) -> int:
        """Row records ((seq, run, JSON text, table, ...) each), in order: one digest update, one
        write. Returns how many."""
        if not rows:
            return 0
        chunk = "\n".join(map(_TEXT, rows)) + "\n"
        self.digests["row"].update(chunk.encode())
        if self.csv:
            self.csv.writerows(("row", r[3], r[0], r[2]) for r in rows)
        else:
            self.out.write(chunk)
        return len(rows)

    def seal(self, key: Ed25519PrivateKey) -> None:
        """The last record: every record before it, signed with the exporting host's key."""
        public = keys.public_bytes(key)
        digests = {kind: h.hexdigest() for kind, h in self.digests.items()}
        record = {"record": "seal", "public_key": public.hex(), "digests": digests,
                  "sig": key.sign(seal_message(digests, public)).hex()}
        text = json.dumps(record, separators=(",", ":"))
        if self.csv:
            self.csv.writerow(["seal", "", "", text])
        else:
            self.out.write(text + "\n")


class Bits:
    """A set of small non-negative integers (blob ids), one bit each: an export of a year's
    trail remembers which blobs it wrote in megabytes, not gigabytes."""

    def __init__(self) -> None:
        self.bits = bytearray()

    def has(self, n: int) -> bool:
        i = n >> 3
        return i < len(self.bits) and bool(self.bits[i] >> (n & 7) & 1)

    def add(self, n: int) -> None:
        i = n >> 3
        if i >= len(self.bits):
            self.bits.extend(bytes(max(i + 1 - len(self.bits), len(self.bits))))
        self.bits[i] |= 1 << (n & 7)

    def discard(self, n: int) -> None:
        i = n >> 3
        if i < len(self.bits):
            self.bits[i] &= ~(1 << (n & 7)) & 255

    def __iter__(self) -> Iterator[int]:
        for i, byte in enumerate(self.bits):
            if byte:
                yield from (i * 8 + b for b in range(8) if byte >> b & 1)


def export(conn: sqlite3.Connection, out: TextIO, fmt: str, key: Ed25519PrivateKey, run_ids: list[str] | None = None,
           scope: str | None = None, through: int | None = None,
           progress: Callable[[int, int, int], None] | None = None) -> ExportSummary:
    """Write the trail, or the runs `run_ids`, to `out` (a text stream opened with newline=''),
    sealed with `key` (the exporting host's). Rows are written as they are read: memory does
    not grow with the trail. `progress(rows, runs begun, runs)` is called now and then.

    scope "archive": the runs and the checkpoints from the database's start up to `through`
    (store.archive makes sure those are exactly the archived runs' checkpoints)."""
    writer = _Out(out, fmt)
    summary = ExportSummary()
    with snapshot(conn):
        # The checkpoints are read twice, a batch at a time (a year's trail holds a million).
        base_id, base_hash, _ = _base(load_checkpoints(conn, "WHERE c.kind = 'archive'"))
        if scope == "archive":
            def take(c: Checkpoint) -> bool:
                return c.id <= (through or 0)
        elif run_ids is None:
            def take(c: Checkpoint) -> bool:
                return True
        else:
            wanted = set(run_ids)

            def take(c: Checkpoint) -> bool:
                return c.run_id in wanted and c.kind in RUN_KINDS
        scope = scope or ("database" if run_ids is None else "run")
        keys_of_runs = {r[1]: r[0] for r in conn.execute("SELECT seq, run_id FROM runs")}
        runs = list(keys_of_runs) if run_ids is None else run_ids
        summary.runs = runs
        writer.write({"record": "header", "format": FORMAT_NAME, "version": SCHEMA_VERSION, "scope": scope,
                      "runs": runs, "base": {"checkpoint": base_id, "hash": base_hash.hex()}})
        for ident, public, hostname, machine, first_seen in conn.execute(
                "SELECT id, public_key, hostname, machine_id, first_seen FROM hosts ORDER BY id"):
            writer.write({"record": "host", "id": ident, "public_key": public.hex(), "hostname": hostname,
                          "machine_id": machine, "first_seen": first_seen})
        # Only sealed rows: what a run recorded after its last checkpoint cannot be verified yet.
        by_key: dict[Any, Any] = {}
        by_id: dict[Any, Any] = {}
        for c in _checkpoints(conn):
            if c.kind in RUN_KINDS:
                by_key[c.run], by_id[c.run_id] = c.last_seq, c.last_seq
        sealed = {**by_key, **by_id}
        selection = None if run_ids is None else [(keys_of_runs[r], r) for r in runs]
        _write_rows(conn, writer, summary, export_rows.rows(conn, selection), sealed, progress, len(runs))
        prev = base_hash
        for cp in _checkpoints(conn):
            if take(cp):
                writer.write(checkpoint_record(cp, prev))
                summary.checkpoints += 1
                summary.head = cp
            prev = cp.hash
        writer.write({"record": "end", "rows": summary.rows, "blobs": summary.blobs, "checkpoints": summary.checkpoints,
                      "unsealed_rows_left_out": summary.unsealed})
        writer.seal(key)
    return summary


def _checkpoints(conn: sqlite3.Connection) -> Iterator[Checkpoint]:
    """Every checkpoint in id order, as chain.load_checkpoints reads them, a batch at a time."""
    cursor = conn.execute(
        "SELECT c.id, c.kind, c.run_id, c.rows, c.last_seq, c.head, h.public_key, c.at, c.detail, c.hash, c.sig, "
        "c.run, c.host FROM checkpoints c LEFT JOIN hosts h ON h.id = c.host ORDER BY c.id")
    while batch := cursor.fetchmany(4096):
        yield from (Checkpoint(*row) for row in batch)


def runs_started(conn: sqlite3.Connection, since: dt.datetime | None, until: dt.datetime | None) -> list[str]:
    """The run ids, in the trail's order, of the runs that started at or after `since` and
    before `until` (either may be None): whole runs, chosen by their start time."""
    chosen = []
    for run_id, at in conn.execute("SELECT run_id, at FROM runs ORDER BY seq"):
        try:
            started = dt.datetime.fromisoformat(at)
        except (TypeError, ValueError):
            continue
        if started.tzinfo is None:
            started = started.replace(tzinfo=dt.UTC)
        if (since is None or started >= since) and (until is None or started < until):
            chosen.append(run_id)
    return chosen


PROGRESS_ROWS = 200_000      # how often export's progress callback is called


def _write_rows(conn: sqlite3.Connection, writer: _Out, summary: ExportSummary, rows: Iterator[tuple],
                sealed: dict[Any, Any], progress: Callable[[int, int, int], None] | None, total_runs: int) -> None:
    """Each row record, each blob record before the first row that uses it (once). The rows
    are export_rows.rows' tuples, kept as they are until written (this loop is per row)."""
    seen, python, batch = summary.blob_ids, export_rows.PYTHON, export_rows.BATCH
    pending: list[tuple] = []       # rows not written yet: written together, in order
    runs_begun = 0
    for row in rows:
        seq, run, text, table, blob1, blob2 = row       # export_rows.MAX_REFS blob ids
        if seq > sealed.get(run, -1):
            summary.unsealed += 1
            continue
        if blob1 is not None or blob2 is not None:
            for blob in (blob1, blob2):
                if blob is not None and not seen.has(blob):
                    seen.add(blob)
                    summary.rows += writer.rows(pending)
                    pending = []
                    _write_blob(conn, writer, blob, table, seq)
                    summary.blobs += 1
        elif table == "runs":
            runs_begun += 1
        if python in text:
            row = (seq, run, export_rows.python_row(conn, table, seq), table)
        pending.append(row)
        if len(pending) >= batch:
            summary.rows += writer.rows(pending)
            pending = []
            if progress is not None and summary.rows % PROGRESS_ROWS < batch:
                progress(summary.rows, runs_begun, total_runs)
    summary.rows += writer.rows(pending)
    if progress is not None:
        progress(summary.rows, runs_begun, total_runs)


def _write_blob(conn: sqlite3.Connection, writer: _Out, blob: int, table: str, seq: int) -> None:
    found = conn.execute("SELECT sha256, data FROM blobs WHERE id = ?", (blob,)).fetchone()
    if found is None:
        raise ValueError(f"{table} seq {seq} refers to blob {blob}, which the database does not hold")
    sha, data = bytes(found[0]).hex(), bytes(found[1]).hex()
    writer.write_text("blob", f'{{"record":"blob","sha256":"{sha}","data":"{data}"}}')


# -- reading ---------------------------------------------------------------------------------------

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def open_text(path: Path) -> TextIO:
    """The export's text, whether written plain or gzip-compressed (told apart by content)."""
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic[:2] == GZIP_MAGIC:
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    if magic == ZSTD_MAGIC:
        raise ExportFormatError(0, "a zstd-compressed file: decompress it first (zstd -d FILE), or export it "
                                   "with --compress (gzip), which 'audit verify --export' reads as it is")
    return open(path, encoding="utf-8", newline="")


def _sniff(path: Path) -> str:
    with open_text(path) as f:
        start = f.read(64).lstrip("\ufeff \t\r\n")
    if start.startswith("{"):
        return "jsonl"
    if start.startswith(",".join(CSV_COLUMNS)):
        return "csv"
    raise ExportFormatError(1, "neither an amdflash JSONL export (a JSON object per line) nor a CSV export "
                               f"(header '{','.join(CSV_COLUMNS)}')")


def read_export(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line, record) of an exported file (JSONL or CSV, told apart by content)."""
    for n, record, _ in read_records(path):
        yield n, record


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line, JSON text) of each record, read a line at a time; ExportFormatError for a file
    that is not UTF-8 text, JSONL or CSV (or readable gzip), Broken for compressed bytes that
    end in the middle."""
    try:
        fmt = _sniff(path)
        with open_text(path) as f:
            if fmt == "jsonl":
                for n, text in enumerate(f, 1):
                    if text.strip():
                        yield n, text.rstrip("\r\n")
            else:
                reader = csv.reader(f)
                next(reader, None)
                for cells in reader:
                    yield reader.line_num, cells[-1] if cells else ""
    except UnicodeDecodeError as e:
        raise ExportFormatError(0, f"byte {e.start}: the file is not UTF-8 text") from None
    except csv.Error as e:
        raise ExportFormatError(0, f"not a readable CSV export ({e})") from None
    except (gzip.BadGzipFile, zlib.error) as e:
        raise ExportFormatError(0, f"not a readable gzip file ({e})") from None
    except EOFError:
        raise Broken("end of file: the compressed export ends in the middle: it is truncated or incomplete") \
            from None


def read_records(path: Path) -> Iterator[tuple[int, dict[str, Any], str]]:
    """(line, record, its JSON text) of an exported file; ExportFormatError for anything that
    is not one (text that is not UTF-8, JSON or CSV, a record that is not an object)."""
    for n, text in _lines(path):
        try:
            record = json.loads(text)
        except (ValueError, RecursionError) as e:   # JSONDecodeError, an over-long number, deep nesting
            raise ExportFormatError(n, f"not valid JSON ({getattr(e, 'msg', None) or type(e).__name__})") \
                from None
        if not isinstance(record, dict) or not isinstance(record.get("record"), str):
            raise ExportFormatError(n, "not an export record (a JSON object with a 'record' field)")
        yield n, record, text


# -- the shape of each record: anything else is malformed ---------------------------------------

_HEX = re.compile(r"(?:[0-9a-f]{2})*")


def _int(v: Any) -> bool:
    return type(v) is int


def _str(v: Any) -> bool:
    return type(v) is str


def _hex(v: Any) -> bool:
    return type(v) is str and _HEX.fullmatch(v) is not None


def _hex32(v: Any) -> bool:
    return _hex(v) and len(v) == 64


def _sig(v: Any) -> bool:
    return _hex(v) and len(v) == 128


def _opt(check: Any) -> Any:
    return lambda v: v is None or check(v)


def _strings(v: Any) -> bool:
    return type(v) is list and all(type(x) is str for x in v)


def _base_field(v: Any) -> bool:
    return type(v) is dict and set(v) == {"checkpoint", "hash"} and _int(v["checkpoint"]) and _hex32(v["hash"])


def _digests(v: Any) -> bool:
    return type(v) is dict and set(v) == set(SEALED) and all(_hex32(x) for x in v.values())


FIELDS: dict[str, dict[str, Any]] = {
    "header": {"format": _str, "version": _int, "scope": lambda v: type(v) is str and v in SCOPES, "runs": _strings,
               "base": _base_field},
    "host": {"id": _int, "public_key": _hex32, "hostname": _opt(_str), "machine_id": _opt(_str),
             "first_seen": _opt(_str)},
    "blob": {"sha256": _hex32, "data": _hex},
    "row": {"table": lambda v: type(v) is str and v in PHYSICAL, "seq": _int, "values": lambda v: type(v) is dict},
    "checkpoint": {"id": _int, "kind": _str, "run_id": _opt(_str), "rows": _opt(_int), "last_seq": _opt(_int),
                   "head": _opt(_hex32), "public_key": _hex32, "at": _str, "detail": _opt(_str), "prev": _hex32,
                   "hash": _hex32, "sig": _sig},
    "end": {"rows": _int, "blobs": _int, "checkpoints": _int, "unsealed_rows_left_out": _int},
    "seal": {"public_key": _hex32, "digests": _digests, "sig": _sig},
}


def check_shape(line: int, r: dict[str, Any]) -> None:
    """The record has exactly its kind's fields, each of its type (ExportFormatError if not)."""
    kind = r["record"]
    fields = FIELDS.get(kind)
    if fields is None:
        raise ExportFormatError(line, f"a record of unknown kind {kind[:40]!r}")
    missing = [f for f in fields if f not in r]
    extra = [f for f in r if f not in fields and f != "record"]
    if missing or extra:
        what = "missing " + ", ".join(missing) if missing else "unknown field " + ", ".join(x[:40] for x in extra)
        raise ExportFormatError(line, f"a {kind} record with {what}")
    for name, valid in fields.items():
        if not valid(r[name]):
            raise ExportFormatError(line, f"{kind} field {name}: {json.dumps(r[name])[:40]} is not what it "
                                          "should be")


# -- verification ----------------------------------------------------------------------------------

@dataclass
class ExportReport:
    ok: bool
    scope: str = "?"
    rows: int = 0
    runs: list[str] = field(default_factory=list)
    checkpoints: int = 0
    head: dict[str, Any] | None = None
    signers: dict[str, int] = field(default_factory=dict)
    trusted: bool = False
    sealed_by: str | None = None      # fingerprint of the key that sealed the export
    first_bad: str | None = None

    def describe(self) -> str:
        if not self.ok:
            return f"export BROKEN at {self.first_bad} (checked {self.rows} rows before it)"
        runs = ", ".join(self.runs) if len(self.runs) <= 4 else f"{len(self.runs)} runs"
        lines = [f"export intact: {self.scope} export of {runs}: {self.rows} rows, {self.checkpoints} signed "
                 "checkpoints, every run's chain complete"]
        if self.head:
            lines.append(f"chain head at export: checkpoint #{self.head['id']} hash {self.head['hash']}")
        how = "verified against the given --key" if self.trusted else \
            "valid under the keys the export carries; pass --key PUBFILE to prove who signed"
        lines.append(f"signatures: {how}: " + ", ".join(f"{k} ({n})" for k, n in self.signers.items()))
        lines.append(f"sealed by:  {self.sealed_by} (header, hosts, rows, checkpoints and counts, as exported; "
                     + ("a given --key)" if self.trusted else "the key the export carries)"))
        return "\n".join(lines)


def _value(line: int, column: str, kind: str, value: Any) -> Any:
    if value is None or (kind in ("int",) and type(value) is int) or (kind == "text" and type(value) is str):
        return value
    if kind == "blob" and isinstance(value, dict) and set(value) == {"hex"} and _hex(value["hex"]):
        return bytes.fromhex(value["hex"])
    if kind == "ref" and isinstance(value, dict) and set(value) == {"sha256"} and _hex32(value["sha256"]):
        return bytes.fromhex(value["sha256"])
    raise ExportFormatError(line, f"column {column}: {json.dumps(value)[:40]} is not a {kind} value")


def _checkpoint(r: dict[str, Any]) -> tuple[Checkpoint, bytes]:
    """A checkpoint record (its shape already checked) and the hash of the one before it."""
    cp = Checkpoint(r["id"], r["kind"], r["run_id"], r["rows"], r["last_seq"],
                    bytes.fromhex(r["head"]) if r["head"] is not None else None, bytes.fromhex(r["public_key"]),
                    r["at"], r["detail"], bytes.fromhex(r["hash"]), bytes.fromhex(r["sig"]))
    return cp, bytes.fromhex(r["prev"])


class _Shas:
    """The SHA-256s of the blobs read so far: in memory up to LIMIT, then in a temporary
    SQLite file, so that a year's export verifies in bounded memory."""

    LIMIT = 1 << 18

    def __init__(self) -> None:
        self.mem: set[bytes] = set()
        self.db: sqlite3.Connection | None = None
        self.count = 0

    def __contains__(self, sha: bytes) -> bool:
        if sha in self.mem:
            return True
        return self.db is not None and self.db.execute("SELECT 1 FROM s WHERE sha = ?", (sha,)).fetchone() is not None

    def add(self, sha: bytes) -> None:
        if sha in self:
            return
        self.count += 1
        self.mem.add(sha)
        if len(self.mem) >= self.LIMIT:
            if self.db is None:
                self.db = sqlite3.connect("")       # "": a private temporary file, gone when closed
                self.db.execute("CREATE TABLE s (sha BLOB PRIMARY KEY) WITHOUT ROWID")
            self.db.executemany("INSERT INTO s VALUES (?)", ((s,) for s in self.mem))
            self.mem.clear()

    def close(self) -> None:
        if self.db is not None:
            self.db.close()


@dataclass
class _Read:
    """An export as read: its records checked for shape, its seal's digests recomputed; the
    rows themselves are hashed as they are read, never held."""

    header: dict[str, Any] | None = None
    end: dict[str, Any] | None = None
    seal: tuple[int, dict[str, Any]] | None = None
    rows: int = 0
    run_keys: dict[int, Any] = field(default_factory=dict)    # seq of each runs row -> its run_id
    checkpoints: int = 0
    # The checkpoint records' lines and text: the first reading parsed them, this one checks
    # they are the same (one copy of the checkpoints in memory, not two).
    checkpoint_text: Any = field(default_factory=hashlib.sha256)
    blobs: _Shas = field(default_factory=_Shas)
    lines: dict[str, int] = field(default_factory=dict)     # kind -> line of its first record
    digests: dict[str, Any] = field(default_factory=lambda: {kind: hashlib.sha256() for kind in SEALED})
    error: Exception | None = None       # the first malformed or misplaced record: ends the reading


def _records(path: Path, got: _Read) -> Iterator[tuple[str, int, Any, bytes]]:
    """Every record, in order, into `got`; yields each row (table, seq, run, canonical text)
    to be hashed. The first malformed record (ExportFormatError), record out of place or bytes
    that do not match their hash (Broken) is kept in got.error and ends the reading."""
    try:
        for line, r, text in read_records(path):
            kind = r["record"]
            if not (kind == "row" and len(r) == 4 and type(r.get("seq")) is int and type(r.get("values")) is dict
                    and type(r.get("table")) is str and r["table"] in PHYSICAL):
                check_shape(line, r)        # every record but a well-formed row (checked just above)
            if got.seal is not None:
                raise Broken(f"line {line}: a record after the seal, the export's last record")
            if kind != "seal" and got.end is not None:
                raise Broken(f"line {line}: a record after the end record")
            if got.header is None and kind != "header":
                raise Broken(f"line {line}: the file does not start with a header record")
            if kind != "seal":
                got.digests[kind].update(text.encode() + b"\n")
                got.lines.setdefault(kind, line)
            if kind == "row":
                table, seq, values = r["table"], r["seq"], r["values"]
                vals = _row_values(line, table, seq, values, got.blobs)
                got.rows += 1
                if table == "runs":
                    got.run_keys[seq] = vals[0]
                yield table, seq, vals[0], canonical(table, seq, vals)
            elif kind == "header":
                if got.header is not None:
                    raise Broken(f"line {line}: a second header record")
                if r["format"] != FORMAT_NAME or r["version"] != SCHEMA_VERSION:
                    raise ExportFormatError(line, f"not an {FORMAT_NAME} of version {SCHEMA_VERSION} (format "
                                                  f"{r['format'][:40]!r}, version {r['version']})")
                got.header = r
            elif kind == "blob":
                data = bytes.fromhex(r["data"])
                if hashlib.sha256(data).hexdigest() != r["sha256"]:
                    raise Broken(f"line {line}: blob bytes do not match their sha256")
                got.blobs.add(bytes.fromhex(r["sha256"]))
            elif kind == "checkpoint":
                got.checkpoints += 1
                got.checkpoint_text.update(b"%d:%s\n" % (line, text.encode()))
            elif kind == "end":
                got.end = r
            elif kind == "seal":
                got.seal = line, r
    except (ExportFormatError, Broken) as e:
        got.error = e


_COLUMN_SETS = {table: {c for c, _ in columns} for table, columns in PHYSICAL.items()}
_PLAIN_KINDS = {"int": int, "text": str}      # a value of these kinds is its JSON value as it is


def _row_values(line: int, table: str, seq: int, values: dict[str, Any], blobs: _Shas) -> tuple:
    if values.keys() != _COLUMN_SETS[table]:
        raise ExportFormatError(line, f"{table} seq {seq}: its columns are not those of the schema")
    vals, refs = [], []
    for c, k in PHYSICAL[table]:
        v = values[c]
        if v is not None and type(v) is not _PLAIN_KINDS.get(k):       # else: _value would return it as it is
            v = _value(line, c, k, v)
            if k == "ref":
                refs.append((c, v))
        vals.append(v)
    for c, v in refs:          # after every value is read: a malformed one is named first, as it always was
        if v not in blobs:
            raise Broken(f"line {line} ({table} seq {seq}): column {c} refers to bytes not in the file")
    return tuple(vals)


def _prescan(path: Path) -> tuple[list[tuple[int, Checkpoint, bytes]], dict[int, Any], bytes]:
    """What hashing the rows as they are read needs first, from a quick first reading: the
    checkpoints (after the rows in the file) and the runs rows. Only lines that can hold one
    are parsed (a record of either kind names it in its text, or escapes a character); nothing
    is judged here: the full reading checks every record, and that it found these same ones."""
    checkpoints: list[tuple[int, Checkpoint, bytes]] = []
    run_keys: dict[int, Any] = {}
    text_of_checkpoints = hashlib.sha256()
    try:
        for line, text in _lines(path):
            if "checkpoint" not in text and '"runs"' not in text and "\\u" not in text:
                continue
            try:
                r = json.loads(text)
                if not isinstance(r, dict) or not isinstance(r.get("record"), str):
                    continue
                check_shape(line, r)
                if r["record"] == "checkpoint":
                    checkpoints.append((line, *_checkpoint(r)))
                    text_of_checkpoints.update(b"%d:%s\n" % (line, text.encode()))
                elif r["record"] == "row" and r["table"] == "runs" and set(r["values"]) == set(_RUNS_COLUMNS):
                    run_keys[r["seq"]] = _value(line, "run_id", "text", r["values"]["run_id"])
            except (ValueError, RecursionError, KeyError, TypeError):
                continue
    except (ExportFormatError, Broken):
        pass
    return checkpoints, run_keys, text_of_checkpoints.digest()


_RUNS_COLUMNS = tuple(c for c, _ in PHYSICAL["runs"])
assert PHYSICAL["runs"][0] == ("run_id", "text")


def verify_export(path: Path, keyfiles: list[Path] | None = None) -> ExportReport:
    """Recompute every run's chain from the exported rows, check every checkpoint's hash and
    signature, the header and counts against what the file holds, and the export's seal;
    name the first record that does not match. Raises ExportFormatError for a malformed file.

    The file is read twice, a line at a time (first for its checkpoints, which follow the rows,
    then in full): memory does not grow with the number of rows."""
    report = ExportReport(False)
    check = KeyCheck([keys.read_public(p) for p in keyfiles] if keyfiles else None)
    report.trusted = check.trusted is not None
    got = _Read()
    try:
        checkpoints, early_keys, early_text = _prescan(path)
        # Run keys: a run's rows carry the seq of its runs row (or its run_id, in plain tables).
        chains = _chains(checkpoints, early_keys)
        hasher = SegmentHasher(chains)
        rows = _records(path, got)
        unmatched: Broken | None = None      # the first row the chains do not take, named in its turn
        try:
            hasher.feed_many(rows)
        except Broken as e:
            unmatched = e
            for _ in rows:                   # the rest of the file is still read and checked
                pass
        if got.error is not None:
            raise got.error
        if got.checkpoint_text.digest() != early_text or got.run_keys != early_keys:
            raise Broken("the file changed while it was being verified (its checkpoints or runs rows differ between "
                         "two readings): verify it again once nothing writes it")
        header, end = got.header, got.end
        if header is None or end is None:
            raise Broken("end of file: no end record: the export is truncated or incomplete")
        counts = {"rows": got.rows, "blobs": got.blobs.count, "checkpoints": got.checkpoints}
        for name, n in counts.items():
            if end[name] != n:
                raise Broken(f"end record (line {got.lines['end']}): it counts {end[name]} {name}, the file holds {n}")
        report.scope, report.runs = header["scope"], list(header["runs"])
        _check_export_checkpoints(header, checkpoints, check)
        by_run = _by_run(checkpoints)
        missing = [r for r in report.runs if r not in by_run]
        if missing:
            raise Broken(f"run {missing[0]}: no checkpoint in the file")
        if unmatched is not None:
            raise unmatched
        if set(by_run) - set(chains):
            raise Broken(f"run {sorted(set(by_run) - set(chains))[0]}: checkpoints but no runs row in the file")
        for run_id in by_run:
            hasher.check(chains[run_id])
        held = list(dict.fromkeys(got.run_keys.values()))
        if sorted(held) != sorted(report.runs):
            extra = sorted(set(held) - set(report.runs)) or sorted(set(report.runs) - set(held))
            raise Broken(f"header (line {got.lines['header']}): its runs field does not list the runs the file holds "
                         f"(run {extra[0]})")
        report.sealed_by = keys.fingerprint(_check_seal(got, check))
        report.rows, report.checkpoints = got.rows, len(checkpoints)
        report.head = {"id": checkpoints[-1][1].id, "hash": checkpoints[-1][1].hash.hex()} if checkpoints else None
        report.ok = True
    except Broken as e:
        report.first_bad = str(e)
    finally:
        got.blobs.close()
    report.signers = {keys.fingerprint(k): n for k, n in check.signers.items()}
    return report


def _by_run(checkpoints: list[tuple[int, Checkpoint, bytes]]) -> dict[str, list[Checkpoint]]:
    by_run: dict[str, list[Checkpoint]] = {}
    for _, cp, _ in checkpoints:
        if cp.kind in RUN_KINDS and cp.run_id:
            by_run.setdefault(cp.run_id, []).append(cp)
    return by_run


def _chains(checkpoints: list[tuple[int, Checkpoint, bytes]], run_keys: dict[int, Any]) -> dict[Any, RunChain]:
    by_run = _by_run(checkpoints)
    chains: dict[Any, RunChain] = {}
    for seq, run_id in run_keys.items():
        if run_id in by_run:
            chains[seq] = chains[run_id] = RunChain(run_id, by_run[run_id])
    return chains


def _check_seal(got: _Read, check: KeyCheck) -> bytes:
    """The export's own signature: over every record's text, by a --key when given. Returns
    the sealing key."""
    if got.seal is None:
        raise Broken("end of file: no seal record: the export is not signed (its seal was removed, or an amdflash "
                     "older than signed exports made it), so its header and counts cannot be trusted")
    line, seal = got.seal
    for kind in SEALED:
        if got.digests[kind].hexdigest() != seal["digests"][kind]:
            where = f" (line {got.lines[kind]})" if kind in got.lines else ""
            raise Broken(f"line {line}: the {kind} record(s){where} are not those the export's seal signed: "
                         f"changed, added or removed after it was made")
    public = bytes.fromhex(seal["public_key"])
    if check.trusted is not None and public not in check.trusted:
        raise Broken(f"line {line}: the export is sealed by key {keys.fingerprint(public)}, which is not a given "
                     "--key: it was made (or re-made) by someone else")
    if not keys.verify_signature(public, bytes.fromhex(seal["sig"]), seal_message(seal["digests"], public)):
        raise Broken(f"line {line}: the export's seal does not verify under its key {keys.fingerprint(public)}: "
                     "it was changed")
    return public


def _check_export_checkpoints(header: dict[str, Any], checkpoints: list[tuple[int, Checkpoint, bytes]],
                              check: KeyCheck) -> None:
    """Each checkpoint's hash and signature; for a database or archive export, also that they
    form one unbroken chain from the header's starting point."""
    contiguous = header["scope"] in ("database", "archive")
    expected_prev = bytes.fromhex(header["base"]["hash"])
    expected_id = header["base"]["checkpoint"] + 1
    for line, cp, prev in checkpoints:
        if contiguous and (cp.id != expected_id or prev != expected_prev):
            raise Broken(f"line {line}: checkpoint #{cp.id} does not follow checkpoint #{expected_id - 1}: "
                         "checkpoints are missing or out of order")
        try:
            check_checkpoint_chain([cp], prev, check)
        except Broken as e:
            raise Broken(f"line {line}: {e}") from None
        expected_prev, expected_id = cp.hash, cp.id + 1


__all__ = ["GENESIS", "export", "verify_export", "read_export"]
