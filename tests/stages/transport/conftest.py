"""Transport tests: the USB driver over the emulated bridge, sysfs PCI on a fake tree, the CLI."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from amdflash.stages.transport import discovery
from amdflash.stages.open_transport import EMULATORS
from amdflash.stages.sim import Board
from amdflash.stages.transport.usb import BridgeInfo, UsbBar5, find_bridges
from tests.support import cli

CLI_TIMEOUT = 60


@pytest.fixture(autouse=True)
def isolated_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Locks in tmp_path, no emulated bridges unless a test names them, no real sysfs."""
    monkeypatch.setenv("AMDFLASH_LOCK_DIR", str(tmp_path / "locks"))
    empty = tmp_path / "no-pci-devices"
    empty.mkdir()
    monkeypatch.setenv(discovery.ENV_SYSFS_PCI, str(empty))
    monkeypatch.delenv(discovery.ENV_SIM_USB, raising=False)


def serial_of(path: Path) -> str:
    return json.loads((path / "board.json").read_text())["serial"]


def unique_id_of(path: Path) -> str:
    return json.loads((path / "board.json").read_text())["unique_id"]


class Rig:
    """Emulated bridges (one per board directory) on the backend the product selects."""

    def __init__(self, paths: list[Path]):
        self.paths = paths
        self.backend = discovery.emulated_usb_backend([str(p) for p in paths], EMULATORS)
        self.bars: list[UsbBar5] = []

    def bridges(self) -> list[BridgeInfo]:
        return find_bridges(self.backend)

    def open(self, index: int = 0) -> UsbBar5:
        bar = UsbBar5(self.bridges()[index], self.backend)
        self.bars.append(bar)
        return bar

    def board(self, index: int = 0) -> Board:
        return self.backend.bridges[index].board

    def emulated_bridge(self, index: int = 0) -> Any:
        return self.backend.bridges[index]

    def close(self) -> None:
        for bar in self.bars:
            bar.close()
        self.backend.close()


@pytest.fixture
def rig(make_board) -> Iterator[Callable[..., Rig]]:
    """rig(n=1, **create_board options) or rig(paths=[...]) -> Rig."""
    rigs: list[Rig] = []

    def make(n: int = 1, paths: list[Path] | None = None, **options: Any) -> Rig:
        r = Rig(paths or [make_board(**options) for _ in range(n)])
        rigs.append(r)
        return r

    yield make
    for r in rigs:
        r.close()


def run_cli(tmp_path: Path, *args: str, env: dict[str, str] | None = None,
            timeout: float = CLI_TIMEOUT) -> cli.Result:
    """amdflash in this process, its database and working directory in tmp_path."""
    return cli.run(*args, env={"AMDFLASH_DB": str(tmp_path / "audit.sqlite"), **(env or {})}, cwd=tmp_path,
                   timeout=timeout)


HOLDER = """
import sys
from amdflash.stages.transport.lock import BoardLock
lock = BoardLock(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None).acquire()
print("locked", flush=True)
sys.stdin.read()
"""


class LockHolder:
    """Another process holding a board's lock until `release()`."""

    def __init__(self, key: str, resource: str | None = None):
        self.proc = subprocess.Popen([sys.executable, "-c", HOLDER, key, *([resource] if resource else [])], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=dict(os.environ))
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "locked"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def release(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(timeout=10)


@pytest.fixture
def hold_lock() -> Iterator[Callable[[str], LockHolder]]:
    holders: list[LockHolder] = []

    def make(key: str, resource: str | None = None) -> LockHolder:
        h = LockHolder(key, resource)
        holders.append(h)
        return h

    yield make
    for h in holders:
        h.release()
