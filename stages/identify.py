"""Stage: open the ROM_SW engine and identify the flash (JEDEC, SR1-3, SFDP, unique ID)."""
from __future__ import annotations

import json

from amdflash.stages.device import Device
from amdflash.stages.flash.spinor import FlashIdentity, SpiNor
from amdflash.stages.navi31.romsw import RomSw, RomSwOptions


def open_engine(dev: Device, options: RomSwOptions) -> RomSw:
    """Configure the engine (pads, page mirror, prescaler)."""
    engine = RomSw(dev.bar, options)   # its transactions are recorded from its register writes
    dev.romsw = engine
    engine.open()
    return engine


def identify_flash(dev: Device) -> FlashIdentity:
    assert dev.romsw is not None
    nor = SpiNor(dev.romsw)
    ident = nor.identify()
    dev.nor = nor
    record_identity(dev, ident)
    return ident


def record_identity(dev: Device, ident: FlashIdentity | None) -> None:
    idt = dev.identity
    dev.recorder.add(
        "boards", spec=idt.spec, kind=idt.kind, emulated=int(bool(idt.extra.get("emulated"))),
        bridge_serial=idt.serial, pci_address=idt.pci_address,
        vendor_id=idt.vendor_id, device_id=idt.device_id,
        jedec=ident.jedec_capture.hex() if ident else None,
        chip=ident.chip.name if ident else None,
        unique_id=ident.unique_id.hex() if ident else None,
        sr1=ident.sr1 if ident else None, sr2=ident.sr2 if ident else None, sr3=ident.sr3 if ident else None,
        protection=ident.protection.describe() if ident else None,
        sfdp=(ident.sfdp.describe() if ident.sfdp else ident.sfdp_error) if ident else None,
        detail=json.dumps(idt.extra, sort_keys=True, default=str), at=_now())


def _now() -> str:
    import datetime as dt

    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


PROBE_TIMEOUT = 0.05   # seconds on the board's clock: a gated engine must not stall `list`


def probe_flash(bar) -> dict[str, object]:  # noqa: ANN001 - a Bar5
    """For `amdflash list`: JEDEC id and unique ID through ROM_SW, read-only, registers restored;
    when the engine is gated, whether the ROM aperture is there instead."""
    from amdflash.stages.flash.spinor import FlashError
    from amdflash.stages.navi31 import regs as R
    from amdflash.stages.navi31.romsw import RomSwError

    try:
        with RomSw(bar, RomSwOptions(timeout=PROBE_TIMEOUT)) as engine:
            ident = SpiNor(engine).identify()
        return {"chip": ident.chip.name, "jedec": ident.chip.jedec.hex(), "unique_id": ident.unique_id.hex()}
    except (RomSwError, FlashError) as e:
        raw = bar.read32(R.ROM_CNTL) != R.ROM_CNTL_RAW_UNAVAILABLE
        return {"flash": f"ROM_SW does not answer: {e}",
                "aperture": "available (dump --via aperture)" if raw else "unavailable"}
