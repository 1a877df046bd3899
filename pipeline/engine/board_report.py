"""A board's hardware report given to an ordinary run (`--hardware-report FILE`).

`amdflash hardware-report --scratch-sector N` measures a board: its chip's slowest busy
times, and which reading of the block-protect bits the chip follows where the sources
disagree (its protection probe). A run given that report — info, read, dump, verify,
flash, resume — first checks it is the report of THIS board (the flash's JEDEC id and its
unique ID, or, for a flash without one, the board's serial; hashed or not), refusing it
otherwise before anything is done, then:

* raises the busy limits to the report's measured maxima (spinor.SpiNor.busy_limits), so a
  chip the report showed slower than its datasheet is not stopped as too slow;
* sets aside the protection readings the probe showed the chip does NOT follow. Only
  narrowing among the sources' readings: what remains is at least one source's reading,
  never a range smaller than every source says; a reading the probe did not test stays.

The report is untrusted input (a file): read whole (at most 1 MiB), checked like
`sim create --from-report` checks it, and every field used here validated. What was
applied is a stages row of the run (identify / hardware report).
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from amdflash.pipeline.errors import Refusal
from amdflash.stages.drivers.flash.spinor import BUSY_MARGIN, FlashIdentity

MAX_REPORT = 1 << 20
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class BoardReport:
    path: Path
    sha256: str                        # of the file as read
    jedec: bytes                       # the report's RDID capture
    unique_id: dict[str, str | None]   # {"value": hex or None} or {"sha256": hex}
    serial: dict[str, str | None]
    busy: dict[int, float]             # opcode -> the slowest the report saw (hardware_report.busy_limits)
    follows: tuple[str, ...] = ()      # the protection probe: readings the chip follows
    contradicts: tuple[str, ...] = ()  # ... and those it does not
    probe: str = ""                    # the probe in words ("" : the report has none)
    # What the probe did: the first status register's setting, the sector's address, whether
    # the byte was taken; and the status registers as found (the rest stayed so during it).
    trial: tuple[int, int, bool] | None = None
    registers: tuple[tuple[str, int], ...] = ()

    @property
    def arguments(self) -> dict[str, str]:
        """For the run's recorded arguments."""
        return {"hardware_report": str(self.path), "hardware_report_sha256": self.sha256}


def load(path: Path) -> BoardReport:
    """The report file, checked; Refusal naming the file and the field otherwise."""
    from amdflash.stages.sim.calibration import MAX_BUSY_SECONDS, CalibrationError, loads
    from amdflash.stages.sim.report_model import check

    what = f"--hardware-report {path}"
    try:
        if not path.is_file() or path.stat().st_size > MAX_REPORT:
            raise Refusal(f"{what}: not a regular file of at most 1 MiB")
        raw = path.read_bytes()
        report = dict(check(loads(raw.decode("utf-8"))))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError, CalibrationError) as e:
        raise Refusal(f"{what}: not a hardware report amdflash can use ({e})") from None
    flash, board = report["flash"], report["board"]
    try:
        busy = busy_limits(report)
    except (TypeError, ValueError, KeyError, AttributeError):
        raise Refusal(f"{what}: timings.busy.kinds: a kind's times are not numbers") from None
    for op, seconds in busy.items():
        if not (math.isfinite(seconds) and 0 <= seconds <= MAX_BUSY_SECONDS):
            raise Refusal(f"{what}: timings.busy.kinds.{op:#04x}: {seconds!r} s is not a busy time "
                          f"(0..{MAX_BUSY_SECONDS:g} s)")
    follows, contradicts, probe, trial = _probe(what, flash.get("protection_reading"))
    return BoardReport(path, hashlib.sha256(raw).hexdigest(), bytes.fromhex(flash["jedec"]),
                       _identity(what, "flash.unique_id", flash.get("unique_id")),
                       _identity(what, "board.serial", board.get("serial")), busy, follows, contradicts, probe,
                       trial, tuple(flash["status_registers"].items()))


