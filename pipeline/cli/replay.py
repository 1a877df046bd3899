"""`amdflash replay`: re-apply a run's recorded register writes to an emulated board."""
from __future__ import annotations

import argparse
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from amdflash.pipeline.errors import EXIT_FAILED, EXIT_OK, Refusal
from amdflash.pipeline.cli import output

if TYPE_CHECKING:
    import sqlite_utils

    from amdflash.store.replay import ReplayResult

DESCRIPTION = """\
Rebuild the board of RUN_ID as the run found it — flash content from the run's backup,
registers from its "before" snapshot, SR1/SR2/SR3 as identified (so CMP and BP protect what
they protected) — on an emulated board in a temporary directory (ideal profile: every SPI
operation completes at once), then re-apply the recorded register writes in order.

Each recorded verify result is compared with the replayed unit when the replay reaches it
(verify rows and register writes share one sequence), and at the end the replayed flash
with the run's result SHA-256. The first divergence is named: the verify row, the last
register write applied, the unit, the byte address and the recorded and replayed bytes.
A stuck bit, an erase that did nothing or a transient read error on the hardware shows up
there; an emulated replay has none of them.

Only register writes are recorded. That is enough for ROM_SW flash runs: the reads they
made (status polls, data windows) change no state, and the ideal profile needs no polls.
Units the run did not back up stay 0xFF and are left out of every comparison.

Only a run whose record verifies is replayed (its rows as its checkpoints seal them: see
'amdflash audit verify --run'); rows of an unsealed tail (a host that died with its writer)
are replayed as recorded, and said to be unverified.

With --from-report FILE (a hardware report of the run's own board: a report whose flash JEDEC
id, unique ID or bridge serial differ from the run's is refused), the replay board is the
report's chip, and a divergence the report accounts for is shown "as listed" instead: a unit
whose read-back differed once, turning the driver's timed page programs off, and verified when
written again, when the report lists the chip's page program as taking other times than the
model — consistent with programs the chip did not take while still busy (the replay board is
never busy). Every other divergence stays one.

Writes nothing but the temporary emulated board, which is deleted afterwards; the audit
database is opened read-only. Exit 0 identical (with --from-report: but for divergences the
report lists), 1 diverged or the run does not verify, 2 refused (unknown run, run without a
backup, an --image that is not the run's image)."""


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("replay", help="re-apply a run's register writes to an emulated board from its backup; "
                                      "show where hardware and replay diverge",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_id", metavar="RUN_ID", help="the run (a unique prefix is enough)")
    p.add_argument("--until", type=_positive, metavar="N", help="stop after register write N (numbered from 1)")
    p.add_argument("--image", type=Path, metavar="FILE",
                   help="the run's image, if it moved since the run (default: the recorded path); it lets a "
                        "divergence in a unit that verified be pinned to a byte")
    p.add_argument("--from-report", type=Path, metavar="FILE",
                   help="a fidelity check: replay onto the board a hardware report of the run's own board "
                        "describes (its chip, SFDP and status registers; a report of another board is refused); "
                        "the report's divergences from the model are listed, and a divergence they account for "
                        "is shown 'as listed' (see above) only when the report names the board by its IDs in the "
                        "clear (hardware-report --include-ids): a hash of them vouches for nothing")
    p.add_argument("--format", choices=("text", "json"), default="text", help="text (default) or json")
    p.set_defaults(func=cmd_replay)


def _positive(text: str) -> int:
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value < 1:
        raise argparse.ArgumentTypeError("register writes are numbered from 1")
    return value


def cmd_replay(args: argparse.Namespace) -> int:
    from amdflash.pipeline.engine.auditdb import open_for_reading
    from amdflash.pipeline.commands.board import db_path
    from amdflash.store.queries import RunNotFound, resolve_run
    from amdflash.store.partial import with_spans
    from amdflash.store.replay import ReplayRefused, replay
    from amdflash.store.run_rows import RunUnverified, open_run

    db = open_for_reading(db_path(args))
    try:
        try:
            run_id = resolve_run(db, args.run_id)
        except RunNotFound as e:
            raise Refusal(str(e)) from None
        # The image path comes from the run's own (verified) runs row, never from a row added beside it.
        try:
            key = open_run(db.conn, run_id).key
        except RunUnverified as e:       # not replayed: named with every span that fails (store.partial)
            raise with_spans(db.conn, run_id, e) from None
        image = _image(db, key, run_id, args.image)
        board: dict[str, Any] | None = None
        listed: list[str] = []
        record: RecordFacts | None = None
        if args.from_report is not None:
            from amdflash.pipeline.cli.sim import read_report, report_options

            board, listed = report_options(args.from_report)
            record = _record_facts(db, run_id)
            report = read_report(args.from_report)
            same = _same_board(report, record)
            if same is False:
                raise Refusal(f"--from-report {args.from_report}: the report is of another board than run {run_id}'s "
                              "(its flash JEDEC id, unique ID or bridge serial differ); a fidelity check needs a "
                              "report of the run's own board")
            record.identified = bool(same)
        try:
            result = replay(db, run_id, until=args.until, image=image, board=board)
        except ReplayRefused as e:
            raise Refusal(str(e)) from None
        result.notes += [f"listed: the report's board diverges from the model: {d}" for d in listed]
        left = _registers_left(db, run_id)
        result.notes += [left] if left else []
        if record is not None:
            if not record.identified:
                result.notes.append(HASHED_ONLY if _hashed(report) else
                                    "the report cannot be matched to the run's board beyond its JEDEC id (no unique "
                                    "ID or serial in both): no divergence is taken as listed")
            explain(result, listed, record)
    finally:
        db.conn.close()
    if args.format == "json":
        print(json.dumps(result.to_json(), indent=2))
    else:
        output.result(render_text(result))
    return EXIT_OK if not result.unexplained else EXIT_FAILED


def _registers_left(db: sqlite_utils.Database, run_id: str) -> str | None:
    """The registers the run left changed (a run killed and never resumed: from its sealed
    writes), as its report says them (store.facts); None for a run that took no snapshot."""
    from amdflash.store.fact_words import left_words
    from amdflash.store.facts import registers
    from amdflash.store.run_rows import open_run

    regs = registers(db.conn, open_run(db.conn, run_id))
    return "registers " + left_words(regs) if regs["before"] is not None else None


@dataclass
class RecordFacts:
    """What the run's own (sealed) record says of its board, for matching a report to it."""

    jedec: str = ""
    unique_id: str | None = None
    serial: str | None = None
    timed_pages_off_at: set[int] = field(default_factory=set)   # units whose read-back turned it off
    identified: bool = False


def _record_facts(db: sqlite_utils.Database, run_id: str) -> RecordFacts:
    import re

    from amdflash.store.queries import first_board, stage_details
    from amdflash.store.run_rows import open_run

    rows = open_run(db.conn, run_id)
    facts = RecordFacts()
    b = first_board(db, rows, ("jedec", "unique_id", "bridge_serial"))
    if b is not None:
        facts.jedec = str(b["jedec"] or "")
        facts.unique_id = b["unique_id"] if isinstance(b["unique_id"], str) else None
        facts.serial = b["bridge_serial"] if isinstance(b["bridge_serial"], str) else None
    for detail in stage_details(db, rows, "rom_sw", "fast path"):
        found = re.match(r"timed pages: off for this board: the unit at (0x[0-9a-f]{1,8}) differed on read-back",
                         str(detail or ""))
        if found:
            facts.timed_pages_off_at.add(int(found.group(1), 16))
    return facts


HASHED_ONLY = ("the report names the board only by hashes of its unique ID and serial (unsalted: anyone who has "
               "seen them, as the line view shows them, can write them into any report); no divergence is taken as "
               "listed: make the report with --include-ids")


def _hashed(report: dict[str, Any]) -> bool:
    """Whether the report carries the board's unique ID or serial as a hash only."""
    kept = [(report.get("flash") or {}).get("unique_id"), (report.get("board") or {}).get("serial")]
    return any(isinstance(k, dict) and "sha256" in k for k in kept)


def _same_board(report: dict[str, Any], record: RecordFacts) -> bool | None:
    """Whether a hardware report is of the run's board: False when its flash JEDEC id differs, or
    its unique ID (else its bridge serial) does; True when one of those matches as a plain value;
    None when neither can be compared, or matches only as a hash: an unsalted hash of an ID is no
    proof, whoever has seen it (the line view's history shows it) can put it in another board's
    report, so only a plain ID vouches for "as listed"."""
    def compare(kept: Any, value: str | None) -> bool | None:
        if not value or not isinstance(kept, dict):
            return None
        if isinstance(kept.get("value"), str):
            return kept["value"] == value
        if isinstance(kept.get("sha256"), str):
            return None if kept["sha256"] == hashlib.sha256(value.encode()).hexdigest() else False
        return None

    if str(report["flash"]["jedec"])[:6] != record.jedec[:6]:
        return False
    uid = compare(report["flash"].get("unique_id"), record.unique_id)
    if uid is not None:
        return uid
    return compare(report["board"].get("serial"), record.serial)


PAGE_PROGRAM_LISTED = "busy: page program "


def explain(result: ReplayResult, listed: list[str], record: RecordFacts) -> None:
    """The divergences a hardware report of the run's own board accounts for. One kind only: a
    unit whose read-back differed once and verified when written again (`transient`), where the
    run's record shows the driver's timed page programs turned off by that very read-back, and
    the report lists the chip's page program as taking other times than the model — consistent
    with page programs the chip did not take while still busy (the replay board is never busy).
    Consistent with, not proven: a weak cell that took on the retry looks the same to the record.
    Anything else stays a divergence, as does everything when the report cannot be matched to
    the run's board."""
    busy = [d for d in listed if d.startswith(PAGE_PROGRAM_LISTED)]
    if not busy or not record.identified:
        return
    for d in result.divergences:
        if d.transient and d.unit in record.timed_pages_off_at:
            d.explained_by = ("consistent with page programs the chip did not take while still busy: the run turned "
                              "timed pages off at this unit's read-back, the unit verified when written again, and "
                              "the report lists " + "; ".join(busy))


def _image(db, key: int, run_id: str, given: Path | None) -> bytes | None:
    """The run's image: --image (must match the run), else the recorded path if it still matches."""
    from amdflash.store.queries import run_row

    run = run_row(db, key)
    if given is not None:
        try:
            data = given.read_bytes()
        except OSError as e:
            raise Refusal(f"cannot read image {given}: {e.strerror}") from None
        if hashlib.sha256(data).hexdigest() != run["image_sha256"]:
            raise Refusal(f"image {given} is not the image of run {run_id}")
        return data
    if not run["image_path"]:
        return None
    try:
        return Path(run["image_path"]).read_bytes()   # store.replay ignores it unless its hash matches
    except OSError:
        return None


def render_text(r) -> str:
    sr1, sr2, sr3 = r.status_registers
    lines = [
        f"replay     run {r.run_id} ({r.command}, {r.status}) on a temporary emulated board (ideal profile)",
        f"start      backup of {r.units_backed_up} units, \"before\" register snapshot, "
        f"SR1={sr1:02x} SR2={sr2:02x} SR3={sr3:02x}",
        f"applied    {r.writes_applied} of {r.writes_total} register writes"
        + (f" (--until {r.until})" if r.until is not None else ""),
        f"verifies   {r.verifies_checked} checked, {r.verifies_matching} match the record"
        + (f", {r.verifies_excluded} excluded (units not backed up)" if r.verifies_excluded else ""),
    ]
    if r.result_matches is not None:
        lines.append(f"result     replayed sha256 {r.replay_sha256} "
                     f"{'matches' if r.result_matches else 'differs from'} the recorded {r.result_sha256}")
    for note in r.notes:
        lines.append(f"note       {note}")
    explained = [d for d in r.divergences if d.explained_by is not None]
    for d in explained:
        lines.append(f"as listed  unit {d.unit:#08x} (verify row seq {d.verify_seq}): {d.explained_by}")
    unexplained = r.unexplained
    if not unexplained:
        lines.append("identical  the replay reproduces every recorded outcome"
                     + (" but those the hardware report lists" if explained else ""))
        return "\n".join(lines)
    first = unexplained[0]
    lines.append(f"DIVERGED   {len(unexplained)} divergence{'s' if len(unexplained) != 1 else ''}"
                 f"{' not listed' if explained else ''}; the first:")
    where = []
    if first.verify_seq is not None:
        where.append(f"verify row seq {first.verify_seq} (attempt {first.attempt})")
    if first.after_write_n is not None:
        where.append(f"after register write {first.after_write_n} (seq {first.after_write_seq})")
    else:
        where.append("before the first register write")
    lines.append("  at       " + ", ".join(where))
    if first.unit is not None:
        lines.append(f"  unit     {first.unit:#08x}")
    if first.address is not None:
        lines.append(f"  byte     {first.address:#08x}: recorded {first.recorded_byte:#04x}, "
                     f"replayed {first.replayed_byte:#04x}")
    else:
        lines.append("  byte     not pinned: the record holds only the read-back's hash there")
    lines.append(f"  why      {first.detail}")
    return "\n".join(lines)

