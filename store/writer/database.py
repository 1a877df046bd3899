"""Opening the trail's database for writing: the schema created, an older one refused until
`audit upgrade`, another application's refused, the database proven writable; where the anchor
file lives; and the free space the trail keeps for itself."""
from __future__ import annotations

import os
import shlex
import sqlite3
from collections.abc import Callable
from pathlib import Path

from amdflash.store.schema import SCHEMA_VERSION, SchemaError, create, version

# Free space the trail keeps for itself on the database's file system: below STOP_FREE the
# writer stops the job (every later barrier fails, so nothing destructive starts) while the
# room left still takes the run's end; a run does not start below START_FREE.
STOP_FREE = 4 << 20
START_FREE = 8 << 20


def free_bytes(path: str) -> int:
    """Bytes free to this user on the file system that holds `path` (its directory)."""
    st = os.statvfs(os.path.dirname(os.path.abspath(path)))
    return st.f_bavail * st.f_frsize


def low_space(path: str, free: int, need: int) -> str:
    return (f"audit database {path}: the file system has {free / (1 << 20):.1f} MiB free, and the trail "
            f"keeps {need >> 20} MiB free so that a run can always record its end; free some space")


class StoreUnavailable(RuntimeError):
    """The database cannot be opened or written: refuse before touching a board."""


def needs_upgrade(path: str, found: int) -> str:
    """Why a database of an older schema is not used, and the one command that upgrades it."""
    return (f"audit database {path} was written by an older amdflash (schema version {found}: a hash chain, "
            "no signatures); no command upgrades it as a side effect of using it. Its owner upgrades it, "
            f"once, with: amdflash --db {shlex.quote(path)} audit upgrade")


def prepare(path: str, upgrade: Callable[[sqlite3.Connection], None] | None = None,
            conn: sqlite3.Connection | None = None, keep: bool = False) -> sqlite3.Connection | None:
    """Create the schema, or upgrade an older one with `upgrade` (only `audit upgrade` hands
    one down, store.migrate.upgrade: the migration is built on this module, so this module
    does not import it), or refuse a database that is not ours or that needs an upgrade and
    got none. Proves the database writable by a write that is rolled back (else
    StoreUnavailable). One connection does it all: `conn`, a plain connection to `path` the
    caller has already looked through (pipeline.engine.auditdb), or one opened here; `keep`
    returns it open (the command reads the trail through it during its run), else it is closed."""
    try:
        if conn is None:
            conn = sqlite3.connect(path, timeout=30.0, check_same_thread=False, isolation_level=None)
        try:
            # Looked at before anything is set: its journal mode would already change an older
            # database, which only `audit upgrade` may.
            found = version(conn)
            if upgrade is None and found is not None and 0 < found < SCHEMA_VERSION:
                raise SchemaError(needs_upgrade(path, found))
            if found is None:
                raise SchemaError(f"{path} is an SQLite database of another application (no amdflash schema); "
                                  "refusing to add tables to it")
            if found > SCHEMA_VERSION:
                raise SchemaError(f"audit database {path} has schema version {found}; this amdflash understands "
                                  f"{SCHEMA_VERSION} (upgrade amdflash)")
            # WAL lets readers (reports, datasette) run beside the writer on one snapshot each.
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            found = version(conn)       # another process may have created it meanwhile
            if found == 0:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    if version(conn) == 0:
                        create(conn)
                    conn.execute("COMMIT")
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
            elif found is not None and found < SCHEMA_VERSION:
                if upgrade is None:
                    raise SchemaError(needs_upgrade(path, found))
                upgrade(conn)
            # A real write, rolled back: read-only files, mounts and permissions all show here.
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('write-check', '')")
            conn.execute("ROLLBACK")
        except BaseException:
            conn.close()
            raise
        if keep:
            return conn
        conn.close()
        return None
    except SchemaError:
        raise
    except (sqlite3.Error, OSError) as e:
        raise StoreUnavailable(f"audit database {path} is not writable: {e}") from None


def default_anchor(db_path: str) -> Path:
    """The anchor file: beside the database unless AMDFLASH_ANCHOR names another place."""
    return Path(os.environ.get("AMDFLASH_ANCHOR") or db_path + ".anchor")
