"""The emulated Winbond W25Q16FW and W25Q16JW: the W25Q16DW's JEDEC id, told apart by SFDP.

Facts and where they come from (docs/flash-chip.md has the table):

* flashrom's flashchips (winbond.c, "W25Q16.W", model WINBOND_NEX_W25Q16_W = 0x6015): one
  entry for every EF 60 15 part: 2048 KiB, 256-byte pages, erasers 4K/32K/64K/chip,
  1.70-1.95 V, untested, no `.reg_bits`.
* ufprog's part table (vendor-winbond.c, `w25q16xw_fixup_model`): the part answering EF 60 15
  is the W25Q16JW when its SFDP basic flash parameter table has minor revision 6 (JESD216B),
  the W25Q16FW at minor revision 5 (JESD216A), and the W25Q16DW otherwise. Its FW and JW
  entries (unlike the DW's): three 256-byte security registers from index 1
  (`w25q_otp_3`: 0x1000, 0x2000, 0x3000), status registers SR1, SR2 and SR3
  (`w25q_3_regs`: SR2 = SRP1, QE, LB1..LB3, CMP, with bit 2 reserved — there is no LB0;
  SR3 = WPS bit 2, DRV, HOLD/RST bit 7, read with 15h and written with 11h), QE set by
  writing SR2 alone with 31h (`SNOR_QE_SR2_BIT1`; the DW sets it through 01h with both
  bytes), global block unlock 98h for the individual block locks WPS=1 selects
  (`SNOR_F_GLOBAL_UNLOCK`), the same BP/TB/SEC/CMP ranges; QPI 38h/FFh on the FW, none on
  the JW; 50h volatile status writes; an 8-byte unique ID (4Bh).

Assumed (no public datasheet text reached here): every busy time (the DW's figures), the
SR3 value at the factory (DRV = 11b, 0x60), that 01h still writes SR1 and SR2 together
(the compatibility form JESD216's QER 101b describes, which the emulated SFDP states),
the suspend bit (SR2 bit 7), the 90h/ABh device byte (14h), and every SFDP field beyond
the revision, density, erase types, their times and the 4 KiB opcode.
"""
from __future__ import annotations

from dataclasses import replace

from amdflash.stages.sim.parts import IndividualLocks, Register, SecurityRegisters
from amdflash.stages.sim.sfdp_table import Bfpt, build_sfdp
from amdflash.stages.sim.w25q16dw import BUSY as DW_BUSY
from amdflash.stages.sim.w25q16dw import W25Q16DW

BUSY: dict[int, tuple[float, float]] = {**DW_BUSY, 0x31: DW_BUSY[0x01], 0x11: DW_BUSY[0x01]}
ERASE_TYPES = ((0x1000, 0x20, 45e-3), (0x8000, 0x52, 120e-3), (0x10000, 0xD8, 150e-3))


def _sfdp(minor: int) -> bytes:
    return build_sfdp(Bfpt(revision=(1, minor), density_bits=16 << 20, erase_types=ERASE_TYPES,
                           page_program=0.4e-3, chip_erase=5.0, qer=0b101))


W25Q16FW = replace(
    W25Q16DW,
    name="W25Q16FW",
    description="Winbond W25Q16FW, 16 Mbit, 1.8 V (SFDP basic table 1.5)",
    registers=(
        Register("SR1", 0x05, writable=0xFC),
        Register("SR2", 0x35, writable=0x43, otp=0x38),     # SRP1, QE, CMP; LB1..LB3 one-time; bit 2 reserved
        Register("SR3", 0x15, writable=0xE4, initial=0x60),  # WPS, DRV1..DRV0, HOLD/RST
    ),
    status_writes={0x01: (0, 1), 0x31: (1,), 0x11: (2,)},
    one_byte_clears=0,
    protection=replace(W25Q16DW.protection, select=(2, 2)),
    busy=BUSY,
    sfdp=_sfdp(5),
    security=SecurityRegisters(first=1, count=3, size=0x100, lock=((1, 3), (1, 4), (1, 5))),
    individual_locks=IndividualLocks(),
)

W25Q16JW = replace(
    W25Q16FW,
    name="W25Q16JW",
    description="Winbond W25Q16JW, 16 Mbit, 1.8 V (SFDP basic table 1.6)",
    sfdp=_sfdp(6),
    qpi_enter=None,
)

