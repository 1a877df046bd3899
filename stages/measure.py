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
  the status reads around it, and narrowed by bisection over operations of the same kind.
"""
from __future__ import annotations

import functools
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from amdflash.stages.navi31 import regs as R
from amdflash.stages.navi31.romsw import RomSw
from amdflash.stages.transport.base import Bar5

BLOCK_SIZES = (4, 16, 64, 256)      # streamed transfer sizes timed (the window holds 256 bytes)
SPI_SIZES = (16, 64, 256)           # RX counts of the SPI-time bisection
BISECT_STEPS = 14
POLL_FRACTION = 0.01
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


def fit_line(points: dict[str, Any]) -> tuple[float, float, float]:
    """(intercept, slope per byte, largest residual) of the medians over the sizes."""
    xs = [float(k) for k in points]
    ys = [points[k]["median"] for k in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    intercept = my - slope * mx
    return intercept, slope, max(abs(y - intercept - slope * x) for x, y in zip(xs, ys))


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
class BusyProbe:
    """Busy times of one kind of operation: bounds from polling, narrowed by bisection."""

    lo: float = 0.0
    hi: float | None = None
    samples: list[float] = field(default_factory=list)

    seen_busy: bool = False

    def result(self) -> dict[str, Any]:
        assert self.hi is not None
        if not self.seen_busy:
            # Over before the first status read could land (a page program over a slow link):
            # only an upper bound.
            return {"seconds_at_most": self.hi, "polled": distribution(self.samples)}
        return {"seconds": (self.lo + self.hi) / 2, "error": (self.hi - self.lo) / 2,
                "polled": distribution(self.samples)}


class BusyMeter:
    """Runs one operation (write enable, the command) and times its busy period."""

    def __init__(self, engine: RomSw, prescale: int):
        self.engine, self.prescale = engine, prescale
        self.clock = engine.bar.clock
        self.kinds: dict[int, BusyProbe] = {}
        self._sent: list[float] = []
        self._lead = 0.0
        engine.observer = lambda *a: self._sent.append(self.clock.now())

    def _status(self) -> tuple[float, int]:
        """(when the chip answered the status read, SR1). The chip answers at the end of the
        transaction's SPI time (1 opcode byte, 2 bytes read); a chained read must not take
        a capture left waiting by an earlier one, so the engine forgets it first."""
        self.engine.forget()
        self._sent.clear()
        sr1 = self.engine.read(RDSR1)[0]
        return self._sent[0] + spi_nominal(3, self.prescale), sr1

    def run(self, opcode: int, address: int, tx: bytes = b"", timeout: float = 30.0) -> None:
        engine, clock = self.engine, self.clock
        probe = self.kinds.setdefault(opcode, BusyProbe())
        engine.command(WREN)
        self._sent.clear()
        engine.command(opcode, address, 3, tx)
        start = self._sent[0] + spi_nominal(4 + len(tx), self.prescale)
        if probe.hi is not None:
            # Bisection: one status read at the middle of what is still unknown.
            # The status read answers `lead` after it is sent (its register writes and SPI time).
            clock.sleep(start + (probe.lo + probe.hi) / 2 - self._lead - clock.now())
            sent = clock.now()
            at, sr1 = self._status()
            self._lead = at - sent
            if sr1 & WIP:
                probe.seen_busy = True
                probe.lo = max(probe.lo, at - start)
            else:
                probe.hi = min(probe.hi, at - start)
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
        if probe.hi is None:
            probe.lo, probe.hi = max(0.0, last_busy - start), done
        else:
            probe.hi = min(probe.hi, done)
            probe.lo = max(probe.lo, last_busy - start)

    def close(self) -> None:
        self.engine.observer = None
