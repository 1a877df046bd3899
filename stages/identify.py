"""Stage: open the ROM_SW engine and identify the flash (JEDEC, SR1-3, SFDP, unique ID)."""
from __future__ import annotations

from stages.device import Device
from stages.flash.spinor import FlashIdentity, SpiNor
from stages.navi31.romsw import RomSw, RomSwOptions


def open_engine(dev: Device, options: RomSwOptions) -> RomSw:
    """Configure the engine (pads, page mirror, prescaler), recording each transaction."""
    engine = RomSw(dev.bar, options)
    recorder, clock = dev.recorder, dev.clock

    def observe(opcode: int, address: int, address_bytes: int, tx_len: int, rx_len: int) -> None:
        recorder.spi_transaction(opcode, address, address_bytes, tx_len, rx_len, clock.now())

    engine.observer = observe
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
        "boards", spec=idt.spec, kind=idt.kind, bridge_serial=idt.serial, pci_address=idt.pci_address,
        vendor_id=idt.vendor_id, device_id=idt.device_id,
        jedec=ident.jedec_capture.hex() if ident else None,
        chip=ident.chip.name if ident else None,
        unique_id=ident.unique_id.hex() if ident else None,
        sr1=ident.sr1 if ident else None, sr2=ident.sr2 if ident else None, sr3=ident.sr3 if ident else None,
        protection=ident.protection.describe() if ident else None,
        sfdp=(ident.sfdp.describe() if ident.sfdp else ident.sfdp_error) if ident else None,
        detail=repr(idt.extra), at=_now())


def _now() -> str:
    import datetime as dt

    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")
