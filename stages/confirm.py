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

Confirmation by expectation (`confirm_expected`). Where the right answer is known — a verify
against an image, the read-back of the data just written, a unit of the board found equal to
the image before a flash — a read that returns exactly the expected bytes needs no second
read: no flipped bit, dropped byte or glitching line turns wrong bytes into exactly the
expected ones. Two kinds of match prove nothing, so such a chunk still takes agreeing reads:

* expected content a fault produces as well (`patterned`): a chunk that repeats itself with
  a period of at most 128 bytes — one byte over and over (all 0xFF: a busy chip, pads not
  released, a line stuck high; all 0x00: a line stuck low; 0x55/0xAA: a line that toggles),
  or a short pattern, which a read displaced by a whole period (a dropped or extra clock, a
  flipped low address bit) returns unchanged; and expected content the image holds at another
  256-byte position too (`Expectation`), which a misaddressed read returns as well;
* a read that is not proven to come from the chip in answer to this request: the data window
  may still hold what the host wrote into it (the page just programmed) or an earlier capture.
  The ROM_SW driver proves each delivery from the window's content (navi31/romsw.py,
  docs/rom-sw.md); a read it cannot prove does not confirm itself.

A mismatch never confirms itself: the chunk is read again and voted on as above, its first
read counting as one. The backup of a unit about to change has no expectation: when any chunk
of a unit differs from the image, the whole unit is confirmed by agreeing reads (`whole`).

The vote logic is pure (reads come from a callable), so it is tested on its own; the
ROM_SW path reads a unit's copies as one chain (cheap in chained RX mode), the aperture
path votes over whole dumps.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from collections.abc import Callable, Iterable, Sequence

from amdflash.stages.drivers.flash.geometry import FLASH_SIZE

CHUNK = 0x100            # one ROM_SW read transaction
EXTRA_READS = 6          # reads beyond k before a chunk is given up
MAJORITY = 3             # a disputed byte needs at least this many agreeing reads
MAX_AGREEING = 7         # the most agreeing reads the noise estimate may ask for
RISK = 1e-6              # accepted chance of a coincidentally agreeing wrong byte per flash
DETAIL_BYTES = 16        # disputed bytes described in the audit row
PATTERN_PERIOD = 128     # expected content repeating with this period or a shorter one proves nothing

Ranges = Sequence[tuple[int, int]]
ReadChunks = Callable[[Ranges], Iterable[bytes]]   # the bytes of each (address, size), in order
# ... and for each, whether the read provably came from the chip in answer to that request.
ProvenChunks = Callable[[Ranges], Iterable[tuple[bytes, bool]]]


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
        while k < MAX_AGREEING and FLASH_SIZE * p ** k / 8 ** (k - 1) > RISK:
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
    matched: int = 0                             # chunks confirmed by their expected content
    chunks: int = 0                              # chunks read

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


