"""The amdgpu transport on an emulated sysfs tree: VBIOS identity, the PSP update, its failures.

The status poll runs on a virtual clock: each 100 ms sleep advances virtual time and lets the
emulated kernel act, so a 1,500-poll timeout costs no wall time.
"""
from __future__ import annotations

import ctypes
import errno
import struct
import time
from pathlib import Path

import pytest

from amdflash.stages.atom import BytesSource
from amdflash.stages.partitions import read_layout
from amdflash.stages.transport.amdgpu import (
    AMDGPU_INFO_VBIOS, AMDGPU_INFO_VBIOS_INFO, DRM_IOCTL_AMDGPU_INFO, INFO_REQUEST, MAX_POLLS, VBIOS_INFO, AmdgpuBoard,
    VbflashError, find_amdgpu,
)
from amdflash.stages.transport.base import TransportError
from amdflash.stages.transport.sim.amdgpu_sysfs import PSP_REJECTED
from amdflash.stages.transport.sim.synth import synthetic_ifwi
from tests.amdgpu.conftest import open_board


def test_the_info_ioctl_number_is_the_kernel_s():
    # DRM_IOW(0x40 + DRM_AMDGPU_INFO, struct drm_amdgpu_info): write, 32 bytes, type 'd', nr 0x45.
    assert DRM_IOCTL_AMDGPU_INFO == 0x40206445
    assert INFO_REQUEST.size == 32 and VBIOS_INFO.size == 200


def fake_info_ioctl(calls: list, pn: bytes = b"113-D7040100-114",  # noqa: ANN201
                    ver: bytes = b"022.001.002.008.000001"):
    """The kernel's side of AMDGPU_INFO_VBIOS: fill the caller's buffer through return_pointer."""
    def ioctl(fd: int, request: int, arg: bytearray) -> int:
        pointer, size, query, kind, offset = INFO_REQUEST.unpack(bytes(arg))
        calls.append((request, size, query, kind, offset))
        payload = VBIOS_INFO.pack(b"AMD TEST BOARD", pn, 0x1234, 0, ver, b"2023/03/27 09:41")
        ctypes.memmove(pointer, payload, min(size, len(payload)))
        return 0
    return ioctl


def test_part_number_from_the_info_ioctl(emulated):
    calls: list = []
    board, _ = open_board(emulated(), ioctl=fake_info_ioctl(calls))
    info, notes = board.vbios_info()
    assert notes == []
    assert calls == [(DRM_IOCTL_AMDGPU_INFO, 200, AMDGPU_INFO_VBIOS, AMDGPU_INFO_VBIOS_INFO, 0)]
    assert info.part_number == "113-D7040100-114" and info.version == "022.001.002.008.000001"
    assert info.name == "AMD TEST BOARD" and "renderD128" in info.source   # the render node first


def test_falls_back_to_sysfs_then_to_the_rom_file(emulated):
    emu = emulated()
    board, _ = open_board(emu)                       # the real ioctl on a plain file: ENOTTY
    info, notes = board.vbios_info()
    assert info.part_number == "SYNTH-0001-102" and info.source.startswith("sysfs")
    assert "Inappropriate ioctl" in notes[0]
    (emu.device / "vbios_version").unlink()
    info, notes = board.vbios_info()
    assert info.part_number == "SYNTH-0001-102" and info.source.startswith("rom file")
    assert info.version == "SYNTHETIC.002" and len(notes) == 2
    assert board.vbios_info(allow_rom=False)[0] is None


def test_the_rom_file_is_enabled_only_when_the_kernel_asks(emulated, monkeypatch):
    emu = emulated()
    board, _ = open_board(emu)
    rom = (emu.device / "rom").read_bytes()
    real = Path.read_bytes
    writes: list[str] = []
    state = {"enabled": False}

    def read_bytes(self: Path) -> bytes:
        if self.name == "rom" and not state["enabled"]:
            raise OSError(errno.EINVAL, "Invalid argument")   # pci_read_rom before "1" was written
        return rom if self.name == "rom" else real(self)

    def write_text(self: Path, text: str) -> int:
        writes.append(text)
        state["enabled"] = text == "1"
        return len(text)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    monkeypatch.setattr(Path, "write_text", write_text)
    assert board.read_rom() == rom and writes == ["1", "0"]


