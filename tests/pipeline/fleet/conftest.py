"""Fixtures for the fleet tests: a line on one machine (see lab.py) and a throwaway PostgreSQL."""
from __future__ import annotations

import contextlib
import io
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from amdflash.pipeline.cli.main import main
from amdflash.stages.sim.synth import synthetic_ifwi

from tests.pipeline.fleet import lab as lab_module
from tests.pipeline.fleet.pgcluster import PostgresCluster, server_binaries
from tests.pipeline.engine.conftest import cli, db, image  # noqa: F401 - fixtures: the in-process CLI and its database


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
    """Pid of the amdflash process running a job on this board: under `fleet job`, its forked
    child (the job); otherwise the command line itself — never the audit writer it forks."""
    procs: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = [a.decode(errors="replace") for a in (entry / "cmdline").read_bytes().split(b"\0") if a]
        except OSError:
            continue
        if f"sim:{board}" in argv and any("amdflash" in a for a in argv):
            procs[int(entry.name)] = argv
    roots = [pid for pid in procs if _parent(pid) not in procs]
    jobs = []
    for root in roots:
        if "fleet" in procs[root]:
            jobs += [pid for pid in procs if _parent(pid) == root]
        else:
            jobs.append(root)
    return jobs


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
