"""Finding boards and opening a board spec: USB bridges first, then native PCI devices.

Specs: `auto` (the first USB bridge, else the first native PCI device — through amdgpu when
that driver is bound and offers psp_vbflash, unless --unbind-driver), `usb` / `usb:N` /
`usb:SERIAL`, `pci` / `pci:DDDD:BB:DD.F`, `amdgpu` / `amdgpu:DDDD:BB:DD.F` (a healthy board
with the amdgpu driver bound: no BAR5, see transport/amdgpu.py). `sim:PATH` never gets here
(open_transport handles it). Every board is locked (`BoardLock`, keyed by bridge serial or PCI address)
before anything is sent to it, so a second process gets "board busy (pid N)".

Emulated USB bridges are used only when chosen explicitly: `AMDFLASH_SIM_USB=DIR[,DIR...]`
replaces libusb with the emulated pyusb backend serving those board directories, and
says so; the backend comes from the `Emulators` the caller hands in (transport/emulated.py:
only stages/open_transport.py hands one that can build it). Nothing ever falls back to an
emulator, nor from one to hardware. `AMDFLASH_SYSFS_PCI` points native PCI
discovery at another sysfs devices directory (tests); the board spec's
`unbind_driver` (the CLI's --unbind-driver) lets the PCI transport unbind a bound kernel driver.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar
from collections.abc import Callable

import usb.core

from amdflash.stages.transport.amdgpu import AmdgpuBoard, AmdgpuDevice, attribute_io, find_amdgpu
from amdflash.stages.transport.base import Bar5, NoBoardFound, OpenBoard, ThroughAmdgpu, ThroughBar5, TransportError
from amdflash.stages.transport.emulated import ENV_SIM_USB, Emulators
from amdflash.stages.transport.lock import BoardBusy, BoardLock
from amdflash.stages.transport.pci import SYSFS_PCI_DEVICES, PciBar5, PciDevice, find_devices, normalise_address
from amdflash.stages.transport.usb import (BridgeInfo, LinkDown, UnexpectedDevice, UsbBar5, default_backend,
                                           device_node, find_bridges)

ENV_SYSFS_PCI = "AMDFLASH_SYSFS_PCI"
_SERIAL = re.compile(r"[0-9a-fA-F]{8}")

Announce = Callable[[str], None]


class Spec(Protocol):
    # Read-only: BoardSpec is a frozen dataclass.
    @property
    def kind(self) -> str: ...

    @property
    def selector(self) -> str: ...

    @property
    def unbind_driver(self) -> bool: ...


Probe = Callable[[Bar5], dict[str, Any]]


# -- USB -----------------------------------------------------------------------------------------

@dataclass
class UsbScan:
    """The bridges one backend shows; an emulated backend holds its boards until closed."""

    backend: Any
    bridges: list[BridgeInfo]
    emulated: bool

    @property
    def usable(self) -> list[BridgeInfo]:
        """What usb:N counts: bridges that are (or may be, permissions aside) our firmware."""
        return [b for b in self.bridges if not b.foreign_firmware]

    def close(self) -> None:
        if self.emulated:
            self.backend.close()


def emulated_usb_backend(paths: list[str], emulators: Emulators) -> Any:
    """The emulated bridge backend serving these board directories, built by `emulators`."""
    for path in paths:
        if not os.path.isfile(os.path.join(path, "board.json")):
            raise TransportError(f"{ENV_SIM_USB}: {path} is not an emulated board "
                                 "(create one with 'amdflash sim create')")
    if emulators.usb_backend is None:
        raise TransportError(f"{ENV_SIM_USB} is set, but this caller was handed no emulated USB backend "
                             "(boards are opened through amdflash.stages.open_transport)")
    return emulators.usb_backend(paths)


def scan_usb(announce: Announce, emulators: Emulators) -> UsbScan:
    selected = [p.strip() for p in os.environ.get(ENV_SIM_USB, "").split(",") if p.strip()]
    if selected:
        announce(f"{ENV_SIM_USB} is set: USB bridges are EMULATED boards ({', '.join(selected)}), not hardware")
        backend = emulated_usb_backend(selected, emulators)
        try:
            return UsbScan(backend, find_bridges(backend), emulated=True)
        except BaseException:
            backend.close()
            raise
    backend = default_backend()
    try:
        return UsbScan(backend, find_bridges(backend), emulated=False)
    except (usb.core.NoBackendError, usb.core.USBError) as e:
        announce(f"USB: cannot enumerate devices ({e}); looking for native PCI devices only")
        return UsbScan(backend, [], emulated=False)


def select_usb(bridges: list[BridgeInfo], selector: str) -> int:
    """Index into `bridges` for usb, usb:N or usb:SERIAL (8 hex digits)."""
    if not bridges:
        raise NoBoardFound("no board found: no ASM24 USB bridge (add1:0001 or 3801:0001) is connected")
    if not selector:
        return 0
    if _SERIAL.fullmatch(selector):
        matches = [i for i, b in enumerate(bridges) if (b.serial or "").lower() == selector.lower()]
        if len(matches) > 1:
            raise TransportError(f"usb:{selector}: {len(matches)} bridges share this serial; "
                                 f"use usb:N ({', '.join(f'usb:{i}' for i in matches)})")
        if matches:
            return matches[0]
        found = ", ".join(b.serial or "?" for b in bridges)
        raise NoBoardFound(f"usb:{selector}: no USB bridge with this serial (found: {found})")
    if selector.isdecimal():
        index = int(selector)
        if index < len(bridges):
            return index
        raise NoBoardFound(f"usb:{index}: only {len(bridges)} USB bridge(s) found (usb:0..usb:{len(bridges) - 1})")
    raise TransportError(f"usb:{selector}: expected a bridge index (usb:0) or an 8-hex-digit serial")


def usb_lock(backend: Any, bridge: BridgeInfo) -> BoardLock:
    """The bridge's lock: its device node, or what the backend says is the board behind it
    (an emulated bridge: the board's directory, the very lock its sim: spec takes)."""
    hook = getattr(backend, "lock_path_for", None)
    if hook is not None:
        return BoardLock(bridge.lock_key, hook(bridge.device))
    return BoardLock(bridge.lock_key, device_node(bridge.bus, bridge.address))


def _open_usb(scan: UsbScan, index: int) -> tuple[ThroughBar5, BoardLock]:
    bridge = scan.usable[index]
    try:
        lock = usb_lock(scan.backend, bridge).acquire()
    except BaseException:
        scan.close()
        raise
    try:
        bar = UsbBar5(bridge, scan.backend, on_close=scan.close)
    except BaseException:
        lock.release()
        scan.close()
        raise
    if scan.emulated:
        bar.identity.extra["emulated"] = True
    return ThroughBar5(bar), lock


# -- native PCI ----------------------------------------------------------------------------------

def sysfs_root() -> Path:
    return Path(os.environ.get(ENV_SYSFS_PCI) or SYSFS_PCI_DEVICES)


def _open_pci(device: PciDevice, announce: Announce, unbind_driver: bool) -> tuple[ThroughBar5, BoardLock]:
    lock = BoardLock(device.spec, device.path).acquire()
    try:
        return ThroughBar5(PciBar5(device, unbind_driver=unbind_driver, announce=announce)), lock
    except BaseException:
        lock.release()
        raise


def _select_pci(devices: list[PciDevice], selector: str) -> PciDevice:
    if not devices:
        raise NoBoardFound("no board found: no native Navi31 PCI device (1002:744c)")
    return _by_address(devices, selector, f"pci:{selector}: no Navi31")


_Addressed = TypeVar("_Addressed", PciDevice, AmdgpuDevice)


def _by_address(devices: list[_Addressed], selector: str, none_here: str) -> _Addressed:
    """The first device when no address is given, else the one at the address (BB:DD.F means domain 0)."""
    if not selector:
        return devices[0]
    address = normalise_address(selector).lower()
    for device in devices:
        if device.address.lower() == address:
            return device
    raise NoBoardFound(f"{none_here} at this address (found: {', '.join(d.address for d in devices)})")


# -- amdgpu ---------------------------------------------------------------------------------------

def _open_amdgpu(device: AmdgpuDevice, unbind_driver: bool, emulators: Emulators) -> tuple[ThroughAmdgpu, BoardLock]:
    if unbind_driver:
        raise TransportError(f"{device.spec} works through the bound amdgpu driver; --unbind-driver contradicts it "
                             f"(use pci:{device.address} --unbind-driver for the ROM_SW path)")
    lock = BoardLock(device.pci.spec, device.path).acquire()   # the PCI device's: never amdgpu and ROM_SW at once
    try:
        return ThroughAmdgpu(AmdgpuBoard(device, io=attribute_io(emulators))), lock
    except BaseException:
        lock.release()
        raise


def _select_amdgpu(devices: list[AmdgpuDevice], selector: str) -> AmdgpuDevice:
    if not devices:
        raise NoBoardFound("no board found: no Navi31 PCI device (1002:744c) with the amdgpu driver bound")
    return _by_address(devices, selector, f"amdgpu:{selector}: no amdgpu-bound Navi31")


def _list_amdgpu(device: AmdgpuDevice, emulators: Emulators) -> dict[str, Any]:
    """What the PCI entry of an amdgpu-bound device adds: its amdgpu: spec and the running VBIOS,
    read-only through the ioctl or sysfs (never the rom file, which needs enabling)."""
    entry: dict[str, Any] = {"spec_amdgpu": device.spec,
                             "psp_vbflash": "available" if device.can_flash else "absent (flash needs it)"}
    info, notes = AmdgpuBoard(device, io=attribute_io(emulators)).vbios_info(allow_rom=False)
    if info is not None:
        entry.update(part_number=info.part_number, vbios_version=info.version, vbios_source=info.source)
    else:
        entry["vbios_error"] = "; ".join(notes)
    return entry


# -- opening a spec -------------------------------------------------------------------------------

def open_spec(spec: Spec, announce: Announce, emulators: Emulators) -> tuple[OpenBoard, BoardLock]:
    """Open and lock the board a spec names, declaring which way it is driven (`auto` may land
    on either); `emulators` builds what AMDFLASH_SIM_* choose."""
    if spec.kind == "auto":
        scan = scan_usb(announce, emulators)
        if scan.usable:
            bridge = scan.usable[0]
            announce(f"auto: using usb:0 (ASM24 bridge {bridge.serial or bridge.usb_id}"
                     f"{', emulated' if scan.emulated else ''})")
            return _open_usb(scan, 0)
        scan.close()
        devices = find_devices(sysfs_root())
        if devices and devices[0].driver == "amdgpu" and not spec.unbind_driver \
                and AmdgpuDevice(devices[0]).can_flash:
            announce(f"auto: no USB bridge; using amdgpu:{devices[0].address} (amdgpu is bound: the PSP "
                     "updates the flash; --unbind-driver for the ROM_SW path instead)")
            return _open_amdgpu(AmdgpuDevice(devices[0]), False, emulators)
        if devices:
            announce(f"auto: no USB bridge; using {devices[0].spec} (native PCIe)")
            return _open_pci(devices[0], announce, spec.unbind_driver)
        raise NoBoardFound("no board found: no ASM24 USB bridge (add1:0001 or 3801:0001) and no native "
                           "Navi31 PCI device (1002:744c)")
    if spec.kind == "usb":
        scan = scan_usb(announce, emulators)
        try:
            index = select_usb(scan.usable, spec.selector)
        except BaseException:
            scan.close()
            raise
        return _open_usb(scan, index)
    if spec.kind == "pci":
        return _open_pci(_select_pci(find_devices(sysfs_root()), spec.selector), announce, spec.unbind_driver)
    if spec.kind == "amdgpu":
        return _open_amdgpu(_select_amdgpu(find_amdgpu(sysfs_root()), spec.selector), spec.unbind_driver, emulators)
    raise TransportError(f"board spec {spec.kind}:{spec.selector} is not a USB, PCI or amdgpu board")


# -- listing --------------------------------------------------------------------------------------

def _lock_for_listing(lock: BoardLock, entry: dict[str, Any]) -> BoardLock | None:
    """The board's lock, or None with the entry saying who holds it: `list` never waits."""
    try:
        return lock.acquire()
    except BoardBusy as e:
        entry["status"] = f"busy (pid {e.pid})" if e.pid else "busy"
        return None


def _list_usb(index: int | None, bridge: BridgeInfo, scan: UsbScan, probe: Probe) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "spec": f"usb:{index}" if index is not None else None,
        "spec_serial": f"usb:{bridge.serial}" if index is not None and bridge.serial else None,
        "kind": "usb", "serial": bridge.serial, "usb_id": bridge.usb_id, "product": bridge.product,
        "bus": bridge.bus, "address": bridge.address, "emulated": True if scan.emulated else None,
    }
    if bridge.error:
        entry["error"] = bridge.error
        return entry
    lock = _lock_for_listing(usb_lock(scan.backend, bridge), entry)
    if lock is None:
        return entry
    try:
        bar = UsbBar5(bridge, scan.backend)
    except LinkDown as e:
        entry.update(link="down", error=str(e))
    except UnexpectedDevice as e:
        entry.update(link="up", pci_ids=f"{e.vendor_id:04x}:{e.device_id:04x}", error=str(e))
    except TransportError as e:
        entry["error"] = str(e)
    else:
        try:
            entry.update(link="up", pci_ids=f"{bar.identity.vendor_id:04x}:{bar.identity.device_id:04x}",
                         bar5=bar.identity.extra["bar5"])
            entry.update(probe(bar))
        except TransportError as e:
            entry["error"] = str(e)
        finally:
            bar.close()
    finally:
        lock.release()
    return entry


