"""Facts about a run that the host establishes itself, rather than claims it is told.

* operator: the OS account running the process (by uid, from the password database), never
  an environment variable; a name given with `--operator` is recorded beside it as claimed;
* tool version: the installed package's metadata, plus the VCS revision when amdflash runs
  from a git checkout (with "-dirty" when it has uncommitted changes);
* host: the name the line knows it by when it is told one (a fleet host job is, by the
  coordinator's place: $AMDFLASH_HOST_NAME), else its OS host name; and its machine-id, which
  is what tells one machine from another;
* clock: timestamps are UTC; whether the kernel says the system clock is synchronised
  (adjtimex) is recorded when it can be known.
"""
from __future__ import annotations

import ctypes
import functools
import os
import pwd
import socket
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

from amdflash.pipeline.version import installed_version
from amdflash.store.writer.sealer import machine_id

LINE_NAME = "AMDFLASH_HOST_NAME"   # the line's name for this host (its exporter's), when it has one
_TIME_ERROR = 5          # adjtimex: the clock is not synchronised
_STA_UNSYNC = 0x0040
_STATUS_OFFSET = 40      # struct timex: int status after unsigned modes and four longs (LP64)


@dataclass(frozen=True)
class HostFacts:
    operator: str
    host: str
    machine_id: str | None
    tool_version: str
    tool_revision: str | None
    clock_sync: str


def operator() -> str:
    uid = os.getuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:   # no passwd entry (some containers): the uid is the fact
        return f"uid {uid}"


@functools.cache
def tool_version() -> str:
    version = installed_version()
    return "unknown (not installed)" if version == "0+unknown" else version


@functools.cache
def tool_revision() -> str | None:
    """The git commit of the checkout amdflash runs from, if it runs from one."""
    root = Path(__file__).resolve().parents[2]   # pipeline/engine/run_facts.py -> the checkout
    if not (root / ".git").exists():
        return None
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"git {head}{'-dirty' if dirty else ''}"


def clock_sync() -> str:
    """What the kernel says of the system clock's synchronisation (Linux adjtimex)."""
    try:
        # The C library is already loaded in this process: its symbols are found through the
        # process itself (dlopen(NULL)), where ctypes.util.find_library would run `ldconfig -p`.
        adjtimex = ctypes.CDLL(None, use_errno=True).adjtimex
    except (OSError, AttributeError):
        return "unknown"
    buf = ctypes.create_string_buffer(512)   # larger than struct timex; modes = 0: read only
    state = adjtimex(buf)
    if state < 0:
        return "unknown"
    (status,) = struct.unpack_from("i", buf.raw, _STATUS_OFFSET)
    if state == _TIME_ERROR or status & _STA_UNSYNC:
        return "unsynchronised (kernel adjtimex)"
    return "synchronised (kernel adjtimex)"


def host_name() -> str:
    """The host as its line names it (a run page read on the line says `hosta`, not the OS
    host name `vm` of the machine behind it), else the OS host name."""
    return os.environ.get(LINE_NAME, "").strip() or socket.gethostname()


def host_facts() -> HostFacts:
    return HostFacts(operator(), host_name(), machine_id(), tool_version(), tool_revision(), clock_sync())
