"""Facts of one run the trail holds but the report's other fields do not say (issue 44): the
registers before, after restore and left changed; each override (--force, --clear-cmp, …) and
what it overrode; the image and the backup, and whether the trail holds their content; the
VBIOS part number before and after; each unit's time; how the run ended; a verify failure in
the flash chip's terms; and which database the report was read from.

`add` puts them into the report object (JSON) under `facts`, each a structured value, and
`facts.words`: the same facts as (key, label, sentence). The text report prints those
sentences and the HTML page shows them (store/html.py), so the three formats say the same
words. Everything is read from the run's own rows; a fact taken from another run (the one
that put registers back, a later run's boot id) only from a run that verifies.

The sentences are store/fact_words.py's. Nothing here imports store.queries (which calls
`add`): the few rows it needs it reads itself.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import sqlite3
from typing import Any

from amdflash.stages.drivers.navi31 import regs as R
from amdflash.store.fact_words import words
from amdflash.store.run_rows import RunRows, RunUnverified, open_run
from amdflash.store.status import ENDS, PROCESS_STAGE, _boot_id, boot_of, machine_id, process_alive, run_status

REGISTER_NAMES = {getattr(R, name): name for name in (
    "ROM_CNTL", "PAGE_MIRROR_CNTL", "ROM_STATUS", "ROM_INDEX", "ROM_DATA", "ROM_START",
    "ROM_SW_CNTL", "ROM_SW_STATUS", "ROM_SW_COMMAND", "GPIOPAD_MASK", "GPIOPAD_A", "GPIOPAD_EN",
    "MP0_C2PMSG_73", "MP0_C2PMSG_115", "MP0_C2PMSG_116")}

# The registers a run changes and must put back (stages/restore.RESTORABLE, which store does not
# import: that module brings the whole device). ROM_SW_CNTL and ROM_SW_STATUS are the engine's
# own: the hardware changes them as each transaction runs, so what was last written says nothing.
LEFT = (R.ROM_SW_COMMAND, R.ROM_CNTL, R.ROM_INDEX, R.PAGE_MIRROR_CNTL, R.GPIOPAD_A, R.GPIOPAD_EN, R.GPIOPAD_MASK)

# Shape letters of a log_spi row (store.schema.SHAPE_LETTERS) that write each ROM_SW register.
_STATUS_LETTERS, _COMMAND_LETTERS, _CNTL_LETTERS = set("SsHB"), set("CcHB"), set("Nn")


def add(conn: sqlite3.Connection, rows: RunRows, rep: dict[str, Any], db_file: str) -> None:
    """Put the facts into `rep` (its other keys already there): `facts` and each unit's times."""
    times = _unit_times(conn, rows, rep)
    for unit in rep["units"]:
        unit.update(times.get(unit["address"], {"start_s": None, "end_s": None, "start": None, "end": None}))
    facts: dict[str, Any] = {
        "registers": registers(conn, rows),
        "overrides": overrides(rep),
        "image": {"path": rep.get("image_path"), "sha256": rep.get("image_sha256"), "in_trail": False},
        "backup": backup(conn, rows),
        "vbios": vbios(rep),
        "unit_clock": _clock_words(rep, times),
        "ended": ended(conn, rows, rep),
        "verify_diagnosis": diagnosis(rep["verifies"]["failed"], rep["units"]),
        "database": db_file,
    }
    rep["facts"] = facts
    facts["words"] = [{"key": k, "label": label, "text": text} for k, label, text in words(rep)]


def read_for_host(rep: dict[str, Any], host: str) -> None:
    """The run was read from a copy of `host`'s trail (the central record's, in a temporary file):
    its facts name that host, not the copy, as where its commands run (pipeline.run_end.on_host)."""
    facts = rep.get("facts")
    if isinstance(facts, dict):
        facts["read_for_host"], facts["database"] = host, None
        facts["words"] = [{"key": k, "label": label, "text": text} for k, label, text in words(rep)]


# -- registers --------------------------------------------------------------------------------

def _name(offset: int) -> str:
    return REGISTER_NAMES.get(offset, f"{offset:#07x}")


def _snapshot(conn: sqlite3.Connection, rows: RunRows, label: str, sealed: bool = False) -> dict[int, int] | None:
    where, args = (rows.sealed_sql, rows.sealed_args) if sealed else (rows.sql, rows.args)
    found = conn.execute(f"SELECT registers FROM register_snapshots WHERE {where} AND label = ? ORDER BY seq LIMIT 1",
                         [*args, label]).fetchone()
    try:
        return {int(k, 16): int(v) for k, v in json.loads(found[0]).items()} if found else None
    except (ValueError, TypeError, AttributeError):
        return None          # not a row amdflash wrote


