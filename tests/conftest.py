"""Shared fixtures: emulated boards in temporary directories."""
from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Callable

import pytest

from amdflash.stages.sim import Board, create_board

# HOME and the XDG directories in a temporary home for every test, in every process, and a run
# that touches amdflash's directories in the real home fails (tests/support/home_guard.py).
pytest_plugins = ["tests.support.home_guard"]

# The suite starts amdflash as a process hundreds of times; without cached bytecode each one
# compiles the whole program again (a third of its start-up). An environment that turns the
# cache off (PYTHONDONTWRITEBYTECODE) would make every one of them pay it.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# The tests press Ctrl-C as at a terminal. A pytest started in the background (`pytest &`, a
# script's job) ignores SIGINT, as POSIX has it, and so would every amdflash it starts, which
# rightly keeps ignoring it then (pipeline/launch.py): Ctrl-C as a shell at a terminal gives it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--board-report", action="append", default=[], type=Path, metavar="FILE",
                     help="a hardware report (amdflash hardware-report) of a board to run tests/stages/boards/ against "
                          "besides those stored there: its emulated board must reproduce the report and "
                          "dump, flash, verify and replay on it (repeatable)")


# The slow set's longest tests (one to three minutes each on 2 cores), started first: pytest-xdist
# hands tests out in collection order, and one of them started last would run alone at the
# end while the other workers sit idle.
LONGEST = ("test_faults_kills.py", "test_faults_matrix.py", "test_confirmed_reads.py", "test_durability.py",
           "test_line.py", "test_confirm_by_expectation.py", "test_killed_host_job.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: not (item.path.name in LONGEST and item.get_closest_marker("slow")))


@pytest.fixture(scope="session", autouse=True)
def host_key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The audit trail's signing key for the whole session: never the user's own."""
    path = tmp_path_factory.mktemp("host-key") / "host_key.pem"
    previous = os.environ.get("AMDFLASH_HOST_KEY")
    os.environ["AMDFLASH_HOST_KEY"] = str(path)
    yield path
    if previous is None:
        os.environ.pop("AMDFLASH_HOST_KEY", None)
    else:
        os.environ["AMDFLASH_HOST_KEY"] = previous


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
