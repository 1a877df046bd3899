"""The commands as plain functions with typed results, shared by the CLI and `amdflash.pipeline.api`.

Each board command checks everything that needs no board first (board specs, options,
image, output paths, the audit database) and raises Refusal before any run starts; then it
runs one audited run per board, all boards at once, and returns one result per board
(results.py). Nothing here parses arguments or prints: the CLI does that.
"""
from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ParamSpec, TypeVar
from collections.abc import Callable, Sequence

import anyio

from amdflash.pipeline.engine import amdgpu_jobs, interrupts, jobs
from amdflash.pipeline.commands import checks, run_end, transparency
from amdflash.pipeline.engine import auditdb, board_report, next_step, output_files as outputs, witnessing
from amdflash.pipeline import config
from amdflash.pipeline.errors import EXIT_INTERRUPTED, Refusal
from amdflash.pipeline.commands.resume_plan import plan_resume
from amdflash.pipeline.commands.results import (DumpResult, FlashResult, IfwiResult, InfoResult, ProbeResult,
                                                ReadResult, RunOutcome, VerifyResult)
from amdflash.pipeline.engine.runner import JobBody, RunInfo, RunResult, new_run_id, run_boards
from amdflash.stages.open_transport import BoardSpec
from amdflash.stages.image.part_check import PartPolicy
from amdflash.store.queries import RunNotFound, RunReport
from amdflash.store.verify import acting_for

EngineOptions = jobs.EngineOptions
R = TypeVar("R", bound=RunOutcome)
P = ParamSpec("P")
T = TypeVar("T")


def board_command(command: Callable[P, T]) -> Callable[P, T]:
    """A command that acts on a board: what it reads of the trail to decide (an unfinished
    flash, what a resume keeps, which backup is the original) counts as signed only under this
    host's own key, never under one the database lists beside it (store.verify.acting_for)."""
    @functools.wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        session = args[0] if args else kwargs.get("session")
        db = session.db_path if isinstance(session, Session) else None
        with acting_for(auditdb.own_key_paths(db)):
            return command(*args, **kwargs)
    return run


def default_db(named: str | None = None) -> str:
    """The audit database, by its real path: `named`, else the default (the one place this is
    decided: config.audit_db)."""
    return config.audit_db(named)


def default_db_path() -> str:
    """The default audit database's real path: a command suggested for it names no --db."""
    import os

    return os.path.realpath(config.data_dir() / "audit.sqlite")


def db_path(args: Any) -> str:
    """The audit database of a parsed command line, by its real path."""
    return config.audit_db(getattr(args, "db", None), getattr(args, "settings", None))


@dataclass(frozen=True)
class Session:
    """What every board command needs besides its own arguments."""

    boards: tuple[str, ...] = ("auto",)
    db: str | None = None
    unbind_driver: bool = False      # pci boards: unbind a bound kernel driver instead of refusing
    progress: bool = False           # show progress on stderr (the CLI's default; off for the API)
    operator: str | None = None      # who says they run this (recorded as claimed, beside the OS account)
    # The places the commands it suggests name (the command line's, from its global options);
    # None: this session's database, unless it is the default one (`say`).
    advice: next_step.Advice | None = None

    def __post_init__(self) -> None:
        checks.operator_name(self.operator)      # before any run: the trail keeps it

    @functools.cached_property
    def db_path(self) -> str:
        """Resolved once (links, relative paths): every use of the session names one file."""
        return default_db(self.db)

    def specs(self) -> list[BoardSpec]:
        return checks.board_specs(list(self.boards), self.unbind_driver)

    @functools.cached_property
    def say(self) -> next_step.Advice:
        """The places every command this session suggests names: two sessions of different
        databases in one process each name their own."""
        if self.advice is not None:
            return self.advice
        return next_step.Advice(None if self.db_path == default_db_path() else self.db_path)


@dataclass(frozen=True)
class FlashOptions:
    clear_cmp: bool = False          # allow clearing SR2.CMP (only CMP; BP bits are never changed)
    start_sector: int = 0
    sector_count: int | None = None  # default: to the end of the flash
    force: bool = False              # accept an image without the AA55AA55 signature, or another part number
    retries: int = 2                 # re-erase/program attempts per unit after a failed verify
    expect_part: str | None = None   # a blank/unreadable (bricked) board's part number, vouched for by the user
    unknown_chip_ok: bool = False    # write a flash part the chip table lacks, from its SFDP facts alone
    start_over: bool = False         # flash a board whose last flash never finished (instead of resuming it)


