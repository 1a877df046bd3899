"""Opening the audit database, for writing (every board command) or reading (runs, report).

Refused before any run starts, with exit 2 and one line: a path that is a directory,
device or FIFO; a directory or file that is not writable; a file that is not SQLite; a
SQLite database of another program (amdflash never adds its tables to it); a database
of another schema version — one of an older amdflash too: only its owner's explicit
`audit upgrade` upgrades it, no command does as a side effect. Writability is proven by a
write that is rolled back, so a read-only file, mount or permission is caught here and not
at the first audit write.
"""
from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

import sqlite_utils

from amdflash.pipeline import config
from amdflash.pipeline.errors import Refusal
from amdflash.store.schema import SchemaError
from amdflash.store.reading import NoTrail, OURS, Trail, TrailRefused, foreign, not_a_file, open_trail, tables
from amdflash.store.verify import connect_reader
from amdflash.store.writer.database import START_FREE, StoreUnavailable, free_bytes, low_space, prepare
from amdflash.store.writer.process import AuditWriter
from amdflash.stages.files import private_dir, private_file, room_problem



def _look(path: Path) -> sqlite3.Connection:
    """An existing file must be an amdflash database (or empty): looked at through the one
    connection that then prepares it (store.writer.database.prepare), before anything is changed."""
    conn: sqlite3.Connection | None = None
    try:
        conn = sqlite3.connect(str(path), timeout=30.0, check_same_thread=False, isolation_level=None)
        found = tables(conn)
    except sqlite3.DatabaseError as e:
        if conn is not None:
            conn.close()
        raise Refusal(f"audit database {path} is not usable: {e}") from None
    if found and OURS not in found:
        conn.close()
        raise Refusal(foreign(path, found))
    return conn


def open_writer(path_text: str) -> AuditWriter:
    """The audit writer for a board command, after every check that can refuse up front."""
    path = Path(path_text)
    why = not_a_file(path)
    if why:
        raise Refusal(f"audit database {path} is not usable: {why}")
    directory = path.parent if str(path.parent) else Path(".")
    if directory.resolve() == config.data_dir().resolve():
        # Our own data directory (made on first use): the trail and the backups of flash
        # content are the owner's alone.
        try:
            private_dir(directory, tighten=True)
        except OSError as e:
            raise Refusal(f"audit database {path}: cannot create directory {directory} ({e.strerror})") from None
    elif not directory.is_dir():
        # A directory the user named: a typo must not silently grow a tree of directories.
        raise Refusal(f"audit database {path}: directory {directory} does not exist (create it first)")
    problem = room_problem(path if path.exists() else directory)   # a kernel file system, a read-only mount
    if problem:
        raise Refusal(f"audit database {path} is not writable: {problem}")
    if not os.access(directory, os.W_OK | os.X_OK):
        # SQLite keeps its WAL and lock files beside the database.
        raise Refusal(f"audit database {path}: directory {directory} is not writable")
    try:
        free = free_bytes(str(path))
    except OSError:
        free = START_FREE
    if free < START_FREE:
        raise Refusal(low_space(str(path), free, START_FREE))
    existed = path.exists() and path.stat().st_size > 0
    conn = None
    if existed:
        if not os.access(path, os.R_OK | os.W_OK):
            raise Refusal(f"audit database {path} is not writable: permission denied")
        conn = _look(path)
    try:
        try:
            for name in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
                if name == path or name.exists():
                    private_file(name)   # 0600 before SQLite writes: its WAL and -shm take the same mode
        except OSError as e:
            raise Refusal(f"audit database {path}: {e.strerror}") from None
        try:
            # Created, or one of an older amdflash refused ('audit upgrade' upgrades it), and
            # proven writable, through this one connection.
            prepare(str(path), conn=conn)
            # Closed before the writer process is forked, and the command's own connection for
            # reading the trail during its run (run_trail) opened after: a child forked with a
            # connection open inherits SQLite's per-file lock state for it, believes it holds
            # locks the kernel gave the parent, and once the parent dies another connection's
            # close may checkpoint and remove the -wal under the writer's later commits (a
            # killed host's last rows were lost: test_durability's host killed alone).
            conn = None
            writer = AuditWriter(str(path), key_path=host_key_path(str(path))).open(prepared=True)
            conn = sqlite3.connect(str(path), timeout=30.0, check_same_thread=False, isolation_level=None)
        except (StoreUnavailable, SchemaError) as e:
            raise Refusal(str(e)) from None
    except BaseException:
        if conn is not None:
            conn.close()
        raise
    writer.kept = conn
    return writer


