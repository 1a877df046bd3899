"""A full recovery flash through `amdflash flash`: modelled and wall seconds (asm24 and
ideal profiles), audit rows written, and the wall-time ratio of audit on vs a null store.

The board holds random content; the image is dense (every page programmed), so every
unit is erased, programmed and verified.
"""
from __future__ import annotations

import os
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from amdflash.stages.transport.sim import create_board
from tests.bench.bench_flash import modelled

SIZE = 0x200000


def main(repeats: int = 3) -> None:
    work = Path(tempfile.mkdtemp(prefix="amdflash-audit-bench-"))
    rng = random.Random(11)
    current = rng.randbytes(SIZE)
    image = bytearray(rng.randbytes(SIZE))
    image[:4] = b"\xaa\x55\xaa\x55"
    (work / "image.bin").write_bytes(image)
    db = work / "audit.sqlite"
    env = {**os.environ, "AMDFLASH_DB": str(db), "PYTHONPATH": os.getcwd()}
    n = 0
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for _ in range(repeats):
        for profile in ("asm24", "ideal"):
            for audit in ("audit", "null"):
                n += 1
                board = create_board(work / f"b{n}", content=current, transport=profile, seed=n)
                entry = "tests.bench.null_store" if audit == "null" else "amdflash.pipeline.cli"
                start = time.perf_counter()
                subprocess.run([sys.executable, "-m", entry, "-q", "flash", str(work / "image.bin"),
                                "--yes", "--force", "--board", f"sim:{board}"], check=True, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                results.setdefault((profile, audit), []).append((time.perf_counter() - start, modelled(board)))
    con = sqlite3.connect(db)
    runs = [r[0] for r in con.execute("SELECT run_id FROM runs ORDER BY seq")]
    total_rows = con.execute("SELECT seq FROM chain_head").fetchone()[0]
    per_run = total_rows / len(runs)
    print(f"{'profile':8} {'store':6} {'modelled s':>11} {'wall s (median)':>16}")
    for (profile, audit), values in results.items():
        walls = [w for w, _ in values]
        print(f"{profile:8} {audit:6} {values[0][1]:11.2f} {statistics.median(walls):16.2f}")
    for profile in ("asm24", "ideal"):
        on = statistics.median(w for w, _ in results[(profile, "audit")])
        off = statistics.median(w for w, _ in results[(profile, "null")])
        print(f"{profile}: audit on / null store wall-time ratio {on / off:.2f}")
    print(f"audit rows per full flash: {per_run:.0f} (over {len(runs)} audited runs)")
    for table in ("register_writes", "spi_transactions", "units", "verifies", "backup_units"):
        count = con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        print(f"  {table:18} {count / len(runs):9.0f} per run")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
