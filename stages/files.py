"""Files amdflash creates, made so that no other local user can steer or read them.

amdflash runs as root beside other users, and writes into directories they may share (a
dump into /tmp, a report next to an image). A name there may already be taken by a link
to a file root owns, or by a file someone else holds open. So every file is created new,
never opened through a link (O_CREAT | O_EXCL | O_NOFOLLOW), under a name nobody can
guess, filled, fsynced, and only then renamed to the name asked for: what is at that name
is replaced (a link itself, never its target) or, without overwrite, left alone.

Modes: what holds flash content or the record — the audit database with its WAL, the
anchor, keys, backups — is 0600 in 0700 directories; an output the user names (a dump, a
report, an export) gets the user's umask, but never more open than 0644.
"""
from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, cast

PRIVATE = 0o600
PRIVATE_DIR = 0o700
OUTPUT = 0o644      # the most open an output may be; the umask narrows it further


class OutputExists(FileExistsError):
    """The output's name is taken and overwriting was not asked for."""


# What the errors an operator meets writing a file mean, in words (the others: the system's own).
_REASONS = {errno.EROFS: "the file system is read-only (mounted ro)",
            errno.ENOSPC: "no space left on the file system",
            errno.EDQUOT: "the disk quota is used up",
            errno.EACCES: "permission denied",
            errno.EPERM: "operation not permitted"}


def reason(e: OSError) -> str:
    """Why an OS call failed, in words, with the error's symbolic name (ENOSPC) to search for."""
    name = errno.errorcode.get(e.errno or 0, "")
    text = _REASONS.get(e.errno or 0) or (e.strerror or str(e)).lower()
    return f"{text} ({name})" if name else text


class FileFailure(OSError):
    """An OS error on a file amdflash writes, said with what was being done and to which file
    (the name asked for, not the hidden partial file beside it)."""

    def __init__(self, doing: str, path: Path, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror, str(path))
        self.doing = doing
        self.cause = cause

    def __str__(self) -> str:
        return f"{self.doing} {self.filename}: {reason(self.cause)}"


# File systems the kernel makes up (no disk behind them): a file written there is not kept.
PSEUDO = frozenset({"proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs",
                    "configfs", "pstore", "bpf", "efivarfs", "fusectl", "mqueue", "binfmt_misc", "autofs"})


def fs_type(path: Path) -> str | None:
    """The type of the file system `path` is on (from /proc/self/mountinfo), None if unknown."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    target, best, kind = os.path.realpath(path), "", None
    for line in lines:
        fields = line.split()
        if "-" not in fields[6:]:
            continue
        point = fields[4].encode().decode("unicode_escape")     # "\040" is a space
        under = target == point or target.startswith(point.rstrip("/") + "/")
        if under and len(point) >= len(best):
            best, kind = point, fields[fields.index("-", 6) + 1]
    return kind


def room_problem(directory: Path, need: int = 0) -> str | None:
    """Why a file of `need` bytes cannot be written in `directory`, when the file system says so
    before anything is written: a pseudo file system, a read-only one, or too little free space."""
    kind = fs_type(directory)
    if kind in PSEUDO:
        return f"{directory} is on a {kind} file system (made up by the kernel, not a disk)"
    try:
        vfs = os.statvfs(directory)
    except OSError:
        return None
    if vfs.f_flag & os.ST_RDONLY:
        return f"{directory} is on a read-only file system (mounted ro)"
    free = vfs.f_bavail * vfs.f_frsize
    if free < need:
        return f"{directory} has {free // 1024} KiB free on its file system, {need // 1024} KiB are needed"
    return None


def create_new(path: Path, mode: int = PRIVATE, dir_fd: int | None = None) -> int:
    """A file descriptor of a new file at `path` (never an existing file, never through a link);
    with `dir_fd`, `path` is a name in that open directory."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)


class LinkInPath(NotADirectoryError):
    """A directory to be reached without following links has a link (or a non-directory) on its
    way: another user may have swapped a directory for a link to one of their choosing.
    `link`: a link is what is there (else a file that is not a directory)."""

    link = False

    def __str__(self) -> str:
        return str(self.strerror)


def open_dir(path: str | os.PathLike[str], readable: bool = True) -> int:
    """A descriptor of the directory at `path`, reached from / one name at a time with no
    symbolic link followed anywhere on the way: read-only, or without `readable` O_PATH (enough
    to open, create and rename the files in it, as search permission is). Callers that accept a link as the name
    they were given resolve it once (os.path.realpath) and hand this the result: a link found
    here was put there since. Files are then opened relative to the descriptor (dir_fd), so the
    directory they land in is the one opened, whatever is renamed or linked at its path later."""
    where = os.path.abspath(path)
    parts = [p for p in where.split("/") if p]
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, name in enumerate(parts):
            # O_PATH on the way (search permission is enough); the directory itself read-only.
            last = i == len(parts) - 1
            flags = (os.O_RDONLY if last and readable else os.O_PATH) | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                step = os.open(name, flags, dir_fd=fd)
            except OSError as e:
                if e.errno not in (errno.ENOTDIR, errno.ELOOP):
                    raise
                reached = "/" + "/".join(parts[:i + 1])
                link = _is_link(name, fd)
                what = "a symbolic link" if link else "not a directory"
                error = LinkInPath(e.errno, f"{reached} is {what}: a directory reached without following links", where)
                error.link = link
                raise error from None
            os.close(fd)
            fd = step
        if not parts and readable:
            step = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            os.close(fd)
            fd = step
        return fd
    except BaseException:
        os.close(fd)
        raise


