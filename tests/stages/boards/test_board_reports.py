"""Every hardware report in tests/stages/boards/ (emulated parts and profiles, and any real board's a
maintainer adds) becomes an emulated board that reproduces it: `sim create --from-report`, then
a new hardware report of that board agrees with the stored one within its stated error."""
from __future__ import annotations

import json

from amdflash.stages.sim.report_model import check
from tests.stages.boards.conftest import STORED as REPORTS
from tests.pipeline.commands.test_round_trip import compare


def test_there_is_a_report_of_every_emulated_chip_on_every_profile():
    from amdflash.stages.sim.catalog import all_parts
    from amdflash.stages.sim.cost import PROFILES

    names = {p.name for p in REPORTS}
    # UNKNOWN-SFDP2 is the part amdflash cannot identify (SFDP 2.0): it has no report.
    missing = [f"emulated-{chip.lower()}-{profile}.json" for chip in all_parts() for profile in PROFILES
               if chip != "UNKNOWN-SFDP2" and f"emulated-{chip.lower()}-{profile}.json" not in names]
    assert not missing


def test_the_board_of_a_report_reproduces_it(amdflash, tmp_path, report_path):
    path = report_path
    stored = json.loads(path.read_text())
    check(stored)
    r = amdflash("sim", "create", tmp_path / "board", "--from-report", path, "--seed", 1)
    assert r.code == 0, r.err
    r = amdflash("hardware-report", "--board", f"sim:{tmp_path / 'board'}", "-o", tmp_path / "again.json")
    assert r.code == 0, r.err
    again = json.loads((tmp_path / "again.json").read_text())
    stored_busy = stored["timings"]["busy"]
    stored["timings"]["busy"] = {}            # the new report has no scratch block; busy times are compared below
    compare(stored, again)
    made = json.loads((tmp_path / "board" / "board.json").read_text())
    for op, k in (stored_busy.get("kinds") or {}).items() if made["transport"] != "ideal" else ():
        if "seconds" in k:
            kept = made["calibration"]["busy"][op]
            assert (kept["median"] if "per_operation" in k else kept) == k["seconds"]
