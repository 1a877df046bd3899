"""`amdflash report --format html`: one self-contained page per run, for forensic review.

The page carries everything inline — CSS in a <style> element, graphics as plain HTML
blocks — and fetches nothing (no scripts, fonts, images or links out), so it can be
archived with a compliance record and opened years later on an offline machine. Every
recorded value is escaped: board strings, paths and error texts come from the field. Beyond
markup, a browser would obey a bidi override (U+202E shows the rest of a name reversed) or hide
a zero-width or control character: those are shown as escapes (`\\u202e`), as on a terminal.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import json
import re
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlite_utils
from amdflash.stages.drivers.flash import protection as prot
from amdflash.stages.drivers.navi31 import regs as R
from amdflash.store.queries import RunNotFound, RunReport, run_chain, transactions_between, unit_states
from amdflash.store.run_rows import RunRows, RunUnverified
from amdflash.store.status import PROCESS_STAGE
from amdflash.stages.drivers.flash.geometry import FLASH_SIZE, UNIT
from amdflash.stages.terminal import for_html as escape


CELLS_PER_ROW = 32            # two 64 KiB blocks per row: 16 rows for the 2 MiB
BLOCK_CELLS = 16
TRANSACTIONS_BEFORE_ERROR = 32

# Map categories: (css class, legend text). Written units are drawn solid once verified
# and hatched when touched but not verified (class "unverified"), so "verified" reads
# across the three actions; a unit only planned was never touched.
CATEGORIES = (
    ("skip", "skipped — already equal"),
    ("earlier", "written by an earlier run of this flash, found equal"),
    ("program", "programmed without erase, verified"),
    ("erase", "erased + programmed, verified"),
    ("failed", "verify failed"),
    ("planned", "planned (its action decided), never touched"),
    ("unreached", "in the run's range, never planned (the run stopped first)"),
    ("protected", "protected (block protection)"),
    ("none", "outside the run's range"),
)
_ACTION_CLASS = {"skip": "skip", "program": "program", "erase+program": "erase"}

REGISTER_NAMES = {getattr(R, name): name for name in (
    "ROM_CNTL", "PAGE_MIRROR_CNTL", "ROM_STATUS", "ROM_INDEX", "ROM_DATA", "ROM_START",
    "ROM_SW_CNTL", "ROM_SW_STATUS", "ROM_SW_COMMAND", "GPIOPAD_MASK", "GPIOPAD_A", "GPIOPAD_EN",
    "MP0_C2PMSG_73", "MP0_C2PMSG_115", "MP0_C2PMSG_116")}

# SPI NOR opcodes as the datasheets name them (GD25LQ16E, docs/flash-chip.md).
OPCODES = {
    0x01: "WRSR", 0x02: "PP", 0x03: "READ", 0x04: "WRDI", 0x05: "RDSR1", 0x06: "WREN", 0x0B: "FAST_READ",
    0x11: "WRSR3", 0x15: "RDSR3", 0x20: "SE 4K", 0x31: "WRSR2", 0x35: "RDSR2", 0x4B: "RDUID", 0x50: "VWREN",
    0x52: "BE 32K", 0x5A: "RDSFDP", 0x60: "CE", 0x66: "RSTEN", 0x75: "SUSPEND", 0x7A: "RESUME",
    0x99: "RST", 0x9F: "RDID", 0xAB: "RDP", 0xB9: "DP", 0xC7: "CE", 0xD8: "BE 64K",
}


def render(db: sqlite_utils.Database, rep: RunReport, beside: Path | None = None) -> str:
    """The page of one run, from its report (store.queries.report, which verified the run and
    read it through its verified rows: so does this page). `beside`: the directory the page is
    written into; other runs are linked only to their pages there."""
    run_id, rows = rep["run_id"], rep.rows
    body = [
        _header(rep),
        _unverified(rep),
        _identity(rep, beside),
        _outcome(rep.get("outcome"), beside),
        _sector_map(rep, unit_states(db, rows), _earlier(db, rep)),
        _timeline(rep),
        _every_fact(rep),
        _facts(rep),
        _verifies(rep),
        _first_error(db, rep, rows),
        _chain(rep["chain"]),
    ]
    return (f"<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>amdflash run {escape(run_id)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
            + "\n".join(body)
            + f"\n<footer>amdflash {escape(str(rep.get('tool_version') or ''))} report · generated "
              f"{escape(_now())} from the audit trail · self-contained: nothing is fetched</footer>\n"
              "</body>\n</html>\n")


# -- identity ---------------------------------------------------------------------------------

def _header(rep: dict[str, Any]) -> str:
    status = str(rep["status"])
    return (f"<header><h1>Run <span class=\"mono\">{escape(rep['run_id'])}</span></h1>"
            f"<span class=\"badge {escape(_status_class(status))}\" data-field=\"status-badge\">"
            f"{escape(status)}</span>{_emulated_badge(rep)}{_legacy_badge(rep)} "
            f"<span class=\"muted\">{escape(str(rep['command']))}</span>"
            "</header>")


def clock_words(state: str | None) -> str | None:
    """The host clock's state, and what it means for this record's timestamps (said here once)."""
    if state and state.startswith("unsynchronised"):
        return (f"{state}: no time source had set the host's clock when the run started, so the record's "
                "timestamps may be off from real time (their order within the run holds)")
    return state


def _legacy_badge(rep: dict[str, Any]) -> str:
    """Beside the status: a legacy run's status is what an unsigned file said (store.migrate)."""
    if not (rep.get("chain") or {}).get("legacy"):
        return ""
    return (" <span class=\"badge warn\" data-field=\"legacy-badge\" title=\"recorded by an older amdflash: "
            "nothing signs this run's rows\">legacy, unsigned</span>")


def _emulated_badge(rep: dict[str, Any]) -> str:
    if not rep.get("emulated"):
        return ""
    return " <span class=\"badge emulated\" data-field=\"emulated-badge\">emulated board</span>"


def _status_class(status: str) -> str:
    if "not verified" in status:      # a status no checkpoint that holds vouches for
        return "bad"
    return {"succeeded": "ok", "failed": "bad", "interrupted": "warn"}.get(status, "neutral")


