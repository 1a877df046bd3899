"""The command line over emulated USB bridges (AMDFLASH_SIM_USB) and across processes."""
from __future__ import annotations

import json
import re

from amdflash.stages.transport import discovery
from amdflash.stages.transport.lock import sim_key
from tests.stages.transport.conftest import run_cli, serial_of, unique_id_of
from tests.stages.transport.test_usb import transfers_to_open


def sim_usb_env(*paths) -> dict[str, str]:  # noqa: ANN002
    return {discovery.ENV_SIM_USB: ",".join(str(p) for p in paths)}


def test_info_over_an_emulated_usb_bridge(make_board, tmp_path):
    path = make_board()
    result = run_cli(tmp_path, "info", "--board", "usb", env=sim_usb_env(path))
    assert result.returncode == 0, result.stderr
    assert f"board       usb:{serial_of(path)} serial {serial_of(path)} (emulated)" in result.stdout
    assert "JEDEC capture c8 60 15" in result.stdout
    assert f"unique ID   {unique_id_of(path)}" in result.stdout
    assert "USB bridges are EMULATED boards" in result.stderr


def test_list_text_and_json(make_board, tmp_path):
    a, b = make_board(), make_board(gated=True)
    env = sim_usb_env(a, b)
    text = run_cli(tmp_path, "list", env=env)
    assert text.returncode == 0, text.stderr
    assert "EMULATED" in text.stderr
    lines = text.stdout.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(f"spec=usb:0  spec_serial=usb:{serial_of(a)}  kind=usb  serial={serial_of(a)}")
    assert "link=up" in lines[0] and "pci_ids=1002:744c" in lines[0] and "jedec=c86015" in lines[0]
    assert f"unique_id={unique_id_of(a)}" in lines[0]
    assert "ROM_SW does not answer" in lines[1]

    as_json = run_cli(tmp_path, "list", "--format", "json", env=env)
    assert as_json.returncode == 0, as_json.stderr
    boards = json.loads(as_json.stdout)
    assert [(x["spec"], x["spec_serial"], x["serial"]) for x in boards] == [
        ("usb:0", f"usb:{serial_of(a)}", serial_of(a)), ("usb:1", f"usb:{serial_of(b)}", serial_of(b))]
    assert boards[0]["jedec"] == "c86015" and boards[0]["unique_id"] == unique_id_of(a)
    assert boards[0]["emulated"] is True and boards[0]["link"] == "up"


def test_a_board_held_by_another_process_exits_2_board_busy(make_board, tmp_path, hold_lock):
    path = make_board()
    holder = hold_lock(sim_key(path), str(path))
    result = run_cli(tmp_path, "info", "--board", f"sim:{path}")
    assert result.returncode == 2, result.stderr
    assert f"board busy (pid {holder.pid})" in result.stderr and "Traceback" not in result.stderr
    holder.release()
    assert run_cli(tmp_path, "info", "--board", f"sim:{path}").returncode == 0


def test_a_usb_bridge_held_by_another_process_exits_2_and_list_shows_it(make_board, tmp_path, hold_lock):
    """The other process holds the board by its sim: path; the emulated bridge in front of the
    same board is the same board (one lock, on the board directory)."""
    path = make_board()
    holder = hold_lock(sim_key(path), str(path))
    env = sim_usb_env(path)
    result = run_cli(tmp_path, "info", "--board", f"usb:{serial_of(path)}", env=env)
    assert result.returncode == 2, result.stderr
    assert f"board busy (pid {holder.pid})" in result.stderr
    listed = run_cli(tmp_path, "list", "--format", "json", env=env)
    assert json.loads(listed.stdout)[0]["status"] == f"busy (pid {holder.pid})"


def test_a_disconnect_during_a_job_fails_promptly_naming_the_operation(make_board, tmp_path):
    opening = transfers_to_open(make_board)
    path = make_board(faults=[f"usb-disconnect-after={opening + 40}"])
    result = run_cli(tmp_path, "info", "--board", "usb", env=sim_usb_env(path), timeout=30)
    assert result.returncode == 1, result.stderr
    assert re.search(r"error: USB bridge [0-9a-f]{8}: (read32|write32|read_block|write_block) BAR5\+0x[0-9a-f]+"
                     r".*: the USB bridge was disconnected", result.stderr), result.stderr
    assert "Traceback" not in result.stderr


def test_no_board_found_is_a_refusal_on_record(tmp_path):
    result = run_cli(tmp_path, "info")
    assert result.returncode == 2
    assert result.stderr.startswith("error: no board found") and result.stderr.count("\n") == 1
    runs = run_cli(tmp_path, "runs")
    [line] = runs.stdout.splitlines()
    assert line.split()[1:3] == ["info", "refused"] and "auto" in line.split() and "no board found" in line


def test_sim_create_bridge_options_reach_the_emulated_bridge(tmp_path):
    never = tmp_path / "never"
    created = run_cli(tmp_path, "sim", "create", str(never), "--seed", "7", "--bridge-link", "never")
    assert created.returncode == 0, created.stderr
    assert json.loads((never / "board.json").read_text())["bridge"] == {"pcie_on_at_boot": False,
                                                                        "link_trains": False}
    result = run_cli(tmp_path, "info", "--board", "usb:0", env=sim_usb_env(never))
    assert result.returncode == 1 and "PCIe link not up" in result.stderr

    other = tmp_path / "other"
    assert run_cli(tmp_path, "sim", "create", str(other), "--gpu-device-id", "0x7480",
                   "--bridge-link", "down").returncode == 0
    assert json.loads((other / "board.json").read_text())["bridge"] == {
        "pcie_on_at_boot": False, "link_trains": True, "gpu_device_id": 0x7480}
    result = run_cli(tmp_path, "info", "--board", "usb", env=sim_usb_env(other))
    assert result.returncode == 1 and "1002:7480, not a Navi31 GPU" in result.stderr

    bad = run_cli(tmp_path, "sim", "create", str(tmp_path / "bad"), "--gpu-device-id", "0x12345")
    assert bad.returncode == 2 and "16-bit" in bad.stderr


def test_a_calibrated_board_behind_the_emulated_bridge_keeps_its_measured_link(tmp_path):
    """A board made from a hardware report answers over the emulated USB bridge with the real
    bridge's transfer latencies, as it does over sim: (before, the bridge charged the model's)."""
    from amdflash.stages.sim import create_board

    path = create_board(tmp_path / "b", seed=3, calibration={"transport": {"control": 160e-6, "bulk": 60e-6}})
    out = tmp_path / "r.json"
    result = run_cli(tmp_path, "hardware-report", "--board", "usb", "-o", str(out), env=sim_usb_env(path))
    assert result.returncode == 0, result.stderr
    transport = json.loads(out.read_text())["timings"]["transport"]
    assert abs(transport["write32"]["median"] - 160e-6) < 2e-6, transport["write32"]
    assert abs(transport["read32"]["median"] - 320e-6) < 4e-6, transport["read32"]
