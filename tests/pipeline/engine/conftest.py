"""End-to-end CLI tests: amdflash commands on emulated boards, each with its own database."""
from __future__ import annotations

from pathlib import Path

import pytest

from amdflash.stages.sim.synth import synthetic_ifwi
from tests.support import cli as command_line
from tests.support.cli import Result

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def db(tmp_path: Path, monkeypatch) -> Path:
    path = tmp_path / "audit.sqlite"
    monkeypatch.setenv("AMDFLASH_DB", str(path))
    monkeypatch.setenv("AMDFLASH_LOCK_DIR", str(tmp_path / "locks"))
    return path


@pytest.fixture
def cli(db):
    """Run amdflash in this process (fast); returns exit code and captured output."""
    def run(*args: object, **kw) -> Result:
        return command_line.run("-q", *args, **kw)
    return run


@pytest.fixture
def cli_shown(db):
    """Like `cli`, but without -q: what a user sees on success (no progress display)."""
    def run(*args: object, **kw) -> Result:
        return command_line.run("--no-progress", *args, **kw)
    return run


@pytest.fixture
def cli_process(db, tmp_path):
    """Run amdflash as a separate process, as a user would."""
    def run(*args: object, timeout: float = 300, env: dict | None = None) -> Result:
        return command_line.run_process(*args, timeout=timeout, env={"PYTHONPATH": str(ROOT), **(env or {})},
                                        cwd=tmp_path, module="amdflash.pipeline.cli")
    return run


@pytest.fixture
def image(tmp_path: Path) -> Path:
    path = tmp_path / "image.bin"
    path.write_bytes(synthetic_ifwi(1234))
    return path


def flash_content(board: Path) -> bytes:
    return (board / "flash.bin").read_bytes()
