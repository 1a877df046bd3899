"""Virtual time for the emulated board.

The clock is the board's `modelled_seconds` counter: transport costs, SPI bus time and
host sleeps all advance it, and flash busy periods are measured against it. It lives in
the board's state file, so it keeps running across host processes.

In real-time mode (scale > 0) the board lives in wall time as a real one does: every
modelled second charged is also slept as `scale` wall seconds, so boards driven in
parallel really overlap; and wall time that passes while the host waits on its own clock
(a client polling with time.sleep, as the reference client does) passes on the board too,
at 1/scale modelled seconds per wall second. Modelled figures are deterministic only
without real-time mode.
"""
from __future__ import annotations

import time

REALTIME_SLICE = 0.002  # sleep in slices so per-access costs do not each pay a syscall


class SimClock:
    def __init__(self, counters: memoryview[float], index: int, sleep_index: int, realtime_scale: float = 0.0):
        self._c = counters
        self._i = index
        self._sleep_i = sleep_index
        self.realtime_scale = realtime_scale
        self._debt = 0.0
        # Wall time and board time when this host opened the board (real-time mode only).
        self._wall = time.perf_counter()
        self._board = counters[index]

    def now(self) -> float:
        if self.realtime_scale:
            self._follow_wall()
        return self._c[self._i]

    def advance(self, seconds: float) -> None:
        """Charge modelled time (a transport cost, SPI time)."""
        if seconds:
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

    def _follow_wall(self) -> None:
        # Charged time is slept off, so wall time never falls behind it for long; when the
        # host has waited on its own, wall time is ahead, and the board follows it.
        by_wall = self._board + (time.perf_counter() - self._wall) / self.realtime_scale
        if by_wall > self._c[self._i]:
            self._c[self._i] = by_wall
            self._debt = 0.0   # that wall time has passed: nothing is owed