def _engine(engine: EngineOptions | None) -> EngineOptions:
    engine = engine or EngineOptions()
    checks.prescale(engine.prescale)
    if engine.rx_mode not in ("primed", "chained"):
        raise Refusal(f"--rx-mode {engine.rx_mode!r}: primed or chained")
    if not 1 <= engine.reads <= 9:
        raise Refusal(f"--reads {engine.reads}: 1..9 agreeing reads")
    if engine.hardware_report is not None:
        # Read and checked now, before any run: which board it is of is checked when it is identified.
        engine.board_report = board_report.load(Path(engine.hardware_report))
    return engine


def _run(session: Session, specs: list[BoardSpec], command: str, arguments: dict[str, Any],
         body: Callable[[BoardSpec, RunInfo], JobBody], result: type[R], image: bytes | None = None,
         image_path: str | None = None, flash_options: FlashOptions | None = None,
         then: Callable[[Any, list[R]], list[R]] | None = None, **extra: Any) -> list[R]:
    """One audited run per board, all at once; the audit database is checked and opened first.
    `then`: what the command adds to its results from the trail, through the reader of the reports.

    Every body is wrapped so that an `amdgpu:` board (no BAR5: the driver's psp_vbflash path)
    runs that path's job for the command, or refuses it.
    """
    if arguments.get("hardware_report") and len(specs) > 1:
        raise Refusal("--hardware-report describes one board: name only that board (one --board)")
    if arguments.get("hardware_report") and specs[0].kind == "amdgpu":
        raise Refusal(f"--hardware-report: {specs[0]} is run through the amdgpu driver, which neither polls the "
                      "flash nor decodes its protection; give the report with the board's usb: or pci: spec")
    witnesses = witnessing.configured()      # a witness setting that cannot be used refuses before any run
    writer = auditdb.open_writer(session.db_path)
    image_sha = hashlib.sha256(image).hexdigest() if image is not None else None
    # What the jobs read of earlier runs goes through the connection that prepared the database:
    # one reader for the whole run, handed down, never a path (store.reading.Trail).
    trail = auditdb.run_trail(writer, session.db_path)

    def make(spec: BoardSpec) -> tuple[JobBody, RunInfo]:
        info = RunInfo(new_run_id(), spec, command, dict(arguments), image_sha,
                       operator_claimed=session.operator, advice=session.say, trail=trail)
        return amdgpu_jobs.for_command(command, body(spec, info), image, flash_options, session.db_path), info

    try:
        try:
            runs = anyio.run(run_boards, make, specs, writer, session.progress, image_path)
            interrupts.runs_recorded()
        finally:
            writer.close()
        # The same connection, once the writer has closed the trail, for every board's report,
        # the run's end, the transparency log and what `then` adds; closed last (a writable
        # connection: it tidies the WAL away as the writer's would have).
        reader = trail.db if any(r.run_id for r in runs) else None
        return _results(session, command, result, runs, reader, witnesses, then, extra)
    finally:
        trail.close()


def _results(session: Session, command: str, result: type[R], runs: list[RunResult], reader: Any,
             witnesses: Any, then: Callable[[Any, list[R]], list[R]] | None, extra: dict[str, Any]) -> list[R]:
    reports, backups = _reports(reader, runs, session.say)
    # Each ended run's receipt and the checkpoints sealed meanwhile go into the host's
    # transparency log (pipeline.commands.transparency); its outcome rides in the summary.
    logged = transparency.record_ended(session.db_path, reports, reader)
    # Then the witnesses are asked to cosign its new tree head (engine/witnessing.py: a short
    # deadline, never the run's result); what they said rides in the summary too.
    witnessed = witnessing.at_end(session.db_path, witnesses, logged)
    results = [result(r.run_id, r.spec, command, r.status, r.exit_code, r.error, tuple(r.output),
                   {**r.summary, **({"transparency_log": logged[r.run_id]} if r.run_id in logged else {}),
                    **({"witnesses": witnessed} if witnessed and r.run_id in logged else {})},
                   reports.get(r.run_id, {}),
                   next_step.advice(reports[r.run_id], *backups.get(r.run_id, (None,)), run_id=r.run_id, spec=r.spec,
                                    say=session.say) if r.run_id in reports else None, **extra) for r in runs]
    return then(reader, results) if then is not None and reader is not None else results


