"""A board's hardware report given to an ordinary run (--hardware-report FILE): refused unless it
is of this board; its measured busy maxima raise the limits, and a protection reading its probe
showed the chip does not follow is set aside (only among the sources' readings). `info` says
which reading is in force and why; the trail records what was applied."""
from __future__ import annotations

import json

import pytest

from amdflash.stages.drivers.flash import chips
from amdflash.stages.sim import Board, create_board
from amdflash.stages.sim.synth import PART_KEY, synthetic_ifwi

MiB2 = 0x200000
SPI25 = "flashrom decode_range_spi25 and ufprog wpr_3bp_tb_sec_cmp"
DATASHEETS = "the Winbond/GigaDevice datasheet tables (recalled)"
MAX_4K = chips.GD25LQ16E.erase_type(0x1000).maximum        # 300 ms


@pytest.fixture
def image(tmp_path):
    path = tmp_path / "image.bin"
    path.write_bytes(synthetic_ifwi(1234))
    return path


def report(amdflash, board, path, sector: int = 16):
    r = amdflash("hardware-report", "--board", f"sim:{board}", "--scratch-sector", sector, "--yes", "-o", path)
    assert r.code == 0, r.err
    return path


def set_sr1(board, value: int) -> None:
    with Board(board) as b:
        b.chip.transaction(b"\x06", 0)
        b.chip.transaction(bytes((0x01, value)), 0)


def last_stages(amdflash) -> list[dict]:
    run_id = json.loads(amdflash("runs", "--format", "json").out)[-1]["run_id"]
    return json.loads(amdflash("report", run_id, "--format", "json").out)["stages"]


def flash_content(board) -> bytes:
    return (board / "flash.bin").read_bytes()


@pytest.mark.parametrize("follows, flashed", [("", True), ("spi25-bp11-all", False)])
def test_a_write_only_the_set_aside_reading_protects_goes_ahead_with_the_boards_report(
        amdflash, tmp_path, isolated, image, follows, flashed):
    """SEC=1 BP=6 on a GD25LQ16E: 32 KiB at the top (flashrom, ufprog) or everything (the
    datasheet tables). The board's report probed which its chip follows: the bottom 64 KiB is
    written when the chip follows the programs' reading, and still refused when it follows
    the datasheets'. Without the report, both are refused."""
    board = create_board(tmp_path / "board", seed=3, transport="ideal",
                         calibration={"protection": follows} if follows else None)
    path = report(amdflash, board, tmp_path / "r.json")
    set_sr1(board, 0x58)
    before = flash_content(board)
    args = ("flash", image, "--yes", "--expect-part", PART_KEY, "--force", "--sector-count", "16",
            "--board", f"sim:{board}")
    r = amdflash(*args)
    assert r.code == 2 and "read more than one way" in r.err, r.err
    r = amdflash(*args, "--hardware-report", path)
    if flashed:
        assert r.code == 0, r.err
        assert flash_content(board)[:0x10000] == image.read_bytes()[:0x10000]
        applied = [s["detail"] for s in last_stages(amdflash) if (s["stage"], s["event"]) ==
                   ("identify", "hardware report")]
        assert len(applied) == 1 and f"not {DATASHEETS}" in applied[0] and str(path) in applied[0], applied
    else:
        assert r.code == 2, r.err
        assert f"(2048 KiB) by {DATASHEETS}" in r.err or "0x000000-0x1fffff protected" in r.err, r.err
        assert f"protection reading: {DATASHEETS}" in r.err, r.err
        assert flash_content(board) == before


def test_info_says_which_reading_is_in_force_and_why(amdflash, tmp_path, isolated):
    board = create_board(tmp_path / "board", seed=3, transport="ideal")
    path = report(amdflash, board, tmp_path / "r.json")
    r = amdflash("info", "--board", f"sim:{board}")
    assert r.code == 0, r.err
    assert f"reading     the union of every source's reading ({SPI25}; {DATASHEETS}): no hardware report" in r.out
    r = amdflash("info", "--board", f"sim:{board}", "--hardware-report", path)
    assert r.code == 0, r.err
    assert f"reading     {SPI25} (this board's hardware report {path}: the report's probe at 0x010000" in r.out
    assert f"the chip follows {SPI25}, not {DATASHEETS}" in r.out
    assert "busy        limits: the datasheet maximum or this board's measured one" in r.out


