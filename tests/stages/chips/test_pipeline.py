"""The flash / verify / resume suite on every emulated part, through the CLI, and the
unknown-chip policy: `info` from SFDP, `flash` refused unless --unknown-chip-ok, then from
SFDP facts alone."""
from __future__ import annotations

import json
import os
import signal

import pytest

from amdflash.stages.drivers.flash import chips
from amdflash.stages.drivers.flash.planning import PlanCosts, apply_cover, cover, plan_unit
from amdflash.stages.sim import Board, command_log, create_board
from amdflash.stages.sim.synth import PART_KEY, synthetic_ifwi
from tests.stages.chips.conftest import TABLE_PARTS
from tests.pipeline.engine.conftest import ROOT, flash_content
from tests.pipeline.engine.test_resume import damaged
from tests.support import cli as command_line

MiB2 = 0x200000
PARTS = (*TABLE_PARTS, "UNKNOWN")          # UNKNOWN is written with --unknown-chip-ok
ERASE_SIZES = {"GD25LQ16E": {4096, 32768, 65536}, "W25Q16DW": {4096, 32768, 65536},
               "W25Q16FW": {4096, 32768, 65536}, "W25Q16JW": {4096, 32768, 65536},
               "MX25U1635F": {4096, 32768, 65536}, "MX25U1633F": {4096, 32768, 65536}, "UNKNOWN": {4096, 65536}}


def ok_flag(chip: str) -> list[str]:
    return ["--unknown-chip-ok"] if chip.startswith("UNKNOWN") else []


def last_report(cli) -> dict:  # noqa: ANN001
    run_id = json.loads(cli("runs", "--format", "json").out)[-1]["run_id"]
    r = cli("report", run_id, "--format", "json")
    assert r.code == 0, r.err
    return json.loads(r.out)


def chip_facts(rep: dict) -> dict:
    rows = [s for s in rep["stages"] if (s["stage"], s["event"]) == ("identify", "chip facts")]
    assert len(rows) == 1
    return json.loads(rows[0]["detail"])


@pytest.mark.slow   # a long scenario: CI runs it (pytest -m slow)
@pytest.mark.parametrize("chip", PARTS)
def test_flash_verify_on_each_part(cli, make_board, image, chip):
    img = image.read_bytes()
    board = make_board(chip=chip, content=damaged(img), transport="ideal")
    r = cli("flash", image, "--yes", "--expect-part", PART_KEY, *ok_flag(chip), "--board", f"sim:{board}")
    assert r.code == 0, r.err
    assert flash_content(board) == img
    rep = last_report(cli)
    assert rep["status"] == "succeeded" and all(u["state"] == "verified" for u in rep["units"])
    used = {int(size) for size in rep["summary"]["erases"]}
    assert used and used <= ERASE_SIZES[chip]
    facts = chip_facts(rep)
    assert facts["source"] == ("sfdp" if chip == "UNKNOWN" else "table")
    assert facts["jedec"] == Board(board).chip.part.jedec.hex()
    if chip != "UNKNOWN":
        assert facts["name"].endswith(chip)          # W25Q16DW/FW/JW share a JEDEC id: told apart by SFDP
    assert cli("verify", image, "--board", f"sim:{board}").code == 0
    with Board(board) as b:
        b.files.flash[0x12345] ^= 0x10
    r = cli("verify", image, "--board", f"sim:{board}")
    assert r.code == 1 and "0x012345" in r.err


