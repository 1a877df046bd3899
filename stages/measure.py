"""Stage: measure a board's timings on its own clock, for `amdflash hardware-report`.

Every figure is taken on the transport's clock (wall time on hardware, the virtual clock
on an emulated board) and comes with its spread or its bounds, so that a report says how
far each figure can be trusted:

* link latency per transfer kind (single-TLP read and write, streamed read and write of
  4..256 bytes): each access timed `samples` times on the ROM_SW data window, which is
  scratch space while no transaction runs (the engine is told to forget what it held);
* the SPI time of a ROM_SW read of n bytes: the least sleep after the CNTL write after which
  one STATUS read shows done, found by bisection over repeated transactions. The read lands
  part-way through its round trip, so the SPI time is that sleep plus the read's landing
  delay, taken as half its round trip (an assumption, stated in the report);
* flash busy times (only on a scratch block the user gave up): the time from the end of the
  starting transaction's SPI time to the first status read that shows WIP clear, bounded by
  the status reads around it, and narrowed by bisection over operations of the same kind
  while they all agree; a kind whose operations take different times is reported as a
  spread: the normal under which every operation's bounds are likeliest (BusyProbe).
"""
from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from amdflash.stages.drivers.navi31 import regs as R
from amdflash.stages.drivers.navi31.romsw import RomSw
from amdflash.stages.transport.base import Bar5

BLOCK_SIZES = (4, 16, 64, 256)      # streamed transfer sizes timed (the window holds 256 bytes)
SPI_SIZES = (16, 64, 256)           # RX counts of the SPI-time bisection
BISECT_STEPS = 14
POLL_FRACTION = 0.01
AGREE = 1e-9               # seconds: bounds closer than this are one time (float rounding)
POLL_MIN = 20e-6            # seconds: on a native link a status read takes a few microseconds
WIP = 0x01
RDSR1, WREN, PP = 0x05, 0x06, 0x02
SPI_REFCLK_HZ, SPI_OVERHEAD = 100e6, 1e-6   # the engine's assumed bus (docs/rom-sw.md)


def distribution(values: list[float]) -> dict[str, float | int]:
    return {"n": len(values), "min": min(values), "median": statistics.median(values),
            "mean": statistics.fmean(values), "max": max(values),
            "stdev": statistics.pstdev(values) if len(values) > 1 else 0.0}


def spi_nominal(wire_bytes: int, prescale: int) -> float:
    return SPI_OVERHEAD + 8 * wire_bytes * (prescale + 1) / SPI_REFCLK_HZ


def _timed(clock, act: Callable[[], object]) -> float:
    start = clock.now()
    act()
    return clock.now() - start


def transport_latency(bar: Bar5, samples: int = 16) -> dict[str, Any]:
    """Round-trip times of each access kind, on the idle engine's data window."""
    clock, window = bar.clock, R.ROM_SW_DATA
    value = bar.read32(window)
    out: dict[str, Any] = {
        "read32": distribution([_timed(clock, lambda: bar.read32(window)) for _ in range(samples)]),
        "write32": distribution([_timed(clock, lambda: bar.write32(window, value)) for _ in range(samples)]),
        "read_block": {}, "write_block": {},
    }
    for size in BLOCK_SIZES:
        data = bar.read_block(window, size)
        out["read_block"][str(size)] = distribution(
            [_timed(clock, functools.partial(bar.read_block, window, size)) for _ in range(samples)])
        out["write_block"][str(size)] = distribution(
            [_timed(clock, functools.partial(bar.write_block, window, data)) for _ in range(samples)])
    return out


