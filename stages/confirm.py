"""Confirmed reads: a byte is kept only when independent reads of it agree.

An unstable cell or a noisy SPI line makes a single read lie now and then, and nothing in
the bytes shows it. So everything amdflash keeps (a dump, the backup of a unit about to be
erased, a passing verify) is read at least twice and compared:

* a byte is confirmed when `k` reads of it all agree (k ≥ the run's `--reads`, 2 by default);
* where reads of a 256-byte chunk disagree, the chunk is read again, and a disputed byte
  is confirmed only when one value has at least max(3, k) reads and more than half of all
  reads of it; past a bound (k + 6 reads) it is given up and the caller fails naming the
  unit rather than keep a guess;
* `k` grows with the noise the board has shown. Two reads that agree can both be wrong: on
  a board whose reads flip a byte with probability p, identical flips in k reads happen
  with probability about p^k/8^(k-1) per byte (a flip hits one of 8 bits). `k` is the least
  that keeps the chance of one such byte anywhere in a 2 MiB flash below 1e-6, with p
  estimated from the disagreements seen so far in the run (2 up to p ≈ 2e-6, 3 up to
  3e-4, 4 up to 1.2e-3, 5 up to 1.8e-2).

The vote logic is pure (reads come from a callable), so it is tested on its own; the
ROM_SW path reads a unit's copies as one chain (cheap in chained RX mode), the aperture
path votes over whole dumps.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from collections.abc import Callable, Iterable, Sequence

CHUNK = 0x100            # one ROM_SW read transaction
EXTRA_READS = 6          # reads beyond k before a chunk is given up
MAJORITY = 3             # a disputed byte needs at least this many agreeing reads
MAX_AGREEING = 7         # the most agreeing reads the noise estimate may ask for
FLASH_BYTES = 0x200000
RISK = 1e-6              # accepted chance of a coincidentally agreeing wrong byte per flash
DETAIL_BYTES = 16        # disputed bytes described in the audit row

Ranges = Sequence[tuple[int, int]]
ReadChunks = Callable[[Ranges], Iterable[bytes]]   # the bytes of each (address, size), in order


class UnconfirmedRead(RuntimeError):
    """Reads of a unit did not agree, even after re-reading: nothing of it may be kept."""

    def __init__(self, result: Confirmation, purpose: str):
        offset = result.unsettled[0]
        votes = result.votes.get(offset, Counter())
        seen = ", ".join(f"{v:02x}×{n}" for v, n in votes.most_common(4))
        what = (f"the identification read {purpose.removeprefix('identify ')} at {result.address:#08x}"
                if purpose.startswith("identify") else f"unit {result.address:#08x} ({purpose})")
        super().__init__(
            f"reads of {what} do not agree: {len(result.unsettled)} byte(s) "
            f"unconfirmed after {result.reads} reads, first at {result.address + offset:#08x} (read {seen}); "
            "an unstable cell or a noisy SPI line — nothing of it was kept")
        self.address = result.address
        self.result = result


@dataclass
class Noise:
    """How often this board's reads have disagreed in this run; sets `k`."""

    byte_reads: int = 0
    flips: int = 0          # reads of a byte that lost its vote

    @property
    def rate(self) -> float:
        return self.flips / self.byte_reads if self.byte_reads else 0.0

    def agreeing(self, need: int) -> int:
        """Agreeing reads a byte needs: at least `need`, more on a noisy board."""
        if need <= 1:
            return 1
        p, k = self.rate, need
        while k < MAX_AGREEING and FLASH_BYTES * p ** k / 8 ** (k - 1) > RISK:
            k += 1
        return k


@dataclass
class Confirmation:
    """The outcome of reading one unit until its bytes agreed (or the bound was reached)."""

    address: int
    size: int
    data: bytes
    reads: int                                   # most reads taken of any chunk
    agreeing: int = 2                            # k the reads were held to
    differing: list[int] = field(default_factory=list)    # offsets whose reads were not unanimous
    unsettled: list[int] = field(default_factory=list)    # offsets with no confirmed value
    votes: dict[int, Counter] = field(default_factory=dict)   # of the first disputed offsets

    @property
    def resolved(self) -> bool:
        return not self.unsettled

    def detail(self) -> str:
        """JSON for the audit row: the disputed bytes and how they were read."""
        return json.dumps({
            "agreeing_reads_needed": self.agreeing,
            "bytes": [[f"{self.address + o:#08x}", {f"{v:02x}": n for v, n in self.votes[o].most_common()}]
                      for o in self.differing[:DETAIL_BYTES] if o in self.votes],
            "unsettled": [f"{self.address + o:#08x}" for o in self.unsettled[:DETAIL_BYTES]],
        })


