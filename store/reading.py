"""The one way to open the audit trail for reading: one connection (store.read_only: it writes
nothing beside the file), its refusals and the schema-version check in one place; and the
trail a board command's jobs share during its run.

The refusals are TrailRefused (NoTrail when there is no file): pipeline.engine.auditdb turns
them into the command's one-line refusal (exit 2), naming the line's trail where that helps.
"""
from __future__ import annotations

import os
import sqlite3
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlite_utils

from amdflash.store import schema
from amdflash.store.read_only import connect_reader
from amdflash.store.writer.database import needs_upgrade

OURS = "meta"   # every amdflash database has this table, with its schema version


class TrailRefused(schema.SchemaError):
    """The trail cannot be read: the message says why, in one line (a SchemaError, as the
    store's readers have always said it)."""


class NoTrail(TrailRefused):
    def __init__(self, path: str) -> None:
        super().__init__(f"no audit database at {path}")
        self.path = path


def not_a_file(path: Path) -> str | None:
    """Why `path` cannot be a database file, or None."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        return e.strerror
    if not stat.S_ISREG(st.st_mode):
        return "it is a directory" if stat.S_ISDIR(st.st_mode) else "it is not a regular file"
    return None


def tables(conn: sqlite3.Connection) -> list[str]:
    return [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]


def foreign(path: Path | str, found: list[str]) -> str:
    shown = ", ".join(found[:5]) + (", …" if len(found) > 5 else "")
    return (f"{path} is not an amdflash audit database (it holds tables {shown}); "
            "amdflash adds nothing to another program's database: choose another --db")


def open_trail(path_text: str, strict: bool = True) -> sqlite_utils.Database:
    """The trail at `path_text`, read-only, through one connection: refused (TrailRefused) when
    it is not a regular file, missing, not SQLite, another program's, of an older amdflash
    (naming the command that upgrades it: reading never does) or of a newer one. `strict`
    (runs, report, the board commands' reports): also an empty file, and another program's
    database named by its tables; else (review, replay, bundle, audit) those fall to the
    schema check's words."""
    path = Path(path_text)
    if strict and (why := not_a_file(path)):
        raise TrailRefused(f"audit database {path} is not usable: {why}")
    if not path.exists():
        raise NoTrail(path_text)
    try:
        conn = connect_reader(path_text)
    except (sqlite3.Error, OSError) as e:
        raise TrailRefused(f"audit database {path} is not usable: {e}" if strict
                           else f"cannot read audit database {path_text}: {e}") from None
    try:
        _check(conn, path, path_text, strict)
    except BaseException:
        conn.close()
        raise
    # No sqlite-utils plugins: any installed package may declare one, and it would be handed
    # every connection to the trail (prepare_connection: SQL functions of its own, inside a
    # process that often runs as root); looking for them also imports importlib.metadata and
    # reads every installed package's entry points, on each command that reads the trail.
    return sqlite_utils.Database(conn, execute_plugins=False)


def _check(conn: sqlite3.Connection, path: Path, path_text: str, strict: bool) -> None:
    try:
        if strict:
            try:
                found_tables = tables(conn)
            except sqlite3.DatabaseError as e:
                raise TrailRefused(f"audit database {path} is not usable: {e}") from None
            if not found_tables:
                # An empty file: the first run on this host is creating the schema right now (in
                # one transaction: a reader sees nothing or everything), or it never got that far.
                raise TrailRefused(f"no audit trail in {path} yet: no run has been recorded there")
            if OURS not in found_tables:
                raise TrailRefused(foreign(path, found_tables))
        found = schema.version(conn)
        if found is not None and 0 < found < schema.SCHEMA_VERSION:
            raise TrailRefused(needs_upgrade(path_text, found) + " (reading it here changed nothing)")
        if found is None:
            raise TrailRefused(f"{path_text} is not an amdflash audit database")
        if found != schema.SCHEMA_VERSION:
            raise TrailRefused(f"audit database {path_text} has schema version {found}; this amdflash reads "
                               f"{schema.SCHEMA_VERSION}")
    except (sqlite3.Error, OSError) as e:
        raise TrailRefused(f"cannot read audit database {path_text}: {e}") from None


class Trail:
    """The trail a board command reads through its one connection, opened before the run just
    after the writer process started (pipeline.engine.auditdb.open_writer): the jobs of all its
    boards read through it in turn (one read at a time: each is a read transaction), never by
    path, and the command its reports once the writer has closed. What a read sees is what the
    writer had committed when it began."""

    def __init__(self, db: sqlite_utils.Database) -> None:
        self.db = db
        self._turn = threading.Lock()

    @contextmanager
    def read(self) -> Iterator[sqlite_utils.Database]:
        with self._turn:
            yield self.db

    def close(self) -> None:
        with self._turn:
            self.db.conn.close()


TrailSource = str | Trail | None     # a path (tools and tests that run a job alone), the command's trail, or none


@contextmanager
def reading(source: str | Trail) -> Iterator[sqlite_utils.Database]:
    """The database a store read goes through: the command's shared trail (in its turn), or the
    file at a path opened for this read alone (open_trail) and closed after."""
    if isinstance(source, Trail):
        with source.read() as db:
            yield db
        return
    db = open_trail(source, strict=False)
    try:
        yield db
    finally:
        db.conn.close()
