"""amdflash on an amdgpu: board, through the CLI, against the emulated tree and its kernel."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

from amdflash.stages.sim.synth import synthetic_ifwi
from tests.pipeline.engine.conftest import ROOT, cli_shown  # noqa: F401 - fixture
from tests.support.cli import audit_rows


@pytest.fixture
def image(tmp_path):  # noqa: ANN201
    def make(seed: int = 9, key: str = "SYNTH-0001") -> str:
        path = tmp_path / f"image-{key}-{seed}.bin"
        path.write_bytes(synthetic_ifwi(seed, part_key=key))
        return str(path)
    return make


rows = audit_rows


def last_run(db) -> str:  # noqa: ANN001
    return rows(db, "SELECT run_id FROM runs ORDER BY rowid DESC LIMIT 1")[0][0]


def stages(db, stage: str) -> list[tuple[str, str]]:  # noqa: ANN001
    return rows(db, "SELECT event, detail FROM stages WHERE run_id = ? AND stage = ? ORDER BY rowid",
                last_run(db), stage)


def test_list_shows_the_amdgpu_spec_and_running_part_number(cli, emulated):
    emulated()
    r = cli("list", "--format", "json")
    assert r.code == 0, r.err
    [entry] = json.loads(r.out)
    assert entry["spec"] == "pci:0000:03:00.0" and entry["spec_amdgpu"] == "amdgpu:0000:03:00.0"
    assert entry["part_number"] == "SYNTH-0001-102" and entry["psp_vbflash"] == "available"


def test_info_reads_the_part_number_and_records_the_board(cli, db, emulated):
    emu = emulated()
    r = cli("info", "--board", emu.spec)
    assert r.code == 0, r.err
    assert "part number SYNTH-0001-102" in r.out and "psp_vbflash available" in r.out
    [(kind, detail)] = rows(db, "SELECT kind, detail FROM boards WHERE run_id = ?", last_run(db))
    assert kind == "amdgpu" and json.loads(detail)["part_number"] == "SYNTH-0001-102"
    assert rows(db, "SELECT count(*) FROM register_snapshots WHERE run_id = ?", last_run(db)) == [(0,)]


def test_auto_uses_amdgpu_when_the_driver_is_bound(cli, emulated):
    emulated()
    r = cli("info")
    assert r.code == 0, r.err
    assert "board       amdgpu:0000:03:00.0" in r.out


def test_flash_is_a_psp_update_and_is_audited(cli, cli_shown, db, emulated, image):
    emu = emulated()
    r = cli_shown("flash", image(), "--yes", "--board", emu.spec)
    assert r.code == 0, r.err
    assert "part number check: same" in r.out and "PSP update succeeded: psp_vbflash_status 0x80000000" in r.out
    assert "not a byte-for-byte copy" in r.out and emu.updates == 1
    events = [e for e, _ in stages(db, "psp_vbflash")]
    assert events[:6] == ["start", "clearing", "cleared", "staging", "staged", "triggered"] and events[-1] == "end"
    assert [d for e, d in stages(db, "psp_vbflash") if e == "status"][-1].startswith("0x80000000")
    [(_, detail)] = stages(db, "part_number")
    assert json.loads(detail)["board_part"] == "SYNTH-0001-102"
    report = json.loads(cli("report", last_run(db), "--format", "json").out)
    assert report["status"] == "succeeded" and report["board"]["spec"] == emu.spec and report["units"] == []
    assert "PSP chose the partition" in report["summary"]["note"]
    assert "not a byte-for-byte copy" in cli("report", last_run(db)).out
    assert cli("audit", "verify").code == 0


def test_another_boards_image_never_reaches_the_psp(cli, db, emulated, image):
    emu = emulated()
    r = cli("flash", image(key="SYNTH-0002"), "--yes", "--board", emu.spec)
    assert r.code == 2 and "SYNTH-0002-102" in r.err and "SYNTH-0001-102" in r.err
    assert stages(db, "psp_vbflash") == [] and emu.handed_over == [] and emu.state.image_size == 0
    r = cli("flash", image(key="SYNTH-0002"), "--yes", "--force", "--board", emu.spec)
    assert r.code == 0, r.err
    assert json.loads(stages(db, "part_number")[0][1])["outcome"] == "forced" and emu.updates == 1


def test_a_psp_failure_fails_the_run_naming_the_status(cli, db, emulated, image):
    emu = emulated(outcome="error", error_status=0x80000007)
    r = cli("flash", image(), "--yes", "--board", emu.spec)
    assert r.code == 1
    assert "PSP reported failure: reading psp_vbflash failed with EIO and psp_vbflash_status is 0x80000007" in r.err
    [(message,)] = rows(db, "SELECT message FROM errors WHERE run_id = ?", last_run(db))
    assert "0x80000007" in message
    assert stages(db, "psp_vbflash")[-1][0] == "fail"
    assert rows(db, "SELECT status FROM run_status WHERE run_id = ? ORDER BY rowid DESC LIMIT 1",
                last_run(db)) == [("failed",)]


def test_options_of_the_rom_sw_path_are_refused(cli, emulated, image):
    emu = emulated()
    for extra in (["--start-sector", "16"], ["--clear-cmp"]):
        r = cli("flash", image(), "--yes", *extra, "--board", emu.spec)
        assert r.code == 2 and "do not apply to an amdgpu: board" in r.err
    r = cli("dump", "out.bin", "--board", emu.spec)
    assert r.code == 2 and "'dump' needs BAR5" in r.err
    r = cli("info", "--board", emu.spec, "--unbind-driver")
    assert r.code == 1 and "--unbind-driver contradicts it" in r.err


def test_no_psp_vbflash_no_flash(cli, emulated, image):
    emu = emulated(with_vbflash=False)
    r = cli("flash", image(), "--yes", "--board", emu.spec)
    assert r.code == 2 and "exposes no psp_vbflash" in r.err
    assert cli("info", "--board", emu.spec).code == 0


def test_verify_compares_partition_payloads_through_the_flash_dump(cli, cli_shown, emulated, image):
    emu = emulated(spirom_dump=True)
    img = image()
    r = cli("verify", img, "--board", emu.spec)
    assert r.code == 1 and "no partition of the board holds the image's partition A payload" in r.err
    assert cli("flash", img, "--yes", "--board", emu.spec).code == 0
    r = cli_shown("verify", img, "--board", emu.spec)
    assert r.code == 0, r.err
    assert "the board's partition B (boot priority 1) holds the image's partition A payload" in r.out
    assert emu.flash != open(img, "rb").read()        # not a byte-identical copy, and verify does not need one


def test_verify_without_a_dump_compares_the_running_vbios(cli, cli_shown, emulated, image):
    emu = emulated()
    img = image()
    assert cli("flash", img, "--yes", "--board", emu.spec).code == 0
    r = cli("verify", img, "--board", emu.spec)
    assert r.code == 1 and "changes only when the board reboots" in r.err
    emu.reboot()
    r = cli_shown("verify", img, "--board", emu.spec)
    assert r.code == 0, r.err
    assert "the running VBIOS" in r.out and "equals the image's partition A ATOM image" in r.out


def test_a_user_in_another_process_reaches_the_tree_through_the_environment(emulated, image, tmp_path):
    emu = emulated()
    env = {**os.environ, **emu.env, "AMDFLASH_DB": str(tmp_path / "own.sqlite"),
           "AMDFLASH_LOCK_DIR": str(tmp_path / "locks"), "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "amdflash.pipeline.cli", "--no-progress", "flash", image(),
                        "--yes", "--board", "amdgpu:03:00.0"], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "PSP update succeeded" in p.stdout and emu.updates == 1


def test_verify_refuses_an_image_without_partition_a(cli, emulated, tmp_path):
    emu = emulated(spirom_dump=True)
    broken = bytearray(synthetic_ifwi(9))
    broken[0x12000:0x12020] = b"\xff" * 0x20
    path = tmp_path / "broken.bin"
    path.write_bytes(broken)
    r = cli("verify", path, "--board", emu.spec)
    assert r.code == 2 and "partition A cannot be found" in r.err and "verified by partition" in r.err


def test_a_staging_a_killed_run_left_is_named_from_the_trail_and_cleared(cli, db, emulated, image, monkeypatch):
    """A run that died while staging (here: the driver failed it half-way) leaves bytes in the
    driver's buffer; the next run finds it in the trail, in the same boot, and empties it
    before the PSP is handed anything."""
    from amdflash.stages.transport.amdgpu import AmdgpuBoard

    emu = emulated()
    img = image()
    real = AmdgpuBoard.stage_image

    def half_then_fail(self: AmdgpuBoard, data: bytes) -> None:
        real(self, data[:0x100000])
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(AmdgpuBoard, "stage_image", half_then_fail)
    assert cli("flash", img, "--yes", "--board", emu.spec).code == 1
    first = last_run(db)
    assert emu.state.image_size == 0x100000 and emu.handed_over == []
    monkeypatch.setattr(AmdgpuBoard, "stage_image", real)
    r = cli("flash", img, "--yes", "--board", emu.spec)
    assert r.code == 0, r.err
    cleared = dict(stages(db, "psp_vbflash"))["cleared"]
    assert f"run {first} was staging 0x200000 bytes in this boot and never triggered them" in cleared
    data = open(img, "rb").read()
    assert emu.handed_over == [f"{len(data):#x} {hashlib.sha256(data).hexdigest()}"] and emu.updates == 1


def test_after_a_reboot_the_trail_no_longer_speaks_for_the_buffer(cli, db, emulated, image, monkeypatch):
    from amdflash.stages.transport.amdgpu import AmdgpuBoard

    emu = emulated()
    real = AmdgpuBoard.stage_image
    monkeypatch.setattr(AmdgpuBoard, "stage_image", lambda self, data: (_ for _ in ()).throw(OSError(5, "EIO")))
    assert cli("flash", image(), "--yes", "--board", emu.spec).code == 1
    first = last_run(db)
    # Only the staging is put back: monkeypatch.undo() would drop the test's $AMDFLASH_DB too,
    # and the second flash would go to the default trail (once the user's own, in their home).
    monkeypatch.setattr(AmdgpuBoard, "stage_image", real)
    emu.reboot()
    assert cli("flash", image(), "--yes", "--board", emu.spec).code == 0
    assert last_run(db) != first                      # the second flash is on this test's trail
    cleared = dict(stages(db, "psp_vbflash"))["cleared"]
    assert "never triggered" not in cleared and "psp_vbflash_status reads 0x0" in cleared