def test_the_planner_weighs_the_identified_parts_erase_times(cli, make_board, tmp_path):
    """Five 4 KiB units of a 32 KiB block need an erase: at the GD25LQ16E's times one 32 KiB
    erase (and programming the other three units again) is quicker, at the MX25U1635F's five
    4 KiB erases are: the MX board gets those."""
    img = bytearray(os.urandom(MiB2))
    img[:4] = b"\xaa\x55\xaa\x55"
    current = bytearray(img)
    block = 0x40000
    for unit in range(5):
        current[block + unit * 0x1000:block + (unit + 1) * 0x1000] = bytes(0x1000)
    units = [plan_unit(a, bytes(current[a:a + 0x1000]), bytes(img[a:a + 0x1000]), 256)
             for a in range(block, block + 0x10000, 0x1000)]
    sizes = [0x1000, 0x8000, 0x10000]
    by_gd = cover(units, sizes, PlanCosts.for_chip(chips.GD25LQ16E))
    by_mx = cover(units, sizes, PlanCosts.for_chip(chips.MX25U1635F))
    assert [e.size for e in by_gd] == [0x8000] and [e.size for e in by_mx] == [0x1000] * 5
    assert len(apply_cover(units, by_mx)) == 16
    (tmp_path / "img.bin").write_bytes(img)
    board = make_board(chip="MX25U1635F", content=bytes(current), transport="ideal")
    assert cli("flash", tmp_path / "img.bin", "--yes", "--force", "--board", f"sim:{board}").code == 0
    assert flash_content(board) == bytes(img)
    assert last_report(cli)["summary"]["erases"] in ({"4096": 5}, {4096: 5})


# -- resume ------------------------------------------------------------------------------------

def run(args: list[str], env: dict[str, str]) -> command_line.Result:
    return command_line.run("-q", *args, env=env)


def run_killed(args: list[str], env: dict[str, str]) -> command_line.Result:
    """A command the emulator kills: a process of its own."""
    return command_line.run_process("-q", *args, env=env, module="amdflash.pipeline.cli")


def kill_and_resume(tmp_path, chip: str, fraction: float) -> None:  # noqa: ANN001
    """Flash once undisturbed to count register writes, then kill a flash `fraction` of the way
    and resume it: the board ends with exactly the image."""
    image = synthetic_ifwi(99)
    (tmp_path / "image.bin").write_bytes(image)
    content = damaged(image)
    env = {"PYTHONPATH": str(ROOT), "AMDFLASH_DB": str(tmp_path / "a.sqlite"),
           "AMDFLASH_LOCK_DIR": str(tmp_path / "locks")}
    flash = ["flash", str(tmp_path / "image.bin"), "--yes", "--expect-part", PART_KEY, *ok_flag(chip)]
    ref = create_board(tmp_path / "reference", chip=chip, content=content, transport="ideal", seed=5)
    assert run([*flash, "--board", f"sim:{ref}"], env).returncode == 0
    with Board(ref) as b:
        total = int(b.stats()["reg_writes"])
    board = create_board(tmp_path / "board", chip=chip, content=content, transport="ideal", seed=5,
                         faults=[f"kill-after-writes={max(1, int(total * fraction))}"])
    assert run_killed([*flash, "--board", f"sim:{board}"], env).returncode == -signal.SIGKILL
    resumed = run(["resume", "--board", f"sim:{board}", "--yes"], env)
    assert resumed.returncode == 0, resumed.stderr
    assert flash_content(board) == image
    assert "intact" in run(["audit", "verify"], env).stdout


@pytest.mark.slow   # a long scenario: CI runs it (pytest -m slow)
@pytest.mark.parametrize("chip", PARTS[1:])
def test_a_killed_flash_resumes_to_the_image_on_each_part(tmp_path, chip):
    kill_and_resume(tmp_path, chip, 0.5)


@pytest.mark.slow
@pytest.mark.parametrize("fraction", [0.05, 0.3, 0.75, 0.97])
@pytest.mark.parametrize("chip", PARTS[1:])
def test_a_flash_killed_anywhere_resumes_on_each_part(tmp_path, chip, fraction):
    kill_and_resume(tmp_path, chip, fraction)


