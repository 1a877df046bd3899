"""The emulated Winbond W25Q16DW: 16 Mbit, 1.8 V, the same protection layout as the GD25LQ16E.

Facts and where they come from (docs/flash-chip.md has the table):

* flashrom's flashchips (entry "W25Q16.W", model WINBOND_NEX_W25Q16_W = 0x6015 "W25Q16DW"):
  JEDEC id EF 60 15; 2048 KiB, 256-byte pages; erasers 4 KiB (20h), 32 KiB (52h),
  64 KiB (D8h), chip (60h, C7h); OTP read 48h, program 42h, erase 44h, unique ID 4Bh;
  QPI enable 38h; 1.70-1.95 V; tested: untested; no `.reg_bits` (flashrom does not
  decode its protection).
* ufprog's part table (hackpascal/ufprog, vendor-winbond.c, "W25Q16DW"): erase
  4K/32K/64K, 8-byte unique ID read with 4Bh and four dummy bytes, non-volatile status
  register with a 50h volatile write, QE is SR2 bit 1 written through 01h (SR2 read with
  35h), QPI 38h (leave with FFh), four 256-byte security registers (index 0..3), status
  layout SR1 = BP0..BP2, TB, SEC, SRP0 and SR2 = SRP1, QE, LB0..LB3, CMP, protection
  decoded as BP/TB/SEC/CMP; its SFDP basic table is neither JESD216A nor B (ufprog tells
  the W25Q16DW from the FW and JW by that), i.e. revision 1.0.
* Winbond's W25Q datasheets of that generation: a 01h whose CS# rises after one data
  byte clears QE and CMP (recalled, not re-checked here: assumed).

Assumed: every busy time (the W25Q16JV datasheet's figures as recalled: page 0.4/3 ms,
4 KiB 45/400 ms, 32 KiB 120/1600 ms, 64 KiB 150/2000 ms, chip 5/25 s, status write
10/15 ms), the suspend status bit (SR2 bit 7 for both erase and program), the 90h/ABh
device byte (14h, as on the other Winbond 16 Mbit parts), the SFDP fields beyond
revision, density, erase types and the 4 KiB opcode, and the device byte.
"""
from __future__ import annotations

from amdflash.stages.sim.parts import BlockProtection, PartSpec, Register, SecurityRegisters, Suspend
from amdflash.stages.sim.sfdp_table import Bfpt, build_sfdp

BUSY: dict[int, tuple[float, float]] = {
    0x02: (0.4e-3, 3e-3), 0x20: (45e-3, 400e-3), 0x52: (120e-3, 1.6), 0xD8: (150e-3, 2.0),
    0x60: (5.0, 25.0), 0xC7: (5.0, 25.0), 0x01: (10e-3, 15e-3),
    0x42: (0.4e-3, 3e-3), 0x44: (45e-3, 400e-3),
}

SFDP = build_sfdp(Bfpt(
    revision=(1, 0), density_bits=16 << 20,
    erase_types=((0x1000, 0x20, 45e-3), (0x8000, 0x52, 120e-3), (0x10000, 0xD8, 150e-3))))

W25Q16DW = PartSpec(
    name="W25Q16DW",
    description="Winbond W25Q16DW, 16 Mbit, 1.8 V",
    jedec=bytes((0xEF, 0x60, 0x15)),
    device_id=0x14,
    registers=(
        Register("SR1", 0x05, writable=0xFC),
        Register("SR2", 0x35, writable=0x43, otp=0x3C),     # SRP1, QE, CMP; LB0..LB3 one-time
    ),
    status_writes={0x01: (0, 1)},
    one_byte_clears=0x42,                                   # QE, CMP
    protection=BlockProtection(bp=((0, 2), (0, 3), (0, 4)), tb=(0, 5), sec=(0, 6), cmp=(1, 6)),
    erases={0x20: 0x1000, 0x52: 0x8000, 0xD8: 0x10000},
    busy=BUSY,
    sfdp=SFDP,
    lock_bit=(1, 0),
    volatile_enable=True,
    suspend=Suspend(0x75, 0x7A, erase_bit=(1, 7), program_bit=(1, 7)),
    security=SecurityRegisters(first=0, count=4, size=0x100, lock=((1, 2), (1, 3), (1, 4), (1, 5))),
    unique_id=8,
    qpi_enter=0x38,
)
