"""Stage: snapshot the registers, read the identity and the backup — every kept byte confirmed.

Reads that are kept (a dump, the backup of a unit about to be erased, a passing verify,
the flash identity) go through `read_unit` / `read_identity` with the run's read count:
at 2 or more each byte is confirmed by agreeing reads (stages.confirm), and every
disagreement is recorded in the audit trail (read_disagreements) whether or not it was
resolved. `reads=1` is a plain single read.

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

from amdflash.stages.confirm import Confirmation, Noise, Ranges, UnconfirmedRead, confirm
from amdflash.stages.device import Device
from amdflash.stages.flash.spinor import FlashIdentity, SpiNor
from amdflash.stages.identify import record_identity
from amdflash.stages.navi31 import regs as R
from amdflash.stages.navi31.romsw import RomSw
from amdflash.stages.files import PRIVATE, create_new, private_dir

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
    """What the confirmed reads of one run found (kept in dev.extra['read_checks'])."""

    reads: int = 1
    disagreed: list[tuple[str, int]] = field(default_factory=list)    # (purpose, address) of each read
    unresolved: list[tuple[str, int]] = field(default_factory=list)
    noise: Noise = field(default_factory=Noise)

    def summary(self) -> dict[str, object]:
        return {"reads": self.reads, "confirmed": self.reads >= 2, "disagreed_reads": len(self.disagreed),
                "unresolved_reads": len(self.unresolved), "flip_rate": self.noise.rate,
                "agreeing_reads": self.noise.agreeing(self.reads)}

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


def read_checks(dev: Device) -> ReadChecks:
    return dev.extra.setdefault("read_checks", ReadChecks())


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

def read_unit(dev: Device, address: int, size: int, reads: int = 1, purpose: str = "read") -> bytes:
    """The flash bytes at [address, address+size) through ROM_SW.

    reads=1: one plain read. reads≥2: confirmed — raises UnconfirmedRead (after recording
    it) when some byte could not be confirmed; nothing unconfirmed is ever returned.
    """
    nor = dev.nor
    assert nor is not None and nor.chip is not None
    if reads <= 1:
        return nor.read(address, size)
    if address < 0 or size < 0 or address + size > nor.chip.size:
        raise ValueError(f"range {address:#x}+{size:#x} is outside the {nor.chip.size // 1024} KiB flash")

    def chain(ranges: Ranges) -> Iterable[bytes]:
        # One chain for all copies: in chained RX mode each read costs one transaction.
        return list(nor.read_ranges(ranges))

    return keep(dev, confirm(chain, address, size, reads, read_checks(dev).noise), purpose)


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

async def read_backup(dev: Device, addresses: Sequence[int], unit: int, reads: int) -> list[UnitRead]:
    """Read (confirmed) and record every unit, in order. Returns fewer units than asked
    when the operator asked to stop; nothing has been erased then."""
    out: list[UnitRead] = []
    for i, address in enumerate(addresses):
        if dev.stop:
            break
        data = await dev.call(read_unit, dev, address, unit, reads, "backup", at=("backup", address))
        dev.recorder.add("backup_units", address=address, size=unit,
                         sha256=hashlib.sha256(data).hexdigest(), data=data)
        dev.progress("backup", i + 1, len(addresses))
        out.append(UnitRead(address, data))
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
    fd = os.open(backup_dir, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return digest.hexdigest(), size, path


def file_sha256(path: Path) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        return None
