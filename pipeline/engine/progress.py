"""Progress of long work, per board: every active stage side by side, in bytes, with rate and ETA.

The stages of a flash run concurrently (backup read, erase, program, verify), so one bar
that follows "the current stage" would jump back and forth. Each board gets a row with a
column per stage instead, and a final state: done, failed at ADDRESS, interrupted or
refused. On a terminal that is a live rich table on stderr; off a terminal it is a
progress line every few seconds; with --log-json one JSON event per stage with numeric
`done` / `total` (bytes), `rate` (bytes/s) and `eta` (s). -q and --no-progress turn it off.

A stage reports (stage, done, total) in its own units; the table below turns them into
bytes. Units the planner found already equal pass erase, program and verify at once, so
they count as done for those three (seen through the audit rows, see events.py).
"""
from __future__ import annotations

import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from collections.abc import Callable

from amdflash.pipeline.engine.events import RowTap, TappedRecorder, debug_tap, wants_trace
from amdflash.pipeline.logsetup import QUIET, load_structlog, logger, settings
from amdflash.stages.terminal import printable
from amdflash.stages.drivers.flash.geometry import UNIT

if TYPE_CHECKING:      # rich (a hundred modules) is imported only for the live table on a terminal
    from rich.live import Live
    from rich.table import Table

# Bytes per unit each stage counts in; stages not listed count items (ifwi-all).
BYTES_PER = {"backup": UNIT, "erase": UNIT, "program": UNIT, "verify": UNIT, "dump": UNIT, "read": 1,
             "aperture": 1}
FLASH_STAGES = ("backup", "erase", "program", "verify")
PASSED_BY_SKIP = ("erase", "program", "verify")
FINAL = {"succeeded": "done", "failed": "failed", "interrupted": "interrupted", "refused": "refused"}
WINDOW = 10.0   # seconds of samples behind a rate


@dataclass
class StageProgress:
    name: str
    done: int = 0
    total: int = 0
    samples: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=64))

    @property
    def in_bytes(self) -> bool:
        return self.name in BYTES_PER

    def amounts(self, skipped: int) -> tuple[int, int]:
        """(done, total) in bytes (or items), counting units that were already equal."""
        per = BYTES_PER.get(self.name, 1)
        extra = skipped if self.name in PASSED_BY_SKIP else 0
        return min(self.done + extra, self.total) * per, self.total * per

    def rate(self, skipped: int) -> float | None:
        """Bytes (or items) per second over the last few seconds of real work."""
        if len(self.samples) < 2:
            return None
        (t0, d0), (t1, d1) = self.samples[0], self.samples[-1]
        if t1 - t0 <= 0:
            return None
        return (d1 - d0) * BYTES_PER.get(self.name, 1) / (t1 - t0)

    def record(self, done: int, total: int, now: float) -> None:
        self.done, self.total = done, total
        self.samples.append((now, done))
        while len(self.samples) > 2 and now - self.samples[0][0] > WINDOW:
            self.samples.popleft()


@dataclass
class BoardProgress:
    board: str
    run_id: str
    stages: dict[str, StageProgress] = field(default_factory=dict)
    skipped: int = 0
    state: str = "running"
    failed_at: int | None = None
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None
    erased: int = 0          # bytes the erase stage actually erased (units it passed need not be)

    def update(self, stage: str, done: int, total: int) -> StageProgress:
        progress = self.stages.get(stage)
        if progress is None:
            progress = self.stages[stage] = StageProgress(stage)
        progress.record(done, total, time.monotonic())
        return progress

    def observe(self, table: str, row: dict[str, Any]) -> bool:
        """Take what progress needs from an audit row; True when the run reached its end."""
        if table == "units" and row.get("action") == "skip" and row.get("state") == "verified":
            self.skipped += 1
            backup = self.stages.get("backup")
            for name in PASSED_BY_SKIP:   # a unit already equal has passed them all: show them
                if backup is not None and name not in self.stages:
                    self.stages[name] = StageProgress(name, 0, backup.total)
        elif table == "units" and row.get("state") == "erased":
            self.erased += int(row.get("size") or 0)
        elif table == "errors" and row.get("address") is not None and self.failed_at is None:
            self.failed_at = int(row["address"])
        elif table == "run_status" and row.get("status") in FINAL:
            self.state = FINAL[row["status"]]
            self.ended = time.monotonic()
            return True
        return False

    @property
    def final(self) -> str:
        if self.state == "failed" and self.failed_at is not None:
            return f"failed at {self.failed_at:#08x}"
        return self.state

    def describe(self, stage: StageProgress, final: bool = False) -> str:
        """One stage in one clause; on the run's final line its state says 'done' once."""
        done, total = stage.amounts(self.skipped)
        rate = stage.rate(self.skipped)
        text = f"{stage.name} {self.amounts_text(stage)}"
        if done >= total and total:
            return text if final else text + " done"
        if rate:
            text += f" {_amount(int(rate), stage.in_bytes)}/s"
            if self.state == "running":
                text += f" ETA {_duration((total - done) / rate)}"
        return text


    def amounts_text(self, stage: StageProgress) -> str:
        """'1.00 MiB/2.00 MiB'; for the erase stage, with the bytes it actually erased: units
        that needed no erase pass it too (a 4 KiB fix erases 4 KiB, not the 2 MiB it looked at)."""
        done, total = stage.amounts(self.skipped)
        text = f"{_amount(done, stage.in_bytes)}/{_amount(total, stage.in_bytes)}"
        if stage.name != "erase":
            return text
        return f"{text} ({_amount(self.erased, True) + ' erased' if self.erased else 'none erased'})"


def _amount(n: int, in_bytes: bool) -> str:
    if not in_bytes:
        return str(n)
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}" if unit == "MiB" else f"{n / size:.0f} {unit}"
    return f"{n} B"


