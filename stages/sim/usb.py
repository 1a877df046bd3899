"""The emulated ASM24 USB-to-PCIe bridge, as a pyusb backend (docs/bridge.md is the contract).

    backend = SimUsbBackend([board_a, board_b], pcie_on_at_boot=False)
    dev = usb.core.find(backend=backend, idVendor=0xADD1)

Each board directory becomes one SuperSpeed bridge on bus 2 (or a high-speed one, with the
`usb2` option), behind an emulated xHCI root hub (what libusb lists as its parent), with
the board's serial. A driver sees the wire protocol of the custom firmware and libusb's
behaviour around it, failures included. Three modules, along the seams a real host has:

* usb_bus.py: the bus — descriptors (the 121-byte configuration descriptor with its UAS
  setting), the host's view of each device, libusb's error codes, the root hub;
* asm24_firmware.py: the firmware — control requests, XDATA, PCIe power, the TLP engine,
  the streamed modes, what each transfer costs, and the assumptions where neither the spec
  nor the firmware source decides;
* this module: the backend pyusb calls — enumeration, handles, configuration, claims and
  kernel drivers as libusb on Linux keeps them, each transfer handed to its device.

Choices of the host side where neither the spec nor the firmware source decides (assumptions):

* GET_CONFIGURATION is answered from the host's cache, as libusb does on Linux (the
  kernel configured the device at enumeration, so it answers 1 until the driver sets 0);
  no transfer reaches the firmware, which would not answer it;
* a port reset (reset_device) costs one control transfer; the firmware ignores bus resets
  and the kernel re-sends SET_CONFIGURATION, which cancels streams;
* a new backend is a re-plug: XDATA, link state, streams and PCIe config start afresh;
* a bridge gone with usb-disconnect-after (asm24_firmware.py) leaves `enumerate_devices`.
"""
from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from collections.abc import Callable, Iterable, Mapping

import usb.backend

from amdflash.stages.sim.asm24_firmware import Asm24, BridgeOptions
from amdflash.stages.sim.board import Board
from amdflash.stages.sim.state import C
from amdflash.stages.sim.usb_bus import (LIBUSB_ERROR_BUSY, LIBUSB_ERROR_IO, LIBUSB_ERROR_NOT_FOUND,
                                        LIBUSB_ERROR_TIMEOUT, RootHub, SimDevice, usb_error)

KERNEL_TIMEOUT_MS = 5000          # Linux USB_CTRL_SET_TIMEOUT, for requests the kernel sends

PathLike = str | os.PathLike
BoardSpec = PathLike | tuple[PathLike, Mapping[str, Any]]


class Handle:
    """What open_device hands pyusb: one opening of a device, which may claim its interface."""

    def __init__(self, device: RootHub | Asm24):   # the only kinds of device there are
        self.device = device


