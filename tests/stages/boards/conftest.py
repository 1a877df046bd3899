"""tests/stages/boards/: every stored hardware report, and any given with --board-report FILE, is a
board the tests run against (a test takes the `report_path` argument). One stored report runs
in the quick suite, unless the test module says ALL_SLOW; CI runs them all."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.pipeline.cli.conftest import amdflash, isolated  # noqa: F401 - the CLI fixtures: own database, locks, config

HERE = Path(__file__).resolve().parent
STORED = sorted(HERE.glob("*.json"))
QUICK = "emulated-gd25lq16e-asm24.json"      # one in the quick suite; CI runs them all (slow)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "report_path" not in metafunc.fixturenames:
        return
    given = [path.resolve() for path in metafunc.config.getoption("board_report")]
    quick = None if getattr(metafunc.module, "ALL_SLOW", False) else QUICK
    params = [pytest.param(p, id=p.name, marks=() if p.name == quick else pytest.mark.slow) for p in STORED]
    # A report asked for on the command line runs whatever -m says of slow ones.
    params += [pytest.param(p, id=f"given:{p.name}") for p in given]
    metafunc.parametrize("report_path", params)