def test_a_report_of_another_board_is_refused_naming_the_mismatch(amdflash, tmp_path, isolated, image):
    board = create_board(tmp_path / "board", seed=3, transport="ideal")
    other = create_board(tmp_path / "other", seed=4, transport="ideal", content="blank")
    path = report(amdflash, board, tmp_path / "r.json")
    r = amdflash("flash", image, "--yes", "--expect-part", PART_KEY, "--board", f"sim:{other}",
                 "--hardware-report", path)
    assert r.code == 2, r.err
    assert f"--hardware-report {path} is not of this board: its flash.unique_id (sha256 " in r.err
    assert flash_content(other) == b"\xff" * MiB2
    with Board(other) as b:
        assert b.stats()["flash_busy_seconds"] == 0


def test_a_report_that_is_not_one_is_refused_before_any_run(amdflash, tmp_path, isolated):
    board = create_board(tmp_path / "board", seed=3, transport="ideal")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "amdflash-hardware-report", "version": 1}))
    r = amdflash("info", "--board", f"sim:{board}", "--hardware-report", bad)
    assert r.code == 2 and f"--hardware-report {bad}: not a hardware report" in r.err, r.err
    assert not (isolated / "audit.sqlite").exists()          # no run began


def test_a_probe_verdict_the_parts_readings_do_not_give_is_refused(amdflash, tmp_path, isolated):
    """The byte was taken under SEC=1 BP=6 at 0x010000: the programs' 32 KiB reading allows
    that, the datasheets' does not. A report saying the opposite was not written by amdflash
    as it stands: nothing is set aside on its word."""
    board = create_board(tmp_path / "board", seed=3, transport="ideal")
    path = report(amdflash, board, tmp_path / "r.json")
    edited = json.loads(path.read_text())
    probe = edited["flash"]["protection_reading"]
    assert probe["taken"] is True and probe["follows"] == [SPI25]
    probe["follows"], probe["contradicts"] = [DATASHEETS], [SPI25]
    path.write_text(json.dumps(edited))
    r = amdflash("info", "--board", f"sim:{board}", "--hardware-report", path)
    assert r.code == 2, r.err
    assert "flash.protection_reading does not agree with the GigaDevice GD25LQ16E's readings" in r.err


def test_a_chip_the_report_measured_slow_is_flashed_within_its_raised_limit(amdflash, tmp_path, isolated, image):
    """4 KiB erases of 3 x the datasheet maximum: over the limit without the report (the run
    fails naming the chip too slow, the erase over), within it when the board's report is
    given to its resume, which finishes the flash."""
    board = create_board(tmp_path / "board", seed=5, content=bytes(MiB2), transport="pcie",
                         calibration={"busy": {"0x20": 3 * MAX_4K}})
    path = report(amdflash, board, tmp_path / "r.json")
    r = amdflash("flash", image, "--yes", "--expect-part", PART_KEY, "--sector-count", "2", "--board", f"sim:{board}")
    assert r.code == 1 and "slower than its datasheet" in r.err, r.err
    run_id = json.loads(amdflash("runs", "--format", "json").out)[-1]["run_id"]
    r = amdflash("resume", run_id, "--board", f"sim:{board}", "--yes", "--hardware-report", path)
    assert r.code == 0, r.err
    assert flash_content(board)[:0x2000] == image.read_bytes()[:0x2000]
    applied = [s["detail"] for s in last_stages(amdflash)
               if (s["stage"], s["event"]) == ("identify", "hardware report")]
    assert len(applied) == 1 and "20h 0.9" in applied[0], applied


def test_a_flash_without_a_unique_id_is_matched_by_the_board_serial(amdflash, tmp_path, isolated):
    """The MX25U1632F/1633F entry reads no unique ID: another such board's report is refused
    by its serial; the board's own is taken."""
    board = create_board(tmp_path / "board", seed=3, chip="MX25U1633F", transport="ideal")
    other = create_board(tmp_path / "other", seed=4, chip="MX25U1633F", transport="ideal")
    path = tmp_path / "r.json"
    assert amdflash("hardware-report", "--board", f"sim:{board}", "-o", path).code == 0
    r = amdflash("info", "--board", f"sim:{other}", "--hardware-report", path)
    assert r.code == 2 and "has no unique ID, so the board serial must match" in r.err, r.err
    r = amdflash("info", "--board", f"sim:{board}", "--hardware-report", path)
    assert r.code == 0, r.err
    assert "has no protection probe" in r.out


