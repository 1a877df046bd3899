"""The emulated ASM24 USB-to-PCIe bridge, as a pyusb backend (docs/bridge.md is the contract).

    backend = SimUsbBackend([board_a, board_b], pcie_on_at_boot=False)
    dev = usb.core.find(backend=backend, idVendor=0xADD1)

Each board directory becomes one SuperSpeed bridge on bus 2 (or a high-speed one, with the
`usb2` option), behind an emulated xHCI root hub (what libusb lists as its parent), with
the board's serial. A driver sees the wire protocol of the custom firmware and libusb's
behaviour around it, failures included:

* control transfers: standard GET_DESCRIPTOR (device, configuration, string, BOS),
  SET_CONFIGURATION, SET_INTERFACE, CLEAR_FEATURE(ENDPOINT_HALT); vendor E4/E5 (XDATA),
  F0 (TLP engine), F3 (PCIe power and link training). Any other request is acknowledged
  when it has no data stage and times out when it has one, as the firmware does;
* bulk OUT 0x02 / IN 0x81 carry the streamed modes, in 1024-byte packets. The firmware's
  per-packet rules hold: an OUT packet larger than the dwords still armed is dropped and
  disarms the endpoint; IN chunks (≤ 256 dwords) are fetched from PCIe when the stream is
  armed and after each packet the host takes, so reading less than announced leaves a
  fetched chunk waiting in the endpoint until SET_CONFIGURATION / SET_INTERFACE flushes it
  — a later stream's data comes *after* it (the endpoint holds at most IN_FIFO_PACKETS;
  beyond that the oldest waiting packet is lost). CLEAR_FEATURE(HALT) on 0x81 ends the
  stream, but a chunk already handed to the USB controller may still arrive, as the
  firmware's own tests find (they drain 0x81 after clearing it): the first waiting chunk
  stays, the rest are dropped;
* the configuration descriptor lists interface 0's alternate setting 0 (the two bulk
  endpoints the protocol uses) and alternate setting 1 (UAS: four bulk endpoints with
  streams and pipe usage descriptors), 121 bytes in all; the firmware treats both alike;
* E4 returns up to 512 bytes per request (64 on USB 2), as the firmware caps it;
* the TLP engine keeps its registers in XDATA (0xB210 fmt, 0xB217 byte enables,
  0xB218/0xB21C address low/high, 0xB220 data, 0xB22A completion header, 0xB284 bit 0
  "carried data", 0xB296 status, all big-endian), so E4 shows the engine's state and a
  failed completion carries whatever the data register last held;
* costs (docs/cost-model.md, `asm24`; nothing on an `ideal` board) are charged on the board's
  clock per transfer, the fixed latency before the firmware acts on the transfer and the
  payload time after it (cost.py's landing rule), and the board's counters count transfers,
  bytes and TLPs (every TLP,
  each streamed dword one; config TLPs also count as config_accesses). A streamed run that
  stays inside BAR5 reaches the board as one `reg_read`/`reg_write` per USB packet, hooks
  still visited dword by dword in ascending order.

Choices where neither the spec nor the firmware source decides (assumptions):

* GET_CONFIGURATION is answered from the host's cache, as libusb does on Linux (the
  kernel configured the device at enumeration, so it answers 1 until the driver sets 0);
  no transfer reaches the firmware, which would not answer it;
* E4/E5 with a non-zero wIndex high byte address a second (PHY) bank, modelled as plain
  memory;
* F0 IN when no completion is pending (after a posted write, or before any TLP) answers
  the poll timeout (return status 0xFF); with the PCIe link down every TLP fails with an
  engine error (return status 1), in streams too. A streamed read whose TLP type gets no
  completion (a posted write in mode 2) wedges the firmware's polling loop: every later
  transfer times out until the bridge is re-plugged (a new backend);
* memory TLPs to anything but BAR5 (VRAM, doorbells, I/O) are Unsupported Requests; a
  zero-byte-enable read completes with one byte count and no register access;
* a bulk IN buffer smaller than the next packet fails with EOVERFLOW (babble) and
  consumes the packet; a transfer that ends without a short packet waits for its timeout
  and then returns the bytes it got (libusb's partial-transfer rule), or raises
  USBTimeoutError if it got none. A timed-out transfer charges its timeout on the clock
  (an infinite timeout, 0, charges nothing and still raises rather than hang a test);
* F3 on asserts PERST# and trains the link again whatever its state (the firmware's
  pcie_power_on does): the GPU is reset — config spaces and BARs lost, BAR5 registers and
  the ROM_SW engine and PSP mailbox back at their power-on values — and link training
  time is charged (`LINK_TRAINING_SECONDS`, or the firmware's full `LINK_TRAINING_TIMEOUT`
  when the link never comes up). F3 off and link loss reset every config space behind the
  engine;
* a port reset (reset_device) costs one control transfer; the firmware ignores bus resets
  and the kernel re-sends SET_CONFIGURATION, which cancels streams;
* a new backend is a re-plug: XDATA, link state, streams and PCIe config start afresh.

Fault usb-disconnect-after=N: transfers 1..N to that bridge work, number N+1 and every
later one fail with LIBUSB_ERROR_NO_DEVICE and the bridge leaves `enumerate_devices`.
The count lives in the board's fault state (F_USB_TRANSFERS), so it runs on across
processes; firing is recorded in slot F_USB_DISCONNECTED and never repeats.
"""
from __future__ import annotations

import errno as _errno
import os
import re
import struct
import threading
from collections import deque
from dataclasses import dataclass, fields, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from collections.abc import Callable, Iterable, Mapping

import usb.backend
import usb.core

from amdflash.stages.sim.board import Board
from amdflash.stages.sim.state import F_USB_FIRED as F_USB_DISCONNECTED
from amdflash.stages.sim.state import F_USB_TRANSFERS
from amdflash.stages.sim.cost import ASM24
from amdflash.stages.sim.pcie import BAR5_SIZE, NAVI31_DEVICE, PcieTopology
from amdflash.stages.sim.state import C


MAX_PACKET = 1024
USB2_MAX_PACKET = 512
IN_FIFO_PACKETS = 16             # assumed: the SuperSpeed burst window (bMaxBurst 15)
XDATA_READ_MAX = 512             # the firmware's E4 limit on USB 3 ...
XDATA_READ_MAX_USB2 = 64         # ... and on USB 2
LINK_UP_LTSSM = 0x78
LINK_OFF_LTSSM = 0x00
LINK_TRAINING_LTSSM = 0x10        # assumed: a Polling state while training keeps failing
LINK_TRAINING_SECONDS = 0.5       # assumed: training to L0 after F3 on
LINK_TRAINING_TIMEOUT = 2.0       # docs/bridge.md: "up to about 2 s"

