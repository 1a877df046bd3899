"""The original content of a flash run's units, as its lineage (the run and its resumes)
recorded it: for a resume that must rebuild the backup file."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from amdflash.store.queries import open_readonly


class DamagedBackup(RuntimeError):
    pass


@dataclass
class RecordedBackup:
    units: dict[int, bytes] = field(default_factory=dict)    # address -> first recorded content
    files: list[tuple[str, str]] = field(default_factory=list)   # (sha256, path) of backup files


def original_units(path: str | None, lineage: list[str], addresses: list[int]) -> RecordedBackup:
    """Each unit's first backup row across the lineage, in record order, checked against its
    recorded SHA-256. Every run reads a unit's backup before anything erases it, so the first
    row is the content before the lineage touched it."""
    out = RecordedBackup()
    if not path or not lineage:
        return out
    wanted = set(addresses)
    db = open_readonly(path)
    try:
        marks = ", ".join("?" * len(lineage))
        for run_id, address, sha, data in db.conn.execute(
                f"SELECT run_id, address, sha256, data FROM backup_units WHERE run_id IN ({marks}) ORDER BY seq",
                lineage):
            if address not in wanted or address in out.units:
                continue
            if hashlib.sha256(data or b"").hexdigest() != sha:
                raise DamagedBackup(f"the backup of unit {address:#08x} recorded by run {run_id} does not match its "
                                    "recorded SHA-256: the audit database is damaged (see 'amdflash audit verify')")
            out.units[address] = bytes(data)
        out.files = [(sha, p) for sha, p in db.conn.execute(
            f"SELECT sha256, path FROM backups WHERE run_id IN ({marks}) ORDER BY seq", lineage)]
    finally:
        db.conn.close()
    return out