def _named(values: dict[int, int] | None) -> dict[str, str] | None:
    return None if values is None else {_name(k): f"{v:#010x}" for k, v in sorted(values.items())}


def last_writes(conn: sqlite3.Connection, rows: RunRows, offsets: set[int]) -> dict[int, int]:
    """The value the run's sealed register writes last put in each of `offsets`: the raw
    writes (log_writes, block writes split into registers) and the ROM_SW registers its last
    transactions set (log_spi: their shape says which registers each wrote)."""
    if rows.sealed is None:
        return {}
    lost = link_lost(conn, rows)
    span = (rows.key, rows.sealed if lost is None else min(rows.sealed, lost - 2), rows.key)
    last: dict[int, tuple[int, int]] = {}
    for seq, offset, value, data in conn.execute(
            "SELECT w.seq, w.offset, w.value, b.data FROM log_writes w LEFT JOIN blobs b ON b.id = w.data "
            "WHERE w.seq BETWEEN ? AND ? AND w.run = ? ORDER BY w.seq", span):
        if value is not None:
            last[offset] = (seq, value)
        elif isinstance(data, bytes):
            for i in range(0, len(data) - 3, 4):
                if offset + i in offsets:
                    last[offset + i] = (seq, int.from_bytes(data[i:i + 4], "little"))
    wanted = {R.ROM_SW_STATUS: _STATUS_LETTERS, R.ROM_SW_COMMAND: _COMMAND_LETTERS, R.ROM_SW_CNTL: _CNTL_LETTERS}
    for seq, command, cntl, shape in conn.execute(
            "SELECT seq, command, cntl, coalesce(shape, 'SCN') FROM log_spi WHERE seq BETWEEN ? AND ? AND run = ? "
            "ORDER BY seq DESC LIMIT 64", span):
        for offset, letters in list(wanted.items()):
            if letters & set(shape or ""):
                value = {R.ROM_SW_STATUS: 0, R.ROM_SW_COMMAND: command, R.ROM_SW_CNTL: cntl}[offset]
                if value is not None and (offset not in last or last[offset][0] < seq):
                    last[offset] = (seq, value)
                del wanted[offset]
        if not wanted:
            break
    return {k: v for k, (_, v) in last.items() if k in offsets}


def link_lost(conn: sqlite3.Connection, rows: RunRows) -> int | None:
    """The seq of the run's first sealed 'write failed' (the register write recorded just
    before it did not reach the board: the transport was lost), if any. From there on its
    recorded writes, its attempt to put the registers back among them, never reached it."""
    found = conn.execute(f"SELECT min(seq) FROM stages WHERE {rows.sealed_sql} AND stage = 'transport' "
                         "AND event = 'write failed'", rows.sealed_args).fetchone()
    return found[0] if found and found[0] is not None else None


def registers(conn: sqlite3.Connection, rows: RunRows) -> dict[str, Any]:
    """Before, after restore, and what the run left changed: from its "after restore" snapshot,
    or, where it ended without one (killed, its host lost), from its sealed register writes; and
    the later run that found them so and put them back, if one did (a run that verifies)."""
    before = _snapshot(conn, rows, "before")
    after = _snapshot(conn, rows, "after restore")
    out: dict[str, Any] = {"before": _named(before), "after_restore": _named(after), "left_changed": [],
                           "left_from": None, "put_back_by": None, "found_by_next": None}
    if before is None:
        return out
    if after is not None:
        left, out["left_from"] = after, "after restore"
    else:
        left, out["left_from"] = {**before, **last_writes(conn, rows, set(before))}, "sealed writes"
        if link_lost(conn, rows) is not None:
            out["left_from"] = "sealed writes before the link was lost"
    out["left_changed"] = [{"register": _name(k), "before": f"{before[k]:#010x}", "left": f"{left[k]:#010x}"}
                           for k in LEFT if k in before and k in left and left[k] != before[k]]
    if after is None:
        out["put_back_by"], out["found_by_next"] = _settled_by(conn, rows.run_id)
    return out


