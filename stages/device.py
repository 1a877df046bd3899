"""What every stage of one board's job shares: the audited BAR, the drivers, the recorder.

Device I/O runs in a worker thread behind a per-board CapacityLimiter(1): one board is
one serial SPI bus, while different boards run truly in parallel.
"""
from __future__ import annotations

import shlex
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar
from collections.abc import Callable

import anyio

from amdflash.stages.drivers.flash.spinor import SpiNor
from amdflash.stages.drivers.navi31.romsw import RomSw
from amdflash.stages.transport.base import Bar5, BoardIdentity, Capability, Clock, TransportError

if TYPE_CHECKING:
    from amdflash.stages.snapshot import ReadChecks
    from amdflash.stages.transport.amdgpu import AmdgpuBoard

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


class Stranded(Protocol):
    """An earlier run whose register changes were put back before this one (the record's
    account of it: store.stranded.StrandedRun); read-only."""
    @property
    def run_id(self) -> str: ...
    @property
    def command(self) -> str: ...
    @property
    def registers(self) -> dict[int, int]: ...
    @property
    def unique_id(self) -> str | None: ...
    @property
    def outcome(self) -> str: ...


class NoBar5:
    """The BAR5 of a board the amdgpu driver owns: there is none to reach. A register access
    is refused, never attempted; the clock and identity are the driver board's."""

    def __init__(self, board: AmdgpuBoard) -> None:
        self.board = board

    @property
    def clock(self) -> Clock:
        return self.board.clock

    @property
    def identity(self) -> BoardIdentity:
        return self.board.identity

    def _refuse(self, *_: Any) -> Any:
        raise TransportError(f"{self.identity.spec}: the amdgpu driver owns this board's BAR5; "
                             "no register is reachable through it")

    read32 = write32 = read_block = write_block = _refuse

    def close(self) -> None:
        self.board.close()


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
    # What a run learns about the board on its way, for the stages after: the register values
    # the run must leave (before it changed anything, or as an earlier run found them), the run
    # whose changes were put back first, the protection reading in words, the confirmed reads'
    # findings, lines for the operator, and how to word a command the operator may paste (the
    # engine hands its own down, so the command reaches the run's audit database).
    registers_truth: dict[int, int] = field(default_factory=dict)
    stranded: Stranded | None = None
    protection_reading: str | None = None
    read_checks: ReadChecks | None = None
    notes: list[str] = field(default_factory=list)
    suggest: Callable[..., str] = field(default=lambda *words, args=(): shlex.join(
        ["amdflash", *words, *(["--", *args] if args else [])]))
    # How the board is driven, as opening it declared (transport/base.py); for "amdgpu",
    # `amdgpu` is the driver's board and `bar` a NoBar5 (see `through_amdgpu`).
    capability: Capability = "bar5"
    amdgpu: AmdgpuBoard | None = None

    @classmethod
    def through_amdgpu(cls, board: AmdgpuBoard, recorder: AuditSink, stop: StopFlag,
                       progress: Progress = lambda stage, done, total: None) -> Device:
        """The device of a board opened through the amdgpu driver (capability "amdgpu")."""
        return cls(NoBar5(board), board.identity, recorder, stop, progress, capability="amdgpu", amdgpu=board)

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
