"""A full dense recovery flash through `amdflash flash`: wall seconds with the audit trail and
with a store that keeps nothing (median of several, alternating), and what one flash adds
to the audit database — rows and bytes, the first flash and the ones after it.

The board holds random content and the image is random (every page programmed), so every
unit is backed up, erased, programmed and verified: 4 MiB of content no compression or
deduplication can shrink. Every board of a repeat holds the same content and is flashed
with the same image, as a lab recovering a batch of boards would: content-addressed blobs
then store that content once.

    python -m tests.bench.bench_audit [REPEATS] [PROFILE ...]      (default: 5 ideal)
"""
from __future__ import annotations

import os
import random
import resource
import sqlite3
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from amdflash.stages.sim import create_board

SIZE = 0x200000


def _rows(db: Path) -> dict[str, int]:
    con = sqlite3.connect(db)
    try:
        tables = [t for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE '\\_%' "
                                            "ESCAPE '\\' AND name NOT LIKE 'sqlite_%'")]
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables}
    finally:
        con.close()


def _children_cpu() -> float:
    """User + system CPU seconds of every finished child process so far (their own children,
    such as the audit writer, included once waited for)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _bytes(db: Path) -> int:
    """The database's size compacted (VACUUM INTO): what the rows take, without free pages or WAL."""
    out = db.with_name("vacuumed.sqlite")
    out.unlink(missing_ok=True)
    con = sqlite3.connect(db)
    con.execute(f"VACUUM INTO '{out}'")
    con.close()
    size = out.stat().st_size
    out.unlink()
    return size


def main(repeats: int = 5, profiles: tuple[str, ...] = ("ideal",)) -> None:
    work = Path(tempfile.mkdtemp(prefix="amdflash-audit-bench-"))
    try:
        measure(work, repeats, profiles)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def measure(work: Path, repeats: int, profiles: tuple[str, ...]) -> None:
    rng = random.Random(11)
    current = rng.randbytes(SIZE)
    image = bytearray(rng.randbytes(SIZE))
    image[:4] = b"\xaa\x55\xaa\x55"
    (work / "image.bin").write_bytes(image)
    db = work / "audit.sqlite"
    env = {**os.environ, "AMDFLASH_DB": str(db), "AMDFLASH_HOST_KEY": str(work / "host_key.pem"),
           "PYTHONPATH": os.getcwd()}
    walls: dict[tuple[str, str], list[float]] = {}
    cpus: dict[tuple[str, str], list[float]] = {}      # CPU seconds of the command and its writer
    growth: list[tuple[dict[str, int], int]] = []
    n = 0
    for i in range(repeats):
        for profile in profiles:
            for audit in (("audit", "null") if i % 2 == 0 else ("null", "audit")):
                n += 1
                board = create_board(work / f"b{n}", content=current, transport=profile, seed=n)
                entry = "tests.bench.null_store" if audit == "null" else "amdflash.pipeline.cli.main"
                before = (_rows(db), _bytes(db)) if audit == "audit" and db.exists() else ({}, 0)
                cpu = _children_cpu()
                start = time.perf_counter()
                subprocess.run([sys.executable, "-m", entry, "-q", "flash", str(work / "image.bin"), "--yes",
                                "--force", "--board", f"sim:{board}"], check=True, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                walls.setdefault((profile, audit), []).append(time.perf_counter() - start)
                cpus.setdefault((profile, audit), []).append(_children_cpu() - cpu)
                if audit == "audit":
                    after = _rows(db)
                    growth.append(({t: after[t] - before[0].get(t, 0) for t in after}, _bytes(db) - before[1]))
    print(f"{'profile':8} {'store':6} {'wall s (median)':>16}   runs")
    for (profile, audit), values in walls.items():
        print(f"{profile:8} {audit:6} {statistics.median(values):16.2f}   {', '.join(f'{v:.2f}' for v in values)}")
    for profile in profiles:
        on, off = walls[(profile, "audit")], walls[(profile, "null")]
        pairs = [a / b for a, b in zip(on, off, strict=True)]
        print(f"{profile}: audit on / null store wall ratio {statistics.median(on) / statistics.median(off):.2f} "
              f"(medians); per pair {', '.join(f'{r:.2f}' for r in pairs)}")
        con, coff = cpus[(profile, "audit")], cpus[(profile, "null")]
        print(f"{profile}: CPU seconds (user + system, the command and its audit writer) audit "
              f"{statistics.median(con):.2f}, null {statistics.median(coff):.2f}: ratio "
              f"{statistics.median(con) / statistics.median(coff):.2f} (medians)")
    first, later = growth[0], growth[1:]
    print(f"first full flash: {sum(first[0].values())} rows, {first[1] / 1e6:.2f} MB "
          f"(of which its 4 MiB of backed-up and programmed content, stored once: "
          f"{(first[1] - 2 * SIZE) / 1e6:.2f} MB without it)")
    if later:
        rows = statistics.median(sum(g.values()) for g, _ in later)
        size = statistics.median(b for _, b in later)
        print(f"each later full flash (same image and content): {rows:.0f} rows, {size / 1e6:.2f} MB")
    print("rows of the first flash by table: " + ", ".join(f"{t} {c}" for t, c in first[0].items() if c))


if __name__ == "__main__":
    args = sys.argv[1:]
    main(int(args[0]) if args else 5, tuple(args[1:]) or ("ideal",))
