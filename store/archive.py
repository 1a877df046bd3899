"""`audit archive`: move old runs out of the database into a signed, verifiable file.

The database's checkpoints form one chain; an archive takes a *prefix* of it — every
checkpoint up to some K and every row of the runs they seal — so that what stays is again
one unbroken chain, starting after K. The archive file is an export (store.export) that
verifies on its own; the database keeps a signed "archive" seal naming K, the hash of
checkpoint K, the runs moved and the file's SHA-256, so that its chain verifies across the
gap and the anchor file's older entries are accounted for.

A run goes only with its whole resume lineage (the run it resumed, the runs that resumed
it), and only when every run of the lineage ended — or was resumed — before the date.

The host's line keeps recording while an archive is made: the file is written and verified
from a snapshot (a read transaction), and the write lock is taken only to check that what it
was written from still holds, delete the archived rows (by each run's seq span, the rowid)
and the blobs only they used, and write the seal. VACUUM only on request (--compact).
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from amdflash.store import schema
from amdflash.store.chain import Checkpoint, load_checkpoints
from amdflash.store.export import Bits, ExportSummary, export, verify_export
from amdflash.store.export_rows import run_spans
from amdflash.store.verify import RUN_KINDS, _base, snapshot
from amdflash.store.writer.database import default_anchor
from amdflash.store.writer.sealer import ChainWriter, Signer, now_iso, sign_and_insert
from amdflash.stages.files import PRIVATE, create_new, private_dir


class ArchiveRefused(RuntimeError):
    pass


@dataclass
class ArchiveResult:
    path: Path
    sha256: str
    runs: list[str]
    rows: int
    checkpoints: int
    seal: int
    backups_moved: list[str] = field(default_factory=list)
    bytes_before: int = 0
    bytes_after: int = 0
    compacted: bool = False

    def describe(self) -> str:
        size = (f"it shrank from {self.bytes_before} to {self.bytes_after} bytes" if self.compacted else
                f"its file keeps its size ({self.bytes_after} bytes: new runs reuse the space freed; --compact "
                "shrinks it)")
        lines = [f"archived {len(self.runs)} run(s), {self.rows} rows and {self.checkpoints} checkpoints to "
                 f"{self.path} (sha256 {self.sha256})",
                 f"the database keeps seal checkpoint #{self.seal}; {size}",
                 f"check the archive at any time: amdflash audit verify --export {self.path} --key PUBFILE"]
        if self.backups_moved:
            lines.append(f"moved {len(self.backups_moved)} backup image(s) to {self.path}.backups/")
        return "\n".join(lines)


def archive(db_path: str, key_path: Path, before: dt.datetime, out: Path, move_backups: bool = False,
            compact: bool = False, progress: Callable[[str], None] | None = None) -> ArchiveResult:
    """Write the runs that can go to `out` from a snapshot (flashes keep recording meanwhile),
    then, under the write lock only for that, check the trail still agrees, delete those runs'
    rows by their seq spans, seal, and commit. VACUUM only if `compact`."""
    say = progress or (lambda _: None)
    signer = Signer.load(key_path)
    size_before = os.path.getsize(db_path)
    conn = schema.connect(db_path)
    partial = out.with_name(out.name + ".partial")
    try:
        with snapshot(conn):             # a read transaction: no lock a writer waits for
            checkpoints = load_checkpoints(conn)
            through = _base(checkpoints)[0]
            runs = _archivable(conn, before)
            k, chosen = _prefix(conn, checkpoints, runs)
            if not chosen:
                raise ArchiveRefused(f"no run can be archived before {before.isoformat()}: none ended by then "
                                     "(with its whole resume lineage), or they are interleaved with newer runs")
            ordered = sorted(chosen, key=lambda r: runs[r])
            by_id = {c.id: c for c in checkpoints}
            summary = _write(conn, partial, ordered, k, signer, say)
            seen_seq = conn.execute("SELECT seq FROM chain_head WHERE id = 1").fetchone()[0]
            say(f"archive: {summary.rows} rows of {len(ordered)} run(s) written; finding the bytes only they use")
            orphans = _orphans(conn, summary.blob_ids, {runs[r] for r in chosen})
        digest = _check_file(partial, say)
        say("archive: removing the archived runs from the database")
        placed = False
        conn.execute("BEGIN IMMEDIATE")     # from here on, writers wait: deletes and the seal only
        try:
            checkpoints = _unchanged(conn, before, chosen, through, by_id[k])
            for (ref,) in _refs_since(conn, seen_seq):      # bytes a row recorded meanwhile uses stay
                orphans.discard(ref)
            moved = _backups(conn, chosen, out) if move_backups else []
            rows = _prune(conn, {r: runs[r] for r in chosen}, k, orphans)
            if rows != summary.rows + summary.unsealed:
                raise ArchiveRefused(f"the archived runs hold {rows} rows now, {summary.rows + summary.unsealed} "
                                     "when they were written: the trail changed meanwhile; nothing was removed, "
                                     "run audit archive again")
            by_id = {c.id: c for c in checkpoints}
            last = checkpoints[-1]
            seal = Checkpoint(last.id + 1, "archive", None, rows, None, by_id[k].hash, signer.public, now_iso(),
                              json.dumps({"through_checkpoint": k, "through_hash": by_id[k].hash.hex(),
                                          "after_checkpoint": through, "runs": ordered, "file": str(out),
                                          "file_sha256": digest, "rows": rows,
                                          "backups": "moved" if move_backups else "kept", "moved": moved,
                                          # appended to the anchor after the commit, like every seal
                                          "anchor": os.path.abspath(default_anchor(db_path))},
                                         sort_keys=True))
            sign_and_insert(conn, signer, seal, last.hash)
            conn.execute("UPDATE chain_head SET checkpoint = ?, hash = ? WHERE id = 1", (seal.id, seal.hash))
            schema.add_triggers(conn)
            os.replace(partial, out)
            placed = True
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if placed:            # nothing was removed: no archive file either
                out.unlink(missing_ok=True)
            raise
        for path in moved:
            target = out.with_name(out.name + ".backups") / Path(path).name
            private_dir(target.parent)
            shutil.move(path, target)
        ChainWriter(conn, signer, default_anchor(db_path))._write_anchor(seal)
        if compact:
            say("archive: compacting the database (VACUUM)")
            conn.execute("VACUUM")
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    finally:
        conn.close()
    return ArchiveResult(out, digest, ordered, rows, k - through, seal.id, moved, size_before,
                         os.path.getsize(db_path), compact)


def _archivable(conn: sqlite3.Connection, before: dt.datetime) -> dict[str, int]:
    """run_id -> key of every run whose whole resume lineage is done before `before`."""
    runs = {r: (key, parent) for key, r, parent in conn.execute("SELECT seq, run_id, resumes_run_id FROM runs")}
    ended: dict[str, str] = {}
    for run_id, status, at in conn.execute(
            "SELECT s.run_id, s.status, s.at FROM run_status s WHERE s.seq = "
            "(SELECT max(seq) FROM run_status x WHERE x.run_id = s.run_id)"):
        if status in schema.TERMINAL:
            ended[run_id] = at
    group: dict[str, str] = {r: r for r in runs}

    def root(r: str) -> str:
        while group[r] != r:
            r = group[r]
        return r

    for r, (_, parent) in runs.items():
        if parent in runs:
            group[root(r)] = root(parent)
    resumed = {parent for _, parent in runs.values() if parent}
    members: dict[str, list[str]] = {}
    for r in runs:
        members.setdefault(root(r), []).append(r)
    out = {}
    for lineage in members.values():
        done = all(r in ended or r in resumed for r in lineage)
        early = all(dt.datetime.fromisoformat(ended[r]) < before for r in lineage if r in ended)
        if done and early and any(r in ended for r in lineage):
            out.update({r: runs[r][0] for r in lineage})
    return out


def _prefix(conn: sqlite3.Connection, checkpoints: list[Checkpoint], runs: dict[str, int]) -> tuple[int, set[str]]:
    """The largest K such that checkpoints up to K seal archivable runs only and no run sealed
    there has a checkpoint (or an unsealed row) after K; and those runs."""
    through = _base(checkpoints)[0]
    k = through
    for cp in checkpoints:
        if cp.kind in RUN_KINDS and cp.run_id not in runs:
            break
        k = cp.id
    while True:
        chosen = {c.run_id for c in checkpoints if c.id <= k and c.kind in RUN_KINDS}
        late = [c for c in checkpoints if c.id > k and c.run_id in chosen]
        if not late:
            return k, {r for r in chosen if r} & set(runs)
        k = min(c.id for c in checkpoints if c.run_id == late[0].run_id) - 1


def _write(conn: sqlite3.Connection, partial: Path, runs: list[str], k: int, signer: Signer,
           say: Callable[[str], None]) -> ExportSummary:
    partial.unlink(missing_ok=True)

    def progress(rows: int, begun: int, total: int) -> None:
        say(f"archive: {rows} rows written ({begun} of {total} runs begun)")

    # The record itself (rows and the flash content they refer to): the owner's alone.
    with os.fdopen(create_new(partial, PRIVATE), "w", encoding="utf-8", newline="") as f:
        summary = export(conn, f, "jsonl", signer.key, runs, scope="archive", through=k, progress=progress)
        f.flush()
        os.fsync(f.fileno())
    return summary


def _check_file(partial: Path, say: Callable[[str], None]) -> str:
    """The archive written verifies on its own; its SHA-256 (read in chunks, not whole)."""
    say(f"archive: verifying {partial}")
    check = verify_export(partial)
    if not check.ok:
        raise ArchiveRefused(f"the archive written does not verify ({check.first_bad}); nothing was removed")
    digest = hashlib.sha256()
    with open(partial, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _unchanged(conn: sqlite3.Connection, before: dt.datetime, chosen: set[str], through: int,
               last_archived: Checkpoint) -> list[Checkpoint]:
    """Under the write lock: what the archive was written from still holds — no other archive
    meanwhile, its last checkpoint the same, no archived run resumed or sealed again since.
    Returns the checkpoints as they are now."""
    checkpoints = load_checkpoints(conn)
    now = {c.id: c for c in checkpoints}
    again = [c for c in checkpoints if c.id > last_archived.id and c.run_id in chosen]
    resumed = chosen - set(_archivable(conn, before))
    if _base(checkpoints)[0] != through or getattr(now.get(last_archived.id), "hash", None) != last_archived.hash \
            or again or resumed:
        raise ArchiveRefused("the trail changed while the archive was written (another archive, or an archived run "
                             "resumed or sealed again); nothing was removed: run audit archive again")
    return checkpoints


_REF_TABLES = {t: [c for c, k in cols if k == "ref"] for t, cols in schema.PHYSICAL.items()
               if any(k == "ref" for _, k in cols)}
assert not set(_REF_TABLES) & schema.PLAIN      # every table with references carries run keys


def _orphans(conn: sqlite3.Connection, archived: Bits, keys: set[int]) -> Bits:
    """The blobs archived rows use and no other row does (read in the snapshot: the rows
    recorded after it are looked at under the lock)."""
    orphans = Bits()
    orphans.bits = bytearray(archived.bits)
    for table, columns in _REF_TABLES.items():
        cursor = conn.execute(f"SELECT run, {', '.join(columns)} FROM {table} WHERE "
                              + " OR ".join(f"{c} IS NOT NULL" for c in columns))
        while batch := cursor.fetchmany(4096):
            for run, *refs in batch:
                if run not in keys:
                    for ref in refs:
                        if ref is not None:
                            orphans.discard(ref)
    return orphans


def _refs_since(conn: sqlite3.Connection, seq: int) -> Iterator[tuple[int]]:
    """Blob ids used by rows recorded after `seq` (a rowid range: costs those rows)."""
    for table, columns in _REF_TABLES.items():
        for column in columns:
            yield from conn.execute(f"SELECT {column} FROM {table} WHERE seq > ? AND {column} IS NOT NULL", (seq,))


def _backups(conn: sqlite3.Connection, runs: set[str], out: Path) -> list[str]:
    """Backup images of the archived runs that no remaining run refers to."""
    marks = ",".join("?" * len(runs))
    theirs = {p for (p,) in conn.execute(f"SELECT path FROM backups WHERE run_id IN ({marks})", list(runs))}
    kept = {p for (p,) in conn.execute(f"SELECT path FROM backups WHERE run_id NOT IN ({marks})", list(runs))}
    # Only amdflash's own backup files move: a path a row names elsewhere is never touched.
    own = (Path(conn.execute("PRAGMA database_list").fetchone()[2]).parent / "backups").resolve()
    return sorted(p for p in theirs - kept
                  if p and Path(p).is_file() and not Path(p).is_symlink() and Path(p).resolve().parent == own)


def _prune(conn: sqlite3.Connection, runs: dict[str, int], k: int, orphans: Bits) -> int:
    """Delete the archived runs' rows — exactly those the archive read: a plain table's by the
    run's id (indexed), a bulk table's by the run's seq span (the rowid: the bulk tables carry
    no run index, and need none) — checkpoints up to K and the blobs only those rows used."""
    schema.drop_triggers(conn)
    ends = run_spans(conn, list(runs.values()))
    removed = 0
    for run_id, key in runs.items():
        for table in schema.PHYSICAL:
            if table in schema.PLAIN:
                removed += conn.execute(f"DELETE FROM {table} WHERE run_id = ? AND seq >= ?", (run_id, key)).rowcount
            else:
                removed += conn.execute(f"DELETE FROM {table} WHERE seq BETWEEN ? AND ? AND run = ?",
                                        (key, ends[key], key)).rowcount
    conn.execute("DELETE FROM checkpoints WHERE id <= ?", (k,))
    conn.executemany("DELETE FROM blobs WHERE id = ?", ((blob,) for blob in orphans))
    return removed
