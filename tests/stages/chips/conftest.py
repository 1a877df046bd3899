"""Fixtures for the chip tests: the pipeline's CLI fixtures, and the parts to run over."""
from __future__ import annotations

from tests.pipeline.engine.conftest import Result, cli, cli_shown, db, image  # noqa: F401  (fixtures)

# The parts in the chip table, each emulated; GD25LQ16E is the board's own part.
TABLE_PARTS = ("GD25LQ16E", "W25Q16DW", "W25Q16FW", "W25Q16JW", "MX25U1635F", "MX25U1633F")