def test_nothing_readable_says_why_for_each_source(emulated):
    emu = emulated(vbios_version_file=False)
    (emu.device / "rom").write_bytes(b"")
    board, _ = open_board(emu)
    info, notes = board.vbios_info()
    assert info is None and len(notes) == 3 and "option ROM header" in notes[2]


def test_a_device_without_amdgpu_is_not_an_amdgpu_board(emulated):
    emu = emulated(driver="vfio-pci")
    assert find_amdgpu(emu.root / "devices") == []


def flash_update(emu, image: bytes):  # noqa: ANN001, ANN201
    board, clock = open_board(emu)
    board.stage_image(image)
    error = board.trigger()
    seen: list[tuple[int, int]] = []
    status, polls = board.wait_for_psp(error, lambda p, s: seen.append((p, s)))
    return status, polls, seen, clock


def test_a_psp_update_writes_the_inactive_partition(emulated):
    emu = emulated(busy=0.35)
    before = emu.flash
    image = synthetic_ifwi(9)
    status, polls, seen, clock = flash_update(emu, image)
    assert status == 0x80000000 and emu.updates == 1
    # First poll before the driver noticed, then busy, then the PSP's answer.
    assert [s for _, s in seen] == [0x0, 0x1, 0x80000000]
    assert polls == 6 and clock.t == pytest.approx(0.5)
    after = emu.flash
    assert after[0x100000:0x110000] == image[0x20000:0x30000]      # partition B now holds the image's A
    assert after[0x20000:0x30000] == before[0x20000:0x30000]        # the running partition untouched
    layout = read_layout(BytesSource(after))
    assert layout.slot("ISH_B").priority == 1 and layout.slot("ISH_A").priority == 0
    assert layout.slot("ISH_B").atom.part_number == "SYNTH-0001-102"
    assert (emu.device / "psp_vbflash").stat().st_size == 0         # the driver freed its buffer
    assert (emu.device / "vbios_version").read_text().strip() == "SYNTH-0001-102"


def test_the_update_needs_the_trigger_read(emulated):
    emu = emulated()
    board, clock = open_board(emu)
    board.stage_image(synthetic_ifwi(9))
    start = time.perf_counter()
    with pytest.raises(VbflashError, match="after 1500 polls .*never started, psp_vbflash_status reads 0x0") as e:
        board.wait_for_psp()
    assert e.value.status == 0 and emu.updates == 0
    assert clock.sleeps == MAX_POLLS - 1 and clock.t == pytest.approx(149.9)
    assert time.perf_counter() - start < 10                         # virtual time, not 150 s


def test_a_stuck_psp_times_out_after_1500_polls(emulated):
    emu = emulated(outcome="stuck")
    board, clock = open_board(emu)
    board.stage_image(synthetic_ifwi(9))
    assert board.trigger() is None
    with pytest.raises(VbflashError, match="after 1500 polls .*still busy, psp_vbflash_status reads 0x1"):
        board.wait_for_psp()
    assert clock.sleeps == MAX_POLLS - 1


def test_a_psp_failure_code_ends_the_wait_at_once(emulated):
    emu = emulated(outcome="error", error_status=0x80000005, busy=0.2)
    board, clock = open_board(emu)
    board.stage_image(synthetic_ifwi(9))
    board.trigger()
    with pytest.raises(VbflashError, match="PSP reported failure: psp_vbflash_status is 0x80000005 "
                                           r"\(status code 0x0005\) after 4 poll") as e:
        board.wait_for_psp()
    assert e.value.status == 0x80000005 and emu.updates == 0


def test_the_modelled_psp_rejects_an_image_without_partition_a(emulated):
    emu = emulated()
    image = bytearray(synthetic_ifwi(9))
    image[0x12000:0x12020] = b"\xff" * 0x20
    with pytest.raises(VbflashError, match=f"{PSP_REJECTED:#010x}"):
        flash_update(emu, bytes(image))