def _settled_by(conn: sqlite3.Connection, run_id: str) -> tuple[dict[str, Any] | None, dict[str, str] | None]:
    """The later run that dealt with what this run left (stages.restore.put_back's sealed
    record: what it put back) and the registers it found: from a run that verifies only."""
    for other, seq, detail in conn.execute(
            "SELECT run_id, seq, detail FROM stages WHERE stage = 'restore_stranded' AND event = 'end' ORDER BY seq"):
        try:
            said = json.loads(detail)
            if said.get("run") != run_id or other == run_id:
                continue
            rows = open_run(conn, other)
        except (ValueError, TypeError, AttributeError, RunUnverified):
            continue
        if rows.unsealed(seq):
            continue
        found = conn.execute(f"SELECT registers FROM register_snapshots WHERE {rows.sealed_sql} AND label = 'found' "
                             "ORDER BY seq LIMIT 1", rows.sealed_args).fetchone()
        try:
            seen = {int(k, 16): int(v) for k, v in json.loads(found[0]).items()} if found else None
        except (ValueError, TypeError, AttributeError):
            seen = None
        return ({"run_id": other, "put_back": said.get("put_back") or {},
                 "changed_since": said.get("changed_since")}, _named(seen))
    return None, None


# -- overrides, image, backup, VBIOS ---------------------------------------------------------

def _stage(rep: dict[str, Any], stage: str, events: tuple[str, ...] = ("end", "refuse")) -> dict[str, Any] | None:
    for row in rep.get("stages") or ():
        if row.get("stage") == stage and row.get("event") in events:
            return row
    return None


def _json(row: dict[str, Any] | None) -> dict[str, Any]:
    try:
        found = json.loads((row or {}).get("detail") or "")
    except (ValueError, TypeError):
        return {}
    return found if isinstance(found, dict) else {}


def overrides(rep: dict[str, Any]) -> list[dict[str, Any]]:
    """Each override the run was given and what it overrode, as its sealed rows record it."""
    given = rep.get("arguments")
    args: dict[str, Any] = given if isinstance(given, dict) else {}
    part = _json(_stage(rep, "part_number"))
    out: list[dict[str, Any]] = []
    if args.get("force"):
        forced = part.get("outcome") == "forced"
        out.append({"option": "--force", "overrode": "part number" if forced else None,
                    "image_part": part.get("image_part"), "board_part": part.get("board_part"),
                    "board_detail": part.get("board_detail"), "reason": part.get("reason"),
                    "part_outcome": part.get("outcome")})
    if args.get("clear_cmp"):
        cleared = _stage(rep, "clear_cmp")
        began = _stage(rep, "clear_cmp", ("start",))
        out.append({"option": "--clear-cmp", "overrode": "protection" if began else None,
                    "protection": (began or {}).get("detail"), "result": (cleared or {}).get("detail")})
    if args.get("unknown_chip_ok"):
        chip = _json(_stage(rep, "identify", ("chip facts",)))
        out.append({"option": "--unknown-chip-ok", "overrode": "unknown chip" if chip.get("source") == "sfdp" else None,
                    "chip": chip.get("name")})
    return out


def backup(conn: sqlite3.Connection, rows: RunRows) -> dict[str, Any] | None:
    """The run's backup (path, sha256: its own, else — a resume — the one the flash it resumes
    made, through resumes of resumes, each run verified) and whether its sealed backup units
    rebuild it."""
    made_by, seen = rows, {rows.run_id}
    found = None
    for _ in range(32):
        found = conn.execute(f"SELECT sha256, size, path FROM backups WHERE {made_by.sealed_sql} ORDER BY seq LIMIT 1",
                             made_by.sealed_args).fetchone()
        parent = conn.execute("SELECT resumes_run_id FROM runs WHERE seq = ?", (made_by.key,)).fetchone()
        if found is not None or not parent or not isinstance(parent[0], str) or parent[0] in seen:
            break
        seen.add(parent[0])
        try:
            made_by = open_run(conn, parent[0])
        except RunUnverified:
            break
    if found is None:
        return _unfinished_backup(conn, rows)
    rows = made_by
    sha, size, path = found
    digest, held, units = hashlib.sha256(), 0, 0
    for address, data in conn.execute(
            f"SELECT address, data FROM backup_units WHERE {rows.sealed_sql} ORDER BY address, seq", rows.sealed_args):
        if isinstance(data, bytes) and address == held:
            digest.update(data)
            held += len(data)
            units += 1
    whole = held == size and digest.hexdigest() == sha
    return {"path": path, "sha256": sha, "size": size, "run_id": rows.run_id, "units_in_trail": units,
            "bytes_in_trail": held, "in_trail": whole}


