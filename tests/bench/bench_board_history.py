"""What `amdflash info` costs on a board the line keeps re-flashing (issue 42).

Builds one trail and one emulated board (ideal profile, random content) and flashes that
board again and again with dense random images (a new image each time: every page
programmed), up to the largest count asked. Then, for each count N (default 2, 8, 24), a copy
of the trail as it stood when the board's Nth flash ended (the rows and checkpoints after it
removed: the trail the line had then), and `amdflash info` on the board timed against it: wall
seconds of the whole command (Python start-up included) and its CPU seconds (user + system,
which move less with the machine's load), median of 3. Printed: each, its ratio to the first
count's, and the growth exponent (log of the ratio over log of the count ratio: 0 flat, 1
linear, 2 quadratic). The done-when figure: at 24 flashes at most 1.5x the wall time at 2.

    python -m tests.bench.bench_board_history [2,8,24] [DIR] [--before SCRIPT]

DIR defaults to a temp dir (an existing one is carried on from the flashes it holds).
`--before SCRIPT`: also time `python SCRIPT info ...`, on the same copies, interleaved — a
script that runs another version's CLI (the README's "before" column ran amdflash with
store/originals.py as it was before issue 42: that module put in sys.modules, then
`runpy.run_module("amdflash.pipeline.cli")`).
"""
from __future__ import annotations

import math
import os
import random
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from amdflash.stages.sim import create_board

SIZE = 0x200000


def _env(work: Path, db: Path | None = None) -> dict[str, str]:
    return {**os.environ, "AMDFLASH_DB": str(db or work / "audit.sqlite"),
            "AMDFLASH_HOST_KEY": str(work / "host_key.pem"), "AMDFLASH_LOCK_DIR": str(work / "locks"),
            "PYTHONPATH": os.getcwd()}


def _cli(work: Path, *args: str, script: str | None = None, db: Path | None = None) \
        -> subprocess.CompletedProcess[str]:
    how = [script] if script else ["-m", "amdflash.pipeline.cli"]
    return subprocess.run([sys.executable, *how, *args], env=_env(work, db), capture_output=True, text=True)


def flashes_done(work: Path) -> int:
    db = work / "audit.sqlite"
    if not db.exists():
        return 0
    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT count(*) FROM runs WHERE command = 'flash'").fetchone()[0]
    finally:
        con.close()


def flash_to(work: Path, board: Path, count: int) -> None:
    """Flash the board until the trail holds `count` flashes of it, each a new random image."""
    for n in range(flashes_done(work), count):
        image = work / "image.bin"
        data = bytearray(random.Random(5000 + n).randbytes(SIZE))
        data[:4] = b"\xaa\x55\xaa\x55"
        image.write_bytes(data)
        p = _cli(work, "-q", "flash", str(image), "--yes", "--force", "--board", f"sim:{board}")
        assert p.returncode == 0, p.stderr


def trail_at(work: Path, count: int) -> Path:
    """A copy of the trail as it stood when the board's `count`th flash ended."""
    from amdflash.store.schema import PHYSICAL, add_triggers, drop_triggers

    where = work / f"at-{count}"
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir()
    db = where / "audit.sqlite"
    src, dst = sqlite3.connect(work / "audit.sqlite"), sqlite3.connect(db)
    src.backup(dst)
    src.close()
    key = dst.execute("SELECT seq FROM runs WHERE command = 'flash' ORDER BY seq LIMIT 1 OFFSET ?",
                      (count - 1,)).fetchone()[0]
    final, last = dst.execute("SELECT id, last_seq FROM checkpoints WHERE run = ? AND kind = 'final'",
                              (key,)).fetchone()
    drop_triggers(dst)
    for table in PHYSICAL:
        dst.execute(f"DELETE FROM {table} WHERE seq > ?", (last,))
    dst.execute("DELETE FROM checkpoints WHERE id > ?", (final,))
    dst.execute("UPDATE chain_head SET seq = ?, checkpoint = ?, hash = (SELECT hash FROM checkpoints WHERE id = ?) "
                "WHERE id = 1", (last, final, final))
    add_triggers(dst)
    dst.commit()
    dst.close()
    return db


def timed_info(work: Path, board: Path, db: Path, script: str | None = None) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds, stdout) of one `info` on the board against `db`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    p = _cli(work, "--no-progress", "info", "--board", f"sim:{board}", script=script, db=db)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert p.returncode == 0, p.stderr
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, p.stdout


def _exponent(ratio: float, counts: float) -> str:
    return f"{math.log(ratio) / math.log(counts):5.2f}" if counts != 1 else "    -"


def main(counts: list[int], where: str | None = None, before: str | None = None, repeats: int = 3) -> None:
    work = Path(where) if where else Path(tempfile.mkdtemp(prefix="amdflash-history-"))
    work.mkdir(parents=True, exist_ok=True)
    board = work / "board"
    if not board.exists():
        create_board(board, content=random.Random(7).randbytes(SIZE), transport="ideal", seed=7)
    print(f"one board flashed N times (dense random images), trail in {work}", flush=True)
    flash_to(work, board, max(counts))
    columns: list[tuple[str, str | None]] = [("now", None)] + ([("before", before)] if before else [])
    head = " {:>11} {:>5} {:>5} {:>6} {:>5} {:>5}"
    print("  " + f"{'N':>4}" + "".join(" |" + head.format(name + " wall", "ratio", "exp", "cpu", "ratio", "exp")
                                       for name, _ in columns))
    first: dict[str | None, tuple[int, float, float]] = {}
    for count in counts:
        db = trail_at(work, count)
        walls: dict[str | None, list[float]] = {script: [] for _, script in columns}
        cpus: dict[str | None, list[float]] = {script: [] for _, script in columns}
        said = ""
        for _ in range(repeats):                 # interleaved: the machine's load falls on both alike
            for _, script in columns:
                wall, cpu, out = timed_info(work, board, db, script)
                walls[script].append(wall)
                cpus[script].append(cpu)
                said = said or next((x.strip() for x in out.splitlines() if x.startswith("original")), "")
        cells = []
        for _, script in columns:
            wall, cpu = statistics.median(walls[script]), statistics.median(cpus[script])
            n0, w0, c0 = first.setdefault(script, (count, wall, cpu))
            cells.append(f" | {wall:11.2f} {wall / w0:5.2f} {_exponent(wall / w0, count / n0)} {cpu:6.2f} "
                         f"{cpu / c0:5.2f} {_exponent(cpu / c0, count / n0)}")
        print(f"  {count:>4}{''.join(cells)}", flush=True)
        if said:
            print(f"       ...{said[-100:]}")


if __name__ == "__main__":
    args = sys.argv[1:]
    script = None
    if "--before" in args:
        i = args.index("--before")
        script = args[i + 1]
        del args[i:i + 2]
    main([int(n) for n in (args[0] if args else "2,8,24").split(",")], args[1] if len(args) > 1 else None, script)
