"""Through the command line: the fast-path verdicts and the board's protocol diagnostics are
in the audit trail of the run; `dump` with several boards names a file per board."""
from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import pytest

from tests.support import cli as command_line
from amdflash.stages.sim.synth import synthetic_ifwi
from tests.stages.transport.conftest import serial_of
from tests.stages.transport.test_cli import sim_usb_env

SIZE = 0x200000


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    monkeypatch.setenv("AMDFLASH_DB", str(tmp_path / "audit.sqlite"))

    def run(*args: object) -> tuple[int, str, str]:
        r = command_line.run("-q", *args)
        return r.code, r.out, r.err
    return run


def rows(tmp_path: Path, sql: str) -> list[tuple]:
    return command_line.audit_rows(tmp_path / "audit.sqlite", sql)


def test_a_run_records_each_fast_path_verdict_and_the_boards_diagnostics(cli, make_board, tmp_path):
    board = make_board()
    code, _, err = cli("info", "--board", f"sim:{board}")
    assert code == 0, err
    verdicts = [d for (d,) in rows(tmp_path, "SELECT detail FROM stages WHERE stage = 'rom_sw' AND event = 'fast path'")]
    assert any(d.startswith("chained RX: ok") for d in verdicts)
    assert any(d.startswith("status and window in one read: ok") for d in verdicts)
    assert not any("early observe" in d for d in verdicts)
    (diag,) = rows(tmp_path, "SELECT detail FROM stages WHERE stage = 'transport' AND event = 'diagnostics'")
    assert diag == ("protocol violations 0, unobserved completions 0, ignored while busy 0",)


def test_reads_sent_too_early_are_recorded_with_the_run(cli, make_board, tmp_path, monkeypatch):
    """A lenient board counts what the driver did wrong; the run records the count and the
    driver's giving up the fast path that caused it. A strict board fails the run instead."""
    from amdflash.stages.drivers.navi31.romsw import RomSw

    real = RomSw.spi_estimate     # a bound of the SPI time four times too short
    monkeypatch.setattr(RomSw, "spi_estimate", lambda self, wire, margin=True: real(self, wire, margin) / 4)
    lenient = make_board(strict=False)
    code, _, err = cli("read", "0", "0x1000", "--board", f"sim:{lenient}")
    assert code == 0, err
    assert "status and window in one read off for this board" in err
    diag = rows(tmp_path, "SELECT detail FROM stages WHERE stage = 'transport' AND event = 'diagnostics'")[-1][0]
    assert diag.startswith("protocol violations ") and not diag.startswith("protocol violations 0")
    strict = make_board()
    code, _, err = cli("read", "0", "0x1000", "--board", f"sim:{strict}")
    assert code == 1 and "protocol violation: the data window was read" in err
    (error,) = rows(tmp_path, "SELECT message FROM errors")
    assert "protocol violation" in error[0]


def test_a_slow_chip_flashes_correctly_and_the_run_says_programming_turned_checked(cli, make_board, tmp_path):
    rng = random.Random(8)
    image = bytearray(rng.randbytes(SIZE))
    image[:4] = b"\xaa\x55\xaa\x55"
    (tmp_path / "image.bin").write_bytes(image)
    board = make_board(content=rng.randbytes(SIZE), faults=["slow-busy=2"], transport="pcie")
    code, out, err = cli("flash", tmp_path / "image.bin", "--yes", "--force", "--board", f"sim:{board}",
                         "--start-sector", "0", "--sector-count", "32")   # random content: no part number
    assert code == 0, err
    assert (board / "flash.bin").read_bytes()[:0x20000] == bytes(image[:0x20000])
    verdicts = [d for (d,) in rows(tmp_path, "SELECT detail FROM stages WHERE event = 'fast path'")]
    assert any(d.startswith("timed pages: off for this board") for d in verdicts)


@pytest.mark.slow
def test_dump_with_several_boards_writes_a_file_per_board(cli, make_board, tmp_path):
    a, b = make_board(content=synthetic_ifwi(1)), make_board(content=synthetic_ifwi(2))
    code, _, err = cli("dump", tmp_path / "one.bin", "--board", f"sim:{a}", "--board", f"sim:{b}")
    assert code == 2 and "2 boards would all write" in err
    assert not (tmp_path / "one.bin").exists()
    code, _, err = cli("dump", tmp_path / "dump-{serial}.bin", "--board", f"sim:{a}", "--board", f"sim:{b}")
    assert code == 0, err
    for board, seed in ((a, 1), (b, 2)):
        out = tmp_path / f"dump-{serial_of(board)}.bin"
        assert hashlib.sha256(out.read_bytes()).digest() == hashlib.sha256(synthetic_ifwi(seed)).digest()


@pytest.mark.slow
def test_dump_templates_that_would_collide_are_refused_up_front(cli, make_board, tmp_path):
    a, b = make_board(), make_board()
    code, _, err = cli("dump", tmp_path / "x-{n}-{n}.bin", "--board", f"sim:{a}", "--board", f"sim:{b}")
    assert code == 0, err                                       # {n} tells them apart
    assert sorted(p.name for p in tmp_path.glob("x-*.bin")) == ["x-1-1.bin", "x-2-2.bin"]


@pytest.mark.slow   # a long scenario: CI runs it (pytest -m slow)
def test_dump_serials_known_only_once_open_are_filled_in_then(make_board, tmp_path):
    from tests.stages.transport.conftest import run_cli

    a, b = make_board(), make_board()
    env = sim_usb_env(a, b)
    r = run_cli(tmp_path, "dump", str(tmp_path / "usb-{serial}.bin"), "--board", "usb:0", "--board", "usb:1", env=env)
    assert r.returncode == 0, r.stderr
    assert {p.name for p in tmp_path.glob("usb-*.bin")} == {f"usb-{serial_of(a)}.bin", f"usb-{serial_of(b)}.bin"}
    runs = json.loads(run_cli(tmp_path, "runs", "--format", "json").stdout)
    assert [r["status"] for r in runs] == ["succeeded", "succeeded"]
