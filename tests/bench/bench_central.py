"""The central record's targets, as a user meets them (whole `amdflash` processes, wall time):

* `amdflash audit push` of one dense full flash's trail (random board content, random
  image: every unit backed up, erased, programmed, verified) into a fresh central
  database: ≤ 2 s;
* `amdflash fleet runs` over 1,000 runs: ≤ 1 s.

The central database is a throwaway PostgreSQL cluster (tests/pipeline/fleet/pgcluster.py); the
1,000 runs are short runs written and signed by the ordinary audit writer. Each command is
timed several times (a fresh central database for every push); medians and every time are
printed, with the push's own time (inside the process, without interpreter start-up) and
its CPU seconds: the amdflash process's and those of the PostgreSQL backends that ended
meanwhile (the server's checks of the push run in its backend), which a loaded machine
changes far less than wall time — compare those between versions.

    python -m tests.bench.bench_central [REPEATS]      (default 5)
"""
from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from amdflash.stages.sim import create_board

from tests.pipeline.fleet.central_trail import new_database, synthetic_runs
from tests.pipeline.fleet.pgcluster import PostgresCluster, server_binaries

SIZE = 0x200000


def amdflash(env: dict, *args: str) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "amdflash.pipeline.cli", *args], capture_output=True, text=True,
                          env=env, check=True)
    return time.perf_counter() - started, done.stdout


def cpu_seconds(cluster: PostgresCluster) -> float:
    """CPU seconds of this process's ended children and of the cluster's ended backends (the
    postmaster's children: a push's backend ends when the push disconnects)."""
    children = os.times()
    postmaster = int((cluster.data / "postmaster.pid").read_text().split()[0])
    fields = Path(f"/proc/{postmaster}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return children.children_user + children.children_system + (int(fields[13]) + int(fields[14])) / ticks


def central(cluster: PostgresCluster, env: dict, pub: Path, name: str) -> str:
    url = new_database(cluster)
    amdflash(env, "-q", "fleet", "central-setup", url)
    amdflash(env, "-q", "fleet", "enroll", "--to", url, "--key", str(pub), "--name", name)
    return url


def main(repeats: int = 5) -> None:
    work = Path(tempfile.mkdtemp(prefix="amdflash-central-bench-"))
    cluster = PostgresCluster(server_binaries()).start()
    try:
        env = {**os.environ, "PYTHONPATH": os.getcwd(), "AMDFLASH_HOST_KEY": str(work / "key" / "host_key.pem"),
               "AMDFLASH_LOCK_DIR": str(work / "locks")}
        rng = random.Random(11)
        image = work / "image.bin"
        image.write_bytes(b"\xaa\x55\xaa\x55" + rng.randbytes(SIZE - 4))
        board = create_board(work / "board", content=rng.randbytes(SIZE), transport="ideal", seed=1)
        trail = work / "full.sqlite"
        amdflash(env, "-q", "--db", str(trail), "flash", str(image), "--yes", "--force", "--board", f"sim:{board}")
        pub = work / "host.pub"
        amdflash(env, "-q", "audit", "key", "-o", str(pub))

        walls, inside, cpus, sent = [], [], [], {}
        for i in range(repeats):
            url = central(cluster, env, pub, f"host{i}")
            copy = work / f"push{i}.sqlite"
            shutil.copy(trail, copy)
            cpu = cpu_seconds(cluster)
            wall, out = amdflash(env, "--db", str(copy), "audit", "push", "--to", url, "--format", "json")
            time.sleep(0.5)                          # the backend has ended (its CPU is counted) by then
            cpus.append(cpu_seconds(cluster) - cpu)
            sent = json.loads(out)
            walls.append(wall)
            inside.append(sent["seconds"])
        print(f"audit push of one dense full flash ({sent['rows']} rows, {sent['checkpoints']} checkpoints, "
              f"{sent['blobs']} blobs, {sent['blob_bytes'] / 1e6:.1f} MB): "
              f"wall median {statistics.median(walls):.2f} s "
              f"({', '.join(f'{w:.2f}' for w in walls)}); inside the process median {statistics.median(inside):.2f} s "
              f"— target ≤ 2 s; CPU (client and server) median {statistics.median(cpus):.2f} s "
              f"({', '.join(f'{c:.2f}' for c in cpus)})")

        many = work / "many.sqlite"
        synthetic_runs(many, Path(env["AMDFLASH_HOST_KEY"]), 1000)
        url = central(cluster, env, pub, "line")
        amdflash(env, "-q", "--db", str(many), "audit", "push", "--to", url)
        runs = []
        for _ in range(repeats):
            wall, out = amdflash(env, "fleet", "runs", "--from", url)
            assert len(out.splitlines()) == 1000
            runs.append(wall)
        print(f"fleet runs over 1000 runs: wall median {statistics.median(runs):.2f} s "
              f"({', '.join(f'{w:.2f}' for w in runs)}) — target ≤ 1 s")
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
