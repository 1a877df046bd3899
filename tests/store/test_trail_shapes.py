"""The compact trail follows the driver, whatever shape its writes take: for every way the ROM_SW
driver can talk to the board — its default fast paths (streamed command, preload, no CNTL
clears), the validated sequence, each fast path alone, restore around each transaction,
primed reads, checked programming — the `register_writes` view re-creates exactly the writes
the board received, in order (offsets, values, one block write as one block), and
`spi_transactions` holds every transaction the board's engine started, each with the opcode,
address and lengths it started with."""
from __future__ import annotations

import itertools
import json
import random
import sqlite3
from dataclasses import astuple, fields, replace
from pathlib import Path

import pytest

from amdflash.pipeline.cli.main import main
from amdflash.stages.drivers.navi31 import romsw
from amdflash.stages.drivers.navi31 import regs as R
from amdflash.stages.drivers.navi31.fastpaths import VALIDATED, FastPaths
from amdflash.stages.sim import Board, create_board

SECTORS = 20
ALL = FastPaths()


@pytest.fixture
def seen(monkeypatch) -> dict[str, list]:
    """Every register write the emulated board receives, and every transaction its engine starts."""
    from amdflash.stages.sim import romsw as engine

    log: dict[str, list] = {"writes": [], "starts": []}
    real_write, real_start = Board.reg_write, engine.RomSwEngine._start

    def reg_write(self, offset, data):  # noqa: ANN001
        log["writes"].append((offset, bytes(data)))
        return real_write(self, offset, data)

    def start(self, cntl, now):  # noqa: ANN001
        command = self.board.get32(R.ROM_SW_COMMAND)
        log["starts"].append((command & 0xFF, cntl))
        return real_start(self, cntl, now)

    monkeypatch.setattr(Board, "reg_write", reg_write)
    monkeypatch.setattr(engine.RomSwEngine, "_start", start)
    return log


def _flash(tmp_path: Path, monkeypatch, wanted: FastPaths | None, *extra: str, sectors: int = SECTORS) -> tuple[Path, str]:
    monkeypatch.setenv("AMDFLASH_LOCK_DIR", str(tmp_path / "locks"))
    if wanted is not None:
        monkeypatch.setattr(romsw.RomSwOptions, "wanted", lambda self: wanted)
    # Random content under a random image: every unit is erased and every page programmed.
    rng = random.Random(7)
    board = create_board(tmp_path / "board", content=rng.randbytes(0x200000), transport="ideal", seed=3)
    image = tmp_path / "image.bin"
    image.write_bytes(b"\xaa\x55\xaa\x55" + rng.randbytes(0x200000 - 4))
    db = tmp_path / "audit.sqlite"
    code = main(["-q", "--db", str(db), "flash", str(image), "--yes", "--force", "--sector-count", str(sectors),
                 *extra, "--board", f"sim:{board}"])
    assert code == 0
    con = sqlite3.connect(db)
    run_id = con.execute("SELECT run_id FROM runs ORDER BY seq DESC LIMIT 1").fetchone()[0]
    con.close()
    return db, run_id


def _trail(db: Path, run_id: str) -> tuple[list, list, dict[str, int]]:
    con = sqlite3.connect(db)
    try:
        writes = [(offset, value.to_bytes(4, "little") if value is not None else bytes(data))
                  for offset, value, data in con.execute(
                      "SELECT offset, value, data FROM register_writes WHERE run_id = ? ORDER BY n", [run_id])]
        starts = con.execute("SELECT opcode, address, address_bytes, tx_len, rx_len FROM spi_transactions "
                             "WHERE run_id = ? ORDER BY n", [run_id]).fetchall()
        run = con.execute("SELECT seq FROM runs WHERE run_id = ?", [run_id]).fetchone()[0]
        rows = {t: con.execute(f"SELECT count(*) FROM {t} WHERE run = ?", [run]).fetchone()[0]
                for t in ("log_spi", "log_writes")}
    finally:
        con.close()
    return writes, starts, rows


def _decoded(command: int, cntl: int) -> tuple:
    sent = (cntl >> 16) & 3
    address = (command >> (8 + 8 * (3 - sent))) & (0xFFFFFF >> (8 * (3 - sent)))
    rx = bool(cntl & R.ROM_SW_RETURN_DATA_ENABLE)
    return address, (cntl >> 16) & 7, 0 if rx else cntl & 0xFFFF, cntl & 0xFFFF if rx else 0


DRIVERS = {
    "default fast paths": (None, ()),
    "validated sequence": (VALIDATED, ()),
    "streamed command alone": (replace(VALIDATED, streamed_command=True), ()),
    "streamed command, single-TLP": (replace(VALIDATED, streamed_command=True, single_tlp=True), ()),
    "CNTL clears, single-TLP": (replace(ALL, no_cntl_clears=False), ()),
    "preload without timed pages": (replace(ALL, timed_pages=False), ()),
    "restore each transaction": (None, ("--restore-each",)),
    "primed reads": (None, ("--rx-mode", "primed")),
}


