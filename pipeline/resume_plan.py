"""Planning a resume from the audit trail: which run, which image, which board, what is done.

Everything here reads the database only, before any run starts; any doubt is a Refusal.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from amdflash.pipeline.auditdb import open_reader
from amdflash.pipeline.checks import read_image
from amdflash.pipeline.errors import Refusal
from amdflash.stages.open_transport import BoardSpec
from amdflash.store.queries import (RunNotFound, finished_by, has_intents, latest_unfinished, report, resolve_run,
                                    run_chain, runs, unit_states, writes_since)

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


def plan_resume(db_path: str, spec: BoardSpec, run_id: str | None, image: Path | None) -> ResumePlan:
    db = open_reader(db_path)
    try:
        try:
            return _plan(db, spec, run_id, image)
        except RunNotFound as e:
            raise Refusal(str(e)) from None
    finally:
        db.conn.close()


def _plan(db: Any, spec: BoardSpec, wanted: str | None, image_override: Path | None) -> ResumePlan:
    if wanted:
        run_id = resolve_run(db, wanted)
    else:
        found = latest_unfinished(db, str(spec))
        if not found:
            raise Refusal(f"no unfinished flash run of {spec} to resume")
        run_id = found
    rep = report(db, run_id)
    if rep["command"] not in ("flash", "resume"):
        raise Refusal(f"run {run_id} is a {rep['command']} run; only flash runs can be resumed")
    if rep["status"] == "succeeded":
        raise Refusal(f"run {run_id} already succeeded; nothing to resume")
    done = finished_by(db, run_id)
    if done:
        raise Refusal(f"run {run_id} was already completed by resume run {done}; nothing to resume")
    arguments = rep["arguments"]
    recorded = arguments.get("image") or rep["image_path"]
    if image_override is None and not recorded:
        raise Refusal(f"run {run_id} recorded no image path; name it with --image")
    image_file = image_override or Path(recorded)
    try:
        image = read_image(image_file)
    except Refusal as e:
        if image_override is not None:
            raise
        raise Refusal(f"{e}; if the image has moved, name it: amdflash resume {run_id} --image FILE --yes") from None
    sha = hashlib.sha256(image).hexdigest()
    if sha != rep["image_sha256"]:
        raise Refusal(f"image {image_file} is not the image of run {run_id} "
                      f"(sha256 {sha[:16]}…, the run used {str(rep['image_sha256'])[:16]}…)")
    lineage = run_chain(db, run_id)
    verified: set[int] = set()
    for rid in lineage:
        verified |= {a for a, u in unit_states(db, rid).items() if u["state"] == "verified"}
    identity: dict[str, str] = {}
    for rid in lineage:
        b = report(db, rid)["board"]
        if b["unique_id"] or b["chip"]:
            identity = {"unique_id": b["unique_id"] or "", "jedec_chip": b["chip"] or "",
                        "bridge_serial": b["bridge_serial"] or ""}
            break
    if identity and identity["unique_id"] in BLANK_UIDS and str(spec) != rep["board"]["spec"]:
        # An unprogrammed unique ID tells no two boards apart: then only the same spec will do.
        raise Refusal(f"the flash of run {run_id} has no usable unique ID ({identity['unique_id']}); "
                      f"resume it with the same --board {rep['board']['spec']}")
    if identity:
        if identity["unique_id"]:
            later = writes_since(db, lineage[0], identity["unique_id"], lineage)
        else:   # a part without a readable unique ID: the board is known by its spec alone
            later = _spec_writes_since(db, lineage, rep["board"]["spec"])
        if later:
            raise Refusal(f"run {later[0]['run_id']} ({later[0]['command']}) wrote this board after run "
                          f"{run_id} began; resuming would overwrite it — start a new flash instead")
    else:
        if any(has_intents(db, rid) for rid in lineage):
            raise Refusal(f"run {run_id} began writing but recorded no board identity; refusing to guess")
        if str(spec) != rep["board"]["spec"]:
            raise Refusal(f"run {run_id} died before identifying its board; resume it with the same "
                          f"--board {rep['board']['spec']}")
    return ResumePlan(run_id, arguments, image, str(image_file.resolve()), frozenset(verified), identity,
                      tuple(lineage))


def _spec_writes_since(db: Any, lineage: list[str], spec: str) -> list[dict[str, Any]]:
    """Write runs on the board spec after the lineage's first run, other than the lineage's."""
    all_runs = runs(db)
    first = next(i for i, r in enumerate(all_runs) if r["run_id"] == lineage[0])
    return [r for r in all_runs[first + 1:] if r["board_spec"] == spec and r["run_id"] not in lineage
            and r["command"] in ("flash", "resume", "ifwi-all")]