def _key_list(keys: Sequence[Path] | None) -> list[Path] | None:
    return None if keys is None else list(keys)


def _report(reader: Any, run_id: str, keys: Sequence[Path] | None = None) -> RunReport:
    """A run's report object (`report --format json`), with what its confirmed reads found;
    its signatures checked against `keys` (trusted public key files) when given. A run that
    does not verify is refused (store.run_rows.RunUnverified: exit 1, naming the problem)."""
    from amdflash.store.queries import report

    return report(reader, run_id, _key_list(keys))


def _partial(reader: Any, run_id: str, keys: Sequence[Path] | None, against: Path | None,
             central: str | None = None) -> RunReport:
    """The report of a run that does not verify, marked (store.partial_report); an --against
    copy (an export, or the central record's copy, read into a temporary file) that is not a
    copy of the run that verifies is refused (exit 2)."""
    import tempfile

    from amdflash.store.partial_report import partial_report
    from amdflash.store.queries import resolve_run

    try:
        if central is None:
            return partial_report(reader, run_id, _key_list(keys), against)
        from amdflash.store.central import materialize
        from amdflash.store.central.reading import shown_url
        from amdflash.store.central.schema import CentralError

        with tempfile.TemporaryDirectory(prefix="amdflash-central-") as tmp:
            copy = Path(tmp) / "run.sqlite"
            try:
                materialize(central, resolve_run(reader, run_id), copy)
            except CentralError as e:        # no such run there, or it names runs of several hosts
                raise Refusal(f"--against {shown_url(central)}: {e}") from None
            return partial_report(reader, run_id, _key_list(keys), copy=(copy, f"the central record at "
                                                                               f"{shown_url(central)}"))
    except ValueError as e:
        raise Refusal(str(e)) from None


def _reports(reader: Any, runs: list[RunResult], say: next_step.Advice) \
        -> tuple[dict[str, dict[str, Any]], dict[str, tuple[str, str, str]]]:
    """Each run's report, and for a flash the backup of its board's original content: (path,
    the run that made it, the command that puts it back); `reader`: the command's reader of the
    trail after the run (None: no run reached it)."""

    ids = [r.run_id for r in runs if r.run_id]
    if not ids or reader is None:
        return {}, {}
    found: dict[str, dict[str, Any]] = {}
    for run_id in ids:
        try:
            found[run_id] = _report(reader, run_id)
        except RunNotFound:   # killed before its first row reached the trail
            continue
    originals = {run_id: original for run_id, rep in found.items()
                 if rep["command"] in next_step.WRITES and rep["status"] not in ("succeeded", "refused")
                 and (original := _original(reader, rep, say))}     # advice is for runs that did not succeed
    for run_id, rep in found.items():      # the keys of `report --format json`, its end included
        run_end.add(reader, rep, lambda run_id=run_id: originals.get(run_id), say)  # type: ignore[misc]
    return found, originals


def _original(db: Any, rep: dict[str, Any], say: next_step.Advice) -> tuple[str, str, str] | None:
    """The backup that holds the original content of a flash run's board (store.originals),
    with the command that puts it back even while a flash of the board is unfinished."""
    from amdflash.store.originals import BoardKey, board_history

    board = rep.get("board") or {}
    if not board.get("chip"):
        # The run never identified its board: all it knows is the spec, and an index spec
        # (usb:0) may reach another board today than the one whose original is on record.
        return None
    history = board_history(db, BoardKey(board.get("unique_id") or "", board.get("chip") or "",
                                         board.get("spec") or ""))
    first = history.first
    if first is None:
        return None
    if len(history.original) == 1:
        put_back = jobs.restore_command(first, board.get("spec") or "", say.command, start_over=True)
    else:      # range backups before the first whole one: put back in turn, in one command
        put_back = say.command("restore-original", "--board", board.get("spec") or "", "--yes")
    return first.path, first.run_id, put_back


