"""The floors of a job: the least modelled time it can take, computed from the cost model.

Both are computations over the job's ROM_SW transactions, never measurements:

* The **physical floor** is the flash's typical busy time for the erases and programs the
  job needs plus the SPI time of every byte that must cross the bus (opcode, address, data
  of every read, write enable, erase and program), with zero transport cost.
* The **transport floor** is the least time any driver could take over a transport (the
  `asm24` bridge unless told otherwise) under the board's rules: a transaction starts when
  its CNTL write lands and ends its SPI time later; nothing touches COMMAND, CNTL or the
  data window until its end has been observed; the chip takes a transaction only when it
  is not busy. Per transaction that leaves, as the least work a driver must do:

  1. clear STATUS, write COMMAND when it changes, load TX data into the window — as single
     posted writes or one streamed write from STATUS, whichever is quicker;
  2. write CNTL so that it lands no earlier than the chip is free;
  3. observe the done bit with a read that lands no earlier than the transaction's end: a
     single STATUS read, or — when the window holds the previous RX capture the job needs —
     one streamed read of STATUS up to the end of that data.

  Loads the next transaction does not need the chip for (clearing STATUS, COMMAND, TX data)
  overlap the flash's busy time; data for a page program is loaded before the write enable
  that precedes it, while the previous page programs. RX results arrive one transaction
  late (the data window shows the preceding capture), so a chain of reads costs one more
  transaction than it has reads, and reads of one job form one chain. Busy waits cost
  nothing but the wait: a driver that knew the exact busy time would poll no status.

The transport floor counts on the link's latency: an observing read sent that long before
the transaction's end lands just after it, a CNTL write sent that long before the chip is
free lands just then. No driver can know that latency on a real link (it varies, and a
host may be delayed at any moment), so a driver that never lets an access touch a
transaction in flight sends the read no earlier than the end itself, by its own clock (and
CNTL no earlier than the chip is free). `transport_floor(..., credit_latency=False)` is the
least time under that rule too: the **observed floor**, the one such a driver can reach.

Reads of kept data count as amdflash's confirmation policy reads them (stages/confirm.py):
a chunk whose content is known, may confirm itself (neither patterned nor found elsewhere in
the image) and is found as expected — in a verify against the image, a unit found equal to the
image before a flash, the read-back of the data written — is read once; every other kept
chunk `kept_reads` times (a dump, the backup of a unit about to change, patterned content).
The floors idealise the reads of one job into one chain, so they count nothing for proving
where a read came from (amdflash reads the whole window once where a chain starts, and a
read it cannot prove is read again): that, like any chain start, is amdflash's own cost.

A job is a list of `Op`s; `read_ops`, `program_ops`, `verify_ops` and `flash_ops` build the
usual ones.
"""
from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Iterable, Sequence

from amdflash.stages.confirm import Expectation
from amdflash.stages.drivers.flash.chips import GD25LQ16E, ChipInfo
from amdflash.stages.drivers.flash.planning import PlanCosts, apply_cover, cover, plan_unit
from amdflash.stages.drivers.navi31.regs import ROM_SW_DATA, ROM_SW_STATUS
from amdflash.stages.sim.cost import ASM24, CostProfile, spi_seconds

CHUNK = 0x100
STATUS_TO_WINDOW = ROM_SW_DATA - ROM_SW_STATUS      # STATUS, COMMAND, one reserved dword
DEFAULT_PRESCALE = 8


@dataclass(frozen=True)
class Op:
    """One ROM_SW transaction of a job."""

    wire: int                  # bytes on the SPI bus: opcode, address, TX data or RX clocks
    busy: float = 0.0          # flash busy time it starts (typical)
    load: int = 0              # bytes written into the data window before it starts
    delivers: int = 0          # bytes of the preceding RX capture read from the window after it
    new_command: bool = True   # COMMAND differs from the preceding transaction's
    physical: bool = True      # its bytes must cross the bus (False: only the RX quirk needs it)


