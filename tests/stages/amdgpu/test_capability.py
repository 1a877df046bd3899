"""An amdgpu board as opened: it declares the driver's PSP update as its capability, its
device reaches no register, and the emulated kernel behind it is the one handed in."""
from __future__ import annotations

import pytest

from amdflash.stages.device import Device, StopFlag
from amdflash.stages.open_transport import EMULATORS, open_transport, parse_spec
from amdflash.stages.sim.amdgpu_sysfs import EmulatedKernel, KernelClock
from amdflash.stages.transport.amdgpu import AmdgpuBoard, attribute_io, find_amdgpu
from amdflash.stages.transport.base import TransportError
from tests.stages.amdgpu.conftest import open_board
from tests.stages.amdgpu.test_jobs import Rows


@pytest.mark.parametrize("spec", ["amdgpu", "auto"])
def test_a_board_opened_through_the_driver_declares_it(emulated, spec):
    emu = emulated()
    opened, lock = open_transport(parse_spec(spec), lambda m: None)
    try:
        assert opened.capability == "amdgpu"
        assert opened.identity.spec == emu.spec and opened.identity.kind == "amdgpu"
        assert isinstance(opened.board.io, EmulatedKernel) and isinstance(opened.board.clock, KernelClock)
    finally:
        opened.close()
        lock.release()


def test_the_device_of_an_amdgpu_board_reaches_no_register(emulated):
    board, clock = open_board(emulated())
    dev = Device.through_amdgpu(board, Rows(), StopFlag())
    assert dev.capability == "amdgpu" and dev.amdgpu is board and dev.clock is clock
    for access in (lambda: dev.bar.read32(0), lambda: dev.bar.write32(0, 1), lambda: dev.bar.read_block(0, 4),
                   lambda: dev.bar.write_block(0, b"\0" * 4)):
        with pytest.raises(TransportError, match="the amdgpu driver owns this board's BAR5"):
            access()


def test_the_emulated_kernel_is_used_only_when_handed_in(emulated, capsys):
    emu = emulated()
    [device] = find_amdgpu(emu.root / "devices")
    refused = "AMDFLASH_SIM_AMDGPU is set, but this caller was handed no emulated kernel"
    with pytest.raises(TransportError, match=refused):
        attribute_io()
    with pytest.raises(TransportError, match=refused):
        AmdgpuBoard(device)
    capsys.readouterr()
    assert isinstance(attribute_io(EMULATORS), EmulatedKernel)
    assert "the amdgpu driver is an EMULATED kernel" in capsys.readouterr().err
