"""Jobs on a healthy board through the amdgpu driver: info, flash (a PSP update), verify.

These are not ROM_SW jobs: there are no registers, no erase units and no byte-by-byte plan.
`flash` hands the whole IFWI to the PSP, which writes the partition it chooses; `verify`
therefore compares partition payloads (and, failing a flash dump, the running VBIOS), never
raw bytes. The runner records them like any run: run, stages, errors, outcome.

`ByTransport` picks the body when the board is open, by the capability opening it declared
(Device.capability), so `auto` can land on either path.

`flash` never hands the PSP bytes it did not stage in this run. The driver's psp_vbflash
buffer adds up every write across opens until a trigger or an overflow (transport/amdgpu.py),
so before staging the job establishes it is empty: a psp_vbflash_status other than 0 proves
it (the last thing that happened to it was a trigger, which freed it); otherwise it may hold
a staging — left by a run whose trail shows it staged in this boot and never triggered, or by
anything else — and is emptied by the kernel's overflow rule first (stages row
`psp_vbflash`/`cleared`). When it cannot be emptied, the run is refused, saying what to do.
"""
from __future__ import annotations

import hashlib
import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from amdflash.pipeline.errors import Refusal
from amdflash.pipeline.engine.runner import JobBody, RunInfo, now_iso, stage
from amdflash.stages.image import part_check
from amdflash.stages.image.atom import BytesSource
from amdflash.stages.device import Device
from amdflash.stages.drivers.flash.geometry import FLASH_SIZE
from amdflash.stages.image.part_check import BoardPart, PartPolicy
from amdflash.stages.image.partitions import LayoutError, read_layout
from amdflash.stages.transport.amdgpu import NOT_STARTED, AmdgpuBoard, VbflashError, VbiosInfo
from amdflash.store.reading import TrailSource, reading
from amdflash.store.schema import SchemaError

PSP_NOTE = ("this was a PSP update through amdgpu: the PSP chose the partition it wrote, so the flash is not a "
            "byte-for-byte copy of the image; the board runs the new firmware after a reboot, and 'verify' compares "
            "partition payloads")
ELSEWHERE = "use the USB bridge, or pci:{address} --unbind-driver, for the ROM_SW path"


def board_of(dev: Device) -> AmdgpuBoard:
    board = dev.amdgpu
    assert board is not None, "an amdgpu job runs only on a board opened through the amdgpu driver"
    return board


@dataclass
class ByTransport:
    """One command, two bodies: through BAR5 (ROM_SW, aperture, PSP mailbox) or through amdgpu."""

    command: str
    bar5: JobBody
    amdgpu: JobBody | None

    async def __call__(self, dev: Device, info: RunInfo) -> dict[str, Any]:
        if dev.capability == "bar5":
            return await self.bar5(dev, info)
        if self.amdgpu is None:
            raise Refusal(f"'{self.command}' needs BAR5, which an amdgpu: board does not offer (the kernel driver "
                          f"owns it); {ELSEWHERE.format(address=dev.identity.pci_address)}")
        return await self.amdgpu(dev, info)


def for_command(command: str, body: JobBody, image: bytes | None, flash: Any = None,
                db_path: str | None = None) -> ByTransport:
    """The command's body for either path (commands._run wraps every board job in this).

    `flash` is the flash command's options (commands.FlashOptions); `db_path` the audit
    database, whose earlier runs may say what an interrupted PSP update left staged.
    """
    amdgpu: JobBody | None = None
    if command == "info":
        amdgpu = AmdgpuInfoJob()
    elif command == "verify" and image is not None:
        amdgpu = AmdgpuVerifyJob(image)
    elif command == "flash" and image is not None and flash is not None:
        whole = flash.start_sector == 0 and flash.sector_count is None
        amdgpu = AmdgpuFlashJob(image, PartPolicy(flash.force, flash.expect_part), whole, flash.clear_cmp, db_path)
    return ByTransport(command, body, amdgpu)