def _identity(what: str, name: str, value: Any) -> dict[str, str | None]:
    """An identity field as `hardware_report._id` writes it: {"value": text or null} or {"sha256": hex}."""
    if value is None:
        return {"value": None}
    if isinstance(value, dict) and set(value) == {"sha256"} and isinstance(value["sha256"], str) \
            and _SHA256.fullmatch(value["sha256"]):
        return {"sha256": value["sha256"]}
    if isinstance(value, dict) and set(value) == {"value"} and (
            value["value"] is None or (isinstance(value["value"], str) and 0 < len(value["value"]) <= 128)):
        return {"value": value["value"]}
    raise Refusal(f"{what}: {name}: expected {{\"value\": text or null}} or {{\"sha256\": 64 hex digits}}")


def _probe(what: str, probe: Any) -> tuple[tuple[str, ...], tuple[str, ...], str, tuple[int, int, bool] | None]:
    """The protection probe's readings (only names amdflash knows), the probe in words, and
    what it did (setting, address, taken)."""
    from amdflash.stages.drivers.flash.chips import CHIPS

    if probe is None:
        return (), (), "", None
    if not isinstance(probe, dict):
        raise Refusal(f"{what}: flash.protection_reading: expected an object")
    if "follows" not in probe:
        return (), (), "the probe found nothing (" + str(probe.get("result", "no result"))[:200] + ")", None
    try:
        setting, address = int(probe["setting"], 16), int(probe["address"], 16)
    except (KeyError, TypeError, ValueError):
        raise Refusal(f"{what}: flash.protection_reading: setting and address are hex numbers") from None
    if not (0 <= setting <= 0xFF and 0 <= address < 1 << 24) or not isinstance(probe.get("taken"), bool):
        raise Refusal(f"{what}: flash.protection_reading: a register setting, a flash address and whether the "
                      "byte was taken")
    known = {r.source for chip in CHIPS if chip.protection for r in chip.protection.all_readings()}
    lists = []
    for key in ("follows", "contradicts"):
        names = probe.get(key)
        if not isinstance(names, list) or not all(isinstance(n, str) and n in known for n in names):
            raise Refusal(f"{what}: flash.protection_reading.{key}: a list of readings amdflash knows")
        lists.append(tuple(names))
    if not lists[0] or set(lists[0]) & set(lists[1]):
        raise Refusal(f"{what}: flash.protection_reading: the chip follows at least one reading, and none it "
                      "also contradicts")
    words = f"the report's probe at {address:#08x} with the status register {setting:#04x}"
    return lists[0], lists[1], words, (setting, address, probe["taken"])


def _check_probe(report: BoardReport, ident: FlashIdentity) -> None:
    """The probe's verdict must be what this part's readings make of what it did: under its
    setting (the other registers as found), the readings calling the sector protected are
    those it contradicts if the byte was taken, else those it follows."""
    layout = ident.chip.protection
    assert layout is not None and report.trial is not None
    setting, address, taken = report.trial
    found = dict(report.registers)
    regs = (setting, *(found.get(r.name, 0) for r in ident.chip.registers[1:]))
    decoded = layout.decode(regs, ident.chip.size)
    protected = {r.source for r in decoded.readings() if r.overlaps(address, 0x1000)}
    writable = {r.source for r in decoded.readings()} - protected
    follows, contradicts = (writable, protected) if taken else (protected, writable)
    if (set(report.follows), set(report.contradicts)) != (follows, contradicts):
        raise Refusal(f"--hardware-report {report.path}: flash.protection_reading does not agree with the "
                      f"{ident.chip.name}'s readings of setting {setting:#04x} at {address:#08x} (the byte "
                      f"{'taken' if taken else 'not taken'}): a report amdflash did not write as it is; "
                      "nothing was done")


def _matches(field: dict[str, str | None], value: str | None) -> bool:
    if "sha256" in field:
        return value is not None and hashlib.sha256(value.encode()).hexdigest() == field["sha256"]
    return field.get("value") == value


