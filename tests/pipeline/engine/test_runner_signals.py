"""Ctrl-C in the first instant of a command's runs, before the runner watches for it."""
from __future__ import annotations

import os
import signal
from typing import NoReturn

import anyio
import pytest

from amdflash.pipeline.engine.runner import run_boards
from amdflash.stages.open_transport import BoardSpec, parse_spec


def test_a_ctrl_c_before_the_signal_watcher_starts_begins_no_run() -> None:
    """Until the runner's watcher holds SIGINT, the event loop's own handler (asyncio.Runner)
    takes it and cancels the runner's task; a board task already scheduled then still began
    its run (and recorded it) before the cancellation reached it, and the command line said
    only "interrupted" of a run left on record. No board may begin before the watcher is in."""
    begun: list[str] = []

    def make(spec: BoardSpec) -> NoReturn:       # run_boards' make_body: a board's run begins here
        begun.append(str(spec))
        raise AssertionError("a board's run began after Ctrl-C was pressed")

    async def command() -> None:
        os.kill(os.getpid(), signal.SIGINT)        # pressed as the runs begin
        await run_boards(make, [parse_spec("sim:/nonexistent")], writer=None, show_progress=False)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)   # as the command line has it
    try:
        with pytest.raises(KeyboardInterrupt):
            anyio.run(command)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert begun == []
