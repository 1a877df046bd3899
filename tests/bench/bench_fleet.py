"""A line's wall time: 8 boards over 2 exporters by one `fleet flash`, against one board alone.

Target: the eight boards take at most 1.4 times the wall time of the one board. The boards
run in real-time mode (`--realtime SCALE`: every modelled second is also slept as SCALE wall
seconds), so they overlap in wall time as hardware would; host CPU (the emulator, the
audit writer, SSH, the job processes) is what can make eight slower than one.

Every round recreates the nine boards with identical content (one seed; each still has its
own unique ID), then times `fleet flash` of the single board, then of the eight. Wall
times are whole fleet commands (coordinator session, reservations, SSH, jobs, release).
Needs what the fleet tests need (labgrid, sshd). Wall clocks are noisy on a shared machine:
the medians and every round are printed.

    python -m tests.bench.bench_fleet [--rounds 3] [--scale 1.0]
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from amdflash.stages.sim import create_board
from amdflash.stages.sim.synth import synthetic_ifwi
from tests.pipeline.fleet.lab import Lab, missing

SEED = 100
TARGET = 1.4


@dataclass
class Round:
    one_wall: float
    eight_wall: float
    one_modelled: float
    eight_modelled: float          # the slowest of the eight

    @property
    def ratio(self) -> float:
        return self.eight_wall / self.one_wall


def measure(root: Path, rounds: int, scale: float, report=print) -> list[Round]:  # noqa: ANN001
    """Time one board, then eight over two exporters, `rounds` times, on a line set up in `root`."""
    lab = Lab(root / "line")
    results: list[Round] = []
    try:
        lab.start_sshd()
        lab.start_coordinator()
        lab.add_host("hosta", 5, realtime=scale, seed=SEED, seed_step=0)
        lab.add_host("hostb", 4, realtime=scale, seed=SEED, seed_step=0)
        for name in lab.hosts:
            lab.start_exporter(name)
        places = {p["spec"][4:]: p["place"] for p in lab.make_places("line=bench")}
        single = places[str(lab.hosts["hosta"].boards[4])]
        eight = [places[str(b)] for h in lab.hosts.values() for b in h.boards if places[str(b)] != single]
        lab.labgrid_client("-p", single, "set-tags", "group=one")
        for place in eight:
            lab.labgrid_client("-p", place, "set-tags", "group=eight")
        image = root / "image.bin"
        image.write_bytes(synthetic_ifwi(4242))
        for r in range(rounds):
            if r:
                for host in lab.hosts.values():
                    for board in host.boards:
                        _recreate(board, scale)
            one_wall, one = _timed(lab, image, "group=one")
            eight_wall, many = _timed(lab, image, "group=eight")
            assert set(one.statuses().values()) == {"succeeded"}, one.boards
            assert set(many.statuses().values()) == {"succeeded"} and len(many.boards) == 8, many.boards
            result = Round(one_wall, eight_wall, next(iter(one.boards.values()))["modelled_seconds"],
                           max(b["modelled_seconds"] for b in many.boards.values()))
            results.append(result)
            report(f"round {r + 1}: one board {one_wall:6.2f} s wall ({result.one_modelled:.2f} modelled); "
                   f"eight boards {eight_wall:6.2f} s wall (slowest {result.eight_modelled:.2f} modelled); "
                   f"ratio {result.ratio:.2f}")
    finally:
        lab.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scale", type=float, default=1.0, help="real-time scale of the boards (default 1.0)")
    args = parser.parse_args()
    why = missing()
    if why:
        raise SystemExit(f"cannot run: {why}")
    with tempfile.TemporaryDirectory() as d:
        rounds = measure(Path(d), args.rounds, args.scale)
    print(f"median: one board {statistics.median(r.one_wall for r in rounds):.2f} s, eight boards over two "
          f"exporters {statistics.median(r.eight_wall for r in rounds):.2f} s, ratio "
          f"{statistics.median(r.ratio for r in rounds):.2f} (target <= {TARGET}) at real-time scale {args.scale}")


def _recreate(board: Path, scale: float) -> None:
    shutil.rmtree(board)
    create_board(board, seed=SEED, realtime_scale=scale)


def _timed(lab: Lab, image: Path, where: str):  # noqa: ANN202
    start = time.perf_counter()
    outcome = lab.fleet("flash", str(image), "--where", where, "--yes", timeout=900)
    return time.perf_counter() - start, outcome


if __name__ == "__main__":
    main()