def _unfinished_backup(conn: sqlite3.Connection, rows: RunRows) -> dict[str, Any] | None:
    """A run that stopped while backing up made no backup file, but the units it had read are
    sealed in the trail ('audit bundle' rebuilds them as original-partial.bin)."""
    units, held, first = conn.execute(f"SELECT count(*), coalesce(sum(length(data)), 0), min(address) FROM "
                                      f"backup_units WHERE {rows.sealed_sql}", rows.sealed_args).fetchone()
    if not units:
        return None
    done = conn.execute(f"SELECT 1 FROM stages WHERE {rows.sealed_sql} AND stage = 'backup' AND event = 'end' "
                        "LIMIT 1", rows.sealed_args).fetchone()
    return {"path": None, "sha256": None, "size": None, "run_id": rows.run_id, "units_in_trail": units,
            "bytes_in_trail": held, "in_trail": False, "unfinished": done is None, "first_address": first}


def vbios(rep: dict[str, Any]) -> dict[str, Any] | None:
    """The VBIOS part number (and version) the board held before, as the part check read it,
    and after: derived from the image written (said so), for a run that succeeded."""
    part = _json(_stage(rep, "part_number"))
    if not part:
        return None
    given = rep.get("arguments")
    args: dict[str, Any] = given if isinstance(given, dict) else {}
    # Only a whole-image flash is known to have written the image's VBIOS: a range may not cover it.
    whole = bool(args) and args.get("start_sector", 0) == 0 and args.get("sector_count") in (None, 512)
    succeeded = (rep.get("status") == "succeeded" and rep.get("command") in ("flash", "resume", "restore-original")
                 and whole)
    return {"before": part.get("board_part"), "before_version": part.get("board_version"),
            "before_state": part.get("board_state"), "before_where": part.get("board_detail"),
            "image": part.get("image_part"), "image_version": part.get("image_version"),
            "after": part.get("image_part") if succeeded else None,
            "after_version": part.get("image_version") if succeeded else None,
            "after_from": "derived from the image written, as the flash succeeded and verified; not read back"
            if succeeded else None}


# -- unit times ---------------------------------------------------------------------------------

def _anchor(conn: sqlite3.Connection, rows: RunRows) -> tuple[float, dt.datetime] | None:
    """(board clock, wall time) of one moment: the "before" snapshot's clock and the wall time
    of the stages row recorded right after it (`registers` end: the snapshot's reads later, a
    few milliseconds; the row before it comes before the search for a stranded run's registers)."""
    snap = conn.execute(f"SELECT seq, clock FROM register_snapshots WHERE {rows.sql} AND label = 'before' "
                        "ORDER BY seq LIMIT 1", rows.args).fetchone()
    if snap is None or snap[1] is None:
        return None
    at = conn.execute(f"SELECT at FROM stages WHERE {rows.sql} AND seq > ? ORDER BY seq LIMIT 1",
                      [*rows.args, snap[0]]).fetchone()
    try:
        return float(snap[1]), dt.datetime.fromisoformat(at[0])
    except (TypeError, ValueError):
        return None


