"""Progress of long work: one rich bar per board on a terminal, periodic log lines otherwise."""
from __future__ import annotations

import sys
import threading
import time
from typing import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from amdflash.pipeline.logsetup import logger


class ProgressBoard:
    """Shared by all boards of one invocation."""

    def __init__(self, enabled: bool = True, interval: float = 5.0):
        self.tty = enabled and sys.stderr.isatty()
        self.enabled = enabled
        self.interval = interval
        self._lock = threading.Lock()
        self._progress: Progress | None = None
        if self.tty:
            self._progress = Progress(
                TextColumn("[bold]{task.fields[board]}[/]"), TextColumn("{task.fields[stage]:>8}"),
                BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                console=Console(stderr=True), transient=False)

    def __enter__(self) -> "ProgressBoard":
        if self._progress:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress:
            self._progress.stop()

    def reporter(self, board: str, run_id: str) -> Callable[[str, int, int], None]:
        """A progress callback for one board: (stage, done, total)."""
        if not self.enabled:
            return lambda stage, done, total: None
        if self._progress is not None:
            task = self._progress.add_task("", total=1, board=board, stage="open")
            progress = self._progress

            def update(stage: str, done: int, total: int) -> None:
                progress.update(task, stage=stage, completed=done, total=max(total, 1))
            return update
        log = logger(run_id=run_id, board=board)
        stages: dict[str, tuple[int, int]] = {}
        last = {"t": time.monotonic()}
        lock = self._lock

        def line(stage: str, done: int, total: int) -> None:
            # Stages run interleaved; one line per interval says where each of them is, and a
            # stage that completes says so once.
            now = time.monotonic()
            with lock:
                finished = done == total and stages.get(stage, (0, 0))[0] != total
                stages[stage] = (done, total)
                if finished or now - last["t"] >= self.interval:
                    last["t"] = now
                    log.info("progress", **{name: f"{d}/{t}" for name, (d, t) in stages.items()})
        return line
