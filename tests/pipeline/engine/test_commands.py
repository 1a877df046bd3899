"""Every board command end to end through the CLI, on emulated boards."""
from __future__ import annotations

import json
import os
import re
import sqlite3

import pytest

from amdflash.stages.drivers.navi31 import regs as R
from amdflash.stages.sim import Board
from amdflash.stages.sim.synth import PART_KEY
from tests.pipeline.engine.conftest import flash_content

MiB2 = 0x200000


def registers(path) -> dict[int, int]:  # noqa: ANN001
    with Board(path) as b:
        return {r: b.get32(r) for r in (R.GPIOPAD_MASK, R.GPIOPAD_A, R.GPIOPAD_EN, R.PAGE_MIRROR_CNTL,
                                         R.ROM_CNTL, R.ROM_SW_STATUS, R.ROM_SW_CNTL)}


def report(cli, run_id: str) -> dict:
    r = cli("report", run_id, "--format", "json")
    assert r.code == 0, r.err
    return json.loads(r.out)


@pytest.fixture
def cli(db):
    """amdflash in this process, as a user runs it (no -q: results are checked on stdout)."""
    from tests.support import cli as command_line

    def run(*args: object) -> command_line.Result:
        return command_line.run("--no-progress", *args)
    return run


def last_run(cli) -> dict:
    r = cli("runs", "--format", "json")
    return json.loads(r.out)[-1]


def test_info_prints_identity_and_records_the_run(cli, make_board):
    board = make_board(cmp=True)
    before = registers(board)
    r = cli("info", "--board", f"sim:{board}")
    assert r.code == 0, r.err
    assert "GD25LQ16E" in r.out and "c8 60 15" in r.out and "CMP=set" in r.out
    assert "SFDP 1.6: 2048 KiB, erase 4K:20h, 32K:52h, 64K:D8h" in r.out
    rep = report(cli, last_run(cli)["run_id"])
    assert rep["status"] == "succeeded" and rep["board"]["jedec"].startswith("c86015")
    assert rep["board"]["unique_id"] == Board(board).config["unique_id"]
    assert rep["register_writes"] > 0
    assert registers(board) == before


def test_read_hex_and_file(cli, make_board, tmp_path):
    board = make_board(content=bytes(range(256)) * 0x2000)
    r = cli("read", "0x10", "0x20", "--board", f"sim:{board}")
    assert r.code == 0 and r.out.split()[0] == bytes(range(0x10, 0x30)).hex()
    out = tmp_path / "r.bin"
    assert cli("read", "0x1000", "0x1800", "-o", out, "--board", f"sim:{board}").code == 0
    assert out.read_bytes() == (bytes(range(256)) * 0x2000)[0x1000:0x2800]
    assert cli("read", "0x1FFFFF", "2", "--board", f"sim:{board}").code == 2


@pytest.mark.slow
@pytest.mark.parametrize("via", ["rom-sw", "aperture"])
def test_dump_both_paths(cli, make_board, tmp_path, via):
    board = make_board(transport="ideal")
    out = tmp_path / f"{via}.bin"
    r = cli("dump", out, "--via", via, "--board", f"sim:{board}")
    assert r.code == 0, r.err
    assert out.read_bytes() == flash_content(board)
    rep = report(cli, last_run(cli)["run_id"])
    import hashlib
    assert rep["result_sha256"] == hashlib.sha256(flash_content(board)).hexdigest()


@pytest.mark.slow
def test_aperture_dump_refusals_write_no_file(cli, make_board, tmp_path):
    # No raw controller: known from one register read, before anything is read (a refusal);
    # a mirrored aperture only once the whole of it was read (a failure). Neither writes a file.
    for variant, code in (({"mirrored_rom": True}, 1), ({"no_raw_rom": True}, 2)):
        out = tmp_path / "x.bin"
        r = cli("dump", out, "--via", "aperture", "--board", f"sim:{make_board(transport='ideal', **variant)}")
        assert r.code == code and not out.exists(), (variant, r.err)


@pytest.mark.slow
def test_verify_match_and_mismatch(cli, make_board, tmp_path):
    board = make_board(transport="ideal")
    good = tmp_path / "good.bin"
    good.write_bytes(flash_content(board))
    assert cli("verify", good, "--board", f"sim:{board}").code == 0
    bad = bytearray(flash_content(board))
    bad[0x12345] ^= 0x5A
    (tmp_path / "bad.bin").write_bytes(bad)
    r = cli("verify", tmp_path / "bad.bin", "--board", f"sim:{board}")
    assert r.code == 1
    assert f"verify mismatch at 0x012345: flash={flash_content(board)[0x12345]:02x} image={bad[0x12345]:02x}" in r.err


