"""Issue 45's done-when, through the real `audit push`: a flash whose second witness was down ends
`not yet witnessed`; once the witness is back, `audit push` (to a central PostgreSQL) asks it
again and the tree head is witnessed by 2 of 2, with nothing else asked of the witness that had
cosigned. (tests/pipeline/cli/test_witnessed_run.py calls the step `audit push` runs itself.)"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.pipeline.cli.test_witnessed_run import configure, end_line, log_vkey, ORIGIN
from tests.pipeline.fleet import test_central
from tests.pipeline.fleet.test_central import enroll
from tests.support import cli as command_line
from tests.support.witness_server import WitnessServer

pytest.importorskip("psycopg", reason="psycopg is not installed (pip install '.[test]' brings it)")

central = test_central.central      # a fresh central database, set up


def test_audit_push_completes_a_flash_a_witness_was_down_for(cli, db, central, image: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from amdflash.stages.sim import create_board
    from amdflash.stages.sim.synth import PART_KEY
    from amdflash.store import witness as ws

    servers = [WitnessServer(name=f"w{i}.test/push", logs={ORIGIN: [log_vkey()]}) for i in range(2)]
    up = servers[0].start()
    try:
        configure(tmp_path, monkeypatch, servers[:1] + [servers[1]], urls=[up.url, "http://127.0.0.1:9"])
        board = create_board(tmp_path / "board", transport="ideal", seed=7)
        small = tmp_path / "three sectors.bin"
        small.write_bytes(image.read_bytes()[:3 * 4096])
        r = command_line.run("--no-progress", "flash", small, "--board", f"sim:{board}", "--yes", "--force",
                             "--start-sector", "0", "--sector-count", "3", "--expect-part", PART_KEY)
        assert "not yet witnessed (1 of 2 cosigned, 2 needed: w1.test/push: unreachable" in end_line(r), r.err
        enroll(cli, central, tmp_path)
        back = servers[1].start()
        try:
            configure(tmp_path, monkeypatch, servers)
            r = command_line.run("audit", "push", "--to", central)
        finally:
            back.stop()
    finally:
        up.stop()
    assert r.code == 0, r.err
    said = [line for line in r.err_lines if line.startswith("witnesses: ")]
    assert len(said) == 1 and said[0].endswith(": witnessed by 2 of 2"), r.err
    assert [status for status, _ in up.requests] == [200] and [status for status, _ in back.requests] == [200]
    head = ws.newest(str(db))
    assert head is not None and len(head.signatures) == 3
