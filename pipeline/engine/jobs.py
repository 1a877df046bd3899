"""The board commands as jobs: each a graph of stages over one board.

Checks that need no board (image size and magic, --yes) happen in the CLI before any run
starts; checks that need the board (identity, protection) happen here before the first
destructive stage. A failed check is a `Refusal`: exit 2, nothing written to the flash.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Callable

import anyio

from amdflash.pipeline.engine import board_report, next_step, output_files as outputs
from amdflash.pipeline.engine.board_report import BoardReport
from amdflash.pipeline.errors import Refusal
from amdflash.pipeline.engine.runner import RunInfo, say_now, stage
from amdflash.stages.image import part_check
from amdflash.stages.confirm import Expectation, confirm_whole
from amdflash.stages.device import Device, Interrupted
from amdflash.stages.drivers.flash import write_policy
from amdflash.stages.drivers.flash.spinor import BUSY_MARGIN, FlashIdentity
from amdflash.stages.identify import identity_lines, open_engine, record_chip_facts, record_identity
from amdflash.stages.drivers.navi31 import aperture
from amdflash.stages.drivers.navi31.psp import PspMailbox
from amdflash.stages.drivers.navi31.romsw import RomSwOptions
from amdflash.stages.drivers.flash.geometry import FLASH_SIZE, UNIT
from amdflash.stages.plan import PlanSummary
from amdflash.stages.snapshot import (UnitRead, file_sha256, keep, partial_path, read_backup, read_checks,
                                      read_identity, read_unit, write_backup)
from amdflash.stages.verify import first_mismatch, record_verify
from amdflash.store.reading import TrailSource
from amdflash.store.originals import Backup, BoardHistory, BoardKey, board_history, original_units
from amdflash.stages.files import new_file, write_new


@dataclass
class EngineOptions:
    prescale: int = 8
    rx_mode: str = "chained"
    restore_each: bool = False
    reads: int = 2            # agreeing reads that confirm a kept byte (1: unconfirmed)
    # --hardware-report FILE: the board's report (busy limits, protection reading), checked
    # against the board at identification; loaded (and refused if unusable) before the run.
    hardware_report: Path | None = None
    board_report: BoardReport | None = field(default=None, compare=False, repr=False)

    def romsw(self) -> RomSwOptions:
        return RomSwOptions(prescale=self.prescale, rx_mode=self.rx_mode,  # type: ignore[arg-type]
                            restore_each=self.restore_each)


async def identify(dev: Device, engine: EngineOptions, info: RunInfo) -> FlashIdentity:
    note_read_policy(dev, engine.reads)
    stage(dev.recorder, "identify", "start")
    await dev.call(open_engine, dev, engine.romsw())
    ident = await dev.call(read_identity, dev, engine.reads)
    report = engine.board_report
    if report is not None:
        # Before the chip facts are recorded and anything is decided: the board's own measurements.
        ident, reading, words = board_report.apply(report, ident, dev.identity.serial)
        assert dev.nor is not None
        dev.nor.chip, dev.nor.busy_limits = ident.chip, dict(report.busy)
        stage(dev.recorder, "identify", "hardware report", words)
    else:
        reading = board_report.reading_words(ident)
    dev.protection_reading = reading
    record_chip_facts(dev, ident)
    stage(dev.recorder, "identify", "end", f"{ident.chip.name} uid {ident.unique_id.hex()}")
    stranded = dev.stranded
    if stranded is not None and stranded.unique_id and stranded.unique_id != ident.unique_id.hex():
        # Matched by bridge/board serial before the flash could be read: say if the flash differs.
        warning = (f"warning: the registers put back were recorded by run {stranded.run_id} on a flash with "
                   f"unique ID {stranded.unique_id}; this flash's is {ident.unique_id.hex()}")
        stage(dev.recorder, "identify", "warning", warning)
        info.output.append(warning)
    return ident


def note_read_policy(dev: Device, reads: int) -> None:
    """The run's arguments record --reads; the summary records what the reads found."""
    read_checks(dev).reads = reads


def finish_reads(dev: Device, info: RunInfo, summary: dict[str, Any]) -> dict[str, Any]:
    """Flag the board in the output and the run summary when its reads disagreed."""
    checks = read_checks(dev)
    warning = checks.warning()
    if warning:
        info.output.append(warning)
    return {**summary, "reads": checks.summary()}


