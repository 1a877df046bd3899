"""Reading the small files a user names (keys, anchors, settings) without trusting the name.

A path on the command line may be a FIFO (opening it blocks until someone writes), a
device such as /dev/zero (reading it never ends) or a directory. Only regular files are
read, never more than a stated size, and the open itself cannot block.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path


class NotAFile(ValueError):
    """The path exists but is not a regular file of a sensible size."""


def kind_of(mode: int) -> str:
    """What a file that is not a regular one is, for messages ("a FIFO", ...)."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def read_regular(path: Path, limit: int) -> bytes:
    """The bytes of the regular file at `path`: NotAFile if it is something else or larger than
    `limit` bytes; OSError (FileNotFoundError, PermissionError, ...) as the system reports it."""
    # O_NONBLOCK: a FIFO opens at once, so the check below sees it instead of hanging.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotAFile(f"{path} is {kind_of(mode)}, not a regular file")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise NotAFile(f"{path} is larger than {limit} bytes; is it the right file?")
    return data
