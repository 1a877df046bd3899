"""What every stage of one board's job shares: the audited BAR, the drivers, the recorder.

Device I/O runs in a worker thread behind a per-board CapacityLimiter(1): one board is
one serial SPI bus, while different boards run truly in parallel.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar
from collections.abc import Callable

import anyio

from amdflash.stages.drivers.flash.spinor import SpiNor
from amdflash.stages.drivers.navi31.romsw import RomSw
from amdflash.stages.transport.base import Bar5, BoardIdentity

T = TypeVar("T")


class Interrupted(Exception):
    """The operator asked to stop (Ctrl-C, SIGTERM); raised at the next safe point."""


class AuditSink(Protocol):
    run_id: str
    register_writes: int

    @property
    def failed(self) -> str | None: ...

    def add(self, table: str, **row: Any) -> None: ...

    def register_write(self, offset: int, value: int | None, data: bytes | None, clock: float) -> None: ...

    def covers(self, start: int, size: int) -> bool: ...

    def flush(self) -> None: ...

    def durable(self) -> None: ...


class StopFlag:
    """Set from the signal handler; checked by stages between units (the safe points)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason = ""

    def set(self, reason: str) -> None:
        self.reason = reason
        self._event.set()

    def __bool__(self) -> bool:
        return self._event.is_set()

    def check(self) -> None:
        if self._event.is_set():
            raise Interrupted(self.reason or "interrupted")


Progress = Callable[[str, int, int], None]   # (stage, done, total)


@dataclass
class Device:
    bar: Bar5
    identity: BoardIdentity
    recorder: AuditSink
    stop: StopFlag
    progress: Progress = lambda stage, done, total: None
    limiter: anyio.CapacityLimiter = field(default_factory=lambda: anyio.CapacityLimiter(1))
    romsw: RomSw | None = None
    nor: SpiNor | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    async def call(self, fn: Callable[..., T], *args: Any, at: tuple[str, int] | None = None) -> T:
        """Run blocking device I/O in this board's worker thread slot. `at` (stage, unit
        address): a failure that names no address of its own is marked as happening there."""
        try:
            return await anyio.to_thread.run_sync(fn, *args, limiter=self.limiter)
        except Exception as e:
            if at is not None and getattr(e, "address", None) is None:
                stage, address = at
                e.stage, e.address = stage, address  # type: ignore[attr-defined]
                e.where = f"{stage} of unit {address:#08x}"  # type: ignore[attr-defined]
            raise

    @property
    def clock(self):
        return self.bar.clock