def test_flash_writes_the_image_and_report_has_the_contract_keys(cli, make_board, image):
    board = make_board(content="blank", transport="ideal")
    r = cli("flash", image, "--yes", "--expect-part", PART_KEY, "--board", f"sim:{board}")
    assert r.code == 0, r.err
    assert flash_content(board) == image.read_bytes()
    rep = report(cli, last_run(cli)["run_id"])
    for key in ("run_id", "command", "status", "board", "image_sha256", "result_sha256", "units",
                "register_writes", "error"):
        assert key in rep
    assert rep["status"] == "succeeded" and rep["error"] is None
    assert rep["board"]["spec"] == f"sim:{board}" and rep["board"]["jedec"]
    assert rep["result_sha256"] == rep["image_sha256"]
    assert len(rep["units"]) == 512 and all(u["state"] == "verified" for u in rep["units"])
    assert {u["action"] for u in rep["units"]} <= {"skip", "program", "erase+program"}


def test_flash_plans_minimal_work(cli, make_board, image):
    img = image.read_bytes()
    current = bytearray(img)
    current[0x20000:0x30000] = os.urandom(0x10000)         # one whole 64K block differs
    current[0x41000:0x42000] = bytes(0x1000)                # one unit needs an erase
    board = make_board(content=bytes(current), transport="ideal")
    assert cli("flash", image, "--yes", "--board", f"sim:{board}").code == 0
    assert flash_content(board) == img
    rep = report(cli, last_run(cli)["run_id"])
    actions = {u["address"]: u["action"] for u in rep["units"]}
    assert actions[0x41000] == "erase+program"
    assert all(actions[a] == "erase+program" for a in range(0x20000, 0x30000, 0x1000)
               if img[a:a + 0x1000] != current[a:a + 0x1000])
    assert sum(a == "skip" for a in actions.values()) >= 512 - 17
    assert rep["summary"]["erases"] in ({"65536": 1, "4096": 1}, {65536: 1, 4096: 1})


def test_flash_program_only_where_bits_only_clear(cli, make_board, image):
    img = image.read_bytes()
    current = bytearray(img)
    current[0x50000:0x50100] = b"\xff" * 0x100             # erased page: programming alone restores it
    board = make_board(content=bytes(current), transport="ideal")
    assert cli("flash", image, "--yes", "--board", f"sim:{board}").code == 0
    rep = report(cli, last_run(cli)["run_id"])
    if img[0x50000:0x50100] != b"\xff" * 0x100:
        assert {u["address"]: u["action"] for u in rep["units"]}[0x50000] == "program"
    assert flash_content(board) == img


@pytest.mark.parametrize("args,needle", [
    ((), "--yes"),
    (("--yes", "--start-sector", "600"), "--start-sector: 600 is not in 0..511"),
    (("--yes", "--start-sector", "10", "--sector-count", "510"), "--sector-count 510: from sector 10 there are 1..502"),
    (("--yes", "--retries", "-1"), "--retries: -1 is not in 0..100"),
    (("--yes", "--prescale", "99"), "--prescale: 99 is not in 0..15"),
])
def test_flash_refusals_before_anything(cli, make_board, image, args, needle):
    board = make_board(transport="ideal")
    before = flash_content(board)
    r = cli("flash", image, *args, "--board", f"sim:{board}")
    assert r.code == 2 and needle in r.err
    assert r.err.count("\n") == 1 and r.err.startswith("error: ") and "Traceback" not in r.err
    assert flash_content(board) == before


@pytest.mark.slow   # a long scenario: CI runs it (pytest -m slow)
def test_flash_refuses_wrong_size_and_missing_magic(cli, make_board, tmp_path):
    board = make_board(transport="ideal")
    before = flash_content(board)
    (tmp_path / "short.bin").write_bytes(bytes(100))
    assert cli("flash", tmp_path / "short.bin", "--yes", "--board", f"sim:{board}").code == 2
    nomagic = tmp_path / "nomagic.bin"
    nomagic.write_bytes(os.urandom(MiB2))
    r = cli("flash", nomagic, "--yes", "--board", f"sim:{board}")
    assert r.code == 2 and "AA55AA55" in r.err
    assert flash_content(board) == before
    assert cli("flash", nomagic, "--yes", "--force", "--board", f"sim:{board}").code == 0
    assert flash_content(board) == nomagic.read_bytes()


