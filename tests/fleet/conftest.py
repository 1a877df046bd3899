"""Fixtures for the fleet tests: a line on one machine (see lab.py) and a throwaway PostgreSQL."""
from __future__ import annotations

import contextlib
import io
import json
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from amdflash.pipeline.cli import main
from amdflash.stages.transport.sim.synth import synthetic_ifwi
from tests.fleet import lab as lab_module
from tests.fleet.pgcluster import PostgresCluster, server_binaries


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[lab_module.Lab]:
    """sshd on loopback and a labgrid coordinator; tests add hosts (exporters) and boards."""
    why = lab_module.missing()
    if why:
        pytest.skip(why)
    line = lab_module.Lab(tmp_path / "line")
    try:
        line.start_sshd()
        line.start_coordinator()
        yield line
    finally:
        line.close()


@pytest.fixture
def fleet_image(tmp_path: Path) -> Path:
    path = tmp_path / "image.bin"
    path.write_bytes(synthetic_ifwi(4242))
    return path


def _sim(*args: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["sim", *args]) == 0
    return out.getvalue()


def flash_of(board: Path) -> bytes:
    """The board's flash array as stored, bypassing every driver (`amdflash sim image`)."""
    with tempfile.TemporaryDirectory() as d:
        _sim("image", str(board), "-o", f"{d}/flash.bin")
        return Path(f"{d}/flash.bin").read_bytes()


def board_stats(board: Path) -> dict:
    """The emulated board's counters (`amdflash sim stats`): register writes, modelled seconds."""
    return json.loads(_sim("stats", str(board)))


def job_processes(board: Path) -> list[int]:
    """Pid of the amdflash command-line process (not `fleet job`) running a job on this board."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        text = [a.decode(errors="replace") for a in argv if a]
        if "amdflash.pipeline.cli" in text and "fleet" not in text and f"sim:{board}" in text:
            pids.append(int(entry.name))
    # The audit writer is a fork of the job process (same command line): keep the job itself.
    return [pid for pid in pids if _parent(pid) not in pids]


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


@pytest.fixture(scope="session")
def postgres_binaries() -> Path:
    found = server_binaries()
    if found is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl, postgres) not found: install them "
                    "(Debian: apt-get install postgresql; .ci/run does)")
    return found


@pytest.fixture(scope="session")
def postgres(postgres_binaries: Path) -> Iterator[PostgresCluster]:
    """A throwaway PostgreSQL cluster in a temporary directory, reachable only by its unix socket
    (one per test session: tests that need a clean slate create their own database in it)."""
    cluster = PostgresCluster(postgres_binaries).start()
    try:
        yield cluster
    finally:
        cluster.stop()
