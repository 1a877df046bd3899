"""The emulated Navi31 board and ASM24 bridge: hardware for tests, demo and benchmarks.

`open_bar(path, transport)` is the entry point the reference-client conformance runner
uses (../shared/conformance): a persistent board whose `read`/`write` calls are each
charged as one streamed BAR access on the named cost profile.
"""
from amdflash.stages.sim.bar import SimBar, SimBar5, open_bar
from amdflash.stages.sim.board import Board
from amdflash.stages.sim.create import create_board

__all__ = ["Board", "SimBar", "SimBar5", "create_board", "open_bar"]
