"""The line view at scale: 64 emulated boards over 4 exporters, watched in Chromium.

Targets (issue 22): the page's first paint < 1 s, and every update on the page < 2 s after
the event, while 64 boards flash at once.

The line is the fleet tests' (tests/pipeline/fleet/lab.py: labgrid coordinator, exporters as hosts over
a loopback sshd, a throwaway PostgreSQL), each host with its follow service, `fleet serve`,
and Debian's Chromium through Playwright. Every board holds the image but for a few 64 KiB
blocks (so 64 flashes fit one run of the bench on a small machine) and runs in real-time mode
(`--realtime`), so the flashes overlap as on a line; one `fleet flash --parallel 64` writes
them all.

* first paint: the page loaded afresh in a new tab while 3/4 of the 64 boards are running —
  the browser's own first-contentful-paint time (Performance API), and the wall time of the
  load; and again after the flash, the 64 boards still on the page and the machine idle (what
  the page costs, without 64 emulated boards competing for the CPU);
* update latency: one tab stays open (it is never reloaded: what it shows came by server-sent
  events); its table is read every `--poll` seconds, and each progress row the hosts published
  is matched with the first moment the page showed it (that board, state and bytes). The
  event's time is the row's `at`: for an end, when the host's trail recorded it; for a running
  row, when the host's follow service read it from the trail (at most 0.5 s after the trail).
  Rows overtaken before the page could show them (a newer one of the same board within one
  update) are counted, not timed. The poll adds up to `--poll` seconds.

The jobs run at low CPU priority (`--jobs-nice`, and their sessions' autogroup too: see
tests/pipeline/fleet/lab.py): each carries an emulated board, whose CPU stands for a real board's own
silicon on another machine; `--jobs-nice 0` shows 64 emulated boards starving the page instead.
Each update's latency is also split at central's receipt (`received_at`), and the five slowest
are printed.

Also printed: the central record's size per run with progress on — the progress rows' bytes
against the signed rows' bytes of the same runs.

    python -m tests.bench.bench_line_view [--boards 16] [--hosts 4] [--scale 0.5] [--poll 0.05] [--jobs-nice 19]
"""
from __future__ import annotations

import argparse
import datetime as dt
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from amdflash.stages.sim.synth import synthetic_ifwi

from tests.pipeline.fleet.central_trail import new_database
from tests.pipeline.fleet.lab import Lab, missing, wait_for
from tests.pipeline.fleet.pgcluster import PostgresCluster, server_binaries
from tests.store import screenshots

ROWS_JS = """() => Array.from(document.querySelectorAll('#boards tr[data-place]')).map(tr => {
    const bar = tr.querySelector('progress');
    return [tr.dataset.place, tr.dataset.state, bar ? Number(bar.value) : null];
})"""
PAINT_JS = """() => { const p = performance.getEntriesByType('paint').find(e => e.name === 'first-contentful-paint');
                      return p ? p.startTime : null; }"""
FIRST_PAINT_TARGET, UPDATE_TARGET = 1.0, 2.0
# The hosts' jobs run at this CPU priority (tests/pipeline/fleet/lab.py: Lab's jobs_nice): each carries an
# emulated board, whose CPU is work a real board does in its own silicon on another machine.
JOBS_NICE = 19


