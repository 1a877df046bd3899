"""The amdgpu transport on an emulated sysfs tree: VBIOS identity, the PSP update, its failures.

The attributes are answered by the tree's emulated kernel on the tree's virtual clock: the
trigger's 60 s wait and a 1,500-poll timeout cost no wall time.
"""
from __future__ import annotations

import ctypes
import errno
import hashlib
import struct
import time
from pathlib import Path

import pytest

from amdflash.stages.image.atom import BytesSource
from amdflash.stages.image.partitions import read_layout
from amdflash.stages.transport import amdgpu
from amdflash.stages.transport.amdgpu import (
                                              AMDGPU_INFO_VBIOS, AMDGPU_INFO_VBIOS_INFO, DRM_IOCTL_AMDGPU_INFO, INFO_REQUEST, MAX_POLLS, VBIOS_INFO, AmdgpuBoard,
                                              VbflashError, find_amdgpu,
                                              )
from amdflash.stages.transport.base import TransportError
from amdflash.stages.sim.amdgpu_sysfs import PSP_REJECTED
from amdflash.stages.sim.synth import synthetic_ifwi
from tests.stages.amdgpu.conftest import open_board


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
    # The trigger read returned once the PSP had answered (the driver waits for it).
    assert seen == [(1, 0x80000000)] and polls == 1 and clock.now() == pytest.approx(0.35)
    assert emu.handed_over == [f"{len(image):#x} {hashlib.sha256(image).hexdigest()}"]
    after = emu.flash
    assert after[0x100000:0x110000] == image[0x20000:0x30000]      # partition B now holds the image's A
    assert after[0x20000:0x30000] == before[0x20000:0x30000]        # the running partition untouched
    layout = read_layout(BytesSource(after))
    assert layout.slot("ISH_B").priority == 1 and layout.slot("ISH_A").priority == 0
    assert layout.slot("ISH_B").atom.part_number == "SYNTH-0001-102"
    assert emu.state.image_size == 0 and not emu.state.allocated  # the driver freed its buffer
    assert (emu.device / "vbios_version").read_text().strip() == "SYNTH-0001-102"


def test_the_update_needs_the_trigger_read(emulated):
    emu = emulated()
    board, clock = open_board(emu)
    board.stage_image(synthetic_ifwi(9))
    start = time.perf_counter()
    with pytest.raises(VbflashError, match="after 1500 polls .*never started, psp_vbflash_status reads 0x0") as e:
        board.wait_for_psp()
    assert e.value.status == 0 and emu.updates == 0
    assert clock.sleeps == MAX_POLLS - 1 and clock.now() == pytest.approx(149.9)
    assert time.perf_counter() - start < 20                         # virtual time, not 150 s


def test_a_stuck_psp_holds_the_trigger_60_s_then_times_out_after_1500_polls(emulated):
    """PSP_SPIROM_UPDATE_TIMEOUT: the read blocks 60 s, then -ETIME; the PSP may still answer,
    so the status is polled on."""
    emu = emulated(outcome="stuck")
    board, clock = open_board(emu)
    board.stage_image(synthetic_ifwi(9))
    start = time.perf_counter()
    error = board.trigger()
    assert error is not None and error.errno == errno.ETIME and clock.now() == pytest.approx(60.0)
    with pytest.raises(VbflashError, match="after 1500 polls .*still busy, psp_vbflash_status reads 0x1"):
        board.wait_for_psp(error)
    assert clock.now() == pytest.approx(60.0 + 149.9) and time.perf_counter() - start < 20
    assert emu.state.image_size == 0                                # freed all the same


def test_a_psp_slower_than_the_drivers_wait_is_still_seen_to_succeed(emulated):
    emu = emulated(busy=75.0)
    board, clock = open_board(emu)
    board.stage_image(synthetic_ifwi(9))
    error = board.trigger()
    assert error is not None and error.errno == errno.ETIME
    status, polls = board.wait_for_psp(error)
    assert status == 0x80000000 and emu.updates == 1
    assert 75.0 <= clock.now() <= 75.2 and polls in (151, 152)          # 100 ms polls after the 60 s


def test_a_psp_failure_code_ends_the_wait_at_once(emulated):
    emu = emulated(outcome="error", error_status=0x80000005, busy=0.2)
    board, clock = open_board(emu)
    board.stage_image(synthetic_ifwi(9))
    error = board.trigger()
    assert error is not None and error.errno == errno.EIO
    with pytest.raises(VbflashError, match="PSP reported failure: reading psp_vbflash failed with EIO and "
                                           r"psp_vbflash_status is 0x80000005 \(status code 0x0005\)") as e:
        board.wait_for_psp(error)
    assert e.value.status == 0x80000005 and emu.updates == 0 and clock.sleeps == 0


def test_the_modelled_psp_rejects_an_image_without_partition_a(emulated):
    emu = emulated()
    image = bytearray(synthetic_ifwi(9))
    image[0x12000:0x12020] = b"\xff" * 0x20
    with pytest.raises(VbflashError, match=f"{PSP_REJECTED:#010x}"):
        flash_update(emu, bytes(image))


