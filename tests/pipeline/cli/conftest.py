"""CLI tests: the command line as a user meets it, on emulated boards, each test with its own
audit database, config directory and lock directory."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

from amdflash.stages.transport import discovery
from tests.support import cli
from tests.support.cli import Result
from tests.pipeline.engine.conftest import flash_content, image  # noqa: F401 - shared: the image fixture, flash content



@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Everything the CLI reads from the environment points into tmp_path."""
    monkeypatch.setenv("AMDFLASH_DB", str(tmp_path / "audit.sqlite"))
    monkeypatch.setenv("AMDFLASH_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.delenv("AMDFLASH_CONFIG", raising=False)
    monkeypatch.delenv(discovery.ENV_SIM_USB, raising=False)
    empty = tmp_path / "no-pci-devices"
    empty.mkdir()
    monkeypatch.setenv(discovery.ENV_SYSFS_PCI, str(empty))
    return tmp_path


@pytest.fixture
def amdflash() -> Callable[..., Result]:
    """amdflash in this process; returns exit status and what it printed."""
    def run(*args: object, **kw: Any) -> Result:
        return cli.run(*args, **kw)
    return run


@pytest.fixture
def amdflash_process(tmp_path: Path) -> Callable[..., Result]:
    """amdflash as its own process, as a shell runs it."""
    def run(*args: object, timeout: float = 120, env: dict[str, str] | None = None, **kw: Any) -> Result:
        return cli.run_process(*args, timeout=timeout, env=env, cwd=tmp_path, **kw)
    return run
