"""Where the CLI's words go: results on stdout, human messages and errors on stderr.

Every line is made printable first (`terminal.printable`): what a board, an image, a file
name or the trail says never reaches the terminal as control sequences.

stdout carries results only (text, or JSON objects), so it can be piped; a reader that
stops early (`| head`) ends the output quietly, without a traceback and without changing
the exit status. Messages go through the logger, so --log-json keeps stderr pure JSON and
-q keeps it silent on success.
"""
from __future__ import annotations

import os
import sys
from typing import Any

from amdflash.pipeline.logsetup import logger
from amdflash.stages.terminal import printable

_closed = False


def _stdout_gone() -> None:
    """The reader went away: send the rest (and the interpreter's final flush) nowhere."""
    global _closed
    _closed = True
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def result(text: str = "") -> None:
    """One line of results on stdout."""
    if _closed:
        return
    try:
        sys.stdout.write(printable(text, multiline=True) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        _stdout_gone()


def result_json(obj: Any, indent: int | None = None) -> None:
    import json

    result(json.dumps(obj, indent=indent, default=str))


def note(message: str, **fields: Any) -> None:
    """A human message on stderr (not with -q)."""
    logger().info(message, **fields)


def error(message: str, advice: str | None = None, **fields: Any) -> None:
    """`error: …` on stderr, one line (a JSON event with --log-json), and the next step on a
    line of its own when there is one (the event's `advice` field in JSON)."""
    if advice:
        fields["advice"] = advice
    logger().error(" ".join(message.split()), **fields)


def reset() -> None:
    global _closed
    _closed = False


def stdout_closed() -> bool:
    return _closed


__all__ = ["result", "result_json", "note", "error", "reset", "stdout_closed", "_stdout_gone"]