def patterned(chunk: bytes) -> bool:
    """Whether `chunk` repeats itself with a period of at most PATTERN_PERIOD bytes (and at
    most half its length): one byte over and over, or a short pattern."""
    n = len(chunk)
    limit = min(PATTERN_PERIOD, n // 2)
    if limit < 1:
        return True
    head = chunk[:4]
    p = chunk.find(head, 1)
    while 0 < p <= limit:
        if chunk[p:] == chunk[:n - p]:
            return True
        p = chunk.find(head, p + 1)
    return False


class Expectation:
    """What the flash should hold (`image`, the whole flash), and which of its chunks may
    confirm themselves by a match: those neither `patterned` nor found at another 256-byte
    position of the image (a misaddressed read would return those as well). `what` names
    it in the audit trail: "the image", "the data written"."""

    def __init__(self, image: bytes, what: str = "the image", chunk: int = CHUNK):
        self.image, self.what, self.chunk = image, what, chunk
        seen = Counter(image[a:a + chunk] for a in range(0, len(image), chunk))
        self._confirming = {a: seen[image[a:a + chunk]] == 1 and not patterned(image[a:a + chunk])
                            for a in range(0, len(image), chunk)}

    def labelled(self, what: str) -> Expectation:
        """The same expectation under another name (the chunk table is shared)."""
        other = object.__new__(Expectation)
        other.__dict__.update(self.__dict__, what=what)
        return other

    def confirming(self, address: int, size: int) -> bool:
        """Whether a read of [address, address+size) that returns exactly the expected bytes
        confirms itself (given it provably came from the chip)."""
        return size == self.chunk and self._confirming.get(address, False)

    def confirming_count(self, address: int, size: int) -> int:
        """How many of the chunks of [address, address+size) may confirm themselves."""
        return sum(self.confirming(a, min(self.chunk, address + size - a))
                   for a in range(address, address + size, self.chunk))


def confirm_expected(read: ProvenChunks, address: int, size: int, need: int, expected: Expectation,
                     noise: Noise | None = None, whole: bool = False, likely_equal: bool = True) -> Confirmation:
    """Confirm [address, address+size) knowing what it should hold (see the module docstring).

    Every chunk is read once; a chunk whose expected content may confirm itself and whose read
    equals it and is proven to come from the chip is confirmed by that match. Every other chunk
    is confirmed by agreeing reads, its first read counting as one: those that can never
    confirm themselves take all their reads in the first chain already (as do all chunks when
    the caller expects the unit to differ, `likely_equal=False`), so a board as expected needs
    one chain per unit. `whole`: a unit any chunk of which differs from its expectation is
    confirmed by agreeing reads throughout (the backup of a unit about to change)."""
    noise = noise if noise is not None else Noise()
    k = noise.agreeing(need)
    ranges = [(a, min(CHUNK, address + size - a)) for a in range(address, address + size, CHUNK)]
    wanted = {a: expected.image[a:a + n] for a, n in ranges}
    may = {a: expected.confirming(a, n) for a, n in ranges}
    more = [r for r in ranges if not (may[r[0]] and likely_equal)]
    first = list(ranges) + more * (k - 1)
    copies: dict[int, list[bytes]] = {a: [] for a, _ in ranges}
    proven: dict[int, bool] = {a: False for a, _ in ranges}
    for (a, _), (data, ok) in zip(first, read(first), strict=True):
        copies[a].append(data)
        proven[a] = proven[a] or ok
    differs = any(c != wanted[a] for a, _ in ranges for c in copies[a])
    matched = set() if whole and differs else {
        a for a, _ in ranges if may[a] and proven[a] and all(c == wanted[a] for c in copies[a])}
    rest = [(a, n) for a, n in ranges if a not in matched]

    def again(batch: Ranges) -> list[bytes]:
        return [data for data, _ in read(batch)]

    voted = _vote(again, rest, k, noise, {a: copies[a] for a, _ in rest}) if rest else {}
    for a, n in ranges:
        if a in matched:
            noise.byte_reads += n * len(copies[a])
            voted[a] = ((wanted[a], [], [], {}), len(copies[a]))
    result = _assemble(address, size, ranges, voted, k)
    result.matched = len(matched)
    return result


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


def _vote(read: ReadChunks, ranges: Ranges, k: int, noise: Noise,
          copies: dict[int, list[bytes]] | None = None) -> dict[int, tuple[_Settled, int]]:
    """Every chunk read up to k times in one call (`copies`: reads already taken); then, one
    call per pass, once more each chunk that still has unsettled bytes, until none has or the
    bound is reached."""
    copies = {a: list((copies or {}).get(a, [])) for a, _ in ranges}
    settled: dict[int, tuple[_Settled, int]] = {}
    pending = list(ranges)
    batch = [(a, n) for r in range(k) for a, n in pending if len(copies[a]) + r < k]
    while True:
        if batch:
            for (a, _), data in zip(batch, read(batch), strict=True):
                copies[a].append(data)
        for a, _ in pending:
            settled[a] = (settle(copies[a], k), len(copies[a]))
        pending = [(a, n) for a, n in pending if settled[a][0][2]]
        batch = [(a, n) for a, n in pending if len(copies[a]) < k + EXTRA_READS]
        if k <= 1 or not batch:
            break
    for a, n in ranges:
        (_, _, _, votes), reads = settled[a]
        noise.byte_reads += n * reads
        noise.flips += sum(reads - tally.most_common(1)[0][1] for tally in votes.values())
    return settled


def _assemble(address: int, size: int, ranges: Ranges, settled: dict[int, tuple[_Settled, int]],
              k: int) -> Confirmation:
    result = Confirmation(address, size, b"".join(settled[a][0][0] for a, _ in ranges),
                          max(settled[a][1] for a, _ in ranges), k, chunks=len(ranges))
    for a, _ in ranges:
        (_, differing, unsettled, votes), _ = settled[a]
        base = a - address
        result.differing += [base + o for o in differing]
        result.unsettled += [base + o for o in unsettled]
        for o in differing[:DETAIL_BYTES] + unsettled[:1]:
            if o in votes and (len(result.votes) < DETAIL_BYTES or o in unsettled[:1]):
                result.votes[base + o] = votes[o]
    return result
