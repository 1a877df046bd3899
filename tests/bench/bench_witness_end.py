"""What asking the witnesses adds to a flash's end (issue 45: at most 0.5 s with a local witness).

Runs `amdflash flash` (a process of its own each time, Python start-up included) on an emulated
board, alternately without witnesses and with two local witnesses of our own
(tests/support/witness_server.py on loopback, quorum 2), ROUNDS times each, and prints the
wall seconds of each command, the medians, and their difference: what the witnesses add to the
end of a flash, imports of the HTTP client included. Those whole-flash times move by seconds with the
machine's load; the figure the target is checked against is the witnessing alone
(pipeline/engine/witnessing.at_end as a flash's end calls it, in a fresh process so its imports
count), over the same trail, median of ROUNDS.

    python -m tests.bench.bench_witness_end [ROUNDS]
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from amdflash.stages.sim import create_board
from amdflash.stages.sim.synth import synthetic_ifwi
from amdflash.store import keys, tlog
from tests.support.witness_server import WitnessServer

ORIGIN = "bench.example/amdflash-host"
TARGET = 0.5


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        key_path = work / "host_key.pem"
        keys.load_or_create(key_path)
        log_key = keys.load_or_create(tlog.log_key_path(key_path))
        log_vkey = tlog.vkey(ORIGIN, keys.public_bytes(log_key))
        servers = [WitnessServer(name=f"w{i}.bench/witness", logs={ORIGIN: [log_vkey]}).start() for i in range(2)]
        plain, witnessed = work / "plain.toml", work / "witnessed.toml"
        plain.write_text(f'log_origin = "{ORIGIN}"\n')
        witnessed.write_text(plain.read_text() + "witness_quorum = 2\n" + "".join(
            f'[[witnesses]]\nurl = "{s.url}"\nkey = "{s.vkey}"\n' for s in servers))
        image = work / "image.bin"
        image.write_bytes(synthetic_ifwi(1234))
        board = create_board(work / "board", seed=3)
        env = {**os.environ, "AMDFLASH_DB": str(work / "audit.sqlite"), "AMDFLASH_HOST_KEY": str(key_path),
               "AMDFLASH_LOCK_DIR": str(work / "locks"), "XDG_DATA_HOME": str(work / "data"),
               "XDG_CONFIG_HOME": str(work / "config")}
        times: dict[str, list[float]] = {"without": [], "with": []}
        for i in range(rounds):
            for label, config in (("without", plain), ("with", witnessed)):
                started = time.monotonic()
                done = subprocess.run([sys.executable, "-m", "amdflash.pipeline.cli", "--no-progress", "--config",
                                       str(config), "flash", str(image), "--board", f"sim:{board}", "--yes"],
                                      env=env, capture_output=True, text=True)
                took = time.monotonic() - started
                if done.returncode != 0:
                    print(done.stderr, file=sys.stderr)
                    return 1
                end = [line for line in done.stderr.splitlines() if line.startswith("run ")]
                times[label].append(took)
                print(f"round {i + 1} {label:8} {took:6.2f} s   {end[-1] if end else ''}")
        without, with_ = statistics.median(times["without"]), statistics.median(times["with"])
        print(f"\nmedian flash: without witnesses {without:.2f} s, with two local witnesses {with_:.2f} s: "
              f"{with_ - without:+.3f} s")

        # The witnessing alone, as a flash's end runs it, in a fresh process each time (so the
        # import of the HTTP client and of the witness code counts): a head none of the witnesses
        # cosigned yet is asked of both, their answers checked and kept.
        db = str(work / "audit.sqlite")
        probe = ("import sys, time\n"
                 "import amdflash.pipeline.cli.board\n"       # what a flash's process has loaded by its end
                 "from amdflash.pipeline.engine import witnessing\n"
                 "from amdflash.pipeline import config\n"
                 "started = time.monotonic()\n"
                 "conf = witnessing.configured(config.load(config.Path(sys.argv[2])))\n"
                 "said = witnessing.at_end(sys.argv[1], conf, {'run': {'tree_size': 1}})\n"
                 "assert said and said['witnessed'], said\n"
                 "print(time.monotonic() - started)\n")
        alone = []
        for _ in range(rounds):
            for p in Path(db + ".anchor.witnessed").glob("checkpoint.*"):
                p.unlink()
            done = subprocess.run([sys.executable, "-c", probe, db, str(witnessed)], env=env, capture_output=True,
                                  text=True)
            if done.returncode != 0:
                print(done.stderr, file=sys.stderr)
                return 1
            alone.append(float(done.stdout))
        for s in servers:
            s.stop()
        # What the witness code costs a flash's start-up: its modules' import, measured by Python.
        done = subprocess.run([sys.executable, "-X", "importtime", "-c", "import amdflash.pipeline.cli.board"],
                              env=env, capture_output=True, text=True)
        own = sum(int(line.split("|")[1]) for line in done.stderr.splitlines()
                  if line.startswith("import time:") and line.split("|")[2].strip().lstrip().split(".")[-1]
                  in ("witnessing", "witness") and "amdflash" in line)
        print(f"import of the witness modules at start-up (pipeline/engine/witnessing, store/witness, "
              f"self time): {own / 1000:.1f} ms")
        added = statistics.median(alone) + own / 1e6
        print(f"witnessing at a flash's end (two witnesses asked, answers checked, kept; the HTTP client's "
              f"import included): {', '.join(f'{a * 1000:.0f}' for a in alone)} ms; "
              f"median {statistics.median(alone) * 1000:.0f} ms")
        print(f"added to a flash (start-up import and end): {added:.3f} s (target at most {TARGET} s): "
              f"{'met' if added <= TARGET else 'NOT met'}; the whole flashes' medians differ by "
              f"{with_ - without:+.2f} s, within their own spread on a shared machine")
        return 0 if added <= TARGET else 1


if __name__ == "__main__":
    raise SystemExit(main())