def spi_times(engine: RomSw, prescale: int) -> dict[str, Any]:
    """SPI time of an n-byte RX transaction (03h, 3 address bytes), by bisection of the
    sleep after CNTL that one STATUS read needs to see done."""
    bar, clock = engine.bar, engine.bar.clock
    land = statistics.median(_timed(clock, lambda: bar.read32(R.ROM_SW_STATUS)) for _ in range(8)) / 2
    sizes: dict[str, Any] = {}
    for count in SPI_SIZES:
        wire = 4 + count
        nominal = spi_nominal(wire, prescale)
        lo, hi = 0.0, 4 * nominal + 4 * land

        def done_after(sleep: float, count: int = count) -> bool:
            bar.write32(R.ROM_SW_STATUS, 0)
            bar.write32(R.ROM_SW_COMMAND, 0x03)          # read at address 0
            bar.write32(R.ROM_SW_CNTL, 3 << 16 | R.ROM_SW_RETURN_DATA_ENABLE | count)
            sent = clock.now()
            clock.sleep(sent + sleep - clock.now())
            seen = bar.read32(R.ROM_SW_STATUS) & R.ROM_SW_DONE
            while not bar.read32(R.ROM_SW_STATUS) & R.ROM_SW_DONE:   # never leave one running
                if clock.now() > sent + 1.0:
                    raise TimeoutError("a ROM_SW read of the SPI-time probe did not finish in 1 s")
                clock.sleep(1e-5)
            return bool(seen)

        if done_after(0.0):
            sizes[str(count)] = {"wire_bytes": wire, "seconds_at_most": land, "nominal": nominal}
            continue
        for _ in range(BISECT_STEPS):
            mid = (lo + hi) / 2
            if done_after(mid):
                hi = mid
            else:
                lo = mid
        sizes[str(count)] = {"wire_bytes": wire, "seconds": hi + land, "error": hi - lo + land,
                             "nominal": nominal}
    engine.forget()
    return {"prescale": prescale, "read_landing": land, "sizes": sizes}


@dataclass
class Staircase:
    """Robbins-Monro search for the time by which a fraction `p` of the operations are done:
    each operation answers one status read at `x` (done or still busy) and moves `x` by a
    step that shrinks as answers come in. It only places the reads where they tell most
    about the spread; the figures come from every read's answer (censored_normal_fit)."""

    p: float
    x: float
    step: float
    trail: list[float] = field(default_factory=list)

    def answer(self, done: bool) -> None:
        self.x = max(0.0, self.x - self.step / (len(self.trail) + 1) ** 0.6 * (float(done) - self.p))
        self.trail.append(self.x)


# The staircases' targets, in turn: the median twice as often as each of the one-sigma quantiles.
STAIR_TARGETS = (0.5, 0.15866, 0.5, 0.84134)
POLL_FIRST = 3             # operations timed by polling alone before any read is placed
TIGHT = 0.1                 # per-operation bounds this narrow (of the time) pin each operation


