"""Counting the SQLite connections a command line opens in this process (issue 43)."""
from __future__ import annotations

import sqlite3
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def counted() -> Iterator[list[str]]:
    """Every sqlite3.connect made inside, listed by where it was made. The schema the trail is
    checked against (an in-memory database, made once a process) is made again, as in a process
    of its own. The writer process's connection is another process's: not counted."""
    from amdflash.store import verify

    opened: list[str] = []
    real = sqlite3.connect

    def counting(*a: Any, **k: Any) -> sqlite3.Connection:
        here = [f for f in traceback.extract_stack()[:-1] if "/tests/" not in f.filename]
        opened.append(" <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in reversed(here[-4:])))
        return real(*a, **k)

    verify._expected_schema.cache_clear()
    sqlite3.connect = counting  # type: ignore[assignment]
    try:
        yield opened
    finally:
        sqlite3.connect = real
