"""structlog configuration: a console renderer on a terminal, JSON lines with --log-json."""
from __future__ import annotations

import logging
import sys

import structlog


def configure(json_lines: bool = False, verbose: bool = False, quiet: bool = False) -> None:
    # On a terminal the progress bars say what is happening; run events would only break
    # them up. Elsewhere (CI, cron, pipes) the info events are the progress record.
    quiet_default = sys.stderr.isatty() and not json_lines
    level = logging.DEBUG if verbose else logging.WARNING if quiet or quiet_default else logging.INFO
    renderer = (structlog.processors.JSONRenderer() if json_lines
                else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()))
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )


def logger(**bound: object) -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger("amdflash").bind(**bound)
