"""Planning a resume from the audit trail: which run, which image, which board, what is done.

Everything here reads the database only, before any run starts; any doubt is a Refusal.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from amdflash.pipeline.engine.auditdb import open_reader
from amdflash.pipeline.commands.checks import read_image
from amdflash.pipeline.errors import Refusal
from amdflash.pipeline.engine.jobs import place
from amdflash.pipeline.engine.next_step import Advice
from amdflash.stages.open_transport import BoardSpec
from amdflash.store.queries import (RunNotFound, has_intents, latest_unfinished, newest_resume, report, resolve_run,
                                    run_chain, runs, unit_states, unvouched, writes_since, wrote_nothing)
from amdflash.store.run_rows import RunRows
from amdflash.store.verify import snapshot

BLANK_UIDS = ("f" * 32, "0" * 32, "")      # "": a part with no unique ID amdflash can read


@dataclass(frozen=True)
class ResumePlan:
    run_id: str                          # the run being resumed (the newest of its lineage)
    arguments: dict[str, Any]            # the original flash's arguments
    image: bytes
    image_path: str
    verified: frozenset[int] = frozenset()               # units some run of the lineage verified
    identity: dict[str, str] = field(default_factory=dict)   # unique_id, jedec_chip, bridge_serial
    lineage: tuple[str, ...] = ()        # the runs from the original flash to this one (the first backup is theirs)


def plan_resume(db_path: str, spec: BoardSpec, run_id: str | None, image: Path | None, say: Advice) -> ResumePlan:
    """The resume of `run_id` (else the board's newest unfinished flash); `say`: the places the
    commands its refusals suggest name."""
    db = open_reader(db_path)
    try:
        try:
            with snapshot(db.conn):
                return _plan(db, spec, run_id, image, say)
        except RunNotFound as e:
            raise Refusal(str(e)) from None
    finally:
        db.conn.close()


def _plan(db: Any, spec: BoardSpec, wanted: str | None, image_override: Path | None, say: Advice) -> ResumePlan:
    if wanted:
        # The run named, or the newest resume of it: a run whose resume was interrupted too is
        # finished from where that resume stopped (its report names the run, as it was then).
        run_id = newest_resume(db, resolve_run(db, wanted))
    else:
        found = latest_unfinished(db, str(spec))
        if not found:
            raise Refusal(f"no unfinished flash run of {spec} to resume")
        run_id = found
    # Every run of the lineage must verify (RunUnverified, exit 1, names what does not match):
    # what the resume skips, which board it accepts and which backup it keeps come from them.
    lineage = run_chain(db, run_id)
    unsealed = next((r for r in lineage if r.sealed is None), None)
    if unsealed is not None:
        # Its runs row (image, arguments, board) is vouched for by no checkpoint. Nor did it write
        # anything: every erase, program and status write is sealed before it reaches the board.
        raise Refusal(f"run {unsealed.run_id} has no sealed rows: nothing it recorded is verified, and it wrote "
                      "nothing to the flash; start a new flash instead")
    rep = report(db, run_id)
    if rep["command"] not in ("flash", "resume"):
        raise Refusal(f"run {run_id} is a {rep['command']} run; only flash runs can be resumed")
    if rep["status"] == "succeeded":
        raise Refusal(f"run {run_id} already succeeded; nothing to resume")
    done = rep["finished_by"]
    if done:
        raise Refusal(f"run {run_id} was already completed by resume run {done}; nothing to resume")
    arguments = rep["arguments"]
    recorded = arguments.get("image") or rep["image_path"]
    if image_override is None and not recorded:
        raise Refusal(f"run {run_id} recorded no image path; name it with --image")
    image_file = image_override or Path(recorded)
    try:
        # A range flash may have written a range's own bytes (a backup put back): placed as it did.
        start = int(arguments.get("start_sector") or 0)
        image = place(read_image(image_file, range_size=int(arguments.get("sector_count") or 512) * 0x1000), start)
    except Refusal as e:
        if image_override is not None:
            raise
        again = say.command("resume", "--board", str(spec), "--image", "FILE", "--yes", args=[run_id])
        raise Refusal(f"{e}; if the image has moved, name it: {again}") from None
    sha = hashlib.sha256(image).hexdigest()
    if sha != rep["image_sha256"]:
        raise Refusal(f"image {image_file} is not the image of run {run_id} "
                      f"(sha256 {sha[:16]}…, the run used {str(rep['image_sha256'])[:16]}…)")
    # Units a run verified are skipped only if a checkpoint seals that: a row in an unsealed
    # tail (a host that died with its writer) vouches for nothing, so its unit is redone.
    verified: set[int] = set()
    for rows in lineage:
        verified |= {a for a, u in unit_states(db, rows, sealed_only=True).items() if u["state"] == "verified"}
    identity: dict[str, str] = {}
    for rows in lineage:
        b = _board(db, rows)
        if b.get("unique_id") or b.get("chip"):
            identity = {"unique_id": b["unique_id"] or "", "jedec_chip": b["chip"] or "",
                        "bridge_serial": b["bridge_serial"] or ""}
            break
    if identity and identity["unique_id"] in BLANK_UIDS and str(spec) != rep["board"]["spec"]:
        # An unprogrammed unique ID tells no two boards apart: then only the same spec will do.
        raise Refusal(f"the flash of run {run_id} has no usable unique ID ({identity['unique_id']}); "
                      f"resume it with the same --board {rep['board']['spec']}")
    ids = [r.run_id for r in lineage]
    if identity:
        if identity["unique_id"]:
            later = writes_since(db, lineage[0], identity["unique_id"], ids)
        else:   # a part without a readable unique ID: the board is known by its spec alone
            later = _spec_writes_since(db, ids, rep["board"]["spec"])
        refused = {r["run_id"] for r in runs(db) if r["status"] == "refused"}
        # A refused run wrote nothing — when its own sealed rows say so: a `refused` status
        # INSERTed for a run that wrote (no key needed) must not hide it.
        later = [r for r in later if not (r["run_id"] in refused and unvouched(db, r["run_id"]) is None)]
        why = unvouched(db, later[0]["run_id"]) if later else None
        if why:
            # Still refused (it may have written), but not called a write the trail vouches for.
            other = later[0]["run_id"]
            check = f" (check it: {say.command('audit', 'verify', '--run', other)})" if isinstance(other, str) else ""
            raise Refusal(f"run {other!s} ({later[0]['command']!s}) is on record as writing this board after run "
                          f"{run_id} began, but {why}{check}; resuming could overwrite what it may have written "
                          "— start a new flash instead")
        if later:
            raise Refusal(f"run {later[0]['run_id']} ({later[0]['command']}) wrote this board after run "
                          f"{run_id} began; resuming would overwrite it — start a new flash instead")
    else:
        if any(has_intents(db, rows) for rows in lineage):
            raise Refusal(f"run {run_id} began writing but recorded no board identity; refusing to guess")
        if str(spec) != rep["board"]["spec"]:
            raise Refusal(f"run {run_id} died before identifying its board; resume it with the same "
                          f"--board {rep['board']['spec']}")
    return ResumePlan(run_id, arguments, image, str(image_file.resolve()), frozenset(verified), identity,
                      tuple(ids))


def _board(db: Any, rows: RunRows) -> dict[str, Any]:
    """The run's identified board, as its sealed rows record it (the last row naming a chip)."""
    boards = list(db.query(f"SELECT unique_id, chip, bridge_serial FROM boards WHERE {rows.sealed_sql} ORDER BY seq",
                           rows.sealed_args))
    return next((b for b in reversed(boards) if b.get("chip")), boards[0] if boards else {})


def _spec_writes_since(db: Any, lineage: list[str], spec: str) -> list[dict[str, Any]]:
    """Write runs on the board spec after the lineage's first run, other than the lineage's."""
    all_runs = runs(db)
    first = next(i for i, r in enumerate(all_runs) if r["run_id"] == lineage[0])
    return [r for r in all_runs[first + 1:] if r["board_spec"] == spec and r["run_id"] not in lineage
            and r["command"] in ("flash", "resume", "ifwi-all") and not wrote_nothing(db, r["run_id"])]
