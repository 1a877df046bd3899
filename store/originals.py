"""The original content of a flash run's units, as its lineage (the run and its resumes)
recorded it: for a resume that must rebuild the backup file."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from amdflash.store.queries import open_readonly
from amdflash.store.run_rows import open_run
from amdflash.store.verify import snapshot


class DamagedBackup(RuntimeError):
    pass


@dataclass
class RecordedBackup:
    units: dict[int, bytes] = field(default_factory=dict)    # address -> first recorded content
    files: list[tuple[str, str]] = field(default_factory=list)   # (sha256, path) of backup files


def original_units(path: str | None, lineage: list[str], addresses: list[int]) -> RecordedBackup:
    """Each unit's first backup row across the lineage, in record order, checked against its
    recorded SHA-256. Every run reads a unit's backup before anything erases it, so the first
    row is the content before the lineage touched it.

    Only rows a checkpoint seals, of runs that verify (store.run_rows): a backup file is kept,
    or a unit's content taken, only on the word of a run whose record holds (RunUnverified
    otherwise). A unit backed up only in an unsealed tail was not erased by that run (its
    intent, which precedes any erase, is sealed first), so what the board holds now is it."""
    out = RecordedBackup()
    if not path or not lineage:
        return out
    wanted = set(addresses)
    db = open_readonly(path)
    try:
        with snapshot(db.conn):
            for run in [open_run(db.conn, run_id) for run_id in lineage]:
                for address, sha, data in db.conn.execute(
                        f"SELECT address, sha256, data FROM backup_units WHERE {run.sealed_sql} ORDER BY seq",
                        run.sealed_args):
                    if address not in wanted or address in out.units:
                        continue
                    if hashlib.sha256(data or b"").hexdigest() != sha:
                        raise DamagedBackup(f"the backup of unit {address:#08x} recorded by run {run.run_id} does not "
                                            "match its recorded SHA-256: the audit database is damaged (see 'amdflash "
                                            "audit verify')")
                    out.units[address] = bytes(data)
                out.files += [(sha, p) for sha, p in db.conn.execute(
                    f"SELECT sha256, path FROM backups WHERE {run.sealed_sql} ORDER BY seq", run.sealed_args)]
    finally:
        db.conn.close()
    return out