def _engine_args(engine: EngineOptions) -> dict[str, Any]:
    report = engine.board_report.arguments if engine.board_report is not None else {}
    return {"prescale": engine.prescale, "rx_mode": engine.rx_mode, "restore_each": engine.restore_each,
            "reads": engine.reads, **report}


# -- board commands ------------------------------------------------------------------------------

@board_command
def info(session: Session, engine: EngineOptions | None = None) -> list[InfoResult]:
    """Identify the flash of every board: JEDEC, SR1-3, protection, SFDP, unique ID."""
    specs, engine = session.specs(), _engine(engine)

    def then(reader: Any, results: list[InfoResult]) -> list[InfoResult]:
        return [_with(r, lines=(*r.lines, *_unfinished(reader, r, session.say))) if r.ok else r for r in results]

    return _run(session, specs, "info", _engine_args(engine), lambda s, i: jobs.InfoJob(engine), InfoResult,
                then=then)


def _unfinished(reader: Any, result: InfoResult, say: next_step.Advice) -> list[str]:
    """A flash of this board (same flash unique ID, or same spec) that never finished: the
    operator who looks at the board after a crash learns it here, with the command that ends it.
    `reader`: the command's reader of the trail after the run."""
    from amdflash.store.queries import runs

    rows = runs(reader)
    uid = result.unique_id
    board = [r for r in rows if (uid and r["unique_id"] == uid) or r["board_spec"] == result.board]
    lines = _scratch_left(reader, board, uid, result.board, say)
    history = _board_history(reader, result)
    if history.first is not None:
        since = [r for r in history.writes if r != history.first.run_id]
        later = (f"; written since by {next_step.plural(len(since), 'flash run')}, the last {since[-1]}"
                 if since else "")
        lines.append(f"original    backup {history.first.path} (run {history.first.run_id}, "
                     f"{'intact' if history.first.intact() else 'gone or changed since'}){later}")
    gone = history.unfinished
    if gone is None:
        return lines
    original = (f"the board's original: backup {history.first.path} (run {history.first.run_id})"
                if history.first else "no backup of the board's original content is on record")
    check = say.command("audit", "verify", "--run", gone.run_id)
    said = (f"{gone.status}, {next_step.plural(gone.written, 'unit')} written" if gone.written is not None else
            f"{gone.status}; its record does not verify: {check}")
    resume = say.command("resume", "--board", result.board, "--yes", args=[gone.run_id])
    return [*lines, f"unfinished flash {gone.run_id} on this board ({said}; {original}): to finish it, {resume}"]


def _board_history(db_path: Any, result: InfoResult) -> Any:
    """What the trail knows of the identified board (store.originals: by flash unique ID and chip)."""
    from amdflash.store.originals import BoardKey, board_history

    return board_history(db_path, BoardKey(result.unique_id or "", result.chip or "", result.board))


def _scratch_left(reader: Any, board: list[dict[str, Any]], uid: str | None, spec: str,
                  say: next_step.Advice) -> list[str]:
    """Scratch blocks of this board's hardware-report runs left torn, oldest first: a block's
    first backup holds its content (a later run's backup of a torn block would hold the tear),
    until a later flash of the board that covers the block succeeded (which is how it is put back)."""
    from amdflash.store.run_rows import RunUnverified

    torn: dict[int, tuple[str, tuple[str, str]]] = {}
    unread: list[str] = []
    for r in board:
        if uid and r["unique_id"] and r["unique_id"] != uid:
            continue                           # another flash chip that was at this spec once
        if r["command"] == "flash" and r["status"] == "succeeded" and torn:
            try:
                args = _report(reader, r["run_id"])["arguments"]
            except RunUnverified:
                continue
            first, count = int(args.get("start_sector") or 0), int(args.get("sector_count") or 0)
            for block in [b for b in torn if first * 0x1000 <= b and b + 0x10000 <= (first + count) * 0x1000]:
                del torn[block]
        elif r["command"] == "hardware-report" and r["status"] != "succeeded":
            try:
                rep = _report(reader, r["run_id"])
            except RunUnverified:
                unread.append(r["run_id"])
                continue
            for block, backup in next_step.scratch_left(rep).items():
                torn.setdefault(block, (r["run_id"], backup))
    lines = [f"hardware-report {run_id} left its scratch block: "
             f"{next_step.scratch_advice(block, backup, spec, say=say)}"
             for block, (run_id, backup) in sorted(torn.items())]
    lines += [f"hardware-report {run_id} does not verify: whether it left its scratch block torn is not known"
              for run_id in unread]
    return lines


