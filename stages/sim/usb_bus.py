"""The emulated USB bus: what every device on it shows libusb, and the xHCI root hub.

Descriptors (device, configuration, string, BOS: the objects pyusb's IBackend getters hand
out and the bytes GET_DESCRIPTOR answers), the host's view of a device's state (its
configuration, alternate setting, claims, whether a kernel driver holds it), libusb's error
codes as pyusb's libusb1 backend raises them, and the root hub every bridge hangs off.
The bridge's firmware is asm24_firmware.py; the backend pyusb talks to is usb.py.

The bridge's configuration descriptor lists interface 0's alternate setting 0 (the two bulk
endpoints the protocol uses) and alternate setting 1 (UAS: four bulk endpoints with streams
and pipe usage descriptors), 121 bytes in all; the firmware treats both alike. On a USB 2
port it lists one setting with four 512-byte bulk endpoints.
"""
from __future__ import annotations

import errno as _errno
import struct
import threading
from types import SimpleNamespace
from typing import Any

import usb.core

MAX_PACKET = 1024
USB2_MAX_PACKET = 512

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


def usb_error(code: int) -> usb.core.USBError:
    text, err = _ERRORS[code]
    cls = usb.core.USBTimeoutError if code == LIBUSB_ERROR_TIMEOUT else usb.core.USBError
    return cls(text, code, err)


def _string_descriptor(text: str) -> bytes:
    raw = text.encode("utf-16-le")
    return bytes((2 + len(raw), 3)) + raw


def _desc(**fields_: Any) -> SimpleNamespace:
    return SimpleNamespace(**fields_)


Endpoints = list[tuple[dict[str, int], bytes]]      # (endpoint fields, extra descriptor bytes)


class Descriptors:
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


def bridge_descriptors(*, usb2: bool, vendor_id: int, product_id: int, product: str, serial: str,
                       bus: int, address: int, port: int) -> Descriptors:
    """A bridge's descriptor set as the firmware reports it (docs/bridge.md, "Identity"):
    SuperSpeed with the UAS setting, or high speed on a USB 2 port."""
    return Descriptors(
        device=dict(bcdUSB=0x0200 if usb2 else 0x0320, bDeviceClass=0, bDeviceSubClass=0,
                    bDeviceProtocol=0, bMaxPacketSize0=64 if usb2 else 9, idVendor=vendor_id,
                    idProduct=product_id, bcdDevice=0x0001),
        config=dict(bConfigurationValue=1, iConfiguration=0, bmAttributes=0xC0, bMaxPower=0),
        interfaces=_usb2_interfaces() if usb2 else _usb3_interfaces(),
        strings=["tiny", product, serial],
        bos=_BOS, bus=bus, address=address, port=port,
        speed=LIBUSB_SPEED_HIGH if usb2 else LIBUSB_SPEED_SUPER)


class SimDevice:
    """Common ground of the root hub and the bridges: identity, handles, claims."""

    descriptors: Descriptors
    parent: SimDevice | None = None

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.gone = False
        self.configuration = 1          # the kernel configured the device at enumeration
        self.claims: dict[int, object] = {}     # interface: the backend's handle that claimed it
        self.kernel_driver = False
        self.alt = 0                    # interface 0's selected alternate setting

    def check_present(self) -> None:
        if self.gone:
            raise usb_error(LIBUSB_ERROR_NO_DEVICE)


class RootHub(SimDevice):
    """The SuperSpeed root hub of an xHCI controller: parent of every bridge."""

    def __init__(self, bus: int):
        super().__init__()
        self.kernel_driver = True
        self.descriptors = Descriptors(
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
