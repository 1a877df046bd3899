"""Shared fixtures: emulated boards in temporary directories."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from amdflash.stages.transport.sim import Board, create_board


@pytest.fixture
def make_board(tmp_path: Path) -> Callable[..., Path]:
    """make_board(**create_board options) -> path of a fresh emulated board."""
    counter = 0

    def make(name: str | None = None, **options) -> Path:
        nonlocal counter
        counter += 1
        options.setdefault("seed", counter)
        return create_board(tmp_path / (name or f"board{counter}"), **options)

    return make


@pytest.fixture
def board(make_board) -> Board:
    """An open emulated board with the default (synthetic) content, asm24 profile."""
    b = Board(make_board())
    yield b
    b.close()