def _list_pci(device: PciDevice, announce: Announce, probe: Probe) -> dict[str, Any]:
    entry: dict[str, Any] = {"spec": device.spec, "kind": "pci", "pci_address": device.address,
                             "pci_ids": f"{device.vendor_id:04x}:{device.device_id:04x}", "driver": device.driver}
    if device.driver:
        entry["status"] = f"kernel driver {device.driver} bound: not probed (see --unbind-driver)"
        return entry
    lock = _lock_for_listing(BoardLock(device.spec, device.path), entry)
    if lock is None:
        return entry
    try:
        bar = PciBar5(device, announce=announce)
        try:
            entry.update(probe(bar))
        finally:
            bar.close()
    except TransportError as e:
        entry["error"] = str(e)
    finally:
        lock.release()
    return entry


def list_boards(announce: Announce, probe: Probe, emulators: Emulators) -> list[dict[str, Any]]:
    """Every USB bridge and native Navi31, with spec, identity and link; `probe(bar)` (from the
    layer above, which knows the flash) adds what the board itself answers."""
    boards: list[dict[str, Any]] = []
    scan = scan_usb(announce, emulators)
    try:
        index = 0
        for bridge in scan.bridges:
            if bridge.foreign_firmware:
                boards.append(_list_usb(None, bridge, scan, probe))
            else:
                boards.append(_list_usb(index, bridge, scan, probe))
                index += 1
    finally:
        scan.close()
    for device in find_devices(sysfs_root()):
        entry = _list_pci(device, announce, probe)
        if device.driver == "amdgpu":
            entry.update(_list_amdgpu(AmdgpuDevice(device), emulators))
        boards.append(entry)
    return boards