@pytest.mark.slow   # a long scenario: CI runs it (pytest -m slow)
def test_resume_of_a_part_without_unique_id_needs_the_same_board_spec(cli, make_board, image, tmp_path):
    board = make_board(chip="UNKNOWN", content=damaged(image.read_bytes()), transport="ideal",
                       faults=["kill-after-writes=19000"])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    killed = run_killed(["flash", str(image), "--yes", "--unknown-chip-ok", "--expect-part", PART_KEY,
                         "--board", f"sim:{board}"], env)
    assert killed.returncode == -signal.SIGKILL
    run_id = json.loads(cli("runs", "--format", "json").out)[-1]["run_id"]
    assert chip_facts(json.loads(cli("report", run_id, "--format", "json").out))["unique_id"] is None
    other = make_board(chip="UNKNOWN", content=damaged(image.read_bytes()), transport="ideal")
    r = cli("resume", run_id, "--board", f"sim:{other}", "--yes")
    assert r.code == 2 and "no usable unique ID" in r.err
    assert cli("resume", run_id, "--board", f"sim:{board}", "--yes").code == 0
    assert flash_content(board) == image.read_bytes()


# -- refusals ---------------------------------------------------------------------------------

REFUSALS = [
    # (part, sim create options, extra flash arguments, what the error says)
    ("UNKNOWN", {}, [], "--unknown-chip-ok"),
    ("UNKNOWN-SFDP10", {}, ["--unknown-chip-ok"], "no page size; no page-program time; no erase times"),
    ("UNKNOWN", {}, ["--unknown-chip-ok", "--clear-cmp"], "--clear-cmp: the part is known only from its SFDP"),
    ("UNKNOWN", {"bp": 1}, ["--unknown-chip-ok"], "SR1=44 has bits 2 set"),
    ("MX25U1635F", {}, ["--clear-cmp"], "has no CMP bit"),
    ("MX25U1635F", {"bp": 10}, [], "0x000000-0x0fffff (1024 KiB) by ufprog"),
    ("W25Q16DW", {"cmp": True}, [], "--clear-cmp"),
]


@pytest.mark.parametrize("chip, options, args, needle", REFUSALS)
def test_writes_are_refused_before_anything_is_written(cli, make_board, image, chip, options, args, needle):
    board = make_board(chip=chip, content="blank", transport="ideal", **options)
    r = cli("flash", image, "--yes", "--expect-part", PART_KEY, *args, "--board", f"sim:{board}")
    assert r.code == 2 and needle in r.err, r.err
    assert flash_content(board) == b"\xff" * MiB2
    with Board(board) as b:
        assert b.stats()["flash_busy_seconds"] == 0


def test_the_mx25u1635f_writes_outside_what_every_reading_protects(cli, make_board, image):
    """BP=4: the top 512 KiB by ufprog's table and flashrom's rule alike; below it is written."""
    board = make_board(chip="MX25U1635F", content="blank", transport="ideal", bp=4)
    r = cli("flash", image, "--yes", "--expect-part", PART_KEY, "--sector-count", "384", "--board", f"sim:{board}")
    assert r.code == 0, r.err
    got = flash_content(board)
    assert got[:0x180000] == image.read_bytes()[:0x180000] and got[0x180000:] == b"\xff" * 0x80000


@pytest.mark.slow
def test_cmp_on_the_w25q16dw_is_cleared_with_both_status_bytes(cli, make_board, image):
    board = make_board(chip="W25Q16DW", cmp=True, transport="ideal")
    r = cli("flash", image, "--yes", "--clear-cmp", "--force", "--board", f"sim:{board}")
    assert r.code == 0, r.err
    assert flash_content(board) == image.read_bytes()
    with Board(board) as b:
        assert b.chip.transaction(b"\x35", 1) == b"\x00"


@pytest.mark.slow
@pytest.mark.parametrize("chip", ["W25Q16FW", "W25Q16JW"])
def test_cmp_on_the_w25q16fw_and_jw_is_cleared_by_writing_sr2_alone(cli, make_board, image, chip):
    board = make_board(chip=chip, cmp=True, transport="ideal")
    r = cli("flash", image, "--yes", "--clear-cmp", "--force", "--board", f"sim:{board}")
    assert r.code == 0, r.err
    assert flash_content(board) == image.read_bytes()
    status_writes = [(c.opcode, c.data) for c in command_log.read(board) if c.opcode in (0x01, 0x31, 0x11)]
    assert status_writes == [(0x31, b"\x00")]          # SR2 alone, CMP cleared, nothing else touched
    with Board(board) as b:
        assert b.chip.transaction(b"\x35", 1) == b"\x00"
    ends = [s["detail"] for s in last_report(cli)["stages"] if (s["stage"], s["event"]) == ("clear_cmp", "end")]
    assert ends == ["SR2.CMP cleared: 31h 00: SR2=0x00, CMP clear"]