# TLP engine registers in XDATA.
REG_FMT, REG_BYTE_EN, REG_ADDR, REG_ADDR_HI = 0xB210, 0xB217, 0xB218, 0xB21C
REG_DATA, REG_CPL, REG_CARRIED, REG_STATUS = 0xB220, 0xB22A, 0xB284, 0xB296
REG_LTSSM = 0xB450
STATUS_ERROR, STATUS_COMPLETE = 0x01, 0x02
CPL_SC, CPL_UR, CPL_CRS, CPL_CA = 0, 1, 2, 4

# libusb error codes and the text/errno pyusb's libusb1 backend attaches to them.
LIBUSB_ERROR_IO = -1
LIBUSB_ERROR_INVALID_PARAM = -2
LIBUSB_ERROR_NO_DEVICE = -4
LIBUSB_ERROR_NOT_FOUND = -5
LIBUSB_ERROR_BUSY = -6
LIBUSB_ERROR_TIMEOUT = -7
LIBUSB_ERROR_OVERFLOW = -8
LIBUSB_ERROR_PIPE = -9
_ERRORS: dict[int, tuple[str, int]] = {
    LIBUSB_ERROR_IO: ("Input/output error", _errno.EIO),
    LIBUSB_ERROR_INVALID_PARAM: ("Invalid parameter", _errno.EINVAL),
    LIBUSB_ERROR_NO_DEVICE: ("No such device (it may have been disconnected)", _errno.ENODEV),
    LIBUSB_ERROR_NOT_FOUND: ("Entity not found", _errno.ENOENT),
    LIBUSB_ERROR_BUSY: ("Resource busy", _errno.EBUSY),
    LIBUSB_ERROR_TIMEOUT: ("Operation timed out", _errno.ETIMEDOUT),
    LIBUSB_ERROR_OVERFLOW: ("Overflow", _errno.EOVERFLOW),
    LIBUSB_ERROR_PIPE: ("Pipe error", _errno.EPIPE),
}
LIBUSB_SPEED_HIGH = 3
LIBUSB_SPEED_SUPER = 4
KERNEL_TIMEOUT_MS = 5000          # Linux USB_CTRL_SET_TIMEOUT, for requests the kernel sends


def usb_error(code: int) -> usb.core.USBError:
    text, err = _ERRORS[code]
    cls = usb.core.USBTimeoutError if code == LIBUSB_ERROR_TIMEOUT else usb.core.USBError
    return cls(text, code, err)


_CONTROL, _BULK, _BULK_BYTES = C["control_transfers"], C["bulk_transfers"], C["bulk_bytes"]
_TLPS, _CONFIG = C["tlps"], C["config_accesses"]
_SERIAL = re.compile(r"[0-9a-f]{8}")


@dataclass(frozen=True)
class BridgeOptions:
    """What distinguishes one emulated bridge (and the GPU behind it) from another.

    Taken, later ones winning: these defaults, the board's `board.json` "bridge" object,
    the backend's keyword arguments, a per-board mapping given with the path.
    """

    vendor_id: int = 0xADD1           # newer units: 0x3801
    product_id: int = 0x0001
    product: str = "custom v0.1"
    pcie_on_at_boot: bool = True      # firmware builds differ: some boot with PCIe off
    link_trains: bool = True          # False: F3 never brings the link to L0
    gpu_device_id: int = NAVI31_DEVICE
    kernel_driver: bool = False       # a kernel driver is bound to interface 0 at plug-in
    engine_errors: int = 0            # the first N non-posted TLPs fail (return status 1) undelivered
    gpu_crs_reads: int = 0            # the GPU answers its first N config requests with CRS
    gpu_abort_offsets: tuple[int, ...] = ()   # BAR5 dwords whose reads complete with CA
    usb2: bool = False                # plugged into a USB 2 port: high speed, 512-byte packets
    serial_string: str | None = None  # what the serial descriptor says instead of the board's serial
                                      # (another firmware, or a device forging ours: any string)

    @classmethod
    def resolve(cls, *layers: Mapping[str, Any]) -> BridgeOptions:
        known = {f.name for f in fields(cls)}
        merged: dict[str, Any] = {}
        for layer in layers:
            unknown = set(layer) - known
            if unknown:
                raise TypeError(f"unknown bridge option(s): {', '.join(sorted(unknown))}")
            merged.update({k: v for k, v in layer.items() if v is not None})
        return replace(cls(), **merged)


PathLike = str | os.PathLike
BoardSpec = PathLike | tuple[PathLike, Mapping[str, Any]]


# -- descriptors ------------------------------------------------------------------------------

def _string_descriptor(text: str) -> bytes:
    raw = text.encode("utf-16-le")
    return bytes((2 + len(raw), 3)) + raw


def _desc(**fields_: Any) -> SimpleNamespace:
    return SimpleNamespace(**fields_)


Endpoints = list[tuple[dict[str, int], bytes]]      # (endpoint fields, extra descriptor bytes)