def _identity(rep: dict[str, Any], beside: Path | None) -> str:
    b = rep["board"]
    srs = (f"SR1={b['sr1']:02x} SR2={b['sr2']:02x} SR3={b['sr3']:02x}"
           if None not in (b["sr1"], b["sr2"], b["sr3"]) else None)
    effective = _protection(rep)
    rows: list[tuple[str, str, Any]] = [
        ("run_id", "run", rep["run_id"]),
        ("command", "command", rep["command"]),
        ("status", "status", rep["status"]),
        ("started", "started", rep["started"]),
        ("ended", "ended", rep["ended"]),
        ("resumes_run_id", "resumed from", _run_link(rep["resumes_run_id"], beside)),
        ("resumed_by", "resumed by", _Html(", ".join(f"{_run_link(r['run_id'], beside)} ({escape(r['status'])})"
                                                     for r in rep.get("resumed_by") or [])) or None),
        ("finished_by", "fixed by", _run_link(rep.get("finished_by"), beside)),
        ("superseded_by", "superseded by", _run_link(rep.get("superseded_by"), beside)),
        ("operator", "operator (OS account)", rep["operator"]),
        ("operator_claimed", "operator (claimed, --operator)", rep.get("operator_claimed")),
        ("host", "host", rep["host"]),
        ("machine_id", "machine-id", rep.get("machine_id")),
        ("clock_sync", "system clock", clock_words(rep.get("clock_sync"))),
        ("tool_version", "amdflash version", rep["tool_version"]),
        ("tool_revision", "amdflash revision", rep.get("tool_revision")),
        ("emulated", "board", "emulated (a synthetic board, not hardware)" if rep.get("emulated") else
         "hardware" if rep.get("emulated") is False else None),
        ("board_spec", "board spec", b["spec"]),
        ("jedec", "JEDEC capture", b["jedec"]),
        ("chip", "chip", b["chip"]),
        ("unique_id", "flash unique ID", b["unique_id"]),
        ("bridge_serial", "bridge serial", b["bridge_serial"]),
        ("pci_address", "PCI address", b["pci_address"]),
        ("status_registers", "status registers", srs),
        ("protection", "protection as identified", b["protection"]),
        ("protection_effective", "protection during the run", effective.describe if effective else None),
        ("image_path", "image", rep["image_path"]),
        ("image_sha256", "image SHA-256", rep["image_sha256"]),
        ("result_sha256", "result SHA-256", rep["result_sha256"]),
        ("arguments", "arguments", _pairs(rep["arguments"]) if rep["arguments"] else None),
        ("register_writes", "register writes", rep["register_writes"]),
        ("spi_transactions", "SPI transactions", rep["spi_transactions"]),
        ("backups", "backup", "; ".join(f"{x['sha256']} {x['path']}" for x in rep["backups"]) or None),
        ("board_detail", "transport detail", _pairs(b["detail"]) if b.get("detail") else None),
        ("error", "error", rep["error"]),
        ("registers_put_back", "registers put back first", "; ".join(rep.get("registers_put_back") or ()) or None),
    ]
    cells = "".join(
        f"<tr><th>{escape(label)}</th><td data-field=\"{escape(key)}\"{_MONO_ATTR if key in _MONO else ''}>"
        f"{_value(value)}</td></tr>"
        for key, label, value in rows)
    return f"<section id=\"identity\"><h2>Run and board</h2><table class=\"kv\">{cells}</table></section>"


def _outcome(end: dict[str, Any] | None, beside: Path | None) -> str:
    """What a failed or interrupted run left, and the way out (pipeline.run_end): the words
    and commands its command line printed, each command on its own so that it can be copied."""
    if not end:
        return ""
    fixed = end.get("fixed_by")
    superseded = end.get("superseded_by")     # a later run wrote the board: no step of this run's is left
    backup, first = end.get("backup"), end.get("original")
    rows: list[tuple[str, str, Any]] = [
        ("flash_state", "state when the run ended" if fixed or superseded else "state", end.get("state")),
        ("backup", "backup", _backup_words(backup, backup["content"], beside) if backup else None),
        ("original", "the board's original", _backup_words(first, None, beside) if first else None),
        ("next_step", "next step", None if fixed or superseded else _words(end.get("next_step"))),
        ("fixed_by", "fixed by", _run_link(fixed, beside)),
        ("superseded_by", "superseded by", _run_link(superseded, beside)),
    ]
    cells = "".join(f"<tr><th>{escape(label)}</th><td data-field=\"{escape(key)}\"{_CMD if key == 'next_step' else ''}>"
                    f"{_value(value)}</td></tr>" for key, label, value in rows if value)
    return f"<section id=\"outcome\"><h2>What the run left, and the way out</h2><table class=\"kv\">{cells}</table>" \
           "</section>"


_CMD = ' class="cmd"'      # words with commands in them: wrapped only between words (CSS)


def _backup_words(backup: dict[str, Any], content: str | None, beside: Path | None = None) -> _Html:
    """A backup file, what it holds and the command that writes it back (its own element:
    data-field put-back, to copy as it is)."""
    what = f"{escape(content)}: " if content else ""
    return _Html(f"{what}<span class=\"mono\">{escape(backup['path'])}</span> (run "
                 f"{_run_link(backup['run_id'], beside)}); to put it back: "
                 f"<code data-field=\"put-back\" class=\"cmd mono\">{_words(backup['put_back'])}</code>")


def _words(text: str | None) -> _Html | None:
    """A command (or words around one) that wraps only between its words: each word kept on one
    line (a browser would also break after a '/' or a '-' of a path or an option), so what is
    read is what is pasted; a word too long for the line scrolls (CSS). The text copied is the
    text given: its words joined by the same single spaces."""
    if not text:
        return None
    return _Html(" ".join(f"<span class=\"w\">{escape(word)}</span>" if word else "" for word in text.split(" ")))


_MONO = {"run_id", "jedec", "unique_id", "bridge_serial", "status_registers", "image_sha256", "result_sha256",
         "backups", "arguments", "image_path", "board_spec", "machine_id", "tool_revision", "board_detail"}
_MONO_ATTR = ' class="mono"'


class _Html(str):
    """Markup made here, not recorded text: not escaped again."""


def _pairs(value: Any) -> _Html | str:
    """A recorded JSON object as a reviewer reads it: one "name: value" per line (nested
    objects inline); anything else as text."""
    if not isinstance(value, dict):
        return str(value)
    lines = [f"<em class=\"key\">{escape(str(key).replace('_', ' '))}</em> {escape(_plain(item))}"
             for key, item in value.items()]
    return _Html("<br>".join(lines))


