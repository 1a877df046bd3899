"""EF 60 15 whose SFDP cannot be read: the W25Q16DW, FW and JW cannot be told apart, so the
part is taken as the most careful of the three — an FW/JW's WPS is honoured, CMP is cleared
with 31h and read back, then with the two-byte 01h a DW takes, and every source's reading of
the BP bits counts. Each through the CLI against an emulated board whose SFDP reads 0xFF."""
from __future__ import annotations

import pytest

from amdflash.stages.sim import Board, command_log
from amdflash.stages.sim.synth import PART_KEY
from tests.stages.chips.test_pipeline import last_report
from tests.pipeline.engine.conftest import flash_content

MiB2 = 0x200000
CAREFUL = "Winbond W25Q16DW, W25Q16FW or W25Q16JW (not told apart by SFDP)"
NO_SFDP = {"sfdp": ""}          # the chip answers 5Ah with 0xFF: no SFDP signature


def test_info_names_the_three_parts_and_why(cli_shown, make_board):
    board = make_board(chip="W25Q16JW", transport="ideal", calibration=NO_SFDP)
    r = cli_shown("info", "--board", f"sim:{board}")
    assert r.code == 0, r.err
    assert f"flash       {CAREFUL}" in r.out
    assert "revision (unreadable) selects none of the others" in r.out


@pytest.mark.parametrize("chip", ["W25Q16FW", "W25Q16JW"])
def test_an_fw_or_jw_with_wps_set_is_refused_before_anything_is_written(cli, make_board, image, chip):
    """Taken for a W25Q16DW (no SR3), the block locks WPS=1 selects were not seen: the flash
    started and the chip ignored its writes."""
    board = make_board(chip=chip, content="blank", transport="ideal", calibration=NO_SFDP)
    with Board(board) as b:
        b.chip.transaction(b"\x06", 0)
        b.chip.transaction(b"\x11\x64", 0)                 # SR3: WPS=1, DRV as at the factory
    r = cli("flash", image, "--yes", "--expect-part", PART_KEY, "--board", f"sim:{board}")
    assert r.code == 2 and "WPS=1" in r.err and "individual block locks" in r.err, r.err
    assert flash_content(board) == b"\xff" * MiB2
    with Board(board) as b:
        assert b.stats()["flash_busy_seconds"] == 0


@pytest.mark.slow
def test_a_dw_whose_sfdp_is_unreadable_is_flashed_its_cmp_cleared_by_the_fallback(cli, make_board, image):
    """A DW has no SR3 (15h reads 0xFF, reserved bits set: no WPS) and ignores 31h: CMP is
    still set after it, so the two-byte 01h clears it, each attempt in the trail."""
    board = make_board(chip="W25Q16DW", cmp=True, transport="ideal", calibration=NO_SFDP)
    r = cli("flash", image, "--yes", "--clear-cmp", "--force", "--board", f"sim:{board}")
    assert r.code == 0, r.err
    assert flash_content(board) == image.read_bytes()
    status_writes = [(c.opcode, c.data) for c in command_log.read(board) if c.opcode in (0x01, 0x31, 0x11)]
    assert status_writes == [(0x31, b"\x00"), (0x01, b"\x00\x00")]
    with Board(board) as b:
        assert b.chip.transaction(b"\x35", 1) == b"\x00"
    ends = [s["detail"] for s in last_report(cli)["stages"] if (s["stage"], s["event"]) == ("clear_cmp", "end")]
    assert ends == ["SR2.CMP cleared: 31h 00: SR2=0x40, CMP still set; 01h 00 00: SR2=0x00, CMP clear"]