def test_the_api_takes_the_report_as_an_engine_option(amdflash, tmp_path, isolated):
    from amdflash import api

    board = create_board(tmp_path / "board", seed=3, transport="ideal")
    other = create_board(tmp_path / "other", seed=4, transport="ideal")
    path = report(amdflash, board, tmp_path / "r.json")
    shown = api.info(f"sim:{board}", engine=api.EngineOptions(hardware_report=path))
    assert shown.ok
    assert any(line.startswith(f"reading     {SPI25} (this board's hardware report") for line in shown.lines)
    refused = api.info(f"sim:{other}", engine=api.EngineOptions(hardware_report=path))
    assert refused.status == "refused" and "is not of this board" in (refused.error or "")
    with pytest.raises(api.Refused, match="not a hardware report"):
        api.info(f"sim:{board}", engine=api.EngineOptions(hardware_report=tmp_path / "board" / "board.json"))


@pytest.mark.slow   # a killed flash and its resume (CI runs it: pytest -m slow)
def test_a_resume_without_the_option_uses_the_report_its_killed_run_was_given(tmp_path, image):
    """The flash given --hardware-report is killed mid-run; `resume` alone finds the report in
    the run's arguments (its file unchanged) and applies it again, as its trail shows."""
    import signal

    from tests.pipeline.engine.conftest import ROOT
    from tests.support import cli

    env = {"PYTHONPATH": str(ROOT), "AMDFLASH_DB": str(tmp_path / "a.sqlite"),
           "AMDFLASH_LOCK_DIR": str(tmp_path / "locks")}

    def run(*args: object) -> cli.Result:
        return cli.run("-q", *args, env=env)

    def writes(board) -> int:
        with Board(board) as b:
            return int(b.stats()["reg_writes"])

    content = bytes(MiB2)
    twin = create_board(tmp_path / "twin", seed=3, content=content, transport="ideal")
    def measure(board, path) -> None:
        assert run("hardware-report", "--board", f"sim:{board}", "--scratch-sector", 16, "--yes", "-o",
                   path).returncode == 0

    measure(twin, tmp_path / "r.json")
    reported = writes(twin)
    flash = ("flash", image, "--yes", "--expect-part", PART_KEY)
    assert run(*flash, "--board", f"sim:{twin}", "--start-over").returncode == 0
    flashing = writes(twin) - reported
    board = create_board(tmp_path / "board", seed=3, content=content, transport="ideal",
                         faults=[f"kill-after-writes={reported + flashing // 2}"])
    path = tmp_path / "mine.json"
    measure(board, path)
    killed = cli.run_process("-q", *flash, "--board", f"sim:{board}", "--hardware-report", path, env=env,
                             module="amdflash.pipeline.cli")      # killed: a process of its own
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    resumed = run("resume", "--board", f"sim:{board}", "--yes")
    assert resumed.returncode == 0, resumed.stderr
    assert flash_content(board) == image.read_bytes()
    run_id = json.loads(run("runs", "--format", "json").stdout)[-1]["run_id"]
    stages = json.loads(run("report", run_id, "--format", "json").stdout)["stages"]
    applied = [s["detail"] for s in stages if (s["stage"], s["event"]) == ("identify", "hardware report")]
    assert len(applied) == 1 and str(path) in applied[0], applied


def test_a_report_for_an_amdgpu_board_is_refused_rather_than_left_unused(amdflash, tmp_path, isolated):
    """The driver's psp_vbflash path neither polls the flash nor decodes its protection."""
    board = create_board(tmp_path / "board", seed=3, transport="ideal")
    path = tmp_path / "r.json"
    assert amdflash("hardware-report", "--board", f"sim:{board}", "-o", path).code == 0
    r = amdflash("info", "--board", "amdgpu:0000:03:00.0", "--hardware-report", path)
    assert r.code == 2 and "--hardware-report: amdgpu:0000:03:00.0 is run through the amdgpu driver" in r.err, r.err