def read_ops(chunks: int, chunk: int = CHUNK) -> list[Op]:
    """A chain of `chunks` array reads (03h, 3 address bytes), plus the trailing transaction
    that brings the last capture into the window (same command, no data clocked)."""
    if not chunks:
        return []
    ops = [Op(4 + chunk, delivers=chunk if i else 0) for i in range(chunks)]
    ops.append(Op(4, delivers=chunk, new_command=False, physical=False))
    return ops


def program_ops(pages: int, chip: ChipInfo = GD25LQ16E) -> list[Op]:
    """Write enable and page program for each page; the page's data loads before the enable."""
    ops: list[Op] = []
    facts = chip.write_facts()
    for _ in range(pages):
        ops.append(Op(1, load=facts.page_size))
        ops.append(Op(4 + facts.page_size, busy=facts.page_program))
    return ops


def erase_ops(size: int, chip: ChipInfo = GD25LQ16E) -> list[Op]:
    chip.erase_type(size)   # one of the part's erase sizes (ValueError otherwise)
    return [Op(1), Op(4, busy=chip.write_facts().erase_typical[size])]


def physical_floor(ops: Iterable[Op], prescale: int = DEFAULT_PRESCALE) -> float:
    return sum(spi_seconds(op.wire, prescale) + op.busy for op in ops if op.physical)


def transport_floor(ops: Sequence[Op], profile: CostProfile = ASM24, prescale: int = DEFAULT_PRESCALE,
                    credit_latency: bool = True) -> float:
    """The least time for `ops` over `profile` (see the module docstring), in seconds;
    `credit_latency=False`: the observed floor (nothing sent before the moment it waits for)."""
    host = 0.0          # when the host may start its next access
    chip_free = 0.0     # when the flash has finished its last busy period
    waits_for = 0.0     # when the host may send the next CNTL write (the chip free by its clock)
    cntl = profile.tlp_write32()
    for op in ops:
        host += _loads(op, profile)
        issue = max(host, (chip_free - cntl.lands) if credit_latency else waits_for)
        returned = issue + cntl.total
        spi = spi_seconds(op.wire, prescale)
        end = issue + cntl.lands + spi
        observe = (profile.stream_read(STATUS_TO_WINDOW + op.delivers) if op.delivers
                   else profile.tlp_read32())
        # Without the latency: the read waits for the end the host can be sure of, counted
        # from the CNTL write's return.
        host = max(returned, (end - observe.lands) if credit_latency else (returned + spi)) + observe.total
        chip_free = end + op.busy
        waits_for = returned + spi + op.busy
    return max(host, chip_free)


def _loads(op: Op, profile: CostProfile) -> float:
    """Clearing STATUS, COMMAND if it changes, TX data: the quickest way to write them."""
    single = profile.tlp_write32().total
    separate = single * (2 if op.new_command else 1)
    if op.load:
        separate += profile.stream_write(op.load).total
    # One stream from STATUS: STATUS, COMMAND, the reserved dword, then the window.
    span = 8 if not op.load else STATUS_TO_WINDOW + op.load
    streamed = profile.stream_write(span).total
    mixed = single + profile.stream_write(span - 4).total if op.new_command else separate
    return min(separate, streamed, mixed)


# -- the usual jobs ---------------------------------------------------------------------------