def _record_board(dev: Device, vbios: VbiosInfo | None, notes: list[str]) -> None:
    idt = dev.identity
    detail = {"part_number": vbios.part_number if vbios else None, "source": vbios.source if vbios else None,
              "vbios_version": vbios.version if vbios else None, "unavailable": notes, **idt.extra}
    dev.recorder.add("boards", spec=idt.spec, kind=idt.kind, bridge_serial=None, pci_address=idt.pci_address,
                     vendor_id=idt.vendor_id, device_id=idt.device_id, jedec=None, chip=None, unique_id=None,
                     sr1=None, sr2=None, sr3=None, protection=None, sfdp=None,
                     detail=json.dumps(detail, sort_keys=True, default=str), at=now_iso())


async def _identify(dev: Device) -> tuple[VbiosInfo | None, list[str]]:
    stage(dev.recorder, "identify", "start")
    vbios, notes = await dev.call(board_of(dev).vbios_info)
    _record_board(dev, vbios, notes)
    stage(dev.recorder, "identify", "end", vbios.part_number if vbios else "part number unknown")
    return vbios, notes


@dataclass
class AmdgpuInfoJob:
    async def __call__(self, dev: Device, info: RunInfo) -> dict[str, Any]:
        board = board_of(dev)
        vbios, notes = await _identify(dev)
        idt = dev.identity
        info.output += [
            f"board       {idt.spec} (PCI {idt.vendor_id:04x}:{idt.device_id:04x}, amdgpu driver bound)",
            f"PSP update  {'psp_vbflash available' if board.device.can_flash else 'psp_vbflash absent: no flash'}",
        ]
        if vbios:
            info.output += [f"part number {vbios.part_number}  (from {vbios.source})",
                            f"VBIOS       version {vbios.version or '-'}  name {vbios.name or '-'}  "
                            f"date {vbios.date or '-'}"]
        info.output += [f"unavailable {n}" for n in notes]
        if vbios is None:
            raise RuntimeError(f"{idt.spec}: the running VBIOS's part number could not be read: {'; '.join(notes)}")
        return {"part_number": vbios.part_number, "vbios_version": vbios.version, "source": vbios.source}


def left_staged(trail: TrailSource, address: str, boot_id: str | None, current_run: str) -> dict[str, Any] | None:
    """What the trail says the last earlier PSP update on this device left in the driver's
    buffer in this boot: its run and the bytes it was writing (staging, or clearing) when it
    stopped before a trigger (or a completed clear) — None when it left nothing, or nothing
    is known (no database, another boot). `trail`: the command's (store.reading.Trail), or a
    path for a job run alone."""
    if not trail or (isinstance(trail, str) and not Path(trail).exists()) or boot_id is None:
        return None
    try:
        with reading(trail) as db:
            rows = db.conn.execute(
                "SELECT run_id, event, detail FROM stages WHERE stage = 'psp_vbflash' AND run_id != ? AND run_id IN "
                "(SELECT run_id FROM boards WHERE kind = 'amdgpu' AND pci_address = ?) ORDER BY seq",
                [current_run, address]).fetchall()
    except (SchemaError, sqlite3.Error):
        return None
    if not rows:
        return None
    last = rows[-1][0]
    left: dict[str, Any] | None = None
    for run_id, event, detail in rows:
        if run_id != last:
            continue
        if event in ("clearing", "staging"):
            try:
                facts = json.loads(detail)
            except (TypeError, ValueError):
                continue
            left = {"run": run_id, "what": event, **facts} if facts.get("boot_id") == boot_id else None
        elif event in ("cleared", "triggered"):
            left = None
    return left


