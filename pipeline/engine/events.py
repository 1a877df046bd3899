"""The audit trail as a stream of events: a recorder that shows its rows as they are recorded.

Everything a run does that matters is recorded (stage transitions, unit states, verify
results, every ROM_SW transaction and register write), so watching the recorder is how
progress and `-v` see every layer without those layers knowing about either. The tap
runs in the producer's thread, before the row reaches the writer.
"""
from __future__ import annotations

from typing import Any
from collections.abc import Callable

from amdflash.pipeline.logsetup import TRACE, VERBOSE, logger, settings

RowTap = Callable[[str, dict[str, Any]], None]

# Rows worth a debug line at -v (the bulk rows come at -vv; backup content never does).
_VERBOSE_TABLES = {"runs", "run_status", "boards", "stages", "register_snapshots", "units", "verifies",
                   "errors", "backups"}


class TappedRecorder:
    """An AuditSink that passes every row on to the real recorder and shows it to `taps`."""

    def __init__(self, recorder: Any, taps: list[RowTap], trace: bool = False) -> None:
        self._recorder = recorder
        self._taps = taps
        # The bulk rows (hundreds of thousands per flash) go straight through unless shown.
        self.register_write = self._register_write if trace else recorder.register_write
        if trace:
            # Transactions are assembled from the register writes: the recorder says when one starts.
            recorder.on_transaction = self._spi_transaction

    def __getattr__(self, name: str) -> Any:
        return getattr(self._recorder, name)

    @property
    def failed(self) -> str | None:
        return self._recorder.failed

    def add(self, table: str, **row: Any) -> None:
        self._recorder.add(table, **row)
        self._show(table, row)

    def _show(self, table: str, row: dict[str, Any]) -> None:
        for tap in self._taps:
            try:
                tap(table, row)
            except Exception:
                logger().debug("progress or log tap failed", table=table, exc_info=True)

    def _register_write(self, offset: int, value: int | None, data: bytes | None, clock: float) -> None:
        self._recorder.register_write(offset, value, data, clock)
        row = {"offset": f"{offset:#07x}", "clock": round(clock, 6)}
        row.update({"value": f"{value:#010x}"} if value is not None else {"bytes": len(data or b"")})
        self._show("register_writes", row)

    def _spi_transaction(self, opcode: int | None, address: int | None, address_bytes: int, tx_len: int,
                         rx_len: int, clock: float) -> None:
        row = {"opcode": f"{opcode:#04x}" if opcode is not None else None,
               "address": f"{address:#08x}" if address_bytes and address is not None else None,
               "tx": tx_len, "rx": rx_len, "clock": round(clock, 6)}
        self._show("spi_transactions", row)


def debug_tap(run_id: str, board: str) -> RowTap | None:
    """A tap that logs rows as debug events at -v (and the bulk rows at -vv), or None."""
    verbosity = settings().verbosity
    if verbosity < VERBOSE:
        return None
    log = logger(run_id=run_id, board=board)
    layer = {"register_writes": "transport", "spi_transactions": "rom_sw", "register_snapshots": "navi31",
             "units": "flash", "verifies": "flash", "stages": "stage", "boards": "identify"}

    def tap(table: str, row: dict[str, Any]) -> None:
        if table not in _VERBOSE_TABLES and not (verbosity >= TRACE and table in layer):
            return
        # "event" is the log line's own name: a stage row's event travels as "transition".
        shown = {("transition" if k == "event" else k): v for k, v in row.items()
                 if k not in ("run_id", "data") and v is not None}
        log.debug(_EVENT_NAMES.get(table, table), layer=layer.get(table, "run"), **shown)
    return tap


_EVENT_NAMES = {"runs": "run", "run_status": "run status", "boards": "board identified", "stages": "stage",
                "register_snapshots": "register snapshot", "units": "unit", "verifies": "verify",
                "errors": "error", "backups": "backup", "register_writes": "register write",
                "spi_transactions": "spi transaction"}


def wants_trace() -> bool:
    return settings().verbosity >= TRACE
