"""The in-process runner leaves the test process as it found it, and a command that would kill
its host fails instead of killing the test run."""
from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

import pytest
import structlog

from tests.support import cli


@pytest.fixture(autouse=True)
def own_database(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AMDFLASH_DB", str(tmp_path / "audit.sqlite"))
    monkeypatch.setenv("AMDFLASH_LOCK_DIR", str(tmp_path / "locks"))


def test_a_command_line_changes_nothing_of_the_process_it_ran_in(make_board, tmp_path):
    board = make_board(transport="ideal")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    environment, cwd, umask = dict(os.environ), os.getcwd(), os.umask(0o022)
    os.umask(umask)
    handler, config = signal.getsignal(signal.SIGINT), structlog.get_config()
    handlers = list(logging.getLogger().handlers)

    r = cli.run("-v", "--log-json", "info", "--board", f"sim:{board}", cwd=elsewhere,
                env={"AMDFLASH_DB": str(elsewhere / "other.sqlite"), "XDG_CONFIG_HOME": str(elsewhere)})
    assert r.code == 0 and r.returncode == 0, r.err
    assert "JEDEC" in r.stdout and r.err.startswith("{")          # its output, captured
    assert (elsewhere / "other.sqlite").exists()                  # its environment, while it ran
    assert dict(os.environ) == environment and os.getcwd() == cwd
    assert os.umask(umask) == umask
    assert signal.getsignal(signal.SIGINT) is handler
    assert structlog.get_config() == config and logging.getLogger().handlers == handlers


def test_a_command_whose_host_the_emulator_kills_fails_in_process(make_board):
    board = make_board(transport="ideal", faults=["kill-after-writes=10"])
    with pytest.raises(cli.HostWouldDie, match="must run as a process"):
        cli.run("info", "--board", f"sim:{board}")
    killed = cli.run_process("info", "--board", f"sim:{board}")
    assert killed.returncode == -signal.SIGKILL                  # as a process it is killed, as it should be
