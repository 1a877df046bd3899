"""Stage: open the ROM_SW engine; record the flash identity (read, confirmed, by
stages.snapshot.read_identity) and the chip facts the run works with; probe boards for `list`.

Opening the engine checks its fast paths on the board (navi31/fastpaths.py). Every verdict
is recorded as a `stages` row of the run ("rom_sw" / "fast path"); one that leaves a fast
path off for this board — at open or later in the job — is also said on the console.
The chip facts the run works with — from the chip table, or from the part's SFDP alone
for a part the table does not know — are recorded as an "identify" / "chip facts" row
whose detail is JSON.
"""
from __future__ import annotations

import json
import logging

from amdflash.stages.device import Device
from amdflash.stages.drivers.flash import chips
from amdflash.stages.drivers.flash.spinor import FlashIdentity, SpiNor
from amdflash.stages.drivers.navi31.fastpaths import Finding
from amdflash.stages.drivers.navi31.romsw import RomSw, RomSwOptions


def open_engine(dev: Device, options: RomSwOptions) -> RomSw:
    """Configure the engine (pads, page mirror, prescaler) and check its fast paths,
    recording each verdict (its transactions are recorded from its register writes)."""
    engine = RomSw(dev.bar, options)
    dev.romsw = engine
    engine.open()
    for finding in engine.findings:
        record_finding(dev, finding)
    engine.on_finding = lambda finding: record_finding(dev, finding)
    dev.recorder.add("stages", stage="rom_sw", event="fast paths", detail=engine.fast.describe(), at=_now())
    return engine


def record_finding(dev: Device, finding: Finding) -> None:
    verdict = "ok" if finding.ok else "off for this board"
    dev.recorder.add("stages", stage="rom_sw", event="fast path",
                     detail=f"{finding.name}: {verdict}: {finding.detail}", at=_now())
    if not finding.ok:
        # Through the standard logging module: the command line routes it to its own log (with
        # the board as a field) without this stage importing structlog for a board that never warns.
        logging.getLogger("amdflash").warning(f"{finding.name} off for this board: {finding.detail}",
                                              extra={"fields": {"board": dev.identity.spec}})


def record_chip_facts(dev: Device, ident: FlashIdentity) -> None:
    dev.recorder.add("stages", stage="identify", event="chip facts", detail=json.dumps(chip_facts(ident)), at=_now())


def chip_facts(ident: FlashIdentity) -> dict[str, object]:
    """What the run knows about the flash and where it comes from (table or SFDP)."""
    chip = ident.chip
    return {
        **chip.facts(),
        "jedec_capture": ident.jedec_capture.hex(),
        "status_registers_read": {r.name: v for r, v in zip(chip.registers, ident.registers)},
        "identified_by": chips.why_part(chip, ident.sfdp),
        "protection_now": ident.protection.describe(),
        "sfdp": ident.sfdp.facts() if ident.sfdp else {"error": ident.sfdp_error},
        "unique_id": ident.unique_id.hex() or None,
        "unique_id_method": chip.facts()["unique_id"],
    }


def identity_lines(ident: FlashIdentity) -> list[str]:
    """The flash part of `info`'s output."""
    chip = ident.chip
    where = " — not in the chip table: described by its SFDP alone" if chip.source == "sfdp" else ""
    status = f"status      {ident.describe_registers()}"
    if chip.protection is not None and chip.protection.cmp is not None:
        status += f"  CMP={'set' if ident.cmp else 'clear'}"
    if ident.qe is not None:
        status += f"  QE={int(ident.qe)}"
    if ident.unique_id:
        uid = ident.unique_id.hex()
    elif chip.unique_id:
        uid = f"none (the {chip.name} reports no factory serial number)"
    else:
        uid = "none (no unique-ID method is known for this part)"
    return [
        f"flash       {chip.name} ({chip.size // 1024} KiB, {chip.voltage}); "
        f"JEDEC capture {ident.jedec_capture.hex(' ')}{where}",
        f"part        {chips.why_part(chip, ident.sfdp)}",
        status,
        f"protection  {ident.protection.describe()}",
        f"SFDP        {ident.sfdp.describe() if ident.sfdp else 'unreadable: ' + str(ident.sfdp_error)}",
        f"unique ID   {uid}",
    ]


def record_identity(dev: Device, ident: FlashIdentity | None) -> None:
    idt = dev.identity
    dev.recorder.add(
        "boards", spec=idt.spec, kind=idt.kind, emulated=int(bool(idt.extra.get("emulated"))),
        bridge_serial=idt.serial, pci_address=idt.pci_address,
        vendor_id=idt.vendor_id, device_id=idt.device_id,
        jedec=ident.jedec_capture.hex() if ident else None,
        chip=ident.chip.name if ident else None,
        unique_id=(ident.unique_id.hex() or None) if ident else None,
        sr1=ident.sr1 if ident else None, sr2=_named(ident, "SR2"), sr3=_named(ident, "SR3"),
        protection=ident.protection.describe() if ident else None,
        sfdp=(ident.sfdp.describe() if ident.sfdp else ident.sfdp_error) if ident else None,
        detail=json.dumps(idt.extra, sort_keys=True, default=str), at=_now())


def _named(ident: FlashIdentity | None, name: str) -> int | None:
    """A status register by its name: a part without SR2 (or whose second register is
    something else, like the MX25U1635F's security register) records none."""
    if ident is None:
        return None
    found = [v for r, v in zip(ident.chip.registers, ident.registers) if r.name == name]
    return found[0] if found else None


def _now() -> str:
    import datetime as dt

    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


PROBE_TIMEOUT = 0.05   # seconds on the board's clock: a gated engine must not stall `list`


def probe_flash(bar) -> dict[str, object]:
    """For `amdflash list`: JEDEC id and unique ID through ROM_SW, read-only, registers restored;
    when the engine is gated, whether the ROM aperture is there instead."""
    from amdflash.stages.drivers.flash.spinor import FlashError
    from amdflash.stages.drivers.navi31 import regs as R
    from amdflash.stages.drivers.navi31.romsw import RomSwError

    from amdflash.stages.drivers.navi31.fastpaths import VALIDATED

    try:
        # The validated sequence, unchecked: `list` reads a few registers, speed is no matter.
        with RomSw(bar, RomSwOptions(timeout=PROBE_TIMEOUT, fast=VALIDATED, self_check=False)) as engine:
            ident = SpiNor(engine).identify()
        return {"chip": ident.chip.name, "jedec": ident.chip.jedec.hex(), "unique_id": ident.unique_id.hex() or None}
    except (RomSwError, FlashError) as e:
        raw = bar.read32(R.ROM_CNTL) != R.ROM_CNTL_RAW_UNAVAILABLE
        return {"flash": f"ROM_SW does not answer: {e}",
                "aperture": "available (dump --via aperture)" if raw else "unavailable"}