@pytest.mark.parametrize("chip, select", [("W25Q16JW", "WPS"), ("MX25U1635F", "WPSEL")])
def test_individual_block_locks_refuse_the_write_before_anything_is_written(cli, make_board, image, chip, select):
    """WPS (SR3 bit 2) / WPSEL (SCUR bit 7) replace the BP bits by per-block locks, all set at
    power-up: BP=0 no longer means 'nothing protected'."""
    board = make_board(chip=chip, content="blank", transport="ideal")
    with Board(board) as b:
        b.chip.transaction(b"\x06", 0)
        if chip == "MX25U1635F":
            b.chip.transaction(b"\x68", 0)                 # WPSEL: one-time, for good
        else:
            b.chip.transaction(b"\x11\x64", 0)             # SR3: WPS=1, DRV as at the factory
    r = cli("flash", image, "--yes", "--expect-part", PART_KEY, "--board", f"sim:{board}")
    assert r.code == 2 and f"{select}=1" in r.err and "individual block locks" in r.err, r.err
    assert flash_content(board) == b"\xff" * MiB2


def test_an_erase_the_mx25u1635f_reports_failed_fails_the_run_naming_it(cli, make_board, image):
    """E_FAIL in SCUR: the chip's own word that the erase did not happen."""
    board = make_board(chip="MX25U1635F", content=bytes(MiB2), transport="ideal", faults=["erase-fail=3"])
    r = cli("flash", image, "--yes", "--expect-part", PART_KEY, "--board", f"sim:{board}")
    assert r.code == 1, r.err
    assert "erase at 0x00" in r.err and "failed (SCUR=0x41: E_FAIL set)" in r.err, r.err


def test_info_describes_an_unknown_part_from_its_sfdp(cli_shown, make_board):
    board = make_board(chip="UNKNOWN", transport="ideal")
    r = cli_shown("info", "--board", f"sim:{board}")
    assert r.code == 0, r.err
    assert "unknown part (JEDEC e5 51 15, from SFDP 1.6)" in r.out and "described by its SFDP alone" in r.out
    assert "SFDP 1.6: 2048 KiB, erase 4K:20h, 64K:D8h, page 256 B, 3-byte addresses" in r.out
    assert "protection  unknown" in r.out and "QE=1" in r.out


@pytest.mark.parametrize("chip, needle", [("W25Q16DW", "status      SR1=00 SR2=00  CMP=clear  QE=0"),
                                          ("MX25U1635F", "status      SR=00 SCUR=01  QE=0")])
def test_info_names_each_parts_own_registers(cli_shown, make_board, chip, needle):
    board = make_board(chip=chip, transport="ideal")
    r = cli_shown("info", "--board", f"sim:{board}")
    assert r.code == 0 and needle in r.out, r.out


@pytest.mark.slow
def test_the_python_api_takes_unknown_chip_ok(db, make_board, image):
    from amdflash import api

    board = make_board(chip="UNKNOWN", content="blank", transport="ideal")
    info = api.info(f"sim:{board}")
    assert info.ok and info.chip.startswith("unknown part (JEDEC e5 51 15")
    refused = api.flash(image, board=f"sim:{board}", expect_part=PART_KEY)
    assert refused.exit_code == 2 and "--unknown-chip-ok" in refused.error
    flashed = api.flash(image, board=f"sim:{board}", expect_part=PART_KEY, unknown_chip_ok=True)
    assert flashed.ok and flash_content(board) == image.read_bytes()