def _is_link(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def private_dir(path: Path, tighten: bool = False) -> Path:
    """`path` as a directory: made 0700 if missing (missing parents as the system makes them);
    with `tighten`, an existing one of ours that others can enter is narrowed to 0700 (our
    own data directory; never a directory the user chose, which may be shared on purpose)."""
    try:
        os.mkdir(path, PRIVATE_DIR)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(path, PRIVATE_DIR)
    except FileExistsError:
        st = os.lstat(path)
        if tighten and stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and st.st_mode & 0o077:
            os.chmod(path, PRIVATE_DIR)
    return path


def private_file(path: Path) -> None:
    """Make sure the file at `path` is readable by its owner only: an empty one is created
    0600 if missing (SQLite then gives its WAL and shared-memory files the same mode); one we
    own that others can read is narrowed to 0600."""
    try:
        os.close(create_new(path, PRIVATE))
        return
    except FileExistsError:
        pass
    st = os.lstat(path)
    if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and st.st_mode & 0o077:
        os.chmod(path, PRIVATE)


def _partial(path: Path) -> Path:
    # A short name of its own: `path` may already be as long as a name can be.
    return path.with_name(f".amdflash-{secrets.token_hex(8)}.partial")


class _Named:
    """The file being written, whose write errors name the file asked for (an error raised by
    whatever produces the data stays that error)."""

    def __init__(self, f: BinaryIO, path: Path) -> None:
        self._f, self._path = f, path

    def write(self, data: bytes) -> int:
        try:
            return self._f.write(data)
        except OSError as e:
            raise FileFailure("writing", self._path, e) from e

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


@contextlib.contextmanager
def new_file(path: Path, mode: int = OUTPUT, overwrite: bool = True, dir_fd: int | None = None) -> Iterator[BinaryIO]:
    """A whole file, written through the yielded file object: under a fresh unguessable name
    beside `path`, fsynced, then renamed to `path` — so an interrupted write never leaves a
    plausible file, and nothing planted at either name is followed. Without `overwrite`, an
    existing `path` is left as it was (OutputExists), checked atomically by the link (or, on
    a file system without links, the rename) that puts the new file in place. With `dir_fd`
    (a directory open_dir opened), both names are taken in that directory: `path` names the
    file in messages, its last component is what is written."""
    tmp = _partial(path)
    at = {} if dir_fd is None else {"src_dir_fd": dir_fd, "dst_dir_fd": dir_fd}
    tmp_name, name = (tmp, path) if dir_fd is None else (Path(tmp.name), Path(path.name))
    try:
        fd = create_new(tmp_name, mode, dir_fd)
    except OSError as e:
        raise FileFailure("creating", path, e) from e
    doing: str | None = None      # None while the caller's body runs: its own errors stay its own
    try:
        with os.fdopen(fd, "wb") as f:
            yield cast(BinaryIO, _Named(f, path))
            doing = "writing"
            f.flush()
            os.fsync(f.fileno())
        doing = "renaming the finished file to"
        if overwrite:
            os.replace(tmp_name, name, **at)
        else:
            try:
                _place_if_free(tmp_name, name, dir_fd)
            except FileExistsError:
                raise OutputExists(f"{path} exists (use --overwrite to replace it)") from None
    except OSError as e:
        try:
            os.unlink(tmp_name, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        if doing is None or isinstance(e, (FileFailure, OutputExists)):
            raise
        raise FileFailure(doing, path, e) from e
    except BaseException:
        try:
            os.unlink(tmp_name, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        raise


# Hard links are refused by file systems that have none (FAT and exFAT — a USB stick —, some
# network and FUSE mounts): EPERM, or EOPNOTSUPP.
_NO_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP}


def _place_if_free(tmp: Path, path: Path, dir_fd: int | None = None) -> None:
    """Give the finished file `tmp` the name `path` only if that name is free (else
    FileExistsError), atomically: a hard link, then the temporary name removed; where the file
    system has no hard links, a rename that refuses to replace (renameat2 RENAME_NOREPLACE)."""
    try:
        os.link(tmp, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
    except OSError as e:
        if e.errno not in _NO_LINKS:
            raise
        _rename_no_replace(tmp, path, dir_fd)
        return
    os.unlink(tmp, dir_fd=dir_fd)


def _rename_no_replace(src: Path, dst: Path, dir_fd: int | None = None) -> None:
    import ctypes

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2    # glibc 2.28 and later
    except AttributeError:
        raise OSError(errno.ENOSYS, "renameat2 is not available to rename without replacing", str(dst)) from None
    at_fdcwd, rename_noreplace = -100, 1
    at = at_fdcwd if dir_fd is None else dir_fd
    if renameat2(at, os.fsencode(src), at, os.fsencode(dst), rename_noreplace) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(dst))     # EEXIST: FileExistsError


def fsync_dir(directory: Path) -> None:
    """Make the names in `directory` durable (a file just renamed into it survives power loss)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_new(path: Path, data: bytes | str, mode: int = OUTPUT, overwrite: bool = True,
              dir_fd: int | None = None) -> Path:
    """`new_file` for content already in memory (text is written as UTF-8)."""
    with new_file(path, mode, overwrite, dir_fd) as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
    return path


def readonly_uri(path: str | os.PathLike[str]) -> str:
    """An SQLite URI that opens `path` read-only: the path percent-encoded, so a name with
    '#', '?' or '%' in it opens that very file and not another."""
    return Path(os.path.abspath(path)).as_uri() + "?mode=ro"
