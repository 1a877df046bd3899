"""What reading one run costs in a large audit database, and how fast the whole one verifies.

Builds (or reuses) a database of N full dense flashes through `amdflash flash` — each on a
fresh emulated board (ideal profile) holding its own random content, all with one random
image — then times, for a run in the middle of it, every per-run read through the CLI
(wall seconds of the whole command, Python start-up included):

    report (text, json, html), audit verify --run, replay is left out (it re-runs the flash)

and the whole-database `audit verify` (rows per second).

    python -m tests.bench.bench_trail_scale [N] [DIR]        (default: 100 flashes in a temp dir)
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

from amdflash.stages.sim import create_board

SIZE = 0x200000


def build(work: Path, flashes: int) -> Path:
    db = work / "audit.sqlite"
    env = _env(work)
    image = work / "image.bin"
    if not image.exists():
        data = bytearray(random.Random(1).randbytes(SIZE))
        data[:4] = b"\xaa\x55\xaa\x55"
        image.write_bytes(data)
    done = _count(db)
    for n in range(done, flashes):
        board = create_board(work / "boards" / f"b{n}", content=random.Random(1000 + n).randbytes(SIZE),
                             transport="ideal", seed=n)
        subprocess.run([sys.executable, "-m", "amdflash.pipeline.cli", "-q", "flash", str(image), "--yes",
                        "--force", "--board", f"sim:{board}"], check=True, env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        for f in board.iterdir():        # the board itself is not needed any more
            f.unlink()
        board.rmdir()
        if n % 10 == 9:
            print(f"  {n + 1} flashes, {db.stat().st_size / 1e6:.0f} MB", flush=True)
    return db


def _env(work: Path) -> dict[str, str]:
    return {**os.environ, "AMDFLASH_DB": str(work / "audit.sqlite"), "AMDFLASH_HOST_KEY": str(work / "host_key.pem"),
            "AMDFLASH_LOCK_DIR": str(work / "locks"), "PYTHONPATH": os.getcwd()}


def _count(db: Path) -> int:
    if not db.exists():
        return 0
    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT count(*) FROM runs").fetchone()[0]
    finally:
        con.close()


def timed(work: Path, *args: str, repeats: int = 3) -> tuple[float, str]:
    walls, out = [], ""
    for _ in range(repeats):
        start = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "amdflash.pipeline.cli", *args], env=_env(work),
                           capture_output=True, text=True)
        walls.append(time.perf_counter() - start)
        out = p.stdout
        assert p.returncode == 0, p.stderr
    return statistics.median(walls), out


def main(flashes: int = 100, where: str | None = None) -> None:
    work = Path(where) if where else Path(tempfile.mkdtemp(prefix="amdflash-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"building {flashes} full flashes in {work} ...", flush=True)
    start = time.perf_counter()
    db = build(work, flashes)
    print(f"built in {time.perf_counter() - start:.0f} s: {db.stat().st_size / 1e6:.0f} MB")
    con = sqlite3.connect(db)
    runs = [r for (r,) in con.execute("SELECT run_id FROM runs ORDER BY seq")]
    rows = sum(con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for (t,) in con.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'log\\_%' ESCAPE '\\' "
        "OR name IN ('runs', 'run_status', 'boards', 'stages', 'backups', 'errors')").fetchall())
    con.close()
    run = runs[len(runs) // 2]
    baseline, _ = timed(work, "--help")
    print(f"{len(runs)} runs, {rows} audit rows; timing run {run} (median of 3, whole command)")
    print(f"  {'amdflash --help (Python start-up alone)':44} {baseline:6.2f} s")
    for label, args in (("report RUN", ("report", run)),
                        ("report RUN --format json", ("report", run, "--format", "json")),
                        ("report RUN --format html -o FILE", ("report", run, "--format", "html", "-o",
                                                             str(work / "r.html"))),
                        ("audit verify --run RUN", ("audit", "verify", "--run", run))):
        wall, _ = timed(work, *args)
        print(f"  {label:44} {wall:6.2f} s")
    wall, out = timed(work, "audit", "verify", repeats=1)
    first = out.splitlines()[0]
    print(f"  {'audit verify (whole database)':44} {wall:6.2f} s: {rows / wall / 1e3:.0f}k rows/s\n    {first}")
    in_process(db, run, rows)


def in_process(db: Path, run: str, rows: int, repeats: int = 3) -> None:
    """The same reads as library calls in one process: what they cost without Python start-up
    and the CLI's imports (median of `repeats`; the database's pages warm after the first)."""
    from amdflash.pipeline.commands import board as commands
    from amdflash.store.verify import verify_database, verify_run
    from amdflash.pipeline.engine.next_step import BARE

    def median(call, repeats: int = repeats) -> float:
        walls = []
        for _ in range(repeats):
            start = time.perf_counter()
            call()
            walls.append(time.perf_counter() - start)
        return statistics.median(walls)

    print(f"in one process (median of {repeats}):")
    print(f"  {'report RUN (text and json: the same object)':44} "
          f"{median(lambda: commands.report(run, str(db), advice=BARE)):6.2f} s")
    print(f"  {'report RUN --format html':44} "
          f"{median(lambda: commands.report(run, str(db), html=True, advice=BARE)):6.2f} s")
    # `runs` checks each listed status's seal: one span per run (store/status_seal.py).
    listed = median(lambda: commands.runs(str(db)))
    print(f"  {'runs (every run, each status seal checked)':44} {listed:6.2f} s: "
          f"{listed / max(1, len(commands.runs(str(db)))) * 1e3:.1f} ms a run")
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        print(f"  {'verify_run':44} {median(lambda: verify_run(con, run)):6.2f} s")
        wall = median(lambda: verify_database(con), repeats=1)
        print(f"  {'verify_database (whole database)':44} {wall:6.2f} s: {rows / wall / 1e3:.0f}k rows/s")
    finally:
        con.close()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100, sys.argv[2] if len(sys.argv) > 2 else None)
