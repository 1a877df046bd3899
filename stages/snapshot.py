"""Stage: snapshot the registers, read the identity and the backup — every kept byte confirmed.

Reads that are kept (a dump, the backup of a unit about to be erased, a passing verify,
the flash identity) go through `read_unit` / `read_identity` with the run's read count:
at 2 or more each byte is confirmed by agreeing reads (stages.confirm), or — where the
caller knows what the unit should hold — by a proven read that returns exactly that, and
every disagreement is recorded in the audit trail (read_disagreements) whether or not it
was resolved. How each kept unit was confirmed is recorded per reading phase (a `stages`
row "reads / confirmed", `ReadChecks.record`). `reads=1` is a plain single read.

The backup is read completely before anything is erased: each unit's content goes to the
audit trail (backup_units) as it is read, and the assembled image is written, fsynced and
named by its SHA-256 beside the database before the first erase of the run.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Iterable, Sequence

from amdflash.stages.confirm import CHUNK as CHUNK_BYTES
from amdflash.stages.confirm import (Confirmation, Expectation, Noise, Ranges, UnconfirmedRead, confirm,
                                     confirm_expected)
from amdflash.stages.device import Device
from amdflash.stages.drivers.flash.spinor import FlashIdentity, SpiNor
from amdflash.stages.identify import record_identity
from amdflash.stages.drivers.navi31 import regs as R
from amdflash.stages.drivers.navi31.romsw import RomSw
from amdflash.stages.files import PRIVATE, create_new, fsync_dir, private_dir

# Everything the ROM_SW and aperture paths may touch, captured before any change.
SNAPSHOT_REGISTERS = (
    R.ROM_CNTL, R.PAGE_MIRROR_CNTL, R.ROM_STATUS, R.ROM_INDEX, R.ROM_START,
    R.ROM_SW_CNTL, R.ROM_SW_STATUS, R.ROM_SW_COMMAND,
    R.GPIOPAD_MASK, R.GPIOPAD_A, R.GPIOPAD_EN,
    R.MP0_C2PMSG_115, R.MP0_C2PMSG_116,
)


@dataclass(frozen=True)
class UnitRead:
    address: int
    data: bytes


@dataclass
class ReadChecks:
    """What the confirmed reads of one run found (kept in dev.read_checks)."""

    reads: int = 1
    disagreed: list[tuple[str, int]] = field(default_factory=list)    # (purpose, address) of each read
    unresolved: list[tuple[str, int]] = field(default_factory=list)
    noise: Noise = field(default_factory=Noise)
    # How each kept unit was confirmed, per purpose until recorded: (address, size, chunks
    # confirmed by their expected content, chunks read); and what that content was.
    units: dict[str, list[tuple[int, int, int, int]]] = field(default_factory=dict)
    matched_what: dict[str, str] = field(default_factory=dict)
    totals: dict[str, dict[str, int]] = field(default_factory=dict)   # of what was recorded

    def summary(self) -> dict[str, object]:
        return {"reads": self.reads, "confirmed": self.reads >= 2, "disagreed_reads": len(self.disagreed),
                "unresolved_reads": len(self.unresolved), "flip_rate": self.noise.rate,
                "agreeing_reads": self.noise.agreeing(self.reads), "confirmation": self.totals}

    def note(self, purpose: str, address: int, size: int, matched: int, chunks: int, what: str | None) -> None:
        units = self.units.setdefault(purpose, [])
        if units and units[-1][0] == address:
            units.pop()          # read again (a retry after a mismatch): the last read is what counts
        units.append((address, size, matched, chunks))
        if what:
            self.matched_what[purpose] = what

    def record(self, dev: Device, purpose: str) -> None:
        """One `stages` row ("reads", "confirmed") saying how each unit read for `purpose`
        since the last such row was confirmed: JSON with the counts and, per run of
        consecutive units confirmed alike, [first address, units, how, chunks matched]."""
        units = self.units.pop(purpose, [])
        if not units:
            return
        counts = {"units": len(units), "matched": 0, "agreeing": 0, "mixed": 0, "single": 0}
        runs: list[list[object]] = []
        end = None
        for address, size, matched, chunks in units:
            how = unit_confirmation(self.reads, matched, chunks)
            counts[how] += 1
            if runs and end == address and runs[-1][2] == how and runs[-1][3] == matched:
                runs[-1][1] = int(runs[-1][1]) + 1    # type: ignore[call-overload]
            else:
                runs.append([f"{address:#08x}", 1, how, matched])
            end = address + size
        total = self.totals.setdefault(purpose, {k: 0 for k in counts})
        for k, v in counts.items():
            total[k] += v
        what = self.matched_what.get(purpose)
        record_stage(dev, "reads", "confirmed", json.dumps({
            "purpose": purpose, "reads": self.reads, "matched_what": what, **counts,
            "how": {"matched": f"every chunk read once and equal to {what or 'what was expected'}, "
                               "proven to come from the chip",
                    "agreeing": "every chunk by agreeing reads (majority on disagreement)",
                    "mixed": "the chunks counted matched as 'matched', the others by agreeing reads",
                    "single": "one read per byte, not confirmed (--reads 1)"},
            "units_by_address": runs}))


    def warning(self) -> str | None:
        if not self.disagreed:
            return None
        units = [a for p, a in self.disagreed if not p.startswith("identify")]
        where = [f"{len(units)} unit(s), first at {units[0]:#08x}"] if units else []
        if len(units) < len(self.disagreed):
            where.append(f"{len(self.disagreed) - len(units)} identification read(s)")
        return (f"warning: reads of this board disagreed ({'; '.join(where)}); {len(self.unresolved)} left "
                "unresolved — an unstable cell or a noisy SPI line (each disagreement is in the audit trail: "
                "read_disagreements)")


def confirmation_note(dev: Device, purpose: str) -> str:
    """How the last unit read for `purpose` was confirmed, in words (for a unit's row)."""
    checks = read_checks(dev)
    _, _, matched, chunks = checks.units[purpose][-1]
    how = unit_confirmation(checks.reads, matched, chunks)
    what = checks.matched_what.get(purpose, "what was expected")
    return {"single": "read once, not confirmed (--reads 1)",
            "agreeing": f"confirmed by agreeing reads ({chunks} chunks)",
            "matched": f"confirmed: all {chunks} chunks read back as {what}",
            "mixed": f"confirmed: {matched} of {chunks} chunks read back as {what}, the rest by agreeing reads",
            }[how]


def unit_confirmation(reads: int, matched: int, chunks: int) -> str:
    """How a unit was confirmed: matched | agreeing | mixed | single."""
    if reads <= 1:
        return "single"
    return "matched" if matched == chunks else "mixed" if matched else "agreeing"


def read_checks(dev: Device) -> ReadChecks:
    if dev.read_checks is None:
        dev.read_checks = ReadChecks()
    return dev.read_checks


def snapshot_registers(dev: Device, label: str) -> dict[int, int]:
    values = {reg: dev.bar.read32(reg) for reg in SNAPSHOT_REGISTERS}
    record_snapshot(dev, label, values)
    return values


def record_snapshot(dev: Device, label: str, values: dict[int, int]) -> None:
    dev.recorder.add("register_snapshots", label=label,
                     registers=json.dumps({f"{k:#07x}": v for k, v in values.items()}),
                     clock=dev.clock.now())


def record_stage(dev: Device, name: str, event: str, detail: str | None = None) -> None:
    dev.recorder.add("stages", stage=name, event=event, detail=detail,
                     at=dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"))


# -- confirmed reads ---------------------------------------------------------------------------

def read_unit(dev: Device, address: int, size: int, reads: int = 1, purpose: str = "read",
              expected: Expectation | None = None, whole: bool = False, likely_equal: bool = True) -> bytes:
    """The flash bytes at [address, address+size) through ROM_SW.

    reads=1: one plain read. reads≥2: confirmed — raises UnconfirmedRead (after recording
    it) when some byte could not be confirmed; nothing unconfirmed is ever returned.
    `expected`: what the flash should hold there; a chunk read once that equals it confirms
    itself where stages.confirm allows (`whole`, `likely_equal`: see confirm_expected).
    How the unit was confirmed is noted for `ReadChecks.record`.
    """
    nor = dev.nor
    assert nor is not None and nor.chip is not None
    checks = read_checks(dev)
    if reads <= 1:
        data = nor.read(address, size)
        checks.note(purpose, address, size, 0, -(-size // CHUNK_BYTES), None)
        return data
    if address < 0 or size < 0 or address + size > nor.chip.size:
        raise ValueError(f"range {address:#x}+{size:#x} is outside the {nor.chip.size // 1024} KiB flash")

    def chain(ranges: Ranges) -> Iterable[bytes]:
        # One chain for all copies: in chained RX mode each read costs one transaction.
        return list(nor.read_ranges(ranges))

    def proven(ranges: Ranges) -> Iterable[tuple[bytes, bool]]:
        return list(nor.read_ranges_proven(ranges))

    if expected is not None and nor.spi.proves_reads:
        result = confirm_expected(proven, address, size, reads, expected, checks.noise, whole, likely_equal)
    else:
        result = confirm(chain, address, size, reads, checks.noise)
    data = keep(dev, result, purpose)
    checks.note(purpose, address, size, result.matched, result.chunks,
                expected.what if expected is not None else None)
    return data


def keep(dev: Device, result: Confirmation, purpose: str) -> bytes:
    """Record a confirmation's disagreements; return its bytes, or raise if unresolved."""
    checks = read_checks(dev)
    if result.differing or not result.resolved:
        checks.disagreed.append((purpose, result.address))
        if not result.resolved:
            checks.unresolved.append((purpose, result.address))
        dev.recorder.add("read_disagreements", address=result.address, size=result.size, purpose=purpose,
                         reads=result.reads, differing=len(result.differing), detail=result.detail(),
                         resolved=int(result.resolved), clock=dev.clock.now())
    if not result.resolved:
        raise UnconfirmedRead(result, purpose)
    return result.data


def read_identity(dev: Device, reads: int) -> FlashIdentity:
    """Identify the flash (JEDEC, SR1-3, SFDP, unique ID) with every identification read
    confirmed like a unit read: the unique ID is what later runs match this board by."""
    assert dev.romsw is not None
    ident = SpiNor(ConfirmingReads(dev, dev.romsw, reads)).identify()   # type: ignore[arg-type]
    dev.nor = SpiNor(dev.romsw, ident.chip)
    record_identity(dev, ident)
    return ident


class ConfirmingReads:
    """The ROM_SW engine, with each single read (`read`) confirmed by agreeing reads and
    its disagreements recorded; everything else goes to the engine as is."""

    def __init__(self, dev: Device, engine: RomSw, reads: int):
        self._dev, self._engine, self._reads = dev, engine, reads

    def __getattr__(self, name: str) -> object:
        return getattr(self._engine, name)

    def read(self, opcode: int, address: int = 0, address_bytes: int = 0, count: int = 1) -> bytes:
        engine = self._engine

        def again(ranges: Ranges) -> list[bytes]:
            return [engine.read(opcode, address, address_bytes, count) for _ in ranges]

        result = confirm(again, address, count, self._reads, read_checks(self._dev).noise, chunk=max(count, 1))
        return keep(self._dev, result, f"identify ({opcode:02X}h)")


# -- the backup ---------------------------------------------------------------------------------

async def read_backup(dev: Device, addresses: Sequence[int], unit: int, reads: int,
                      image: Expectation | None = None) -> list[UnitRead]:
    """Read (confirmed) and record every unit, in order. Returns fewer units than asked
    when the operator asked to stop; nothing has been erased then.

    `image`: what the flash will be written with. A unit found equal to it is confirmed by
    that match where stages.confirm allows; a unit about to change has no expectation and
    is confirmed by agreeing reads throughout. Each unit is read on the guess that it is
    like the one before (equal or not), which only decides how many reads its first chain
    takes."""
    out: list[UnitRead] = []
    likely_equal = True
    try:
        for i, address in enumerate(addresses):
            if dev.stop:
                break
            data = await dev.call(read_unit, dev, address, unit, reads, "backup", image, True, likely_equal,
                                  at=("backup", address))
            dev.recorder.add("backup_units", address=address, size=unit,
                             sha256=hashlib.sha256(data).hexdigest(), data=data)
            dev.progress("backup", i + 1, len(addresses))
            out.append(UnitRead(address, data))
            likely_equal = image is not None and data == image.image[address:address + unit]
    finally:
        read_checks(dev).record(dev, "backup")
    return out


def partial_path(backup_dir: Path, run_id: str) -> Path:
    """Where a run's backup is assembled before it is complete (removed by resume)."""
    return backup_dir / f".{run_id}.partial"


def write_backup(backup_dir: Path, run_id: str, units: Iterable[bytes]) -> tuple[str, int, Path]:
    """Write the image, fsync it, name it by its SHA-256 and fsync the directory: once this
    returns, the file survives a crash of the host. Returns (sha256, size, path)."""
    private_dir(backup_dir, tighten=True)    # flash content: the owner's alone (0700, files 0600)
    tmp = partial_path(backup_dir, run_id)
    tmp.unlink(missing_ok=True)   # a killed run's leftover (resume removes it too)
    digest = hashlib.sha256()
    size = 0
    try:
        with os.fdopen(create_new(tmp, PRIVATE), "wb") as f:
            for data in units:
                f.write(data)
                digest.update(data)
                size += len(data)
            f.flush()
            os.fsync(f.fileno())
        path = backup_dir / f"{digest.hexdigest()}.bin"
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(backup_dir)
    return digest.hexdigest(), size, path


def file_sha256(path: Path) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        return None
