"""amdflash as a library: the board commands as functions that return result objects.

    from amdflash import api

    info = api.info("usb:0")
    print(info.chip, info.unique_id)
    backup = api.dump("backup.bin", board="usb:0")
    result = api.flash("known-good.bin", board="usb:0", clear_cmp=True)
    if not result.ok:
        print(result.error, "-> resume with api.resume(board='usb:0')")

Each call is one audited run on one board, exactly as the command line does it (the same
checks, the same audit database: `db=`, else $AMDFLASH_DB, else the config file's `db`,
else the platform data directory). What the CLI would refuse with exit status 2 raises
`Refused` before anything runs; what happens during the run (success, failure, an
interruption, a busy board) is in the returned result: `status`, `ok`, `error`, `run_id`,
`report` (the run as recorded, the same object as `amdflash report RUN --format json`) and
typed properties per command. `result.raise_for_status()` turns a failure into `RunFailed`.

Call from the main thread: a run watches SIGINT/SIGTERM so that Ctrl-C stops it at a safe
point (between erase units) and the registers are always restored. Nothing is printed;
events go to the standard `logging` module (logger "amdflash") unless the application
configured structlog itself.
"""
from __future__ import annotations

import logging
from pathlib import Path
from collections.abc import Sequence

from amdflash.pipeline.commands import board as board_commands
from amdflash.pipeline.errors import Refusal as Refused
from amdflash.pipeline.commands.results import (DumpResult, FlashResult, InfoResult, ReadResult, RunFailed, RunOutcome,
                                                VerifyResult)

EngineOptions = board_commands.EngineOptions

__all__ = ["info", "read", "dump", "verify", "flash", "resume", "runs", "Refused", "RunFailed", "RunOutcome",
           "InfoResult", "ReadResult", "DumpResult", "VerifyResult", "FlashResult", "EngineOptions"]


def _quiet_by_default() -> None:
    """Route amdflash's events to `logging` when nobody configured structlog."""
    import structlog

    if not structlog.is_configured():
        structlog.configure(logger_factory=structlog.stdlib.LoggerFactory(),
                            wrapper_class=structlog.stdlib.BoundLogger,
                            processors=[structlog.processors.add_log_level, structlog.stdlib.render_to_log_kwargs])
        logging.getLogger("amdflash").addHandler(logging.NullHandler())


def _session(board: str, db: str | Path | None) -> board_commands.Session:
    _quiet_by_default()
    return board_commands.Session((board,), str(db) if db is not None else None)


def _one(results: Sequence[RunOutcome]) -> RunOutcome:
    (result,) = results
    return result


def info(board: str = "auto", *, db: str | Path | None = None, engine: EngineOptions | None = None) -> InfoResult:
    """Identify the flash: JEDEC capture, chip, SR1-3, protection, SFDP, unique ID."""
    return _one(board_commands.info(_session(board, db), engine))  # type: ignore[return-value]


def read(address: int, size: int, board: str = "auto", *, output: str | Path | None = None,
         db: str | Path | None = None, engine: EngineOptions | None = None, overwrite: bool = False) -> ReadResult:
    """Read `size` bytes at `address` (result.data), to `output` too if given (an existing file
    only with `overwrite`)."""
    out = Path(output) if output is not None else None
    return _one(board_commands.read(_session(board, db), address, size, out, engine, overwrite))  # type: ignore[return-value]


def dump(output: str | Path, board: str = "auto", *, via: str = "rom-sw", db: str | Path | None = None,
         engine: EngineOptions | None = None, overwrite: bool = False) -> DumpResult:
    """Dump the whole 2 MiB flash to `output` (written only when complete, and in place of an
    existing file only with `overwrite`); result.result_sha256."""
    return _one(board_commands.dump(_session(board, db), Path(output), via, engine, overwrite))  # type: ignore[return-value]


def verify(image: str | Path, board: str = "auto", *, db: str | Path | None = None,
           engine: EngineOptions | None = None) -> VerifyResult:
    """Compare the whole flash with `image`; result.equal, result.first_mismatch."""
    return _one(board_commands.verify(_session(board, db), Path(image), engine))  # type: ignore[return-value]


def flash(image: str | Path, board: str = "auto", *, clear_cmp: bool = False, start_sector: int = 0,
          sector_count: int | None = None, force: bool = False, retries: int = 2, expect_part: str | None = None,
          unknown_chip_ok: bool = False, start_over: bool = False, db: str | Path | None = None,
          engine: EngineOptions | None = None) -> FlashResult:
    """Write `image` (backup, plan, erase, program, verify). Calling it is the confirmation that
    the CLI asks for with --yes. `expect_part`: a blank (bricked) board's VBIOS part number, as
    --expect-part; `unknown_chip_ok`: as --unknown-chip-ok; `start_over`: as --start-over (a
    board whose last flash never finished is refused without it)."""
    options = board_commands.FlashOptions(clear_cmp, start_sector, sector_count, force, retries, expect_part,
                                    unknown_chip_ok, start_over)
    return _one(board_commands.flash(_session(board, db), Path(image), options, engine))  # type: ignore[return-value]


def resume(run_id: str | None = None, board: str = "auto", *, image: str | Path | None = None,
           db: str | Path | None = None, hardware_report: str | Path | None = None) -> FlashResult:
    """Finish an interrupted flash run (the latest unfinished one of `board` if no run_id).
    `hardware_report`: the board's hardware report, as --hardware-report (the other commands
    take it as EngineOptions(hardware_report=...))."""
    path = Path(image) if image is not None else None
    report = Path(hardware_report) if hardware_report is not None else None
    return _one(board_commands.resume(_session(board, db), run_id, path, report))  # type: ignore[return-value]


def runs(db: str | Path | None = None) -> list[dict[str, object]]:
    """Every recorded run, oldest first."""
    return board_commands.runs(str(db) if db is not None else None)
