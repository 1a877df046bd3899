"""A hardware report's measured busy times raise the driver's limit for that board."""
from __future__ import annotations

import json
from pathlib import Path

from amdflash.pipeline.commands.hardware_report import busy_limits

VARYING = Path(__file__).resolve().parents[2] / "stages" / "boards" / "emulated-varying-w25q16jw-asm24.json"


def test_a_reports_busy_limits_are_the_slowest_operation_it_saw():
    report = json.loads(VARYING.read_text())
    kinds = report["timings"]["busy"]["kinds"]
    limits = busy_limits(report)
    assert set(limits) == {int(op, 16) for op in kinds}
    for op, kind in kinds.items():
        slowest = max([kind[k]["max"] for k in ("per_operation", "polled") if k in kind]
                      + [kind["seconds"] + kind["error"]])
        assert limits[int(op, 16)] == slowest
    # The varying 4 KiB erase: its slowest pinned operation, not its median.
    assert limits[0x20] > kinds["0x20"]["seconds"]


def test_a_report_without_busy_times_raises_nothing():
    report = json.loads(VARYING.read_text())
    report["timings"]["busy"] = {}
    assert busy_limits(report) == {}