@dataclass
class Result:
    first_paint: list[float] = field(default_factory=list)     # seconds (the browser's FCP), mid-flash
    load: list[float] = field(default_factory=list)            # seconds (wall, page.goto), mid-flash
    idle_paint: list[float] = field(default_factory=list)      # the same, 64 boards on the page, line idle
    idle_load: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)       # every row seen, seconds
    to_central: list[float] = field(default_factory=list)      # of which: the event to central's receipt
    to_page: list[float] = field(default_factory=list)         # and central's receipt to the page
    slowest: list[tuple[float, str]] = field(default_factory=list)
    end_latencies: list[float] = field(default_factory=list)   # the ends, seconds
    overtaken: int = 0
    rows: int = 0
    boards: int = 0
    progress_bytes_per_run: float = 0.0
    record_bytes_per_run: float = 0.0

    def describe(self) -> str:
        def stats(values: list[float]) -> str:
            if not values:
                return "none"
            q = sorted(values)
            return (f"median {statistics.median(q):.2f} s, p95 {p95(q):.2f} s, "
                    f"max {q[-1]:.2f} s ({len(q)})")

        return (f"{self.boards} boards: first paint {stats(self.first_paint)} (target < {FIRST_PAINT_TARGET} s); "
                f"page load (wall) {stats(self.load)}\n"
                f"after the flash (the same {self.boards} boards on the page, the line idle): first paint "
                f"{stats(self.idle_paint)}; page load (wall) {stats(self.idle_load)}\n"
                f"updates on the page after the event: {stats(self.latencies)}; ends {stats(self.end_latencies)} "
                f"(target < {UPDATE_TARGET} s); {self.overtaken} of {self.rows} rows overtaken before shown\n"
                f"  of which the event to central's receipt {stats(self.to_central)}; central to the page "
                f"{stats(self.to_page)}\n"
                + "".join(f"  slow: {what}\n" for _, what in sorted(self.slowest, reverse=True)[:5]) +
                f"record per run: signed rows {self.record_bytes_per_run / 1e6:.3f} MB, progress rows "
                f"{self.progress_bytes_per_run / 1e3:.1f} kB "
                f"(+{100 * self.progress_bytes_per_run / max(1.0, self.record_bytes_per_run):.2f} %)")


def p95(values: list[float]) -> float:
    """The 95th percentile (nearest rank below), as the bench prints it and the test holds it."""
    return sorted(values)[int(0.95 * (len(values) - 1))]


def _image_and_content() -> tuple[bytes, bytes]:
    image = synthetic_ifwi(4242)
    content = bytearray(image)
    for block in (0x80000, 0x110000, 0x190000):            # three 64 KiB blocks to rewrite
        content[block:block + 0x10000] = bytes(0x10000)
    return image, bytes(content)


def measure(root: Path, boards: int = 16, hosts: int = 4, scale: float = 0.5, poll: float = 0.05,
            jobs_nice: int = JOBS_NICE, report=print) -> Result:
    image, content = _image_and_content()
    (root / "image.bin").write_bytes(image)
    cluster = PostgresCluster(server_binaries()).start()   # type: ignore[arg-type]
    lab = Lab(root / "line", jobs_nice=jobs_nice)
    result = Result(boards=boards * hosts)
    try:
        lab.start_sshd()
        lab.start_coordinator()
        for h in range(hosts):
            lab.add_host(f"host{h}", boards, seed=100 * (h + 1), realtime=scale, content=content)
        admin, viewer, _ = lab.watched_line(cluster, "line=bench")
        base = lab.start_serve(viewer)
        report(f"line up: {hosts} exporters, {boards * hosts} boards")
        seen: dict[tuple[str, str, int | None], float] = {}
        with screenshots.browser() as page:
            page.goto(base)
            started = time.time()
            flash = lab.fleet_popen("flash", str(root / "image.bin"), "--where", "line=bench", "--yes",
                                    "--parallel", str(boards * hosts))
            painted = False
            while flash.poll() is None:
                now = time.time()
                rows = page.evaluate(ROWS_JS)
                for place, state, done in rows:
                    seen.setdefault((place, state, done), now)
                running = sum(1 for _, state, _ in rows if state == "running")
                if not painted and running >= boards * hosts * 3 // 4:
                    painted = True
                    _paint(page, base, result.first_paint, result.load)
                    report(f"first paint measured with {running} boards running")
                time.sleep(max(0.0, poll - (time.time() - now)))
            out, err = flash.communicate()
            wait_for(lambda: _all_ended(page, boards * hosts, seen), 120, "every end on the page", interval=poll)
            report(f"fleet flash exited {flash.returncode} after {time.time() - started:.1f} s")
            time.sleep(10)                                         # the machine settles
            _paint(page, base, result.idle_paint, result.idle_load)
        _latencies(admin, seen, result)
        _sizes(admin, result)
    finally:
        lab.close()
        cluster.stop()
    return result