@board_command
def read(session: Session, address: int, size: int, output: Path | None = None,
         engine: EngineOptions | None = None, overwrite: bool = False) -> list[ReadResult]:
    """Read SIZE bytes at ADDRESS (to `output`, else as hex lines in the result)."""
    specs, engine = session.specs(), _engine(engine)
    checks.read_range(address, size)
    if output is not None:
        checks.writable_output(output, overwrite=overwrite, need=size)
        if len(specs) > 1:
            raise Refusal("read -o writes one file: name one board")
    arguments = {"address": address, "size": size, "output": str(output) if output else None, **_engine_args(engine)}
    return _run(session, specs, "read", arguments, lambda s, i: jobs.ReadJob(engine, address, size, output, overwrite),
                ReadResult, output=output)


@board_command
def dump(session: Session, output: Path, via: str = "rom-sw", engine: EngineOptions | None = None,
         overwrite: bool = False) -> list[DumpResult]:
    """Dump the whole 2 MiB flash of every board; a file appears only when its dump is complete,
    and never in place of an existing one unless `overwrite`."""
    specs, engine = session.specs(), _engine(engine)
    if via not in ("rom-sw", "aperture"):
        raise Refusal(f"--via {via!r}: rom-sw or aperture")
    outputs.check(output, specs)     # several boards: a template that tells their files apart
    for n, spec in enumerate(specs, 1):
        checks.writable_output(outputs.for_board(output, n, spec), "dump", overwrite, need=jobs.FLASH_SIZE)
    arguments = {"output": str(output), "via": via, **_engine_args(engine)}
    results = _run(session, specs, "dump", arguments,
                   lambda s, i: jobs.DumpJob(engine, outputs.for_board(output, specs.index(s) + 1, s), via, overwrite),
                   DumpResult)
    return [_with(r, path=Path(r.summary["path"]) if r.ok and r.summary.get("path") else None) for r in results]


def _with(result: R, **changes: Any) -> R:
    import dataclasses

    return dataclasses.replace(result, **changes)


@board_command
def verify(session: Session, image: Path, engine: EngineOptions | None = None) -> list[VerifyResult]:
    """Compare every board's whole flash with IMAGE, unit by unit."""
    specs, engine = session.specs(), _engine(engine)
    data = checks.read_image(image)
    path = str(image.resolve())
    return _run(session, specs, "verify", {"image": path, **_engine_args(engine)},
                lambda s, i: jobs.VerifyJob(engine, data), VerifyResult, data, path)


@board_command
def flash(session: Session, image: Path, options: FlashOptions = FlashOptions(),
          engine: EngineOptions | None = None, board: dict[str, str] | None = None,
          image_sha256: str | None = None) -> list[FlashResult]:
    """Write IMAGE: backup, plan, erase, program, verify; nothing is written before every check.
    IMAGE is the whole flash, or — with a sector range — that range's own bytes (a range
    flash's backup). `board`: the identity the board must have (unique_id, jedec_chip);
    `image_sha256`: what IMAGE must hash to (restore_original: the backup as recorded)."""
    specs, engine = session.specs(), _engine(engine)
    count = checks.sector_range(options.start_sector, options.sector_count)
    checks.retries(options.retries)
    raw = checks.read_image(image, range_size=count * jobs.UNIT)
    if image_sha256 is not None and hashlib.sha256(raw).hexdigest() != image_sha256:
        raise Refusal(f"backup {image} changed since it was checked (sha256 differs from the one on record)")
    data = jobs.place(raw, options.start_sector)
    checks.check_signature(data, image, options.force)
    path = str(image.resolve())
    arguments = {"image": path, "clear_cmp": options.clear_cmp, "start_sector": options.start_sector,
                 "sector_count": count, "force": options.force, "retries": options.retries,
                 "expect_part": options.expect_part, "unknown_chip_ok": options.unknown_chip_ok,
                 "start_over": options.start_over, **_engine_args(engine)}
    backups = checks.backup_folder(Path(session.db_path).absolute().parent / "backups")
    return _run(session, specs, "flash", arguments,
                lambda s, i: jobs.FlashJob(engine, data, options.start_sector, count, options.clear_cmp,
                                           options.retries, backups, expected_identity=board,
                                           db_path=session.db_path,
                                           part_policy=PartPolicy(options.force, options.expect_part),
                                           unknown_chip_ok=options.unknown_chip_ok, start_over=options.start_over),
                FlashResult, data, path, options)


