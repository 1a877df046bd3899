"""Virtual time for the emulated board.

The clock is the board's `modelled_seconds` counter: transport costs, SPI bus time and
host sleeps all advance it, and flash busy periods are measured against it. It lives in
the board's state file, so it keeps running across host processes. In real-time mode the
clock also sleeps `scale` wall seconds per modelled second, so boards driven in parallel
really overlap in wall time.
"""
from __future__ import annotations

import time

REALTIME_SLICE = 0.002  # sleep in slices so per-access costs do not each pay a syscall


class SimClock:
    def __init__(self, counters: memoryview, index: int, sleep_index: int, realtime_scale: float = 0.0):
        self._c = counters
        self._i = index
        self._sleep_i = sleep_index
        self.realtime_scale = realtime_scale
        self._debt = 0.0

    def now(self) -> float:
        return self._c[self._i]

    def advance(self, seconds: float) -> None:
        """Charge modelled time (a transport cost, SPI time)."""
        self._c[self._i] += seconds
        if self.realtime_scale:
            self._pay(seconds)

    def sleep(self, seconds: float) -> None:
        """The host waits: time passes on the board."""
        if seconds <= 0:
            return
        self._c[self._i] += seconds
        self._c[self._sleep_i] += seconds
        if self.realtime_scale:
            self._pay(seconds)

    def _pay(self, seconds: float) -> None:
        self._debt += seconds * self.realtime_scale
        if self._debt >= REALTIME_SLICE:
            start = time.perf_counter()
            time.sleep(self._debt)
            # Oversleeping is paid back from the next slices.
            self._debt -= time.perf_counter() - start
