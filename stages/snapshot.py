"""Stage: snapshot the registers, then read the backup unit by unit, streaming it onward.

Each unit's backup content is recorded in the audit trail (backup_units) before it is
passed on, so it is durable before the unit's intent — and before any erase of it. The
assembled image is stored content-addressed beside the database at the end.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from anyio.abc import ObjectSendStream

from amdflash.stages.device import Device
from amdflash.stages.navi31 import regs as R

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


def snapshot_registers(dev: Device, label: str) -> dict[int, int]:
    values = {reg: dev.bar.read32(reg) for reg in SNAPSHOT_REGISTERS}
    dev.recorder.add("register_snapshots", label=label,
                     registers=json.dumps({f"{k:#07x}": v for k, v in values.items()}),
                     clock=dev.clock.now())
    return values


def read_unit(dev: Device, address: int, size: int) -> bytes:
    assert dev.nor is not None
    return dev.nor.read(address, size)


class BackupFile:
    """The backup image, written as it is read and named by its SHA-256 when complete."""

    def __init__(self, backup_dir: Path):
        backup_dir.mkdir(parents=True, exist_ok=True)
        self.dir = backup_dir
        self._tmp = backup_dir / f".partial-{os.getpid()}-{id(self):x}"
        self._file = open(self._tmp, "wb")
        self._digest = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> None:
        self._file.write(data)
        self._digest.update(data)
        self.size += len(data)

    def finish(self) -> tuple[str, Path]:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        sha = self._digest.hexdigest()
        path = self.dir / f"{sha}.bin"
        os.replace(self._tmp, path)
        return sha, path

    def discard(self) -> None:
        if not self._file.closed:
            self._file.close()
        self._tmp.unlink(missing_ok=True)


async def read_backup(dev: Device, addresses: Sequence[int], unit: int, out: ObjectSendStream[UnitRead],
                      backup: BackupFile | None) -> int:
    """Read the units in order, record each, add it to the backup file, send it on.
    Returns how many were read (fewer when the operator asked to stop)."""
    async with out:
        for i, address in enumerate(addresses):
            if dev.stop:
                return i   # stop reading; what was sent drains through the later stages
            data = await dev.call(read_unit, dev, address, unit)
            dev.recorder.add("backup_units", address=address, size=unit,
                             sha256=hashlib.sha256(data).hexdigest(), data=data)
            if backup is not None:
                backup.write(data)
            dev.progress("backup", i + 1, len(addresses))
            await out.send(UnitRead(address, data))
    return len(addresses)
