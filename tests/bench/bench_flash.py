"""One table: what each job costs in modelled seconds, beside its floors.

Jobs (asm24 profile unless said): dump, verify, a dense flash over random content, a
synthetic IFWI over another, a no-op reflash (the image already on the board) and a
16-sector range. Columns: `amdflash` with its defaults and with `--rx-mode primed`, the
reference client (when --seed-client names ../shared/conformance/run-seed-client), the
physical floor, the transport floor and the observed floor (docs/cost-model.md; all computed
by stages.transport.sim.floor, not measured; the observed floor is the transport floor for a
driver that never counts on the link's latency, as amdflash's does not), and the ratios. Every run is through the CLI on a fresh emulated board, so the
figures include opening the board, identification and the open-time self-checks.

    python -m tests.bench.bench_flash [--seed-client ../shared/conformance/run-seed-client]
                                      [--kept-reads N] [--jobs dump,verify,...] [--trace]
"""
from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from amdflash.stages.flash.spinor import SpiNor
from amdflash.stages.navi31 import regs as R
from amdflash.stages.navi31.romsw import RomSw, RomSwOptions
from amdflash.stages.transport.sim import SimBar5, create_board
from amdflash.stages.transport.sim.cost import PCIE
from amdflash.stages.transport.sim.floor import dump_ops, flash_ops, physical_floor, transport_floor
from amdflash.stages.transport.sim.state import C, BoardFiles
from amdflash.stages.transport.sim.synth import synthetic_ifwi

SIZE, UNIT = 0x200000, 0x1000
RANGE_START, RANGE_COUNT = 256, 16

# Targets of issue 14 (ratios to the transport floor unless said).
TARGETS = {"dense flash": 1.15, "dump": 1.10, "verify": 1.10}
NOOP_VS_DUMP = 1.02
VS_REFERENCE = 12.0
PCIE_VS_PHYSICAL = 1.05


def modelled(path: Path) -> float:
    files = BoardFiles(path)
    try:
        return files.region("counters").cast("d")[C["modelled_seconds"]]
    finally:
        files.close()


@dataclass
class Job:
    name: str
    board: bytes                       # the board's content before the job
    image: bytes | None                # the image it writes or compares with
    ours: Callable[[Path, Path], list[str]]          # (board, image file) -> CLI arguments
    reference: Callable[[Path, Path], list[str]]     # -> reference client arguments
    floors: tuple[float, float, float] = (0.0, 0.0, 0.0)   # physical, transport, observed
    results: dict[str, float] = field(default_factory=dict)


