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

A file that cannot be read as an export (not UTF-8, not JSON, a record of unknown kind, a
missing field or one of the wrong type) is malformed: ExportFormatError, which the command
line shows as `error: ...` with exit 2. A well-formed file that does not match its
signatures, hashes or counts is BROKEN (exit 1), naming the first record that does not.
"""
from __future__ import annotations

import csv
import hashlib
import heapq
import json
import re
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from amdflash.store import keys
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
from amdflash.store.schema import PHYSICAL, PLAIN, RUN_END_SQL, SCHEMA_VERSION
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


# -- writing ---------------------------------------------------------------------------------------

def _json_value(value: Any) -> Any:
    return {"hex": bytes(value).hex()} if isinstance(value, (bytes, bytearray, memoryview)) else value


def checkpoint_record(cp: Checkpoint, prev: bytes) -> dict[str, Any]:
    return {"record": "checkpoint", "id": cp.id, "kind": cp.kind, "run_id": cp.run_id, "rows": cp.rows,
            "last_seq": cp.last_seq, "head": cp.head.hex() if cp.head else None, "public_key": cp.public_key.hex(),
            "at": cp.at, "detail": cp.detail, "prev": prev.hex(), "hash": cp.hash.hex(), "sig": cp.sig.hex()}


def seal_message(digests: dict[str, str], public_key: bytes) -> bytes:
    """What an export's seal signs: the digest of each kind of record, and the signing key."""
    return "|".join([SEAL_PREFIX, *(f"{kind}:{digests[kind]}" for kind in SEALED), public_key.hex()]).encode()


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
        text = json.dumps(record, separators=(",", ":"))
        self.digests[record["record"]].update(text.encode() + b"\n")
        self._put(record, text)

    def _put(self, record: dict[str, Any], text: str) -> None:
        if self.csv:
            self.csv.writerow([record["record"], record.get("table", ""), record.get("seq", ""), text])
        else:
            self.out.write(text + "\n")

    def seal(self, key: Ed25519PrivateKey) -> None:
        """The last record: every record before it, signed with the exporting host's key."""
        public = keys.public_bytes(key)
        digests = {kind: h.hexdigest() for kind, h in self.digests.items()}
        record = {"record": "seal", "public_key": public.hex(), "digests": digests,
                  "sig": key.sign(seal_message(digests, public)).hex()}
        self._put(record, json.dumps(record, separators=(",", ":")))


def export(conn: sqlite3.Connection, out: TextIO, fmt: str, key: Ed25519PrivateKey, run_ids: list[str] | None = None,
           scope: str | None = None, through: int | None = None) -> ExportSummary:
    """Write the trail, or the runs `run_ids`, to `out` (a text stream opened with newline=''),
    sealed with `key` (the exporting host's).

    scope "archive": the runs and the checkpoints from the database's start up to `through`
    (store.archive makes sure those are exactly the archived runs' checkpoints)."""
    writer = _Out(out, fmt)
    summary = ExportSummary()
    with snapshot(conn):
        all_cps = load_checkpoints(conn)
        base_id, base_hash, _ = _base(all_cps)
        prev_of = {}
        prev = base_hash
        for cp in all_cps:
            prev_of[cp.id] = prev
            prev = cp.hash
        if scope == "archive":
            cps = [c for c in all_cps if c.id <= (through or 0)]
        elif run_ids is None:
            cps = all_cps
        else:
            wanted = set(run_ids)
            cps = [c for c in all_cps if c.run_id in wanted and c.kind in RUN_KINDS]
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
        sealed: dict[Any, Any] = {c.run: c.last_seq for c in all_cps if c.kind in RUN_KINDS}
        sealed.update({c.run_id: c.last_seq for c in all_cps if c.kind in RUN_KINDS})
        seen_blobs: set[int] = set()
        for table, seq, row in _rows(conn, None if run_ids is None else [keys_of_runs[r] for r in runs], runs):
            if seq > sealed.get(row[0], -1):
                summary.unsealed += 1
                continue
            values = {}
            for (column, kind), value in zip(PHYSICAL[table], row, strict=True):
                if kind == "ref" and value is not None:
                    sha, data = conn.execute("SELECT sha256, data FROM blobs WHERE id = ?", (value,)).fetchone()
                    if value not in seen_blobs:
                        seen_blobs.add(value)
                        writer.write({"record": "blob", "sha256": sha.hex(), "data": bytes(data).hex()})
                        summary.blobs += 1
                    value = {"sha256": sha.hex()}
                values[column] = _json_value(value)
            writer.write({"record": "row", "table": table, "seq": seq, "values": values})
            summary.rows += 1
        for cp in cps:
            writer.write(checkpoint_record(cp, prev_of[cp.id]))
        summary.checkpoints = len(cps)
        summary.head = cps[-1] if cps else None
        writer.write({"record": "end", "rows": summary.rows, "blobs": summary.blobs, "checkpoints": len(cps),
                      "unsealed_rows_left_out": summary.unsealed})
        writer.seal(key)
    return summary