def _paint(page: Any, base: str, paints: list[float], loads: list[float], times: int = 5) -> None:
    """Load the page afresh in new tabs: the browser's first contentful paint, and the wall time."""
    for _ in range(times):
        other = page.context.browser.new_page()    # a fresh tab, nothing cached
        t0 = time.perf_counter()
        other.goto(base)
        loads.append(time.perf_counter() - t0)
        fcp = other.evaluate(PAINT_JS)
        if fcp is not None:
            paints.append(fcp / 1000)
        other.close()


def _all_ended(page: Any, want: int, seen: dict) -> bool:
    now = time.time()
    rows = page.evaluate(ROWS_JS)
    for place, state, done in rows:
        seen.setdefault((place, state, done), now)
    return len(rows) == want and all(state != "running" for _, state, _ in rows)


def _latencies(url: str, seen: dict[tuple[str, str, int | None], float], result: Result) -> None:
    import psycopg

    with psycopg.connect(url) as pg:
        rows = pg.execute("SELECT place, state, bytes_done, bytes_total, at, received_at FROM amdflash.progress "
                          "WHERE run_id IS NOT NULL ORDER BY id").fetchall()
    for place, state, done, total, at, received in rows:
        result.rows += 1
        key = (place, state, done if total else None)
        if key not in seen:
            result.overtaken += 1
            continue
        latency = seen[key] - at.timestamp()
        result.latencies.append(latency)
        result.to_central.append(received.timestamp() - at.timestamp())
        result.to_page.append(seen[key] - received.timestamp())
        shown = seen[key] - received.timestamp()
        result.slowest.append((latency, f"{latency:.2f} s: {place} {state} {done}/{total}, at {at:%H:%M:%S.%f}, "
                                        f"received {received:%H:%M:%S.%f}, shown {shown:+.2f} s after"))
        if state != "running":
            result.end_latencies.append(latency)


def _sizes(url: str, result: Result) -> None:
    import psycopg

    from amdflash.store.schema import PHYSICAL

    with psycopg.connect(url) as pg:
        runs = pg.execute("SELECT count(*) FROM amdflash.runs").fetchone()[0] or 1
        progress = pg.execute("SELECT coalesce(sum(pg_column_size(p.*)), 0) FROM amdflash.progress p").fetchone()[0]
        signed = 0
        for table in ("checkpoints", "blobs", *PHYSICAL):
            signed += pg.execute(f"SELECT coalesce(sum(pg_column_size(t.*)), 0) FROM amdflash.{table} t").fetchone()[0]
    result.progress_bytes_per_run = progress / runs
    result.record_bytes_per_run = signed / runs


