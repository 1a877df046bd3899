"""Running the command line from a test: in this process (fast) or as a process of its own
(where the process is the point: signals, kills, exit status of the console script, start-up,
two processes at once, a process's umask).

A process costs ~0.7 s of imports before it does anything; in this process a command line
costs what the command does. `run` leaves the process as it found it: environment, working
directory, umask, sys.argv, signal handlers and the logging configuration are put back after
each call, so tests that follow see none of it."""
from __future__ import annotations

import io
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


# The signals amdflash (or a library it starts) may take over for a command line.
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE, signal.SIGQUIT, signal.SIGUSR1)


@dataclass
class Result:
    """Exit status and what a command line printed; also stands in for a CompletedProcess."""
    code: int
    out: str
    err: str
    args: list[str] = field(default_factory=list)

    @property
    def returncode(self) -> int:
        return self.code

    @property
    def stdout(self) -> str:
        return self.out

    @property
    def stderr(self) -> str:
        return self.err

    @property
    def err_lines(self) -> list[str]:
        return self.err.splitlines()

    def check_returncode(self) -> None:
        if self.code:
            raise subprocess.CalledProcessError(self.code, self.args, self.out, self.err)


def _text_stream() -> io.TextIOWrapper:
    # A text stream with a binary buffer beneath (as sys.stdout has) and no file descriptor.
    return io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="backslashreplace", write_through=True)


def _read(stream: io.TextIOWrapper) -> str:
    stream.flush()
    buffer = stream.buffer
    assert isinstance(buffer, io.BytesIO)
    return buffer.getvalue().decode("utf-8", "backslashreplace")


@contextmanager
def _environment(env: Mapping[str, str | None] | None) -> Iterator[None]:
    saved = dict(os.environ)
    try:
        for key, value in (env or {}).items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


class HostWouldDie(BaseException):
    """An emulated board's kill-after-writes fault fired in a command run in this process, which
    would have killed the test run with it: such a command must run with `run_process`."""


@contextmanager
def _no_host_deaths() -> Iterator[list[bool]]:
    from amdflash.stages.sim.board import Board

    fired: list[bool] = []
    dies = Board._host_dies

    def refuse(self: Board) -> None:
        fired.append(True)
        raise HostWouldDie("kill-after-writes fired in this process: run the command with run_process")

    Board._host_dies = refuse  # type: ignore[method-assign]
    try:
        yield fired
    finally:
        Board._host_dies = dies  # type: ignore[method-assign]


@contextmanager
def _process_state() -> Iterator[None]:
    """What a command line may change of the process, put back after it."""
    from amdflash.pipeline import logsetup

    handlers = {s: signal.getsignal(s) for s in _SIGNALS}
    # structlog only if already imported: a command that logs nothing never imports it.
    structlog = sys.modules.get("structlog")
    structlog_config = structlog.get_config() if structlog else None

    settings = logsetup.settings()
    root = logging.getLogger()
    root_handlers, root_level = list(root.handlers), root.level
    showwarning = logging._warnings_showwarning  # type: ignore[attr-defined]
    argv, cwd, umask = list(sys.argv), os.getcwd(), os.umask(0o022)
    os.umask(umask)
    try:
        yield
    finally:
        for s, handler in handlers.items():
            if handler is not None:
                signal.signal(s, handler)
        if structlog_config is not None:
            structlog.configure(**structlog_config)  # type: ignore[union-attr]
        elif "structlog" in sys.modules:
            sys.modules["structlog"].reset_defaults()
        logsetup._settings = settings
        root.handlers[:] = root_handlers
        root.setLevel(root_level)
        if showwarning is None:
            logging.captureWarnings(False)
        sys.argv[:] = argv
        os.chdir(cwd)
        os.umask(umask)


def run(*args: object, env: Mapping[str, str | None] | None = None, cwd: str | os.PathLike[str] | None = None,
        stdin: str | None = None, timeout: float | None = None) -> Result:
    """`amdflash ARGS` in this process: main(argv) with stdout and stderr captured (neither is a
    terminal), `env` set (None unsets) and `cwd` entered for the call only; `stdin` is what it
    reads (else it reads this process's stdin). A call that took longer than `timeout` seconds
    raises TimeoutExpired once it has returned, as the process would have been stopped."""
    from amdflash.pipeline.cli.main import main

    argv = [str(a) for a in args]
    out, err = _text_stream(), _text_stream()
    saved_streams = sys.stdin, sys.stdout, sys.stderr
    with _process_state(), _environment(env), _no_host_deaths() as host_died:
        if cwd is not None:
            os.chdir(cwd)
        sys.argv[:] = ["amdflash", *argv]
        if stdin is not None:
            sys.stdin = io.StringIO(stdin)
        sys.stdout, sys.stderr = out, err
        started = time.monotonic()
        try:
            code = main(argv)
        finally:
            sys.stdin, sys.stdout, sys.stderr = saved_streams
    if host_died:
        raise HostWouldDie(f"amdflash {' '.join(argv)}: the emulated host was killed (kill-after-writes); "
                           f"this command must run as a process. Its stderr:\n{_read(err)}")
    took = time.monotonic() - started
    if timeout is not None and took > timeout:
        raise subprocess.TimeoutExpired(["amdflash", *argv], timeout, _read(out), _read(err))
    return Result(code, _read(out), _read(err), ["amdflash", *argv])


def command(*args: object, module: str = "amdflash") -> list[str]:
    """The argv that starts `amdflash ARGS` as a process of its own."""
    return [sys.executable, "-m", module, *map(str, args)]


def run_process(*args: object, env: Mapping[str, str | None] | None = None,
                cwd: str | os.PathLike[str] | None = None, timeout: float = 300, module: str = "amdflash",
                **popen: Any) -> Result:
    """`amdflash ARGS` as a process of its own, with this process's environment and `env` over
    it (None unsets); the exit status is negative when a signal ended it."""
    full = {**os.environ}
    for key, value in (env or {}).items():
        if value is None:
            full.pop(key, None)
        else:
            full[key] = value
    argv = command(*args, module=module)
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=full, cwd=cwd, **popen)
    return Result(p.returncode, p.stdout, p.stderr, argv)


def audit_rows(db: Path | str, sql: str, *params: Any) -> list[Any]:
    """The rows a query finds in an audit database."""
    import sqlite3

    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()