def test_a_failed_trigger_with_nothing_started_fails_at_the_first_poll(emulated):
    board, clock = open_board(emulated())
    with pytest.raises(VbflashError, match="did not start the update .*Input/output error"):
        board.wait_for_psp(OSError(errno.EIO, "Input/output error"))
    assert clock.sleeps == 0


def test_status_that_is_not_a_number(emulated):
    emu = emulated()
    (emu.device / "psp_vbflash_status").write_text("busy\n")
    board, _ = open_board(emu)
    with pytest.raises(VbflashError, match="reads 'busy', not a number"):
        board.read_status()


def test_an_image_larger_than_the_driver_buffer_is_refused(emulated):
    board, _ = open_board(emulated())
    with pytest.raises(VbflashError, match="at most 0x300000"):
        board.stage_image(bytes(0x300001))


def test_the_flash_dump_when_the_driver_offers_it(emulated):
    board, _ = open_board(emulated(spirom_dump=True))
    data, where = board.read_spirom(0x200000)
    assert data == synthetic_ifwi(1) and where.endswith("1/psp_spirom_dump")
    board, _ = open_board(emulated())
    data, why = board.read_spirom(0x200000)
    assert data is None and "no psp_spirom_dump" in why


def test_identity_and_the_missing_vbflash(emulated):
    board, _ = open_board(emulated(with_vbflash=False))
    assert board.identity.kind == "amdgpu" and board.identity.spec == "amdgpu:0000:03:00.0"
    assert not board.device.can_flash and board.identity.extra["psp_vbflash"] is False


def test_a_wrongly_bound_device_is_refused():
    from amdflash.stages.transport.amdgpu import AmdgpuDevice
    from amdflash.stages.transport.pci import PciDevice

    device = AmdgpuDevice(PciDevice("0000:03:00.0", Path("/nonexistent"), 0x1002, 0x744C, "vfio-pci"))
    with pytest.raises(TransportError, match="use pci:0000:03:00.0 instead"):
        AmdgpuBoard(device)


def test_tree_layout_as_the_transport_expects_it(emulated):
    emu = emulated()
    [device] = find_amdgpu(emu.root / "devices")
    assert device.spec == emu.spec and device.can_flash
    board, _ = open_board(emu)
    assert [p.name for p in board.drm_nodes()] == ["renderD128", "card1"]
    assert struct.unpack("<H", (emu.device / "rom").read_bytes()[:2])[0] == 0xAA55


def test_a_real_info_vbios_answer_decodes(emulated):
    """fwupd's recording of DRM_IOCTL_AMDGPU_INFO (AMDGPU_INFO_VBIOS_INFO) on a Polaris23 board
    (1002:6981), in ../shared/realdata. Expected values read from its bytes by offset: name at
    0x00, vbios_pn at 0x40, version at 0x80 (bytes 00 03 32 0f), vbios_ver_str at 0x88 (with
    "D0155500." left after its NUL), date at 0xA8."""
    from tests.image.test_realdata import realdata

    raw = realdata("amdgpu_ioctl", "polaris23_1002-6981_drm_amdgpu_info_vbios.bin").read_bytes()
    assert len(raw) == VBIOS_INFO.size

    def ioctl(fd: int, request: int, arg: bytearray) -> int:
        pointer, size, *_ = INFO_REQUEST.unpack(bytes(arg))
        ctypes.memmove(pointer, raw, size)
        return 0

    board, _ = open_board(emulated(), ioctl=ioctl)
    info, notes = board.vbios_info()
    assert notes == [] and info.source.startswith("DRM_IOCTL_AMDGPU_INFO")
    assert info.part_number == "113-D0155500-100"
    assert info.name == "D01555 Polaris23 GLXT DT A0 GDDR5 256Mx32 4GB 35W"
    assert info.version == "015.050.003.000.012636" and info.date == "2019/07/02 17:04"
    assert info.version_code == 0x0F320300
