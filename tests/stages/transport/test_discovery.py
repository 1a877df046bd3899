"""Discovery and board specs over emulated bridges (AMDFLASH_SIM_USB), and board locking."""
from __future__ import annotations

from amdflash.stages.identify import probe_flash

import pytest

from amdflash.stages.drivers.navi31 import regs as R
from amdflash.stages.open_transport import BoardSpecError, list_boards, open_transport, parse_spec
from amdflash.stages.transport import discovery
from amdflash.stages.transport.base import TransportError
from amdflash.stages.transport.lock import BoardBusy, BoardLock, sim_key
from tests.stages.transport.conftest import serial_of, unique_id_of


@pytest.fixture
def sim_usb(make_board, monkeypatch):
    """sim_usb(n, **create options) -> board paths served as emulated USB bridges."""
    def make(n: int = 1, **options) -> list:  # noqa: ANN001
        paths = [make_board(**options) for _ in range(n)]
        monkeypatch.setenv(discovery.ENV_SIM_USB, ",".join(str(p) for p in paths))
        return paths

    return make


def opened(spec: str, messages: list[str] | None = None):  # noqa: ANN201
    return open_transport(parse_spec(spec), (messages if messages is not None else []).append)


def flash_unique_id(bar) -> str:  # noqa: ANN001
    from amdflash.stages.drivers.flash.spinor import SpiNor
    from amdflash.stages.drivers.navi31.romsw import RomSw

    with RomSw(bar) as engine:
        return SpiNor(engine).identify().unique_id.hex()


def test_usb_index_and_serial_specs_pick_the_right_bridge(sim_usb):
    paths = sim_usb(2)
    serials = [serial_of(p) for p in paths]
    for spec, want in (("usb:0", 0), ("usb:1", 1), (f"usb:{serials[1]}", 1), (f"usb:{serials[0].upper()}", 0),
                       ("usb", 0)):
        messages: list[str] = []
        board, lock = opened(spec, messages)
        try:
            assert board.identity.serial == serials[want], spec
            assert board.identity.extra["emulated"] is True
            assert flash_unique_id(board.bar) == unique_id_of(paths[want]), spec
            assert any("EMULATED" in m for m in messages)          # never silently an emulator
            assert lock.key == f"usb:{serials[want]}"
        finally:
            board.close()
            lock.release()


def test_bad_usb_selectors_name_what_was_found(sim_usb):
    paths = sim_usb(2)
    # Selectors that name no board that is there: NoBoardFound, a refusal (exit 2) in the CLI.
    with pytest.raises(discovery.NoBoardFound, match=r"usb:2: only 2 USB bridge\(s\) found"):
        opened("usb:2")
    with pytest.raises(discovery.NoBoardFound, match=f"no USB bridge with this serial \\(found: {serial_of(paths[0])}"):
        opened("usb:0badf00d")
    # A malformed selector never gets as far as discovery: the spec grammar refuses it.
    with pytest.raises(BoardSpecError, match="usb:N .index from 0. or usb:SERIAL"):
        opened("usb:first")


def test_auto_picks_the_first_usb_bridge_and_says_so(sim_usb):
    [path] = sim_usb(1)
    messages: list[str] = []
    bar, lock = opened("auto", messages)
    try:
        assert bar.identity.serial == serial_of(path)
        assert any(m.startswith("auto: using usb:0") for m in messages)
    finally:
        bar.close()
        lock.release()


def test_no_board_at_all_is_no_board_found():
    with pytest.raises(discovery.NoBoardFound, match="no board found"):
        opened("auto")
    with pytest.raises(discovery.NoBoardFound, match="no board found"):
        opened("pci")


def test_a_bad_sim_usb_path_is_an_error_not_a_fallback(tmp_path, monkeypatch):
    monkeypatch.setenv(discovery.ENV_SIM_USB, str(tmp_path / "missing"))
    with pytest.raises(TransportError, match="AMDFLASH_SIM_USB: .*missing is not an emulated board"):
        opened("auto")


def test_a_second_open_of_the_same_bridge_is_busy_and_releases_everything(sim_usb):
    sim_usb(1)
    bar, lock = opened("usb:0")
    try:
        with pytest.raises(BoardBusy, match=r"board busy \(pid \d+\)"):
            opened("usb:0")
    finally:
        bar.close()
        lock.release()
    bar, lock = opened("usb:0")                                  # free again
    bar.close()
    lock.release()


def test_the_lock_is_taken_before_the_board_is_touched(sim_usb, hold_lock):
    [path] = sim_usb(1)
    holder = hold_lock(f"usb:{serial_of(path)}", str(path))   # the board the bridge fronts
    from amdflash.stages.sim import Board

    board = Board(path)
    try:
        before = board.stats()
        with pytest.raises(BoardBusy, match=f"board busy \\(pid {holder.pid}\\)"):
            opened("usb:0")
        after = board.stats()
        assert after["tlps"] == before["tlps"]                      # no bring-up happened
    finally:
        board.close()


def test_list_reports_identity_link_flash_and_failures(make_board, monkeypatch, hold_lock):
    good = make_board()
    gated = make_board(gated=True)
    dead = make_board(bridge={"pcie_on_at_boot": False, "link_trains": False})
    other = make_board(bridge={"gpu_device_id": 0x7480})
    busy = make_board()
    paths = [good, gated, dead, other, busy]
    monkeypatch.setenv(discovery.ENV_SIM_USB, ",".join(map(str, paths)))
    holder = hold_lock(f"usb:{serial_of(busy)}", str(busy))
    messages: list[str] = []
    boards = list_boards(messages.append, probe_flash)
    assert any("EMULATED" in m for m in messages)
    assert [b["spec"] for b in boards] == ["usb:0", "usb:1", "usb:2", "usb:3", "usb:4"]
    by_serial = {b["serial"]: b for b in boards}
    g = by_serial[serial_of(good)]
    assert g["spec_serial"] == f"usb:{serial_of(good)}" and g["link"] == "up" and g["pci_ids"] == "1002:744c"
    assert (g["jedec"], g["unique_id"]) == ("c86015", unique_id_of(good))
    assert g["emulated"] is True and "error" not in g
    gt = by_serial[serial_of(gated)]
    assert "jedec" not in gt and "ROM_SW does not answer" in gt["flash"] and gt["aperture"].startswith("available")
    d = by_serial[serial_of(dead)]
    assert d["link"] == "down" and "PCIe link not up" in d["error"]
    o = by_serial[serial_of(other)]
    assert o["pci_ids"] == "1002:7480" and "not a Navi31" in o["error"]
    assert by_serial[serial_of(busy)]["status"] == f"busy (pid {holder.pid})"


def test_list_restores_the_engine_registers(sim_usb):
    [path] = sim_usb(1)
    from amdflash.stages.sim import Board

    board = Board(path)
    try:
        before = {reg: board.get32(reg) for reg in (*R.ROM_SW_SAVED, R.ROM_SW_COMMAND)}
        [entry] = list_boards(lambda m: None, probe_flash)
        assert entry["jedec"] == "c86015"
        assert {reg: board.get32(reg) for reg in (*R.ROM_SW_SAVED, R.ROM_SW_COMMAND)} == before
    finally:
        board.close()


def test_sim_specs_still_lock_by_path(make_board):
    path = make_board()
    with BoardLock(sim_key(path), path):
        with pytest.raises(BoardBusy):
            opened(f"sim:{path}")