@board_command
def restore_original(session: Session, engine: EngineOptions | None = None) -> list[FlashResult]:
    """Write back the content amdflash first found on the one board named: the backups of its
    first flashes (store.originals), each checked against the SHA-256 on record first, newest
    first so each unit ends as first found. A flash of the board left unfinished is started
    over (this is the way back from it)."""
    from amdflash.store.originals import board_history

    specs = session.specs()
    if len(specs) != 1 or specs[0].kind == "auto":
        raise Refusal("restore-original needs exactly one --board, as the board's earlier runs named it")
    spec = str(specs[0])
    reader = auditdb.open_reader(session.db_path)     # one reader for both: the board, then its history
    try:
        key = _known_board(reader, session.db_path, spec)
        history = board_history(reader, key)
    finally:
        reader.conn.close()
    if not history.original:
        raise Refusal(f"no backup of the original content of board {spec} is on record in {session.db_path}")
    for b in history.original:
        if not b.intact():
            raise Refusal(f"backup {b.path} (run {b.run_id}) is gone or no longer matches the sha256 on record "
                          f"({b.sha256}): refusing to write it as the board's original")
    board = {"unique_id": key.unique_id, "jedec_chip": key.chip} if key.by_uid else None
    results: list[FlashResult] = []
    for b in reversed(history.original):
        options = FlashOptions(start_sector=b.start_sector, sector_count=b.sector_count, force=True, start_over=True)
        results += flash(session, Path(b.path), options, engine, board, b.sha256)
        if not all(r.ok for r in results):
            break
    return results


