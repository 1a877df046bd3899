"""What opening a board declares, and where an emulated USB backend comes from.

A board opened by spec says once which way it is driven (capability "bar5": its registers),
in what open_transport returns. The USB transport builds an emulated backend only from the
`Emulators` it is handed (stages/open_transport.EMULATORS); handed none, a chosen emulator
is refused, never replaced by hardware.
"""
from __future__ import annotations

import pytest

from amdflash.stages.open_transport import EMULATORS, list_boards, open_transport, parse_spec
from amdflash.stages.transport import discovery
from amdflash.stages.transport.base import Bar5, TransportError
from amdflash.stages.transport.emulated import NO_EMULATORS, Emulators
from tests.stages.transport.conftest import serial_of


def test_a_sim_board_is_opened_for_its_registers(make_board):
    path = make_board()
    opened, lock = open_transport(parse_spec(f"sim:{path}"), lambda m: None)
    try:
        assert opened.capability == "bar5"
        assert isinstance(opened.bar, Bar5) and opened.identity is opened.bar.identity
        assert opened.identity.spec == f"sim:{path}"
    finally:
        opened.close()
        lock.release()


def test_an_emulated_usb_bridge_is_opened_for_its_registers(make_board, monkeypatch):
    path = make_board()
    monkeypatch.setenv(discovery.ENV_SIM_USB, str(path))
    for spec in ("usb:0", "auto"):
        opened, lock = open_transport(parse_spec(spec), lambda m: None)
        try:
            assert opened.capability == "bar5", spec
            assert isinstance(opened.bar, Bar5) and opened.identity.serial == serial_of(path)
        finally:
            opened.close()
            lock.release()


def test_the_emulated_usb_backend_is_the_one_handed_in(make_board, monkeypatch):
    paths = [make_board(), make_board()]
    monkeypatch.setenv(discovery.ENV_SIM_USB, ",".join(map(str, paths)))
    asked: list[list[str]] = []

    def backend(selected: list[str]):  # noqa: ANN202
        asked.append(selected)
        assert EMULATORS.usb_backend is not None
        return EMULATORS.usb_backend(selected)

    messages: list[str] = []
    scan = discovery.scan_usb(messages.append, Emulators(usb_backend=backend))
    try:
        assert asked == [[str(p) for p in paths]]
        assert scan.emulated and [b.serial for b in scan.usable] == [serial_of(p) for p in paths]
        assert any("EMULATED" in m for m in messages)
    finally:
        scan.close()


def test_a_chosen_usb_emulator_with_no_backend_handed_in_is_refused(make_board, monkeypatch):
    path = make_board()
    monkeypatch.setenv(discovery.ENV_SIM_USB, str(path))
    refused = "AMDFLASH_SIM_USB is set, but this caller was handed no emulated USB backend"
    with pytest.raises(TransportError, match=refused):
        discovery.open_spec(parse_spec("usb"), lambda m: None, NO_EMULATORS)
    with pytest.raises(TransportError, match=refused):
        discovery.list_boards(lambda m: None, lambda bar: {}, NO_EMULATORS)
    # The one place that lists boards hands it in.
    [entry] = list_boards(lambda m: None, lambda bar: {})
    assert entry["serial"] == serial_of(path) and entry["emulated"] is True
