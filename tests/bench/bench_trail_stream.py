"""What audit export, audit verify --export and audit archive cost against the trail's size
(issue 42): wall and CPU seconds and peak memory (the child's max RSS) of each command, whole,
through the CLI, on trails of growing size, with the growth exponent between the smallest and
the largest (1: linear; 0: flat).

    python -m tests.bench.bench_trail_stream [N1,N2,...] [DIR]   (default 4,24 flashes in DIR, or a temp dir)

Trails are built with bench_trail_scale.build (N dense flashes, random images) in DIR/N and
reused; archive runs on a copy (it removes the runs it archives: every run before the last).
With AMDFLASH_BENCH_CLI=FILE, FILE is run in place of amdflash's module (a launcher of another
tree: how the figures before and after were taken on the same trails).
"""
from __future__ import annotations

import math
import os
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.bench.bench_trail_scale import _env, build


def _cli() -> list[str]:
    other = os.environ.get("AMDFLASH_BENCH_CLI")
    return [sys.executable, other] if other else [sys.executable, "-m", "amdflash.pipeline.cli"]


def measured(work: Path, *args: str) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS MB) of one whole command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    p = subprocess.run([*_cli(), "-q", *args], env=_env(work), capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert p.returncode == 0, p.stderr
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    # ru_maxrss of children is the largest of any child so far: each command runs in a fresh
    # grandchild-free process, and the commands are measured smallest trail first.
    return wall, cpu, _peak(after.ru_maxrss)


def _peak(kb: int) -> float:
    return kb / 1024


def _rows(db: Path) -> int:
    con = sqlite3.connect(db)
    try:
        tables = [t for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND (name LIKE "
                                            "'log\\_%' ESCAPE '\\' OR name IN ('runs', 'run_status', 'boards', "
                                            "'stages', 'backups', 'errors'))")]
        return sum(con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables)
    finally:
        con.close()


def _last_start(db: Path) -> str:
    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT at FROM runs ORDER BY seq DESC LIMIT 1").fetchone()[0]
    finally:
        con.close()


def one_size(work: Path) -> dict[str, tuple[float, float, float]]:
    """Each command once on the trail in `work` (each in its own process, for its own max RSS)."""
    out = work / "bench-export.jsonl"
    out.unlink(missing_ok=True)
    figures = {"audit export": _isolated(work, "audit", "export", "-o", str(out)),
               "audit verify --export": _isolated(work, "audit", "verify", "--export", str(out))}
    copy = work.with_name(work.name + "-archive")
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(work, copy, ignore=shutil.ignore_patterns("bench-*", "boards"))
    figures["audit archive"] = _isolated(copy, "audit", "archive", "--before", _last_start(copy / "audit.sqlite"),
                                         "-o", str(copy / "bench-archive.jsonl"))
    shutil.rmtree(copy, ignore_errors=True)
    return figures


def _isolated(work: Path, *args: str) -> tuple[float, float, float]:
    """measured() in a process of its own, so that max RSS is this command's alone."""
    code = ("import json, sys; from pathlib import Path; from tests.bench.bench_trail_stream import measured; "
            "print(json.dumps(measured(Path(sys.argv[1]), *sys.argv[2:])))")
    p = subprocess.run([sys.executable, "-c", code, str(work), *args], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert p.returncode == 0, p.stderr
    import json

    wall, cpu, rss = json.loads(p.stdout.splitlines()[-1])
    return wall, cpu, rss


def main(sizes: list[int], where: str | None = None) -> None:
    root = Path(where) if where else Path(tempfile.mkdtemp(prefix="amdflash-stream-"))
    results = {}
    for n in sizes:
        work = root / str(n)
        work.mkdir(parents=True, exist_ok=True)
        print(f"trail of {n} flashes in {work} ...", flush=True)
        db = build(work, n)
        rows = _rows(db)
        results[n] = (rows, one_size(work))
        for name, (wall, cpu, rss) in results[n][1].items():
            print(f"  {name:24} {wall:7.2f} s wall {cpu:7.2f} s CPU ({cpu / rows * 1e6:5.2f} µs/row) "
                  f"{rss:7.1f} MB peak RSS", flush=True)
    if len(sizes) > 1:
        small, large = sizes[0], sizes[-1]
        (r0, f0), (r1, f1) = results[small], results[large]
        print(f"growth exponent from {small} to {large} flashes ({r0} to {r1} rows): log(ratio) / log(row ratio)")
        for name in f0:
            cpu = math.log(f1[name][1] / f0[name][1]) / math.log(r1 / r0)
            rss = math.log(f1[name][2] / f0[name][2]) / math.log(r1 / r0)
            print(f"  {name:24} CPU {cpu:5.2f}   peak RSS {rss:5.2f} ({f1[name][2] / f0[name][2]:.2f}x)")


if __name__ == "__main__":
    main([int(x) for x in sys.argv[1].split(",")] if len(sys.argv) > 1 else [4, 24],
         sys.argv[2] if len(sys.argv) > 2 else None)
