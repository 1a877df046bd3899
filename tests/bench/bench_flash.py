"""Modelled seconds (asm24 profile) of a full dump and a full recovery flash.

Ours (primed and chained RX) at the driver level and through the `amdflash flash` pipeline,
against the reference client on identical boards (when --seed-client names
../shared/conformance/run-seed-client), beside the physical floor of docs/cost-model.md.

The recovery flash writes an image over a board holding different (random) content, so
every unit needs an erase. Two images: the synthetic IFWI (mostly erased space, like a
real 2 MiB IFWI's free areas) and a dense one (every page programmed).
"""
from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from amdflash.stages.flash.chips import GD25LQ16E
from amdflash.stages.flash.planning import cover, plan_unit
from amdflash.stages.flash.sectors import flash_sectors
from amdflash.stages.flash.spinor import SpiNor
from amdflash.stages.navi31.romsw import RomSw, RomSwOptions
from amdflash.stages.transport.sim import SimBar5, create_board
from amdflash.stages.transport.sim.cost import ASM24
from amdflash.stages.transport.sim.state import C, BoardFiles
from amdflash.stages.transport.sim.synth import synthetic_ifwi

SIZE, UNIT, PAGE = 0x200000, 0x1000, 0x100
PRESCALE = 8


def modelled(path: Path) -> float:
    files = BoardFiles(path)
    try:
        return files.region("counters").cast("d")[C["modelled_seconds"]]
    finally:
        files.close()


def spi(wire_bytes: int) -> float:
    return ASM24.spi_transaction(wire_bytes, PRESCALE)


def floor_dump() -> float:
    return (SIZE // 256) * spi(4 + 256)


def floor_flash(current: bytes, image: bytes) -> float:
    """Busy time of the erases and programs needed, SPI time of the programmed pages and of
    one read-back of every written unit."""
    chip = GD25LQ16E
    sizes = [e.size for e in chip.erase_types]
    busy = {e.size: e.typical for e in chip.erase_types}
    total = 0.0
    for block in range(0, SIZE, 0x10000):
        plans = [plan_unit(a, current[a:a + UNIT], image[a:a + UNIT], PAGE) for a in range(block, block + 0x10000, UNIT)]
        total += sum(busy[e.size] for e in cover(plans, sizes))
        for p in plans:
            total += len(p.pages) * (chip.page_program[0] + spi(4 + PAGE))
            if p.action != "skip":
                total += (UNIT // 256) * spi(4 + 256)
    return total


def run_ours_driver(path: Path, what: str, mode: str, image: bytes) -> float:
    bar = SimBar5(path)
    start = bar.clock.now()
    engine = RomSw(bar, RomSwOptions(rx_mode=mode))  # type: ignore[arg-type]
    with engine:
        nor = SpiNor(engine)
        nor.identify()
        if what == "dump":
            nor.read(0, SIZE)
        else:
            flash_sectors(nor, image)
    elapsed = bar.clock.now() - start
    bar.close()
    return elapsed


def run_cli(args: list[str], env: dict[str, str]) -> None:
    subprocess.run([sys.executable, "-m", "amdflash.pipeline.cli", "-q", *args], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seed-client", type=Path, help="path of ../shared/conformance/run-seed-client")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="amdflash-bench-"))
    rng = random.Random(7)
    current = rng.randbytes(SIZE)
    sparse = synthetic_ifwi(7)
    dense = bytearray(rng.randbytes(SIZE))
    dense[:4] = b"\xaa\x55\xaa\x55"
    images = {"synthetic": sparse, "dense": bytes(dense)}
    for name, img in images.items():
        (work / f"{name}.bin").write_bytes(img)
    env = {**os.environ, "AMDFLASH_DB": str(work / "audit.sqlite"), "PYTHONPATH": os.getcwd()}
    n = 0

    def board() -> Path:
        nonlocal n
        n += 1
        return create_board(work / f"b{n}", content=current, seed=n)

    rows: list[tuple[str, str, float, float]] = []   # (job, who, modelled, wall)

    def measure(job: str, who: str, fn) -> None:  # noqa: ANN001
        path = board()
        t0, m0 = time.perf_counter(), modelled(path)
        fn(path)
        rows.append((job, who, modelled(path) - m0, time.perf_counter() - t0))

    for mode in ("primed", "chained"):
        measure("dump 2 MiB", f"ours driver ({mode})", lambda p, m=mode: run_ours_driver(p, "dump", m, b""))
        measure("dump 2 MiB", f"amdflash dump ({mode})",
                lambda p, m=mode: run_cli(["dump", str(work / "out.bin"), "--rx-mode", m, "--board", f"sim:{p}"], env))
    if args.seed_client:
        measure("dump 2 MiB", "reference romless",
                lambda p: subprocess.run([str(args.seed_client), str(p), "romless", "dump", str(work / "ref.bin")],
                                         check=True, stdout=subprocess.DEVNULL, env=env))
    for name, img in images.items():
        job = f"flash {name}"
        for mode in ("primed", "chained"):
            measure(job, f"ours driver ({mode})", lambda p, m=mode, i=img: run_ours_driver(p, "flash", m, i))
            measure(job, f"amdflash flash ({mode})",
                    lambda p, m=mode, nm=name: run_cli(["flash", str(work / f"{nm}.bin"), "--yes", "--rx-mode", m,
                                                        "--force", "--board", f"sim:{p}"], env))
        if args.seed_client:
            measure(job, "reference romless",
                    lambda p, nm=name: subprocess.run([str(args.seed_client), str(p), "romless", "flash",
                                                       str(work / f"{nm}.bin"), "--yes"],
                                                      check=True, stdout=subprocess.DEVNULL, env=env))

    floors = {"dump 2 MiB": floor_dump(), **{f"flash {k}": floor_flash(current, v) for k, v in images.items()}}
    print(f"{'job':18} {'who':26} {'modelled s':>11} {'× floor':>8} {'wall s':>8}")
    for job, who, m, wall in rows:
        print(f"{job:18} {who:26} {m:11.2f} {m / floors[job]:8.1f} {wall:8.2f}")
    for job, f in floors.items():
        print(f"{job:18} {'physical floor':26} {f:11.2f}")
    print(f"(boards and images in {work})")


if __name__ == "__main__":
    main()
