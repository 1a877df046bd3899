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

Everything needed to recompute each run's chain (store.chain) and check each signature is
in the file, so an export verifies on its own, and one run's export is a complete record of
that run: its rows and every checkpoint that sealed them.
"""
from __future__ import annotations

import csv
import hashlib
import heapq
import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

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


class ExportFormatError(ValueError):
    """A record that cannot be read back; names its line."""

    def __init__(self, line: int, message: str):
        super().__init__(f"line {line}: {message}")
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


class _Out:
    def __init__(self, out: TextIO, fmt: str):
        if fmt not in FORMATS:
            raise ValueError(f"unknown export format {fmt!r} (one of {', '.join(FORMATS)})")
        self.out = out
        self.csv = csv.writer(out, lineterminator="\n") if fmt == "csv" else None
        if self.csv:
            self.csv.writerow(CSV_COLUMNS)

    def write(self, record: dict[str, Any]) -> None:
        text = json.dumps(record, separators=(",", ":"))
        if self.csv:
            self.csv.writerow([record["record"], record.get("table", ""), record.get("seq", ""), text])
        else:
            self.out.write(text + "\n")


def export(conn: sqlite3.Connection, out: TextIO, fmt: str, run_ids: list[str] | None = None,
           scope: str | None = None, through: int | None = None) -> ExportSummary:
    """Write the trail, or the runs `run_ids`, to `out` (a text stream opened with newline='').

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
                queries.append(conn.execute(f"SELECT seq, {columns} FROM {table} WHERE run_id = ? ORDER BY seq",
                                            (run_id,)))
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
    fmt = _sniff(path)
    with open(path, encoding="utf-8", newline="") as f:
        if fmt == "jsonl":
            lines: Iterator[tuple[int, str]] = ((n, text) for n, text in enumerate(f, 1) if text.strip())
        else:
            reader = csv.reader(f)
            next(reader, None)
            lines = ((reader.line_num, cells[-1] if cells else "") for cells in reader)
        for n, text in lines:
            try:
                record = json.loads(text)
            except json.JSONDecodeError as e:
                raise ExportFormatError(n, f"not valid JSON ({e.msg})") from None
            if not isinstance(record, dict) or not isinstance(record.get("record"), str):
                raise ExportFormatError(n, "not an export record")
            yield n, record


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
        return "\n".join(lines)


def _value(line: int, column: str, kind: str, value: Any) -> Any:
    if value is None or (kind in ("int",) and type(value) is int) or (kind == "text" and type(value) is str):
        return value
    if kind == "blob" and isinstance(value, dict) and set(value) == {"hex"}:
        return bytes.fromhex(value["hex"])
    if kind == "ref" and isinstance(value, dict) and set(value) == {"sha256"}:
        return bytes.fromhex(value["sha256"])
    raise ExportFormatError(line, f"column {column}: {str(value)[:40]!r} is not a {kind} value")


def _checkpoint(line: int, r: dict[str, Any]) -> tuple[Checkpoint, bytes]:
    try:
        cp = Checkpoint(r["id"], r["kind"], r["run_id"], r["rows"], r["last_seq"],
                        bytes.fromhex(r["head"]) if r["head"] else None, bytes.fromhex(r["public_key"]), r["at"],
                        r["detail"], bytes.fromhex(r["hash"]), bytes.fromhex(r["sig"]))
        return cp, bytes.fromhex(r["prev"])
    except (KeyError, TypeError, ValueError):
        raise ExportFormatError(line, "a checkpoint record without all its fields") from None


def verify_export(path: Path, keyfiles: list[Path] | None = None) -> ExportReport:
    """Recompute every run's chain from the exported rows, check every checkpoint's hash and
    signature; name the first record that does not match."""
    report = ExportReport(False)
    check = KeyCheck([keys.read_public(p) for p in keyfiles] if keyfiles else None)
    report.trusted = check.trusted is not None
    rows: list[tuple[str, int, Any, bytes]] = []
    checkpoints: list[tuple[int, Checkpoint, bytes]] = []
    blobs: set[bytes] = set()
    header: dict[str, Any] | None = None
    end: dict[str, Any] | None = None
    try:
        for line, r in read_export(path):
            kind = r["record"]
            if end is not None:
                raise Broken(f"line {line}: a record after the end record")
            if header is None and kind != "header":
                raise Broken(f"line {line}: the file does not start with a header record")
            if kind == "header":
                if header is not None or r.get("format") != FORMAT_NAME:
                    raise Broken(f"line {line}: not an {FORMAT_NAME} header")
                header = r
            elif kind == "blob":
                data = bytes.fromhex(r["data"])
                if hashlib.sha256(data).hexdigest() != r["sha256"]:
                    raise Broken(f"line {line}: blob bytes do not match their sha256")
                blobs.add(bytes.fromhex(r["sha256"]))
            elif kind == "row":
                table, seq = r.get("table"), r.get("seq")
                if not isinstance(table, str) or table not in PHYSICAL or type(seq) is not int:
                    raise Broken(f"line {line}: a row of unknown table {table!r}")
                values = r.get("values") or {}
                if set(values) != {c for c, _ in PHYSICAL[table]}:
                    raise Broken(f"line {line} ({table} seq {seq}): columns do not match the schema")
                vals = tuple(_value(line, c, k, values[c]) for c, k in PHYSICAL[table])
                for (c, k), v in zip(PHYSICAL[table], vals, strict=True):
                    if k == "ref" and v is not None and v not in blobs:
                        raise Broken(f"line {line} ({table} seq {seq}): column {c} refers to bytes not in the file")
                run = vals[0]
                rows.append((table, seq, run, canonical(table, seq, vals)))
            elif kind == "checkpoint":
                cp, prev = _checkpoint(line, r)
                checkpoints.append((line, cp, prev))
            elif kind == "end":
                end = r
        if header is None or end is None:
            raise Broken("end of file: no end record: the export is truncated or incomplete")
        if (end.get("rows"), end.get("checkpoints")) != (len(rows), len(checkpoints)):
            raise Broken(f"end record: it counts {end.get('rows')} rows and {end.get('checkpoints')} checkpoints, "
                         f"the file holds {len(rows)} and {len(checkpoints)}")
        report.scope, report.runs = header["scope"], list(header.get("runs") or [])
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
        report.rows, report.checkpoints = len(rows), len(checkpoints)
        report.head = {"id": checkpoints[-1][1].id, "hash": checkpoints[-1][1].hash.hex()} if checkpoints else None
        report.ok = True
    except ExportFormatError as e:
        report.first_bad = f"line {e.line}: {e.reason}"
    except UnicodeDecodeError as e:
        report.first_bad = f"byte {e.start}: the file is not UTF-8 text"
    except (csv.Error, KeyError, ValueError) as e:
        report.first_bad = f"a record that cannot be read ({e})"
    except Broken as e:
        report.first_bad = str(e)
    report.signers = {keys.fingerprint(k): n for k, n in check.signers.items()}
    return report


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
