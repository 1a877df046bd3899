"""Whether the identified flash may be written over a range, and why not (pure, no I/O).

A part in the chip table: its protection layout decides — a target its block-protect
bits cover is refused (the chip would silently ignore the writes), CMP only with
--clear-cmp, and only on a part that has CMP.

A part known only from its SFDP: refused unless the user says --unknown-chip-ok; then
only what its tables give is used (erase types and times, page size and program time),
so a table without them (JESD216 1.0), or a part the engine cannot address, is refused
all the same, as is anything that needs protection knowledge JESD216 does not carry:
--clear-cmp, and any set bit among SR1 bits 2-6 (apart from a QE bit its tables place
there) — on SPI NOR parts those are block-protect bits, and what they protect the tables
do not say.
"""
from __future__ import annotations

from amdflash.stages.drivers.flash.protection import ProtectionLayout
from amdflash.stages.drivers.flash.spinor import FlashIdentity


def refusal(ident: FlashIdentity, lo: int, hi: int, clear_cmp: bool, unknown_chip_ok: bool) -> str | None:
    """Why writing [lo, hi) must not start, or None."""
    chip = ident.chip
    if chip.source == "sfdp":
        return _unknown_chip(ident, clear_cmp, unknown_chip_ok)
    gaps = chip.write_gaps()
    if gaps:
        return f"the {chip.name} cannot be written by amdflash: {'; '.join(gaps)}"
    layout = chip.protection
    assert layout is not None, "every part in the chip table has a protection layout"
    if clear_cmp and layout.cmp is None:
        return f"--clear-cmp: the {chip.name} has no CMP bit ({ident.protection.describe()})"
    if clear_cmp and ident.protection.cmp and layout.status_locked(ident.registers):
        return (f"--clear-cmp: the status registers are locked (SR2.SRP1=1; {ident.protection.describe()}): "
                "the chip would ignore the write that clears CMP; only a power cycle (or nothing, for a "
                "one-time lock) unlocks them")
    current = ident.protection
    after = layout.decode(layout.without_cmp(ident.registers), chip.size) if clear_cmp else current
    if current.overlaps(lo, hi - lo) and current.cmp and not clear_cmp:
        return f"SR2.CMP is set and protects {current.describe()}; rerun with --clear-cmp to clear it"
    if after.overlaps(lo, hi - lo):
        return (f"the target range {lo:#08x}-{hi - 1:#08x} is write-protected "
                f"({after.describe()}{' even with CMP cleared' if clear_cmp else ''}); "
                f"amdflash does not change block protection bits: clear {_bp_names(layout)} with a programmer "
                "that knows the part, then run again")
    return None


def _unknown_chip(ident: FlashIdentity, clear_cmp: bool, unknown_chip_ok: bool) -> str | None:
    chip = ident.chip
    if not unknown_chip_ok:
        return (f"the flash is not in amdflash's chip table: {chip.name}. Its SFDP describes its geometry "
                "(and, from JESD216A on, its timing) but not its protection bits; pass --unknown-chip-ok to "
                "write it from its SFDP alone")
    gaps = chip.write_gaps()
    if gaps:
        return f"{chip.name}: its SFDP lacks what a write needs: {'; '.join(gaps)}"
    if clear_cmp:
        return ("--clear-cmp: the part is known only from its SFDP, which does not say whether or where it "
                "has a CMP bit; amdflash changes no status bit it cannot place")
    qe = 1 << chip.qe[1] if chip.qe and chip.qe[0] == 0 else 0
    suspect = ident.sr1 & 0x7C & ~qe
    if suspect:
        return (f"SR1={ident.sr1:02x} has bits {_bits(suspect)} set: on SPI NOR parts these are block-protect "
                "bits, and this part's SFDP does not say what they protect; clear them with a tool that knows "
                "the part, then run again")
    return None


def _bp_names(layout: ProtectionLayout) -> str:
    return "..".join(f"BP{i}" for i in (len(layout.bp) - 1, 0))


def _bits(mask: int) -> str:
    return ", ".join(str(b) for b in range(8) if mask >> b & 1)
