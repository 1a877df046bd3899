"""A run's end, told again wherever the run is shown later (`report` text, JSON and HTML).

A reviewer who opens the report of a failed or interrupted run — the next morning, or because
the terminal is gone — needs what the operator was told when it ended: the state the flash is
in, the backup to put back (and whether it is the board's original or only the content as
found), and the next step, in the same words and with the same command (next_step.advice, its
backup from store.originals, as commands' board runs build them). A run that a resume has
since finished says so instead of suggesting a step that is no longer needed.

Read from the central record (`fleet report`, on_host), the same end is told of a run of
another host: its commands must run there, against that host's trail, so the next step says
where and carries no option of the reader's command line.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import sqlite_utils

from amdflash.pipeline.engine import jobs
from amdflash.pipeline.engine import next_step
from amdflash.store.originals import Backup, _first_backup
from amdflash.store.queries import RunNotFound, later_writers, lineage_units, newest_resume, run_chain
from amdflash.store.run_rows import RunUnverified

ENDED_BADLY = ("failed", "interrupted")

# The host a run read from the central record ran on (on_host); None: this host's own trail.
_host: ContextVar[str | None] = ContextVar("run_end_host", default=None)


@contextmanager
def on_host(host: str) -> Iterator[None]:
    """Tell the ends of runs of `host` (fleet report): the next step is prefixed 'on HOST:'.
    No suggested command may carry the reader's own --db or --config (they name files of the
    reader's machine; the record does not keep the host's, so the step says to add them): the
    caller reads the run with next_step.BARE."""
    token = _host.set(host)
    try:
        yield
    finally:
        _host.reset(token)


def _where(step: str | None) -> str | None:
    host = _host.get()
    if step is None or host is None:
        return step
    return (f"on {host}: {step} (run there, with --db and --config of {host}'s trail and configuration if they "
            "are not the defaults)")


def add(db: sqlite_utils.Database, rep: dict[str, Any],
        original: Callable[[], tuple[str, str, str] | None], say: next_step.Advice) -> None:
    """Put the run's end into its report: `fixed_by`, `superseded_by` (store.queries: a later
    run that wrote the board of a flash no resume finished), `registers_put_back` and `outcome`
    (None for a run that succeeded, was refused or still runs). `original`: the board's original
    for the advice, as commands finds it for a board run's (called only for a flash or resume
    that needs it); `say`: the places the commands suggested name."""
    rep["fixed_by"] = rep.get("finished_by")
    later: tuple[str | None, object] = (None, None)
    if not rep["fixed_by"] and wanted(rep) and rep.get("command") in next_step.WRITES:
        later = later_writers(db, rep["run_id"])
    rep["superseded_by"] = later[0]
    rep["registers_put_back"] = put_back_words(rep)
    if _host.get() is not None:         # a copy of another host's run: its facts say where its commands run
        from amdflash.store.facts import read_for_host

        read_for_host(rep, str(_host.get()))
    rep["outcome"] = outcome(db, rep, _board_original(rep, original), later[1], say) if wanted(rep) else None


def put_back_words(rep: dict[str, Any]) -> list[str]:
    """What the run put back, before anything else, of the registers an earlier run left
    changed (stages/restore.put_back's sealed record), in the words the command line said."""
    import json

    words = []
    for row in rep.get("stages") or ():
        if row.get("stage") != "restore_stranded" or row.get("event") != "end":
            continue
        try:
            said = json.loads(row.get("detail") or "")
            done, run = said.get("put_back") or {}, str(said.get("run"))
            if done:
                words.append(f"put back the registers run {run} left changed: "
                             + ", ".join(f"{name} {was} -> {now}" for name, (was, now) in done.items()))
        except (ValueError, TypeError, AttributeError):
            continue        # not a row amdflash wrote: it says nothing
    return words


def _board_original(rep: dict[str, Any], original: Callable[[], tuple[str, str, str] | None]) \
        -> tuple[str, str, str] | None:
    if rep.get("command") not in next_step.WRITES:
        return None
    try:
        return original()
    except (RunNotFound, RunUnverified):    # the board's lineage names a run that is missing or forged
        return None


def wanted(rep: dict[str, Any]) -> bool:
    """Whether the report of this run carries its end (a run that did not succeed, nor was refused:
    a refusal wrote nothing and its reason is the run's error)."""
    return rep.get("status") in ENDED_BADLY


def outcome(db: sqlite_utils.Database, rep: dict[str, Any], original: tuple[str, str, str] | None,
            unvouched: object, say: next_step.Advice) -> dict[str, Any]:
    """The run's end: `state` (what the flash holds, for a flash or resume), `backup` (the
    content the run's lineage found, with the command that writes it back), `original` (the
    board's original, when another backup holds it), `next_step` (next_step.advice: the words
    and command the run printed), `fixed_by` (the resume that finished its work, if any: then
    there is no next step) and `superseded_by` (else the later run that wrote its board since:
    no next step either, for resuming would be refused; the board is that run's business).
    `original`: (path, run, put-back command) as commands gives it to the advice; `unvouched`: a
    later run on record as writing the board that nothing verified vouches for (queries.
    later_writers): resuming is refused over it, so the step says so and offers the put-back
    (`resume_blocked_by`) — the flash is still told as unfinished, never as superseded. `say`:
    the places its commands name."""
    spec = (rep.get("board") or {}).get("spec") or ""
    fixed = rep.get("finished_by")
    # A later run wrote the board: resuming would be refused, and what the board holds is its business.
    superseded = None if fixed else rep.get("superseded_by")
    writes = rep.get("command") in next_step.WRITES
    mine = _lineage_backup(db, rep["run_id"]) if writes else None
    backup = first = None
    if mine is not None:
        is_original = original is None or original[0] == mine.path
        backup = {"path": mine.path, "run_id": mine.run_id, "sha256": mine.sha256,
                  "content": "the board's original content" if is_original else "the content as found",
                  # Until the flash is finished, a new flash of the board needs --start-over.
                  "put_back": (original[2] if is_original and original else
                               jobs.restore_command(mine, spec, say.command))}
    if original is not None and (backup is None or backup["content"] != "the board's original content"):
        first = {"path": original[0], "run_id": original[1], "put_back": original[2]}
    now, carried_by = (_flash_now(db, rep) if writes and not fixed else (rep, rep["run_id"]))
    return {
        "state": next_step.flash_state(now) if writes else None,
        "backup": backup,
        "original": first,
        "next_step": None if fixed or superseded else _where(
            _blocked(now, unvouched, backup, first) if unvouched is not None else
            next_step.advice(now, *(original or (None,)), run_id=carried_by, spec=spec, say=say)),
        "fixed_by": fixed,
        "superseded_by": superseded,
        "resume_blocked_by": None if unvouched is None else str(unvouched),
    }


def _blocked(now: dict[str, Any], unvouched: object, backup: dict[str, Any] | None,
             first: dict[str, Any] | None) -> str:
    """The step when a later run nothing verified vouches for is on record as writing the board:
    not the resume (it refuses), but the put-back, which does not."""
    held = first if first is not None else backup
    way = (f"to put back the original content: {held['put_back']}" if held is not None else
           "to flash it anew: the flash command with --start-over")
    return (f"{next_step.flash_state(now)}. A later run, {unvouched!s}, is on record as writing this board, but "
            f"nothing this host signed vouches for it: resuming this flash is refused while it stands (the refusal "
            f"says why); {way}")


def _flash_now(db: sqlite_utils.Database, rep: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The run's report with the flash's units as its whole job left them — the flash it
    resumes, and the resumes of it since (an interrupted resume wrote on what the run left) —
    and the newest run of that job: the one a resume carries on. The run's own report where a
    run of the job does not verify."""
    try:
        newest = newest_resume(db, rep["run_id"])
        return {**rep, "units": lineage_units(db, newest)}, newest
    except (RunUnverified, RunNotFound):
        return rep, rep["run_id"]


def backup_words(end: dict[str, Any]) -> str | None:
    """The backup line, as a flash says it when it keeps one."""
    backup, first = end.get("backup"), end.get("original")
    if backup is None:
        return (f"none of this run; the board's original: {first['path']} (run {first['run_id']}; to put it back: "
                f"{first['put_back']})" if first else None)
    words = f"backup of {backup['content']}: {backup['path']} (run {backup['run_id']}); to put it back: " \
            f"{backup['put_back']}"
    if first:
        words += f"; the board's original: {first['path']} (run {first['run_id']}; to put it back: " \
                 f"{first['put_back']})"
    return words


def _lineage_backup(db: sqlite_utils.Database, run_id: str) -> Backup | None:
    """The backup the run keeps: its own, else (a resume that kept its lineage's file) the
    first one its lineage recorded — sealed rows of runs that verify only."""
    try:
        chain = run_chain(db, run_id)
    except (RunUnverified, RunNotFound):     # a resumed run missing or forged: nothing it says is kept
        return None
    for rows in [chain[-1], *chain[:-1]]:
        found = _first_backup(db, rows)
        if found is not None:
            return found
    return None


def status_words(status: str, summary: dict[str, Any]) -> str:
    """A run's status as its end line says it, with where its tree head stands with the
    witnesses when the config file names some (engine/witnessing.at_end): `succeeded,
    witnessed by 2 of 2`, or `succeeded — not yet witnessed (why)`."""
    said = (summary.get("witnesses") or {}).get("words")
    if not said:
        # Without witnesses, a run the host's transparency log did not take is still said.
        missed = (summary.get("transparency_log") or {}).get("error")
        return f"{status} \u2014 not in the transparency log ({missed})" if missed else status
    return f"{status}, {said}" if (summary.get("witnesses") or {}).get("witnessed") else f"{status} \u2014 {said}"
