"""The emulated ASM24 bridge, driven through pyusb exactly as a driver would drive hardware."""
from __future__ import annotations

import array
import errno
import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import usb.core
import usb.util

from amdflash.stages.drivers.navi31 import regs as R
from amdflash.stages.sim import Board
from amdflash.stages.sim.state import F_USB_TRANSFERS
from amdflash.stages.sim.cost import ASM24
from amdflash.stages.sim.asm24_firmware import F_USB_DISCONNECTED
from amdflash.stages.sim.usb import SimUsbBackend

MEM_READ, MEM_WRITE = 0x20, 0x60
CFG_READ0, CFG_READ1, CFG_WRITE0, CFG_WRITE1 = 0x04, 0x05, 0x44, 0x45
BAR5_BASE = 0x1000_0000
GPU_BUS = 4


# -- a minimal host side -------------------------------------------------------------------------

@dataclass
class Completion:
    data: int
    status: int          # completion status (0 SC, 1 UR, 2 CRS, 4 CA)
    byte_count: int
    carried: bool
    ret: int             # return status (0 ok, 1 engine error, 0xFF poll timeout)


class CompletionError(RuntimeError):
    pass


class Host:
    """Just enough of docs/bridge.md to exercise the bridge: no retries, no cleverness."""

    def __init__(self, dev: usb.core.Device):
        self.dev = dev
        dev.set_configuration(1)
        usb.util.claim_interface(dev, 0)
        dev.set_interface_altsetting(0, 0)

    def xdata_read(self, addr: int, n: int) -> bytes:
        return bytes(self.dev.ctrl_transfer(0xC0, 0xE4, addr, 0, n))

    def xdata_write(self, addr: int, value: int) -> None:
        self.dev.ctrl_transfer(0x40, 0xE5, addr, value)

    def pcie_power(self, on: bool, timeout: int = 5000) -> None:
        self.dev.ctrl_transfer(0x40, 0xF3, int(on), 0, None, timeout)

    def link_state(self) -> int:
        return self.xdata_read(0xB450, 1)[0]

    def send(self, fmt: int, addr: int, value: int = 0, be: int = 0xF, mode: int = 0) -> None:
        payload = struct.pack("<III", addr & 0xFFFFFFFF, addr >> 32, value)
        assert self.dev.ctrl_transfer(0x40, 0xF0, fmt | be << 8, mode, payload) == 12

    def completion(self) -> Completion:
        raw = bytes(self.dev.ctrl_transfer(0xC0, 0xF0, 0, 0, 8))
        assert len(raw) == 8
        return Completion(int.from_bytes(raw[:4], "little"), raw[4] >> 5, (raw[4] & 0xF) << 8 | raw[5],
                          bool(raw[6] & 1), raw[7])

    def request(self, fmt: int, addr: int, value: int = 0, be: int = 0xF) -> Completion:
        self.send(fmt, addr, value, be)
        c = self.completion()
        if c.ret:
            raise CompletionError(f"return status {c.ret:#x}")
        if c.status:
            raise CompletionError(f"completion status {c.status}")
        return c

    def cfg_read(self, bus: int, reg: int, size: int = 4) -> int:
        offset = reg & 3
        c = self.request(CFG_READ1 if bus else CFG_READ0, bus << 24 | (reg & ~3), be=((1 << size) - 1) << offset)
        assert c.carried and c.byte_count == 4
        return c.data >> 8 * offset & ((1 << 8 * size) - 1)

    def cfg_write(self, bus: int, reg: int, value: int, size: int = 4) -> None:
        offset = reg & 3
        c = self.request(CFG_WRITE1 if bus else CFG_WRITE0, bus << 24 | (reg & ~3), value << 8 * offset,
                         ((1 << size) - 1) << offset)
        assert not c.carried and c.byte_count == 4

    def mem_read(self, addr: int, size: int = 4) -> int:
        offset = addr & 3
        c = self.request(MEM_READ, addr & ~3, be=((1 << size) - 1) << offset)
        assert c.carried and c.byte_count == size
        return c.data >> 8 * offset & ((1 << 8 * size) - 1)

    def mem_write(self, addr: int, value: int, size: int = 4) -> None:
        offset = addr & 3
        self.send(MEM_WRITE, addr & ~3, value << 8 * offset, ((1 << size) - 1) << offset)

    def stream_write(self, addr: int, data: bytes) -> int:
        self.send(MEM_WRITE, addr, len(data) // 4, mode=1)
        return self.dev.write(0x02, data)

    def arm_read(self, addr: int, dwords: int) -> None:
        self.send(MEM_READ, addr, dwords, mode=2)

    def stream_read(self, addr: int, size: int) -> bytes:
        self.arm_read(addr, size // 4)
        return bytes(self.dev.read(0x81, size))

    def bring_up(self) -> None:
        """The bring-up of docs/bridge.md: bridges, Resizable BAR, BAR placement, command registers."""
        for bus in range(4):
            self.cfg_write(bus, 0x18, (bus + 1) << 8 | 4 << 16)
            self.cfg_write(bus, 0x20, 0x1000, 2)
            self.cfg_write(bus, 0x22, 0xFFFF, 2)
            self.cfg_write(bus, 0x24, 0x0000, 2)
            self.cfg_write(bus, 0x26, 0xFFFF, 2)
            self.cfg_write(bus, 0x28, 8)
            self.cfg_write(bus, 0x2C, 0xFFFFFFFF)
            self.cfg_write(bus, 0x04, 7, 2)
        rebar = self.find_ext_cap(0x15)
        supported = self.cfg_read(GPU_BUS, rebar + 4) >> 4
        control = self.cfg_read(GPU_BUS, rebar + 8)
        self.cfg_write(GPU_BUS, rebar + 8, control & ~0x3F00 | (supported.bit_length() - 1) << 8)
        cursors = {True: 0x8_0000_0000, False: 0x1000_0000}
        bar = 0
        while bar < 6:
            reg = 0x10 + 4 * bar
            size, is64, prefetch, io = self.size_bar(bar)
            if size and not io:
                base = cursors[prefetch]
                self.cfg_write(GPU_BUS, reg, base & 0xFFFFFFFF)
                if is64:
                    self.cfg_write(GPU_BUS, reg + 4, base >> 32)
                cursors[prefetch] = base + max(size, 0x200000)
            bar += 2 if is64 else 1
        self.cfg_write(GPU_BUS, 0x04, 7, 2)

    def size_bar(self, bar: int) -> tuple[int, bool, bool, bool]:
        reg = 0x10 + 4 * bar
        self.cfg_write(GPU_BUS, reg, 0xFFFFFFFF)
        low = self.cfg_read(GPU_BUS, reg)
        if low & 1:
            return (~(low & ~3) + 1) & 0xFFFFFFFF, False, False, True
        is64, prefetch = low & 6 == 4, bool(low & 8)
        mask = low & ~0xF
        if is64:
            self.cfg_write(GPU_BUS, reg + 4, 0xFFFFFFFF)
            mask |= self.cfg_read(GPU_BUS, reg + 4) << 32
            return (~mask + 1) & (1 << 64) - 1, True, prefetch, False
        return (~mask + 1) & 0xFFFFFFFF, False, prefetch, False

    def ext_caps(self) -> Iterator[tuple[int, int]]:
        offset = 0x100
        while offset:
            header = self.cfg_read(GPU_BUS, offset)
            yield offset, header & 0xFFFF
            offset = header >> 20 & 0xFFC

    def find_ext_cap(self, cap_id: int) -> int:
        return next(offset for offset, found in self.ext_caps() if found == cap_id)


# -- fixtures ----------------------------------------------------------------------------------

@pytest.fixture
def open_backend():
    backends: list[SimUsbBackend] = []

    def make(boards, **options) -> SimUsbBackend:
        backend = SimUsbBackend(boards, **options)
        backends.append(backend)
        return backend

    yield make
    for backend in backends:
        backend.close()


def bridges(backend: SimUsbBackend, vendor: int = 0xADD1) -> list[usb.core.Device]:
    return list(usb.core.find(find_all=True, backend=backend, idVendor=vendor, idProduct=0x0001))


@pytest.fixture
def rig(make_board, open_backend):
    """(host, board) for one bridge whose link is up and whose GPU is brought up."""
    backend = open_backend([make_board()])
    [dev] = bridges(backend)
    host = Host(dev)
    host.bring_up()
    return host, backend.bridges[0].board


def serial_of(path) -> str:
    return json.loads((path / "board.json").read_text())["serial"]


def stats(board: Board) -> dict[str, float]:
    return board.stats()


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


# -- identity ----------------------------------------------------------------------------------

def test_descriptors_and_strings_as_pyusb_sees_them(make_board, open_backend):
    path = make_board()
    backend = open_backend([path])
    [dev] = bridges(backend)
    assert (dev.bLength, dev.bDescriptorType, dev.bcdUSB) == (18, 1, 0x0320)
    assert (dev.bDeviceClass, dev.bMaxPacketSize0, dev.bcdDevice, dev.bNumConfigurations) == (0, 9, 0x0001, 1)
    assert dev.speed == 4 and dev.port_numbers == (dev.port_number,)
    assert usb.util.get_string(dev, dev.iManufacturer) == "tiny"
    assert usb.util.get_string(dev, dev.iProduct).startswith("custom")
    serial = serial_of(path)
    assert dev.serial_number == serial and len(serial) == 8 and serial == serial.lower()
    assert dev.langids == (0x0409,)

    cfg = dev[0]
    # Interface 0 has two alternate settings, as the firmware's descriptor lists them:
    # 0 with the protocol's two bulk endpoints, 1 for UAS (121 bytes in all).
    assert (cfg.bConfigurationValue, cfg.bNumInterfaces, cfg.wTotalLength) == (1, 1, 121)
    interfaces = list(cfg)                              # iteration stops at the IndexError
    assert [(i.bInterfaceNumber, i.bAlternateSetting) for i in interfaces] == [(0, 0), (0, 1)]
    intf = interfaces[0]
    assert (intf.bInterfaceClass, intf.bInterfaceSubClass, intf.bInterfaceProtocol) == (0xFF, 0xFF, 0xFF)
    eps = {ep.bEndpointAddress: ep for ep in intf}
    assert set(eps) == {0x81, 0x02}
    assert all(ep.bmAttributes == 2 and ep.wMaxPacketSize == 1024 for ep in eps.values())
    assert list(eps[0x81].extra_descriptors)[:2] == [6, 0x30]   # SuperSpeed companion
    uas = {ep.bEndpointAddress: list(ep.extra_descriptors) for ep in interfaces[1]}
    assert set(uas) == {0x81, 0x02, 0x83, 0x04}
    assert {extra[8] for extra in uas.values()} == {3, 4, 2, 1}     # pipe usage: status, command, data
    with pytest.raises(IndexError):
        backend.get_interface_descriptor(backend.bridges[0], 0, 2, 0)
    with pytest.raises(IndexError):
        backend.get_endpoint_descriptor(backend.bridges[0], 2, 0, 0, 0)

    # The raw descriptors agree with the parsed ones.
    raw = bytes(dev.ctrl_transfer(0x80, 6, 0x0100, 0, 64))
    assert len(raw) == 18 and struct.unpack_from("<HH", raw, 8) == (0xADD1, 0x0001)
    raw_cfg = bytes(dev.ctrl_transfer(0x80, 6, 0x0200, 0, 255))
    assert len(raw_cfg) == 121 and raw_cfg[:2] == b"\x09\x02"
    assert bytes(dev.ctrl_transfer(0x80, 6, 0x0200, 0, 9)) == raw_cfg[:9]

    hub = dev.parent
    assert (hub.idVendor, hub.idProduct, hub.bDeviceClass) == (0x1D6B, 0x0003, 9)
    assert hub.parent is None and hub.bus == dev.bus


def test_vendor_3801_per_bridge(make_board, open_backend):
    a, b = make_board(), make_board()
    backend = open_backend([a, (b, {"vendor_id": 0x3801})])
    assert len(bridges(backend, 0xADD1)) == 1
    [newer] = bridges(backend, 0x3801)
    assert newer.serial_number == serial_of(b)


def test_two_bridges_are_told_apart(make_board, open_backend):
    paths = [make_board(), make_board()]
    backend = open_backend(paths)
    devs = bridges(backend)
    assert len(devs) == 2
    assert len({(d.bus, d.address) for d in devs}) == 2
    assert {d.serial_number for d in devs} == {serial_of(p) for p in paths}
    # Each bridge reaches its own board.
    for dev, bridge in zip(devs, backend.bridges):
        host = Host(dev)
        host.bring_up()
        host.mem_write(BAR5_BASE + R.ROM_SW_STATUS, int(dev.serial_number, 16))
        assert bridge.board.get32(R.ROM_SW_STATUS) == int(dev.serial_number, 16)


def test_standard_request_handling(make_board, open_backend):
    backend = open_backend([make_board()])
    [dev] = bridges(backend)
    assert dev.get_active_configuration().bConfigurationValue == 1   # from the host's cache
    host = Host(dev)
    with pytest.raises(usb.core.USBTimeoutError):
        dev.ctrl_transfer(0x80, 0x00, 0, 0, 2, timeout=50)           # GET_STATUS: never answered
    with pytest.raises(usb.core.USBTimeoutError):
        dev.ctrl_transfer(0xC0, 0x99, 0, 0, 4, timeout=50)           # unknown vendor IN
    assert dev.ctrl_transfer(0x40, 0x99, 0, 0) == 0                  # no data stage: acknowledged
    with pytest.raises(usb.core.USBTimeoutError):
        dev.ctrl_transfer(0x80, 6, 0x0600, 0, 10, timeout=50)        # no device qualifier
    assert dev.ctrl_transfer(0x80, 6, 0x0F00, 0, 5)[0] == 5          # BOS header
    # SET_CONFIGURATION with the interface claimed is refused by the kernel.
    with pytest.raises(usb.core.USBError) as busy:
        dev.set_configuration(1)
    assert busy.value.errno == errno.EBUSY
    usb.util.release_interface(dev, 0)
    dev.set_configuration(1)
    # Set the kernel driver question: none is bound, so detaching is an error.
    assert not dev.is_kernel_driver_active(0)
    with pytest.raises(usb.core.USBError) as none:
        dev.detach_kernel_driver(0)
    assert none.value.errno == errno.ENOENT
    assert host.link_state() == 0x78


def test_kernel_driver_must_be_detached_before_claiming(make_board, open_backend):
    backend = open_backend([make_board()], kernel_driver=True)
    [dev] = bridges(backend)
    assert dev.is_kernel_driver_active(0)
    with pytest.raises(usb.core.USBError) as busy:
        usb.util.claim_interface(dev, 0)
    assert busy.value.errno == errno.EBUSY
    dev.detach_kernel_driver(0)
    Host(dev)                                                        # now opens as docs/bridge.md says


def test_the_root_hub_is_never_claimed_nor_its_setting_changed(make_board, open_backend):
    """The hub driver keeps the root hub: it cannot be detached, claimed or have its alternate
    setting selected; what it does not support stalls."""
    backend = open_backend([make_board()])
    [hub] = list(usb.core.find(find_all=True, backend=backend, idVendor=0x1D6B))
    with pytest.raises(usb.core.USBError) as busy:
        hub.detach_kernel_driver(0)
    assert busy.value.errno == errno.EBUSY
    with pytest.raises(usb.core.USBError) as claimed:
        usb.util.claim_interface(hub, 0)
    assert claimed.value.errno == errno.EBUSY
    with pytest.raises(usb.core.USBError) as unclaimed:
        hub.set_interface_altsetting(0, 0)
    assert unclaimed.value.errno in (errno.EBUSY, errno.ENOENT)
    with pytest.raises(usb.core.USBError) as stall:
        hub.ctrl_transfer(0xC0, 0xE4, 0xB450, 0, 1)
    assert stall.value.errno == errno.EPIPE


# -- XDATA and the link ------------------------------------------------------------------------

def test_xdata_read_and_write(make_board, open_backend):
    backend = open_backend([make_board()])
    host = Host(bridges(backend)[0])
    for i, value in enumerate(b"\x12\x34\x56"):
        host.xdata_write(0x5000 + i, value)
    assert host.xdata_read(0x5000, 3) == b"\x12\x34\x56"
    assert len(host.xdata_read(0x4000, 400)) == 400
    assert len(host.xdata_read(0x4000, 600)) == 512                 # at most 512 bytes a request (USB 3)
    host.xdata_write(0xB450, 0)                                      # the link state is read-only
    assert host.link_state() == 0x78


def test_link_up_at_boot(make_board, open_backend):
    host = Host(bridges(open_backend([make_board()]))[0])
    assert host.link_state() == 0x78
    assert host.cfg_read(0, 0) != 0xFFFFFFFF


def test_link_down_at_boot_comes_up_with_f3(make_board, open_backend):
    backend = open_backend([make_board()], pcie_on_at_boot=False)
    host = Host(bridges(backend)[0])
    board = backend.bridges[0].board
    assert host.link_state() != 0x78
    host.send(CFG_READ0, 0)
    assert host.completion().ret == 1                                # the engine cannot send it
    before = board.clock.now()
    host.pcie_power(True)
    assert host.link_state() == 0x78
    assert board.clock.now() - before >= 0.1                         # training takes time
    assert host.cfg_read(0, 0) & 0xFFFF == 0x1B21


def test_link_that_never_comes_up(make_board, open_backend):
    backend = open_backend([make_board()], pcie_on_at_boot=False, link_trains=False)
    host = Host(bridges(backend)[0])
    board = backend.bridges[0].board
    before = board.clock.now()
    host.pcie_power(True)
    assert host.link_state() != 0x78
    assert board.clock.now() - before >= 2.0
    with pytest.raises(usb.core.USBTimeoutError):
        host.pcie_power(True, timeout=100)                           # the host gives up first
    assert host.link_state() != 0x78


def test_power_off_resets_the_hierarchy(rig):
    host, _ = rig
    assert host.cfg_read(GPU_BUS, 0) == 0x744C1002
    host.pcie_power(False)
    assert host.link_state() != 0x78
    host.pcie_power(True)
    assert host.link_state() == 0x78
    with pytest.raises(CompletionError, match="status 1"):
        host.cfg_read(1, 0)                                          # bus numbers are gone


# -- configuration space -----------------------------------------------------------------------

def test_bridge_config_headers(make_board, open_backend):
    host = Host(bridges(open_backend([make_board()]))[0])
    assert host.cfg_read(0, 0x0E, 1) & 0x7F == 1                     # type 1 header
    assert host.cfg_read(0, 0x08) >> 8 == 0x060400
    with pytest.raises(CompletionError, match="status 1"):
        host.cfg_read(1, 0)                                          # bus 1 not enumerated yet
    host.cfg_write(0, 0x18, 1 << 8 | 4 << 16)
    assert host.cfg_read(0, 0x18) == 0x00040100
    assert host.cfg_read(0, 0x19, 1) == 1
    assert host.cfg_read(1, 0) & 0xFFFF == 0x1B21                    # reachable through bus 0
    with pytest.raises(CompletionError, match="status 1"):
        host.cfg_read(2, 0)                                          # bus 1's bridge not programmed
    with pytest.raises(CompletionError, match="status 1"):
        host.cfg_read(5, 0)                                          # beyond the subordinate bus
    with pytest.raises(CompletionError, match="status 1"):
        host.request(CFG_READ1, 1 << 24 | 1 << 19)                   # device 1: nobody there
    # Byte-enabled writes touch only their bytes; read-only fields stay.
    host.cfg_write(0, 0x20, 0x1230, 2)
    host.cfg_write(0, 0x22, 0xFFFF, 2)
    assert host.cfg_read(0, 0x20) == 0xFFF01230
    host.cfg_write(0, 0x00, 0xFFFFFFFF)
    assert host.cfg_read(0, 0x00) & 0xFFFF == 0x1B21
    # A bus beyond a bridge's subordinate number is not forwarded, even if a bridge further
    # down would claim it.
    host.cfg_write(0, 0x18, 1 << 8 | 1 << 16)
    host.cfg_write(1, 0x18, 1 | 2 << 8 | 4 << 16)
    assert host.cfg_read(1, 0x18) == 0x00040201
    with pytest.raises(CompletionError, match="status 1"):
        host.cfg_read(2, 0)
    host.cfg_write(0, 0x18, 1 << 8 | 4 << 16)
    assert host.cfg_read(2, 0) & 0xFFFF == 0x1002
    # A type 0 request goes to the device on the engine's link, whatever bus it names.
    assert host.request(CFG_READ0, 3 << 24).data == host.cfg_read(0, 0)


def test_gpu_identity_bars_and_rebar(make_board, open_backend):
    host = Host(bridges(open_backend([make_board()]))[0])
    for bus in range(4):
        host.cfg_write(bus, 0x18, (bus + 1) << 8 | 4 << 16)
    assert host.cfg_read(GPU_BUS, 0x00) == 0x744C1002
    assert host.cfg_read(GPU_BUS, 0x08) >> 16 == 0x0300
    assert host.cfg_read(GPU_BUS, 0x0E, 1) & 0x7F == 0

    assert host.size_bar(0) == (256 << 20, True, True, False)
    assert host.size_bar(2) == (2 << 20, True, True, False)
    assert host.size_bar(4)[3] and host.size_bar(4)[0] == 256
    assert host.size_bar(5) == (1 << 20, False, False, False)
    assert host.cfg_read(GPU_BUS, 0x24) == 0xFFF00000

    caps = list(host.ext_caps())
    assert caps[0][0] == 0x100 and 0x15 in [cap for _, cap in caps]
    rebar = host.find_ext_cap(0x15)
    supported = host.cfg_read(GPU_BUS, rebar + 4) >> 4
    assert supported.bit_length() - 1 == 15                          # up to 32 GiB
    control = host.cfg_read(GPU_BUS, rebar + 8)
    assert control & 7 == 0 and control >> 5 & 7 >= 1 and control >> 8 & 0x3F == 8
    host.cfg_write(GPU_BUS, rebar + 8, control & ~0x3F00 | 15 << 8)
    assert host.size_bar(0)[0] == 32 << 30
    host.cfg_write(GPU_BUS, rebar + 8, control & ~0x3F00 | 3 << 8)  # 8 MiB is not supported
    assert host.cfg_read(GPU_BUS, rebar + 8) >> 8 & 0x3F == 15
    assert host.size_bar(0)[0] == 32 << 30

    # Placement: a 64-bit BAR keeps its upper dword; address bits below the size read 0.
    host.cfg_write(GPU_BUS, 0x10, 0x0000000C)
    host.cfg_write(GPU_BUS, 0x14, 0x8)
    assert (host.cfg_read(GPU_BUS, 0x10), host.cfg_read(GPU_BUS, 0x14)) == (0xC, 0x8)
    host.cfg_write(GPU_BUS, 0x24, 0x1234_5678)
    assert host.cfg_read(GPU_BUS, 0x24) == 0x1230_0000


def test_gpu_device_id_is_an_option(make_board, open_backend):
    backend = open_backend([make_board()], gpu_device_id=0x73BF)
    host = Host(bridges(backend)[0])
    host.bring_up()
    assert host.cfg_read(GPU_BUS, 0) == 0x73BF1002


# -- memory TLPs -------------------------------------------------------------------------------

def test_mode0_register_access_reaches_the_board(rig):
    host, board = rig
    assert host.mem_read(BAR5_BASE + R.ROM_CNTL) == 0x0A000002
    host.mem_write(BAR5_BASE + R.ROM_SW_STATUS, 0x12345678)
    assert board.get32(R.ROM_SW_STATUS) == 0x12345678
    assert host.mem_read(BAR5_BASE + R.ROM_SW_STATUS) == 0x12345678
    # Sub-dword: byte enables select the bytes, the value is shifted into place.
    assert host.mem_read(BAR5_BASE + R.ROM_CNTL + 3, 1) == 0x0A
    assert host.mem_read(BAR5_BASE + R.ROM_CNTL + 2, 2) == 0x0A00
    host.mem_write(BAR5_BASE + R.ROM_SW_STATUS + 1, 0xAB, 1)
    assert board.get32(R.ROM_SW_STATUS) == 0x1234AB78
    # A posted write has no completion: the IN answers the poll timeout.
    assert host.completion().ret == 0xFF


def test_memory_outside_bar5_is_unsupported(rig):
    host, board = rig
    before = stats(board)
    host.send(MEM_READ, 0x2000_0000)
    c = host.completion()
    assert (c.ret, c.status, c.carried, c.byte_count) == (0, 1, False, 4)
    host.send(MEM_READ, BAR5_BASE - 4, be=0x3)
    c = host.completion()
    assert (c.status, c.byte_count) == (1, 2)
    host.mem_write(BAR5_BASE + 0x100000, 0xDEADBEEF)                  # just past BAR5: dropped
    host.mem_write(0x8_0000_0000, 0xDEADBEEF)                        # VRAM is not emulated
    d = delta(before, stats(board))
    assert "reg_reads" not in d and "reg_writes" not in d and d["tlps"] == 4


def test_memory_decode_needs_the_command_registers(rig):
    host, _ = rig
    host.cfg_write(GPU_BUS, 0x04, 0x4, 2)                             # GPU memory decode off
    with pytest.raises(CompletionError, match="status 1"):
        host.mem_read(BAR5_BASE + R.ROM_CNTL)
    host.cfg_write(GPU_BUS, 0x04, 0x7, 2)
    host.cfg_write(2, 0x04, 0x5, 2)                                   # one bridge stops forwarding
    with pytest.raises(CompletionError, match="status 1"):
        host.mem_read(BAR5_BASE + R.ROM_CNTL)
    host.cfg_write(2, 0x04, 0x7, 2)
    assert host.mem_read(BAR5_BASE + R.ROM_CNTL) == 0x0A000002


def test_failed_completion_carries_the_stale_data_register(rig):
    host, _ = rig
    assert host.mem_read(BAR5_BASE + R.ROM_CNTL) == 0x0A000002
    host.send(MEM_READ, 0x2000_0000)
    c = host.completion()
    assert c.status == 1 and not c.carried and c.data == 0x0A000002
    assert host.xdata_read(0xB220, 4) == bytes.fromhex("0A000002")


def test_crs_and_completer_abort(make_board, open_backend):
    backend = open_backend([make_board()], gpu_crs_reads=1, gpu_abort_offsets=(R.ROM_DATA,))
    host = Host(bridges(backend)[0])
    for bus in range(4):
        host.cfg_write(bus, 0x18, (bus + 1) << 8 | 4 << 16)
    host.send(CFG_READ1, GPU_BUS << 24)
    c = host.completion()
    assert (c.ret, c.status, c.carried, c.byte_count) == (0, 2, False, 4)
    assert host.cfg_read(GPU_BUS, 0) == 0x744C1002
    host.bring_up()
    host.send(MEM_READ, BAR5_BASE + R.ROM_DATA)
    c = host.completion()
    assert (c.status, c.carried) == (4, False)


def test_engine_errors_then_success(make_board, open_backend):
    backend = open_backend([make_board()], engine_errors=2)
    host = Host(bridges(backend)[0])
    for _ in range(2):
        host.send(CFG_READ0, 0)
        assert host.completion().ret == 1
    assert host.cfg_read(0, 0) & 0xFFFF == 0x1B21


# -- streaming ---------------------------------------------------------------------------------

def test_streamed_write_and_read(rig):
    host, board = rig
    data = bytes(range(256))
    before = stats(board)
    assert host.stream_write(BAR5_BASE + R.ROM_SW_DATA, data) == 256
    assert board.reg_read(R.ROM_SW_DATA, 256) == data
    assert host.stream_read(BAR5_BASE + R.ROM_SW_DATA, 256) == data
    d = delta(before, stats(board))
    assert d["tlps"] == 128 and d["bulk_bytes"] == 512
    assert d["control_transfers"] == 2 and d["bulk_transfers"] == 2


def test_streams_longer_than_a_packet(rig):
    host, board = rig
    data = bytes(i * 7 & 0xFF for i in range(4096))
    assert host.stream_write(BAR5_BASE + 0x1000, data) == 4096
    assert board.reg_read(0x1000, 4096) == data
    assert host.stream_read(BAR5_BASE + 0x1000, 4096) == data


def test_bulk_without_a_stream_times_out(rig):
    host, board = rig
    before = board.clock.now()
    with pytest.raises(usb.core.USBTimeoutError):
        host.dev.read(0x81, 4, timeout=20)
    with pytest.raises(usb.core.USBTimeoutError):
        host.dev.write(0x02, b"\0" * 4, timeout=20)
    assert board.clock.now() - before == pytest.approx(2 * 0.020)   # each waits its timeout out


def test_over_send_drops_the_chunk(rig):
    host, board = rig
    board.set32(0x2000, 0x11111111)
    host.send(MEM_WRITE, BAR5_BASE + 0x2000, 1, mode=1)
    with pytest.raises(usb.core.USBTimeoutError):
        host.dev.write(0x02, b"\xAA" * 8, timeout=20)
    assert board.get32(0x2000) == 0x11111111                          # nothing written
    with pytest.raises(usb.core.USBTimeoutError):
        host.dev.write(0x02, b"\xAA" * 4, timeout=20)                 # the endpoint stays unarmed
    # In a multi-packet transfer the packets before the excess one land: a short count.
    host.send(MEM_WRITE, BAR5_BASE + 0x3000, 300, mode=1)
    assert host.dev.write(0x02, b"\x55" * 2048, timeout=20) == 1024
    assert board.reg_read(0x3000, 1024) == b"\x55" * 1024
    assert board.reg_read(0x3400, 4) == b"\0" * 4


def test_under_read_leaves_the_stream_armed_until_aborted(rig):
    host, board = rig
    board.regs[0x4000:0x4800] = bytes(range(256)) * 8
    host.arm_read(BAR5_BASE + 0x4000, 512)
    assert bytes(host.dev.read(0x81, 1024)) == board.reg_read(0x4000, 1024)
    # Not aborted: the next chunk is already waiting and comes before a new stream's data.
    host.arm_read(BAR5_BASE + R.ROM_CNTL, 1)
    with pytest.raises(usb.core.USBError) as overflow:
        host.dev.read(0x81, 4)
    assert overflow.value.errno == errno.EOVERFLOW
    # Aborted with CLEAR_FEATURE(HALT): the stream ends, but the chunk already queued still
    # arrives (the firmware's tests drain 0x81 after clearing); drained, the next reads clean.
    host.arm_read(BAR5_BASE + 0x4000, 768)
    host.dev.read(0x81, 1024)
    host.dev.clear_halt(0x81)
    assert bytes(host.dev.read(0x81, 1024, timeout=20)) == board.reg_read(0x4400, 1024)
    with pytest.raises(usb.core.USBTimeoutError):
        host.dev.read(0x81, 1024, timeout=20)                       # nothing more: the stream ended
    assert host.stream_read(BAR5_BASE + R.ROM_CNTL, 4) == struct.pack("<I", 0x0A000002)


def test_buffer_larger_than_the_stream_returns_what_came(rig):
    host, _ = rig
    host.arm_read(BAR5_BASE + R.ROM_CNTL, 1)
    assert bytes(host.dev.read(0x81, 64)) == struct.pack("<I", 0x0A000002)   # short packet ends it
    host.arm_read(BAR5_BASE, 256)
    assert len(host.dev.read(0x81, 2048, timeout=20)) == 1024                 # waits, then partial


@pytest.mark.parametrize("cancel", ["set_configuration", "set_interface", "clear_halt_out"])
def test_standard_requests_cancel_an_armed_write(rig, cancel):
    host, board = rig
    host.send(MEM_WRITE, BAR5_BASE + 0x5000, 4, mode=1)
    if cancel == "set_configuration":
        usb.util.release_interface(host.dev, 0)
        host.dev.set_configuration(1)
    elif cancel == "set_interface":
        host.dev.set_interface_altsetting(0, 0)
    else:
        host.dev.clear_halt(0x02)
    with pytest.raises(usb.core.USBTimeoutError):
        host.dev.write(0x02, b"\xFF" * 16, timeout=20)
    assert board.reg_read(0x5000, 16) == b"\0" * 16


def test_any_f0_request_ends_an_armed_write(rig):
    host, board = rig
    host.send(MEM_WRITE, BAR5_BASE + 0x5000, 4, mode=1)
    assert host.mem_read(BAR5_BASE + R.ROM_CNTL) == 0x0A000002
    with pytest.raises(usb.core.USBTimeoutError):
        host.dev.write(0x02, b"\xFF" * 16, timeout=20)
    assert board.reg_read(0x5000, 16) == b"\0" * 16


def test_bulk_needs_a_configured_device(make_board, open_backend):
    backend = open_backend([make_board()])
    handle = backend.open_device(backend.bridges[0])
    backend.set_configuration(handle, 0)
    assert backend.get_configuration(handle) == 0
    with pytest.raises(usb.core.USBError) as io:
        backend.bulk_write(handle, 0x02, 0, array.array("B", bytes(4)), 100)
    assert io.value.errno == errno.EIO
    with pytest.raises(usb.core.USBError):
        backend.claim_interface(handle, 0)
    backend.set_configuration(handle, 1)
    backend.claim_interface(handle, 0)
    backend.close_device(handle)


def test_port_reset_cancels_streams_but_keeps_the_pcie_state(rig):
    host, _ = rig
    host.arm_read(BAR5_BASE + R.ROM_CNTL, 1)
    host.dev.reset()
    with pytest.raises(usb.core.USBTimeoutError):
        host.dev.read(0x81, 4, timeout=20)
    assert host.link_state() == 0x78
    assert host.mem_read(BAR5_BASE + R.ROM_CNTL) == 0x0A000002      # BARs survive a USB reset
    with pytest.raises(usb.core.USBError) as bad:
        host.dev.clear_halt(0x83)
    assert bad.value.errno == errno.ENOENT


def test_set_configuration_cancels_an_armed_read(rig):
    host, _ = rig
    host.arm_read(BAR5_BASE, 4)
    usb.util.release_interface(host.dev, 0)
    host.dev.set_configuration(1)
    with pytest.raises(usb.core.USBTimeoutError):
        host.dev.read(0x81, 16, timeout=20)


def test_streamed_read_of_a_posted_type_wedges_the_firmware(make_board, open_backend):
    path = make_board()
    backend = open_backend([path])
    host = Host(bridges(backend)[0])
    host.send(MEM_WRITE, BAR5_BASE, 1, mode=2)
    with pytest.raises(usb.core.USBTimeoutError):
        host.xdata_read(0xB450, 1)
    backend.close()
    assert Host(bridges(open_backend([path]))[0]).link_state() == 0x78   # a re-plug recovers


# -- costs -------------------------------------------------------------------------------------

def test_cost_of_known_sequences(rig):
    host, board = rig
    before = stats(board)
    host.stream_read(BAR5_BASE + R.ROM_CNTL, 4)
    d = delta(before, stats(board))
    assert d["modelled_seconds"] == pytest.approx(100e-6 + 100e-6 + 4 / 1.8e6, rel=1e-9, abs=0)
    assert (d["control_transfers"], d["bulk_transfers"], d["bulk_bytes"], d["tlps"]) == (1, 1, 4, 1)

    before = stats(board)
    host.stream_write(BAR5_BASE + R.ROM_SW_DATA, bytes(64))
    d = delta(before, stats(board))
    assert d["modelled_seconds"] == pytest.approx(200e-6 + 64 / 3.6e6, rel=1e-9, abs=0)
    assert d["tlps"] == 16

    before = stats(board)
    host.mem_write(BAR5_BASE + R.ROM_SW_STATUS, 0)
    assert delta(before, stats(board))["modelled_seconds"] == pytest.approx(100e-6, rel=1e-9)

    before = stats(board)
    host.mem_read(BAR5_BASE + R.ROM_SW_STATUS)
    host.cfg_read(GPU_BUS, 0)
    d = delta(before, stats(board))
    assert d["modelled_seconds"] == pytest.approx(400e-6, rel=1e-9)
    assert (d["control_transfers"], d["tlps"], d["config_accesses"]) == (4, 2, 1)


def test_ideal_board_charges_nothing_but_counts(make_board, open_backend):
    backend = open_backend([make_board(transport="ideal")])
    host = Host(bridges(backend)[0])
    host.bring_up()
    board = backend.bridges[0].board
    host.stream_read(BAR5_BASE + R.ROM_CNTL, 4)
    s = stats(board)
    assert s["modelled_seconds"] == 0.0
    assert s["bulk_transfers"] == 1 and s["control_transfers"] > 100 and s["config_accesses"] > 50


# -- faults ------------------------------------------------------------------------------------

def test_usb_disconnect_after_n_transfers(make_board, open_backend):
    path = make_board(faults=["usb-disconnect-after=5"])
    backend = open_backend([path])
    [dev] = bridges(backend)
    for _ in range(5):
        dev.ctrl_transfer(0xC0, 0xE4, 0xB450, 0, 1)
    with pytest.raises(usb.core.USBError) as gone:
        dev.ctrl_transfer(0xC0, 0xE4, 0xB450, 0, 1)
    assert gone.value.errno == errno.ENODEV and gone.value.backend_error_code == -4
    with pytest.raises(usb.core.USBError) as still:
        dev.read(0x81, 4)
    assert still.value.errno == errno.ENODEV
    assert bridges(backend) == []
    board = backend.bridges[0].board
    assert board.fault_state[F_USB_TRANSFERS] == 6 and board.fault_state[F_USB_DISCONNECTED] == 1
    backend.close()

    # Re-plugged: the device is back, and the one-shot fault does not fire again.
    [again] = bridges(open_backend([path]))
    for _ in range(20):
        assert again.ctrl_transfer(0xC0, 0xE4, 0xB450, 0, 1)[0] == 0x78


def test_disconnect_count_persists_across_backends(make_board, open_backend):
    path = make_board(faults=["usb-disconnect-after=3"])
    backend = open_backend([path])
    for _ in range(2):
        bridges(backend)[0].ctrl_transfer(0xC0, 0xE4, 0xB450, 0, 1)
    backend.close()
    [dev] = bridges(open_backend([path]))
    dev.ctrl_transfer(0xC0, 0xE4, 0xB450, 0, 1)
    with pytest.raises(usb.core.USBError) as gone:
        dev.ctrl_transfer(0xC0, 0xE4, 0xB450, 0, 1)
    assert gone.value.errno == errno.ENODEV


def test_a_request_acts_on_the_board_after_its_transfers_fixed_latency(rig):
    """cost.py's landing rule, through the emulated bridge: a single-TLP write starts a ROM_SW
    transaction when its control transfer's 100 µs have passed; a streamed write, when its
    bulk OUT's 100 µs have passed after the arming control transfer."""
    host, board = rig
    release = {R.GPIOPAD_MASK: 0, R.GPIOPAD_A: 0, R.GPIOPAD_EN: 0, R.PAGE_MIRROR_CNTL: 0x06000000}
    for reg, value in release.items():
        host.mem_write(BAR5_BASE + reg, value)
    host.mem_write(BAR5_BASE + R.ROM_SW_COMMAND, 0x05)
    t = board.clock.now()
    host.mem_write(BAR5_BASE + R.ROM_SW_CNTL, R.ROM_SW_RETURN_DATA_ENABLE | 1)
    started = board.engine._flight()[0]
    assert started - t == pytest.approx(ASM24.control)
    board.clock.sleep(1e-3)
    host.mem_read(BAR5_BASE + R.ROM_SW_STATUS)                       # seen done
    t = board.clock.now()
    host.stream_write(BAR5_BASE + R.ROM_SW_CNTL, struct.pack("<I", R.ROM_SW_RETURN_DATA_ENABLE | 1))
    assert board.engine._flight()[0] - t == pytest.approx(ASM24.control + ASM24.bulk)