@dataclass
class AmdgpuFlashJob:
    image: bytes
    policy: PartPolicy
    whole: bool = True
    clear_cmp: bool = False
    db_path: str | None = None

    async def __call__(self, dev: Device, info: RunInfo) -> dict[str, Any]:
        board = board_of(dev)
        if not self.whole or self.clear_cmp:
            raise Refusal("--start-sector, --sector-count and --clear-cmp do not apply to an amdgpu: board: "
                          "the PSP writes whole partitions and guards the flash itself")
        if not board.device.can_flash:
            raise Refusal(f"{dev.identity.spec}: the amdgpu driver exposes no psp_vbflash/psp_vbflash_status "
                          f"for this device (kernel or PSP too old?); "
                          f"{ELSEWHERE.format(address=dev.identity.pci_address)}")
        vbios, notes = await _identify(dev)
        part, problem = part_check.image_part(self.image)
        found = BoardPart("found", vbios.part_number, vbios.source, vbios.version) if vbios \
            else BoardPart("unreadable", detail="; ".join(notes))
        decision = part_check.decide(part, problem, found, self.policy)
        part_check.record(dev.recorder, decision)
        if decision.refusal:
            raise Refusal(decision.refusal)
        dev.stop.check()   # the last point at which stopping leaves the board untouched

        stage(dev.recorder, "psp_vbflash", "start", f"{len(self.image):#x} bytes, sha256 "
                                                    f"{hashlib.sha256(self.image).hexdigest()}")
        await dev.call(dev.recorder.durable)   # on record before the PSP gets anything
        boot_id = await dev.call(board.boot_id)
        await self._empty_buffer(dev, board, boot_id, info.trail or self.db_path)
        try:
            stage(dev.recorder, "psp_vbflash", "staging",
                  json.dumps({"boot_id": boot_id, "bytes": len(self.image)}, sort_keys=True))
            await dev.call(dev.recorder.durable)   # a run killed while staging is known to the next
            await dev.call(board.stage_image, self.image)
            stage(dev.recorder, "psp_vbflash", "staged")
            trigger_error = await dev.call(board.trigger)
            stage(dev.recorder, "psp_vbflash", "triggered",
                  f"read of psp_vbflash failed: {trigger_error}" if trigger_error else None)
            start = dev.clock.now()

            def observe(polls: int, status: int) -> None:
                stage(dev.recorder, "psp_vbflash", "status", f"{status:#x} at poll {polls}")
                dev.progress("psp", polls, 1500)

            # Once the PSP has the image it is not stopped from here: a stop request waits for its answer.
            status, polls = await dev.call(board.wait_for_psp, trigger_error, observe)
        except BaseException as e:
            stage(dev.recorder, "psp_vbflash", "fail", str(e))
            raise
        stage(dev.recorder, "psp_vbflash", "end", f"{status:#x} after {polls} poll(s); {PSP_NOTE}")
        info.output += [part_check.summary(decision),
                        f"PSP update succeeded: psp_vbflash_status {status:#x} after {polls} poll(s), "
                        f"{dev.clock.now() - start:.1f} s on the board's clock",
                        PSP_NOTE]
        return {"psp_status": status, "polls": polls, "part_number": decision.as_json(), "result_sha256": None,
                "note": PSP_NOTE}

    async def _empty_buffer(self, dev: Device, board: AmdgpuBoard, boot_id: str | None, trail: TrailSource) -> None:
        """Make sure the driver's staging buffer holds nothing (see the module docstring)."""
        status = await dev.call(board.read_status)
        left = await anyio.to_thread.run_sync(left_staged, trail, board.device.address, boot_id,
                                              dev.recorder.run_id)
        if left is not None:
            why = (f"run {left['run']} was {left['what']} {left.get('bytes', 0):#x} bytes in this boot and never "
                   "triggered them")
        elif status == NOT_STARTED:
            why = ("psp_vbflash_status reads 0x0: nothing was handed to the PSP since the last write, so the buffer "
                   "may hold a staging (left by an interrupted update or another program)")
        else:
            stage(dev.recorder, "psp_vbflash", "buffer", f"empty: psp_vbflash_status {status:#x} shows a trigger "
                                                         "since the last write")
            return
        stage(dev.recorder, "psp_vbflash", "clearing", json.dumps({"boot_id": boot_id, "why": why}, sort_keys=True))
        await dev.call(dev.recorder.durable)
        try:
            accepted = await dev.call(board.clear_staging)
        except VbflashError as e:
            stage(dev.recorder, "psp_vbflash", "fail", str(e))
            raise Refusal(f"{dev.identity.spec}: the amdgpu driver's psp_vbflash buffer may hold bytes this run did "
                          f"not stage ({why}), and emptying it failed: {e}. Nothing was handed to the PSP. Do not "
                          "read psp_vbflash; reboot the machine (the buffer does not survive it) and run again") \
                from None
        stage(dev.recorder, "psp_vbflash", "cleared",
              f"emptied by the driver's overflow rule ({accepted:#x} bytes of zeros, then ENOMEM): {why}")


