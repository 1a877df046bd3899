"""`python -m tests.bench.null_store ARGS...`: amdflash with the audit trail replaced by a
store that keeps nothing — the baseline for what the audit costs. Benchmarks only."""
from __future__ import annotations

import sys

import amdflash.pipeline.commands.board as commands
from amdflash.pipeline.cli.main import main
from amdflash.store.writer.recorder import NullWriter

commands.auditdb.open_writer = lambda path: NullWriter().open()   # type: ignore[assignment,return-value]
commands._reports = lambda db, runs: ({}, {})                      # nothing recorded: no reports, no backups

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