def record_growth(root: Path, report=print) -> tuple[float, float, int]:
    """One dense full flash (bench_central's: random content, random image, every unit written)
    with the host's follow service running: (the run's signed rows' bytes, its progress rows'
    bytes, its progress rows) in the central record."""
    import os
    import random
    import subprocess
    import sys

    import psycopg

    from amdflash.stages.sim import create_board

    cluster = PostgresCluster(server_binaries()).start()   # type: ignore[arg-type]
    try:
        env = {**os.environ, "AMDFLASH_HOST_KEY": str(root / "key.pem"), "AMDFLASH_LOCK_DIR": str(root / "locks"),
               "AMDFLASH_DB": str(root / "audit.sqlite"), "PYTHONUNBUFFERED": "1"}

        def amdflash(*args: str) -> None:
            subprocess.run([sys.executable, "-m", "amdflash.pipeline.cli", *args], env=env, check=True,
                           capture_output=True)

        url = new_database(cluster)
        amdflash("-q", "fleet", "central-setup", url)
        amdflash("-q", "audit", "key", "-o", str(root / "host.pub"))
        amdflash("-q", "fleet", "enroll", "--to", url, "--key", str(root / "host.pub"), "--name", "host")
        rng = random.Random(11)
        image = root / "dense.bin"
        image.write_bytes(b"\xaa\x55\xaa\x55" + rng.randbytes(0x200000 - 4))
        board = create_board(root / "dense", content=rng.randbytes(0x200000), transport="ideal", seed=1)
        follow = subprocess.Popen([sys.executable, "-m", "amdflash.pipeline.cli", "audit", "push", "--follow", "--to",
                                   url, "--interval", "0.5"], env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        try:
            time.sleep(3)
            amdflash("-q", "flash", str(image), "--yes", "--force", "--board", f"sim:{board}")
            with psycopg.connect(url, autocommit=True) as pg:
                run_id = wait_for(lambda: pg.execute("SELECT run_id FROM amdflash.runs WHERE command = 'flash'")
                                  .fetchone(), 120, "the flash pushed")[0]
                wait_for(lambda: pg.execute("SELECT 1 FROM amdflash.checkpoints WHERE kind = 'final' AND run_id = %s",
                                            (run_id,)).fetchone(), 120, "its end pushed")
        finally:
            follow.terminate()
            follow.wait(30)
        from amdflash.store.schema import PHYSICAL, PLAIN

        with psycopg.connect(url) as pg:
            key = pg.execute("SELECT seq FROM amdflash.runs WHERE run_id = %s", (run_id,)).fetchone()[0]
            signed = 0
            for table in PHYSICAL:
                where = "run_id = %s" if table in PLAIN else "run = %s"
                signed += pg.execute(f"SELECT coalesce(sum(pg_column_size(t.*)), 0) FROM amdflash.{table} t "
                                     f"WHERE {where}", (run_id if table in PLAIN else key,)).fetchone()[0]
            signed += pg.execute("SELECT coalesce(sum(pg_column_size(t.*)), 0) FROM amdflash.checkpoints t "
                                 "WHERE run_id = %s", (run_id,)).fetchone()[0]
            signed += pg.execute("SELECT coalesce(sum(pg_column_size(t.*)), 0) FROM amdflash.blobs t").fetchone()[0]
            progress, rows = pg.execute("SELECT coalesce(sum(pg_column_size(p.*)), 0), count(*) FROM "
                                        "amdflash.progress p WHERE run_id = %s", (run_id,)).fetchone()
        report(f"dense full flash: signed record {signed / 1e6:.3f} MB (its blobs included), progress {rows} rows, "
               f"{progress / 1e3:.1f} kB: +{100 * progress / signed:.2f} %")
        return float(signed), float(progress), int(rows)
    finally:
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--boards", type=int, default=16, help="boards per host (default 16)")
    parser.add_argument("--hosts", type=int, default=4, help="hosts, one exporter each (default 4)")
    parser.add_argument("--scale", type=float, default=0.5, help="real-time scale of the boards (default 0.5)")
    parser.add_argument("--poll", type=float, default=0.05, help="seconds between reads of the page (default 0.05)")
    parser.add_argument("--jobs-nice", type=int, default=JOBS_NICE,
                        help=f"CPU priority (nice) of the hosts' jobs, which carry the emulated boards (default "
                             f"{JOBS_NICE}; 0: the same as everything else)")
    parser.add_argument("--record-only", action="store_true", help="only the record's growth per dense flash")
    parser.add_argument("--view-only", action="store_true", help="only the view (no dense flash for the record)")
    args = parser.parse_args()
    why = missing() or screenshots.browser_missing() or (None if server_binaries() else "no PostgreSQL server")
    if why:
        raise SystemExit(f"cannot run: {why}")
    if not args.view_only:
        with tempfile.TemporaryDirectory(prefix="amdflash-line-bench-") as d:
            record_growth(Path(d))
    if args.record_only:
        return
    with tempfile.TemporaryDirectory(prefix="amdflash-line-bench-") as d:
        result = measure(Path(d), args.boards, args.hosts, args.scale, args.poll, args.jobs_nice)
    print(result.describe())
    print(f"at {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, load average {open('/proc/loadavg').read().split()[0]}")


if __name__ == "__main__":
    main()
