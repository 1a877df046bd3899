"""The hardware report's protection probe: on the scratch block, under a setting the sources
read differently, one byte is programmed and read back, so the report records which reading
the chip follows; a board made from the report follows the same one."""
from __future__ import annotations

import json

import pytest

from amdflash.stages.sim import Board, create_board

UFPROG = "ufprog mx25x_wpr_type2_4bp_tb0"
FLASHROM_MX = "flashrom decode_range_spi25 as for the MX25L1635E/MX25L1633E"
SPI25 = "flashrom decode_range_spi25 and ufprog wpr_3bp_tb_sec_cmp"
DATASHEETS = "the Winbond/GigaDevice datasheet tables (recalled)"


def report(amdflash, board, path, sector: int) -> dict:
    r = amdflash("hardware-report", "--board", f"sim:{board}", "--scratch-sector", sector, "--yes", "-o", path)
    assert r.code == 0, r.err
    return json.loads(path.read_text())


@pytest.mark.parametrize("chip, follows, sector, found, refuted", [
    ("MX25U1635F", "", 0x1F0, UFPROG, FLASHROM_MX),
    ("MX25U1635F", "spi25", 0x1F0, FLASHROM_MX, UFPROG),
    ("GD25LQ16E", "", 16, SPI25, DATASHEETS),
    ("GD25LQ16E", "spi25-bp11-all", 16, DATASHEETS, SPI25),
])
@pytest.mark.slow
def test_the_report_says_which_reading_the_chip_follows_and_a_board_made_from_it_follows_it(
        amdflash, tmp_path, isolated, chip, follows, sector, found, refuted):
    source = create_board(tmp_path / "source", seed=3, chip=chip, content="synthetic",
                          calibration={"protection": follows} if follows else None)
    with Board(source) as b:
        before = bytes(b.chip.transaction(b"\x05", 1))
    first = report(amdflash, source, tmp_path / "r1.json", sector)
    probe = first["flash"]["protection_reading"]
    assert probe["follows"] == [found] and probe["contradicts"] == [refuted], probe
    with Board(source) as b:
        assert bytes(b.chip.transaction(b"\x05", 1)) == before       # the status register put back
    r = amdflash("sim", "create", tmp_path / "copy", "--from-report", tmp_path / "r1.json", "--seed", 3)
    assert r.code == 0, r.err
    again = report(amdflash, tmp_path / "copy", tmp_path / "r2.json", sector)
    assert again["flash"]["protection_reading"]["follows"] == [found]


def test_a_report_naming_a_reading_amdflash_does_not_know_is_refused(amdflash, tmp_path, isolated):
    source = create_board(tmp_path / "source", seed=3, chip="MX25U1635F")
    first = report(amdflash, source, tmp_path / "r1.json", 0x1F0)
    first["flash"]["protection_reading"]["follows"] = ["my own guess"]
    (tmp_path / "r1.json").write_text(json.dumps(first))
    r = amdflash("sim", "create", tmp_path / "copy", "--from-report", tmp_path / "r1.json")
    assert r.code == 2 and "flash.protection_reading.follows" in r.err, r.err
