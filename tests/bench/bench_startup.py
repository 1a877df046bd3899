"""Start-up of the command line (issue 29): wall time of `amdflash --version`, `--help` and
`info --board sim:DIR` against `python -c pass`, measured side by side in one run (each round
runs every one once, in turn, so the machine's load falls on all alike), and how many modules
each imports beyond the bare interpreter's. `info` runs on a fresh audit database each time
(the schema created and made durable first); `info kept` on one that already holds runs.

    python -m tests.bench.bench_startup [ROUNDS] [--python PATH] [--before DIR]     (default: 9 rounds)

`--python` runs the command lines with another environment's interpreter. `--before DIR`
also runs each command line, in the same rounds, with DIR first on PYTHONPATH: DIR holds an
older `amdflash` package (e.g. a tree of symlinks into a worktree of an older commit:
amdflash/{__init__,__main__}.py from its pipeline/amdflash/, and amdflash/pipeline,
amdflash/stages, amdflash/store pointing at its folders), so before and after share the
machine's load. The board is made once with `amdflash sim create`. Targets: --version
<= 5x and --help <= 10x `python -c pass`, info <= 10x; --version at most 40 modules beyond the
bare interpreter's, --help at most 150.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGETS = {"--version": (5, 40), "--help": (10, 150), "info": (10, None)}
# sys.modules at exit, the console script's way in (pipeline/launch.py), on stderr's last line.
_LAUNCH = ("import atexit, json, sys\n"
           "atexit.register(lambda: print(json.dumps(sorted(sys.modules)), file=sys.__stderr__))\n"
           "sys.argv = ['amdflash', *sys.argv[1:]]\n"
           "from amdflash.pipeline.launch import run\n"
           "run()\n")
_BARE = ("import atexit, json, sys\n"
         "atexit.register(lambda: print(json.dumps(sorted(sys.modules)), file=sys.__stderr__))\n")
_OWN = {"atexit", "json", "json.decoder", "json.scanner", "json.encoder", "_json"}   # the hook's own


def _env(pythonpath: str | None) -> dict[str, str] | None:
    return None if pythonpath is None else {**os.environ, "PYTHONPATH": pythonpath}


def _modules(python: str, code: str, argv: list[str], pythonpath: str | None = None) -> set[str]:
    p = subprocess.run([python, "-c", code, *argv], capture_output=True, text=True, timeout=300,
                       env=_env(pythonpath))
    return set(json.loads(p.stderr.strip().splitlines()[-1])) - _OWN


def _wall(argv: list[str], pythonpath: str | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, timeout=300,
                   env=_env(pythonpath))
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rounds", nargs="?", type=int, default=9)
    ap.add_argument("--python", default=sys.executable, help="the interpreter that runs amdflash")
    ap.add_argument("--before", metavar="DIR", help="also measure the amdflash importable from DIR (PYTHONPATH)")
    opts = ap.parse_args()
    trees = {"": None, **({" (before)": opts.before} if opts.before else {})}
    # The floor is `python -c pass` of the environment that runs amdflash: an editable install's
    # path hook (a .pth importing a finder at every start) is that environment's cost, not
    # amdflash's, and the bench's own interpreter may be another environment altogether.
    bare = opts.python
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        board = Path(tmp) / "board"
        subprocess.run([opts.python, "-m", "amdflash", "sim", "create", str(board)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        info = ["info", "--board", f"sim:{board}", "--db"]
        # `info kept`: the same, on one database that already holds runs (an operator's trail):
        # no schema to create, and the board's earlier runs to look through.
        kept = str(Path(tmp) / "kept.sqlite")
        for _ in range(3):
            subprocess.run([opts.python, "-m", "amdflash", *info, kept], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        lines = {"--version": ["--version"], "--help": ["--help"],
                 "info": [*info, str(Path(tmp) / "info.sqlite")], "info kept": [*info, kept]}
        times: dict[str, list[float]] = {"pass": []}
        for i in range(opts.rounds):
            times["pass"].append(_wall([bare, "-c", "pass"]))
            for name, argv in lines.items():
                for tree, pythonpath in trees.items():
                    if name == "info":      # a fresh database each time
                        argv = [*argv[:-1], str(Path(tmp) / f"info-{i}{tree.strip(' ()')}.sqlite")]
                    times.setdefault(name + tree, []).append(_wall([opts.python, "-m", "amdflash", *argv], pythonpath))
        base = _modules(bare, _BARE, [])
        counts = {name + tree: len(_modules(opts.python, _LAUNCH, argv, pythonpath) - base)
                  for name, argv in lines.items() for tree, pythonpath in trees.items()}
    floor = statistics.median(times["pass"])
    print(f"{opts.rounds} rounds, medians; python -c pass {floor * 1000:.1f} ms, {len(base)} modules")
    print(f"{'command line':<20} {'median ms':>10} {'ratio':>7} {'target':>7} {'modules+':>9} {'target':>7}")
    for name in counts:
        wall = statistics.median(times[name])
        ratio_target, count_target = TARGETS[name.split()[0]]
        print(f"{name:<20} {wall * 1000:>10.1f} {wall / floor:>7.1f} {'<=' + str(ratio_target):>7} "
              f"{counts[name]:>9} {'<=' + str(count_target) if count_target else '-':>7}")

if __name__ == "__main__":
    main()
