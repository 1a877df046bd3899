"""A failed or interrupted run's end as `fleet report` tells it, for the line view and its
notifications: the state the flash is in, the backup (with the command that puts it back), and
the next step on the run's host — or the resume that fixed it.

Told only from the signed record: the run copied out of it into a temporary trail, its chain
and signatures checked again against the host's enrolled key (as a run's page is made), and
its end worded by pipeline.commands.run_end on that copy, as `fleet report` words it. What does
not verify, or is not in the record yet, tells nothing (the view shows the host's word alone).
"""
from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path
from typing import Any

ENDED_BADLY = ("failed", "interrupted")


def run_end(url: str, host_id: int, run_id: str, host_said: str | None = None) -> dict[str, Any] | None:
    """{"status", "fixed_by", "lines"} of the run as `fleet report` tells it (`lines`: the
    state, backup and next step, each one line, or the resume that fixed it); None while the
    record does not hold the run, or when it does not verify. `host_said`: the host's own end
    of it (its follow service saw its process gone: a run with no end recorded is then read as
    interrupted, as on its host)."""
    from amdflash.pipeline.commands import board as commands
    from amdflash.pipeline.commands.run_end import on_host
    from amdflash.pipeline.engine.next_step import BARE
    from amdflash.pipeline.errors import Refusal
    from amdflash.store import central
    from amdflash.store.keys import KeyError_, public_line
    from amdflash.store.run_rows import RunUnverified
    from amdflash.store.status import PROCESS_STAGE, processes_gone

    with central.connect(url) as pg:
        central.need_schema(pg)
        host = pg.execute(f"SELECT name, public_key FROM {central.NS}.hosts WHERE id = %s", (host_id,)).fetchone()
    if host is None:
        return None
    name = str(host[0])
    with tempfile.TemporaryDirectory(prefix="amdflash-serve-end-") as tmp:
        key, copy = Path(tmp) / "host.pub", Path(tmp) / "run.sqlite"
        key.write_text(public_line(bytes(host[1])) + "\n")
        try:
            central.materialize(url, f"{name}/{run_id}", copy)
        except central.CentralError:
            return None                       # not pushed yet
        gone = gone_processes(url, name, copy)
        if host_said == "interrupted":   # the host's word as this view read it (the record may lag)
            gone += _process_rows(copy, run_id, PROCESS_STAGE)
        try:
            with on_host(name), processes_gone(gone):
                rep, _ = commands.report(run_id, str(copy), keys=[key], advice=BARE)   # naming none of ours
        except (Refusal, RunUnverified, KeyError_):
            return None
    if not (rep.get("chain") or {}).get("ok"):
        return None
    return {"status": rep.get("status"), "fixed_by": rep.get("fixed_by"), "lines": end_lines(rep.get("outcome"))}


def end_lines(end: dict[str, Any] | None) -> list[str]:
    """The end's lines, worded as the run's report words them."""
    from amdflash.pipeline.commands.run_end import backup_words

    if not end:
        return []
    backup = backup_words(end)
    lines = [f"state: {end['state']}" + (" (when the run ended)" if end.get("fixed_by") else "")
             if end.get("state") else None,
             f"backup: {backup}" if backup else None,
             f"next: {end['next_step']}" if end.get("next_step") else None,
             f"fixed by {end['fixed_by']}" if end.get("fixed_by") else None]
    return [line for line in lines if line]


def gone_processes(url: str, host: str, copy: Path) -> list[str]:
    """The "process" rows of the runs copied out of the record into `copy` whose process the
    record shows gone (fleet runs' status for them is interrupted: store.central.select_runs),
    for reading the copy as the record reads them (store.status.processes_gone)."""
    from amdflash.store import central
    from amdflash.store.status import PROCESS_STAGE

    conn = sqlite3.connect(f"file:{copy}?mode=ro", uri=True)
    try:
        ids = [str(r) for (r,) in conn.execute("SELECT run_id FROM runs")]
    finally:
        conn.close()
    with central.connect(url) as pg:
        over = [r["run_id"] for r in central.select_runs(pg, host=host, run_ids=ids) if r["status"] == "interrupted"]
    return [d for run_id in over for d in _process_rows(copy, run_id, PROCESS_STAGE)]


def _process_rows(copy: Path, run_id: str, stage: str) -> list[str]:
    conn = sqlite3.connect(f"file:{copy}?mode=ro", uri=True)
    try:
        return [str(d) for (d,) in conn.execute("SELECT detail FROM stages WHERE run_id = ? AND stage = ?",
                                                (run_id, stage)) if d]
    finally:
        conn.close()
