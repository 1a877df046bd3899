"""amdflash.pipeline.api: the commands as functions, with result objects, on emulated boards."""
from __future__ import annotations

import hashlib

import pytest

from amdflash import api
from tests.pipeline.cli.conftest import flash_content


@pytest.mark.slow
def test_info_dump_verify_flash_return_typed_results(make_board, image, tmp_path):
    board = make_board(content="blank", transport="ideal", cmp=True)
    spec = f"sim:{board}"
    info = api.info(spec)
    assert info.ok and info.exit_code == 0 and info.chip == "GigaDevice GD25LQ16E"
    assert info.jedec.startswith("c86015") and info.unique_id and info.status_registers[1] & 0x40   # CMP

    dump = api.dump(tmp_path / "before.bin", board=spec)
    assert dump.ok and dump.path == tmp_path / "before.bin"
    assert dump.result_sha256 == hashlib.sha256(flash_content(board)).hexdigest()

    # The board is blank (bricked): the user vouches for its part number.
    refused = api.flash(image, board=spec, expect_part="SYNTH-0001")   # CMP set, no clear_cmp: refused in the run
    assert refused.status == "refused" and refused.exit_code == 2 and "--clear-cmp" in refused.error
    with pytest.raises(api.RunFailed):
        refused.raise_for_status()

    flashed = api.flash(image, board=spec, clear_cmp=True, expect_part="SYNTH-0001")
    assert flashed.ok and flashed.units["erase"] + flashed.units["program"] > 0
    assert flashed.result_sha256 == hashlib.sha256(image.read_bytes()).hexdigest()
    assert flash_content(board) == image.read_bytes()

    same = api.verify(image, board=spec)
    assert same.equal and same.first_mismatch is None
    other = tmp_path / "other.bin"
    other.write_bytes(bytes(0x200000))
    differs = api.verify(other, board=spec)
    assert not differs.equal and differs.exit_code == 1
    assert differs.first_mismatch["mismatch_address"] == 0
    assert api.read(0, 16, board=spec).data == image.read_bytes()[:16]
    assert [r["command"] for r in api.runs()] == ["info", "dump", "flash", "flash", "verify", "verify", "read"]


def test_refusals_before_a_run_raise_refused(make_board, tmp_path):
    board = make_board(transport="ideal")
    with pytest.raises(api.Refused, match="board spec 'usb:zz'"):
        api.info("usb:zz")
    with pytest.raises(api.Refused, match="character device"):
        api.verify("/dev/zero", board=f"sim:{board}")
    with pytest.raises(api.Refused, match="prescale"):
        api.info(f"sim:{board}", engine=api.EngineOptions(prescale=16))


@pytest.mark.slow
def test_an_interrupted_flash_resumes_through_the_api(make_board, image):
    board = make_board(content="blank", transport="ideal", faults=["kill-after-writes=1"])
    spec = f"sim:{board}"
    import subprocess
    import sys
    killed = subprocess.run([sys.executable, "-c", f"from amdflash import api; api.flash({str(image)!r}, board={spec!r}, expect_part='SYNTH-0001')"],
                            capture_output=True, text=True, timeout=120)
    assert killed.returncode != 0
    resumed = api.resume(board=spec)
    assert resumed.ok and resumed.resumes_run_id
    assert flash_content(board) == image.read_bytes()
