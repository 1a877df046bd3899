"""Emulator throughput: register accesses per second through open_bar, on a strict board.

The last mix starts a ROM_SW transaction with every second access (a CNTL write, then the
STATUS read that sees it done): the target is ≥ 150,000 accesses per second. Wall-clock
figures move with the machine's load: run it a few times and take the median.
"""
from __future__ import annotations

import struct
import tempfile
import time

from amdflash.stages.drivers.navi31 import regs as R
from amdflash.stages.sim import create_board, open_bar


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        bar = open_bar(create_board(f"{d}/b", seed=1, strict=True), "asm24")
        zero = struct.pack("<I", 0)
        # A mix like the reference client's: plain registers, the status register, ROM_SW starts.
        for name, ops in (
            ("plain register write+read", lambda: (bar.write(0x1000, zero), bar.read(0x1000, 4))),
            ("ROM_SW_STATUS write+read", lambda: (bar.write(R.ROM_SW_STATUS, zero), bar.read(R.ROM_SW_STATUS, 4))),
            ("ROM_SW transaction start+read", lambda: (bar.write(R.ROM_SW_CNTL, zero), bar.read(R.ROM_SW_STATUS, 4))),
        ):
            n = 100_000
            start = time.perf_counter()
            for _ in range(n):
                ops()
            rate = 2 * n / (time.perf_counter() - start)
            print(f"{name:32} {rate:12,.0f} accesses/s")
        bar.close()


if __name__ == "__main__":
    main()
