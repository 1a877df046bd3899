"""End-to-end CLI tests: amdflash commands on emulated boards, each with its own database."""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from amdflash.pipeline.cli.main import main
from amdflash.stages.sim.synth import synthetic_ifwi

ROOT = Path(__file__).resolve().parents[3]


@dataclass
class Result:
    code: int
    out: str
    err: str


@pytest.fixture
def db(tmp_path: Path, monkeypatch) -> Path:
    path = tmp_path / "audit.sqlite"
    monkeypatch.setenv("AMDFLASH_DB", str(path))
    monkeypatch.setenv("AMDFLASH_LOCK_DIR", str(tmp_path / "locks"))
    return path


@pytest.fixture
def cli(db, capsys):
    """Run amdflash in this process (fast); returns exit code and captured output."""
    def run(*args: str) -> Result:
        code = main(["-q", *map(str, args)])
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)
    return run


@pytest.fixture
def cli_shown(db, capsys):
    """Like `cli`, but without -q: what a user sees on success (no progress display)."""
    def run(*args: str) -> Result:
        code = main(["--no-progress", *map(str, args)])
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)
    return run


@pytest.fixture
def cli_process(db, tmp_path):
    """Run amdflash as a separate process, as a user would."""
    def run(*args: str, timeout: float = 300, env: dict | None = None) -> Result:
        full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
        p = subprocess.run([sys.executable, "-m", "amdflash.pipeline.cli", *map(str, args)], capture_output=True,
                           text=True, timeout=timeout, env=full_env, cwd=tmp_path)
        return Result(p.returncode, p.stdout, p.stderr)
    return run


@pytest.fixture
def image(tmp_path: Path) -> Path:
    path = tmp_path / "image.bin"
    path.write_bytes(synthetic_ifwi(1234))
    return path


def flash_content(board: Path) -> bytes:
    return (board / "flash.bin").read_bytes()
