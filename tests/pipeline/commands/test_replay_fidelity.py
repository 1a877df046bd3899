"""`replay RUN --from-report FILE`: a run replayed onto the board a hardware report of its
board describes shows no divergence except those the report lists."""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
from amdflash.stages.sim import create_board
from amdflash.stages.sim.synth import synthetic_ifwi


def test_a_flash_run_replays_identically_onto_the_board_its_report_describes(amdflash, tmp_path, isolated):
    board = create_board(tmp_path / "b", seed=11, chip="W25Q16JW",
                         calibration={"transport": {"control": 120e-6}})
    image = tmp_path / "image.bin"
    image.write_bytes(synthetic_ifwi(5))
    r = amdflash("flash", image, "--board", f"sim:{board}", "--yes", "--force", "--sector-count", 16)
    assert r.code == 0, r.err
    run_id = re.search(r"run (\S+): succeeded", r.err).group(1)
    assert amdflash("hardware-report", "--board", f"sim:{board}", "-o", tmp_path / "r.json").code == 0
    r = amdflash("replay", run_id, "--from-report", tmp_path / "r.json", "--format", "json")
    assert r.code == 0, r.err
    result = json.loads(r.out)
    assert result["identical"] and result["divergences"] == []
    assert any("the hardware report's W25Q16JW" in n for n in result["notes"])
    listed = [n for n in result["notes"] if n.startswith("listed:")]
    assert any("transport: control" in n for n in listed)       # what the report says differs from the model
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    r = amdflash("replay", run_id, "--from-report", bad)
    assert r.code == 2 and "--from-report" in r.err


BOARDS = Path(__file__).resolve().parents[2] / "stages" / "boards"
VARYING = BOARDS / "emulated-varying-w25q16jw-asm24.json"


def _slow_board_run(amdflash, tmp_path: Path, *faults: str) -> tuple[str, Path]:  # noqa: ANN001
    """A board like the varying report's (page programs slower than the chip table says), its own
    hardware report (with a scratch block: busy times measured), and a flash of 16 sectors on it."""
    fault_args = [a for f in faults for a in ("--fault", f)]
    assert amdflash("sim", "create", tmp_path / "b", "--from-report", VARYING, "--seed", 3, *fault_args).code == 0
    spec = f"sim:{tmp_path / 'b'}"
    own = tmp_path / "own.json"
    r = amdflash("hardware-report", "--board", spec, "-o", own, "--scratch-sector", 16, "--yes", "--include-ids")
    assert r.code == 0, r.err
    content = bytearray((tmp_path / "b" / "flash.bin").read_bytes())
    content[0xF0000:0x100000] = bytes(range(256)) * 256
    (tmp_path / "image.bin").write_bytes(bytes(content))
    r = amdflash("flash", tmp_path / "image.bin", "--board", spec, "--yes", "--force",
                 "--start-sector", 240, "--sector-count", 16)
    assert r.code == 0, r.err
    assert "timed pages off for this board: the unit at 0x0f0000 differed on read-back" in r.err
    return re.search(r"run (\S+): succeeded", r.err).group(1), own


@pytest.mark.slow
def test_a_write_the_slow_chip_did_not_take_is_as_listed_only_against_its_own_report(amdflash, tmp_path, isolated):
    """The board's page programs take longer than the chip table says: the driver's timed pages
    are not taken at first (the chip is still busy), the read-back sees it, timed pages go off
    and the unit is written again, checked. The replay (never busy) takes every write: against
    the board's own report, which lists its page program times, that divergence is as listed;
    alone it is a divergence; a report of another board is refused."""
    run_id, own = _slow_board_run(amdflash, tmp_path)
    alone = amdflash("replay", run_id)
    assert alone.code == 1 and "DIVERGED   1 divergence" in alone.out, alone.out
    listed = amdflash("replay", run_id, "--from-report", own)
    assert listed.code == 0, listed.out
    assert "as listed  unit 0x0f0000" in listed.out and "busy: page program" in listed.out
    assert "identical  the replay reproduces every recorded outcome but those the hardware report lists" in listed.out
    other = amdflash("replay", run_id, "--from-report", VARYING)     # the board it was made from: another board
    assert other.code == 2 and "the report is of another board" in other.err, other.err
    # The same report with the IDs hashed, as anyone can write them into any board's report (the
    # line view's history shows the hashes): nothing is taken as listed.
    report = json.loads(own.read_text())
    for part, key in (("flash", "unique_id"), ("board", "serial")):
        value = report[part][key]["value"]
        report[part][key] = {"sha256": hashlib.sha256(value.encode()).hexdigest()}
    hashed = tmp_path / "hashed.json"
    hashed.write_text(json.dumps(report))
    forged = amdflash("replay", run_id, "--from-report", hashed)
    assert forged.code == 1 and "as listed  unit" not in forged.out and "--include-ids" in forged.out, forged.out


def test_a_weak_cell_stays_a_divergence_even_against_the_boards_own_report(amdflash, tmp_path, isolated):
    """A bit that fails its first program (a weak cell) on a later unit, on the same slow board:
    that unit too verifies when written again, but the driver's timed pages were already off —
    nothing in the record ties it to busy times, so it stays a divergence and replay exits 1."""
    run_id, own = _slow_board_run(amdflash, tmp_path, "weak-bit=0xf4300:0")
    r = amdflash("replay", run_id, "--from-report", own, "--format", "json")
    assert r.code == 1, r.out
    result = json.loads(r.out)
    units = {d["unit"]: d for d in result["divergences"]}
    assert units[0xF0000]["explained_by"] and units[0xF4000]["transient"] and not units[0xF4000]["explained_by"]
    assert result["unexplained"] == 1