class PartitionMismatch(RuntimeError):
    pass


@dataclass
class AmdgpuVerifyJob:
    image: bytes

    async def __call__(self, dev: Device, info: RunInfo) -> dict[str, Any]:
        board = board_of(dev)
        try:
            layout = read_layout(BytesSource(self.image))
            slot = layout.slot("ISH_A")
            if slot is None or slot.atom is None:
                layout.image_vbios()             # raises, naming what is missing
            assert slot is not None and slot.atom is not None
        except LayoutError as e:
            raise Refusal(f"the image's partition A cannot be found ({e}): an amdgpu: board is verified by "
                          "partition, not byte for byte") from None
        src = BytesSource(self.image)
        payload = slot.payload(src)
        stage(dev.recorder, "verify", "start", "by partition payload")
        flash, where = await dev.call(board.read_spirom, FLASH_SIZE)
        if flash is not None:
            result = self._against_flash(payload, flash, where)
        else:
            rom = await dev.call(board.read_rom)
            atom = self.image[slot.csm_at:slot.csm_at + slot.atom.size]
            result = {"compared": "running VBIOS", "source": f"rom file ({where})", "size": len(atom),
                      "match": rom[:len(atom)] == atom and len(rom) >= len(atom)}
        stage(dev.recorder, "verify", "end" if result["match"] else "fail", json.dumps(result, sort_keys=True))
        if not result["match"]:
            raise PartitionMismatch(self._mismatch(result))
        info.output.append(self._match(result))
        return {"verify": result, "result_sha256": None}

    @staticmethod
    def _against_flash(payload: bytes, flash: bytes, where: str) -> dict[str, Any]:
        try:
            layout = read_layout(BytesSource(flash))
        except LayoutError as e:
            return {"compared": "partition payloads", "source": where, "match": False, "error": str(e)}
        matches = [s for s in layout.slots
                   if bytes(flash[s.location:s.location + len(payload)]) == payload and s.size >= len(payload)]
        return {"compared": "partition payloads", "source": where, "size": len(payload),
                "sha256": hashlib.sha256(payload).hexdigest(), "match": bool(matches),
                "partitions": [f"{s.partition} (boot priority {s.priority})" for s in matches]}

    @staticmethod
    def _match(result: dict[str, Any]) -> str:
        if result["compared"] == "partition payloads":
            return (f"verified by partition: the board's partition {' and '.join(result['partitions'])} holds the "
                    f"image's partition A payload ({result['size']:#x} bytes, sha256 {result['sha256'][:16]}…), "
                    f"read through {result['source']}")
        return (f"verified the running VBIOS: it equals the image's partition A ATOM image ({result['size']:#x} "
                f"bytes; the flash itself is not readable through this driver)")

    @staticmethod
    def _mismatch(result: dict[str, Any]) -> str:
        if result["compared"] == "partition payloads":
            reason = result.get("error") or "no partition of the board holds the image's partition A payload"
            return f"verify by partition failed: {reason} (read through {result['source']})"
        return ("verify failed: the running VBIOS differs from the image's partition A ATOM image (after a PSP "
                "update it changes only when the board reboots; no flash dump is offered by this driver)")
