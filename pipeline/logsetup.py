"""Logging: human lines on stderr, or pure JSON lines with --log-json.

One structlog configuration for the whole process. Levels by verbosity: -q shows warnings
and errors only; the default adds human messages (which board `auto` picked, files
written) and, off a terminal, progress lines; -v adds debug events of every layer that
the audit trail sees (runs, stages, unit states, verify results, register snapshots);
-vv adds every ROM_SW transaction and every register write. Library code (`amdflash.pipeline.api`)
that nobody configured logs through the standard `logging` module instead.

structlog (with rich and asyncio beneath it, hundreds of modules) is imported when the first
message is logged or a command starts (`apply`), not by `configure`: `--help`, `--version`
and a usage error's parse never import it.
"""
from __future__ import annotations

import sys
from collections.abc import MutableMapping
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple

from amdflash.stages.terminal import printable

if TYPE_CHECKING:
    import logging

    import structlog

QUIET, NORMAL, VERBOSE, TRACE = -1, 0, 1, 2


class Settings(NamedTuple):     # not a dataclass: `dataclasses` imports inspect, ast… (--version loads this)
    json_lines: bool = False
    verbosity: int = NORMAL
    configured: bool = False
    applied: bool = False      # structlog configured accordingly (see `apply`)

    @property
    def level(self) -> int:
        import logging

        return {QUIET: logging.WARNING, NORMAL: logging.INFO}.get(self.verbosity, logging.DEBUG)


_settings = Settings()

# Fields every event of a run carries: shown in JSON and at -v, not on a human message.
_CONTEXT = ("run_id", "board", "timestamp", "level", "logger", "layer")


class _Stderr:
    """Writes to whatever sys.stderr is at the moment: rich's live display swaps it to print
    messages above the progress bars."""

    def msg(self, message: str) -> None:
        try:
            print(message, file=sys.stderr, flush=True)
        except (BrokenPipeError, ValueError):   # stderr closed under us: nothing left to tell
            pass

    debug = info = warning = warn = error = critical = exception = fatal = log = msg


def _human(logger: Any, method: str, event: MutableMapping[str, Any]) -> str:
    level = event.get("level", method)
    message = str(event.get("event", ""))
    advice = event.get("advice")
    shown = {k: v for k, v in event.items() if k not in ("event", "advice") and (k not in _CONTEXT or level == "debug")
             and v is not None}
    fields = " ".join(f"{k}={v}" for k, v in shown.items())
    # Messages quote file names, serials, part numbers and trail rows: never raw to a terminal.
    text = printable(f"{message} {fields}".strip() if fields else message, multiline=True)
    if advice:
        text += "\n  next: " + printable(str(advice))    # what to do about it, on a line of its own
    if level in ("warning", "error", "critical", "debug"):
        return f"{'warning' if level == 'warning' else level}: {text}"
    return text


def _json(logger: Any, method: str, event: MutableMapping[str, Any]) -> str:
    import json

    return json.dumps(event, default=str, sort_keys=False)


def configure(json_lines: bool = False, verbosity: int = NORMAL) -> Settings:
    """Configure structlog (and the standard logging module beneath it) for the CLI: at the
    first message, or `apply()`."""
    global _settings
    _settings = Settings(json_lines, verbosity, True)
    return _settings


def apply(lazily: bool = False) -> None:
    """Set logging up as `configure` said, now: the standard logging module's handler (other
    libraries' logging and Python warnings) and structlog. `lazily`: structlog at the first
    message instead, unless a module already imported it (and may log through it directly,
    as a library may): a command that logs nothing never imports it, nor rich."""
    global _settings
    if not _settings.configured or _settings.applied:
        return
    import logging

    # Other libraries' logging (and Python warnings) reach stderr in the same form.
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_amdflash", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler()
    handler.emit = _emit  # type: ignore[method-assign]
    handler._amdflash = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if _settings.verbosity >= TRACE else logging.WARNING)
    logging.captureWarnings(True)
    if lazily and "structlog" not in sys.modules:
        return

    structlog = load_structlog()
    _settings = _settings._replace(applied=True)
    renderer = _json if _settings.json_lines else _human
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_settings.level),
        logger_factory=lambda *args: _Stderr(),
        cache_logger_on_first_use=False,
    )


def _emit(record: logging.LogRecord) -> None:
    structlog = load_structlog()
    apply()
    fields = getattr(record, "fields", None)    # a stage's key-value fields (logging's extra=)
    structlog.get_logger(record.name).log(record.levelno, record.getMessage(), logger=record.name,
                                          **(fields if isinstance(fields, dict) else {}))


def settings() -> Settings:
    return _settings


def load_structlog() -> ModuleType:
    """structlog, imported without rich when rich is not loaded yet. structlog takes rich, where
    installed, for its own console renderer and tracebacks, which amdflash never uses (every
    line is rendered by _human or _json): 85 modules of every command that logs. rich is
    imported as usual afterwards by what draws with it (the live progress table, which loads
    structlog first: see engine/progress.py)."""
    hidden = "structlog" not in sys.modules and "rich" not in sys.modules
    # (Where another thread is importing structlog, the import below waits for it to finish.)
    if hidden:
        sys.modules["rich"] = None      # type: ignore[assignment]  # `import rich` fails: structlog goes without
    try:
        import structlog
    finally:
        if hidden and sys.modules.get("rich", 0) is None:
            del sys.modules["rich"]
    return structlog


def logger(**bound: object) -> structlog.typing.FilteringBoundLogger:
    structlog = load_structlog()
    apply()
    return structlog.get_logger("amdflash").bind(**bound)