def test_a_trigger_with_nothing_staged_fails_at_once_with_einval(emulated):
    """The driver's read returns -EINVAL when vbflash_image_size is 0: no polling for 150 s."""
    emu = emulated()
    board, clock = open_board(emu)
    error = board.trigger()
    assert error is not None and error.errno == errno.EINVAL
    with pytest.raises(VbflashError, match="nothing staged to hand to the PSP: reading psp_vbflash failed with EINVAL"):
        board.wait_for_psp(error)
    assert clock.sleeps == 0 and emu.handed_over == []


def test_a_psp_that_is_not_ready_gets_nothing_and_says_so_at_the_first_poll(emulated):
    emu = emulated(outcome="not_ready")
    board, clock = open_board(emu)
    board.stage_image(synthetic_ifwi(9))
    error = board.trigger()
    assert error is not None and error.errno == errno.ETIME and emu.handed_over == []
    with pytest.raises(VbflashError, match="did not start the update .*Timer expired"):
        board.wait_for_psp(error)
    assert clock.sleeps == 0 and emu.state.image_size == 0


def test_status_that_is_not_a_number(emulated, monkeypatch):
    emu = emulated()
    board, _ = open_board(emu)
    monkeypatch.setattr(board, "_read_attr", lambda path: b"busy\n")
    with pytest.raises(VbflashError, match="reads 'busy', not a number"):
        board.read_status()


# -- the driver's buffer: it adds up every write, across opens -------------------------------------

def test_the_kernel_adds_every_write_to_what_it_holds_and_triggers_all_of_it(emulated):
    """amdgpu_psp_vbflash_write: memcpy at the offset, vbflash_image_size += count, whoever wrote."""
    emu = emulated()
    old, new = synthetic_ifwi(7), synthetic_ifwi(9)
    emu.stage_leftover(old[:0x100000])                       # an interrupted run's first MiB
    emu.stage_leftover(new)                                  # a second writer, from offset 0 again
    assert emu.state.image_size == 0x100000 + len(new)
    board, _ = open_board(emu)
    board.trigger()
    # The PSP gets 3 MiB: the second writer's image, then 1 MiB the buffer held past it.
    assert emu.handed_over == [f"{0x300000:#x} {hashlib.sha256(new + bytes(0x100000)).hexdigest()}"]


def test_a_write_finding_the_size_over_the_limit_gets_enomem_and_frees_the_buffer(emulated):
    emu = emulated(limit=0x300000)
    emu.stage_leftover(bytes(0x200000))
    board, _ = open_board(emu)
    with pytest.raises(VbflashError, match="refused the image at 0x101000 of 0x200000 bytes \\(ENOMEM"):
        board.stage_image(synthetic_ifwi(9))                 # what amdflash did before clearing first
    assert emu.state.image_size == 0 and not emu.state.allocated and emu.state.heap_overflows == 0


@pytest.mark.parametrize("limit", [0x300000, 0x1000000])
def test_clearing_empties_the_buffer_by_the_overflow_rule_and_measures_the_limit(emulated, limit):
    emu = emulated(limit=limit)
    emu.stage_leftover(bytes(0x180000))
    board, clock = open_board(emu)
    accepted = board.clear_staging()
    assert accepted == limit - 0x180000 + 0x1000 and emu.state.image_size == 0
    assert board.kernel_limit() == limit
    assert emu.state.heap_overflows == 0 and emu.handed_over == [] and clock.now() == 0


@pytest.mark.parametrize("limit", [0x300000, 0x1000000])
def test_an_image_over_3_mib_follows_the_running_kernels_limit(emulated, limit):
    """667b96134c9e raised AMD_VBIOS_FILE_MAX_SIZE_B from 3 to 16 MiB: an image between the two
    is written on a kernel that takes it and refused, before a byte of it is written, on one that
    does not — never written past the buffer's end."""
    emu = emulated(limit=limit)
    image = synthetic_ifwi(9) + bytes(0x100000) + bytes(0x2000)        # 3 MiB + 8 KiB
    board, _ = open_board(emu)
    if limit < len(image):
        with pytest.raises(VbflashError, match="this kernel's psp_vbflash takes at most 0x300000 .*667b96134c9e"):
            board.stage_image(image)
        assert emu.state.image_size == 0
    else:
        board.stage_image(image)
        assert board.wait_for_psp(board.trigger())[0] == 0x80000000
        assert emu.handed_over == [f"{len(image):#x} {hashlib.sha256(image).hexdigest()}"]
    assert emu.state.heap_overflows == 0 and emu.state.heap_overreads == 0


def test_no_kernel_takes_more_than_16_mib(emulated):
    board, _ = open_board(emulated())
    with pytest.raises(VbflashError, match="no amdgpu driver takes more than 0x1000000"):
        board.stage_image(bytes(0x1000001))


def test_a_kernel_that_never_refuses_is_not_guessed_at(emulated, monkeypatch):
    monkeypatch.setattr(amdgpu, "CLEAR_BOUND", 0x10000)
    board, _ = open_board(emulated())
    with pytest.raises(VbflashError, match="without the ENOMEM its overflow rule gives .*reboot to empty it"):
        board.clear_staging()


def test_a_reboot_empties_the_buffer_and_changes_the_boot_id(emulated):
    emu = emulated()
    board, _ = open_board(emu)
    boot = board.boot_id()
    emu.stage_leftover(bytes(0x1000))
    emu.reboot()
    assert emu.state.image_size == 0 and board.boot_id() not in (None, boot)


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
    from tests.stages.image.test_realdata import realdata

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