@pytest.mark.parametrize("driver", DRIVERS)
def test_the_trail_re_creates_every_write_and_transaction_the_board_received(driver, tmp_path, monkeypatch, seen, capsys):
    wanted, extra = DRIVERS[driver]
    db, run_id = _flash(tmp_path, monkeypatch, wanted, *extra)
    _check_trail(db, run_id, seen, extra)
    _check_replay(db, run_id, seen, tmp_path / "image.bin", capsys)


# Every combination of the fast paths; those with an odd number on also restore around each transaction.
COMBINATIONS = [FastPaths(*flags) for flags in itertools.product((False, True), repeat=len(fields(FastPaths)))]


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(COMBINATIONS)),
                         ids=["".join("1" if v else "0" for v in astuple(f)) for f in COMBINATIONS])
def test_every_fast_path_combination_is_re_created(index, tmp_path, monkeypatch, seen, capsys):
    wanted = COMBINATIONS[index]
    extra = ("--restore-each",) if bin(index).count("1") % 2 else ()      # half of them, any flag either way
    db, run_id = _flash(tmp_path, monkeypatch, wanted, *extra, sectors=2)
    _check_trail(db, run_id, seen, extra)
    _check_replay(db, run_id, seen, tmp_path / "image.bin", capsys)


def _check_trail(db: Path, run_id: str, seen: dict[str, list], extra: tuple[str, ...]) -> None:
    writes, starts, rows = _trail(db, run_id)
    # Every write the board received (all of the run's, through the audited transport), exactly
    # and in order.
    assert writes == seen["writes"]
    # Every transaction the engine started, with the opcode it started and the address and
    # lengths COMMAND and CNTL gave it.
    assert [o for o, *_ in starts] == [o for o, _ in seen["starts"]]
    engine_view = [(o, *_decoded(c, cntl)) for (o, cntl), c in zip(seen["starts"], _commands(seen["writes"]))]
    assert [tuple(s) for s in starts] == engine_view
    # Compact: one row per transaction (a repeat at once shares it) and next to no plain
    # writes — but with --restore-each, whose engine set-up and restore around every
    # transaction are plain register writes.
    assert rows["log_spi"] <= len(starts)
    if "--restore-each" not in extra:
        assert rows["log_writes"] <= 40, rows


def _check_replay(db: Path, run_id: str, seen: dict[str, list], image: Path, capsys) -> None:  # noqa: ANN001
    """`amdflash replay` sends the replay board exactly the writes the run's board received, in
    order, and every recorded outcome comes out the same."""
    received = list(seen["writes"])
    capsys.readouterr()
    code = main(["--db", str(db), "replay", run_id, "--image", str(image), "--format", "json"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and result["identical"], result
    assert seen["writes"][len(received):] == received
    assert result["writes_applied"] == result["writes_total"] == len(received)
    assert result["verifies_checked"] == result["verifies_matching"] > 0


def _commands(writes: list[tuple[int, bytes]]) -> list[int]:
    """ROM_SW_COMMAND at each CNTL write, following the writes as the engine takes them."""
    command = 0
    out = []
    for offset, data in writes:
        end = offset + len(data)
        if offset < R.ROM_SW_CNTL + 4 and R.ROM_SW_CNTL < end:
            out.append(command)
        if offset <= R.ROM_SW_COMMAND and R.ROM_SW_COMMAND + 4 <= end:
            at = R.ROM_SW_COMMAND - offset
            command = int.from_bytes(data[at:at + 4], "little")
    return out


def test_the_default_driver_writes_shapes_the_rows_describe(tmp_path, monkeypatch, seen):
    """The default driver's fast paths are what the rows were reshaped for: a page's data goes
    out with the write enable before it (one block from STATUS, preloaded) and the page
    program sends it from the window — both one row each, the data stored once."""
    db, run_id = _flash(tmp_path, monkeypatch, None)
    con = sqlite3.connect(db)
    try:
        shapes = dict(con.execute("SELECT coalesce(shape, 'SCN'), count(*) FROM log_spi GROUP BY 1").fetchall())
        pages = con.execute("SELECT count(*) FROM spi_transactions WHERE run_id = ? AND opcode = 2", [run_id]).fetchone()[0]
        preloaded = con.execute(
            "SELECT count(*) FROM log_spi w JOIN log_spi p ON p.seq = (SELECT min(seq) FROM log_spi WHERE seq > w.seq) "
            "WHERE w.shape = 'BN' AND w.command = 6 AND w.tx IS NULL AND p.command & 255 = 2 AND p.tx = w.data "
            "AND coalesce(p.shape, 'SCN') = 'SCN'").fetchone()[0]
    finally:
        con.close()
    assert pages == SECTORS * 16 and preloaded == pages, (pages, preloaded, shapes)