def _plain(item: Any) -> str:
    """A JSON value in words: yes/no, lists joined, objects as "name value" pairs."""
    if item is None:
        return "—"
    if isinstance(item, bool):
        return "yes" if item else "no"
    if isinstance(item, list):
        return "; ".join(_plain(x) for x in item)
    if isinstance(item, dict):
        return ", ".join(f"{str(k).replace('_', ' ')} {_plain(v)}" for k, v in item.items())
    if isinstance(item, float):
        return _number(item)
    return str(item)


def _number(x: float) -> str:
    """A recorded float as people read it: to the thousandth (a duration to the ms), trailing
    zeros dropped; a tiny value keeps three significant digits (0.28800000000000003 -> 0.288)."""
    if x == 0 or abs(x) >= 0.001:
        return f"{x:.3f}".rstrip("0").rstrip(".")
    return f"{x:.3g}"


def _readable(detail: str | None) -> _Html | str:
    """A stage row's detail: a JSON object as name/value lines, other text as it is."""
    if detail and detail.startswith("{"):
        try:
            return _pairs(json.loads(detail))
        except ValueError:
            pass
    return detail or ""


def _value(value: Any) -> str:
    if value is None or value == "":
        return "<span class=\"muted\">—</span>"
    return value if isinstance(value, _Html) else escape(str(value))


# What amdflash's run ids look like (pipeline.runner: UTC time, then 8 hex digits). Only such
# a value becomes a link: the href is built here, never taken from the trail, so no scheme
# (javascript:, data:, http:) or path can reach the page through a recorded value.
RUN_ID = re.compile(r"[0-9]{8}T[0-9]{6}-[0-9a-f]{8}")


def _run_link(run_id: str | None, beside: Path | None) -> _Html | None:
    """Another run, linked to its report file by the name that
    `amdflash report RUN_ID --format html -o RUN_ID.html` gives — when the page is written
    into `beside`, only if that file is there (a link must lead somewhere), else its run id as
    text; a value that is not a run id is shown as escaped text, never linked (it is markup
    here: callers join it into other markup)."""
    if not run_id:
        return None
    if not isinstance(run_id, str) or not RUN_ID.fullmatch(run_id):     # a forged row may hold a BLOB
        return _Html(escape(str(run_id)))
    if beside is not None and run_id not in _TOGETHER.get() and not (beside / f"{run_id}.html").is_file():
        return _Html(f"<span class=\"mono run\">{run_id}</span>")
    return _Html(f"<a class=\"mono\" href=\"{run_id}.html\">{run_id}</a>")


# The pages being written together into one directory (`report --pages DIR`): each links to the
# others, though they are written one after the other.
_TOGETHER: ContextVar[frozenset[str]] = ContextVar("pages_written_together", default=frozenset())


@contextlib.contextmanager
def written_together(run_ids: Iterable[str]) -> Iterator[None]:
    """Render pages that are about to be written beside each other: their links to each other
    lead somewhere once they are all written."""
    token = _TOGETHER.set(frozenset(run_ids))
    try:
        yield
    finally:
        _TOGETHER.reset(token)


def related_runs(rep: dict[str, Any]) -> list[str]:
    """The other runs a run's page names (and links): the run it resumes, the resumes of it,
    the run that fixed or superseded it, the runs whose backups it names — run ids only (a
    recorded value of any other shape is shown, never followed)."""
    end = rep.get("outcome") or {}
    named = [rep.get("resumes_run_id"), *[r.get("run_id") for r in rep.get("resumed_by") or []],
             rep.get("finished_by"), rep.get("superseded_by"), end.get("fixed_by"), end.get("superseded_by"),
             *[(end.get(k) or {}).get("run_id") for k in ("backup", "original")]]
    found = [r for r in named if isinstance(r, str) and RUN_ID.fullmatch(r) and r != rep.get("run_id")]
    return list(dict.fromkeys(found))


@dataclass(frozen=True)
class _Range:
    start: int
    end: int
    describe: str

    def covers(self, address: int) -> bool:
        return self.start <= address < self.end


def _protection(rep: dict[str, Any]) -> _Range | None:
    """What the chip protected while the run wrote: as identified, less CMP if the run cleared it."""
    b = rep["board"]
    cleared = any(s["stage"] == "clear_cmp" and s["event"] == "end" for s in rep["stages"])
    if b["sr1"] is not None and b["sr2"] is not None:
        sr2 = b["sr2"] & ~prot.SR2_CMP if cleared else b["sr2"]
        p = prot.decode(b["sr1"], sr2, FLASH_SIZE)
        return _Range(p.start, p.end, p.describe() + (" (CMP cleared by this run)" if cleared else ""))
    m = re.search(r"(0x[0-9a-fA-F]+)-(0x[0-9a-fA-F]+) protected", b.get("protection") or "")
    if m and not cleared:
        return _Range(int(m[1], 16), int(m[2], 16) + 1, b["protection"])
    return None


# -- sector map -------------------------------------------------------------------------------

def _earlier(db: sqlite_utils.Database, rep: RunReport) -> dict[int, str]:
    """For a resume: the units the runs it continues wrote (erased or programmed), by address,
    with the run that last wrote each — so the map does not call their work "skipped"."""
    if rep["command"] != "resume" or not rep.get("resumes_run_id"):
        return {}
    written: dict[int, str] = {}
    try:
        chain = run_chain(db, rep["resumes_run_id"])
    except (RunUnverified, RunNotFound):
        return {}                  # the page says elsewhere that the earlier run does not verify
    for rows in chain:
        for u in unit_states(db, rows, sealed_only=True).values():
            if u["intended"] and u["action"] != "skip":
                for a in range(u["address"], u["address"] + (u["size"] or UNIT), UNIT):
                    written[a] = rows.run_id
    return written


def _cell(address: int, unit: dict[str, Any] | None, protected: _Range | None,
          in_range: bool, earlier: str | None = None) -> tuple[str, str]:
    """(css classes, tooltip) of the 4 KiB unit at `address` (`earlier`: the run of this
    flash's lineage that wrote it before this resume)."""
    span = f"{address:#08x}–{address + UNIT - 1:#08x}"
    if unit is None:
        if protected and protected.covers(address):
            return "protected", f"{span} · protected · not written"
        if in_range:
            return "unreached", f"{span} · in the run's range · the run never got to it"
        return "none", f"{span} · outside the run's range"
    action, state = unit["action"], unit["state"]
    detail = f" · {unit['detail']}" if unit.get("detail") else ""
    tip = f"{span} · {action} · {state}{detail}"
    if state == "failed":
        return "failed", tip
    category = _ACTION_CLASS.get(action, "none")
    if state == "verified":
        if category == "skip" and earlier:
            return "earlier", f"{tip} · written by run {earlier}"
        return category, tip
    if not unit.get("intended"):
        return "planned", tip + " · never touched"
    return f"{category} unverified", tip


