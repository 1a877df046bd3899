"""`audit archive`: move old runs out of the database into a signed, verifiable file.

The database's checkpoints form one chain; an archive takes a *prefix* of it — every
checkpoint up to some K and every row of the runs they seal — so that what stays is again
one unbroken chain, starting after K. The archive file is an export (store.export) that
verifies on its own; the database keeps a signed "archive" seal naming K, the hash of
checkpoint K, the runs moved and the file's SHA-256, so that its chain verifies across the
gap and the anchor file's older entries are accounted for.

A run goes only with its whole resume lineage (the run it resumed, the runs that resumed
it), and only when every run of the lineage ended — or was resumed — before the date.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import shutil
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from amdflash.store import schema
from amdflash.store.chain import Checkpoint, load_checkpoints
from amdflash.store.export import export, verify_export
from amdflash.store.verify import RUN_KINDS, _base
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

    def describe(self) -> str:
        lines = [f"archived {len(self.runs)} run(s), {self.rows} rows and {self.checkpoints} checkpoints to "
                 f"{self.path} (sha256 {self.sha256})",
                 f"the database keeps seal checkpoint #{self.seal}; it shrank from {self.bytes_before} to "
                 f"{self.bytes_after} bytes",
                 f"check the archive at any time: amdflash audit verify --export {self.path} --key PUBFILE"]
        if self.backups_moved:
            lines.append(f"moved {len(self.backups_moved)} backup image(s) to {self.path}.backups/")
        return "\n".join(lines)


def archive(db_path: str, key_path: Path, before: dt.datetime, out: Path, move_backups: bool = False) -> ArchiveResult:
    signer = Signer.load(key_path)
    size_before = os.path.getsize(db_path)
    conn = schema.connect(db_path)
    try:
        conn.execute("BEGIN IMMEDIATE")     # no writer appends while runs are moved out
        try:
            checkpoints = load_checkpoints(conn)
            through = _base(checkpoints)[0]
            runs = _archivable(conn, before)
            k, chosen = _prefix(conn, checkpoints, runs)
            if not chosen:
                raise ArchiveRefused(f"no run can be archived before {before.isoformat()}: none ended by then "
                                     "(with its whole resume lineage), or they are interleaved with newer runs")
            by_id = {c.id: c for c in checkpoints}
            result = _write(conn, out, sorted(chosen, key=lambda r: runs[r]), k, signer)
            moved = _backups(conn, chosen, out) if move_backups else []
            rows = _prune(conn, chosen, k)
            last = checkpoints[-1]
            seal = Checkpoint(last.id + 1, "archive", None, rows, None, by_id[k].hash, signer.public, now_iso(),
                              json.dumps({"through_checkpoint": k, "through_hash": by_id[k].hash.hex(),
                                          "after_checkpoint": through, "runs": result.runs, "file": str(out),
                                          "file_sha256": result.sha256, "rows": rows,
                                          "backups": "moved" if move_backups else "kept", "moved": moved,
                                          # appended to the anchor after the commit, like every seal
                                          "anchor": os.path.abspath(default_anchor(db_path))},
                                         sort_keys=True))
            sign_and_insert(conn, signer, seal, last.hash)
            conn.execute("UPDATE chain_head SET checkpoint = ?, hash = ? WHERE id = 1", (seal.id, seal.hash))
            schema.add_triggers(conn)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            out.with_name(out.name + ".partial").unlink(missing_ok=True)
            raise
        for path in moved:
            target = out.with_name(out.name + ".backups") / Path(path).name
            private_dir(target.parent)
            shutil.move(path, target)
        ChainWriter(conn, signer, default_anchor(db_path))._write_anchor(seal)
        conn.execute("VACUUM")
    finally:
        conn.close()
    return ArchiveResult(out, result.sha256, result.runs, rows, k - through, seal.id, moved, size_before,
                         os.path.getsize(db_path))


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


def _write(conn: sqlite3.Connection, out: Path, runs: list[str], k: int, signer: Signer) -> _Written:
    partial = out.with_name(out.name + ".partial")
    partial.unlink(missing_ok=True)
    # The record itself (rows and the flash content they refer to): the owner's alone.
    with os.fdopen(create_new(partial, PRIVATE), "w", encoding="utf-8", newline="") as f:
        export(conn, f, "jsonl", signer.key, runs, scope="archive", through=k)
        f.flush()
        os.fsync(f.fileno())
    check = verify_export(partial)
    if not check.ok:
        raise ArchiveRefused(f"the archive written does not verify ({check.first_bad}); nothing was removed")
    digest = hashlib.sha256(partial.read_bytes()).hexdigest()
    os.replace(partial, out)
    return _Written(runs, digest)


@dataclass
class _Written:
    runs: list[str]
    sha256: str


def _backups(conn: sqlite3.Connection, runs: set[str], out: Path) -> list[str]:
    """Backup images of the archived runs that no remaining run refers to."""
    marks = ",".join("?" * len(runs))
    theirs = {p for (p,) in conn.execute(f"SELECT path FROM backups WHERE run_id IN ({marks})", list(runs))}
    kept = {p for (p,) in conn.execute(f"SELECT path FROM backups WHERE run_id NOT IN ({marks})", list(runs))}
    # Only amdflash's own backup files move: a path a row names elsewhere is never touched.
    own = (Path(conn.execute("PRAGMA database_list").fetchone()[2]).parent / "backups").resolve()
    return sorted(p for p in theirs - kept
                  if p and Path(p).is_file() and not Path(p).is_symlink() and Path(p).resolve().parent == own)


def _prune(conn: sqlite3.Connection, runs: set[str], k: int) -> int:
    """Delete the archived runs' rows, checkpoints up to K and blobs nobody refers to any more."""
    schema.drop_triggers(conn)
    marks = ",".join("?" * len(runs))
    keys = [key for (key,) in conn.execute(f"SELECT seq FROM runs WHERE run_id IN ({marks})", list(runs))]
    key_marks = ",".join("?" * len(keys))
    removed = 0
    for table in schema.PHYSICAL:
        column, values = ("run_id", list(runs)) if table in schema.PLAIN else ("run", keys)
        removed += conn.execute(f"DELETE FROM {table} WHERE {column} IN ({marks if column == 'run_id' else key_marks})",
                                values).rowcount
    conn.execute("DELETE FROM checkpoints WHERE id <= ?", (k,))
    refs = " UNION ".join(f"SELECT {c} FROM {t} WHERE {c} IS NOT NULL"
                          for t, cols in schema.PHYSICAL.items() for c, kind in cols if kind == "ref")
    conn.execute(f"DELETE FROM blobs WHERE id NOT IN ({refs})")
    return removed
