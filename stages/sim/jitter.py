"""Link latencies that vary from transfer to transfer, for a board calibrated from a real one.

A real USB bridge (or PCIe root port) does not answer every transfer in the same time. A
calibration may give a transfer latency's spread (calibration.py: median, stdev, min, max);
each access of such a board then adds to the cost model's figures the difference between a
draw and the median: a normal draw, clipped to min..max, one per transfer it rides in (a
single-TLP read over USB is two control transfers; the dwords of one native-PCIe access share
one draw). A posted write lands a jittering handshake before the host sees its transfer
complete, so the host's clock never says exactly when the chip saw it. A board without a
spread never gets here.

The draws come from one generator per opened board, seeded from the board's seed and the
virtual moment it was opened: the same run on the same board takes the same modelled seconds.
"""
from __future__ import annotations

import random
from collections.abc import Mapping

from amdflash.stages.sim.cost import Access, CostProfile


class LinkJitter:
    def __init__(self, cost: CostProfile, spreads: Mapping[str, tuple[float, float, float, float]], seed: int,
                 now: float):
        self._usb = cost.usb
        self._rng = random.Random(f"{seed}:{now!r}")
        self._spreads = dict(spreads)

    def _delta(self, name: str) -> float:
        spread = self._spreads.get(name)
        if spread is None:
            return 0.0
        median, stdev, least, most = spread
        return min(most, max(least, self._rng.gauss(median, stdev))) - median

    def read32(self, access: Access) -> Access:
        if self._usb:                   # the TLP out and its completion back: two control transfers
            first, second = self._delta("control"), self._delta("control")
            return Access(access.lands + first, access.total + first + second)
        return Access(access.lands, access.total + self._delta("pcie_read_dword"))

    def _ack(self, name: str) -> float:
        """How much earlier than the host sees its transfer complete a posted write landed: the
        transfer's handshake after the firmware took it, which jitters too (>= 0)."""
        spread = self._spreads.get(name)
        return abs(self._rng.gauss(0.0, spread[1] / 2)) if spread else 0.0

    def write32(self, access: Access) -> Access:
        if self._usb:
            d = self._delta("control")
            return Access(max(0.0, access.lands + d - self._ack("control")), access.total + d)
        return Access(access.lands, access.total + self._delta("pcie_write_dword"))

    def stream_read(self, access: Access, size: int) -> Access:
        if self._usb:                   # armed by a control transfer (it lands then), data in one bulk IN
            control, bulk = self._delta("control"), self._delta("bulk")
            return Access(access.lands + control, access.total + control + bulk)
        return Access(access.lands, access.total + ((size + 3) >> 2) * self._delta("pcie_read_dword"))

    def stream_write(self, access: Access, size: int) -> Access:
        if self._usb:                   # a control transfer, then the bulk OUT it lands with
            d = self._delta("control") + self._delta("bulk")
            return Access(max(0.0, access.lands + d - self._ack("bulk")), access.total + d)
        return Access(access.lands, access.total + ((size + 3) >> 2) * self._delta("pcie_write_dword"))

    def transfer(self, name: str, median: float) -> float:
        """One USB transfer's fixed latency (the emulated bridge's own transfers)."""
        return median + self._delta(name)
