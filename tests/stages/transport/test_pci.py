"""Native PCIe through sysfs, on a fake sysfs tree in a temporary directory.

A file-backed resource5 has no register behaviour; what is tested here is discovery, the
driver refusal and the unbind path, enabling, the mapping and its access widths, and
config space. Register behaviour is covered through the other transports.
"""
from __future__ import annotations

import struct
from pathlib import Path

import pytest

from amdflash.stages.drivers.navi31 import regs as R
from amdflash.stages.transport import discovery, pci
from amdflash.stages.transport.base import TransportError, WallClock
from amdflash.stages.transport.lock import BoardBusy
from amdflash.stages.transport.pci import BAR5_SIZE, DriverBound, DriverStillBound, PciBar5, find_devices
from tests.stages.transport.conftest import run_cli

NAVI = "0000:03:00.0"
BOUND = "0000:0b:00.0"
OTHER = "0000:00:02.0"


def fake_device(root: Path, address: str, vendor: int = 0x1002, device: int = 0x744C,
                driver: str | None = None, resource_size: int = BAR5_SIZE) -> Path:
    d = root / "devices" / address
    d.mkdir(parents=True)
    (d / "vendor").write_text(f"0x{vendor:04x}\n")
    (d / "device").write_text(f"0x{device:04x}\n")
    (d / "class").write_text("0x030000\n")
    (d / "enable").write_text("0\n")
    config = bytearray(256)
    struct.pack_into("<HH", config, 0x00, vendor, device)
    struct.pack_into("<I", config, 0x08, 0x030000C8)           # class code, revision
    (d / "config").write_bytes(bytes(config))
    with open(d / "resource5", "wb") as f:
        f.truncate(resource_size)
    if driver:
        drv = root / "drivers" / driver
        drv.mkdir(parents=True, exist_ok=True)
        (drv / "unbind").write_text("")
        (d / "driver").symlink_to(drv)
    return d


@pytest.fixture
def sysfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "sys"
    fake_device(root, NAVI)
    fake_device(root, BOUND, driver="amdgpu")
    fake_device(root, OTHER, vendor=0x8086, device=0x46A6, driver="i915")
    monkeypatch.setenv(discovery.ENV_SYSFS_PCI, str(root / "devices"))
    return root


def devices(sysfs: Path) -> dict:
    return {d.address: d for d in find_devices(sysfs / "devices")}


@pytest.fixture
def open_bar(sysfs: Path):
    bars: list[PciBar5] = []

    def make(address: str = NAVI, **options) -> PciBar5:  # noqa: ANN003
        bar = PciBar5(devices(sysfs)[address], **options)
        bars.append(bar)
        return bar

    yield make
    for bar in bars:
        bar.close()


def test_discovery_finds_navi31_functions_in_address_order(sysfs, tmp_path):
    found = find_devices(sysfs / "devices")
    assert [(d.address, d.driver) for d in found] == [(NAVI, None), (BOUND, "amdgpu")]
    assert found[0].spec == f"pci:{NAVI}" and (found[0].vendor_id, found[0].device_id) == (0x1002, 0x744C)
    assert find_devices(tmp_path / "nowhere") == []


def test_a_bound_driver_is_refused_naming_what_unbinding_would_do(sysfs, open_bar):
    with pytest.raises(DriverBound) as err:
        open_bar(BOUND)
    message = str(err.value)
    assert message.startswith("board busy (kernel driver amdgpu is bound to 0000:0b:00.0)")
    assert f"--unbind-driver would write '{BOUND}' to {sysfs / 'devices' / BOUND / 'driver' / 'unbind'}" in message
    assert isinstance(err.value, BoardBusy)                      # the CLI maps it to exit 2
    assert (sysfs / "drivers" / "amdgpu" / "unbind").read_text() == ""
    assert (sysfs / "devices" / BOUND / "enable").read_text().strip() == "0"


