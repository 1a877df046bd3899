"""`amdflash hardware-report`: what a user sends when a board behaves unexpectedly.

One JSON document per board: identity (transport kind, PCI ids, bridge descriptors, VBIOS part
number), the flash's JEDEC id, status registers and raw SFDP, the registers amdflash touches as
found, each fast path's verdict, measured timings with their spread or bounds, and which of
docs/'s assumed facts the measurements confirm or contradict. The flash's unique ID and the
bridge/board serial are SHA-256 hashed unless --include-ids. Read-only (the engine registers it
uses are restored like every run's) unless --scratch-sector N, which gives up the 64 KiB block
holding sector N for the run: it is backed up (to a file beside the report, before anything is
erased), erased and reprogrammed to time the erases and page programs, and read back to
check it is byte-identical. The run is an audited run like any other (command
"hardware-report"), so `sim create --from-run` can also use it.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from amdflash.pipeline.engine import jobs
from amdflash.pipeline.engine.board_report import busy_limits  # noqa: F401 - read with the report
from amdflash.pipeline.errors import Refusal
from amdflash.pipeline.engine.runner import RunInfo
from amdflash.stages import measure
from amdflash.stages.device import Device
from amdflash.stages.drivers.flash.spinor import FlashIdentity
from amdflash.stages.snapshot import SNAPSHOT_REGISTERS, record_stage
from amdflash.stages.sim import report_model
from amdflash.stages.drivers.flash.geometry import SECTOR

FORMAT = "amdflash-hardware-report"
VERSION = 1
BLOCK = 0x10000
REPORT_EVENT = "hardware report"      # the stages row (stage "measure") holding the whole report
RESTORED = "restored and read back identical"   # a scratch stages row's words once the block is back


@dataclass
class HardwareReportJob:
    engine: jobs.EngineOptions
    output: Path | None
    include_ids: bool = False
    scratch_sector: int | None = None
    samples: int = 16
    overwrite: bool = False

    async def __call__(self, dev: Device, info: RunInfo) -> dict[str, Any]:
        bar = dev.bar
        found = await dev.call(lambda: {reg: bar.read32(reg) for reg in SNAPSHOT_REGISTERS})
        record_stage(dev, "measure", "start", "transport latency")
        # Before the engine opens: its data window is scratch space for the transfer timings.
        latency = await dev.call(measure.transport_latency, bar, self.samples)
        ident = await jobs.identify(dev, self.engine, info)
        engine = dev.romsw
        assert engine is not None and dev.nor is not None
        # A scratch block the chip protects is refused before anything else is measured.
        block = self._scratch_block(ident) if self.scratch_sector is not None else None
        sfdp = await dev.call(read_sfdp_space, engine)
        record_stage(dev, "measure", "spi", "SPI time per transaction size")
        spi = await dev.call(measure.spi_times, engine, self.engine.prescale)
        busy: dict[str, Any] = {}
        self._probe: dict[str, Any] | None = None
        if block is not None:
            busy = await dev.call(self._scratch, dev, block)
        part = await dev.call(_vbios_part, dev)
        report = build(dev, ident, found, sfdp, latency, spi, busy, part, self.include_ids)
        if self._probe is not None:
            report["flash"]["protection_reading"] = self._probe
        text = json.dumps(report, indent=2, sort_keys=True) + "\n"
        # The report is part of the run's record: `sim create --from-run TRAIL RUN` builds from it.
        record_stage(dev, "measure", REPORT_EVENT, json.dumps(report, sort_keys=True))
        if self.output is not None:
            from amdflash.stages.files import write_new

            write_new(self.output, text, overwrite=self.overwrite)
            info.output.append(f"wrote hardware report {self.output}")
            info.output += [f"fact        {f['verdict']:13} {f['fact']}" for f in report["facts"]]
        else:
            info.output.append(text.rstrip("\n"))     # stdout is the JSON alone
        return {"hardware_report_sha256": hashlib.sha256(text.encode()).hexdigest(),
                "scratch_block": busy.get("block")}

    def _scratch_block(self, ident: FlashIdentity) -> int:
        """The 64 KiB block holding the scratch sector, if the part and its protection allow."""
        assert self.scratch_sector is not None
        chip = ident.chip
        block = (self.scratch_sector * SECTOR) & ~(BLOCK - 1)
        erases = {e.size for e in chip.erase_types}
        if chip.source != "table" or not {SECTOR, 0x8000, BLOCK} <= erases or chip.page_size != 0x100:
            raise Refusal(f"--scratch-sector: the {chip.name} is not a table part with 4/32/64 KiB erases and "
                          "256-byte pages; no scratch timing on it")
        if not ident.protection.known or ident.protection.overlaps(block, BLOCK) or ident.protection.individual:
            raise Refusal(f"--scratch-sector {self.scratch_sector}: the block {block:#08x}-{block + BLOCK - 1:#08x} "
                          f"may be protected ({ident.protection.describe()}); choose an unprotected sector")
        return block

    def _scratch(self, dev: Device, block: int) -> dict[str, Any]:
        """Give up the 64 KiB block of the scratch sector for the run: back it up, time every
        erase size and every page program there, and put it back, checked."""
        assert dev.romsw is not None and dev.nor is not None
        nor = dev.nor
        assert nor.chip is not None
        erases = {e.size: e.opcode for e in nor.chip.erase_types}
        first = nor.read(block, BLOCK)
        if nor.read(block, BLOCK) != first:
            raise Refusal(f"--scratch-sector: two reads of {block:#08x}+64 KiB disagree; not erasing a block "
                          "whose backup is not confirmed")
        backup = self._backup_path(block).resolve()
        from amdflash.stages.files import PRIVATE, fsync_dir, write_new

        # On disk (private, durable) before the first erase, as a whole-flash image (the block at
        # its place, 0xFF elsewhere) that `amdflash flash --start-sector` can put back if this
        # process dies; its hash goes into the trail, so the advice names only this very file.
        image = bytearray(b"\xff" * nor.chip.size)
        image[block:block + BLOCK] = first
        write_new(backup, bytes(image), mode=PRIVATE, overwrite=False)
        fsync_dir(backup.parent)
        record_stage(dev, "measure", "scratch", f"block {block:#08x} sha256 {hashlib.sha256(image).hexdigest()} "
                                                f"backed up to {backup}")
        meter = measure.BusyMeter(dev.romsw, self.engine.prescale)
        try:
            meter.run(erases[BLOCK], block)
            for half in (block, block + 0x8000):
                meter.run(erases[0x8000], half)
            # The block is erased: which protection reading the chip follows, where they differ
            # (the 4 KiB erases below clear the byte the probe may program).
            self._probe = self._probe_protection(dev, block)
            for sector in range(block, block + BLOCK, SECTOR):
                meter.run(erases[SECTOR], sector)
            for page in range(block, block + BLOCK, 0x100):
                meter.run(measure.PP, page, first[page - block:page - block + 0x100])
            after = nor.read(block, BLOCK)
            if after != first:
                bad = next(i for i in range(BLOCK) if after[i] != first[i])
                raise RuntimeError(f"scratch block not as it was after the measurement: {block + bad:#08x} reads "
                                   f"{after[bad]:#04x}, was {first[bad]:#04x}")
        except BaseException as failure:
            # The block may be erased now: put it back before the failure goes up.
            meter.close()
            self._put_back(dev, block, first, backup, failure)
            raise
        meter.close()
        record_stage(dev, "measure", "scratch", f"block {block:#08x} {RESTORED}")
        backup.unlink()           # only once the trail says the block is back
        return {"block": f"{block:#08x}", "restored": "byte-identical",
                "kinds": {f"{op:#04x}": probe.result() for op, probe in meter.kinds.items()}}

    def _probe_protection(self, dev: Device, block: int) -> dict[str, Any] | None:
        """Set the status register to a protection the sources read differently for a sector of
        the (erased) scratch block, program one byte there, read it back, and put the register
        back as it was: whether the byte was taken says which reading the chip follows."""
        nor = dev.nor
        assert nor is not None and nor.chip is not None and nor.chip.protection is not None
        layout = nor.chip.protection
        regs = nor.registers()
        # 01h writes the registers up to CMP's where the part has CMP (a one-byte 01h clears CMP
        # and QE on some), else the first alone (a two-byte 01h is ignored on the MX25U1635F).
        count = layout.cmp[0] + 1 if layout.cmp is not None else 1
        for address in range(block, block + BLOCK, SECTOR):
            found = layout.probe_setting(regs, address, nor.chip.size)
            if found is not None:
                break
        else:
            return None
        value, protected, writable = found
        original = bytes((regs[0] & 0xFC, *regs[1:count]))
        record_stage(dev, "measure", "protection probe", f"{nor.chip.registers[0].name}={value:#04x} for "
                     f"{address:#08x}; status registers as found: {original.hex(' ')} (put back after)")
        try:
            nor.write_status(bytes((value & 0xFC, *original[1:])))
            if nor.registers()[0] & 0xFC != value & 0xFC:
                return {"address": f"{address:#08x}", "setting": f"{value:#04x}",
                        "result": "the status register did not take the setting (locked?): not probed"}
            nor.write_enable()
            nor.spi.command(measure.PP, address, 3, b"\x00")
            nor.wait_ready(*nor.chip.page_program or (0.0005, 0.003), "probe page program", nor.spi.last_end,
                           measure.PP)
            taken = nor.read(address, 1) == b"\x00"
        finally:
            nor.write_status(original)
        if nor.registers()[:count] != tuple(regs[:count]):
            raise RuntimeError(f"the status registers did not go back to {original.hex(' ')} after the protection "
                               f"probe: they read {bytes(nor.registers()[:count]).hex(' ')}")
        follows, contradicts = (writable, protected) if taken else (protected, writable)
        record_stage(dev, "measure", "protection probe", f"the chip follows {', '.join(follows)}")
        return {"address": f"{address:#08x}", "setting": f"{value:#04x}", "taken": taken,
                "follows": list(follows), "contradicts": list(contradicts)}

    def _put_back(self, dev: Device, block: int, first: bytes, backup: Path, failure: BaseException) -> None:
        """Erase the scratch block and program its content back, read back (after `failure`
        stopped the measurement); if that fails too, the error names the backup."""
        nor = dev.nor
        assert nor is not None and nor.chip is not None
        try:
            # The operation the measurement stopped in may still run (a busy time past its
            # timeout): a write enable would be refused until it ends.
            slowest = max(e.maximum or 0.0 for e in nor.chip.erase_types)
            nor.wait_ready(0.0, slowest, "the operation under way when the measurement stopped")
            nor.erase(block, BLOCK)
            nor.program(block, first)
            if nor.read(block, BLOCK) != first:
                raise RuntimeError("it does not read back identical")
        except Exception as e:
            raise RuntimeError(f"{type(failure).__name__}: {failure}; then putting the scratch block {block:#08x} "
                               f"back failed ({e}): its content is in {backup}") from failure
        record_stage(dev, "measure", "scratch", f"block {block:#08x} {RESTORED} (after: {failure})")
        backup.unlink()

    def _backup_path(self, block: int) -> Path:
        assert self.output is not None
        return self.output.with_name(f"{self.output.name}.block-{block:06x}.bin")


def read_sfdp_space(engine) -> bytes:
    """The SFDP space as the chip answers 5Ah: header, parameter headers and every table
    they point to (at most 4 KiB), read whole."""
    def read(address: int, count: int) -> bytes:
        out = b""
        while count > 0:
            n = min(count, 255)
            out += engine.read(0x5A, address, 3, n + 1)[1:]    # one dummy byte leads
            address, count = address + n, count - n
        return out

    head = read(0, 8)
    if head[:4] != b"SFDP":
        return head
    headers = read(8, 8 * (head[6] + 1))
    end = 8 + len(headers)
    for i in range(0, len(headers), 8):
        h = headers[i:i + 8]
        pointer = int.from_bytes(h[4:7], "little")
        end = max(end, pointer + 4 * h[3])
    return read(0, min(end, report_model.MAX_SFDP))


def _vbios_part(dev: Device) -> dict[str, Any]:
    from amdflash.stages.image.atom import UnitSource
    from amdflash.stages.drivers.flash.geometry import FLASH_SIZE
    from amdflash.stages.image.part_check import flash_part

    assert dev.nor is not None
    part = flash_part(UnitSource(dev.nor.read, FLASH_SIZE))
    return {"state": part.state, "part_number": part.part_number, "version": part.version, "detail": part.detail}


def _id(value: str | None, include: bool) -> dict[str, str | None]:
    if not value:
        return {"value": None}
    if include:
        return {"value": value}
    return {"sha256": hashlib.sha256(value.encode()).hexdigest()}


def build(dev: Device, ident: FlashIdentity, found: dict[int, int], sfdp: bytes, latency: dict[str, Any],
          spi: dict[str, Any], busy: dict[str, Any], part: dict[str, Any], include_ids: bool) -> dict[str, Any]:
    from amdflash.pipeline.engine.run_facts import tool_version

    idt = dev.identity
    kind = idt.kind
    profile = str(idt.extra.get("profile", "")) if kind == "sim" else {"usb": "asm24", "pci": "pcie"}.get(kind, "")
    # Descriptors worth sending: nothing that locates the host (bus, port, sysfs path).
    bridge = {k: v for k, v in idt.extra.items() if k in ("usb_id", "product", "link_trained_by_host", "bar0_size")}
    engine = dev.romsw
    assert engine is not None
    report: dict[str, Any] = {
        "format": FORMAT, "version": VERSION, "amdflash": tool_version(),   # as the run records it
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "board": {"kind": kind, "profile": profile, "emulated": bool(idt.extra.get("emulated")),
                  "vendor_id": idt.vendor_id, "device_id": idt.device_id, "bridge": bridge,
                  "serial": _id(idt.serial, include_ids), "vbios": part},
        "flash": {"chip": ident.chip.name, "source": ident.chip.source, "jedec": ident.jedec_capture.hex(),
                  "status_registers": {r.name: v for r, v in zip(ident.chip.registers, ident.registers)},
                  "protection": ident.protection.describe(), "sfdp": sfdp.hex(),
                  "unique_id": _id(ident.unique_id.hex() or None, include_ids)},
        "registers_found": {f"{reg:#07x}": value for reg, value in sorted(found.items())},
        "fast_paths": [{"name": f.name, "ok": f.ok, "detail": f.detail} for f in engine.findings],
        "timings": {"clock": "transport (wall time on hardware, modelled seconds on an emulated board)",
                    "samples": latency["read32"]["n"], "transport": latency, "spi": spi, "busy": busy},
    }
    report["facts"] = report_model.facts(report, ident)
    report_model.check(report)          # what we send is what we accept
    return report


__all__ = ["HardwareReportJob"]