class SimUsbBackend(usb.backend.IBackend):
    """pyusb backend presenting one emulated ASM24 bridge per board directory.

    `boards`: paths, or (path, {option: value}) pairs; keyword options (see BridgeOptions)
    apply to every bridge. Each bridge holds its `Board` open until `close()`.
    """

    ROOT_BUS = 2

    def __init__(self, boards: Iterable[BoardSpec], **options: Any):
        super().__init__()
        BridgeOptions.resolve(options)                  # reject unknown names early
        self.hub = RootHub(self.ROOT_BUS)
        self.bridges: list[Asm24] = []
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
                    self.bridges.append(Asm24(board, opts, self.hub, address=2 + i, port=1 + i))
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

    def _bridge(self, device: Any) -> Asm24:
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
    def enumerate_devices(self) -> list[SimDevice]:
        return [self.hub, *(b for b in self.bridges if not b.gone)]

    def get_parent(self, dev: SimDevice) -> SimDevice | None:
        return dev.parent

    def get_device_descriptor(self, dev: SimDevice) -> SimpleNamespace:
        return dev.descriptors.device

    def get_configuration_descriptor(self, dev: SimDevice, config: int) -> SimpleNamespace:
        if config != 0:
            raise usb_error(LIBUSB_ERROR_NOT_FOUND)
        return dev.descriptors.config

    def get_interface_descriptor(self, dev: SimDevice, intf: int, alt: int, config: int) -> SimpleNamespace:
        self.get_configuration_descriptor(dev, config)
        if intf >= 1:
            raise IndexError(f"Invalid interface index {intf}")
        if alt >= len(dev.descriptors.interfaces):
            raise IndexError(f"Invalid alternate setting index {alt}")
        return dev.descriptors.interfaces[alt]

    def get_endpoint_descriptor(self, dev: SimDevice, ep: int, intf: int, alt: int, config: int) -> SimpleNamespace:
        self.get_interface_descriptor(dev, intf, alt, config)
        endpoints = dev.descriptors.endpoints[alt]
        if not 0 <= ep < len(endpoints):
            raise IndexError(f"Invalid endpoint index {ep}")
        return endpoints[ep]

    # -- handles, configuration, interfaces -----------------------------------------------
    def open_device(self, dev: RootHub | Asm24) -> Handle:
        dev.check_present()
        return Handle(dev)

    def close_device(self, dev_handle: Handle) -> None:
        dev = dev_handle.device
        for intf in [i for i, h in dev.claims.items() if h is dev_handle]:
            del dev.claims[intf]

    def set_configuration(self, dev_handle: Handle, config_value: int) -> None:
        dev = dev_handle.device
        dev.check_present()
        if isinstance(dev, RootHub) or dev.claims or dev.kernel_driver:
            raise usb_error(LIBUSB_ERROR_BUSY)
        if config_value not in (0, 1):
            raise usb_error(LIBUSB_ERROR_NOT_FOUND)
        with dev.lock:
            dev.control(0x00, 0x09, config_value, 0, memoryview(b""), KERNEL_TIMEOUT_MS)
        dev.configuration = config_value
        dev.alt = 0

    def get_configuration(self, dev_handle: Handle) -> int:
        dev = dev_handle.device
        dev.check_present()
        return dev.configuration

    def set_interface_altsetting(self, dev_handle: Handle, intf: int, altsetting: int) -> None:
        dev = dev_handle.device
        dev.check_present()
        if dev.claims.get(intf) is not dev_handle:
            raise usb_error(LIBUSB_ERROR_NOT_FOUND)
        if altsetting >= len(dev.descriptors.interfaces):
            raise usb_error(LIBUSB_ERROR_NOT_FOUND)
        with dev.lock:
            dev.control(0x01, 0x0B, altsetting, intf, memoryview(b""), KERNEL_TIMEOUT_MS)
        dev.alt = altsetting

    def claim_interface(self, dev_handle: Handle, intf: int) -> None:
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

    def release_interface(self, dev_handle: Handle, intf: int) -> None:
        dev = dev_handle.device
        if dev.claims.get(intf) is not dev_handle:
            raise usb_error(LIBUSB_ERROR_NOT_FOUND)
        del dev.claims[intf]
        dev.check_present()

    def is_kernel_driver_active(self, dev_handle: Handle, intf: int) -> bool:
        dev = dev_handle.device
        dev.check_present()
        if not dev.configuration or intf != 0:
            raise usb_error(LIBUSB_ERROR_NOT_FOUND)
        return dev.kernel_driver

    def detach_kernel_driver(self, dev_handle: Handle, intf: int) -> None:
        dev = dev_handle.device
        if not self.is_kernel_driver_active(dev_handle, intf):
            raise usb_error(LIBUSB_ERROR_NOT_FOUND)
        if isinstance(dev, RootHub):
            raise usb_error(LIBUSB_ERROR_BUSY)
        dev.kernel_driver = False

    def attach_kernel_driver(self, dev_handle: Handle, intf: int) -> None:
        dev = dev_handle.device
        if self.is_kernel_driver_active(dev_handle, intf) or intf in dev.claims:
            raise usb_error(LIBUSB_ERROR_BUSY)
        dev.kernel_driver = True

    # -- transfers ------------------------------------------------------------------------
    def ctrl_transfer(self, dev_handle: Handle, bmRequestType: int, bRequest: int, wValue: int,
                      wIndex: int, data: Any, timeout: int) -> int:
        dev = dev_handle.device
        buf = memoryview(data).cast("B")
        if isinstance(dev, RootHub):
            return dev.control(bmRequestType, bRequest, wValue, wIndex, buf)
        with dev.lock:
            return dev.control(bmRequestType, bRequest, wValue, wIndex, buf, timeout)

    def bulk_write(self, dev_handle: Handle, ep: int, intf: int, data: Any, timeout: int) -> int:
        dev = dev_handle.device
        if isinstance(dev, RootHub):
            raise usb_error(LIBUSB_ERROR_IO)
        with dev.lock:
            return dev.bulk_out(ep, memoryview(data).cast("B"), timeout)

    def bulk_read(self, dev_handle: Handle, ep: int, intf: int, buff: Any, timeout: int) -> int:
        dev = dev_handle.device
        if isinstance(dev, RootHub):
            raise usb_error(LIBUSB_ERROR_IO)
        with dev.lock:
            return dev.bulk_in(ep, memoryview(buff).cast("B"), timeout)

    def intr_write(self, dev_handle: Handle, ep: int, intf: int, data: Any, timeout: int) -> int:
        dev_handle.device.check_present()
        raise usb_error(LIBUSB_ERROR_IO)            # no interrupt OUT endpoint anywhere

    def intr_read(self, dev_handle: Handle, ep: int, intf: int, buff: Any, timeout: int) -> int:
        dev = dev_handle.device
        dev.check_present()
        if isinstance(dev, RootHub) and ep == 0x81:
            raise usb_error(LIBUSB_ERROR_TIMEOUT)   # no port changes to report
        raise usb_error(LIBUSB_ERROR_IO)

    def iso_write(self, dev_handle: Handle, ep: int, intf: int, data: Any, timeout: int) -> int:
        dev_handle.device.check_present()
        raise usb_error(LIBUSB_ERROR_IO)

    def iso_read(self, dev_handle: Handle, ep: int, intf: int, buff: Any, timeout: int) -> int:
        dev_handle.device.check_present()
        raise usb_error(LIBUSB_ERROR_IO)

    def clear_halt(self, dev_handle: Handle, ep: int) -> None:
        dev = dev_handle.device
        dev.check_present()
        if not dev.configuration or ep not in dev.descriptors.endpoint_addresses[dev.alt]:
            raise usb_error(LIBUSB_ERROR_NOT_FOUND)
        if isinstance(dev, RootHub):
            return
        with dev.lock:
            dev.control(0x02, 0x01, 0, ep, memoryview(b""), KERNEL_TIMEOUT_MS)

    def reset_device(self, dev_handle: Handle) -> None:
        dev = dev_handle.device
        dev.check_present()
        if isinstance(dev, RootHub):
            raise usb_error(LIBUSB_ERROR_NOT_FOUND)
        with dev.lock:
            if dev.hung:
                raise usb_error(LIBUSB_ERROR_NOT_FOUND)     # re-enumeration fails
            # The kernel restores the configuration after the port reset.
            dev.control(0x00, 0x09, dev.configuration, 0, memoryview(b""), KERNEL_TIMEOUT_MS)