def run_trail(writer: object, path: str) -> Trail:
    """The trail a board command's jobs read during its run, and the command its reports after
    it (store.reading.Trail): the connection open_writer opened once the writer had started,
    else (a writer made otherwise: tests, benchmarks) the file opened read-only here."""
    conn = getattr(writer, "kept", None)
    if isinstance(conn, sqlite3.Connection):
        writer.kept = None  # type: ignore[attr-defined]
        return Trail(sqlite_utils.Database(conn, execute_plugins=False))
    return Trail(open_reader(path))


def no_database(path: Path | str) -> Refusal:
    """'No audit database at PATH', naming the line's trail when this machine has one: on a
    line host, a command run without --db looks in the account's own data directory."""
    hint = ""
    line_db = config.LINE_DB
    if Path(path) != Path(line_db) and os.path.isfile(line_db):
        hint = f"; this machine's line services write theirs at {line_db} (--db {line_db})"
    return Refusal(f"no audit database at {path}{hint}")


def open_reader(path_text: str) -> sqlite_utils.Database:
    """The audit database, read-only, for runs, report, audit commands and each board command's
    report: store.reading.open_trail (one connection), its refusals as the command's."""
    try:
        return open_trail(path_text)
    except NoTrail:
        raise no_database(path_text) from None
    except TrailRefused as e:
        raise Refusal(str(e)) from None


KEY_FILE = "host_key.pem"


ENV_KEY = "AMDFLASH_HOST_KEY"


def host_key_path(db: str | None = None) -> Path:
    """The private key that signs the audit database `db` (a real path, config.audit_db; None:
    the database this process would use). One database has one key, however it was named.

    The rule: $AMDFLASH_HOST_KEY if set; else a key this account made beside the database's
    real path (an older amdflash kept the key beside a database named by $AMDFLASH_DB or the
    config file's `db`: such a trail goes on being signed by the key that signed it); else
    this account's key in its data directory (made on first use), the one every other
    database of the account is signed with. The data directory's database has both at once."""
    if os.environ.get(ENV_KEY):
        return Path(os.environ[ENV_KEY])
    beside = Path(db or config.audit_db()).parent / KEY_FILE
    return beside if _made_here(beside) else config.data_dir() / KEY_FILE


def own_key_paths(db: str | None = None) -> list[Path]:
    """The key files whose signatures a board command acts on for `db`: the one that signs it
    and, beside it, this account's key in the data directory (a database an older amdflash
    reached by --db was signed by that one, and by the key beside it when reached by
    $AMDFLASH_DB: both are this account's). Never a key someone else could have put there."""
    signing = host_key_path(db)
    if os.environ.get(ENV_KEY):
        return [signing]
    account = config.data_dir() / KEY_FILE
    return [signing] if account == signing else [signing, account]


def _made_here(path: Path) -> bool:
    """A key file this account made: a regular file (not a link) owned by this user that
    nobody else may read or write. Another user's file at that name is never taken as ours."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077


def open_for_reading(path: str) -> sqlite_utils.Database:
    """The audit database read-only. Reading never writes: no upgrade, no key, and for a trail
    of another user nothing created beside it (store.read_only). A database of an older
    amdflash (unsigned) is refused, naming the command its owner upgrades it with."""
    try:
        return open_trail(path, strict=False)
    except NoTrail:
        raise no_database(path) from None
    except TrailRefused as e:
        raise Refusal(str(e)) from None


def legacy_version(path: str) -> int | None:
    """The schema version of the database at `path` if an older amdflash wrote it, else None
    (also when it cannot be read: the usual open then says why)."""
    from amdflash.store import schema

    try:
        if not Path(path).is_file():
            return None
        conn = connect_reader(path)
        try:
            found = schema.version(conn)
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    return found if found is not None and 0 < found < schema.SCHEMA_VERSION else None
