"""The chip table: everything the driver needs to know about a SPI NOR part, as data.

A new part is a new entry; the driver reads sizes, opcodes, timings, status registers,
protection layout and unique-ID method from here. Parts that share a JEDEC id (Winbond's
W25Q16DW, W25Q16FW and W25Q16JW all answer EF 60 15) are told apart by the revision of
their SFDP basic flash parameter table, as ufprog does (`identify_part`). Timings are (typical, maximum)
seconds: the driver first waits about the typical time and gives up after the maximum.
Each entry names its sources and the figures no public source confirmed (`assumed`);
docs/flash-chip.md has the same facts as tables.

A part that is not in the table but answers with a valid SFDP is described by
`from_sfdp`: only what JESD216's tables say (density, erase types and times, page size,
address bytes, where QE is), no protection layout, no unique ID. `write_gaps` says what
such a description lacks for writing.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from amdflash.stages.drivers.flash.protection import BP_TB_SEC_CMP, SPI25_READINGS, ProtectionLayout, Reading, Side
from amdflash.stages.drivers.flash.geometry import FLASH_SIZE, UNIT
from amdflash.stages.drivers.flash.sfdp import Sfdp

KiB = 1024


@dataclass(frozen=True)
class EraseType:
    size: int
    opcode: int
    typical: float | None
    maximum: float | None


@dataclass(frozen=True)
class StatusRegister:
    name: str
    read: int            # the opcode that reads it
    write: int | None = None   # the opcode that writes it alone (31h, 11h), where the part has one


@dataclass(frozen=True)
class FailFlags:
    """Bits the part sets itself when a program or an erase failed (Macronix P_FAIL/E_FAIL)."""

    register: int        # index in the part's status registers
    program: int         # bit number
    erase: int


@dataclass(frozen=True)
class UniqueIdMethod:
    """4Bh: opcode, four bytes of address/dummy, then `length` bytes. secured-otp: if the
    security register (2Bh) shows the factory lock, enter secured OTP (B1h), read `length`
    bytes at 0 with 03h, leave (C1h)."""

    kind: Literal["4Bh", "secured-otp"]
    length: int
    enter: int = 0xB1
    exit: int = 0xC1
    security_register: int = 0x2B
    factory_lock: int = 0x01


SR1 = StatusRegister("SR1", 0x05)


@dataclass(frozen=True)
class WriteFacts:
    page_size: int
    page_program: float                 # typical seconds
    erase_typical: dict[int, float]     # erase size -> typical seconds


@dataclass(frozen=True)
class ChipInfo:
    name: str
    jedec: bytes                      # manufacturer, memory type, capacity
    size: int
    page_size: int | None
    erase_types: tuple[EraseType, ...]  # ascending size; the smallest is the erase unit
    chip_erase: EraseType | None
    page_program: tuple[float, float] | None
    status_write: tuple[float, float] | None
    voltage: str
    registers: tuple[StatusRegister, ...] = (SR1,)   # read at identification, in this order
    protection: ProtectionLayout | None = BP_TB_SEC_CMP   # None: not known (SFDP only)
    unique_id: UniqueIdMethod | None = None
    qe: tuple[int, int] | None = None                     # (register index, bit)
    # How CMP is cleared: "01h" writes every register up to CMP's with one 01h (GD25LQ16E,
    # W25Q16DW); "own" writes CMP's register alone with its own opcode (31h on the FW/JW).
    status_write_method: Literal["01h", "own"] = "01h"
    fail_flags: FailFlags | None = None
    # Parts sharing a JEDEC id: the BFPT minor revisions that select this entry (ufprog's
    # rule); () marks the entry taken when no other one matches (or SFDP is unreadable).
    bfpt_minors: tuple[int, ...] | None = None
    address_bytes: str = "3"                              # "3", "3 or 4" or "4" (SFDP's terms)
    source: Literal["table", "sfdp"] = "table"
    flashrom: str = ""                                    # flashrom's entry and tested status
    sources: tuple[str, ...] = ()
    assumed: tuple[str, ...] = field(default=())
    # Where the sources read this part differently, each reading with its source and what
    # amdflash does about it (docs/flash-chip.md, "Where the sources disagree").
    disagreements: tuple[str, ...] = field(default=())

    @property
    def unit(self) -> int:
        """The erase unit: the smallest erase size, the granularity of planning and audit."""
        return self.erase_types[0].size

    def erase_type(self, size: int) -> EraseType:
        for e in self.erase_types:
            if e.size == size:
                return e
        raise ValueError(f"{self.name} has no {size // 1024} KiB erase")

    def write_facts(self) -> WriteFacts:
        """The facts writing needs (page size, typical page-program and erase times), for a
        part whose description has them all: a write was refused before (write_gaps) otherwise."""
        erase_typical: dict[int, float] = {}
        for e in self.erase_types:
            if e.typical is not None:
                erase_typical[e.size] = e.typical
        if self.page_size is None or self.page_program is None or len(erase_typical) < len(self.erase_types):
            raise ValueError(f"{self.name} lacks what a write needs: {'; '.join(self.write_gaps(self.size))}")
        return WriteFacts(self.page_size, self.page_program[0], erase_typical)

    def write_gaps(self, image_size: int = FLASH_SIZE) -> list[str]:
        """What this description lacks for a write (empty: nothing)."""
        gaps = []
        if self.size != image_size:
            gaps.append(f"its density is {self.size // KiB} KiB, the image {image_size // KiB} KiB")
        if not self.page_size:
            gaps.append("no page size")
        if not self.page_program:
            gaps.append("no page-program time")
        if any(e.typical is None for e in self.erase_types):
            gaps.append("no erase times")
        if not self.erase_types or self.unit != UNIT:
            gaps.append("no 4 KiB erase")
        if self.address_bytes == "4":
            gaps.append("it takes 4-byte addresses only (the ROM_SW engine sends at most 3)")
        return gaps

    def facts(self) -> dict[str, object]:
        """The description as JSON-friendly values (recorded with a run)."""
        def times(pair: tuple[float | None, float | None] | None) -> list[float | None] | None:
            return list(pair) if pair else None

        layout = self.protection
        return {
            "source": self.source, "name": self.name, "jedec": self.jedec.hex(), "size": self.size,
            "page_size": self.page_size, "voltage": self.voltage, "address_bytes": self.address_bytes,
            "erase_types": [{"size": e.size, "opcode": f"{e.opcode:02X}h", "typical_s": e.typical,
                             "maximum_s": e.maximum} for e in self.erase_types],
            "chip_erase_s": times((self.chip_erase.typical, self.chip_erase.maximum)) if self.chip_erase else None,
            "page_program_s": times(self.page_program), "status_write_s": times(self.status_write),
            "status_registers": [f"{r.name} {r.read:02X}h" + (f"/{r.write:02X}h" if r.write else "")
                                 for r in self.registers],
            "protection": (f"{layout.scheme}: " + ", ".join(_bit_names(layout))) if layout else None,
            "protection_readings": [r.source for r in layout.all_readings()] if layout else [],
            "unique_id": f"{self.unique_id.kind}, {self.unique_id.length} bytes" if self.unique_id else None,
            "flashrom": self.flashrom or None, "sources": list(self.sources), "assumed": list(self.assumed),
            "disagreements": list(self.disagreements),
        }


def _bit_names(layout: ProtectionLayout) -> list[str]:
    named = [(f"BP{i}", b) for i, b in enumerate(layout.bp)]
    named += [(n, b) for n, b in (("TB", layout.tb), ("SEC", layout.sec), ("CMP", layout.cmp),
                                  (layout.wps_name, layout.wps)) if b is not None]
    return [f"{n}=reg{r}.{bit}" for n, (r, bit) in named]


FLASHROM = "flashrom flashchips (github.com/flashrom/flashrom)"
UFPROG = "ufprog part tables (github.com/hackpascal/ufprog)"

# Where the sources disagree, in words (the protection readings themselves are data in protection.py).
SEC1_BP6 = ("SEC=1, BP=6: flashrom decode_range_spi25 and ufprog wpr_3bp_tb_sec_cmp protect 32 KiB; the "
            "Winbond/GigaDevice datasheet tables (recalled) and flashrom's 2016 writeprotect.c "
            "sec_block_range_pattern (1-2 MiB chips) everything. amdflash refuses what either protects")
OTP_GD = ("security registers: ufprog gd25_otp_3_1k 3 x 1 KiB (GD25LQ16E an alias of its GD25LB16E); flashrom "
          "GD25LQ16 '1024 B total, 256 B reserved' (one entry for the whole GD25LQ16 line). amdflash never "
          "touches them; the emulator models ufprog's per-part figure")
OTP_W25 = ("security registers: ufprog w25q_otp_4 (DW: 4 x 256 B from 0) / w25q_otp_3 (FW, JW: 3 x 256 B from 1); "
           "flashrom W25Q16.W '256 B total' (one entry for all three). amdflash never touches them; the emulator "
           "models ufprog's per-part figures")
CMP_WRITE = ("writing SR2: ufprog sets QE on the FW/JW with 31h (SR2 alone); the kernel's only EF 60 15 entry "
             "writes both registers with a two-byte 01h. amdflash clears CMP with 31h, reads it back, and "
             "falls back to the two-byte 01h")

# GD25LQ16E: only "4 KiB erase max 300 ms" is confirmed publicly; the rest are the GD25LQ
# family's usual figures (docs/flash-chip.md), assumed.
GD25LQ16E = ChipInfo(
    name="GigaDevice GD25LQ16E",
    jedec=bytes((0xC8, 0x60, 0x15)),
    size=0x200000,
    page_size=0x100,
    erase_types=(
        EraseType(0x1000, 0x20, 0.050, 0.300),
        EraseType(0x8000, 0x52, 0.150, 1.0),
        EraseType(0x10000, 0xD8, 0.250, 1.2),
    ),
    chip_erase=EraseType(0x200000, 0xC7, 8.0, 20.0),
    page_program=(0.0005, 0.0024),
    status_write=(0.005, 0.030),
    voltage="1.8 V",
    registers=(SR1, StatusRegister("SR2", 0x35), StatusRegister("SR3", 0x15)),
    unique_id=UniqueIdMethod("4Bh", 16),
    qe=(1, 1),
    flashrom="GD25LQ16 (C8 60 15), tested: untested",
    sources=("the validated reference client", FLASHROM),
    assumed=("every time except the 4 KiB erase maximum",),
    disagreements=(SEC1_BP6, OTP_GD),
)

# W25Q16DW: flashrom "W25Q16.W" (untested, no .reg_bits); layout, unique ID and SFDP
# revision from ufprog; the protection bits sit where the GD25LQ16E's do.
W25Q16DW = ChipInfo(
    name="Winbond W25Q16DW",
    jedec=bytes((0xEF, 0x60, 0x15)),
    size=0x200000,
    page_size=0x100,
    erase_types=(
        EraseType(0x1000, 0x20, 0.045, 0.400),
        EraseType(0x8000, 0x52, 0.120, 1.6),
        EraseType(0x10000, 0xD8, 0.150, 2.0),
    ),
    chip_erase=EraseType(0x200000, 0xC7, 5.0, 25.0),
    page_program=(0.0004, 0.003),
    status_write=(0.010, 0.015),
    voltage="1.8 V",
    registers=(SR1, StatusRegister("SR2", 0x35)),
    unique_id=UniqueIdMethod("4Bh", 8),
    qe=(1, 1),
    flashrom="W25Q16.W (EF 60 15), tested: untested",
    sources=(FLASHROM, UFPROG),
    assumed=("every time (the W25Q16JV datasheet's figures as recalled)",),
    bfpt_minors=tuple(m for m in range(256) if m not in (5, 6)),      # ufprog: any BFPT but the FW's, JW's
    disagreements=(SEC1_BP6, OTP_W25),
)

# W25Q16FW / W25Q16JW: the same id as the W25Q16DW (flashrom's one "W25Q16.W" entry covers
# all three); ufprog tells them apart by the BFPT minor revision (5: FW, 6: JW, else DW) and
# gives each its own facts: three 256-byte security registers (1..3, LB1..LB3; SR2 bit 2 is
# reserved, not LB0), an SR3 (15h/11h: WPS, DRV, HOLD/RST), QE set with 31h (SR2 alone),
# and global block unlock (98h) for the individual block locks WPS=1 selects. The FW keeps
# the DW's QPI (38h); the JW has none. Times: as the DW's, assumed.
_W25Q16W_PROTECTION = ProtectionLayout(bp=((0, 2), (0, 3), (0, 4)), tb=(0, 5), sec=(0, 6), cmp=(1, 6), srp1=(1, 0),
                                       wps=(2, 2), wps_name="WPS", readings=SPI25_READINGS)
W25Q16FW = replace(
    W25Q16DW, name="Winbond W25Q16FW",
    registers=(SR1, StatusRegister("SR2", 0x35, 0x31), StatusRegister("SR3", 0x15, 0x11)),
    protection=_W25Q16W_PROTECTION, status_write_method="own", bfpt_minors=(5,),
    flashrom="W25Q16.W (EF 60 15, shared with the W25Q16DW/JW), tested: untested",
    assumed=("every time (the W25Q16JV datasheet's figures as recalled)",
             "that 01h still takes SR1 and SR2 together (amdflash writes SR2 with 31h, then 01h if CMP stayed)"),
    disagreements=(SEC1_BP6, OTP_W25, CMP_WRITE),
)
W25Q16JW = replace(W25Q16FW, name="Winbond W25Q16JW", bfpt_minors=(6,))

# EF 60 15 whose SFDP cannot be read (so its BFPT revision says nothing): the most careful of
# the three. The FW/JW's registers and layout (SR3's WPS honoured; a DW, which has no SR3,
# reads 0xFF there, reserved bits set, so it has none), CMP cleared with 31h and read back,
# then the two-byte 01h (what a DW takes), every source's reading of the BP bits.
W25Q16W_UNKNOWN = replace(
    W25Q16FW, name="Winbond W25Q16DW, W25Q16FW or W25Q16JW (not told apart by SFDP)",
    protection=replace(_W25Q16W_PROTECTION, wps_reserved=0x1B),      # SR3 bits 0, 1, 3, 4: reserved
    bfpt_minors=(),
    assumed=("every time (the W25Q16JV datasheet's figures as recalled)",
             "that SR3's reserved bits (0, 1, 3, 4) read 0 on the FW/JW, so 0xFF from 15h is a DW's silence"),
)

# MX25U1635F: flashrom "MX25U1635E" (same id; probe and read tested; no .reg_bits); the
# protection table and ESN from ufprog. 35h on this part enables QPI: never send it.
# Its BP bits are read two ways: ufprog's table (the bottom 1 MiB .. 1.94 MiB for BP = 10..14)
# and flashrom's decode_range_spi25, which flashrom applies to the part's 4-BP 16 Mbit
# siblings MX25L1635E and MX25L1633E (every BP from 6 up: everything). amdflash takes both.
_MX_TABLE: tuple[tuple[Side, int], ...] = (
    ("top", 0), ("top", 64 * KiB), ("top", 128 * KiB), ("top", 256 * KiB), ("top", 512 * KiB),
    ("top", 1024 * KiB), ("top", 2048 * KiB), ("top", 2048 * KiB), ("top", 2048 * KiB),
    ("top", 2048 * KiB), ("bottom", 1024 * KiB), ("bottom", 1536 * KiB), ("bottom", 1792 * KiB),
    ("bottom", 1920 * KiB), ("bottom", 1984 * KiB), ("top", 2048 * KiB))
MX_UFPROG = Reading("ufprog mx25x_wpr_type2_4bp_tb0", "table")
MX_FLASHROM = Reading("flashrom decode_range_spi25 as for the MX25L1635E/MX25L1633E", "spi25")
# The MX25U1632F/1633F keep TB in a one-time configuration-register bit (CR bit 3, as flashrom's
# MX25L3273F `.tb = {CONFIG, 3, OTP}`; ufprog MXIC_F_WPR_4BP_TB_OTP), which amdflash does not read:
# both ends are taken as protected.
MX_TB0 = Reading("flashrom decode_range_spi25 with TB=0 (the one-time TB bit is not read)", "spi25", tb=False)
MX_TB1 = Reading("flashrom decode_range_spi25 with TB=1 (the one-time TB bit is not read)", "spi25", tb=True)
_MX_BP = ((0, 2), (0, 3), (0, 4), (0, 5))

MX25U1635F = ChipInfo(
    name="Macronix MX25U1635F",
    jedec=bytes((0xC2, 0x25, 0x35)),
    size=0x200000,
    page_size=0x100,
    erase_types=(
        EraseType(0x1000, 0x20, 0.035, 0.200),
        EraseType(0x8000, 0x52, 0.200, 1.0),
        EraseType(0x10000, 0xD8, 0.350, 2.0),
    ),
    chip_erase=EraseType(0x200000, 0xC7, 10.0, 25.0),
    page_program=(0.0005, 0.003),
    status_write=(0.010, 0.040),
    voltage="1.8 V",
    registers=(StatusRegister("SR", 0x05), StatusRegister("SCUR", 0x2B)),
    protection=ProtectionLayout(bp=_MX_BP, table=_MX_TABLE, wps=(1, 7), wps_name="WPSEL",
                                readings=(MX_UFPROG, MX_FLASHROM)),
    unique_id=UniqueIdMethod("secured-otp", 16),
    qe=(0, 6),
    fail_flags=FailFlags(register=1, program=5, erase=6),
    flashrom="MX25U1635E (C2 25 35), tested: probe and read OK",
    sources=(FLASHROM, UFPROG),
    assumed=("every time (Macronix 1.8 V figures as recalled)",),
    bfpt_minors=(0,),
    disagreements=(
        "BP=10..14: ufprog mx25x_wpr_type2_4bp_tb0 protects the bottom 1 MiB .. 1.94 MiB; flashrom's "
        "decode_range_spi25 for the 4-BP MX25L1635E/MX25L1633E everything. amdflash refuses what either protects",
        "BP=8: missing from ufprog's table; everything by flashrom's rule",
        "the id C2 25 35: flashrom knows one part (MX25U1635E); ufprog three (MX25U1635F SFDP 1.0, MX25U1632F and "
        "MX25U1633F SFDP 1.6). amdflash tells them apart by the SFDP revision"),
)

# MX25U1632F / MX25U1633F: ufprog lists both under C2 25 35 with an SFDP 1.6 (the 1635F's is
# 1.0), P_FAIL/E_FAIL in SCUR, 2 x 512 B OTP with the ESN last, WPSEL in SCUR bit 7 (the 1632F;
# taken for both) and four BP bits with a one-time TB. SFDP cannot tell the two apart; they
# are one entry, and the TB bit is not read (both ends protected). The ESN's place is not
# modelled: no unique ID (resume then needs the same --board).
MX25U163XF = replace(
    MX25U1635F, name="Macronix MX25U1632F/MX25U1633F",
    protection=ProtectionLayout(bp=_MX_BP, wps=(1, 7), wps_name="WPSEL", readings=(MX_TB0, MX_TB1)),
    unique_id=None,
    flashrom="MX25U1635E (C2 25 35, the id it shares), tested: probe and read OK",
    sources=(UFPROG, FLASHROM),
    assumed=("every time (the MX25U1635F's)", "that its busy times and erase set are the MX25U1635F's"),
    bfpt_minors=(6,),
    disagreements=("the 1632F and 1633F share the id and an SFDP 1.6 (ufprog): not told apart; WPSEL (the "
                   "1632F's) is honoured on both; the one-time TB bit is not read, so both ends are protected",),
)

# C2 25 35 whose SFDP does not say which part it is: the most careful of the three — every
# reading of each (the 1635F's table and flashrom's rule, the 1632F/1633F's either TB).
MX25U163X_UNKNOWN = replace(
    MX25U1635F, name="Macronix MX25U1635F, MX25U1632F or MX25U1633F (not told apart by SFDP)",
    protection=ProtectionLayout(bp=_MX_BP, table=_MX_TABLE, wps=(1, 7), wps_name="WPSEL",
                                readings=(MX_UFPROG, MX_FLASHROM, MX_TB1)),
    bfpt_minors=(),
)

CHIPS: tuple[ChipInfo, ...] = (GD25LQ16E, W25Q16W_UNKNOWN, W25Q16DW, W25Q16FW, W25Q16JW, MX25U163X_UNKNOWN,
                               MX25U1635F, MX25U163XF)


def match_jedec(capture: bytes) -> ChipInfo | None:
    """The chip whose JEDEC id appears in an RDID capture (for an id several parts share,
    the family's default entry: `identify_part` picks the member by SFDP).

    The ROM_SW capture of RDID is not aligned to the first byte on every board, so (as the
    validated client does) the id may sit anywhere in the captured bytes, or wrap around
    their end.
    """
    wrapped = capture + capture[:2]
    for chip in CHIPS:
        if chip.jedec in wrapped and not chip.bfpt_minors:
            return chip
    return None


def identify_part(capture: bytes, table: Sfdp | None) -> ChipInfo | None:
    """The table entry for an RDID capture and the part's SFDP: among the entries sharing the
    id, the one whose BFPT minor revision matches (ufprog's rule), else the default: the
    entry that takes every reading of every part sharing the id (SFDP unreadable, or a
    Macronix revision ufprog does not list)."""
    default = match_jedec(capture)
    if default is None or table is None:
        return default
    for chip in CHIPS:
        if chip.jedec == default.jedec and chip.bfpt_minors and table.bfpt_revision[1] in chip.bfpt_minors:
            return chip
    return default


def why_part(chip: ChipInfo, table: Sfdp | None) -> str:
    """Why the identification chose `chip` (for `info` and the run's chip facts)."""
    siblings = [c for c in CHIPS if c.jedec == chip.jedec and c.bfpt_minors]
    if chip.source == "sfdp" or not siblings:
        return f"the JEDEC id {chip.jedec.hex(' ')} is this part's alone in the chip table"
    names = ", ".join(c.name.split(" ", 1)[1] for c in siblings)
    shown = "unreadable" if table is None else f"{table.bfpt_revision[0]}.{table.bfpt_revision[1]}"
    if chip.bfpt_minors:
        return (f"the JEDEC id {chip.jedec.hex(' ')} is shared ({names}); the SFDP basic table's revision "
                f"{shown} selects this one (ufprog's rule)")
    return (f"the JEDEC id {chip.jedec.hex(' ')} is shared ({names}); the SFDP basic table's revision ({shown}) "
            "selects none of the others, so this entry applies")


def from_sfdp(table: Sfdp, capture: bytes) -> ChipInfo:
    """A part the table does not know, described by its SFDP alone."""
    times = table.erase_times or (None,) * len(table.erase_types)
    erases = tuple(EraseType(size, opcode, *(t or (None, None))) for (size, opcode), t in zip(table.erase_types, times))
    registers: tuple[StatusRegister, ...] = (SR1,)
    qe = (0, 6) if table.qer == 0b010 else None
    if table.sr2_read:
        registers += (StatusRegister("SR2", table.sr2_read),)
        qe = (1, 7) if table.sr2_read == 0x3F else (1, 1)
    # JESD216 gives no chip-erase opcode and no status-write time: neither is known here.
    return ChipInfo(
        name=f"unknown part (JEDEC {capture[:3].hex(' ')}, from SFDP {table.revision[0]}.{table.revision[1]})",
        jedec=capture[:3], size=table.size, page_size=table.page_size, erase_types=erases,
        chip_erase=None, page_program=table.page_program, status_write=None, voltage="unknown",
        registers=registers, protection=None, unique_id=None, qe=qe, address_bytes=table.address_bytes,
        source="sfdp",
        sources=("the part's own SFDP tables",))