def _rows(conn: sqlite3.Connection, keys_: list[int] | None, run_ids: list[str]) -> Iterator[tuple[str, int, tuple]]:
    """Physical rows in seq order: all of them, or those of the runs `keys_` (each found by
    its seq span, which costs that run)."""
    def table_rows(table: str) -> Iterator[tuple[int, str, tuple]]:
        columns = ", ".join(c for c, _ in PHYSICAL[table])
        if keys_ is None:
            for row in conn.execute(f"SELECT seq, {columns} FROM {table} ORDER BY seq"):
                yield row[0], table, row[1:]
            return
        queries = []
        for key, run_id in zip(keys_, run_ids, strict=True):
            if table in PLAIN:
                # From its runs row on: nothing recorded before a run began is its.
                queries.append(conn.execute(f"SELECT seq, {columns} FROM {table} WHERE run_id = ? AND seq >= ? "
                                            "ORDER BY seq", (run_id, key)))
            else:
                last = conn.execute(f"SELECT {RUN_END_SQL} FROM runs r WHERE r.seq = ?", (key,)).fetchone()[0]
                queries.append(conn.execute(f"SELECT seq, {columns} FROM {table} WHERE seq BETWEEN ? AND ? "
                                            "AND +run = ? ORDER BY seq", (key, last, key)))
        for row in heapq.merge(*queries, key=lambda r: r[0]):
            yield row[0], table, row[1:]

    for seq, table, row in heapq.merge(*(table_rows(t) for t in PHYSICAL), key=lambda x: x[0]):
        yield table, seq, row


# -- reading ---------------------------------------------------------------------------------------

def _sniff(path: Path) -> str:
    with open(path, encoding="utf-8", newline="") as f:
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


def read_records(path: Path) -> Iterator[tuple[int, dict[str, Any], str]]:
    """(line, record, its JSON text) of an exported file; ExportFormatError for anything that
    is not one (text that is not UTF-8, JSON or CSV, a record that is not an object)."""
    try:
        fmt = _sniff(path)
        with open(path, encoding="utf-8", newline="") as f:
            if fmt == "jsonl":
                lines: Iterator[tuple[int, str]] = ((n, text.rstrip("\r\n")) for n, text in enumerate(f, 1)
                                                    if text.strip())
            else:
                reader = csv.reader(f)
                next(reader, None)
                lines = ((reader.line_num, cells[-1] if cells else "") for cells in reader)
            for n, text in lines:
                try:
                    record = json.loads(text)
                except (ValueError, RecursionError) as e:   # JSONDecodeError, an over-long number, deep nesting
                    raise ExportFormatError(n, f"not valid JSON ({getattr(e, 'msg', None) or type(e).__name__})") \
                        from None
                if not isinstance(record, dict) or not isinstance(record.get("record"), str):
                    raise ExportFormatError(n, "not an export record (a JSON object with a 'record' field)")
                yield n, record, text
    except UnicodeDecodeError as e:
        raise ExportFormatError(0, f"byte {e.start}: the file is not UTF-8 text") from None
    except csv.Error as e:
        raise ExportFormatError(0, f"not a readable CSV export ({e})") from None


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


@dataclass
class _Read:
    """An export as read: its records checked for shape, its seal's digests recomputed."""

    header: dict[str, Any] | None = None
    end: dict[str, Any] | None = None
    seal: tuple[int, dict[str, Any]] | None = None
    rows: list[tuple[str, int, Any, bytes]] = field(default_factory=list)
    checkpoints: list[tuple[int, Checkpoint, bytes]] = field(default_factory=list)
    blobs: set[bytes] = field(default_factory=set)
    lines: dict[str, int] = field(default_factory=dict)     # kind -> line of its first record
    digests: dict[str, Any] = field(default_factory=lambda: {kind: hashlib.sha256() for kind in SEALED})


