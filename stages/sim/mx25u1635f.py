"""The emulated Macronix MX25U1635F: 16 Mbit, 1.8 V, a table-decoded 4-bit block protection.

Facts and where they come from (docs/flash-chip.md has the table):

* flashrom's flashchips (entry "MX25U1635E", model MACRONIX_MX25U1635E = 0x2535; the
  MX25U1635F answers the same id): JEDEC id C2 25 35; 2048 KiB, 256-byte pages; erasers
  4 KiB (20h), 32 KiB (52h), 64 KiB (D8h), chip (60h, C7h); OTP 512 B, enter B1h, exit
  C1h; "QPI enable 0x35, disable 0xF5"; status register BP0..BP3 and SRWD, "bit6 is quad
  enable"; 1.65-2.0 V; tested: probe and read OK; no `.reg_bits`.
* ufprog's part table (hackpascal/ufprog, vendor-macronix.c, "MX25U1635F"): SFDP 1.0;
  erase 4K/32K/64K; non-volatile status register SR = BP0..BP3 (bits 2..5), QE (bit 6),
  SRWD (bit 7), and the security register (RDSCUR 2Bh); QE in SR1 bit 6; QPI 35h/F5h;
  soft reset 66h/99h; OTP 512 bytes whose first 16 are the factory serial number (ESN),
  present when SCUR bit 0 (FLDO) is set, read in secured-OTP mode; protection ranges
  `mx25x_wpr_type2_4bp_tb0` — BP3..BP0 = 0: none; 1..5: the top 64 KiB × 2^(BP−1); 6..9:
  all; 10..14: all but the top 64 KiB × 2^(14−BP) (i.e. the bottom 1 MiB, 1.5 MiB,
  1.75 MiB, 1.875 MiB, 1.9375 MiB); 15: all. (ufprog's table lists BP = 4 and 5 twice and
  BP = 8 not at all; the first entries and "8 = all" are taken, the latter as flashrom's rule
  reads it.) The emulated chip follows this table; flashrom reads BP = 6..15 of the part's
  4-BP siblings (MX25L1635E, MX25L1633E: decode_range_spi25) as "all", and the driver refuses
  what either reading protects (docs/flash-chip.md, "Where the sources disagree").

* ufprog's MX25U1635F flags `program-erase-fail-indicator-in-scur` (SCUR bit 5 P_FAIL,
  bit 6 E_FAIL) and `wpsel-scur-bit7`; flashrom's Macronix entries with a reg_bits map
  name the same bit (`.wps = {SECURITY, 7, OTP}`, "set by WPSEL command"), and its
  writeprotect.c gives up on a chip whose WPS bit is set and not writable (this one-time bit;
  a Winbond's writable WPS it does not refuse): BP bits are then ignored and each block has
  its own lock. WPSEL is 68h, global unlock 98h, global lock 7Eh.

So, unlike the GD25LQ16E and W25Q16DW: four BP bits, no TB, SEC or CMP; QE in SR1; a
table, not flashrom's generic formula (which would call BP = 10 "everything"); 35h,
which reads SR2 on the others, switches this part to QPI, which the ROM_SW engine cannot
leave; no 4Bh unique ID; no 50h volatile status write; suspend/resume are B0h/30h with
their status in the security register.

Assumed: every busy time (page 0.5/3 ms, 4 KiB 35/200 ms, 32 KiB 200/1000 ms, 64 KiB
350/2000 ms, chip 10/25 s, status write 10/40 ms: Macronix 1.8 V figures as recalled, not
confirmed), the security register's suspend bits (PSB bit 2, ESB bit 3) and LDSO (bit 1)
placement beyond FLDO, that the individual locks are all set at power-up and by a reset, that
a refused (protected) program or erase sets P_FAIL/E_FAIL and that each program or erase
clears its flag when it succeeds, that WPSEL itself takes no busy time, the SFDP fields
beyond revision, density, erase types, 4 KiB opcode and QPI, the vendor parameter table's
contents, and the device byte 35h for 90h/ABh.
"""
from __future__ import annotations

from amdflash.stages.sim.parts import (
                                       BlockProtection, IndividualLocks, PartSpec, Register, SecuredOtp, Suspend,
                                       )
from amdflash.stages.sim.sfdp_table import Bfpt, build_sfdp

KiB = 1024

BUSY: dict[int, tuple[float, float]] = {
    0x02: (0.5e-3, 3e-3), 0x20: (35e-3, 200e-3), 0x52: (200e-3, 1.0), 0xD8: (350e-3, 2.0),
    0x60: (10.0, 25.0), 0xC7: (10.0, 25.0), 0x01: (10e-3, 40e-3),
}

# BP3..BP0 -> (side, protected bytes), ufprog's mx25x_wpr_type2_4bp_tb0.
PROTECTION_TABLE: tuple[tuple[str, int], ...] = (
    ("top", 0), ("top", 64 * KiB), ("top", 128 * KiB), ("top", 256 * KiB), ("top", 512 * KiB),
    ("top", 1024 * KiB),
    ("top", 2048 * KiB), ("top", 2048 * KiB), ("top", 2048 * KiB), ("top", 2048 * KiB),
    ("bottom", 2048 * KiB - 1024 * KiB), ("bottom", 2048 * KiB - 512 * KiB),
    ("bottom", 2048 * KiB - 256 * KiB), ("bottom", 2048 * KiB - 128 * KiB),
    ("bottom", 2048 * KiB - 64 * KiB),
    ("top", 2048 * KiB),
)

# A Macronix vendor parameter table (id C2h) follows the basic table, as Macronix's SFDP
# areas have one; its contents (supply range, feature bits) are assumed.
VENDOR_TABLE = (0xC2, 0x0100, (0x16502000, 0xFFFF0F33, 0xFFFFFFFF, 0x00000000))

SFDP = build_sfdp(Bfpt(
    revision=(1, 0), density_bits=16 << 20,
    erase_types=((0x1000, 0x20, 35e-3), (0x8000, 0x52, 200e-3), (0x10000, 0xD8, 350e-3)),
    read_112=False, read_114=False, read_444=(4, 2, 0xEB)), VENDOR_TABLE)

MX25U1635F = PartSpec(
    name="MX25U1635F",
    description="Macronix MX25U1635F, 16 Mbit, 1.8 V",
    jedec=bytes((0xC2, 0x25, 0x35)),
    device_id=0x35,
    registers=(
        Register("SR", 0x05, writable=0xFC),                  # BP0..BP3, QE, SRWD
        Register("SCUR", 0x2B, initial=0x01),                 # FLDO: the factory locked the ESN
    ),
    status_writes={0x01: (0,)},
    protection=BlockProtection(bp=((0, 2), (0, 3), (0, 4), (0, 5)), table=PROTECTION_TABLE,  # type: ignore[arg-type]
                               select=(1, 7)),                # SCUR bit 7: WPSEL
    individual_locks=IndividualLocks(select_opcode=0x68),
    fail_flags=((1, 5), (1, 6)),                              # SCUR P_FAIL, E_FAIL
    erases={0x20: 0x1000, 0x52: 0x8000, 0xD8: 0x10000},
    busy=BUSY,
    sfdp=SFDP,
    suspend=Suspend(0xB0, 0x30, erase_bit=(1, 3), program_bit=(1, 2)),
    secured_otp=SecuredOtp(enter=0xB1, exit=0xC1, size=0x200, esn=16, factory_lock=(1, 0), user_lock=(1, 1)),
    qpi_enter=0x35,
)
