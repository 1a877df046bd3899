"""The emulated Macronix MX25U1633F: the MX25U1635F's JEDEC id, another part.

Facts and where they come from (docs/flash-chip.md has the table):

* ufprog's part table (vendor-macronix.c) lists the MX25U1632F and MX25U1633F under the
  MX25U1635F's id C2 25 35, each "SFDP 1.6" (the 1635F's is 1.0), with P_FAIL/E_FAIL in
  SCUR, two 512-byte OTP areas with the ESN last, four BP bits and a one-time TB bit
  (`MXIC_F_WPR_4BP_TB_OTP`); the 1632F also has WPSEL in SCUR bit 7.
* flashrom has no entry of its own for either; its Macronix entries with a one-time TB put it
  in the configuration register, bit 3 (MX25L3273F: `.tb = {CONFIG, 3, OTP}`), read with 15h,
  and decode the BP bits with decode_range_spi25 (64 KiB × 2^(BP−1) from the end TB picks,
  everything from BP = 6 up for 16 Mbit).

Modelled: SR (BP0..BP3, QE, SRWD), SCUR (2Bh) with P_FAIL/E_FAIL, CR (15h) whose TB bit a
status write (01h: SR, CR) can only set; no QPI enable at 35h (ufprog gives none), no
secured OTP (its layout is not modelled) and no WPSEL.

Assumed: every busy time and the erase set (the MX25U1635F's), the CR's other bits, the
device byte, the SFDP fields beyond revision, density, erase types and QER (010b: QE in SR1
bit 6).
"""
from __future__ import annotations

from dataclasses import replace

from amdflash.stages.sim.mx25u1635f import BUSY, MX25U1635F
from amdflash.stages.sim.parts import BlockProtection, Register
from amdflash.stages.sim.sfdp_table import Bfpt, build_sfdp

SFDP = build_sfdp(Bfpt(
    revision=(1, 6), density_bits=16 << 20,
    erase_types=((0x1000, 0x20, 35e-3), (0x8000, 0x52, 200e-3), (0x10000, 0xD8, 350e-3)),
    page_program=0.5e-3, chip_erase=10.0, qer=0b010, suspend=(0xB0, 0x30)))

MX25U1633F = replace(
    MX25U1635F,
    name="MX25U1633F",
    description="Macronix MX25U1633F, 16 Mbit, 1.8 V (the MX25U1635F's id, SFDP 1.6, one-time TB)",
    registers=(
        Register("SR", 0x05, writable=0xFC),                  # BP0..BP3, QE, SRWD
        Register("SCUR", 0x2B),
        Register("CR", 0x15, writable=0xC0, otp=0x08),        # TB (bit 3) one-time
    ),
    status_writes={0x01: (0, 2)},
    unread_registers=("CR",),                                 # the driver does not read TB
    protection=BlockProtection(bp=((0, 2), (0, 3), (0, 4), (0, 5)), tb=(2, 3)),
    individual_locks=None,
    busy=BUSY,
    sfdp=SFDP,
    secured_otp=None,
    qpi_enter=None,
)
