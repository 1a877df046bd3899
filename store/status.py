"""A run's status, decided in one place for every view (runs, report, the HTML page, replay,
resume, fleet runs).

A run records its end (succeeded, failed, interrupted, refused) as its last act. A run with no
end on record is `running` only while the process that recorded it lives: every run records,
first of all, which process it is (pid, the process's start time in clock ticks since boot, the
kernel's boot id — a stages row "process"), and a reader on the same machine checks that very
process in /proc. A pid reused by another process has another start time; a reboot has another
boot id. So a run whose host died, was killed or lost power is `interrupted` the moment anyone
looks, not when a later run happens to resume it. Read on another machine (the line's central
record), a run with no end is `interrupted` once a later run resumed it, else `running`: that
reader cannot see the process, so it takes what the record shows instead: its machine recorded
a later run under another boot id (no process survives a boot), or the host said, from its
/proc, that the process is gone (its follow service's word: `audit push --follow`); else the
run is `running`, as it may well be.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

PROCESS_STAGE = "process"
ENDS = ("succeeded", "failed", "interrupted", "refused")
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


# Processes a reader off the host knows are gone, by their "process" row's detail: a run copied
# out of the central record (fleet report, the line view) is read with what the record shows.
_GONE: ContextVar[frozenset[str]] = ContextVar("processes_gone", default=frozenset())


@contextmanager
def processes_gone(details: Iterable[str]) -> Iterator[None]:
    """Within: the processes these "process" rows name are taken as gone (read elsewhere, the
    record showed it: its host said so, or its machine has booted since)."""
    token = _GONE.set(_GONE.get() | frozenset(details))
    try:
        yield
    finally:
        _GONE.reset(token)


def _start_ticks(pid: int, living: bool = False) -> int | None:
    """Field 22 of /proc/PID/stat: when the process started, in clock ticks since boot (`living`:
    None for a process that has died but is not yet reaped — a zombie runs nothing)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: fields follow the last ')'.
    try:
        fields = stat[stat.rindex(")") + 2:].split()
        return None if living and fields[0] in ("Z", "X") else int(fields[19])
    except (ValueError, IndexError):
        return None


def _boot_id() -> str | None:
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return None


def this_process() -> str:
    """The detail of the "process" stages row a run records first: who is running it."""
    pid = os.getpid()
    return json.dumps({"pid": pid, "start_ticks": _start_ticks(pid), "boot_id": _boot_id()}, sort_keys=True)


def process_alive(detail: str | None) -> bool | None:
    """Whether the process a "process" row names still runs: None when this machine cannot
    tell (no such row, or recorded under another boot id: another machine, or this one before
    a reboot — which the caller tells apart by the run's machine-id)."""
    try:
        facts: dict[str, Any] = json.loads(detail or "")
        pid, ticks, boot = int(facts["pid"]), facts.get("start_ticks"), facts.get("boot_id")
    except (ValueError, TypeError, KeyError):
        return None
    if boot is None or boot != _boot_id():
        return None
    return ticks is not None and _start_ticks(pid, living=True) == ticks


def machine_id() -> str | None:
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            return Path(path).read_text().strip() or None
        except OSError:
            continue
    return None


def boot_of(detail: str | None) -> str | None:
    """The boot id a "process" row names (None: none, or not a row that reads)."""
    try:
        boot = json.loads(detail or "").get("boot_id")
    except (ValueError, AttributeError):
        return None
    return boot if isinstance(boot, str) and boot else None


def run_status(recorded: str | None, resumed: bool, process: str | None = None,
               run_machine: str | None = None, machine_boot: str | None = None,
               host_said: str | None = None) -> str:
    """The status every view shows. `recorded`: the run's last run_status row (None: none);
    `resumed`: a later (verified) run resumed it; `process`: its "process" row's detail;
    `run_machine`: the machine-id its runs row recorded. Read on another machine: `machine_boot`,
    the boot id of the newest process its machine recorded; `host_said`: the host's own newest
    word of the run (a progress state, which its follow service decides here, from its /proc)."""
    if recorded in ENDS:
        return recorded
    if resumed:
        return "interrupted"          # a later run took over its work: this one is over
    alive = process_alive(process)
    if alive is None:
        here = machine_id()
        # Recorded on this machine (same machine-id) but under another boot: the host rebooted.
        if process and run_machine and here and run_machine == here:
            return "interrupted"
        if process in _GONE.get():
            return "interrupted"      # the record it was copied from shows its process gone
        booted = boot_of(process)
        if booted and machine_boot and machine_boot != booted:
            return "interrupted"      # its machine has booted since: no process survives a boot
        return "interrupted" if host_said == "interrupted" else "running"
    return "running" if alive else "interrupted"
