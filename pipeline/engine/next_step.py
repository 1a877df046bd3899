"""What a run that did not succeed left on the board, and what to do next, in words.

An operator whose flash failed at 3 a.m. needs two things beside the error: the state the
flash is in (untouched, or which units are half written) and the command that gets the board
back — the backup to put back, or the resume that finishes the job. Both come from the run
as recorded (its units' last states, its backup), never from what the process believes.
"""
from __future__ import annotations

import hashlib
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WRITES = ("flash", "resume")
READS = ("info", "read", "dump", "verify", "probe")

# The documented shapes of what a printed command may carry from the trail, a board, a file
# or the network (a run id, a board spec, a path): anything else is not offered as a command.
RUN_ID = re.compile(r"[0-9]{8}T[0-9]{6}-[0-9a-f]{8}")
SPEC = re.compile(r"(auto|usb|pci|amdgpu)(:[0-9A-Za-z.:]{1,32})?|sim:/.+", re.DOTALL)
# Options whose value is the next word, and the shape each value must have.
VALUES: dict[str, re.Pattern[str] | None] = {
    "--board": SPEC, "--run": RUN_ID, "--start-sector": re.compile(r"[0-9]+"),
    "--sector-count": re.compile(r"[0-9]+"), "--image": None, "-o": None,
}


class NotOffered(ValueError):
    """A value that does not have its documented shape: no command is printed with it."""


@dataclass(frozen=True)
class Advice:
    """The places every command suggested to the operator names: the audit database and the
    config file of the command line (or API session) that suggests it, when they are not the
    defaults, as absolute paths, so that a command pasted into any shell, from any directory,
    reaches the same trail with the same settings. Built once where a command line's global
    options are parsed (cli/main.py) or a session is made (commands/board.py Session), and
    passed down as a value: two command lines in one process (the demo runs one inside
    another) each name their own places."""

    db: str | None = None
    config: str | None = None

    def __post_init__(self) -> None:
        for name in ("db", "config"):
            value = getattr(self, name)
            if value:
                object.__setattr__(self, name, os.path.abspath(value))

    def command(self, *words: str, args: tuple[str, ...] | list[str] = ()) -> str:
        """`amdflash [--db X] [--config Y] WORDS… -- ARGS…`, each word shell-quoted: a line to paste.

        WORDS are the command and its options, each option's value right after it; ARGS its
        positionals, after `--`, so that no value from the trail is ever read as an option when
        pasted (a run INSERTed as `--config=/x/c.toml` would move the key its runs are checked
        against). A run id, board spec or path of another shape is not offered: the words say so
        instead (`checked`)."""
        try:
            checked(words, args)
        except NotOffered as e:
            return f"(no command offered: {e})"
        places = [word for option, path in (("--db", self.db), ("--config", self.config)) if path
                  for word in (option, path)]
        return shlex.join(["amdflash", *places, *words, *(["--", *args] if args else [])])


# The commands of words that name no place of a command line (a run of another host, told
# from the central record: its --db and --config are that host's, not the reader's).
BARE = Advice()


def command(*words: str, args: tuple[str, ...] | list[str] = ()) -> str:
    """A command naming no database or config file (BARE): see Advice.command."""
    return BARE.command(*words, args=args)


def checked(words: tuple[str, ...], args: tuple[str, ...] | list[str]) -> None:
    """Every value in WORDS and ARGS has its documented shape (NotOffered names one that has not)."""
    for option, value in zip(words, words[1:]):
        shape = VALUES.get(option)
        if option in VALUES and (value.startswith("-") or (shape is not None and not shape.fullmatch(value))):
            raise NotOffered(f"{option} {shown(value)} is not of the form {option} takes")
    verb = words[0] if words else ""
    for value in args:
        if verb in ("resume", "report") and not RUN_ID.fullmatch(value):
            raise NotOffered(f"run id {shown(value)} is not of amdflash's form YYYYMMDDTHHMMSS-xxxxxxxx")
        if verb not in ("resume", "report") and not value.startswith("/") and value not in ("FILE", "DIR"):
            raise NotOffered(f"{shown(value)} is not an absolute path")


def shown(value: str) -> str:
    """A value as printed in a refusal: one line, controls escaped."""
    return repr(value)[1:-1] if not value.isprintable() else value


def plural(n: int, word: str, many: str | None = None) -> str:
    """'1 unit', '2 units'."""
    return f"{n} {word if n == 1 else many or word + 's'}"