class _Descriptors:
    """One device's descriptor set: objects for the IBackend getters, bytes for GET_DESCRIPTOR.

    `interfaces` lists interface 0's alternate settings in order, each with its endpoints.
    """

    def __init__(self, *, device: dict[str, int], config: dict[str, int],
                 interfaces: list[tuple[dict[str, int], Endpoints]], strings: list[str], bos: bytes,
                 bus: int, address: int, port: int | None, speed: int = LIBUSB_SPEED_SUPER):
        self.strings = [bytes((4, 3, 0x09, 0x04))] + [_string_descriptor(s) for s in strings]
        body = b""
        for interface, endpoints in interfaces:
            body += struct.pack("<9B", 9, 4, interface["bInterfaceNumber"], interface["bAlternateSetting"],
                                len(endpoints), interface["bInterfaceClass"], interface["bInterfaceSubClass"],
                                interface["bInterfaceProtocol"], interface["iInterface"])
            body += b"".join(struct.pack("<BBBBHB", 7, 5, e["bEndpointAddress"], e["bmAttributes"],
                                         e["wMaxPacketSize"], e["bInterval"]) + extra
                             for e, extra in endpoints)
        total = 9 + len(body)
        self.config_bytes = struct.pack("<BBHBBBBB", 9, 2, total, 1, config["bConfigurationValue"],
                                        config["iConfiguration"], config["bmAttributes"],
                                        config["bMaxPower"]) + body
        self.device_bytes = struct.pack("<BBHBBBBHHHBBBB", 18, 1, device["bcdUSB"], device["bDeviceClass"],
                                        device["bDeviceSubClass"], device["bDeviceProtocol"],
                                        device["bMaxPacketSize0"], device["idVendor"], device["idProduct"],
                                        device["bcdDevice"], 1, 2, 3, 1)
        self.bos_bytes = bos
        self.device = _desc(bLength=18, bDescriptorType=1, **device, iManufacturer=1, iProduct=2,
                            iSerialNumber=3, bNumConfigurations=1, bus=bus, address=address,
                            port_number=port, port_numbers=(port,) if port else None, speed=speed)
        self.config = _desc(bLength=9, bDescriptorType=2, wTotalLength=total, bNumInterfaces=1,
                            **config, extra_descriptors=[])
        self.interfaces = [_desc(bLength=9, bDescriptorType=4, bNumEndpoints=len(endpoints), **interface,
                                 extra_descriptors=[]) for interface, endpoints in interfaces]
        self.endpoints = [[_desc(bLength=7, bDescriptorType=5, **e, bRefresh=0, bSynchAddress=0,
                                 extra_descriptors=list(extra)) for e, extra in endpoints]
                          for _, endpoints in interfaces]
        self.endpoint_addresses = [{e["bEndpointAddress"] for e, _ in endpoints} for _, endpoints in interfaces]

    def get(self, value: int) -> bytes | None:
        kind, index = value >> 8, value & 0xFF
        if kind == 1:
            return self.device_bytes
        if kind == 2:
            return self.config_bytes
        if kind == 3:
            return self.strings[index] if index < len(self.strings) else b"\x02\x03"
        if kind == 0x0F:
            return self.bos_bytes
        return None


_SS_COMPANION_BULK = bytes((6, 0x30, 15, 0, 0, 0))     # bMaxBurst 15
_SS_COMPANION_STREAMS = bytes((6, 0x30, 15, 5, 0, 0))  # bMaxBurst 15, 32 streams
_VENDOR = dict(bInterfaceNumber=0, bInterfaceClass=0xFF, bInterfaceSubClass=0xFF, bInterfaceProtocol=0xFF,
               iInterface=0)


def _bulk(address: int, size: int) -> dict[str, int]:
    return dict(bEndpointAddress=address, bmAttributes=2, wMaxPacketSize=size, bInterval=0)


def _pipe(usage: int) -> bytes:
    return bytes((4, 0x24, usage, 0))                       # UAS pipe usage descriptor


def _usb3_interfaces() -> list[tuple[dict[str, int], Endpoints]]:
    """Interface 0 on SuperSpeed, as the firmware lists it: alternate setting 0 with the two
    bulk endpoints the protocol uses, and alternate setting 1 (UAS: status, command, data
    in, data out) — 121 bytes of configuration descriptor in all."""
    return [
        ({**_VENDOR, "bAlternateSetting": 0},
         [(_bulk(0x81, MAX_PACKET), _SS_COMPANION_BULK), (_bulk(0x02, MAX_PACKET), _SS_COMPANION_BULK)]),
        ({**_VENDOR, "bAlternateSetting": 1},
         [(_bulk(0x81, MAX_PACKET), _SS_COMPANION_STREAMS + _pipe(3)),
          (_bulk(0x02, MAX_PACKET), _SS_COMPANION_STREAMS + _pipe(4)),
          (_bulk(0x83, MAX_PACKET), _SS_COMPANION_STREAMS + _pipe(2)),
          (_bulk(0x04, MAX_PACKET), bytes((6, 0x30, 0, 0, 0, 0)) + _pipe(1))]),
    ]


def _usb2_interfaces() -> list[tuple[dict[str, int], Endpoints]]:
    """On a high-speed port: one setting, four bulk endpoints of 512 bytes."""
    return [({**_VENDOR, "bAlternateSetting": 0},
             [(_bulk(a, USB2_MAX_PACKET), b"") for a in (0x81, 0x02, 0x83, 0x04)])]
_BOS = bytes((5, 0x0F, 22, 0, 2,
              7, 0x10, 2, 2, 0, 0, 0,                   # USB 2.0 extension: LPM
              10, 0x10, 3, 0, 0x0E, 0, 3, 0, 0, 0))     # SuperSpeed: full/high/super speed


class _Timeout(Exception):
    """The device never answers: the host waits out its timeout."""


class _SimDevice:
    """Common ground of the root hub and the bridges: identity, handles, claims."""

    descriptors: _Descriptors
    parent: _SimDevice | None = None

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.gone = False
        self.configuration = 1          # the kernel configured the device at enumeration
        self.claims: dict[int, _Handle] = {}
        self.kernel_driver = False
        self.alt = 0                    # interface 0's selected alternate setting

    def check_present(self) -> None:
        if self.gone:
            raise usb_error(LIBUSB_ERROR_NO_DEVICE)


class _Handle:
    def __init__(self, device: _RootHub | _Asm24):   # the only kinds of device there are
        self.device = device


class _RootHub(_SimDevice):
    """The SuperSpeed root hub of an xHCI controller: parent of every bridge."""

    def __init__(self, bus: int):
        super().__init__()
        self.kernel_driver = True
        self.descriptors = _Descriptors(
            device=dict(bcdUSB=0x0300, bDeviceClass=9, bDeviceSubClass=0, bDeviceProtocol=3,
                        bMaxPacketSize0=9, idVendor=0x1D6B, idProduct=0x0003, bcdDevice=0x0606),
            config=dict(bConfigurationValue=1, iConfiguration=0, bmAttributes=0xE0, bMaxPower=0),
            interfaces=[(dict(bInterfaceNumber=0, bAlternateSetting=0, bInterfaceClass=9,
                              bInterfaceSubClass=0, bInterfaceProtocol=0, iInterface=0),
                         [(dict(bEndpointAddress=0x81, bmAttributes=3, wMaxPacketSize=4, bInterval=12),
                           bytes((6, 0x30, 0, 0, 2, 0)))])],
            strings=["Linux 6.6.0 xhci-hcd", "xHCI Host Controller", "0000:00:14.0"],
            bos=_BOS, bus=bus, address=1, port=None)

    def control(self, request_type: int, request: int, value: int, index: int, buf: memoryview,
                timeout: int = 0) -> int:
        # The hub answers at once: `timeout` is taken only to share the bridges' signature.
        if request_type == 0x80 and request == 6:
            answer = self.descriptors.get(value)
        elif request_type == 0x80 and request == 0:
            answer = b"\x01\x00"                        # self-powered
        elif request_type == 0x80 and request == 8:
            answer = bytes((self.configuration,))
        else:
            raise usb_error(LIBUSB_ERROR_PIPE)          # a hub stalls what it does not support
        if answer is None:
            raise usb_error(LIBUSB_ERROR_PIPE)
        n = min(len(answer), len(buf))
        buf[:n] = answer[:n]
        return n