def kernel_unbinds(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the kernel does on a write to `unbind`: the device's driver link goes away."""
    original = pci.write_unbind

    def unbind(unbind_file: Path, address: str) -> None:
        original(unbind_file, address)
        (unbind_file.parent.parent / "driver").unlink()      # <device>/driver/unbind -> <device>/driver

    monkeypatch.setattr(pci, "write_unbind", unbind)


def test_unbinding_writes_the_address_to_the_drivers_unbind_file(sysfs, open_bar, monkeypatch):
    kernel_unbinds(monkeypatch)
    messages: list[str] = []
    bar = open_bar(BOUND, unbind_driver=True, announce=messages.append)
    assert (sysfs / "drivers" / "amdgpu" / "unbind").read_text() == BOUND
    assert any("unbinding kernel driver amdgpu" in m for m in messages)
    assert bar.identity.extra["unbound_driver"] == "amdgpu"
    assert not (sysfs / "devices" / BOUND / "driver").exists()


def test_a_driver_still_bound_after_unbind_is_refused_untouched(sysfs, open_bar):
    # Nothing here plays the kernel: the driver link survives the write to `unbind`.
    with pytest.raises(DriverStillBound) as err:
        open_bar(BOUND, unbind_driver=True, announce=lambda m: None)
    assert "still bound to 0000:0b:00.0 after writing" in str(err.value)
    assert isinstance(err.value, BoardBusy)                      # exit 2: nothing was written
    assert (sysfs / "devices" / BOUND / "enable").read_text().strip() == "0"


def test_enable_is_set_while_open_and_restored_at_close(sysfs, open_bar):
    enable = sysfs / "devices" / NAVI / "enable"
    bar = open_bar()
    assert enable.read_text().strip() == "1"
    bar.close()
    assert enable.read_text().strip() == "0"
    bar.close()                                                  # idempotent
    with pytest.raises(TransportError, match="after close"):
        bar.read32(0)


def test_a_device_enabled_by_someone_else_stays_enabled(sysfs, open_bar):
    enable = sysfs / "devices" / NAVI / "enable"
    enable.write_text("1\n")
    open_bar().close()
    assert enable.read_text().strip() == "1"


def test_identity_and_clock(open_bar):
    bar = open_bar()
    idt = bar.identity
    assert (idt.spec, idt.kind, idt.pci_address) == (f"pci:{NAVI}", "pci", NAVI)
    assert (idt.vendor_id, idt.device_id) == (0x1002, 0x744C)
    assert isinstance(bar.clock, WallClock)


def test_registers_and_blocks_land_in_resource5_little_endian(sysfs, open_bar):
    bar = open_bar()
    resource = sysfs / "devices" / NAVI / "resource5"
    bar.write32(R.ROM_SW_STATUS, 0x12345678)
    with open(resource, "rb") as f:
        f.seek(R.ROM_SW_STATUS)
        assert f.read(4) == bytes((0x78, 0x56, 0x34, 0x12))
    with open(resource, "r+b") as f:
        f.seek(R.ROM_CNTL)
        f.write((0x0A000002).to_bytes(4, "little"))
    assert bar.read32(R.ROM_CNTL) == 0x0A000002
    window = bytes(range(256))
    bar.write_block(R.ROM_SW_DATA, window)
    assert bar.read_block(R.ROM_SW_DATA, 256) == window
    assert resource.read_bytes()[R.ROM_SW_DATA:R.ROM_SW_DATA + 256] == window


class RecordingMmio:
    """Stands in for the 'I'-format view: records every access, refuses anything but one dword."""

    def __init__(self, view: memoryview):
        self.view = view
        self.accesses: list[tuple[str, int]] = []

    def __getitem__(self, index: object) -> int:
        assert isinstance(index, int), f"MMIO read with {index!r}: only single dwords are allowed"
        self.accesses.append(("load", index))
        return self.view[index]

    def __setitem__(self, index: object, value: int) -> None:
        assert isinstance(index, int), f"MMIO write with {index!r}: only single dwords are allowed"
        self.accesses.append(("store", index))
        self.view[index] = value


def test_mmio_is_only_ever_aligned_32_bit_loads_and_stores(open_bar):
    bar = open_bar()
    assert bar.mmio.format == "I" and bar.mmio.itemsize == 4 and bar.mmio.nbytes == BAR5_SIZE
    recorder = RecordingMmio(bar.mmio)
    bar.mmio = recorder
    bar.write_block(0x100, bytes(16))
    bar.read_block(0x100, 16)
    bar.read32(0x200)
    bar.write32(0x204, 1)
    assert recorder.accesses == ([("store", 0x40 + i) for i in range(4)] + [("load", 0x40 + i) for i in range(4)]
                                 + [("load", 0x80), ("store", 0x81)])
    bar.mmio = recorder.view
    for call in (lambda: bar.read32(2), lambda: bar.write32(BAR5_SIZE, 0), lambda: bar.read_block(0, 6)):
        with pytest.raises(ValueError, match="dword-aligned"):
            call()


def test_config_space_reads_through_the_config_file(open_bar):
    bar = open_bar()
    assert bar.config_read(0) == 0x744C1002
    assert bar.config_read(2, 2) == 0x744C
    assert bar.config_read(0x0B, 1) == 0x03                       # base class: display
    with pytest.raises(ValueError, match="naturally aligned"):
        bar.config_read(1, 2)
    with pytest.raises(TransportError, match="beyond 64 bytes needs root"):
        bar.config_read(0x100)                                   # the fake file is 256 bytes


def test_a_config_space_that_disagrees_with_sysfs_is_refused(sysfs, open_bar):
    (sysfs / "devices" / NAVI / "config").write_bytes(struct.pack("<HH", 0x1002, 0x73BF) + bytes(252))
    with pytest.raises(TransportError, match="config space reads 1002:73bf"):
        open_bar()
    assert (sysfs / "devices" / NAVI / "enable").read_text().strip() == "0"


def test_a_short_resource5_is_refused_and_enable_is_restored(tmp_path):
    root = tmp_path / "short"
    fake_device(root, NAVI, resource_size=0x1000)
    [device] = find_devices(root / "devices")
    with pytest.raises(TransportError, match="BAR5 .* is 0x1000 bytes"):
        PciBar5(device)
    assert (root / "devices" / NAVI / "enable").read_text().strip() == "0"


# -- specs and the CLI ---------------------------------------------------------------------------

def test_pci_specs_select_by_address_and_lock_by_address(sysfs):
    from amdflash.stages.open_transport import open_transport, parse_spec

    for spec in ("pci", f"pci:{NAVI}", "pci:03:00.0", "auto"):
        bar, lock = open_transport(parse_spec(spec), lambda m: None)
        try:
            assert bar.identity.pci_address == NAVI and lock.key == f"pci:{NAVI}"
            with pytest.raises(BoardBusy):
                open_transport(parse_spec(f"pci:{NAVI}"), lambda m: None)
        finally:
            bar.close()
            lock.release()
    with pytest.raises(TransportError, match=f"pci:0000:05:00.0: no Navi31 at this address \\(found: {NAVI}, {BOUND}"):
        open_transport(parse_spec("pci:0000:05:00.0"), lambda m: None)


def test_cli_refuses_a_bound_device_with_exit_2_and_unbind_driver_unbinds_it(sysfs, tmp_path):
    env = {discovery.ENV_SYSFS_PCI: str(sysfs / "devices")}
    refused = run_cli(tmp_path, "info", "--board", f"pci:{BOUND}", env=env)
    assert refused.returncode == 2, refused.stderr
    assert "board busy (kernel driver amdgpu is bound to 0000:0b:00.0)" in refused.stderr
    assert "--unbind-driver would write" in refused.stderr and "Traceback" not in refused.stderr
    assert (sysfs / "drivers" / "amdgpu" / "unbind").read_text() == ""

    # The fake sysfs has no kernel behind it: the driver stays bound, and the run is refused.
    unbound = run_cli(tmp_path, "info", "--board", f"pci:{BOUND}", "--unbind-driver", env=env)
    assert (sysfs / "drivers" / "amdgpu" / "unbind").read_text() == BOUND
    assert unbound.returncode == 2 and "is still bound to 0000:0b:00.0 after writing" in unbound.stderr, \
        unbound.stderr

    helped = run_cli(tmp_path, "info", "--help")
    assert helped.returncode == 0 and "--unbind-driver" in helped.stdout and "unbind" in helped.stdout


def test_cli_list_shows_native_devices(sysfs, tmp_path):
    env = {discovery.ENV_SYSFS_PCI: str(sysfs / "devices")}
    import json

    listed = run_cli(tmp_path, "list", "--format", "json", env=env)
    assert listed.returncode == 0, listed.stderr
    boards = json.loads(listed.stdout)
    assert [b["spec"] for b in boards] == [f"pci:{NAVI}", f"pci:{BOUND}"]
    assert boards[0]["pci_ids"] == "1002:744c" and boards[0]["driver"] is None
    assert "ROM_SW does not answer" in boards[0]["flash"]        # a plain file never reports done
    assert boards[1]["driver"] == "amdgpu" and "not probed" in boards[1]["status"]
    assert (sysfs / "drivers" / "amdgpu" / "unbind").read_text() == ""