def _unit_times(conn: sqlite3.Connection, rows: RunRows, rep: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """Each unit's first and last recorded moment (its first row past `planned`, its last row),
    in seconds on the board's clock since the run's "before" snapshot and, on hardware (whose
    clock is the host's monotonic clock), as wall-clock time."""
    anchor = _anchor(conn, rows)
    if anchor is None:
        return {}
    zero, wall = anchor
    real = rep.get("emulated") is False
    out: dict[int, dict[str, Any]] = {}
    for address, first, last in conn.execute(
            f"SELECT address, min(clock), max(clock) FROM units WHERE {rows.sql} AND state != 'planned' "
            "GROUP BY address", rows.args):
        if not isinstance(address, int) or not all(isinstance(x, (int, float)) for x in (first, last)):
            continue          # a row amdflash did not write (INSERTed into an unsealed tail) says no time
        out[address] = {"start_s": round(first - zero, 6), "end_s": round(last - zero, 6),
                        "start": _wall(wall, first - zero) if real else None,
                        "end": _wall(wall, last - zero) if real else None}
    return out


def _wall(t0: dt.datetime, seconds: float) -> str:
    return (t0 + dt.timedelta(seconds=seconds)).isoformat(timespec="milliseconds")


def _clock_words(rep: dict[str, Any], times: dict[int, dict[str, Any]]) -> str | None:
    if not times:
        return None
    if rep.get("emulated") is False:
        return "wall-clock time, from the board's clock (the host's monotonic clock) since the run's first snapshot"
    return ("seconds on the emulated board's modelled clock since the run's first snapshot (not wall-clock time: "
            "the emulator's time is modelled)")


# -- how the run ended --------------------------------------------------------------------------

def ended(conn: sqlite3.Connection, rows: RunRows, rep: dict[str, Any]) -> dict[str, Any]:
    """How the run ended: its recorded end; else, from the boot ids its machine recorded, killed
    (a later run on the same boot), the host went down (a later run under another boot id) or
    still running (its process lives here, holding the board's lock)."""
    last = conn.execute(f"SELECT status, detail, at FROM run_status WHERE {rows.sql} ORDER BY seq DESC LIMIT 1",
                        rows.args).fetchone()
    if last is not None and last[0] in ENDS:
        return {"how": "recorded", "status": last[0], "at": last[2]}
    process = conn.execute(f"SELECT detail FROM stages WHERE {rows.sql} AND stage = ? ORDER BY seq LIMIT 1",
                           [*rows.args, PROCESS_STAGE]).fetchone()
    detail = process[0] if process else None
    boot = boot_of(detail)
    out: dict[str, Any] = {"how": "unknown", "status": None, "at": None, "boot_id": boot, "later_run": None,
                           "later_boot_id": None}
    if process_alive(detail):
        out["how"] = "running"
        return out
    later = _later_boot(conn, rows, rep.get("machine_id"))
    if later is not None and boot:
        out["later_run"], out["later_boot_id"] = later
        out["how"] = "killed" if later[1] == boot else "host down"
    elif process_alive(detail) is False:
        out["how"] = "killed"           # same boot, here, and its process is gone
    else:
        here = machine_id()
        if boot and here and here == rep.get("machine_id") and _boot_id() not in (None, boot):
            out["how"] = "host down"    # this very host has booted since
            out["later_boot_id"] = _boot_id()
        elif run_status(None, False, detail, rep.get("machine_id")) == "interrupted":
            out["how"] = "gone"         # read elsewhere, the record its host keeps says the process is gone
    return out


def _later_boot(conn: sqlite3.Connection, rows: RunRows, machine: object) -> tuple[str, str] | None:
    """(run, boot id) of the first later run on the same machine that recorded its process and
    verifies."""
    if not isinstance(machine, str) or not machine:
        return None
    for other, seq in conn.execute("SELECT run_id, seq FROM runs WHERE seq > ? AND machine_id = ? ORDER BY seq "
                                   "LIMIT 8", (rows.key, machine)):
        try:
            theirs = open_run(conn, other)
        except RunUnverified:
            continue
        if theirs.key != seq:
            continue
        found = conn.execute(f"SELECT detail FROM stages WHERE {theirs.sealed_sql} AND stage = ? ORDER BY seq LIMIT 1",
                             [*theirs.sealed_args, PROCESS_STAGE]).fetchone()
        boot = boot_of(found[0] if found else None)
        if boot:
            return other, boot
    return None


# -- a verify failure in the chip's terms -----------------------------------------------------

def diagnosis(failed: list[dict[str, Any]], units: list[dict[str, Any]] | None = None) -> str | None:
    """What the failed verifies say of the chip: a NOR flash's erase sets bits to 1 and its
    program only clears bits to 0, so bits that should be 1 but read 0 mean the erase did not
    take; bits that should be 0 but read 1, the program did not take; both, or a different
    byte on each attempt, that the reads are unstable or the data written was not the image's."""
    if not failed:
        return None
    first = failed[0]
    try:
        flash, image, at = int(first["flash_byte"]), int(first["image_byte"]), int(first["mismatch_address"])
    except (TypeError, ValueError, KeyError):
        return None
    zeros, ones = image & ~flash & 0xFF, flash & ~image & 0xFF
    same_unit = [f for f in failed if f.get("address") == first.get("address")]
    unstable = len({(f.get("mismatch_address"), f.get("flash_byte")) for f in same_unit}) > 1
    where = f"at {at:#08x} (flash {flash:02x}, image {image:02x}"
    where += f", {len(same_unit)} attempts alike)" if len(same_unit) > 1 and not unstable else ")"
    said = _diagnosed(first.get("address"), zeros, ones, unstable, where)
    if any(u.get("address") == first.get("address") and u.get("state") == "verified" for u in units or ()):
        said += "; a later attempt then verified the unit"
    return said


def _diagnosed(unit: object, zeros: int, ones: int, unstable: bool, where: str) -> str:
    if unstable:
        named = f"{unit:#08x}" if isinstance(unit, int) else str(unit)
        return (f"the read-back differs from attempt to attempt at unit {named} "
                f"(first {where}: unstable reads, or data that is not the image's")
    if zeros and not ones:
        return f"bits that should be 1 read 0 {where} — the erase did not take"
    if ones and not zeros:
        return f"bits that should be 0 read 1 {where} — the program did not take"
    return (f"bits differ both ways {where}: neither a failed erase nor a failed program alone explains it — "
            "unstable reads, or data that is not the image's")
