"""Ctrl-C (and SIGTERM) after a command line's runs have ended.

Once every run of a command is on record, what is left is closing the trail and reporting
the outcome; a Ctrl-C then must not turn a recorded success into an "interrupted" exit. The
command line (cli.main) marks where that applies, so that a program using the API keeps its
Ctrl-C. SIGTERM is held back the same way: the runs' signal watcher (anyio, over asyncio)
leaves it at its default when it stops, which ended the process by the signal, silently,
while it reported runs already on record."""
from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_command_line = False


def late_interrupt(signum: int, frame: object) -> None:
    """The key pressed once the runs are on record: nothing to stop any more."""


@contextmanager
def command_line(ends_process: bool) -> Iterator[None]:
    """One command line of amdflash; `ends_process`: the process ends after it (the console
    script), else Ctrl-C is put back for the caller's next line (the demo, tests)."""
    global _command_line
    _command_line = True
    sigterm = signal.getsignal(signal.SIGTERM)     # the console script's, or the caller's
    try:
        yield
    finally:
        _command_line = False
        if not ends_process and signal.getsignal(signal.SIGINT) is late_interrupt:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        if not ends_process and signal.getsignal(signal.SIGTERM) is late_interrupt and sigterm is not None:
            signal.signal(signal.SIGTERM, sigterm)


def runs_recorded() -> None:
    """Called once the command's runs have ended and are on record."""
    if not (_command_line and threading.current_thread() is threading.main_thread()):
        return
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, late_interrupt)
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:    # as the runs' watcher left it
        signal.signal(signal.SIGTERM, late_interrupt)