def _duration(seconds: float) -> str:
    seconds = int(seconds + 0.5)
    return f"{seconds // 60}:{seconds % 60:02d}"


class ProgressBoard:
    """Progress of every board of one invocation (a context manager around the runs)."""

    def __init__(self, enabled: bool = True, interval: float = 5.0):
        s = settings()
        if not enabled or s.verbosity <= QUIET:
            self.mode = "off"
        elif s.json_lines:
            self.mode = "json"
        elif sys.stderr.isatty():
            self.mode = "live"
        else:
            self.mode = "lines"
        # --log-json feeds a live view (fleet flash redraws 4 times a second): an event every 5 s
        # would leave a stage shorter than that seen only at its end, with no rate or ETA on the way.
        self.interval = min(interval, 1.0) if self.mode == "json" else interval
        self.boards: dict[str, BoardProgress] = {}
        self._lock = threading.Lock()
        self._live: Live | None = None
        self._last: dict[str, float] = {}

    def __enter__(self) -> ProgressBoard:
        if self.mode == "live":
            # structlog first: while it is being imported without rich (logsetup.load_structlog),
            # an import of rich here would fail; importing structlog waits for that to end.
            load_structlog()
            from rich.console import Console
            from rich.live import Live

            self._live = Live(get_renderable=self._render, console=Console(stderr=True),
                              refresh_per_second=4, transient=False, redirect_stdout=False)
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.refresh()
            self._live.stop()

    # -- wiring (called by the runner) ------------------------------------------------------
    def observe(self, recorder: Any, board: str, run_id: str) -> TappedRecorder:
        """Wrap a run's recorder so that its rows drive this board's progress and -v logging."""
        progress = self.boards[board] = BoardProgress(board, run_id)
        taps: list[RowTap] = []
        debug = debug_tap(run_id, board)
        if debug is not None:
            taps.append(debug)
        if self.mode != "off":
            def tap(table: str, row: dict[str, Any]) -> None:
                if progress.observe(table, row):
                    self._emit(progress, final=True)
            taps.append(tap)
        return TappedRecorder(recorder, taps, trace=wants_trace())

    def reporter(self, board: str, run_id: str) -> Callable[[str, int, int], None]:
        """A progress callback for one board: (stage, done, total)."""
        progress = self.boards.get(board) or self.boards.setdefault(board, BoardProgress(board, run_id))
        if self.mode == "off":
            return lambda stage, done, total: None

        def update(stage: str, done: int, total: int) -> None:
            with self._lock:
                changed = progress.update(stage, done, total)
                finished = changed.done >= changed.total
            if self.mode in ("lines", "json"):
                self._emit(progress, stage=changed if finished else None)
        return update

    # -- output -----------------------------------------------------------------------------
    def _emit(self, progress: BoardProgress, stage: StageProgress | None = None, final: bool = False) -> None:
        """Off a terminal: a line per board every few seconds and one at the end. With --log-json:
        an event per stage at the same moments and when a stage completes."""
        if self.mode not in ("lines", "json") or (final and not progress.stages):
            return   # a run that never got going (refused, no board) has its error line and no more
        now = time.monotonic()
        due = now - self._last.setdefault(progress.board, progress.started) >= self.interval
        if not (due or final or (stage is not None and self.mode == "json")):
            return
        self._last[progress.board] = now
        log = logger(run_id=progress.run_id, board=progress.board)
        if self.mode == "lines":
            parts = [progress.describe(s, final) for s in progress.stages.values()]
            log.info(f"{progress.board}: " + "; ".join(parts + ([progress.final] if final else [])))
            return
        for s in (progress.stages.values() if due or final else [stage]):
            assert s is not None
            done, total = s.amounts(progress.skipped)
            rate = s.rate(progress.skipped)
            log.info("progress", stage=s.name, done=done, total=total, unit="bytes" if s.in_bytes else "items",
                     erased=progress.erased if s.name == "erase" else None,
                     rate=round(rate, 1) if rate else None,
                     eta=round((total - done) / rate, 1) if rate and done < total else None)
        if final:
            log.info("progress", state=progress.final, seconds=round((progress.ended or now) - progress.started, 3))

    def _render(self) -> Table:
        from rich.table import Table
        from rich.text import Text

        with self._lock:
            boards = list(self.boards.values())
        names = [s for s in FLASH_STAGES if any(s in b.stages for b in boards)]
        names += [s for b in boards for s in b.stages if s not in names]
        table = Table(box=None, show_edge=False, pad_edge=False, expand=False)
        table.add_column("board", overflow="fold", max_width=24)
        for name in names:
            table.add_column(name, overflow="fold")
        table.add_column("state", overflow="fold")
        for b in boards:
            cells: list[Any] = [Text(printable(b.board))]
            for name in names:
                s = b.stages.get(name)
                cells.append(self._cell(b, s) if s else Text("-", style="dim"))
            style = {"done": "green", "running": "cyan", "interrupted": "yellow"}.get(b.state, "red")
            cells.append(Text(b.final, style=style))
            table.add_row(*cells)
        return table

    @staticmethod
    def _cell(board: BoardProgress, stage: StageProgress) -> Table:
        done, total = stage.amounts(board.skipped)
        rate = stage.rate(board.skipped)
        amounts = board.amounts_text(stage)
        if done >= total and total:
            speed = "done"
        elif rate and board.state == "running":
            speed = f"{_amount(int(rate), stage.in_bytes)}/s ETA {_duration((total - done) / rate)}"
        else:
            speed = ""
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        cell = Table.grid()
        cell.add_row(ProgressBar(total=max(total, 1), completed=done, width=14))
        cell.add_row(Text(amounts))
        cell.add_row(Text(speed))
        return cell