def _run_range(rep: dict[str, Any]) -> range:
    """The units a flash (or resume) run was asked to write."""
    args = rep.get("arguments") or {}
    if rep["command"] not in ("flash", "resume") or "start_sector" not in args:
        return range(0)
    start = int(args["start_sector"]) * UNIT
    return range(start, start + int(args.get("sector_count") or FLASH_SIZE // UNIT) * UNIT, UNIT)


def _sector_map(rep: dict[str, Any], units: dict[int, dict[str, Any]], earlier: dict[int, str]) -> str:
    protected = _protection(rep)
    in_range = _run_range(rep)
    by_cell: dict[int, dict[str, Any]] = {}
    for u in units.values():
        for a in range(u["address"], u["address"] + (u["size"] or UNIT), UNIT):
            by_cell[a] = u
    counts: dict[str, int] = {}
    rows = []
    for row in range(0, FLASH_SIZE, CELLS_PER_ROW * UNIT):
        blocks = []
        for block in range(row, row + CELLS_PER_ROW * UNIT, BLOCK_CELLS * UNIT):
            cells = []
            for address in range(block, block + BLOCK_CELLS * UNIT, UNIT):
                classes, tip = _cell(address, by_cell.get(address), protected, address in in_range,
                                     earlier.get(address))
                counts[classes] = counts.get(classes, 0) + 1
                cells.append(f"<div class=\"cell {classes}\" data-address=\"{address:#08x}\" "
                             f"title=\"{escape(tip)}\"></div>")
            blocks.append(f"<div class=\"block\">{''.join(cells)}</div>")
        rows.append(f"<div class=\"maprow\"><span class=\"addr\">{row:#08x}</span>{''.join(blocks)}</div>")
    scope = (f"The run's range: {in_range[0]:#08x}–{in_range[-1] + UNIT - 1:#08x}." if in_range else
             "This run wrote no flash range.")
    return (f"<section id=\"sector-map\"><h2>Sector map</h2><p class=\"muted\">One cell per 4 KiB erase unit "
            f"(512 cells), 64 KiB blocks grouped; hover a cell for its address, action and state. {scope}</p>"
            f"{_legend(counts)}<div class=\"map\">{''.join(rows)}</div></section>")


def _legend(counts: dict[str, int]) -> str:
    items = [f"<li><span class=\"cell {c}\"></span>{escape(text)} <b>{counts.get(c, 0)}</b></li>"
             for c, text in CATEGORIES]
    unverified = sum(n for classes, n in counts.items() if "unverified" in classes.split())
    items.insert(4, f"<li><span class=\"cell erase unverified\"></span>hatched: touched (erased or programmed), "
                    f"not verified <b>{unverified}</b></li>")
    return f"<ul class=\"legend\">{''.join(items)}</ul>"


# -- stage timeline ---------------------------------------------------------------------------

@dataclass
class _Stage:
    name: str
    start: dt.datetime | None = None
    end: dt.datetime | None = None
    outcome: str = "no end recorded"
    detail: str = ""
    events: int = 0


# A stage's own last event -> its outcome. A stage that stopped because another failed says
# so ("cancelled"); one that stopped early at an operator's request says "stopped".
_OUTCOMES = {"end": "ended", "fail": "failed", "cancelled": "cancelled", "stop": "stopped early"}


def _timed(rows: list[dict[str, Any]]) -> set[str]:
    """Stages that ran for a time (they recorded a start): the timeline's rows. The others
    are facts recorded at a moment (a fast path's verdict, a decision, diagnostics)."""
    return {r["stage"] for r in rows if r["event"] == "start" and r["stage"] != PROCESS_STAGE}


def _stages(rows: Iterable[dict[str, Any]]) -> list[_Stage]:
    stages: dict[str, _Stage] = {}
    rows = list(rows)
    timed = _timed(rows)
    for r in rows:
        if r["stage"] not in timed:
            continue
        s = stages.setdefault(r["stage"], _Stage(r["stage"]))
        at = _time(r["at"])
        if r["event"] == "start":
            s.start = s.start or at
        elif r["event"] in _OUTCOMES:
            s.end, s.outcome = at or s.end, _OUTCOMES[r["event"]]
        else:
            s.events += 1
        if r["detail"] and r["event"] in ("start", *_OUTCOMES) and (r["event"] != "start" or not s.detail):
            s.detail = r["detail"]   # the end's detail says more than the start's
    return list(stages.values())


def _timeline(rep: dict[str, Any]) -> str:
    stages = _stages(rep["stages"])
    t0 = _time(rep["started"])
    known = [t for s in stages for t in (s.start, s.end) if t]
    t1 = _time(rep["ended"]) or (max(known) if known else None)
    if not stages or t0 is None or t1 is None:
        return "<section id=\"timeline\"><h2>Stage timeline</h2><p class=\"muted\">no stages recorded</p></section>"
    span = max((t1 - t0).total_seconds(), 1e-3)
    rows = "".join(_stage_row(s, t0, span) for s in stages)
    if rep["ended"]:
        scale = f"the run took {span:.3f} s"
    else:
        scale = (f"the run recorded no end, so the axis stops at its last timestamp on record ({span:.3f} s) and "
                 f"stages without an end run off its right edge")
    return (f"<section id=\"timeline\"><h2>Stage timeline</h2><p class=\"muted\">Seconds from the start of the "
            f"run ({escape(rep['started'])}); {scale}. Backup, plan, erase, program and verify run as one pipeline, "
            f"so their bars overlap.</p><table class=\"stages\"><thead><tr><th>stage</th><th>start</th><th>end</th>"
            f"<th>duration</th><th>outcome</th><th class=\"trackhead\">0 s → {span:.3f} s</th><th>detail</th></tr>"
            f"</thead><tbody>{rows}</tbody></table></section>")


def _stage_row(s: _Stage, t0: dt.datetime, span: float) -> str:
    start = (s.start or t0) - t0
    left = min(100 * start.total_seconds() / span, 99.6)
    if s.end:
        width = max(100 * ((s.end - t0) - start).total_seconds() / span, 0.4)
        end, duration = _seconds(s.end - t0), _seconds(s.end - t0 - start)
    else:
        width, end, duration = 100.0, "—", "—"    # open: drawn to the edge of the axis
    kind = {"ended": "ok", "failed": "bad", "cancelled": "cancelled", "stopped early": "stopped"}.get(s.outcome, "open")
    extra = f" · {s.events} event{'' if s.events == 1 else 's'}" if s.events else ""
    return (f"<tr data-stage=\"{escape(s.name)}\"><th>{escape(s.name)}</th><td class=\"num\">{_seconds(start)}</td>"
            f"<td class=\"num\">{end}</td><td class=\"num\">{duration}</td><td class=\"{kind}\">{escape(s.outcome)}"
            f"</td><td class=\"track\"><div class=\"bar {kind}\" style=\"left:{left:.2f}%;"
            f"width:{min(width, 100 - left):.2f}%\"></div></td>"
            f"<td class=\"detail\">{_value(_readable(s.detail)) if s.detail else ''}{escape(extra)}</td></tr>")


def _every_fact(rep: dict[str, Any]) -> str:
    """The facts store.facts found, in the words the text report prints (the JSON's facts.words):
    registers before, after restore and left changed; overrides; image and backup; VBIOS part;
    unit times; how the run ended; a verify failure's diagnosis; the database read."""
    said = (rep.get("facts") or {}).get("words") or ()
    if not said:
        return ""
    cells = "".join(f"<tr><th>{escape(w['label'])}</th><td data-field=\"fact-{escape(w['key'])}\">"
                    f"{escape(w['text'])}</td></tr>" for w in said)
    return (f"<section id=\"every-fact\"><h2>What the trail says of this run</h2><table class=\"kv\">{cells}"
            "</table></section>")


def _facts(rep: dict[str, Any]) -> str:
    """What the run recorded at a moment rather than over a time: the process that ran it,
    each fast path's verdict, the chip facts, the part-number decision, diagnostics."""
    rows = rep["stages"]
    timed = _timed(rows)
    t0 = _time(rep["started"])
    found = []
    for r in rows:
        if r["stage"] in timed and r["event"] in ("start", *_OUTCOMES):
            continue
        at = _time(r["at"])
        when = _seconds(at - t0) if at and t0 else "—"
        event = "" if r["event"] in ("start", "end") else r["event"]
        found.append(f"<tr data-fact=\"{escape(r['stage'])}\"><th>{escape(r['stage'])}</th><td>{escape(event)}</td>"
                     f"<td class=\"num\">{when}</td><td class=\"detail\">{_value(_readable(r['detail']))}</td></tr>")
    if not found:
        return ""
    return ("<section id=\"facts\"><h2>Recorded facts</h2><p class=\"muted\">What the run recorded at a moment: "
            "the process that ran it, each fast path's check, the chip's facts, decisions and diagnostics.</p>"
            "<table class=\"stages\"><thead><tr><th>stage</th><th>what</th><th>at</th><th>detail</th></tr></thead>"
            f"<tbody>{''.join(found)}</tbody></table></section>")


def _time(text: str | None) -> dt.datetime | None:
    if not text:
        return None
    try:
        return dt.datetime.fromisoformat(text)
    except ValueError:
        return None


def _seconds(delta: dt.timedelta) -> str:
    return f"{delta.total_seconds():.3f} s"


# -- verify results ---------------------------------------------------------------------------

def _verifies(rep: dict[str, Any]) -> str:
    v = rep["verifies"]
    failed = v["failed"]
    summary = (f"<p data-field=\"verify-counts\"><b>{v['total']}</b> verify results: <b>{v['ok']}</b> ok, "
               f"<b>{v['total'] - v['ok']}</b> failed.</p>")
    if not failed:
        return f"<section id=\"verifies\"><h2>Verify results</h2>{summary}</section>"
    rows = "".join(
        f"<tr class=\"failed-verify\"><td class=\"mono\">{_hex(f['address'], 6)}</td><td class=\"num\">"
        f"{escape(str(f['attempt']))}</td><td class=\"mono\">{_hex(f['mismatch_address'], 6)}</td>"
        f"<td class=\"mono\">{_hex(f['flash_byte'], 2)}</td><td class=\"mono\">{_hex(f['image_byte'], 2)}</td></tr>"
        for f in failed)
    return (f"<section id=\"verifies\"><h2>Verify results</h2>{summary}<table class=\"grid\"><thead><tr>"
            f"<th>unit</th><th>attempt</th><th>mismatch address</th><th>flash byte</th><th>image byte</th></tr>"
            f"</thead><tbody>{rows}</tbody></table></section>")


def _hex(value: int | None, digits: int) -> str:
    return "—" if value is None else f"0x{value:0{digits}x}"


# -- the first error and the register writes before it ----------------------------------------

def _first_error_event(db: sqlite_utils.Database, rep: dict[str, Any], rows: RunRows) -> tuple[int, str] | None:
    """(seq, description) of the earliest failure on record: a failed verify, an error, a failed stage."""
    where, args = rows.sql, rows.args
    found: list[tuple[int, str]] = []
    for r in db.query("SELECT seq, address, attempt, mismatch_address, flash_byte, image_byte FROM verifies "
                      f"WHERE {where} AND ok = 0 ORDER BY seq LIMIT 1", args):
        found.append((r["seq"], f"verify of unit {_hex(r['address'], 6)} failed (attempt {r['attempt']}): "
                                f"{_hex(r['mismatch_address'], 6)} flash={_hex(r['flash_byte'], 2)} "
                                f"image={_hex(r['image_byte'], 2)}"))
    for r in db.query(f"SELECT seq, stage, message, address FROM errors WHERE {where} ORDER BY seq LIMIT 1", args):
        at = f" at {_hex(r['address'], 6)}" if r["address"] is not None else ""
        found.append((r["seq"], f"error{' in ' + r['stage'] if r['stage'] else ''}{at}: {r['message']}"))
    for r in db.query(f"SELECT seq, stage, detail FROM stages WHERE {where} AND event = 'fail' ORDER BY seq LIMIT 1",
                      args):
        found.append((r["seq"], f"stage {r['stage']} failed: {r['detail'] or ''}"))
    if not found and rep["status"] in ("failed", "interrupted"):
        for r in db.query(f"SELECT seq, status, detail FROM run_status WHERE {where} AND status != 'running' "
                          "ORDER BY seq DESC LIMIT 1", args):
            found.append((r["seq"], f"run {r['status']}: {r['detail'] or 'no detail recorded'}"))
    return min(found) if found else None


def _first_error(db: sqlite_utils.Database, rep: dict[str, Any], rows: RunRows) -> str:
    event = _first_error_event(db, rep, rows)
    no_end = {"running": "no error recorded, but the run recorded no end either: its host may have died "
                         "mid-run ('amdflash resume' finishes it)",
              "interrupted": "no error recorded, and the run recorded no end: its process died mid-run (killed, "
                             "or its host went down)"}
    if event is None and rep.get("ended") is None and rep["status"] in no_end:
        return ("<section id=\"first-error\"><h2>First error</h2><p class=\"warn\" data-field=\"first-error\">"
                f"{no_end[rep['status']]}</p></section>")
    if event is None:
        return "<section id=\"first-error\"><h2>First error</h2><p class=\"ok\">no error recorded</p></section>"
    seq, text = event
    title, transactions = _attempt(db, rows, seq)
    table = "".join(_transaction_row(t) for t in transactions) or \
        "<tr><td colspan=\"7\" class=\"muted\">none on record</td></tr>"
    run_error = (f"<p>The run ended: <span data-field=\"run-error\">{escape(rep['error'])}</span></p>"
                 if rep["error"] else "")
    # A row in the unsealed tail (a run whose host died with its writer) is what the trail
    # holds, but no checkpoint vouches for it: said where it is shown.
    unsealed = (" <span class=\"warn\" data-field=\"first-error-unsealed\">not sealed by any checkpoint: "
                "not verified</span>" if rows.unsealed(seq) else "")
    return (f"<section id=\"first-error\"><h2>First error</h2><p class=\"bad\" data-field=\"first-error\" "
            f"data-seq=\"{seq}\">{escape(text)} <span class=\"muted\">(audit seq {seq})</span>{unsealed}</p>"
            f"{run_error}<h3 data-field=\"attempt\">{escape(title)}</h3><table class=\"grid writes\"><thead><tr>"
            f"<th>n</th><th>seq</th><th>clock (s)</th><th>command</th><th>address</th><th>data</th>"
            f"<th>register writes</th></tr></thead><tbody>{table}</tbody></table></section>")


def _attempt(db: sqlite_utils.Database, rows: RunRows, seq: int) -> tuple[str, list[dict[str, Any]]]:
    """The ROM_SW transactions that explain the failure at `seq`.

    A unit that failed verification: its last attempt — from its last intent (the erase of
    a retry, or of its block) to the failure — keeping the transactions on the unit (erase,
    page programs, the read-back) and, for a retry, which runs alone, everything. Any other
    failure: the run's last transactions before it."""
    failed = list(db.query(f"SELECT seq, address, size FROM units WHERE {rows.sql} AND state = 'failed' AND seq >= ? "
                           "ORDER BY seq LIMIT 1", [*rows.args, seq]))
    if failed:
        unit = failed[0]
        start = list(db.query(f"SELECT seq, detail FROM units WHERE {rows.sql} AND address = ? AND state = 'intent' "
                              "AND seq < ? ORDER BY seq DESC LIMIT 1", [*rows.args, unit["address"], unit["seq"]]))
        if start:
            retry = (start[0]["detail"] or "").startswith("retry")
            lo, hi = unit["address"], unit["address"] + (unit["size"] or UNIT)
            found = [t for t in transactions_between(db, rows, start[0]["seq"], unit["seq"] + 1)
                     if retry or _touches(t, lo, hi)]
            what = "retry" if retry else "attempt (its erase, page programs and read-back)"
            return (f"The last {what} of unit {lo:#08x}: {len(found)} ROM_SW transactions", found)
    found = transactions_between(db, rows, 0, seq)[-TRANSACTIONS_BEFORE_ERROR:]
    return f"The last {len(found)} ROM_SW transactions before it", found


_ERASE_SPAN = {0x20: 0x1000, 0x52: 0x8000, 0xD8: 0x10000, 0x60: FLASH_SIZE, 0xC7: FLASH_SIZE}


def _touches(t: dict[str, Any], lo: int, hi: int) -> bool:
    """Whether a transaction reads, programs or erases any byte of [lo, hi)."""
    if not t["address_bytes"] or t["address"] is None:
        return t["opcode"] in (0x60, 0xC7)
    size = _ERASE_SPAN.get(t["opcode"])
    start = t["address"] - t["address"] % size if size else t["address"]
    end = start + (size or max(t["tx_len"], t["rx_len"], 1))
    return start < hi and lo < end


# How the failure section names each shape letter (store.schema.SHAPE_LETTERS).
_LETTER_WORDS = {"S": "STATUS←0", "s": "STATUS←0 (block)", "C": "COMMAND", "c": "COMMAND (block)",
                 "H": "STATUS+COMMAND (one block)", "B": "STATUS+COMMAND+DATA (one block)", "D": "DATA",
                 "N": "CNTL (starts it)", "n": "CNTL (block, starts it)"}


def _transaction_row(t: dict[str, Any]) -> str:
    op = t["opcode"]
    address = f"{t['address']:#08x}" if t["address_bytes"] and t["address"] is not None else "—"
    data = f"send {t['tx_len']} bytes" if t["tx_len"] else f"receive {t['rx_len']} bytes" if t["rx_len"] else "—"
    writes = ", ".join(_LETTER_WORDS.get(c, c) for c in t.get("writes") or "") or "recorded as plain register writes"
    name = f"{op:02X}h {escape(OPCODES.get(op, '?'))}" if op is not None else "? (COMMAND not on record)"
    return (f"<tr class=\"txn\" data-n=\"{t['n']}\" data-opcode=\"{'' if op is None else f'{op:#04x}'}\">"
            f"<td class=\"num\">{t['n']}</td>"
            f"<td class=\"num\">{t['seq']}</td><td class=\"num\">{t['clock']:.6f}</td>"
            f"<td class=\"mono\">{name}</td><td class=\"mono\">{address}</td>"
            f"<td>{data}</td><td class=\"muted\">{escape(writes)}</td></tr>")


def decode_write(offset: int, value: int | None, data: bytes | None) -> tuple[str, str, str]:
    """(register name, value written, what it means to the ROM_SW engine)."""
    if R.ROM_SW_DATA <= offset < R.ROM_SW_DATA + R.ROM_SW_DATA_SIZE:
        name = f"ROM_SW_DATA_{(offset - R.ROM_SW_DATA) // 4 + 1}"
    else:
        name = REGISTER_NAMES.get(offset, f"{offset:#07x}")
    if value is None:
        blob = bytes(data or b"")
        # The window holds big-endian dwords stored little-endian: reverse each for wire order.
        wire = b"".join(blob[i:i + 4][::-1] for i in range(0, min(len(blob), 16), 4))
        return name, f"{len(blob)} bytes", f"TX data on the wire: {wire.hex(' ')}{' …' if len(blob) > 16 else ''}"
    return name, f"{value:#010x}", _meaning(offset, value)


def _meaning(offset: int, value: int) -> str:
    if offset == R.ROM_SW_STATUS:
        return "clear DONE" if value == 0 else ""
    if offset == R.ROM_SW_COMMAND:
        op = value & 0xFF
        return f"opcode {op:02X}h {OPCODES.get(op, '?')}, address field {value >> 8:#08x}"
    if offset == R.ROM_SW_CNTL:
        count, address_bytes = value & 0xFFFF, (value >> 16) & 0x7
        rx = "receive" if value & R.ROM_SW_RETURN_DATA_ENABLE else "send"
        data = f"{rx} {count} bytes" if count else "no data"
        return f"start transaction: {address_bytes} address bytes, {data}"
    if offset in (R.GPIOPAD_MASK, R.GPIOPAD_A, R.GPIOPAD_EN):
        return "SPI pads released" if not value & R.SPI_PAD_BITS else "SPI pads held by GPIO"
    if offset == R.PAGE_MIRROR_CNTL:
        usage = value & R.PAGE_MIRROR_USAGE_MASK
        return "page mirror usage: SPI" if usage == R.PAGE_MIRROR_USAGE_SPI & R.PAGE_MIRROR_USAGE_MASK \
            else f"page mirror usage bits {usage >> 26}"
    if offset == R.ROM_CNTL:
        return f"SCK prescale {(value >> 24) & 0xF}"
    return ""


# -- audit chain ------------------------------------------------------------------------------

def _unverified(rep: dict[str, Any]) -> str:
    """A run that does not verify (store.partial_report): what the page shows, and each failing
    span with the rows that differ from a copy, when one was given. Empty for a run that verifies."""
    from amdflash.store.partial import difference_words

    u = rep.get("unverified")
    if u is None:
        return ""
    ranges = ", ".join(f"seq {lo}..{hi}" for lo, hi in u["vouched"])
    said = (f"<p class=\"bad\" data-field=\"unverified\">This run does not verify: {escape(u['problem'])}. This page "
            f"shows only what its signed checkpoints still vouch for ({escape(ranges)}); the spans below are not "
            "verified, and nothing on this page is read from them.</p>")
    if rep.get("status_verified") is False and rep.get("recorded_status"):
        said += (f"<p class=\"bad\" data-field=\"status-unverified\">Its status as the trail says it now, "
                 f"'{escape(str(rep['recorded_status']))}', is in rows no checkpoint that holds vouches for.</p>")
    spans = []
    for s in u["spans"]:
        where = f"seq {s['first_seq']}..{s['last_seq'] if s['last_seq'] is not None else 'end'}"
        tables = ", ".join(f"{t} {n}" for t, n in (s.get("tables") or {}).items())
        diffs = "".join(f"<li data-field=\"difference\" class=\"mono\">{escape(difference_words(d))}</li>"
                        for d in s.get("differences") or [])
        compared = f"<br><span class=\"muted\">{escape(s['compared'])}</span>" if s.get("compared") else ""
        spans.append(f"<tr data-field=\"failing-span\"><td class=\"mono\">{escape(where)}</td>"
                     f"<td>{escape(str(s['checkpoint'] if s.get('checkpoint') is not None else '—'))}</td>"
                     f"<td>{escape(s['why'])}{compared}{f'<ul>{diffs}</ul>' if diffs else ''}</td>"
                     f"<td>{escape(tables or 'none')}</td></tr>")
    notes = "".join(f"<p class=\"warn\" data-field=\"unverified-note\">{escape(n)}</p>" for n in u["notes"])
    more = [x for x in (u.get("copy"), u.get("next"), f"check it: {u['check']}") if x]
    return (f"<section id=\"unverified\"><h2>Not verified</h2>{said}<table class=\"grid\"><thead><tr><th>failing "
            "span</th><th>checkpoint</th><th>why (and the rows that differ from the copy)</th><th>rows there now"
            f"</th></tr></thead><tbody>{''.join(spans)}</tbody></table>{notes}"
            + "".join(f"<p class=\"muted\">{escape(x)}</p>" for x in more) + "</section>")


def _chain(c: dict[str, Any]) -> str:
    kind = "ok" if c["ok"] else "bad"
    state = ("intact: this run's rows match every checkpoint that sealed them" if c["ok"] else
             f"BROKEN: {c['problem']}")
    sealed = {"final": "its final checkpoint (the run's end is sealed)",
              "commit": "its last checkpoint (the run recorded no end)",
              "migrated": "an unsigned legacy checkpoint, made when its database was upgraded"}.get(
                  str(c.get("sealed")), "—")
    rows = [("chain", "chain", state),
            ("checkpoint", "sealed by", f"checkpoint #{c['checkpoint']}: {sealed}" if c.get("checkpoint") else None),
            ("chain_head", "chain head", c.get("head")),
            ("checkpoint_hash", "checkpoint hash", c.get("checkpoint_hash")),
            ("signed_by", "signed by", c.get("signed_by")),
            ("signature", "signature", c.get("signature"))]
    if c.get("legacy"):
        rows.insert(1, ("legacy", "legacy", c["legacy"]))
    if c.get("unsealed_rows"):
        rows.append(("unsealed_rows", "not sealed", f"the run's last {c['unsealed_rows']} row(s): no checkpoint "
                     "seals them (still being written, or their writer died), so what they say is not verified"))
    cells = "".join(f"<tr><th>{escape(label)}</th><td data-field=\"{key}\" class=\"mono\"{_ok_attr(key, c)}>"
                    f"{_value(value)}</td></tr>" for key, label, value in rows)
    return (f"<section id=\"chain\"><h2>Audit chain</h2><table class=\"kv {kind}\">{cells}</table>"
            f"<p class=\"muted\">This run's rows ({c.get('rows')}) and its {c.get('checkpoints')} checkpoints were "
            f"checked when this report was made. 'amdflash audit verify --run RUN_ID --key PUBFILE' checks the "
            f"signatures against the host's public key.</p></section>")


def _ok_attr(key: str, c: dict[str, Any]) -> str:
    return f" data-ok=\"{'true' if c['ok'] else 'false'}\"" if key == "chain" else ""


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


CSS = """
:root { --skip: #cfe3d4; --program: #3d7dd8; --erase: #e69a28; --failed: #d23a3a; --protected: #5b6270;
        --none: #ffffff; --line: #d5d9e0; --ink: #1d2330; --muted: #6a7282; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--ink); margin: 24px 32px;
       background: #f6f7f9; max-width: 1300px; }
header { display: flex; align-items: center; gap: 12px; }
h1 { font-size: 22px; margin: 0; } h2 { font-size: 17px; margin: 0 0 8px; } h3 { font-size: 14px; margin: 14px 0 6px; }
section { background: #fff; border: 1px solid var(--line); border-radius: 6px; padding: 14px 18px; margin: 14px 0; }
.mono, td.num { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; font-size: 12.5px; }
td.num { text-align: right; white-space: nowrap; }
.muted { color: var(--muted); }
.badge, span.badge { border-radius: 10px; padding: 2px 10px; font-weight: 600; color: #fff; background: #5d6575; }
.badge.ok { background: #23703c; } .badge.bad { background: #b42323; }
span.badge.warn { background: #8f4f00; color: #fff; }   /* span.warn's text colour would hide it */
.badge.emulated { background: #5b3fa8; }
p.ok, td.ok { color: #23703c; } p.warn, span.warn { color: #8f4f00; font-weight: 600; }
p.bad, td.bad { color: var(--failed); font-weight: 600; } td.open { color: #c77b12; }
table { border-collapse: collapse; }
/* Fixed columns: a long value wraps inside its cell instead of widening the page. Only a word
   longer than its cell (a hash, a path) is broken; a command is never broken inside a word — it
   wraps between words, and a word too long for the line scrolls (what is copied stays whole). */
table.kv { width: 100%; table-layout: fixed; }
table.kv th { text-align: left; font-weight: 500; color: var(--muted); padding: 2px 16px 2px 0; vertical-align: top;
              width: 15em; }
table.kv td { padding: 2px 0; overflow-wrap: break-word; }
.cmd { overflow-wrap: normal; word-break: normal; overflow-x: auto; }
code.cmd { display: block; margin: 2px 0; white-space: normal; }
.cmd .w, .run, a.mono { white-space: nowrap; }   /* a run id is one word */
table.stages { width: 100%; }
table.grid { min-width: 50%; }
table.grid th, table.stages th { text-align: left; font-weight: 600; border-bottom: 1px solid var(--line);
  padding: 4px 8px; }
table.grid td, table.stages td { border-bottom: 1px solid #eef0f3; padding: 3px 8px; }
table.stages tbody th { font-weight: 500; padding: 3px 8px; }
td.track { position: relative; width: 45%; min-width: 260px; }
table.stages td:nth-child(5) { white-space: nowrap; }
td.track .bar { position: absolute; top: 6px; bottom: 6px; border-radius: 3px; }
td.track::before { content: ""; position: absolute; left: 8px; right: 8px; top: 50%;
  border-top: 1px dashed var(--line); }
.bar.ok { background: #5aa36f; } .bar.bad { background: var(--failed); }
.bar.open { background: linear-gradient(90deg, #e4a13a, rgba(228, 161, 58, 0.08)); }
.bar.cancelled, .bar.stopped { background: repeating-linear-gradient(45deg, #8c93a0 0 4px, #dfe2e7 4px 8px); }
td.cancelled, td.stopped { color: var(--muted); font-style: italic; }
td.detail { color: var(--muted); font-size: 12.5px; }
.legend { list-style: none; padding: 0; margin: 4px 0 12px; display: flex; flex-wrap: wrap; gap: 6px 18px; }
.legend li { display: flex; align-items: center; gap: 6px; }
.legend .cell { display: inline-block; width: 14px; height: 14px; }
.map { display: inline-block; }
.maprow { display: flex; align-items: center; gap: 10px; margin-bottom: 3px; }
.maprow .addr { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 11.5px; color: var(--muted);
                width: 68px; text-align: right; }
.block { display: grid; grid-template-columns: repeat(16, 22px); gap: 2px; }
.cell { height: 22px; border-radius: 2px; border: 1px solid rgba(0, 0, 0, 0.12); }
.cell.skip { background: var(--skip); }
.cell.program { background: var(--program); }
.cell.erase { background: var(--erase); }
.cell.failed { background: var(--failed); border-color: #7d1010; }
.cell.protected { background: repeating-linear-gradient(135deg, var(--protected) 0 3px, #8c93a0 3px 6px); }
.cell.none { background: var(--none); border-color: var(--line); }
.cell.planned { background: #fff3bf; border: 2px solid #b58900; }
.cell.unreached { background: #e9ecf1; border: 1px dashed #9aa1ad; }
.cell.earlier { background: #a9c6ee; }
.key { color: var(--muted); font-style: normal; }
.cell.program.unverified { background: repeating-linear-gradient(45deg, var(--program) 0 3px, #fff 3px 6px); }
.cell.erase.unverified { background: repeating-linear-gradient(45deg, var(--erase) 0 3px, #fff 3px 6px); }
.cell.skip.unverified { background: repeating-linear-gradient(45deg, var(--skip) 0 3px, #fff 3px 6px); }
.cell:hover { outline: 2px solid var(--ink); }
table.writes td { font-size: 12.5px; }
footer { color: var(--muted); font-size: 12px; margin-top: 18px; }
@media print {
  body { background: #fff; margin: 0; max-width: none; font-size: 11px; }
  section { border: none; padding: 6px 0; margin: 6px 0; break-inside: avoid; }
  section#sector-map, section#first-error { break-before: page; }
  * { -webkit-print-color-adjust: exact; print-color-adjust: exact; }
  .cell:hover { outline: none; }
  a { color: inherit; text-decoration: none; }
  table.kv td, td.detail { overflow-wrap: break-word; }
  .cmd { overflow-x: visible; }
}
"""
