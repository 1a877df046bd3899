"""Emulated parts amdflash's chip table does not know: for the SFDP-only path.

Fictional parts (not real products): JEDEC ids E5 51 15, E5 52 15, E5 55 15 and E5 56 15
were chosen because neither flashrom's nor amdflash's table has them. Each works like a plain JESD216 part: 2 MiB,
256-byte pages, 4 KiB (20h) and 64 KiB (D8h) erases — no 32 KiB erase — one status register
with BP0..BP2, TB, QE (bit 6, set at the factory, as some ordering codes ship) and SRWD,
decoded by the SPI25 rule; no unique ID, no security registers, no suspend.

* "UNKNOWN": SFDP revision 1.6 with the times the silicon has (4 KiB 48 ms, 64 KiB 384 ms,
  page 640 µs, chip 12 s, maximum 6× each) and QER = 010b (QE is SR1 bit 6): everything a
  write needs is in its tables, so `flash --unknown-chip-ok` can work from them.
* "UNKNOWN-SFDP10": the same silicon with a revision 1.0 table (nine dwords: no page size,
  no times): `info` works, `flash` refuses even with --unknown-chip-ok.
* "UNKNOWN-2BFPT": the same silicon whose SFDP lists a 1.0 basic table first and the 1.6 one
  after it (JESD216 allows several; Linux's sfdp.c reads the highest minor revision of
  major 1): written with --unknown-chip-ok from the 1.6 table's times.
* "UNKNOWN-SFDP2": an SFDP header of major revision 2, which Linux rejects (only JESD216's
  major 1 is understood): the part has no usable SFDP, so nothing describes it.
"""
from __future__ import annotations

from amdflash.stages.sim.parts import BlockProtection, PartSpec, Register
from amdflash.stages.sim.sfdp_table import Bfpt, build_area, build_sfdp

BUSY: dict[int, tuple[float, float]] = {
    0x02: (0.64e-3, 3.84e-3), 0x20: (48e-3, 288e-3), 0xD8: (384e-3, 2.304),
    0x60: (12.0, 72.0), 0xC7: (12.0, 72.0), 0x01: (8e-3, 30e-3),
}
ERASE_TYPES = ((0x1000, 0x20, 48e-3), (0x10000, 0xD8, 384e-3))


def _bfpt(revision: tuple[int, int]) -> Bfpt:
    return Bfpt(revision=revision, density_bits=16 << 20, erase_types=ERASE_TYPES, page_program=0.64e-3,
                chip_erase=12.0, suspend=None, qer=0b010, sr1_write=0b0000001)


def _unknown(name: str, jedec: bytes, revision: tuple[int, int], sfdp: bytes | None = None) -> PartSpec:
    return PartSpec(
        name=name,
        description=f"a fictional JESD216 part with SFDP {revision[0]}.{revision[1]}, absent from the chip table",
        jedec=jedec,
        device_id=0x14,
        registers=(Register("SR1", 0x05, writable=0xFC, initial=0x40),),
        status_writes={0x01: (0,)},
        protection=BlockProtection(bp=((0, 2), (0, 3), (0, 4)), tb=(0, 5)),
        erases={0x20: 0x1000, 0xD8: 0x10000},
        busy=BUSY,
        sfdp=sfdp or build_sfdp(_bfpt(revision)),
    )


UNKNOWN = _unknown("UNKNOWN", bytes((0xE5, 0x51, 0x15)), (1, 6))
UNKNOWN_SFDP10 = _unknown("UNKNOWN-SFDP10", bytes((0xE5, 0x52, 0x15)), (1, 0))
UNKNOWN_2BFPT = _unknown("UNKNOWN-2BFPT", bytes((0xE5, 0x55, 0x15)), (1, 6), build_area(
    (1, 6), [(0xFF00, (1, 0), _bfpt((1, 0)).build()), (0xFF00, (1, 6), _bfpt((1, 6)).build())]))
UNKNOWN_SFDP2 = _unknown("UNKNOWN-SFDP2", bytes((0xE5, 0x56, 0x15)), (2, 0), build_area(
    (2, 0), [(0xFF00, (1, 6), _bfpt((1, 6)).build())]))
