"""Transport diagnostics recorded with the run that caused them.

A transport may offer `diagnostics()`: counts of what it saw go wrong while this run had it
open. The emulated board does (ROM_SW protocol violations, completions touched before their
done bit was read); a strict board also fails the access itself, which the run records as
its error. Recorded as one `stages` row at the end of the run.
"""
from __future__ import annotations

import datetime as dt
from typing import Any

from amdflash.stages.device import Device


def record_diagnostics(dev: Device) -> None:
    transport: Any = dev.bar   # walked through wrappers of any kind, by their attributes
    # Wrappers (the register ledger, the audited BAR) keep what they wrap as .inner / .raw.
    while hasattr(transport, "inner") or hasattr(transport, "raw"):
        transport = getattr(transport, "inner", None) or transport.raw
    diagnostics = getattr(transport, "diagnostics", None)
    if diagnostics is None:
        return
    counts = diagnostics()
    detail = ", ".join(f"{name.replace('_', ' ')} {value}" for name, value in counts.items())
    dev.recorder.add("stages", stage="transport", event="diagnostics", detail=detail,
                     at=dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"))