def dump_ops(size: int = GD25LQ16E.size, reads_per_unit: int = 1) -> list[Op]:
    """Read everything once (or `reads_per_unit` times, when reads are confirmed): a dump has
    no expectation."""
    return read_ops(reads_per_unit * size // CHUNK)


def kept_reads_of(found: bytes, expected: Expectation | None, address: int, size: int, kept_reads: int,
                  whole: bool = False) -> int:
    """Chunk reads that confirm the kept unit [address, address+size) holding `found`, as
    amdflash confirms it: a chunk found as `expected` that may confirm itself is read once,
    any other `kept_reads` times (`whole`: a unit that differs anywhere from its expectation,
    the backup of a unit about to change, takes `kept_reads` for every chunk)."""
    chunks = -(-size // CHUNK)
    if kept_reads <= 1:
        return chunks
    if expected is None or (whole and found != expected.image[address:address + size]):
        return chunks * kept_reads
    once = sum(1 for a in range(address, address + size, CHUNK)
               if expected.confirming(a, min(CHUNK, address + size - a))
               and found[a - address:a - address + CHUNK] == expected.image[a:a + CHUNK])
    return once + (chunks - once) * kept_reads


def verify_ops(board: bytes, image: bytes, kept_reads: int = 1, unit: int = GD25LQ16E.unit) -> list[Op]:
    """Read everything, each chunk as often as its confirmation against `image` needs."""
    expected = Expectation(image) if kept_reads > 1 else None
    return read_ops(sum(kept_reads_of(board[a:a + unit], expected, a, unit, kept_reads)
                        for a in range(0, len(board), unit)))


def plan_costs(profile: CostProfile = ASM24, chip: ChipInfo = GD25LQ16E,
               prescale: int = DEFAULT_PRESCALE) -> PlanCosts:
    """What each kind of work costs at the floor, for choosing erases."""
    def steady(ops: list[Op]) -> float:
        # The cost of one more repetition in a long run: no start-up, no trailing work.
        return transport_floor(ops * 3, profile, prescale) - transport_floor(ops * 2, profile, prescale)

    unit_reads = chip.unit // CHUNK
    return PlanCosts(
        {e.size: steady(erase_ops(e.size, chip)) for e in chip.erase_types},
        steady(program_ops(1, chip)),
        unit_reads * steady([Op(4 + CHUNK, delivers=CHUNK)]),
    )


def flash_ops(current: bytes, image: bytes, first: int = 0, count: int | None = None,
              chip: ChipInfo = GD25LQ16E, kept_reads: int = 1, profile: CostProfile = ASM24,
              prescale: int = DEFAULT_PRESCALE) -> list[Op]:
    """Writing `image` over `current` in units first..first+count: read every unit, erase
    and program what the quickest cover needs, read back every written unit. Every read is
    of kept data (the backup of a unit about to change, a unit found equal to the image, a
    passing read-back), each counted as amdflash confirms it (`kept_reads_of`; `kept_reads`
    2 by default, 1: unconfirmed)."""
    unit = chip.unit
    count = chip.size // unit - first if count is None else count
    addresses = [(first + i) * unit for i in range(count)]
    page_size = chip.write_facts().page_size
    plans = [plan_unit(a, current[a:a + unit], image[a:a + unit], page_size) for a in addresses]
    erases = cover(plans, [e.size for e in chip.erase_types], plan_costs(profile, chip, prescale))
    plans = apply_cover(plans, erases, page_size)
    written = [p for p in plans if p.action != "skip"]
    expected = Expectation(image) if kept_reads > 1 else None
    backup = sum(kept_reads_of(current[a:a + unit], expected, a, unit, kept_reads, whole=True) for a in addresses)
    ops = read_ops(backup)[:-1]   # the backup chain runs on
    for e in sorted(erases, key=lambda e: e.address):
        ops += erase_ops(e.size, chip)
        ops += program_ops(sum(len(p.pages) for p in written if e.address <= p.address < e.address + e.size), chip)
    ops += program_ops(sum(len(p.pages) for p in written if p.action == "program"), chip)
    verify = read_ops(sum(kept_reads_of(image[p.address:p.address + unit], expected, p.address, unit, kept_reads)
                          for p in written))
    if verify:
        # The verify chain continues the backup chain: its first read already delivers.
        verify[0] = Op(verify[0].wire, delivers=CHUNK)
    else:
        verify = [Op(4, delivers=CHUNK, new_command=False, physical=False)]
    return ops + verify