@dataclass
class BusyProbe:
    """Busy times of one kind of operation.

    Each operation is polled until done, which bounds its own time, and one status read is
    placed where it tells most. While all operations agree with one time (a chip whose every
    operation of the kind takes the same), that read bisects what is still unknown; once the
    bisection has narrowed it, reads go just outside the bounds, where a constant time never
    answers otherwise. Real chips vary: once two operations' bounds exclude each other the kind
    `varies` — beyond the timing's own uncertainty (`tolerance`: a real link's jitter puts the
    host's clock off from the chip's by part of a round trip). Its spread is the normal
    likeliest for every operation's bounds (censored_normal_fit); where polling cannot pin each
    operation (one shorter than a status read's round trip), staircases place the reads around
    the median and the one-sigma quantiles, where they tell most about it."""

    lo: float = 0.0
    hi: float | None = None
    samples: list[float] = field(default_factory=list)
    bounds: list[tuple[float, float]] = field(default_factory=list)
    seen_busy: bool = False
    varies: bool = False
    stairs: list[Staircase] = field(default_factory=list)
    # How far a time taken on the host's clock is from when the chip saw it: about the standard
    # deviation of a status read's round trip (a link's jitter), set by the meter.
    noise: float = 0.0
    _turn: int = 0

    @property
    def tolerance(self) -> float:
        """Bounds that miss each other by no more than this may be one time (4 sigma of noise)."""
        return AGREE + 4 * self.noise

    def next_delay(self) -> float | None:
        """Where this operation's status read goes (seconds after its start), or None."""
        if self.hi is None or len(self.bounds) < POLL_FIRST:
            return None
        if self.varies:
            if self._pinned():
                return None                     # polling alone gives each operation's time
            if not self.stairs:
                middle = (self.lo + self.hi) / 2
                self.stairs = [Staircase(p, middle, 0.25 * middle) for p in sorted(set(STAIR_TARGETS))]
            return self._stair().x
        if len(self.bounds) < BISECT_STEPS:
            return (self.lo + self.hi) / 2
        # Outside the bounds by more than the timing's uncertainty, so an answer there that
        # disagrees is the chip's doing, not the link's.
        margin = max(self.hi - self.lo, 0.02 * self.hi, 1.5 * self.tolerance)
        return self.lo - margin if len(self.bounds) % 2 else self.hi + margin

    def _pinned(self) -> list[tuple[float, float]]:
        """The operations polling pinned (bounds within TIGHT of their time), when most were."""
        tight = [(lo, hi) for lo, hi in self.bounds if hi - lo <= TIGHT * (lo + hi) / 2]
        return tight if 2 * len(tight) > len(self.bounds) else []

    def _stair(self) -> Staircase:
        p = STAIR_TARGETS[self._turn % len(STAIR_TARGETS)]
        return next(s for s in self.stairs if s.p == p)

    def answered(self, done: bool) -> None:
        """The status read this operation placed at `next_delay()` found it done (or busy)."""
        if self.varies and self.stairs:
            self._stair().answer(done)
            self._turn += 1

    def add(self, lo: float, hi: float) -> None:
        """One operation took between lo and hi seconds."""
        self.bounds.append((lo, hi))
        if self.hi is None:
            self.lo, self.hi = lo, hi
        elif max(self.lo, lo) > min(self.hi, hi) + self.tolerance:
            self.varies = True
        elif not self.varies:
            self.lo, self.hi = max(self.lo, lo), max(min(self.hi, hi), max(self.lo, lo))

    def result(self) -> dict[str, Any]:
        assert self.hi is not None
        if not self.seen_busy:
            # Over before the first status read could land (a page program over a slow link):
            # only an upper bound, the one every operation kept.
            return {"seconds_at_most": max(hi for _, hi in self.bounds) if self.varies else self.hi,
                    "polled": distribution(self.samples)}
        if not self.varies:
            # The bounds every operation agrees with, and the host clock's own uncertainty.
            return {"seconds": (self.lo + self.hi) / 2, "error": (self.hi - self.lo) / 2 + 4 * self.noise,
                    "polled": distribution(self.samples)}
        if not any(lo > self.tolerance for lo, _ in self.bounds):
            # No read ever saw one busy beyond the timing's own uncertainty: only a bound.
            return {"seconds_at_most": max(hi for _, hi in self.bounds), "polled": distribution(self.samples)}
        # Every operation's own bounds fitted as the normal under which they are likeliest (the
        # reads the staircases placed count as much as the polls); the error is a 95 % interval
        # of the median. The bounds were taken on the host's clock: their noise adds its
        # variance to the chip's, and is taken out of the spread.
        mu, observed, error = censored_normal_fit(self.bounds)
        sigma = max(0.0, observed ** 2 - self.noise ** 2) ** 0.5
        answers = sum(len(s.trail) for s in self.stairs)
        pinned = self._pinned()
        if pinned:
            # Most operations pinned by polling: their range is the real one (around the fit).
            own = [(lo + hi) / 2 for lo, hi in pinned]
            least, most = min(min(own), mu), max(max(own), mu)
            how = f"the normal likeliest for every operation's bounds; min and max of the {len(pinned)} polling pinned"
        else:
            least, most = max(0.0, mu - 3 * sigma), mu + 3 * sigma
            how = (f"the normal likeliest for every operation's bounds ({answers} status reads placed by staircases); "
                   "min and max are the median -+ 3 sigma")
        return {"seconds": mu, "error": error, "polled": distribution(self.samples),
                "per_operation": {"n": len(self.bounds), "min": least, "median": mu, "mean": mu, "max": most,
                                  "stdev": sigma, "estimated": how}}