def describe_identity(dev: Device, ident: FlashIdentity) -> list[str]:
    idt = dev.identity
    serial = f" serial {idt.serial}" if idt.serial else ""
    return [f"board       {idt.spec}{serial}{' (emulated)' if idt.extra.get('emulated') else ''}",
            *identity_lines(ident)]


# -- read-only jobs ---------------------------------------------------------------------------

@dataclass
class InfoJob:
    engine: EngineOptions

    async def __call__(self, dev: Device, info: RunInfo) -> dict[str, Any]:
        ident = await identify(dev, self.engine, info)
        info.output += describe_identity(dev, ident)
        info.output.append(f"reading     {dev.protection_reading}")
        if self.engine.board_report is not None:
            limits = ", ".join(f"{op:02X}h {s:g} s" for op, s in sorted(self.engine.board_report.busy.items()))
            info.output.append(f"busy        limits: the datasheet maximum or this board's measured one, the "
                               f"larger, × {BUSY_MARGIN:g} (measured: {limits or 'none'})")
        return finish_reads(dev, info, {"jedec": ident.jedec_capture.hex(), "unique_id": ident.unique_id.hex()})


@dataclass
class ReadJob:
    engine: EngineOptions
    address: int
    size: int
    output: Path | None
    overwrite: bool = False

    async def __call__(self, dev: Device, info: RunInfo) -> dict[str, Any]:
        await identify(dev, self.engine, info)
        stage(dev.recorder, "read", "start", f"{self.address:#x}+{self.size:#x}")
        chunks = []
        done = 0
        for address in range(self.address, self.address + self.size, UNIT):
            dev.stop.check()
            n = min(UNIT, self.address + self.size - address)
            chunks.append(await dev.call(read_unit, dev, address, n, self.engine.reads, "read", at=("read", address)))
            done += n
            dev.progress("read", done, self.size)
        data = b"".join(chunks)
        read_checks(dev).record(dev, "read")
        stage(dev.recorder, "read", "end")
        sha = hashlib.sha256(data).hexdigest()
        if self.output:
            write_new(self.output, data, overwrite=self.overwrite)
            info.output.append(f"wrote {self.output} ({len(data):#x} bytes) sha256={sha}")
        else:
            info.output += [data[i:i + 32].hex() for i in range(0, len(data), 32)]
        return finish_reads(dev, info, {"result_sha256": sha if (self.address, self.size) == (0, FLASH_SIZE) else None})


