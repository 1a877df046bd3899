"""Write the hardware report of every emulated chip on every cost profile into tests/stages/boards/.

    python -m tests.stages.boards.regenerate        (from the project root; rewrites the emulated ones)

Parts amdflash cannot identify (UNKNOWN-SFDP2, an SFDP 2.0 table) get no report: the
report starts from an identified flash.

Reports of real boards (sent by users, see docs/cost-model.md) sit beside these under their own
names and are never rewritten here. Each emulated report is made with a scratch block where the
part allows one (table parts), so busy times are in it too; one more is of a board whose
erases, programs and link transfers vary (VARYING), so the spreads are in the set too.
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from amdflash.pipeline.cli.main import main
from amdflash.stages.sim import create_board
from amdflash.stages.sim.catalog import all_parts
from amdflash.stages.sim.cost import PROFILES

HERE = Path(__file__).resolve().parent
SCRATCH_SECTOR = 16


VARYING_NAME = "emulated-varying-w25q16jw-asm24.json"
VARYING = {
    "transport": {"control": {"median": 120e-6, "stdev": 12e-6, "min": 95e-6, "max": 170e-6},
                  "bulk": {"median": 90e-6, "stdev": 10e-6, "min": 70e-6, "max": 130e-6}},
    "busy": {"0x02": {"median": 0.6e-3, "stdev": 0.08e-3, "min": 0.4e-3, "max": 0.9e-3},
             "0x20": {"median": 50e-3, "stdev": 8e-3, "min": 35e-3, "max": 80e-3}},
}


def name(chip: str, profile: str) -> str:
    return f"emulated-{chip.lower()}-{profile}.json"


def main_() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["AMDFLASH_DB"] = str(Path(tmp) / "audit.sqlite")
        os.environ["AMDFLASH_LOCK_DIR"] = str(Path(tmp) / "locks")
        for chip in all_parts():
            for profile in PROFILES:
                board = create_board(Path(tmp) / f"{chip}-{profile}", seed=1, chip=chip, transport=profile)
                out = HERE / name(chip, profile)
                args = ["hardware-report", "--board", f"sim:{board}", "-o", str(out), "--overwrite", "-q"]
                code = main([*args, "--scratch-sector", str(SCRATCH_SECTOR), "--yes"])
                if code == 2:          # a part without table erases: no scratch timing
                    code = main(args)
                if code == 1 and not out.exists():
                    # amdflash cannot identify the part (UNKNOWN-SFDP2: SFDP 2.0): no report of it.
                    print(f"{out.name}: not made (amdflash does not identify the {chip})", file=sys.stderr)
                    continue
                if code:
                    print(f"{out.name}: exit {code}", file=sys.stderr)
                    return code
                print(out.name)
        # A board as real ones are: erases, page programs and the bridge's transfers each take
        # a different time (the spreads a report carries and a calibrated board reproduces).
        board = create_board(Path(tmp) / "varying", seed=1, chip="W25Q16JW", calibration=VARYING)
        out = HERE / VARYING_NAME
        code = main(["hardware-report", "--board", f"sim:{board}", "-o", str(out), "--overwrite", "-q",
                     "--scratch-sector", str(SCRATCH_SECTOR), "--yes"])
        if code:
            print(f"{out.name}: exit {code}", file=sys.stderr)
            return code
        print(out.name)
    return 0


if __name__ == "__main__":
    sys.exit(main_())
