"""Reports are untrusted input; the scratch mode refuses a protected block before erasing."""
from __future__ import annotations

import json

from amdflash.stages.drivers.navi31 import regs as R
from amdflash.stages.sim import create_board


def test_scratch_sector_in_a_protected_block_is_refused_and_nothing_changes(amdflash, tmp_path):
    board = create_board(tmp_path / "b", seed=3, bp=1)          # GD25LQ16E BP=1: the top 64 KiB
    before = (board / "flash.bin").read_bytes()
    r = amdflash("hardware-report", "--board", f"sim:{board}", "-o", tmp_path / "r.json",
                 "--scratch-sector", 0x1F0, "--yes")
    assert r.code == 2 and "may be protected" in r.err
    assert (board / "flash.bin").read_bytes() == before
    assert not (tmp_path / "r.json").exists()


def test_a_malformed_report_is_refused_naming_the_field(amdflash, tmp_path):
    board = create_board(tmp_path / "b", seed=3)
    assert amdflash("hardware-report", "--board", f"sim:{board}", "-o", tmp_path / "r.json").code == 0
    report = json.loads((tmp_path / "r.json").read_text())
    for field, value, said in (("read32", {"n": 1, "min": -1}, "timings.transport.read32"),
                               ("sfdp", "zz", "flash.sfdp")):
        bad = json.loads(json.dumps(report))
        if field == "sfdp":
            bad["flash"]["sfdp"] = value
        else:
            bad["timings"]["transport"]["read32"] = value
        path = tmp_path / f"bad-{field}.json"
        path.write_text(json.dumps(bad))
        r = amdflash("sim", "create", tmp_path / f"c-{field}", "--from-report", path)
        assert r.code == 2 and said in r.err, r.err
        assert not (tmp_path / f"c-{field}").exists()
    (tmp_path / "junk.json").write_text("[1, 2")
    assert amdflash("sim", "create", tmp_path / "c", "--from-report", tmp_path / "junk.json").code == 2


def test_unique_id_and_serial_are_hashed_unless_asked_and_nothing_is_written(amdflash, tmp_path):
    board = create_board(tmp_path / "b", seed=5)
    config = json.loads((board / "board.json").read_text())
    def state() -> tuple[bytes, list[bytes]]:
        # The flash, and the registers every run restores (the engine's window and STATUS are scratch).
        regs = (board / "regs.bin").read_bytes()
        return (board / "flash.bin").read_bytes(), [regs[r:r + 4] for r in R.ROM_SW_SAVED]

    before = state()
    assert amdflash("hardware-report", "--board", f"sim:{board}", "-o", tmp_path / "hashed.json").code == 0
    assert state() == before
    hashed = (tmp_path / "hashed.json").read_text()
    assert config["unique_id"] not in hashed.lower() and config["serial"] not in hashed.lower()
    assert json.loads(hashed)["flash"]["unique_id"]["sha256"]
    assert amdflash("hardware-report", "--board", f"sim:{board}", "-o", tmp_path / "ids.json", "--include-ids").code == 0
    ids = json.loads((tmp_path / "ids.json").read_text())
    assert ids["flash"]["unique_id"]["value"] == config["unique_id"]
    assert ids["board"]["serial"]["value"] == config["serial"]


def test_a_scratch_block_whose_backup_reads_disagree_is_refused_before_any_erase(amdflash, tmp_path):
    # Reads that flip bits now and then: two reads of 64 KiB disagree, so the backup is not confirmed.
    board = create_board(tmp_path / "b", seed=4, faults=["read-flip=0.0001"])
    before = (board / "flash.bin").read_bytes()
    r = amdflash("hardware-report", "--board", f"sim:{board}", "-o", tmp_path / "r.json",
                 "--scratch-sector", 16, "--yes")
    assert r.code == 2 and "backup is not confirmed" in r.err
    assert (board / "flash.bin").read_bytes() == before
    assert list(tmp_path.glob("r.json*")) == []