def check_board(report: BoardReport, ident: FlashIdentity, serial: str | None) -> str:
    """Refusal unless the report is of this board; what matched, in words."""
    mine = f"--hardware-report {report.path} is not of this board"
    capture = report.jedec + report.jedec[:2]
    if ident.chip.jedec not in capture:
        raise Refusal(f"{mine}: its flash.jedec {report.jedec.hex(' ')} is not this flash's JEDEC id "
                      f"{ident.chip.jedec.hex(' ')}; nothing was written")
    uid = ident.unique_id.hex() or None
    if uid is not None or report.unique_id.get("value") or "sha256" in report.unique_id:
        if not _matches(report.unique_id, uid):
            theirs = report.unique_id.get("value") or f"sha256 {report.unique_id.get('sha256')}"
            raise Refusal(f"{mine}: its flash.unique_id ({theirs or 'none'}) is not this flash's unique ID "
                          f"({uid or 'none'}); nothing was written")
        return "its flash's JEDEC id and unique ID are this board's"
    if not serial or not _matches(report.serial, serial):
        raise Refusal(f"{mine}: the {ident.chip.name} has no unique ID, so the board serial must match, and the "
                      f"report's board.serial does not match this board's ({serial or 'none'}); nothing was written")
    return "its flash's JEDEC id and the board serial are this board's (the flash has no unique ID)"


def apply(report: BoardReport, ident: FlashIdentity, serial: str | None) -> tuple[FlashIdentity, str, str]:
    """The identity with the readings the report's probe contradicts set aside (refused
    unless the report is of this board), which reading is in force and why, and what was
    applied, in words (for the trail). The busy limits are `report.busy`."""
    matched = check_board(report, ident, serial)
    chip, layout = ident.chip, ident.chip.protection
    narrowed = ident
    set_aside: tuple[str, ...] = ()
    if layout is not None and report.contradicts:
        _check_probe(report, ident)
        set_aside = tuple(r.source for r in layout.all_readings() if r.source in report.contradicts)
        kept = tuple(r for r in layout.all_readings() if r.source not in report.contradicts)
        if kept and set_aside:
            layout = dataclasses.replace(layout, readings=kept)
            chip = dataclasses.replace(chip, protection=layout)
            narrowed = dataclasses.replace(ident, chip=chip, protection=layout.decode(ident.registers, chip.size))
    reading = reading_words(narrowed, report, set_aside)
    busy = ", ".join(f"{op:02X}h {s:g} s" for op, s in sorted(report.busy.items())) or "none measured"
    words = (f"{report.path} (sha256 {report.sha256}): {matched}; busy limits: the slowest it measured × "
             f"{BUSY_MARGIN:g} where over the datasheet's ({busy}); protection reading: {reading}")
    return narrowed, reading, words


def reading_words(ident: FlashIdentity, report: BoardReport | None = None, set_aside: tuple[str, ...] = ()) -> str:
    """Which reading of the block-protect bits is in force for this run, and why."""
    layout = ident.chip.protection
    if layout is None:
        return "none (the part's protection bits are not known)"
    readings = "; ".join(r.source for r in layout.all_readings())
    if report is not None and set_aside:
        return (f"{readings} (this board's hardware report {report.path}: {report.probe} showed the chip "
                f"follows {'; '.join(report.follows)}, not {'; '.join(set_aside)})")
    if len(layout.all_readings()) == 1:
        return f"{readings} (the part's only source)"
    if report is None:
        why = "no hardware report of this board was given"
    elif not report.probe:
        why = f"the hardware report {report.path} has no protection probe (hardware-report --scratch-sector N has)"
    else:
        why = f"{report.probe} contradicts none of this part's readings" if report.follows else report.probe
    return f"the union of every source's reading ({readings}): {why}"


def busy_limits(report: dict[str, Any]) -> dict[int, float]:
    """The longest each busy kind took on the report's board (opcode -> seconds): the slowest
    operation seen (its spread's max, or the polled max), else the estimate plus its error.
    Given to SpiNor.busy_limits, they raise the driver's limit for that board only."""
    limits: dict[int, float] = {}
    for op, kind in ((report.get("timings") or {}).get("busy", {}).get("kinds") or {}).items():
        seen = [float(kind[key]["max"]) for key in ("per_operation", "polled")
                if isinstance(kind.get(key), dict) and "max" in kind[key]]
        if "seconds" in kind:
            seen.append(float(kind["seconds"]) + float(kind.get("error") or 0.0))
        if seen:
            limits[int(op, 16)] = max(seen)
    return limits
