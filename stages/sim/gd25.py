"""The emulated GigaDevice GD25LQ16E (docs/flash-chip.md): the board's own part, fully checked.

Facts: JEDEC id C8 60 15 and 90h/ABh device byte 14h; 2 MiB, 256-byte pages; erase 4 KiB
(20h), 32 KiB (52h), 64 KiB (D8h), chip (60h/C7h); three status registers (05h/35h/15h)
with BP2..BP0, TB, SEC, SRP0 in SR1 and SRP1, QE, SUS2, LB1..LB3, CMP, SUS1 in SR2; 01h
writes SR1 [and SR2], 31h SR2, 11h SR3 (DRV1..DRV0 in bits 6..5); three 1 KiB security
registers at 0x1000/0x2000/0x3000 locked by LB1..LB3 (ufprog's `gd25_otp_3_1k`, three
0x400-byte registers from index 1, for its GD25LB16E entry whose aliases are the GD25LE16E
and GD25LQ16E; flashrom's GD25LQ16 comment reads "OTP: 1024B total, 256B reserved");
16-byte unique ID (4Bh); 75h/7Ah suspend/resume; 66h/99h reset; 50h volatile status write. Only the 4 KiB erase maximum
(300 ms) is confirmed publicly: the other times are the GD25LQ family's usual figures,
assumed. QPI is not modelled (the engine drives one data line and never asks for it).
"""
from __future__ import annotations

from amdflash.stages.sim.parts import BlockProtection, PartSpec, Register, SecurityRegisters, Suspend
from amdflash.stages.sim.sfdp_table import Bfpt, build_sfdp

# Typical and maximum busy times in seconds, by the opcode that starts them.
BUSY: dict[int, tuple[float, float]] = {
    0x02: (0.5e-3, 2.4e-3), 0x20: (50e-3, 300e-3), 0x52: (150e-3, 1.0), 0xD8: (250e-3, 1.2),
    0x60: (8.0, 20.0), 0xC7: (8.0, 20.0),
    0x01: (5e-3, 30e-3), 0x31: (5e-3, 30e-3), 0x11: (5e-3, 30e-3),
    0x42: (0.5e-3, 2.4e-3), 0x44: (50e-3, 300e-3),
}

# No dump of the real part's SFDP is public: the table follows JESD216B (revision 1.6)
# with the part's density, erase types and page size; the fast-read, suspend, deep
# power-down, quad-enable and reset fields describe what the GD25LQ datasheets describe. QER
# is 101b (QE is SR2 bit 1, SR2 read with 35h, written with a two-byte 01h), the code Linux's
# sfdp.c reads as "35h reads SR2": the emulated chip answers 35h. (Until issue 30 it said 100b,
# which Linux reads as "no SR2 read instruction", contradicting the chip.) Times encode the typical
# column as closely as JESD216's units allow (48 / 144 / 256 ms, 512 µs, 8 s) with a max
# multiplier of 6 (4 KiB max = 288 ms, within the confirmed 300 ms).
SFDP = build_sfdp(Bfpt(
    revision=(1, 6), density_bits=16 << 20,
    erase_types=((0x1000, 0x20, 50e-3), (0x8000, 0x52, 150e-3), (0x10000, 0xD8, 250e-3)),
    page_program=0.5e-3, chip_erase=8.0, qer=0b101))

GD25LQ16E = PartSpec(
    name="GD25LQ16E",
    description="GigaDevice GD25LQ16E, 16 Mbit, 1.8 V (the Navi31 reference boards' part)",
    jedec=bytes((0xC8, 0x60, 0x15)),
    device_id=0x14,
    registers=(
        Register("SR1", 0x05, writable=0xFC),
        Register("SR2", 0x35, writable=0x43, otp=0x38),     # SRP1, QE, CMP; LB1..LB3 one-time
        Register("SR3", 0x15, writable=0x60),               # DRV0, DRV1
    ),
    status_writes={0x01: (0, 1), 0x31: (1,), 0x11: (2,)},
    protection=BlockProtection(bp=((0, 2), (0, 3), (0, 4)), tb=(0, 5), sec=(0, 6), cmp=(1, 6)),
    erases={0x20: 0x1000, 0x52: 0x8000, 0xD8: 0x10000},
    busy=BUSY,
    sfdp=SFDP,
    lock_bit=(1, 0),
    volatile_enable=True,
    suspend=Suspend(0x75, 0x7A, erase_bit=(1, 7), program_bit=(1, 2)),
    security=SecurityRegisters(first=1, count=3, size=0x400, lock=((1, 3), (1, 4), (1, 5))),
    unique_id=16,
)