def _read(path: Path) -> _Read:
    """Every record, in order; ExportFormatError for a malformed one, Broken for records out
    of place or bytes that do not match their hash."""
    got = _Read()
    for line, r, text in read_records(path):
        check_shape(line, r)
        kind = r["record"]
        if got.seal is not None:
            raise Broken(f"line {line}: a record after the seal, the export's last record")
        if kind != "seal" and got.end is not None:
            raise Broken(f"line {line}: a record after the end record")
        if got.header is None and kind != "header":
            raise Broken(f"line {line}: the file does not start with a header record")
        if kind != "seal":
            got.digests[kind].update(text.encode() + b"\n")
            got.lines.setdefault(kind, line)
        if kind == "header":
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
        elif kind == "row":
            table, seq, values = r["table"], r["seq"], r["values"]
            if set(values) != {c for c, _ in PHYSICAL[table]}:
                raise ExportFormatError(line, f"{table} seq {seq}: its columns are not those of the schema")
            vals = tuple(_value(line, c, k, values[c]) for c, k in PHYSICAL[table])
            for (c, k), v in zip(PHYSICAL[table], vals, strict=True):
                if k == "ref" and v is not None and v not in got.blobs:
                    raise Broken(f"line {line} ({table} seq {seq}): column {c} refers to bytes not in the file")
            got.rows.append((table, seq, vals[0], canonical(table, seq, vals)))
        elif kind == "checkpoint":
            cp, prev = _checkpoint(r)
            got.checkpoints.append((line, cp, prev))
        elif kind == "end":
            got.end = r
        elif kind == "seal":
            got.seal = line, r
    return got


def verify_export(path: Path, keyfiles: list[Path] | None = None) -> ExportReport:
    """Recompute every run's chain from the exported rows, check every checkpoint's hash and
    signature, the header and counts against what the file holds, and the export's seal;
    name the first record that does not match. Raises ExportFormatError for a malformed file."""
    report = ExportReport(False)
    check = KeyCheck([keys.read_public(p) for p in keyfiles] if keyfiles else None)
    report.trusted = check.trusted is not None
    try:
        got = _read(path)
        header, end, rows, checkpoints = got.header, got.end, got.rows, got.checkpoints
        if header is None or end is None:
            raise Broken("end of file: no end record: the export is truncated or incomplete")
        counts = {"rows": len(rows), "blobs": len(got.blobs), "checkpoints": len(checkpoints)}
        for name, n in counts.items():
            if end[name] != n:
                raise Broken(f"end record (line {got.lines['end']}): it counts {end[name]} {name}, the file holds {n}")
        report.scope, report.runs = header["scope"], list(header["runs"])
        _check_export_checkpoints(header, checkpoints, check)
        by_run: dict[str, list[Checkpoint]] = {}
        for _, cp, _ in checkpoints:
            if cp.kind in RUN_KINDS and cp.run_id:
                by_run.setdefault(cp.run_id, []).append(cp)
        missing = [r for r in report.runs if r not in by_run]
        if missing:
            raise Broken(f"run {missing[0]}: no checkpoint in the file")
        # Run keys: a run's rows carry the seq of its runs row (or its run_id, in plain tables).
        chains: dict[Any, RunChain] = {}
        run_keys = {seq: run for table, seq, run, _ in rows if table == "runs"}
        for seq, run_id in run_keys.items():
            if run_id in by_run:
                chains[seq] = chains[run_id] = RunChain(run_id, by_run[run_id])
        hasher = SegmentHasher(chains)
        hasher.feed_many((table, seq, run, text) for table, seq, run, text in rows)
        if set(by_run) - set(chains):
            raise Broken(f"run {sorted(set(by_run) - set(chains))[0]}: checkpoints but no runs row in the file")
        for run_id in by_run:
            hasher.check(chains[run_id])
        held = list(dict.fromkeys(run_keys.values()))
        if sorted(held) != sorted(report.runs):
            extra = sorted(set(held) - set(report.runs)) or sorted(set(report.runs) - set(held))
            raise Broken(f"header (line {got.lines['header']}): its runs field does not list the runs the file holds "
                         f"(run {extra[0]})")
        report.sealed_by = keys.fingerprint(_check_seal(got, check))
        report.rows, report.checkpoints = len(rows), len(checkpoints)
        report.head = {"id": checkpoints[-1][1].id, "hash": checkpoints[-1][1].hash.hex()} if checkpoints else None
        report.ok = True
    except Broken as e:
        report.first_bad = str(e)
    report.signers = {keys.fingerprint(k): n for k, n in check.signers.items()}
    return report


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