@pytest.mark.slow
def test_cmp_needs_clear_cmp_and_refusal_touches_nothing(cli, make_board, image):
    board = make_board(cmp=True, transport="ideal")
    before, regs = flash_content(board), registers(board)
    r = cli("flash", image, "--yes", "--board", f"sim:{board}")
    assert r.code == 2 and "--clear-cmp" in r.err
    assert flash_content(board) == before and registers(board) == regs
    with Board(board) as b:
        assert b.stats()["flash_busy_seconds"] == 0
    r = cli("flash", image, "--yes", "--clear-cmp", "--board", f"sim:{board}")
    assert r.code == 0, r.err
    assert "cleared SR2.CMP" in r.out
    assert flash_content(board) == image.read_bytes()
    assert registers(board) == regs


def test_block_protected_target_is_refused(cli, make_board, image):
    board = make_board(bp=1, transport="ideal", content="blank")   # top 64 KiB protected
    r = cli("flash", image, "--yes", "--expect-part", PART_KEY, "--board", f"sim:{board}")
    assert r.code == 2 and "write-protected" in r.err
    assert flash_content(board) == b"\xff" * MiB2
    # A range below the protected block is fine.
    assert cli("flash", image, "--yes", "--start-sector", "0", "--sector-count", "16", "--expect-part", PART_KEY,
               "--board", f"sim:{board}").code == 0
    assert flash_content(board)[:0x10000] == image.read_bytes()[:0x10000]


def test_sector_range_writes_only_that_range(cli, make_board, image):
    board = make_board(content="blank", transport="ideal")
    assert cli("flash", image, "--yes", "--start-sector", "16", "--sector-count", "8", "--expect-part", PART_KEY,
               "--board", f"sim:{board}").code == 0
    got, img = flash_content(board), image.read_bytes()
    assert got[0x10000:0x18000] == img[0x10000:0x18000]
    assert got[:0x10000] == b"\xff" * 0x10000 and got[0x18000:] == b"\xff" * (MiB2 - 0x18000)
    rep = report(cli, last_run(cli)["run_id"])
    assert [u["address"] for u in rep["units"]] == list(range(0x10000, 0x18000, 0x1000))
    assert rep["result_sha256"] is None


def test_stuck_bit_fails_naming_address_and_bytes(cli, make_board, image):
    img = image.read_bytes()
    address = next(a for a in range(0x2000, MiB2) if img[a] & 0x01 == 0)
    board = make_board(content="blank", transport="ideal", faults=[f"stuck-bit={address:#x}:0"])
    r = cli("flash", image, "--yes", "--expect-part", PART_KEY, "--board", f"sim:{board}")
    assert r.code == 1
    assert f"verify failed at {address:#08x}: flash={img[address] | 1:02x} image={img[address]:02x}" in r.err
    rep = report(cli, last_run(cli)["run_id"])
    assert rep["status"] == "failed"
    unit = address - address % 0x1000
    assert {u["address"]: u["state"] for u in rep["units"]}[unit] == "failed"
    assert len([v for v in rep["verifies"]["failed"] if v["address"] == unit]) == 3   # 1 + 2 retries


def test_probe_and_ifwi_all(cli, make_board, tmp_path):
    from amdflash.stages.sim.synth import synthetic_ifwi

    board = make_board(transport="ideal", seed=77)
    r = cli("probe", "--board", f"sim:{board}")
    assert r.code == 0, r.err
    assert "transfer type   0x101: the bootloader requests item 0x01, phase 1" in r.out
    assert "model id        0x" in r.out and "boot partition  0x" in r.out
    img = tmp_path / "ifwi.bin"
    img.write_bytes(synthetic_ifwi(77))
    assert cli("ifwi-all", img, "--board", f"sim:{board}").code == 2          # needs --yes
    r = cli("ifwi-all", img, "--yes", "--board", f"sim:{board}")
    assert r.code == 0, r.err
    assert "hard power cycle" in r.out
    r = cli("probe", "--board", f"sim:{make_board(transport='ideal', sos=True)}")
    assert "gated" in r.out