def make_jobs(kept_reads: int) -> list[Job]:
    rng = random.Random(7)
    current = rng.randbytes(SIZE)
    dense = bytearray(rng.randbytes(SIZE))
    dense[:4] = b"\xaa\x55\xaa\x55"
    dense = bytes(dense)
    synth_a, synth_b = synthetic_ifwi(101), synthetic_ifwi(202)

    def flash(extra: list[str] | None = None):  # noqa: ANN202
        # --force: random images carry no part number to match against the board's.
        return lambda b, i: ["flash", str(i), "--yes", "--force", *(extra or [])]

    def ref_flash(extra: list[str] | None = None):  # noqa: ANN202
        return lambda b, i: ["romless", "flash", str(i), "--yes", *(extra or [])]

    rng_args = ["--start-sector", str(RANGE_START), "--sector-count", str(RANGE_COUNT)]
    jobs = [
        Job("dump", synth_a, None, lambda b, i: ["dump", str(b.parent / f"{b.name}.dump")],
            lambda b, i: ["romless", "dump", str(b.parent / f"{b.name}.ref")]),
        Job("verify", synth_a, synth_a, lambda b, i: ["verify", str(i)], lambda b, i: ["romless", "verify", str(i)]),
        Job("dense flash", current, dense, flash(), ref_flash()),
        Job("synthetic IFWI over another", synth_a, synth_b, flash(), ref_flash()),
        Job("no-op reflash", synth_a, synth_a, flash(), ref_flash()),
        Job("16-sector range", current, dense, flash(rng_args), ref_flash(rng_args)),
    ]
    for job in jobs:
        if job.name in ("dump", "verify"):
            ops = dump_ops(reads_per_unit=kept_reads)
        elif job.name == "16-sector range":
            ops = flash_ops(job.board, job.image, RANGE_START, RANGE_COUNT, kept_reads=kept_reads)
        else:
            ops = flash_ops(job.board, job.image, kept_reads=kept_reads)
        job.floors = (physical_floor(ops), transport_floor(ops), transport_floor(ops, credit_latency=False))
    return jobs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed-client", type=Path, help="path of ../shared/conformance/run-seed-client")
    ap.add_argument("--kept-reads", type=int, default=2,
                    help="reads of kept data the floors count, and the --reads amdflash runs with "
                         "(default 2, amdflash's default: every kept byte confirmed; 1: unconfirmed)")
    ap.add_argument("--jobs", help="comma-separated subset of the job names")
    ap.add_argument("--amdflash-python", default=sys.executable,
                    help="interpreter whose amdflash runs the jobs (e.g. another checkout's venv, to compare)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="amdflash-bench-"))
    env = {**os.environ, "AMDFLASH_DB": str(work / "audit.sqlite"), "AMDFLASH_LOCK_DIR": str(work / "locks")}
    jobs = make_jobs(args.kept_reads)
    if args.jobs:
        wanted = set(args.jobs.split(","))
        jobs = [j for j in jobs if j.name in wanted]
    n = 0

    def run(job: Job, who: str, argv_for: Callable[[Path, Path], list[str]], tool: list[str],
            transport: str = "asm24") -> None:
        nonlocal n
        n += 1
        board = create_board(work / f"b{n}", content=job.board, seed=n, transport=transport)
        image = work / f"image{n}.bin"
        if job.image is not None:
            image.write_bytes(job.image)
        before, t0 = modelled(board), time.perf_counter()
        p = subprocess.run([*tool, *argv_for(board, image)], env=env, cwd=os.getcwd(),
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if p.returncode != 0:
            raise SystemExit(f"{who} {job.name} failed ({p.returncode}): {p.stderr.strip()[-800:]}")
        job.results[who] = modelled(board) - before
        job.results[who + " wall"] = time.perf_counter() - t0

    ours = [args.amdflash_python, "-m", "amdflash.pipeline.cli", "-q"]
    # The runs confirm kept data as the floors count it (--reads 2 is amdflash's default).
    reads = ["--reads", str(args.kept_reads)]
    for job in jobs:
        run(job, "default", lambda b, i, j=job: [*j.ours(b, i), *reads, "--board", f"sim:{b}"], ours)
        run(job, "primed", lambda b, i, j=job: [*j.ours(b, i), *reads, "--board", f"sim:{b}", "--rx-mode", "primed"],
            ours)
        if args.seed_client:
            # The reference client takes the board directory first.
            run(job, "reference", lambda b, i, j=job: [str(b), *j.reference(b, i)], [str(args.seed_client)])
    dense = next((j for j in jobs if j.name == "dense flash"), None)
    if dense is not None:
        run(dense, "pcie default", lambda b, i: [*dense.ours(b, i), *reads, "--board", f"sim:{b}"], ours, "pcie")
    print_table(jobs, bool(args.seed_client), args.kept_reads)
    print()
    print_landing_trace(work / "trace-board")
    print(f"(boards, images and audit database in {work})")


REGISTER_NAMES = {R.ROM_SW_CNTL: "CNTL", R.ROM_SW_STATUS: "STATUS", R.ROM_SW_COMMAND: "COMMAND",
                  R.ROM_SW_DATA: "window"}


def print_landing_trace(path: Path) -> None:
    """Access by access, when each one started, landed on the board and ended: two chained
    256-byte reads in the middle of a chain, then two timed page programs."""
    rng = random.Random(9)
    create_board(path, content=rng.randbytes(SIZE), seed=9)
    bar = SimBar5(path)
    try:
        with RomSw(bar, RomSwOptions()) as engine:
            nor = SpiNor(engine)
            nor.identify()
            nor.read(0, 0x1000)
            bar.board.trace = []
            nor.read(0x1000, 0x200)
            _print_trace("two chained 256-byte reads, continuing a chain (asm24)", bar.board.trace)
            nor.erase(0x10000, 0x1000)
            bar.board.trace = []
            nor.program_pages(0x10000, rng.randbytes(0x200), [0x10000, 0x10100])
            nor.read(0x10000, 0x100)
            _print_trace("two timed page programs, then a read chain led by a status read (asm24)",
                         bar.board.trace)
    finally:
        bar.close()


def _print_trace(title: str, trace: list) -> None:  # noqa: ANN001
    print(f"access trace: {title}; µs from the first access")
    t0 = trace[0][3]
    print(f"  {'access':13} {'register':>9} {'bytes':>5} {'started':>9} {'landed':>9} {'ended':>9}")
    for kind, offset, size, start, landed, end in trace:
        name = REGISTER_NAMES.get(offset, f"{offset:#x}")
        print(f"  {kind:13} {name:>9} {size:5} {(start - t0) * 1e6:9.1f} {(landed - t0) * 1e6:9.1f} "
              f"{(end - t0) * 1e6:9.1f}")


def print_table(jobs: list[Job], with_reference: bool, kept_reads: int) -> None:
    head = (f"{'job':28} {'default':>8} {'primed':>8} {'reference':>9} {'physical':>9} {'transport':>9} "
            f"{'observed':>9} {'def/tr':>7} {'def/obs':>7} {'pri/tr':>7} {'def/phys':>8} {'ref/def':>8} {'wall s':>7}")
    print(f"modelled seconds, asm24 profile; kept data read {kept_reads}x by amdflash and in the floors "
          "(the reference client reads once)")
    print(head)
    for j in jobs:
        phys, tr, obs = j.floors
        d, p = j.results["default"], j.results["primed"]
        ref = j.results.get("reference")
        print(f"{j.name:28} {d:8.2f} {p:8.2f} {ref if ref is not None else float('nan'):9.2f} {phys:9.2f} {tr:9.2f} "
              f"{obs:9.2f} {d / tr:7.3f} {d / obs:7.3f} {p / tr:7.3f} {d / phys:8.3f} "
              f"{(ref / d) if ref else float('nan'):8.1f} {j.results['default wall']:7.1f}")
    by = {j.name: j for j in jobs}
    print()
    print("targets")
    for name, limit in TARGETS.items():
        if name in by:
            r = by[name].results["default"] / by[name].floors[1]
            bound = by[name].floors[2] / by[name].floors[1]
            print(f"  {name:26} {r:6.3f} x transport floor   (target <= {limit})  {'ok' if r <= limit else 'MISSED'}"
                  f"   [observed floor = {bound:.3f} x transport floor]")
    if "no-op reflash" in by and "dump" in by:
        r = by["no-op reflash"].results["default"] / by["dump"].results["default"]
        print(f"  {'no-op reflash':26} {r:6.3f} x a dump              (target <= {NOOP_VS_DUMP})  "
              f"{'ok' if r <= NOOP_VS_DUMP else 'MISSED'}")
    if with_reference:
        worst = min(by[n].results["reference"] / by[n].results["default"] for n in by)
        print(f"  {'vs reference (worst job)':26} {worst:6.1f} x faster             (target >= {VS_REFERENCE})  "
              f"{'ok' if worst >= VS_REFERENCE else 'MISSED'}")
    if "dense flash" in by and "pcie default" in by["dense flash"].results:
        j = by["dense flash"]
        ops = flash_ops(j.board, j.image, kept_reads=kept_reads)
        pcie_floor = transport_floor(ops, PCIE)
        r = j.results["pcie default"] / j.floors[0]
        print(f"  {'dense flash, pcie':26} {r:6.3f} x physical floor     (target <= {PCIE_VS_PHYSICAL})  "
              f"{'ok' if r <= PCIE_VS_PHYSICAL else 'MISSED'}   [{j.results['pcie default']:.2f} s; "
              f"pcie transport floor {pcie_floor:.2f} s = {pcie_floor / j.floors[0]:.3f} x physical]")


if __name__ == "__main__":
    main()