@board_command
def restore_from_bundle(session: Session, original: bytes, held: Sequence[tuple[int, int]],
                        boards: set[tuple[str, str]], where: str, force: bool = False,
                        engine: EngineOptions | None = None) -> list[FlashResult]:
    """Write back the original a verified bundle carries (store.bundle.check): each range of
    units it holds by a flash run of its own, from a file in the backups folder named by its
    SHA-256 (where a resume of an interrupted one finds it). The board must be the one whose
    sealed backups the bundle holds (flash unique ID and chip) unless `force`."""
    from amdflash.stages.drivers.flash.geometry import UNIT
    from amdflash.stages.files import private_dir, write_new
    from amdflash.stages.snapshot import file_sha256
    from amdflash.store.originals import BLANK_UIDS

    specs = session.specs()
    if len(specs) != 1 or specs[0].kind == "auto":
        raise Refusal("restore-original --from-bundle needs exactly one --board: the board to write")
    board = None
    if not force:
        if len(boards) != 1:
            raise Refusal(f"bundle {where}: its backups were recorded on {len(boards)} boards, so which board it is "
                          "the original of is not known; --force writes it anyway")
        uid, chip = next(iter(boards))
        if uid in BLANK_UIDS:
            raise Refusal(f"bundle {where}: its board's flash has no unique ID to tell it from another; --force "
                          "writes it anyway")
        board = {"unique_id": uid, "jedec_chip": chip}
    if any(start % UNIT or end % UNIT for start, end in held):
        raise Refusal(f"bundle {where}: its backups are not whole {UNIT}-byte units")
    backups = checks.backup_folder(Path(session.db_path).absolute().parent / "backups")
    pieces = []
    for start, end in held:
        data = original[start:end]
        sha = hashlib.sha256(data).hexdigest()
        path = backups / f"{sha}.bin"
        if file_sha256(path) != sha:
            private_dir(backups, tighten=True)
            write_new(path, data, mode=0o600)
        pieces.append((path, start // UNIT, (end - start) // UNIT, sha))
    results: list[FlashResult] = []
    for path, start_sector, count, sha in pieces:
        options = FlashOptions(start_sector=start_sector, sector_count=count, force=True, start_over=True)
        results += flash(session, path, options, engine, board, sha)
        if not all(r.ok for r in results):
            break
    return results


def _known_board(reader: Any, db: str, spec: str) -> Any:
    """The board at `spec` as the newest run that identified it there recorded it, in a row
    its checkpoints seal: a `boards` row INSERTed without the key (a blank unique ID, which
    would make the board known by its spec alone) is not the board. `reader`: the trail at `db`."""
    from amdflash.store.originals import BoardKey
    from amdflash.store.run_rows import RunUnverified, open_run

    for uid, chip, run_id, seq in reader.conn.execute(
            "SELECT b.unique_id, b.chip, b.run_id, b.seq FROM boards b JOIN runs r ON r.run_id = b.run_id "
            "WHERE r.board_spec = ? AND b.chip IS NOT NULL ORDER BY b.seq DESC", (spec,)).fetchall():
        try:
            rows = open_run(reader.conn, str(run_id))
        except RunUnverified:
            continue
        if rows.key <= seq and not rows.unsealed(seq):
            return BoardKey(str(uid or ""), str(chip), spec)
    raise Refusal(f"no run in {db} that verifies identified a board at {spec}: its original is not known")


@board_command
def resume(session: Session, run_id: str | None = None, image: Path | None = None,
           hardware_report: Path | None = None) -> list[FlashResult]:
    """Finish an interrupted flash run of the one board named (the same board, the same image).
    `hardware_report`: the board's hardware report (--hardware-report); without it, the one
    the run was given, if its file still has the SHA-256 recorded then."""
    specs = session.specs()
    if len(specs) != 1 or (specs[0].kind == "auto" and not run_id):
        raise Refusal("resume needs exactly one --board (and a RUN_ID unless the board is named)")
    plan = plan_resume(session.db_path, specs[0], run_id, image, session.say)
    a = {k: v for k, v in plan.arguments.items() if k not in ("hardware_report", "hardware_report_sha256")}
    engine = _engine(EngineOptions(a.get("prescale", 8), a.get("rx_mode", "chained"), a.get("restore_each", False),
                                   a.get("reads", 2), hardware_report or _recorded_report(plan.arguments)))
    a.update(_engine_args(engine))
    backups = checks.backup_folder(Path(session.db_path).absolute().parent / "backups")

    def body(spec: BoardSpec, info: RunInfo) -> JobBody:
        info.resumes_run_id = plan.run_id
        return jobs.FlashJob(engine, plan.image, a["start_sector"], a["sector_count"], a["clear_cmp"],
                             a.get("retries", 2), backups, plan.verified, True, plan.identity, plan.lineage,
                             session.db_path, unknown_chip_ok=a.get("unknown_chip_ok", False))

    return _run(session, specs, "resume", {**a, "resumes": plan.run_id}, body, FlashResult, plan.image,
                plan.image_path)


def _recorded_report(arguments: dict[str, Any]) -> Path | None:
    """The hardware report a run was given, if its file is still as it was then."""
    path, sha = arguments.get("hardware_report"), arguments.get("hardware_report_sha256")
    if not isinstance(path, str) or not isinstance(sha, str):
        return None
    from amdflash.stages.snapshot import file_sha256

    return Path(path) if Path(path).is_file() and file_sha256(Path(path)) == sha else None


@board_command
def restore(session: Session) -> list[RunOutcome]:
    """Put back the registers an earlier run left changed on each board (host killed, link
    lost) — and nothing else. Every run does this first anyway (pipeline/engine/settle.py)."""
    return _run(session, session.specs(), "restore", {}, lambda s, i: jobs.RestoreJob(), RunOutcome)


@board_command
def probe(session: Session) -> list[ProbeResult]:
    """Query the PSP boot mailbox of every board (query commands only)."""
    return _run(session, session.specs(), "probe", {}, lambda s, i: jobs.ProbeJob(), ProbeResult)


@board_command
def ifwi_all(session: Session, image: Path) -> list[IfwiResult]:
    """Stream the IFWI items the PSP bootloader requests, until its terminal item."""
    specs = session.specs()
    data = checks.read_image(image)
    checks.check_signature(data, image, False)
    checks.check_ifwi(data, image)
    path = str(image.resolve())
    return _run(session, specs, "ifwi-all", {"image": path}, lambda s, i: jobs.IfwiAllJob(data), IfwiResult,
                data, path)


def exit_code(results: Sequence[RunOutcome]) -> int:
    """One exit status for several boards: interrupted, else failed, else refused, else ok."""
    codes = {r.exit_code for r in results}
    for code in (EXIT_INTERRUPTED, 1, 2):
        if code in codes:
            return code
    return 0


# -- boards and the audit trail ------------------------------------------------------------------

def list_boards(announce: Callable[[str], None]) -> list[dict[str, Any]]:
    """Every board found, with the spec to use and what its flash answers (nothing recorded)."""
    from amdflash.stages.identify import probe_flash
    from amdflash.stages.open_transport import list_boards as list_found

    return list_found(announce, probe_flash)


def runs(db: str | None = None) -> list[dict[str, Any]]:
    from amdflash.store.queries import runs as all_runs

    reader = auditdb.open_reader(default_db(db))
    try:
        return all_runs(reader)
    finally:
        reader.conn.close()


def report(run_id: str, db: str | None = None, html: bool = False,
           keys: Sequence[Path] | None = None, beside: Path | None = None,
           unverified: bool = False, against: Path | None = None,
           central: str | None = None, *, advice: next_step.Advice) -> tuple[dict[str, Any], str | None]:
    """One run's report (the `report --format json` object), and its HTML page if asked.
    `keys`: trusted public key files the run's signatures must be by; `beside`: the directory
    the page will be written into (its links lead only to pages there). `unverified`: a run
    that does not verify is reported as far as its checkpoints still vouch for it, the rest
    marked (store.partial_report: its `unverified` key), else refused (RunUnverified);
    `against`: an export of the run that names the rows that differ; `central`: the URL of a
    central record whose copy of the run does so. `advice`: the places the commands its end
    suggests name (next_step.BARE for a run of another host)."""
    from amdflash.store.keys import KeyError_
    from amdflash.store.partial import with_spans
    from amdflash.store.queries import resolve_run
    from amdflash.store.run_rows import RunUnverified
    from amdflash.store.verify import snapshot

    reader = auditdb.open_reader(default_db(db))
    try:
        with snapshot(reader.conn):     # the page reads what the report verified, nothing newer
            try:
                try:
                    rep = _report(reader, run_id, keys)
                except RunUnverified as e:
                    if not unverified:     # named with every failing span, and where the rest is seen
                        raise with_spans(reader.conn, resolve_run(reader, run_id), e, _key_list(keys)) from None
                    rep = _partial(reader, run_id, keys, against, central)
            except (RunNotFound, KeyError_) as e:
                raise Refusal(str(e)) from None
            if rep.get("unverified") is not None:
                # Nothing to advise: a resume or restore refuses a run that does not verify.
                rep.update(fixed_by=rep.get("finished_by"), superseded_by=None,
                           registers_put_back=run_end.put_back_words(rep), outcome=None)
            else:
                # What the run left and the way out, as its command line said it (pipeline.run_end).
                run_end.add(reader, rep, lambda: _original(reader, rep, advice), advice)
            page = None
            if html:
                from amdflash.store.html import render

                page = render(reader, rep, beside)
        return rep, page
    finally:
        reader.conn.close()


def audit_verify(db: str | None = None, run: str | None = None, keys: Sequence[Path] | None = None,
                 anchor: Path | None = None) -> Any:
    """Recompute the chains and check every checkpoint (of the database, or of one run); the
    result says whether it holds and, if not, what breaks it first. `keys`: the trusted public
    keys every signature must be by; `anchor`: the anchor file (default beside the database)."""
    from amdflash.store.keys import KeyError_
    from amdflash.store.queries import resolve_run
    from amdflash.store.verify import verify_database, verify_run
    from amdflash.store.writer.database import default_anchor

    path = default_db(db)
    if anchor is not None and not anchor.exists():
        raise Refusal(f"no anchor file at {anchor}")
    if anchor is not None and not anchor.is_file():
        raise Refusal(f"anchor {anchor} is not a regular file")
    reader = auditdb.open_reader(path)
    try:
        if run:
            try:
                return verify_run(reader.conn, resolve_run(reader, run), _key_list(keys))
            except RunNotFound as e:
                raise Refusal(str(e)) from None
        return verify_database(reader.conn, _key_list(keys), anchor or default_anchor(path))
    except KeyError_ as e:
        raise Refusal(str(e)) from None
    finally:
        reader.conn.close()
