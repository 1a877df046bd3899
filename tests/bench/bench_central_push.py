"""The first `audit push` of a trail of N dense flashes, and the central record's size per
flash beside the trail's (issue 42).

For each N, the trail (bench_trail_scale.build: N dense full flashes, random images, in DIR/N,
reused) is copied and pushed whole into a fresh central database of a throwaway PostgreSQL
cluster, through the CLI: wall seconds of the whole command, the push's own seconds (inside
the process), CPU seconds of the amdflash process and of the cluster's backends that ended
meanwhile (the database's checks run there), per row and per flash; then the record's size:
the total relation size (heap, TOAST, indexes) of the record's tables — the host's rows,
checkpoints and blobs — and the database's size over a freshly set-up one, per flash, beside
the SQLite trail's file size per flash.

    python -m tests.bench.bench_central_push [N1,N2,...] [DIR] [REPEATS]   (default 4,16; a temp dir; 3)

With AMDFLASH_BENCH_CLI=FILE, FILE is run in place of amdflash's module for the central
database's setup, the enrolment and the push (a launcher of another tree, its schema's
checks and its push. With AMDFLASH_BENCH_BEFORE=FILE, that tree's pushes alternate with this
tree's, push by push, on the same trails and cluster, and the ratios are printed: how the
figures before and after were taken.
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from amdflash.store.schema import PHYSICAL

from tests.bench.bench_central import cpu_seconds
from tests.bench.bench_trail_scale import _env, build
from tests.bench.bench_trail_stream import _cli, _rows
from tests.pipeline.fleet.central_trail import new_database
from tests.pipeline.fleet.pgcluster import PostgresCluster, server_binaries

RECORD = ("blobs", "checkpoints", *PHYSICAL)


def _run(env: dict, cli: list[str], *args: str) -> str:
    done = subprocess.run([*cli, *args], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _sql(url: str, query: str) -> int:
    import psycopg

    with psycopg.connect(url) as pg:
        return int(pg.execute(query).fetchone()[0])


def record_bytes(url: str) -> int:
    """Heap, TOAST and indexes of the record's tables."""
    return _sql(url, "SELECT " + " + ".join(f"pg_total_relation_size('amdflash.{t}')" for t in RECORD))


def fresh_central(cluster: PostgresCluster, env: dict, pub: Path, name: str, cli: list[str] | None = None) -> str:
    url = new_database(cluster)
    _run(env, cli or _cli(), "-q", "fleet", "central-setup", url)
    _run(env, cli or _cli(), "-q", "fleet", "enroll", "--to", url, "--key", str(pub), "--name", name)
    return url


def one_push(cluster: PostgresCluster, work: Path, env: dict, pub: Path, name: str, cli: list[str]) -> dict:
    url = fresh_central(cluster, env, pub, name, cli)
    empty = _sql(url, "SELECT pg_database_size(current_database())")
    copy = work.with_name(f"{work.name}-push.sqlite")
    shutil.copy(work / "audit.sqlite", copy)
    cpu = cpu_seconds(cluster)
    started = time.perf_counter()
    sent = json.loads(_run({**env, "AMDFLASH_DB": str(copy)}, cli, "audit", "push", "--to", url,
                           "--format", "json"))
    wall = time.perf_counter() - started
    time.sleep(0.5)                          # the push's backend has ended (its CPU is counted) by then
    figures = {"wall": wall, "inside": sent["seconds"], "cpu": cpu_seconds(cluster) - cpu, "rows": sent["rows"],
               "checkpoints": sent["checkpoints"], "blob_bytes": sent["blob_bytes"], "record": record_bytes(url),
               "database": _sql(url, "SELECT pg_database_size(current_database())") - empty}
    copy.unlink()
    return figures


def _report(label: str, n: int, runs: list[dict], repeats: int, db: Path) -> dict[str, float]:
    med = {k: statistics.median(r[k] for r in runs) for k in ("wall", "inside", "cpu")}
    last = runs[-1]
    rows = last["rows"]
    assert rows == _rows(db), (rows, _rows(db))
    trail = db.stat().st_size
    print(f"{label}: first push of {n} dense flashes ({rows} rows, {last['checkpoints']} checkpoints, "
          f"{last['blob_bytes'] / 1e6:.1f} MB of blobs), medians of {repeats}:")
    walls = ", ".join(f"{r['wall']:.2f}" for r in runs)
    cpus = ", ".join(f"{r['cpu']:.2f}" for r in runs)
    print(f"  wall {med['wall']:.2f} s ({walls}); inside the process {med['inside']:.2f} s; "
          f"CPU client+server {med['cpu']:.2f} s ({cpus})")
    print(f"  per row: wall {med['wall'] / rows * 1e6:.2f} µs, inside {med['inside'] / rows * 1e6:.2f} µs, "
          f"CPU {med['cpu'] / rows * 1e6:.2f} µs; per flash: wall {med['wall'] / n:.2f} s, "
          f"inside {med['inside'] / n:.2f} s")
    print(f"  size per flash: trail (SQLite file) {trail / n / 1e6:.2f} MB; central record's tables "
          f"{last['record'] / n / 1e6:.2f} MB ({last['record'] / trail:.2f}x the trail); central database "
          f"growth {last['database'] / n / 1e6:.2f} MB ({last['database'] / trail:.2f}x)", flush=True)
    return med


def main(sizes: list[int], where: str | None = None, repeats: int = 3) -> None:
    root = Path(where) if where else Path(tempfile.mkdtemp(prefix="amdflash-push-"))
    before = os.environ.get("AMDFLASH_BENCH_BEFORE")
    versions = ([("before", [sys.executable, before])] if before else []) + [("now", _cli())]
    cluster = PostgresCluster(server_binaries()).start()
    try:
        for n in sizes:
            work = root / str(n)
            work.mkdir(parents=True, exist_ok=True)
            db = build(work, n)
            env = _env(work)
            pub = work / "host.pub"
            if not pub.exists():
                _run(env, [sys.executable, "-m", "amdflash.pipeline.cli"], "-q", "audit", "key", "-o", str(pub))
            runs: dict[str, list[dict]] = {label: [] for label, _ in versions}
            for i in range(repeats):          # the versions alternate, push by push
                for label, cli in versions:
                    runs[label].append(one_push(cluster, work, env, pub, f"host{n}{label}{i}", cli))
            medians = {}
            for label, done in runs.items():
                medians[label] = _report(label, n, done, repeats, db)
            if len(medians) == 2:
                before, now = medians["before"], medians["now"]
                print("  before / now: " + ", ".join(f"{k} {before[k] / now[k]:.2f}x" for k in before), flush=True)
    finally:
        cluster.stop()


if __name__ == "__main__":
    main([int(x) for x in sys.argv[1].split(",")] if len(sys.argv) > 1 else [4, 16],
         sys.argv[2] if len(sys.argv) > 2 else None, int(sys.argv[3]) if len(sys.argv) > 3 else 3)