@pytest.mark.parametrize("command", ["stream", "ifwi-step", "live-flash"])
def test_disabled_commands_refuse_with_the_reason(cli, command):
    r = cli(command, "x.bin", "--yes")
    assert r.code == 2 and "0xC" in r.err and "write to SPI error" in r.err


@pytest.mark.parametrize("kind", ["parent-is-a-file", "is-a-directory", "not-a-database"])
def test_unwritable_database_refuses_before_touching_the_board(cli, make_board, image, tmp_path,
                                                              monkeypatch, kind):
    board = make_board(content="blank", transport="ideal")
    if kind == "parent-is-a-file":
        (tmp_path / "file").write_text("x")
        path = tmp_path / "file" / "audit.sqlite"
    elif kind == "is-a-directory":
        path = tmp_path / "dir.sqlite"
        path.mkdir()
    else:
        path = tmp_path / "garbage.sqlite"
        path.write_bytes(os.urandom(4096))
    monkeypatch.setenv("AMDFLASH_DB", str(path))
    r = cli("flash", image, "--yes", "--board", f"sim:{board}")
    assert r.code == 2 and "audit database" in r.err
    assert flash_content(board) == b"\xff" * MiB2
    with Board(board) as b:
        assert b.stats()["reg_writes"] == 0


def test_clear_cmp_is_refused_up_front_when_the_status_registers_are_locked(cli, make_board, image, db):
    """SR2.SRP1 set (power-supply lock-down): the chip would ignore the status write that
    clears CMP. Refused before any write, with the lock named; `info` shows it."""
    from tests.stages.sim.test_board import release_pads, txn

    board = make_board(cmp=True, transport="ideal")
    with Board(board) as b:
        release_pads(b)
        txn(b, 0x06)
        txn(b, 0x01, tx=bytes((0x00, 0x41)))       # SR1 = 0, SR2 = CMP | SRP1
        txn(b, 0x35, rx=2)                          # COMMAND left holding a read, as a driver leaves it
    assert "SRP1=1 (status registers locked)" in cli("info", "--board", f"sim:{board}").out
    before, regs = flash_content(board), registers(board)
    r = cli("flash", image, "--yes", "--clear-cmp", "--board", f"sim:{board}")
    assert r.code == 2 and "status registers are locked" in r.err, r.err
    assert flash_content(board) == before and registers(board) == regs
    con = sqlite3.connect(db)
    sent = {op for (op,) in con.execute("SELECT DISTINCT opcode FROM spi_transactions WHERE run_id = ?",
                                        [last_run(cli)["run_id"]])}
    con.close()
    assert sent and not sent & {0x01, 0x06, 0x31}                # no write enable, no status write


def test_one_board_named_twice_through_a_symlink_is_refused_up_front(cli, make_board, image, tmp_path):
    board = make_board(transport="ideal")
    link = tmp_path / "alias"
    link.symlink_to(board)
    before = flash_content(board)
    r = cli("flash", image, "--yes", "--board", f"sim:{board}", "--board", f"sim:{link}")
    assert r.code == 2 and "is named twice" in r.err and str(board) in r.err, r.err
    assert flash_content(board) == before


def test_a_backup_folder_that_is_a_file_is_refused_before_the_run(cli, make_board, image, db):
    board = make_board(transport="ideal")
    (db.parent / "backups").write_text("not a folder")
    before = flash_content(board)
    r = cli("flash", image, "--yes", "--board", f"sim:{board}")
    assert r.code == 2 and "backup folder" in r.err and "is not a directory" in r.err, r.err
    assert flash_content(board) == before
    assert not db.exists() or "flash" not in cli("runs").out          # no run was started


def test_a_failure_without_an_address_of_its_own_names_the_stage_and_unit(cli, make_board, image, db):
    """The engine stops answering mid-flash: the error says in which stage and unit, and the
    errors row holds both; the hint does not blame gating on an engine that had answered."""
    board = make_board(transport="ideal", faults=["stall-after=15000"])
    r = cli("flash", image, "--yes", "--expect-part", PART_KEY, "--board", f"sim:{board}")
    assert r.code == 1, r.err
    assert re.search(r"(backup|erase|program|verify) of unit 0x[0-9a-f]{6}: ROM_SW transaction timed out", r.err), r.err
    assert "stopped answering after" in r.err and "gated" not in r.err
    con = sqlite3.connect(db)
    stage, address = con.execute("SELECT stage, address FROM errors").fetchone()
    con.close()
    assert stage in ("backup", "erase", "program", "verify") and address % 0x1000 == 0
