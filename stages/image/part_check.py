"""Before a write: is the image for this board? The VBIOS part numbers of both, compared.

The image's part number is the one fwupd checks (ISH_A → partition A → its ATOM image); the
board's is read the same way from what the board holds now, and both are compared on their
first ten characters, as fwupd compares them. The outcome:

* same part → write;
* different part → refuse, unless --force (then written, and on record as forced);
* the board's flash blank (erased) or unreadable as an IFWI — the bricked board this tool
  exists to recover — → refuse unless --expect-part NUMBER matches the image (the operator
  vouches for the board), or --force; on record as which;
* the image's own part number unreadable → refuse unless --force.

Every decision, refusals included, is one `stages` row (stage "part_number") whose detail
is a JSON object with both part numbers, the board's state and the outcome.
"""
from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, replace
from typing import Any

from amdflash.stages.drivers.flash.geometry import FLASH_SIZE
from amdflash.stages.image.atom import BytesSource, Source, UnitSource, part_key, same_part
from amdflash.stages.image.partitions import EFS_BYTES, LayoutError, read_layout

STAGE = "part_number"


@dataclass(frozen=True)
class PartPolicy:
    force: bool = False
    expect_part: str | None = None


@dataclass(frozen=True)
class BoardPart:
    state: str                   # found | blank | unreadable
    part_number: str | None = None
    detail: str = ""             # where it was found, or why it could not be
    version: str | None = None


@dataclass(frozen=True)
class PartDecision:
    image_part: str | None
    board: BoardPart
    outcome: str                 # same | forced | expected | refused
    reason: str
    policy: PartPolicy
    image_version: str | None = None     # the image's VBIOS version: the board's after a flash that succeeds

    @property
    def refusal(self) -> str | None:
        return self.reason if self.outcome == "refused" else None

    def as_json(self) -> dict[str, Any]:
        return {"image_part": self.image_part, "board_part": self.board.part_number, "board_state": self.board.state,
                "board_detail": self.board.detail, "board_version": self.board.version, "outcome": self.outcome,
                "reason": self.reason, "force": self.policy.force, "expect_part": self.policy.expect_part,
                **({"image_version": self.image_version} if self.image_version else {})}


def image_part(image: bytes) -> tuple[str | None, str | None]:
    """(part number, None) of the image, or (None, why not)."""
    try:
        return read_layout(BytesSource(image)).image_vbios().part_number, None
    except LayoutError as e:
        return None, str(e)


def image_version(image: bytes) -> str | None:
    """The image's VBIOS version (after "ATOMBIOSBK-AMD VER"), or None where it cannot be read."""
    try:
        return read_layout(BytesSource(image)).image_vbios().version
    except LayoutError:
        return None


def flash_part(src: Source) -> BoardPart:
    """The part number a flash holds: partition A's, else partition B's (said so)."""
    head = src.read(0, EFS_BYTES)
    if head and head == b"\xff" * len(head):
        return BoardPart("blank", detail="the EFS reads all FF, as erased")
    try:
        layout = read_layout(src)
    except LayoutError as e:
        return BoardPart("unreadable", detail=str(e))
    try:
        atom = layout.image_vbios()
        return BoardPart("found", atom.part_number, "partition A", atom.version)
    except LayoutError as e:
        b = layout.slot("ISH_B")
        if b is not None and b.atom is not None:
            # Said plainly: which partition answered, and why not the first one asked.
            return BoardPart("found", b.atom.part_number, f"partition B, as partition A cannot be read: {e}",
                             b.atom.version)
        return BoardPart("unreadable", detail=str(e))


def decide(image: str | None, image_problem: str | None, board: BoardPart, policy: PartPolicy) -> PartDecision:
    def out(outcome: str, reason: str) -> PartDecision:
        return PartDecision(image, board, outcome, reason, policy)

    if image is None:
        if policy.force:
            return out("forced", f"the image's part number is unknown ({image_problem}); written anyway (--force)")
        return out("refused", f"the image's VBIOS part number cannot be read ({image_problem}), so amdflash "
                              "cannot tell which board it is for; pass --force to write it anyway")
    if policy.expect_part is not None and not same_part(policy.expect_part, image):
        return out("refused", f"--expect-part {policy.expect_part} does not match the image, which is for part "
                              f"{image} (compared on the first ten characters, {part_key(image)!r})")
    if board.state == "found":
        assert board.part_number is not None
        if same_part(board.part_number, image):
            return out("same", f"image part {image} matches the board's {board.part_number} ({board.detail})")
        if policy.force:
            return out("forced", f"image part {image} differs from the board's {board.part_number}; "
                                 "written anyway (--force)")
        return out("refused", f"the image is for part {image} but the board holds part {board.part_number} "
                              f"({board.detail}; compared on the first ten characters, as fwupd does); "
                              "pass --force to write it anyway")
    # One fact per clause: what the flash holds, why, and what to do (an operator reads it at 3 a.m.).
    what = f"the board's flash is {board.state}: {board.detail}"
    if policy.expect_part is not None:
        return out("expected", f"{what}. --expect-part {policy.expect_part} matches the image's part {image}")
    if policy.force:
        return out("forced", f"{what}. The image's part {image} was written anyway (--force)")
    return out("refused", f"{what}. The image is for part {image}; amdflash cannot confirm this board is one. "
                          f"If it is, pass --expect-part {part_key(image)}, or --force")


def record(recorder, decision: PartDecision) -> None:
    recorder.add("stages", stage=STAGE, event="refuse" if decision.refusal else "end",
                 detail=json.dumps(decision.as_json(), sort_keys=True),
                 at=dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"))


def summary(decision: PartDecision) -> str:
    return f"part number check: {decision.outcome} — {decision.reason}"


def check_flash(dev, image: bytes, policy: PartPolicy) -> PartDecision:
    """The ROM_SW path: read just the regions the walk needs from the board's flash (through
    the engine already open), decide, record; the caller refuses when told to."""
    assert dev.nor is not None
    part, problem = image_part(image)
    board = flash_part(UnitSource(dev.nor.read, FLASH_SIZE))
    decision = replace(decide(part, problem, board, policy), image_version=image_version(image))
    record(dev.recorder, decision)
    if not decision.refusal:
        dev.notes.append(summary(decision))
    return decision
