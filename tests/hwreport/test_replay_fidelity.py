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