def _units(report: dict[str, Any]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for unit in report.get("units") or ():
        counts[unit["state"]] = counts.get(unit["state"], 0) + 1
    return counts


def _cmp_cleared(report: dict[str, Any]) -> bool:
    """Whether the run wrote the status register (a CMP clear is on record before it is sent)."""
    return any(row.get("stage") == "clear_cmp" for row in report.get("stages") or ())


def _through_the_driver(report: dict[str, Any]) -> bool:
    """Whether the run handed the image to the amdgpu driver (psp_vbflash: no units recorded)."""
    return any(row.get("stage") == "psp_vbflash" for row in report.get("stages") or ())


def changed(report: dict[str, Any]) -> bool:
    """Whether a flash or resume run changed the flash, by its units' recorded states: a unit's
    intent is on record before its erase begins, so a unit erased even in part counts, as does
    one written and verified since (only a unit found already equal is verified unwritten), a
    status-register write and a flash handed to the amdgpu driver (which records no units).
    What store.queries.changed_nothing decides from the sealed rows."""
    written = any(u["state"] != "planned" and not (u["state"] == "verified" and u.get("action") == "skip")
                  for u in report.get("units") or ())
    return written or _cmp_cleared(report) or _through_the_driver(report)


def flash_state(report: dict[str, Any]) -> str:
    """The flash after a flash or resume run, by its units' last recorded states."""
    n = _units(report)
    erased = n.get("intent", 0) + n.get("erased", 0)
    programmed, failed = n.get("programmed", 0), n.get("failed", 0)
    if not (erased or programmed or failed):
        verified = n.get("verified", 0)
        said = (f"the flash holds the image in {plural(verified, 'unit')} verified so far; the rest is as it was"
                if verified else "the flash was not changed")
        return said + (" (but SR2.CMP was cleared)" if _cmp_cleared(report) else "")
    parts = []
    if erased:
        parts.append(f"{plural(erased, 'unit')} erased (or about to be) and not programmed")
    if programmed:
        parts.append(f"{plural(programmed, 'unit')} programmed and not verified")
    if failed:
        parts.append(f"{plural(failed, 'unit')} failed verify")
    return "the flash is partly written: " + ", ".join(parts)


def advice(report: dict[str, Any], backup: str | None, made_by: str | None = None, put_back: str | None = None, *,
           run_id: str, spec: str, say: Advice) -> str | None:
    """The next step after a run that did not succeed (None when there is nothing to add).
    `backup`: the board's original content, made by run `made_by`, written back by `put_back`.
    A report that already tells its run's end (commands.run_end: `outcome`, worked out from the
    flash as the run's whole lineage left it) is taken at its word: the command line and the
    report say the same step. `say`: the places its commands name."""
    command = say.command
    end = report.get("outcome")
    if isinstance(end, dict) and "next_step" in end:
        return end["next_step"]
    status, ran = report.get("status"), report.get("command")
    if status in (None, "succeeded", "refused"):
        return None        # a refusal wrote nothing and says why; success needs no advice
    resume = command("resume", "--board", spec, "--yes", args=[run_id])
    if ran in WRITES:
        state = flash_state(report)
        back = put_back or (command('flash', '--board', spec, '--yes', '--force', '--start-over', args=[backup])
                            if backup else None)
        if status == "interrupted":
            if not changed(report):
                # Not unfinished: a new flash of the board is not refused over it (store.originals).
                return f"{state}: nothing to finish; to write the image, run the same command again"
            undo = f"; or put back the original content, backup {backup} (run {made_by or run_id}): {back}" \
                if backup else ""
            return f"{state}. To finish the flash: {resume}{undo}"
        if not changed(report):
            return f"{state}. Fix the cause, then finish the flash: {resume}"
        original = (f"The original content is backup {backup} (run {made_by or run_id}): to put it back, {back}"
                    if backup else "No backup of the original content is on record")
        return f"{state}. {original}; or fix the cause and finish the flash: {resume}"
    if ran == "hardware-report":
        left = scratch_left(report)
        if left:
            return scratch_advice(*next(iter(left.items())), spec, say=say)
    if ran == "ifwi-all":
        return ("the PSP bootloader may hold a partial stream: power the board off and on (all rails) before "
                f"the next command (an emulated board: {command('sim', 'power-cycle', args=[sim_dir(spec)])})")
    if ran == "verify" and status == "failed" and (report.get("verifies") or {}).get("failed"):
        image = (report.get("arguments") or {}).get("image") or report.get("image_path")
        if image:       # the board read fine and holds something else: writing the image is the way
            return (f"the flash was not changed (verify only reads it), and it differs from the image; to write "
                    f"the image: {command('flash', '--board', spec, '--yes', args=[str(image)])}")
    if ran in READS:
        again = "run the command again" if status == "interrupted" else "fix the cause, then run the command again"
        return f"the flash was not changed ({ran} only reads it); {again}"
    return None


def sim_dir(spec: str) -> str:
    """An emulated board's directory from its spec (sim:DIR), else a placeholder to fill in."""
    return spec[len("sim:"):] if spec.startswith("sim:") else "DIR"


def scratch_left(report: dict[str, Any]) -> dict[int, tuple[str, str]]:
    """The scratch blocks of a hardware-report run that were backed up and then not put back
    (the run died or failed while one was erased or being programmed): block → (backup image,
    its sha256)."""
    backed: dict[int, tuple[str, str]] = {}
    for row in report.get("stages") or ():
        if row.get("stage") != "measure" or row.get("event") != "scratch":
            continue
        detail = str(row.get("detail") or "")
        found = re.fullmatch(r"block (0x[0-9a-f]{6}) sha256 ([0-9a-f]{64}) backed up to (/.+)", detail, re.DOTALL)
        if found:
            backed[int(found.group(1), 16)] = (found.group(3), found.group(2))
        elif re.match(r"block (0x[0-9a-f]{6}) restored", detail):
            backed.pop(int(detail.split()[1], 16), None)
    return backed


def scratch_advice(block: int, backup: tuple[str, str], spec: str, *, say: Advice) -> str:
    """What to do about a scratch block left torn: the command that writes its backup back, once
    the backup is checked to be the very file the run wrote (its sha256 in the trail)."""
    path, sha256 = backup
    where = f"the scratch block {block:#08x}-{block + 0xFFFF:#08x} may be partly erased"
    try:
        found = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        found = None
    if found != sha256:
        return (f"{where}, and its backup {path} is {'gone' if found is None else 'not the file the run wrote'} "
                "(sha256 differs): its content is on no file amdflash knows of")
    # Quoted: the report's name (and so the backup's) is whatever the user chose.
    put_back = say.command("flash", "--start-sector", str(block // 0x1000), "--sector-count", "16",
                       "--board", spec, "--yes", "--force", args=[path])
    return (f"{where}: its content is in {path} (a whole-flash image holding only that block, sha256 checked); "
            f"to put it back: {put_back}")