_Settled = tuple[bytes, list[int], list[int], "dict[int, Counter]"]


def settle(copies: Sequence[bytes], k: int) -> _Settled:
    """Vote over the reads of one chunk: (bytes, differing offsets, unsettled offsets, votes).

    A byte is settled when all its reads agree and there are at least `k` of them, or when
    one value has at least max(3, k) reads and more than half of them.
    """
    first = copies[0]
    n = len(copies)
    if all(c == first for c in copies[1:]):
        return first, [], ([] if n >= k else list(range(len(first)))), {}
    out = bytearray(first)
    differing: list[int] = []
    unsettled: list[int] = []
    votes: dict[int, Counter] = {}
    enough = max(MAJORITY, k)
    for offset, column in enumerate(zip(*copies)):
        if column.count(column[0]) == n:
            if n < k:
                unsettled.append(offset)
            continue
        differing.append(offset)
        tally = votes[offset] = Counter(column)
        value, count = tally.most_common(1)[0]
        if count >= enough and 2 * count > n:
            out[offset] = value
        else:
            unsettled.append(offset)
    return bytes(out), differing, unsettled, votes


def confirm(read: ReadChunks, address: int, size: int, need: int, noise: Noise | None = None,
            chunk: int = CHUNK) -> Confirmation:
    """Read [address, address+size) until every byte is confirmed or the bound is reached."""
    ranges = [(a, min(chunk, address + size - a)) for a in range(address, address + size, chunk)]
    noise = noise if noise is not None else Noise()
    k = noise.agreeing(need)
    voted = _vote(read, ranges, k, noise)
    return _assemble(address, size, ranges, voted, k)


def confirm_whole(read_all: Callable[[], bytes], size: int, unit: int, need: int,
                  noise: Noise | None = None) -> list[Confirmation]:
    """Confirm a path that reads only everything at once (the ROM aperture): k whole reads,
    then one more whole read per pass while some unit is unsettled; the vote is per unit.
    One Confirmation per unit, in address order."""
    def read(ranges: Ranges) -> list[bytes]:
        wholes: list[bytes] = []
        seen: Counter = Counter()
        out = []
        for a, n in ranges:
            if seen[a] == len(wholes):
                wholes.append(read_all())
            out.append(wholes[seen[a]][a:a + n])
            seen[a] += 1
        return out

    noise = noise if noise is not None else Noise()
    k = noise.agreeing(need)
    ranges = [(a, unit) for a in range(0, size, unit)]
    voted = _vote(read, ranges, k, noise)
    return [_assemble(a, n, [(a, n)], voted, k) for a, n in ranges]


def _vote(read: ReadChunks, ranges: Ranges, k: int, noise: Noise) -> dict[int, tuple[_Settled, int]]:
    """Every chunk read k times in one call; then, one call per pass, once more each chunk
    that still has unsettled bytes, until none has or the bound is reached."""
    copies: dict[int, list[bytes]] = {a: [] for a, _ in ranges}
    settled: dict[int, tuple[_Settled, int]] = {}
    pending = list(ranges)
    batch = pending * k
    while True:
        for (a, _), data in zip(batch, read(batch), strict=True):
            copies[a].append(data)
        for a, _ in pending:
            settled[a] = (settle(copies[a], k), len(copies[a]))
        pending = [(a, n) for a, n in pending if settled[a][0][2]]
        if k <= 1 or not pending or len(copies[pending[0][0]]) >= k + EXTRA_READS:
            break
        batch = pending
    for a, n in ranges:
        (_, _, _, votes), reads = settled[a]
        noise.byte_reads += n * reads
        noise.flips += sum(reads - tally.most_common(1)[0][1] for tally in votes.values())
    return settled


def _assemble(address: int, size: int, ranges: Ranges, settled: dict[int, tuple[_Settled, int]],
              k: int) -> Confirmation:
    result = Confirmation(address, size, b"".join(settled[a][0][0] for a, _ in ranges),
                          max(settled[a][1] for a, _ in ranges), k)
    for a, _ in ranges:
        (_, differing, unsettled, votes), _ = settled[a]
        base = a - address
        result.differing += [base + o for o in differing]
        result.unsettled += [base + o for o in unsettled]
        for o in differing[:DETAIL_BYTES] + unsettled[:1]:
            if o in votes and (len(result.votes) < DETAIL_BYTES or o in unsettled[:1]):
                result.votes[base + o] = votes[o]
    return result