class _Asm24(_SimDevice):
    """One bridge: the firmware's USB behaviour, XDATA, the TLP engine and its streams."""

    def __init__(self, board: Board, options: BridgeOptions, hub: _RootHub, address: int, port: int):
        super().__init__()
        self.board = board
        self.options = options
        self.parent = hub
        self.kernel_driver = options.kernel_driver
        serial = str(board.config.get("serial") or "ffffffff")
        if not _SERIAL.fullmatch(serial):
            raise ValueError(f"{board.path}: bridge serial {serial!r} is not 8 lowercase hex digits")
        self.serial = serial
        self.usb2 = options.usb2
        self.max_packet = USB2_MAX_PACKET if self.usb2 else MAX_PACKET
        self.xdata_read_max = XDATA_READ_MAX_USB2 if self.usb2 else XDATA_READ_MAX
        self.descriptors = _Descriptors(
            device=dict(bcdUSB=0x0200 if self.usb2 else 0x0320, bDeviceClass=0, bDeviceSubClass=0,
                        bDeviceProtocol=0, bMaxPacketSize0=64 if self.usb2 else 9, idVendor=options.vendor_id,
                        idProduct=options.product_id, bcdDevice=0x0001),
            config=dict(bConfigurationValue=1, iConfiguration=0, bmAttributes=0xC0, bMaxPower=0),
            interfaces=_usb2_interfaces() if self.usb2 else _usb3_interfaces(),
            strings=["tiny", options.product, serial if options.serial_string is None else options.serial_string],
            bos=_BOS, bus=hub.descriptors.device.bus, address=address, port=port,
            speed=LIBUSB_SPEED_HIGH if self.usb2 else LIBUSB_SPEED_SUPER)

        physical = board.cost.physical
        self._charge = board.clock.advance if physical else None
        # The board's own figures when it is an asm24 board (a calibrated one has a real
        # bridge's); the bridge's model figures in front of a board made for another link.
        link = board.cost if board.cost.usb else ASM24
        self._control_cost = link.control
        self._bulk_cost = link.bulk
        self._write_byte = link.write_byte
        self._read_byte = link.read_byte
        self._jitter = board.jitter if board.cost.usb else None
        self._counters = board.counters
        self._faults = board.fault_state
        fired = self._faults[F_USB_DISCONNECTED]
        self._disconnect_after = None if fired else board.faults.usb_disconnect_after

        self.xdata = bytearray(0x10000)
        self._banks: dict[int, bytearray] = {}
        self.ctrl_buf = bytearray(512)          # the firmware's one control data buffer
        self.topology = PcieTopology(options.gpu_device_id)
        self.link_up = options.pcie_on_at_boot and options.link_trains
        self.powered = options.pcie_on_at_boot
        self._engine_errors = options.engine_errors
        self._gpu_crs = options.gpu_crs_reads
        self._aborts = frozenset(o & ~3 for o in options.gpu_abort_offsets)
        self.hung = False

        # Stream state (the firmware's dma_dwords and its address shadow).
        self.dma_dwords = 0
        self.dma_addr = 0
        self.dma_addr_hi = 0
        self.dma_fmt = 0
        self.dma_be = 0
        self.out_armed = False
        self.in_queue: deque[bytes] = deque(maxlen=IN_FIFO_PACKETS)

        self._requests: dict[tuple[int, int], Callable[[int, int, memoryview, int], int]] = {
            (0xC0, 0xE4): self._xdata_read,
            (0x40, 0xE5): self._xdata_write,
            (0x40, 0xF0): self._tlp_out,
            (0xC0, 0xF0): self._tlp_in,
            (0x40, 0xF3): self._pcie_power,
            (0x80, 0x06): self._get_descriptor,
            (0x00, 0x09): self._set_configuration_request,
            (0x01, 0x0B): self._set_interface_request,
            (0x02, 0x01): self._clear_feature_endpoint,
        }

    # -- transfer bookkeeping -------------------------------------------------------------
    def begin(self) -> None:
        """Every USB transfer: the device must be there; usb-disconnect-after counts it."""
        if self.gone:
            raise usb_error(LIBUSB_ERROR_NO_DEVICE)
        fs = self._faults
        fs[F_USB_TRANSFERS] += 1
        limit = self._disconnect_after
        if limit is not None and fs[F_USB_TRANSFERS] > limit:
            fs[F_USB_DISCONNECTED] = 1
            self.gone = True
            raise usb_error(LIBUSB_ERROR_NO_DEVICE)

    def charge(self, seconds: float) -> None:
        if self._charge is not None:
            self._charge(seconds)

    def wait_out(self, timeout_ms: int, already: float = 0.0) -> None:
        """The host waits out its timeout (of which `already` seconds have passed)."""
        if timeout_ms > 0:
            self.charge(max(0.0, timeout_ms / 1000 - already))

    def cancel_streams(self) -> None:
        self.dma_dwords = 0
        self.out_armed = False
        self.in_queue.clear()

    def _latency(self, kind: str, median: float) -> float:
        """One transfer's fixed latency (a calibrated link may vary it: sim/jitter.py)."""
        return median if self._jitter is None else self._jitter.transfer(kind, median)

    # -- control transfers ----------------------------------------------------------------
    def control(self, request_type: int, request: int, value: int, index: int, buf: memoryview,
                timeout: int) -> int:
        self.begin()
        self._counters[_CONTROL] += 1
        # The request reaches the firmware when the transfer's fixed latency has passed
        # (cost.py's landing rule): whatever it does to the board happens at that moment.
        latency = self._latency("control", self._control_cost)
        self.charge(latency)
        try:
            if self.hung:
                raise _Timeout
            handler = self._requests.get((request_type, request))
            if handler is None:
                if len(buf):
                    raise _Timeout                  # the firmware never answers a data stage
                n = 0
            else:
                n = handler(value, index, buf, timeout)
        except _Timeout:
            self.wait_out(timeout, already=latency)
            raise usb_error(LIBUSB_ERROR_TIMEOUT) from None
        return n

    def _reply(self, buf: memoryview, answer: bytes | bytearray) -> int:
        n = min(len(answer), len(buf))
        self.ctrl_buf[:n] = answer[:n]
        buf[:n] = answer[:n]
        return n

    def _get_descriptor(self, value: int, index: int, buf: memoryview, timeout: int) -> int:
        answer = self.descriptors.get(value)
        if answer is None:
            raise _Timeout
        return self._reply(buf, answer)

    def _set_configuration_request(self, value: int, index: int, buf: memoryview, timeout: int) -> int:
        self.cancel_streams()
        return 0

    def _set_interface_request(self, value: int, index: int, buf: memoryview, timeout: int) -> int:
        self.cancel_streams()
        return 0

    def _clear_feature_endpoint(self, value: int, index: int, buf: memoryview, timeout: int) -> int:
        if value == 0:                                  # ENDPOINT_HALT
            endpoint = index & 0xFF
            if endpoint == 0x81:
                # The chunk already handed to the USB controller still goes out (the firmware's
                # own tests drain 0x81 after clearing it); anything queued behind it is dropped.
                while len(self.in_queue) > 1:
                    self.in_queue.pop()
            elif endpoint == 0x02:
                self.out_armed = False
            self.dma_dwords = 0
        return 0

    # -- XDATA ----------------------------------------------------------------------------
    def _memory(self, bank: int) -> bytearray:
        if not bank:
            return self.xdata
        return self._banks.setdefault(bank, bytearray(0x10000))

    def _xdata_read(self, value: int, index: int, buf: memoryview, timeout: int) -> int:
        n = min(len(buf), self.xdata_read_max)
        memory = self._memory(index >> 8)
        if value + n <= 0x10000:
            answer = bytearray(memory[value:value + n])
        else:
            answer = bytearray(memory[(value + i) & 0xFFFF] for i in range(n))
        if not index >> 8 and value <= REG_LTSSM < value + n:
            answer[REG_LTSSM - value] = self.ltssm
        return self._reply(buf, answer)

    def _xdata_write(self, value: int, index: int, buf: memoryview, timeout: int) -> int:
        byte = index & 0xFF
        if index >> 8:
            self._memory(index >> 8)[value] = byte
        elif value == REG_STATUS:
            self.xdata[value] &= ~byte & 0xFF           # write 1 to clear
        elif value != REG_LTSSM:
            self.xdata[value] = byte
        return len(buf)

    @property
    def ltssm(self) -> int:
        if self.link_up:
            return LINK_UP_LTSSM
        return LINK_TRAINING_LTSSM if self.powered else LINK_OFF_LTSSM

    # -- PCIe power -----------------------------------------------------------------------
    def _pcie_power(self, value: int, index: int, buf: memoryview, timeout: int) -> int:
        if not value:
            self.powered = False
            self._link_lost()
            return 0
        # Power on always asserts PERST# and trains again, link up or not: the GPU is reset
        # (its config spaces and BAR placement lost, its registers and engines back at their
        # power-on values). The flash chip is a separate device and keeps its state.
        self.powered = True
        self._link_lost()
        self.board.power_on_reset()
        if self.options.link_trains:
            self.link_up = True
            needed = LINK_TRAINING_SECONDS
        else:
            needed = LINK_TRAINING_TIMEOUT
        if timeout and needed * 1000 > timeout:
            raise _Timeout                              # training goes on; the host gave up
        self.charge(needed)
        return 0

    def _link_lost(self) -> None:
        self.link_up = False
        self.topology.reset()

    # -- the TLP engine -------------------------------------------------------------------
    def _tlp_out(self, value: int, index: int, buf: memoryview, timeout: int) -> int:
        cb = self.ctrl_buf
        n = min(len(buf), len(cb))
        cb[:n] = buf[:n]
        addr_lo, addr_hi, data = struct.unpack_from("<III", cb)
        fmt, be, mode = value & 0xFF, value >> 8 & 0xFF, index & 3
        x = self.xdata
        self.dma_dwords = 0                             # any F0 OUT ends the previous stream
        x[REG_FMT] = fmt
        x[REG_BYTE_EN] = be
        struct.pack_into(">II", x, REG_ADDR, addr_lo, addr_hi)
        if mode == 0:
            if fmt & 0x40:
                struct.pack_into(">I", x, REG_DATA, data)
            x[REG_STATUS] = 0
            self._tlp(fmt, addr_hi << 32 | addr_lo if fmt & 0x20 else addr_lo, be, data)
            return len(buf)
        self.dma_addr, self.dma_addr_hi, self.dma_fmt, self.dma_be = addr_lo, addr_hi, fmt, be
        self.dma_dwords = data
        if data:
            if mode == 1:
                self.out_armed = True
            elif mode == 2:
                self._fetch_in_chunk()
        return len(buf)

    def _tlp_in(self, value: int, index: int, buf: memoryview, timeout: int) -> int:
        x = self.xdata
        status = x[REG_STATUS]
        if status & STATUS_ERROR:
            x[REG_STATUS] = status & ~STATUS_ERROR
            answer = bytes(7) + b"\x01"
        elif status & STATUS_COMPLETE:
            answer = bytes((x[REG_DATA + 3], x[REG_DATA + 2], x[REG_DATA + 1], x[REG_DATA],
                            x[REG_CPL], x[REG_CPL + 1], x[REG_CARRIED], 0))
        else:
            answer = bytes(7) + b"\xff"
        return self._reply(buf, answer)

    def _complete(self, status: int, byte_count: int, data: int | None) -> None:
        x = self.xdata
        x[REG_CPL] = status << 5 | byte_count >> 8 & 0xF
        x[REG_CPL + 1] = byte_count & 0xFF
        if data is None:
            x[REG_CARRIED] = 0
        else:
            x[REG_CARRIED] = 1
            struct.pack_into(">I", x, REG_DATA, data)
        x[REG_STATUS] = STATUS_COMPLETE

    def _tlp(self, fmt: int, addr: int, be: int, value: int) -> None:
        """One TLP; its completion (if any) lands in the engine's registers."""
        self._counters[_TLPS] += 1
        posted = fmt in (0x40, 0x60) or fmt & 0xB8 == 0x30
        if not self.link_up:
            self.xdata[REG_STATUS] = STATUS_ERROR
            return
        if self._engine_errors and not posted:
            self._engine_errors -= 1
            self.xdata[REG_STATUS] = STATUS_ERROR
            return
        if fmt in (0x00, 0x20):
            self._memory_read(addr, be)
        elif fmt in (0x40, 0x60):
            self._memory_write(addr, be, value)
        elif fmt in (0x04, 0x05, 0x44, 0x45):
            self._config(fmt, addr, be, value)
        elif not posted:
            self._complete(CPL_UR, 4, None)             # I/O and the rest: nothing claims them

    def _bar5_offset(self, addr: int) -> int | None:
        base = self.topology.bar5_base()
        if base is None:
            return None
        offset = addr - base
        return offset if 0 <= offset < BAR5_SIZE else None

    def _memory_read(self, addr: int, be: int) -> None:
        count = _byte_count(be)
        offset = self._bar5_offset(addr)
        if offset is None:
            self._complete(CPL_UR, count, None)
            return
        if offset & ~3 in self._aborts:
            self._complete(CPL_CA, count, None)
            return
        if be == 0xF:
            data = int.from_bytes(self.board.reg_read(offset, 4), "little")
        elif be:
            first, last = _lowest(be), _highest(be)
            raw = self.board.reg_read(offset + first, last - first + 1)
            data = int.from_bytes(raw, "little") << 8 * first
        else:
            data = 0
        self._complete(CPL_SC, count, data)

    def _memory_write(self, addr: int, be: int, value: int) -> None:
        offset = self._bar5_offset(addr)
        if offset is None:
            return                                      # posted: dropped without a word
        if be == 0xF:
            self.board.reg_write(offset, value.to_bytes(4, "little"))
            return
        raw = value.to_bytes(4, "little")
        i = 0
        while i < 4:
            if be >> i & 1:
                j = i
                while j < 4 and be >> j & 1:
                    j += 1
                self.board.reg_write(offset + i, raw[i:j])
                i = j
            else:
                i += 1

    def _config(self, fmt: int, addr: int, be: int, value: int) -> None:
        self._counters[_CONFIG] += 1
        bus, device, function = addr >> 24 & 0xFF, addr >> 19 & 0x1F, addr >> 16 & 0x7
        space = self.topology.config_target(bool(fmt & 1), bus, device, function)
        if space is None:
            self._complete(CPL_UR, 4, None)
            return
        if self._gpu_crs and space is self.topology.gpu:
            self._gpu_crs -= 1
            self._complete(CPL_CRS, 4, None)        # still initialising after reset
            return
        reg = addr & 0xFFC
        if fmt & 0x40:
            space.write(reg, value, be)
            self.topology.config_written()
            self._complete(CPL_SC, 4, None)
        else:
            self._complete(CPL_SC, 4, space.read(reg))

    def _stream_address(self, addr_lo: int) -> int:
        return self.dma_addr_hi << 32 | addr_lo if self.dma_fmt & 0x20 else addr_lo

    def _fast_stream_offset(self, dwords: int, read: bool) -> int | None:
        """BAR5 offset when a run of dwords can go to the board as one access."""
        if (self.dma_be != 0xF or not self.link_up or self._engine_errors or self._aborts
                or self.dma_fmt not in ((0x00, 0x20) if read else (0x40, 0x60))):
            return None
        offset = self._bar5_offset(self._stream_address(self.dma_addr))
        if offset is None or offset + 4 * dwords > BAR5_SIZE or self.dma_addr + 4 * dwords > 0xFFFFFFFF:
            return None
        return offset

    def _fetch_in_chunk(self) -> None:
        """The firmware's do_usb_bulk_in: up to one packet of dwords, read now, queued on 0x81."""
        n = min(self.dma_dwords, self.max_packet // 4)
        offset = self._fast_stream_offset(n, read=True)
        x = self.xdata
        if offset is not None:
            chunk = self.board.reg_read(offset, 4 * n)
            self._counters[_TLPS] += n
            self._complete(CPL_SC, 4, int.from_bytes(chunk[-4:], "little"))
        else:
            out = bytearray()
            addr = self.dma_addr
            for _ in range(n):
                x[REG_STATUS] = 0
                self._tlp(self.dma_fmt, self._stream_address(addr), self.dma_be,
                          int.from_bytes(x[REG_DATA:REG_DATA + 4], "big"))
                if not x[REG_STATUS] & (STATUS_ERROR | STATUS_COMPLETE):
                    self.hung = True                    # polls forever for a completion
                    return
                out += x[REG_DATA:REG_DATA + 4][::-1]
                addr = (addr + 4) & 0xFFFFFFFF
            chunk = bytes(out)
        self.dma_addr = (self.dma_addr + 4 * n) & 0xFFFFFFFF
        self.dma_dwords -= n
        self.in_queue.append(chunk)

    def _out_packet(self, packet: memoryview) -> bool:
        """The firmware's bulk OUT handler: False when the packet is dropped."""
        dwords = len(packet) >> 2
        if self.dma_dwords < dwords:
            self.out_armed = False                      # dropped, and the endpoint stays unarmed
            return False
        offset = self._fast_stream_offset(dwords, read=False) if dwords else None
        if offset is not None:
            self.board.reg_write(offset, bytes(packet[:4 * dwords]))
            self._counters[_TLPS] += dwords
            self.xdata[REG_DATA:REG_DATA + 4] = bytes(packet[4 * dwords - 4:4 * dwords])[::-1]
            self.xdata[REG_STATUS] = 0
        else:
            x = self.xdata
            addr = self.dma_addr
            for i in range(dwords):
                value = int.from_bytes(packet[4 * i:4 * i + 4], "little")
                struct.pack_into(">I", x, REG_DATA, value)
                x[REG_STATUS] = 0
                self._tlp(self.dma_fmt, self._stream_address(addr), self.dma_be, value)
                addr = (addr + 4) & 0xFFFFFFFF
        self.dma_addr = (self.dma_addr + 4 * dwords) & 0xFFFFFFFF
        self.dma_dwords -= dwords
        self.out_armed = self.dma_dwords > 0
        return True

    # -- bulk transfers -------------------------------------------------------------------
    def bulk_out(self, endpoint: int, data: memoryview, timeout: int) -> int:
        self.begin()
        self._counters[_BULK] += 1
        if endpoint != 0x02 or not self.configuration:
            raise usb_error(LIBUSB_ERROR_IO)
        total = len(data)
        sent = 0
        latency = self._latency("bulk", self._bulk_cost)
        self.charge(latency)                            # the data lands after the fixed latency
        complete = self.out_armed and not self.hung
        if complete:
            if total == 0:
                self._out_packet(data)
            while sent < total:
                packet = data[sent:sent + self.max_packet]
                if not self.out_armed or not self._out_packet(packet):
                    complete = False
                    break
                sent += len(packet)
        self._counters[_BULK_BYTES] += sent
        self.charge(sent * self._write_byte)
        if complete:
            return sent
        self.wait_out(timeout, already=latency + sent * self._write_byte)
        if sent:
            return sent                                 # libusb: a partial transfer is not an error
        raise usb_error(LIBUSB_ERROR_TIMEOUT)

    def bulk_in(self, endpoint: int, buf: memoryview, timeout: int) -> int:
        self.begin()
        self._counters[_BULK] += 1
        if endpoint != 0x81 or not self.configuration:
            raise usb_error(LIBUSB_ERROR_IO)
        room = len(buf)
        got = 0
        complete = False
        queue = self.in_queue
        latency = self._latency("bulk", self._bulk_cost)
        self.charge(latency)                            # later chunks are fetched from here on
        while queue and not self.hung:
            packet = queue[0]
            size = len(packet)
            if size > room - got:
                self._take_packet()
                self._counters[_BULK_BYTES] += got
                self.charge(got * self._read_byte)
                raise usb_error(LIBUSB_ERROR_OVERFLOW)
            buf[got:got + size] = packet
            got += size
            self._take_packet()
            if size < self.max_packet or got == room:
                complete = True
                break
        self._counters[_BULK_BYTES] += got
        self.charge(got * self._read_byte)
        if complete:
            return got
        self.wait_out(timeout, already=latency + got * self._read_byte)
        if got:
            return got
        raise usb_error(LIBUSB_ERROR_TIMEOUT)

    def _take_packet(self) -> None:
        self.in_queue.popleft()
        if not self.in_queue and self.dma_dwords > 0:
            self._fetch_in_chunk()


def _byte_count(be: int) -> int:
    """Completion byte count of a one-dword read (PCIe: first to last enabled byte)."""
    if not be:
        return 1
    return _highest(be) - _lowest(be) + 1


def _lowest(be: int) -> int:
    return (be & -be).bit_length() - 1


def _highest(be: int) -> int:
    return be.bit_length() - 1


# -- the backend ------------------------------------------------------------------------------

class SimUsbBackend(usb.backend.IBackend):
    """pyusb backend presenting one emulated ASM24 bridge per board directory.

    `boards`: paths, or (path, {option: value}) pairs; keyword options (see BridgeOptions)
    apply to every bridge. Each bridge holds its `Board` open until `close()`.
    """

    ROOT_BUS = 2

    def __init__(self, boards: Iterable[BoardSpec], **options: Any):
        super().__init__()
        BridgeOptions.resolve(options)                  # reject unknown names early
        self.hub = _RootHub(self.ROOT_BUS)
        self.bridges: list[_Asm24] = []
        self._closed = False
        seen: set[Path] = set()
        try:
            for i, spec in enumerate(boards):
                path, own = (spec if isinstance(spec, tuple) else (spec, {}))
                resolved = Path(path).resolve()
                if resolved in seen:
                    raise ValueError(f"{path}: the same board twice")
                seen.add(resolved)
                board = Board(path)
                try:
                    opts = BridgeOptions.resolve(board.config.get("bridge") or {}, options, own)
                    self.bridges.append(_Asm24(board, opts, self.hub, address=2 + i, port=1 + i))
                except BaseException:
                    board.close()
                    raise
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for bridge in self.bridges:
            bridge.gone = True
            bridge.board.close()

    def _finalize_object(self) -> None:
        self.close()

    def clock_for(self, device: Any) -> Any:
        """The virtual clock of the board behind `device` (a pyusb Device).

        A transport that finds this hook times its waits on the board's clock, as it would
        on a real bridge's wall clock; without it, it would wait in wall time for virtual
        busy periods that only pass when accesses are charged.
        """
        return self._bridge(device).board.clock

    def lock_path_for(self, device: Any) -> Path:
        """The object whose lock is this bridge's: the board directory, which `sim:PATH` locks
        too, so a board reached both ways is one board to every process."""
        return Path(self._bridge(device).board.path).resolve()

    def diagnostics_for(self, device: Any) -> Callable[[], dict[str, int]]:
        """For a transport that records what the board saw go wrong while it had it open."""
        from amdflash.stages.sim.bar import DIAGNOSTIC_COUNTERS

        counters = self._bridge(device).board.counters
        start = {name: counters[C[name]] for name in DIAGNOSTIC_COUNTERS}
        return lambda: {name: int(counters[C[name]] - value) for name, value in start.items()}

    def _bridge(self, device: Any) -> _Asm24:
        for bridge in self.bridges:
            d = bridge.descriptors.device
            if (d.bus, d.address) == (device.bus, device.address):
                return bridge
        raise LookupError(f"no emulated bridge at bus {device.bus} address {device.address}")

    def __enter__(self) -> SimUsbBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- enumeration and descriptors ------------------------------------------------------
    def enumerate_devices(self) -> list[_SimDevice]:
        return [self.hub, *(b for b in self.bridges if not b.gone)]

    def get_parent(self, dev: _SimDevice) -> _SimDevice | None:
        return dev.parent

    def get_device_descriptor(self, dev: _SimDevice) -> SimpleNamespace:
        return dev.descriptors.device

    def get_configuration_descriptor(self, dev: _SimDevice, config: int) -> SimpleNamespace:
        if config != 0:
            raise usb_error(LIBUSB_ERROR_NOT_FOUND)
        return dev.descriptors.config

    def get_interface_descriptor(self, dev: _SimDevice, intf: int, alt: int, config: int) -> SimpleNamespace:
        self.get_configuration_descriptor(dev, config)
        if intf >= 1:
            raise IndexError(f"Invalid interface index {intf}")
        if alt >= len(dev.descriptors.interfaces):
            raise IndexError(f"Invalid alternate setting index {alt}")
        return dev.descriptors.interfaces[alt]

    def get_endpoint_descriptor(self, dev: _SimDevice, ep: int, intf: int, alt: int, config: int) -> SimpleNamespace:
        self.get_interface_descriptor(dev, intf, alt, config)
        endpoints = dev.descriptors.endpoints[alt]
        if not 0 <= ep < len(endpoints):
            raise IndexError(f"Invalid endpoint index {ep}")
        return endpoints[ep]

    # -- handles, configuration, interfaces -----------------------------------------------
    def open_device(self, dev: _RootHub | _Asm24) -> _Handle:
        dev.check_present()
        return _Handle(dev)

    def close_device(self, dev_handle: _Handle) -> None:
        dev = dev_handle.device
        for intf in [i for i, h in dev.claims.items() if h is dev_handle]:
            del dev.claims[intf]

    def set_configuration(self, dev_handle: _Handle, config_value: int) -> None:
        dev = dev_handle.device
        dev.check_present()
        if isinstance(dev, _RootHub) or dev.claims or dev.kernel_driver:
            raise usb_error(LIBUSB_ERROR_BUSY)
        if config_value not in (0, 1):
            raise usb_error(LIBUSB_ERROR_NOT_FOUND)
        with dev.lock:
            dev.control(0x00, 0x09, config_value, 0, memoryview(b""), KERNEL_TIMEOUT_MS)
        dev.configuration = config_value
        dev.alt = 0

    def get_configuration(self, dev_handle: _Handle) -> int:
        dev = dev_handle.device
        dev.check_present()
        return dev.configuration

    def set_interface_altsetting(self, dev_handle: _Handle, intf: int, altsetting: int) -> None:
        dev = dev_handle.device
        dev.check_present()
        if dev.claims.get(intf) is not dev_handle:
            raise usb_error(LIBUSB_ERROR_NOT_FOUND)
        if altsetting >= len(dev.descriptors.interfaces):
            raise usb_error(LIBUSB_ERROR_NOT_FOUND)
        with dev.lock:
            dev.control(0x01, 0x0B, altsetting, intf, memoryview(b""), KERNEL_TIMEOUT_MS)
        dev.alt = altsetting

    def claim_interface(self, dev_handle: _Handle, intf: int) -> None:
        dev = dev_handle.device
        dev.check_present()
        if not dev.configuration or intf != 0:
            raise usb_error(LIBUSB_ERROR_NOT_FOUND)
        owner = dev.claims.get(intf)
        if owner is dev_handle:
            return
        if owner is not None or dev.kernel_driver:
            raise usb_error(LIBUSB_ERROR_BUSY)
        dev.claims[intf] = dev_handle

    def release_interface(self, dev_handle: _Handle, intf: int) -> None:
        dev = dev_handle.device
        if dev.claims.get(intf) is not dev_handle:
            raise usb_error(LIBUSB_ERROR_NOT_FOUND)
        del dev.claims[intf]
        dev.check_present()

    def is_kernel_driver_active(self, dev_handle: _Handle, intf: int) -> bool:
        dev = dev_handle.device
        dev.check_present()
        if not dev.configuration or intf != 0:
            raise usb_error(LIBUSB_ERROR_NOT_FOUND)
        return dev.kernel_driver

    def detach_kernel_driver(self, dev_handle: _Handle, intf: int) -> None:
        dev = dev_handle.device
        if not self.is_kernel_driver_active(dev_handle, intf):
            raise usb_error(LIBUSB_ERROR_NOT_FOUND)
        if isinstance(dev, _RootHub):
            raise usb_error(LIBUSB_ERROR_BUSY)
        dev.kernel_driver = False

    def attach_kernel_driver(self, dev_handle: _Handle, intf: int) -> None:
        dev = dev_handle.device
        if self.is_kernel_driver_active(dev_handle, intf) or intf in dev.claims:
            raise usb_error(LIBUSB_ERROR_BUSY)
        dev.kernel_driver = True

    # -- transfers ------------------------------------------------------------------------
    def ctrl_transfer(self, dev_handle: _Handle, bmRequestType: int, bRequest: int, wValue: int,
                      wIndex: int, data: Any, timeout: int) -> int:
        dev = dev_handle.device
        buf = memoryview(data).cast("B")
        if isinstance(dev, _RootHub):
            return dev.control(bmRequestType, bRequest, wValue, wIndex, buf)
        with dev.lock:
            return dev.control(bmRequestType, bRequest, wValue, wIndex, buf, timeout)

    def bulk_write(self, dev_handle: _Handle, ep: int, intf: int, data: Any, timeout: int) -> int:
        dev = dev_handle.device
        if isinstance(dev, _RootHub):
            raise usb_error(LIBUSB_ERROR_IO)
        with dev.lock:
            return dev.bulk_out(ep, memoryview(data).cast("B"), timeout)

    def bulk_read(self, dev_handle: _Handle, ep: int, intf: int, buff: Any, timeout: int) -> int:
        dev = dev_handle.device
        if isinstance(dev, _RootHub):
            raise usb_error(LIBUSB_ERROR_IO)
        with dev.lock:
            return dev.bulk_in(ep, memoryview(buff).cast("B"), timeout)

    def intr_write(self, dev_handle: _Handle, ep: int, intf: int, data: Any, timeout: int) -> int:
        dev_handle.device.check_present()
        raise usb_error(LIBUSB_ERROR_IO)            # no interrupt OUT endpoint anywhere

    def intr_read(self, dev_handle: _Handle, ep: int, intf: int, buff: Any, timeout: int) -> int:
        dev = dev_handle.device
        dev.check_present()
        if isinstance(dev, _RootHub) and ep == 0x81:
            raise usb_error(LIBUSB_ERROR_TIMEOUT)   # no port changes to report
        raise usb_error(LIBUSB_ERROR_IO)

    def iso_write(self, dev_handle: _Handle, ep: int, intf: int, data: Any, timeout: int) -> int:
        dev_handle.device.check_present()
        raise usb_error(LIBUSB_ERROR_IO)

    def iso_read(self, dev_handle: _Handle, ep: int, intf: int, buff: Any, timeout: int) -> int:
        dev_handle.device.check_present()
        raise usb_error(LIBUSB_ERROR_IO)

    def clear_halt(self, dev_handle: _Handle, ep: int) -> None:
        dev = dev_handle.device
        dev.check_present()
        if not dev.configuration or ep not in dev.descriptors.endpoint_addresses[dev.alt]:
            raise usb_error(LIBUSB_ERROR_NOT_FOUND)
        if isinstance(dev, _RootHub):
            return
        with dev.lock:
            dev.control(0x02, 0x01, 0, ep, memoryview(b""), KERNEL_TIMEOUT_MS)

    def reset_device(self, dev_handle: _Handle) -> None:
        dev = dev_handle.device
        dev.check_present()
        if isinstance(dev, _RootHub):
            raise usb_error(LIBUSB_ERROR_NOT_FOUND)
        with dev.lock:
            if dev.hung:
                raise usb_error(LIBUSB_ERROR_NOT_FOUND)     # re-enumeration fails
            # The kernel restores the configuration after the port reset.
            dev.control(0x00, 0x09, dev.configuration, 0, memoryview(b""), KERNEL_TIMEOUT_MS)