@dataclass
class DumpJob:
    engine: EngineOptions
    output: Path
    via: str = "rom-sw"
    overwrite: bool = False

    async def __call__(self, dev: Device, info: RunInfo) -> dict[str, Any]:
        # The output may name the board's serial, known now that the board is open.
        self.output = outputs.with_serial(self.output, dev.identity.serial)
        outputs.claim(self.output, str(info.spec))
        if self.via == "aperture":
            return await self._aperture(dev, info)
        await identify(dev, self.engine, info)
        stage(dev.recorder, "dump", "start")
        digest = hashlib.sha256()
        # Whole or not at all; nothing planted is followed.
        with new_file(self.output, overwrite=self.overwrite) as f:
            for i, address in enumerate(range(0, FLASH_SIZE, UNIT)):
                dev.stop.check()
                data = await dev.call(read_unit, dev, address, UNIT, self.engine.reads, "dump",
                                      at=("dump", address))
                f.write(data)
                digest.update(data)
                dev.progress("dump", i + 1, FLASH_SIZE // UNIT)
        sha = digest.hexdigest()
        read_checks(dev).record(dev, "dump")
        dev.recorder.add("backups", sha256=sha, size=FLASH_SIZE, path=str(self.output.resolve()), at=None)
        stage(dev.recorder, "dump", "end", sha)
        info.output.append(f"wrote {self.output} ({FLASH_SIZE:#x} bytes via ROM_SW) sha256={sha}")
        return finish_reads(dev, info, {"result_sha256": sha, "path": str(self.output)})

    async def _aperture(self, dev: Device, info: RunInfo) -> dict[str, Any]:
        """The aperture reads only the whole flash at once: confirmation reads it whole
        `reads` times (and again while some unit disagrees) and votes per 4 KiB unit."""
        note_read_policy(dev, self.engine.reads)
        stage(dev.recorder, "dump", "start", "via ROM aperture")
        passes = 0

        def page_done(done: int, total: int) -> None:
            dev.progress(f"aperture read {passes}", done, total)
            dev.stop.check()   # a safe point: registers are restored by the driver on the way out

        def whole() -> bytes:
            nonlocal passes
            passes += 1
            return aperture.dump(dev.bar, page_done).data

        def run() -> bytes:
            checks = read_checks(dev)
            if self.engine.reads <= 1:
                data = whole()
                for address in range(0, FLASH_SIZE, UNIT):
                    checks.note("aperture dump", address, UNIT, 0, 1, None)
                return data
            units = confirm_whole(whole, FLASH_SIZE, UNIT, self.engine.reads, checks.noise)
            kept = b"".join(keep(dev, unit, "aperture dump") for unit in units)
            for unit in units:
                checks.note("aperture dump", unit.address, UNIT, 0, 1, None)
            return kept

        try:
            data = await dev.call(run)
        except aperture.RawUnavailable as e:
            raise Refusal(f"{e}; dump through the ROM_SW engine instead (--via rom-sw)") from None
        read_checks(dev).record(dev, "aperture dump")
        aperture.check_raw_dump(data)
        sha = hashlib.sha256(data).hexdigest()
        write_new(self.output, data, overwrite=self.overwrite)
        dev.recorder.add("backups", sha256=sha, size=FLASH_SIZE, path=str(self.output.resolve()), at=None)
        stage(dev.recorder, "dump", "end", sha)
        info.output.append(f"wrote {self.output} ({FLASH_SIZE:#x} bytes via ROM aperture) sha256={sha}")
        return finish_reads(dev, info, {"result_sha256": sha, "path": str(self.output)})


class VerifyMismatch(RuntimeError):
    def __init__(self, message: str, address: int):
        super().__init__(message)
        self.address = address


@dataclass
class VerifyJob:
    engine: EngineOptions
    image: bytes

    async def __call__(self, dev: Device, info: RunInfo) -> dict[str, Any]:
        await identify(dev, self.engine, info)
        stage(dev.recorder, "verify", "start")
        expected = Expectation(self.image)
        digest = hashlib.sha256()
        first = None
        bad = 0
        try:
            for i, address in enumerate(range(0, FLASH_SIZE, UNIT)):
                dev.stop.check()
                got = await dev.call(read_unit, dev, address, UNIT, self.engine.reads, "verify", expected,
                                     at=("verify", address))
                digest.update(got)
                mm = record_verify(dev, address, UNIT, got, self.image[address:address + UNIT], 1)
                if mm:
                    bad += 1
                    first = first or mm
                dev.progress("verify", i + 1, FLASH_SIZE // UNIT)
        finally:
            read_checks(dev).record(dev, "verify")
        sha = digest.hexdigest()
        if first:
            stage(dev.recorder, "verify", "fail", f"{bad} units differ")
            raise VerifyMismatch(f"verify mismatch at {first.address:#08x}: flash={first.flash_byte:02x} "
                                 f"image={first.image_byte:02x} ({bad} of {FLASH_SIZE // UNIT} units differ)",
                                 first.address)
        stage(dev.recorder, "verify", "end")
        info.output.append(f"verified {FLASH_SIZE:#x} bytes: flash equals the image, sha256={sha}")
        return finish_reads(dev, info, {"result_sha256": sha})


# -- flashing ---------------------------------------------------------------------------------

@dataclass
class FlashJob:
    engine: EngineOptions
    image: bytes
    start_sector: int = 0
    sector_count: int = FLASH_SIZE // UNIT
    clear_cmp: bool = False
    retries: int = 2
    backup_dir: Path | None = None
    # Resume: units an earlier run verified. They are read again all the same (something may
    # have written the board since), and said so if they changed.
    previously_verified: frozenset[int] = field(default_factory=frozenset)
    resuming: bool = False
    expected_identity: dict[str, str] | None = None                  # resume: must match
    # Resume: the runs from the original flash to this one, and where their record is: the
    # original content of each unit is the first backup any of them recorded.
    lineage: tuple[str, ...] = ()
    db_path: str | None = None
    trail: TrailSource = field(default=None, init=False)     # what it read the board's history through
    part_policy: part_check.PartPolicy = field(default_factory=part_check.PartPolicy)
    unknown_chip_ok: bool = False     # a part known only from its SFDP may be written from its SFDP facts
    # A board whose last flash never finished is refused unless this says to start a new one.
    start_over: bool = False

    @property
    def addresses(self) -> list[int]:
        return [s * UNIT for s in range(self.start_sector, self.start_sector + self.sector_count)]

    async def __call__(self, dev: Device, info: RunInfo) -> dict[str, Any]:
        ident = await identify(dev, self.engine, info)
        self._check_identity(dev, ident)
        history = await self._check_unfinished(dev, ident, info)
        if not self.resuming:   # is the image for this board? (a resumed run was checked when it began)
            decision = await dev.call(part_check.check_flash, dev, self.image, self.part_policy)
            if decision.refusal:
                raise Refusal(decision.refusal)
        await self._check_protection(dev, ident)
        addresses = self.addresses
        clock0 = dev.clock.now()
        summary = PlanSummary()
        chip = ident.chip
        n = len(addresses)

        # The whole backup is read (confirmed), recorded and stored durably before the first
        # erase: the board's original content survives whatever happens next.
        stage(dev.recorder, "backup", "start")
        expected = Expectation(self.image)
        units = await read_backup(dev, addresses, UNIT, self.engine.reads, expected)
        if len(units) < n:
            stage(dev.recorder, "backup", "fail", f"stopped after {len(units)} of {n} units")
            raise Interrupted(dev.stop.reason or "interrupted")
        if self.backup_dir:
            kept = await self._store_backup(dev, units, history, str(info.spec))
            info.output.append(kept)
            say_now(info, kept)     # now: a run killed from here on printed nothing else that names it
        stage(dev.recorder, "backup", "end")

        # Backup -> plan -> erase -> program -> verify, through bounded queues: pipeline/engine/flash_graph.py
        # (imported by the flash that runs it: `info`, `dump` and `verify` never load the write stages).
        from amdflash.pipeline.engine.flash_graph import run_flash_graph

        outcome = await run_flash_graph(dev, self.image, units, chip, summary, self.retries, self.engine.reads,
                                        expected.labelled("the data written"))
        if outcome.stopped:
            raise Interrupted(dev.stop.reason or "interrupted")
        info.output += dev.notes
        changed = sorted(summary.written & self.previously_verified)
        if changed:
            info.output.append(f"{len(changed)} unit(s) verified by an earlier run had changed since and were "
                               f"rewritten (first at {changed[0]:#08x}): something else wrote this board")
        counts = summary.counts
        erases = ", ".join(f"{c}×{s // 1024}K" for s, c in sorted(summary.erases.items(), reverse=True)) or "none"
        info.output.append(
            f"flashed {len(self.addresses)} units: {counts['skip']} already equal, "
            f"{counts['program']} programmed without erase, {counts['erase']} erased+programmed "
            f"(erases: {erases}); retries {outcome.retries}; "
            f"{dev.clock.now() - clock0:.2f} s on the board's clock")
        whole = self.start_sector == 0 and self.sector_count == FLASH_SIZE // UNIT
        return finish_reads(dev, info, {
            "units": counts, "erases": summary.erases,
            "result_sha256": hashlib.sha256(self.image).hexdigest() if whole else None})

    async def _check_unfinished(self, dev: Device, ident: FlashIdentity, info: RunInfo) -> BoardHistory | None:
        """What the trail knows of this board: its original, and a flash of it that never
        finished — which a new flash (not a resume) refuses unless told to start over,
        before anything is written."""
        trail = info.trail or self.db_path     # the command's trail; a path for a job run alone
        if not trail:
            return None
        self.trail = trail
        key = BoardKey(ident.unique_id.hex(), ident.chip.name, str(info.spec))
        history = await anyio.to_thread.run_sync(board_history, trail, key, dev.recorder.run_id)
        gone = history.unfinished
        if gone is not None and not self.start_over and not self.resuming:
            raise Refusal(f"{unfinished_words(gone, history)}. Finish it: "
                          f"{dev.suggest('resume', '--board', str(info.spec), '--yes', args=[gone.run_id])}; "
                          "or start a new flash anyway: the same command with --start-over")
        return history

    async def _store_backup(self, dev: Device, units: list[UnitRead], history: BoardHistory | None = None,
                            spec: str = "") -> str:
        """Write the content as found, fsynced, and record it; returns a line for the operator.

        A fresh run's backup is what it just read. A resume's is, per unit, the first backup
        recorded by any run of its lineage (checked against its hash), or — for units no
        earlier run read, which nothing can have touched — what it just read; an intact
        backup file of the lineage is kept as it is."""
        assert self.backup_dir is not None
        run_id = dev.recorder.run_id
        content = [u.data for u in units]
        how = ""
        if self.resuming and self.lineage:
            recorded = await anyio.to_thread.run_sync(original_units, self.trail, list(self.lineage),
                                                      [u.address for u in units])
            for rid in self.lineage:
                partial_path(self.backup_dir, rid).unlink(missing_ok=True)
            for file_sha, file_path in recorded.files:
                if file_sha256(Path(file_path)) == file_sha:
                    kept = Backup(self.lineage[0], file_path, file_sha, len(units) * UNIT, self.start_sector)
                    return await self._say_backup(dev, kept, history, spec, " (kept, verified)")
            content = [recorded.units.get(u.address, u.data) for u in units]
            how = " (rebuilt from the recorded units)"
        sha, size, path = await anyio.to_thread.run_sync(write_backup, self.backup_dir, run_id, content)
        dev.recorder.add("backups", sha256=sha, size=size, path=str(path), at=None)
        return await self._say_backup(dev, Backup(run_id, str(path), sha, size, self.start_sector), history, spec, how)

    async def _say_backup(self, dev: Device, mine: Backup, history: BoardHistory | None, spec: str, how: str) -> str:
        """Record which backup holds the board's original (one stages row a run, sealed with
        it) and say it: a backup that holds units an unfinished flash wrote is the content
        as found, never the original; each with the command that writes it back."""
        first = history.first if history is not None else None
        original = first if first is not None and first.sha256 != mine.sha256 else mine
        gone = history.unfinished if history is not None and not self.resuming else None
        stage(dev.recorder, "backup", "original", json.dumps({
            "original": {"run_id": original.run_id, "path": original.path, "sha256": original.sha256},
            "this_backup": "original" if original is mine else "content as found",
            "unfinished": {"run_id": gone.run_id, "units_written": gone.written} if gone else None}))
        await dev.call(dev.recorder.durable)
        put_back = f"to put it back: {restore_command(mine, spec, dev.suggest)}"
        if original is mine:
            return f"backup of the original content: {mine.path}{how}; {put_back}"
        found = f" ({unfinished_words(gone, None, short=True)})" if gone else ""
        by = f" by run {mine.run_id}" if self.resuming else ""
        return (f"backup of the content as found{by}: {mine.path}{how}{found}; {put_back}; the board's original: "
                f"{original.path} (run {original.run_id}; to put it back: "
                f"{dev.suggest('restore-original', '--board', spec, '--yes')})")

    def _check_identity(self, dev: Device, ident: FlashIdentity) -> None:
        want = self.expected_identity
        if not want:
            return
        have = {"unique_id": ident.unique_id.hex(), "jedec_chip": ident.chip.name,
                "bridge_serial": dev.identity.serial or ""}
        for key, value in want.items():
            if value and have.get(key) != value:
                raise Refusal(f"this is not the board of the run being resumed: {key} is {have.get(key)!r}, "
                              f"the run recorded {value!r}")

    async def _check_protection(self, dev: Device, ident: FlashIdentity) -> None:
        lo, hi = self.addresses[0], self.addresses[-1] + UNIT
        current = ident.protection
        # The chip table's part, or one known only from its SFDP (--unknown-chip-ok):
        # stages/drivers/flash/write_policy.py.
        why = write_policy.refusal(ident, lo, hi, self.clear_cmp, self.unknown_chip_ok)
        if why and self.engine.board_report is not None:
            why += f" (protection reading: {dev.protection_reading})"
        if why:
            raise Refusal(why)
        if ident.cmp and self.clear_cmp:
            stage(dev.recorder, "clear_cmp", "start", current.describe())
            # A non-volatile status write: on record before it happens, like a unit's intent.
            await dev.call(dev.recorder.durable)
            assert dev.nor is not None
            await dev.call(dev.nor.clear_cmp)
            stage(dev.recorder, "clear_cmp", "end", "SR2.CMP cleared: " + "; ".join(dev.nor.cmp_attempts))
            dev.notes.append("cleared SR2.CMP")


def place(data: bytes, start_sector: int) -> bytes:
    """A whole-flash image from a sector range's own bytes (a range flash's backup), the
    rest erased-state: only the range is written from it."""
    if len(data) == FLASH_SIZE:
        return data
    start = start_sector * UNIT
    return b"\xff" * start + data + b"\xff" * (FLASH_SIZE - start - len(data))


def restore_command(backup: Backup, spec: str, command: Callable[..., str], start_over: bool = True) -> str:
    """The command that writes `backup` back to the board it was read from: its own sectors
    (`command`: the builder that names the places, next_step.Advice.command or dev.suggest).
    With --start-over: pasted at any later time, a flash of the board left unfinished since
    (this very run, killed) must not refuse it — putting the backup back is the way out of one."""
    sectors = [] if backup.whole else ["--start-sector", str(backup.start_sector),
                                       "--sector-count", str(backup.sector_count)]
    return command("flash", *sectors, "--board", spec, "--yes", "--force",
                   *(["--start-over"] if start_over else []), args=[backup.path])


def unfinished_words(gone: Any, history: BoardHistory | None, short: bool = False) -> str:
    """A flash that never finished, in words: its run, what it wrote and, unless `short`,
    where the board's original is."""
    written = ("its record does not verify" if gone.written is None else
               f"{next_step.plural(gone.written, 'unit')} written by run {gone.run_id}")
    if short:
        return f"{written}, which did not finish"
    words = f"flash run {gone.run_id} of this board never finished ({gone.status}; {written})"
    original = history.first if history is not None else None
    if original is not None:
        return f"{words}; the board's original content: backup {original.path} (run {original.run_id})"
    return f"{words}; no backup of the board's original content is on record"


# -- PSP mailbox jobs -------------------------------------------------------------------------

@dataclass
class ProbeJob:
    async def __call__(self, dev: Device, info: RunInfo) -> dict[str, Any]:
        record_identity(dev, None)   # the transport's identity (and whether the board is emulated)
        stage(dev.recorder, "probe", "start")
        result = await dev.call(PspMailbox(dev.bar).probe)
        # The answers are the result (summary); the command line says them in words.
        stage(dev.recorder, "probe", "end")
        return {"probe": {k: list(v) for k, v in result.answers.items()}}


class RestoreJob:
    """`amdflash restore`: the work was done before the body runs (pipeline/engine/settle.py); it
    only says what it found."""

    async def __call__(self, dev: Device, info: RunInfo) -> dict[str, Any]:
        stranded = dev.stranded
        if stranded is None:
            info.output.append("no earlier run left this board's registers changed: nothing to put back")
        return {"put_back_for": stranded.run_id if stranded else None}


@dataclass
class IfwiAllJob:
    image: bytes

    async def __call__(self, dev: Device, info: RunInfo) -> dict[str, Any]:
        record_identity(dev, None)   # the transport's identity (and whether the board is emulated)
        stage(dev.recorder, "ifwi_all", "start")
        mailbox = PspMailbox(dev.bar)
        streamed = []

        def on_item(item) -> None:
            streamed.append(item)
            dev.recorder.add("stages", stage="ifwi_all", event="item",
                             detail=f"item {item.item:#x} phase {item.phase} offset {item.offset:#x} "
                                    f"size {item.size:#x}", at=None)
            dev.progress("ifwi", len(streamed), 19)
            if item.phase != 2:
                dev.stop.check()   # between items: never inside one stream

        items = await dev.call(mailbox.ifwi_all, self.image, on_item)
        stage(dev.recorder, "ifwi_all", "end", f"{len(items)} items")
        for it in items:
            info.output.append(f"streamed item {it.item:#04x} (phase {it.phase}) offset {it.offset:#08x} "
                               f"size {it.size:#x}")
        info.output.append("IFWI stream complete after the terminal item; a hard power cycle is required")
        return {"items": [it.item for it in items]}


__all__ = ["first_mismatch"]