def censored_normal_fit(bounds: list[tuple[float, float]]) -> tuple[float, float, float]:
    """(mu, sigma, error of mu) of the normal under which operations known only to have taken
    between lo and hi seconds each are likeliest. A grid search, narrowed four times; the
    error stated is a 95 % interval: mu's standard error from the likelihood's curvature,
    times Student's t for n - 1 degrees of freedom."""
    def loglik(mu: float, sigma: float) -> float:
        nd = statistics.NormalDist(mu, sigma)
        return sum(math.log(max(nd.cdf(hi) - nd.cdf(lo), 1e-300)) for lo, hi in bounds)

    scale = max(hi for _, hi in bounds)
    if scale <= 0:
        return 0.0, 0.0, 0.0                    # every operation was over at once
    mu_lo, mu_hi = 0.0, scale
    ls_lo, ls_hi = math.log(scale * 1e-3), math.log(scale)      # log sigma
    best = (0.0, 0.0, -math.inf)
    for _ in range(5):
        for i in range(13):
            mu = mu_lo + (mu_hi - mu_lo) * i / 12
            for j in range(13):
                ls = ls_lo + (ls_hi - ls_lo) * j / 12
                value = loglik(mu, math.exp(ls))
                if value > best[2]:
                    best = (mu, ls, value)
        mu_step, ls_step = (mu_hi - mu_lo) / 12, (ls_hi - ls_lo) / 12
        mu_lo, mu_hi = best[0] - 2 * mu_step, best[0] + 2 * mu_step
        ls_lo, ls_hi = best[1] - 2 * ls_step, best[1] + 2 * ls_step
    mu, sigma = best[0], math.exp(best[1])
    h = max(sigma * 0.05, 1e-12)
    curvature = (loglik(mu + h, sigma) - 2 * best[2] + loglik(mu - h, sigma)) / (h * h)
    se = 1 / math.sqrt(-curvature) if curvature < 0 else sigma
    # A 95 % interval: Student's t for the few operations there are (sigma is estimated from
    # them too, and the maximum likelihood sigma divides by n, not n - 1).
    n = len(bounds)
    if n < 3:
        return mu, sigma, 4 * max(se, sigma)
    nu = n - 1
    z = 1.959964
    t = z + (z ** 3 + z) / (4 * nu) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * nu ** 2)
    return mu, sigma, t * se * math.sqrt(n / nu)


class BusyMeter:
    """Runs one operation (write enable, the command) and times its busy period."""

    def __init__(self, engine: RomSw, prescale: int):
        self.engine, self.prescale = engine, prescale
        self.clock = engine.bar.clock
        self.kinds: dict[int, BusyProbe] = {}
        self._sent: list[float] = []
        self._round_trips: list[float] = []
        self._lead = 0.0
        engine.observer = lambda *a: self._sent.append(self.clock.now())

    def _status(self) -> tuple[float, int]:
        """(when the chip answered the status read, SR1). The chip answers at the end of the
        transaction's SPI time (1 opcode byte, 2 bytes read); a chained read must not take
        a capture left waiting by an earlier one, so the engine forgets it first."""
        self.engine.forget()
        self._sent.clear()
        began = self.clock.now()
        sr1 = self.engine.read(RDSR1)[0]
        self._round_trips.append(self.clock.now() - began)
        return self._sent[0] + spi_nominal(3, self.prescale), sr1

    def _noise(self) -> float:
        """The standard deviation of a status read's round trip: a time taken on the host's
        clock is off from the chip's by part of a round trip's jitter."""
        trips = self._round_trips[-256:]
        return statistics.pstdev(trips) if len(trips) > 1 else 0.0

    def run(self, opcode: int, address: int, tx: bytes = b"", timeout: float = 30.0) -> None:
        engine, clock = self.engine, self.clock
        probe = self.kinds.setdefault(opcode, BusyProbe())
        engine.command(WREN)
        self._sent.clear()
        engine.command(opcode, address, 3, tx)
        start = self._sent[0] + spi_nominal(4 + len(tx), self.prescale)
        lo, hi = 0.0, float("inf")              # this operation's own bounds
        delay = probe.next_delay()
        if delay is not None:
            # One status read where it tells most (BusyProbe). It answers `lead` after it is
            # sent (its register writes and SPI time).
            clock.sleep(start + delay - self._lead - clock.now())
            sent = clock.now()
            at, sr1 = self._status()
            self._lead = at - sent
            if sr1 & WIP:
                probe.seen_busy = True
                lo = at - start
            else:
                hi = at - start
            probe.answered(not sr1 & WIP)
        last_busy = start
        while True:
            at, sr1 = self._status()
            if not sr1 & WIP:
                break
            # Polls 1 % of the elapsed time apart (at least 20 us): a fast link does not send tens
            # of thousands of status reads through an erase; the bound stays within about 1 %.
            clock.sleep(max(POLL_FRACTION * (at - start), POLL_MIN))
            last_busy = at
            probe.seen_busy = True
            if at - start > timeout:
                raise TimeoutError(f"opcode {opcode:#04x} at {address:#08x} still busy after {timeout:g} s")
        # A board without physical time (or a busy period over before its SPI time's estimate
        # ended) is done at once: never a negative time.
        done = max(0.0, at - start)
        probe.samples.append(done)
        probe.noise = self._noise()
        probe.add(max(lo, last_busy - start, 0.0), min(hi, done))

    def close(self) -> None:
        self.engine.observer = None
