"""`replay RUN --from-report FILE`: a run replayed onto the board a hardware report of its
board describes shows no divergence except those the report lists."""
from __future__ import annotations

import json
import re

from amdflash.stages.transport.sim import create_board
from amdflash.stages.transport.sim.synth import synthetic_ifwi


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


def test_a_write_the_slow_chip_did_not_take_is_as_listed_only_where_the_report_lists_its_busy_times(
        amdflash, tmp_path, isolated):
    """The board of a report whose page programs take longer than the chip table says: the
    driver's timed pages are not taken at first (the chip is still busy), the read-back sees it
    and the unit is written again, checked. The replay (never busy) takes every write: against
    that report the divergence is one it lists; alone, or against a report of a board whose busy
    times are the model's, it is a divergence."""
    from pathlib import Path

    boards = Path(__file__).resolve().parents[1] / "boards"
    varying, plain = boards / "emulated-varying-w25q16jw-asm24.json", boards / "emulated-w25q16jw-asm24.json"
    assert amdflash("sim", "create", tmp_path / "b", "--from-report", varying, "--seed", 3).code == 0
    content = bytearray((tmp_path / "b" / "flash.bin").read_bytes())
    content[0xF0000:0x100000] = bytes(range(256)) * 256
    (tmp_path / "image.bin").write_bytes(bytes(content))
    r = amdflash("flash", tmp_path / "image.bin", "--board", f"sim:{tmp_path / 'b'}", "--yes", "--force",
                 "--start-sector", 240, "--sector-count", 16)
    assert r.code == 0, r.err
    assert "timed pages off for this board" in r.err               # the fast path's own check caught it
    run_id = re.search(r"run (\S+): succeeded", r.err).group(1)
    alone = amdflash("replay", run_id)
    assert alone.code == 1 and "DIVERGED   1 divergence" in alone.out, alone.out
    listed = amdflash("replay", run_id, "--from-report", varying)
    assert listed.code == 0, listed.out
    assert "as listed  unit 0x0f0000" in listed.out and "busy: page program" in listed.out
    assert "identical  the replay reproduces every recorded outcome but those the hardware report lists" in listed.out
    other = amdflash("replay", run_id, "--from-report", plain, "--format", "json")
    assert other.code == 1
    result = json.loads(other.out)
    assert result["unexplained"] == 1 and result["divergences"][0]["transient"]
