"""BAR5 over the custom ASM24 USB-to-PCIe bridge firmware, driven with pyusb (docs/bridge.md).

Three layers, each a small piece:

* `find_bridges(backend)` lists the bridges (VID:PID, product string, serial) in a stable
  port order; `usb:N` indexes this list.
* `Asm24` speaks the firmware's wire protocol: XDATA, the TLP engine in mode 0 (single
  TLPs with completions, the retry rule) and the streamed modes 1/2 on the bulk endpoints.
  Every USB failure becomes a `TransportError` naming the operation; after a disconnect
  nothing is sent any more, so no loop can spin on a device that is gone.
* `UsbBar5` brings the PCIe hierarchy up (link, bridge bus numbers and windows, Resizable
  BAR, BAR placement), checks the GPU is a Navi31 before BAR5 is touched, and offers the
  `Bar5` interface: single registers as single TLPs (a posted write is one control OUT; a
  read is control OUT + control IN), blocks as streamed accesses. (The reference client's
  stack streamed every access; the ROM_SW driver checks single-TLP access against streams
  on each board before relying on it.)

Timeouts are tinygrad's host code's: 5 s for a control transfer (the firmware busy-polls a
TLP's completion inside it), 30 s for a streamed read's bulk IN, 10 s for F3. A stream that
has to be abandoned is ended with CLEAR_FEATURE(HALT) and the IN endpoint is drained, since
a chunk the firmware had already queued may still arrive.

The transport clock is the backend's `clock_for(device)` when the backend offers one
(a backend that models time, such as an emulated bridge), else wall time.
"""
from __future__ import annotations

import errno
import os
import re
import struct
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable

import usb.core
import usb.util

from amdflash.stages.transport.base import BoardIdentity, Clock, TransportError, WallClock

BRIDGE_IDS: tuple[tuple[int, int], ...] = ((0xADD1, 0x0001), (0x3801, 0x0001))
PRODUCT_PREFIXES = ("custom", "AS2462")
BLANK_SERIAL = "ffffffff"
SERIAL_FORMAT = re.compile(r"[0-9a-f]{8}")   # what the firmware reports (docs/bridge.md)
LANGID_EN_US = 0x0409
UDEV_RULES = (
    'SUBSYSTEMS=="usb", ATTRS{idVendor}=="add1", ATTRS{idProduct}=="0001", TAG+="uaccess"\n'
    'SUBSYSTEMS=="usb", ATTRS{idVendor}=="3801", ATTRS{idProduct}=="0001", TAG+="uaccess"'
)


def _shown(text: str) -> str:
    """A device's string as ASCII escapes (a newline, ESC or bidi override is shown, not obeyed), cut short."""
    return text.encode("unicode_escape", "backslashreplace").decode("ascii")[:64]


VENDOR_OUT, VENDOR_IN = 0x40, 0xC0
REQ_XDATA_READ, REQ_TLP, REQ_PCIE_POWER = 0xE4, 0xF0, 0xF3
EP_OUT, EP_IN = 0x02, 0x81
MODE_SINGLE, MODE_STREAM_WRITE, MODE_STREAM_READ = 0, 1, 2
MEM_READ, MEM_WRITE = 0x20, 0x60
CFG_READ, CFG_WRITE = 0x04, 0x44            # | 1 for type 1 (bus > 0)

XDATA_LTSSM = 0xB450
LTSSM_L0 = 0x78

CPL_UR = 1
COMPLETION_NAMES = {1: "unsupported request (UR)", 2: "configuration request retry (CRS)",
                    4: "completer abort (CA)"}
RETURN_NAMES = {1: "engine error", 0xFF: "poll timeout"}
TLP_RESENDS = 10
TLP_RETRY_WAIT = 1e-3

# Timeouts, as tinygrad's host code (the stack the reference client ran on) sets them.
CONTROL_TIMEOUT_MS = 5000                   # the firmware busy-polls a TLP's completion inside the transfer
LINK_TRAINING_TIMEOUT_MS = 10000            # F3: the firmware trains for up to ~2 s
STREAM_CHUNK = 0x10000                      # bytes per armed stream
BULK_IN_TIMEOUT_MS = 30000                  # a large streamed read may take long to start on a busy bus
BULK_OUT_TIMEOUT_BASE_MS = 1000
BULK_BYTES_PER_MS = 450                     # a quarter of the slower (read) stream rate
DRAIN_TIMEOUT_MS = 20                       # after an abort: a chunk already queued arrives at once
DRAIN_LIMIT = 64                            # chunks drained at most (the endpoint holds fewer)

BRIDGE_BUSES = range(4)
GPU_BUS = 4
NAVI31 = (0x1002, 0x744C)
EXT_CAP_START = 0x100
EXT_CAP_REBAR = 0x15
PREFETCH_WINDOW_BASE = 0x8_0000_0000
MEMORY_WINDOW_BASE = 0x1000_0000
BAR_GRANULE = 0x200000
BAR5_SIZE = 0x100000
COMMAND_IO_MEMORY_MASTER = 0x7


def default_backend() -> Any:
    """libusb from the libusb-package wheel, so `pip install` alone is enough.

    None lets pyusb search for a system libusb itself.
    """
    try:
        import libusb_package

        return libusb_package.get_libusb1_backend()
    except Exception:
        return None


def device_node(bus: int | None, address: int | None) -> str | None:
    """The bridge's device node (usbfs), the object its lock is taken on; None where there is none."""
    if bus is None or address is None:
        return None
    path = f"/dev/bus/usb/{bus:03d}/{address:03d}"
    return path if os.path.exists(path) else None


def clock_for(backend: Any, device: usb.core.Device) -> Clock:
    hook = getattr(backend, "clock_for", None)
    return hook(device) if hook is not None else WallClock()


# -- errors ---------------------------------------------------------------------------------------

class CompletionError(TransportError):
    """The completer answered a TLP with a status other than successful completion."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


class UnexpectedDevice(TransportError):
    """Something other than a Navi31 sits at 4:0.0; BAR5 was not touched."""

    def __init__(self, message: str, vendor_id: int, device_id: int):
        super().__init__(message)
        self.vendor_id = vendor_id
        self.device_id = device_id


class LinkDown(TransportError):
    """The PCIe link behind the bridge did not reach L0."""


def permission_hint() -> str:
    return ("permission denied opening the USB bridge; allow your user with a udev rule, e.g. in "
            "/etc/udev/rules.d/70-amdflash.rules:\n" + UDEV_RULES +
            "\nthen run 'udevadm control --reload' and re-plug the bridge")


def _is_disconnect(e: usb.core.USBError) -> bool:
    return e.errno == errno.ENODEV or getattr(e, "backend_error_code", None) == -4


def describe_usb_error(what: str, e: usb.core.USBError) -> TransportError:
    if isinstance(e, usb.core.USBTimeoutError) or e.errno == errno.ETIMEDOUT:
        return TransportError(f"{what}: USB timeout (the bridge did not answer)")
    if _is_disconnect(e):
        return TransportError(f"{what}: the USB bridge was disconnected")
    if e.errno == errno.EPIPE:
        return TransportError(f"{what}: USB stall (the bridge refused the request)")
    if e.errno == errno.EACCES:
        return TransportError(f"{what}: {permission_hint()}")
    if e.errno == errno.EBUSY:
        return TransportError(f"{what}: the USB interface is busy (another program has claimed the bridge)")
    return TransportError(f"{what}: USB error: {e}")


# -- discovery ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BridgeInfo:
    """One bridge as enumeration shows it; `error` says why it cannot be opened."""

    device: usb.core.Device = field(repr=False, compare=False)
    vendor_id: int
    product_id: int
    bus: int | None
    address: int | None
    port_path: str
    product: str | None
    serial: str | None
    error: str | None = None

    @property
    def usb_id(self) -> str:
        return f"{self.vendor_id:04x}:{self.product_id:04x}"

    @property
    def foreign_firmware(self) -> bool:
        return self.product is not None and not self.product.startswith(PRODUCT_PREFIXES)

    @property
    def lock_key(self) -> str:
        # A blank serial cannot tell bridges apart; the port they sit on can.
        if self.serial and self.serial != BLANK_SERIAL:
            return f"usb:{self.serial}"
        return f"usb:bus{self.bus}-port{self.port_path}"


def _string(device: usb.core.Device, index: int) -> str | None:
    # The firmware lists only en-US; asking for it directly keeps a permission error visible
    # (pyusb's langid lookup would swallow it).
    return usb.util.get_string(device, index, LANGID_EN_US)


def _describe(device: usb.core.Device) -> BridgeInfo:
    ports = getattr(device, "port_numbers", None) or ()
    info: dict[str, Any] = dict(device=device, vendor_id=device.idVendor, product_id=device.idProduct,
                                bus=device.bus, address=device.address,
                                port_path=".".join(str(p) for p in ports) or "?", product=None, serial=None)
    try:
        info["product"] = _string(device, device.iProduct)
        info["serial"] = _string(device, device.iSerialNumber)
    except usb.core.USBError as e:
        info["error"] = str(describe_usb_error("reading the bridge's product and serial strings", e))
    except ValueError as e:
        info["error"] = f"reading the bridge's strings failed: {e}"
    finally:
        try:
            usb.util.dispose_resources(device)      # listing must not keep bridges open
        except usb.core.USBError:
            pass
    if info["product"] is not None:      # shown in listings: even a `custom…` name is anyone's to claim
        info["product"] = _shown(info["product"])
    bridge = BridgeInfo(**info)
    # The firmware reports 8 lowercase hex digits; anything else is not our bridge speaking, and
    # the string (up to 126 characters of anyone's device) would go on to name files, fill
    # terminals and the exporter configuration: it is shown escaped, never used.
    odd_serial = bridge.serial is not None and not SERIAL_FORMAT.fullmatch(bridge.serial)
    said = f"serial string '{_shown(bridge.serial)}'" if odd_serial and bridge.serial is not None else ""
    if bridge.foreign_firmware:
        product = bridge.product or ""
        return BridgeInfo(**{**info, "serial": None if odd_serial else bridge.serial,
                             "error": f"product '{product}' is not the custom ASM24 firmware (expected a name "
                                      f"starting {' or '.join(PRODUCT_PREFIXES)}){'; ' + said if said else ''}"})
    if odd_serial:
        return BridgeInfo(**{**info, "serial": None,
                             "error": f"{said} is not the 8 lowercase hex digits the custom "
                                      "ASM24 firmware reports: bridge not used"})
    return bridge


def find_bridges(backend: Any = None) -> list[BridgeInfo]:
    """Every bridge with a known VID:PID, in bus/port order (stable across re-enumeration)."""
    found: list[usb.core.Device] = []
    for vendor, product in BRIDGE_IDS:
        found += usb.core.find(find_all=True, backend=backend, idVendor=vendor, idProduct=product)
    found.sort(key=lambda d: (d.bus or 0, tuple(getattr(d, "port_numbers", None) or ()), d.address or 0))
    return [_describe(d) for d in found]


# -- the wire protocol ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Completion:
    data: int
    status: int          # completion status: 0 SC, 1 UR, 2 CRS, 4 CA
    byte_count: int
    carried: bool
    ret: int             # return status: 0 ok, 1 engine error, 0xFF poll timeout

    @classmethod
    def decode(cls, raw: bytes) -> Completion:
        return cls(int.from_bytes(raw[0:4], "little"), raw[4] >> 5, (raw[4] & 0xF) << 8 | raw[5],
                   bool(raw[6] & 1), raw[7])


def config_address(bus: int, reg: int, device: int = 0, function: int = 0) -> int:
    return bus << 24 | device << 19 | function << 16 | (reg & 0xFFC)


class Asm24:
    """The firmware's requests on one claimed bridge. `name` prefixes every error."""

    def __init__(self, device: usb.core.Device, clock: Clock, name: str):
        self.device = device
        self.clock = clock
        self.name = name
        self.gone = False
        self.claimed = False

    # -- USB plumbing ---------------------------------------------------------------------
    def _io(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        if self.gone:
            raise TransportError(f"{self.name}: {what}: the USB bridge was disconnected earlier; nothing sent")
        try:
            return fn(*args)
        except usb.core.USBError as e:
            if _is_disconnect(e):
                self.gone = True
            raise describe_usb_error(f"{self.name}: {what}", e) from None

    def claim(self) -> None:
        dev = self.device
        try:
            active = self._io("checking for a kernel driver", dev.is_kernel_driver_active, 0)
        except NotImplementedError:       # not every platform has kernel drivers to detach
            active = False
        if active:
            self._io("detaching the kernel driver from interface 0", dev.detach_kernel_driver, 0)
            # tinygrad's validated open resets the device here (libusb_reset_device): whatever
            # the kernel driver did to the bridge is gone before the configuration is set.
            self._io("resetting the bridge after detaching the kernel driver", dev.reset)
        self._io("setting configuration 1", dev.set_configuration, 1)
        self._io("claiming interface 0", usb.util.claim_interface, dev, 0)
        self.claimed = True
        self._io("selecting interface 0 alternate setting 0", dev.set_interface_altsetting, 0, 0)

    def release(self) -> None:
        """Give the bridge back. Never raises: the device may already be gone."""
        if self.claimed and not self.gone:
            try:
                usb.util.release_interface(self.device, 0)
            except Exception:
                pass
        self.claimed = False
        try:
            usb.util.dispose_resources(self.device)
        except Exception:
            pass

    # -- XDATA and PCIe power -------------------------------------------------------------
    def xdata_read(self, address: int, size: int = 1) -> bytes:
        what = f"XDATA read {address:#06x}"
        raw = bytes(self._io(what, self.device.ctrl_transfer, VENDOR_IN, REQ_XDATA_READ, address, 0, size,
                             CONTROL_TIMEOUT_MS))
        if len(raw) != size:
            raise TransportError(f"{self.name}: {what}: {len(raw)} of {size} bytes")
        return raw

    def pcie_power(self, on: bool) -> None:
        self._io(f"PCIe power {'on' if on else 'off'} (F3)", self.device.ctrl_transfer, VENDOR_OUT,
                 REQ_PCIE_POWER, int(on), 0, None, LINK_TRAINING_TIMEOUT_MS)

    # -- mode 0: single TLPs --------------------------------------------------------------
    def _send(self, what: str, fmt: int, address: int, value: int, byte_enable: int, mode: int) -> None:
        payload = struct.pack("<III", address & 0xFFFFFFFF, address >> 32, value & 0xFFFFFFFF)
        sent = self._io(what, self.device.ctrl_transfer, VENDOR_OUT, REQ_TLP, fmt | byte_enable << 8, mode,
                        payload, CONTROL_TIMEOUT_MS)
        if sent != len(payload):
            raise TransportError(f"{self.name}: {what}: the bridge took {sent} of {len(payload)} request bytes")

    def _completion(self, what: str) -> Completion:
        raw = bytes(self._io(what, self.device.ctrl_transfer, VENDOR_IN, REQ_TLP, 0, 0, 8, CONTROL_TIMEOUT_MS))
        if len(raw) != 8:
            raise TransportError(f"{self.name}: {what}: short completion ({len(raw)} of 8 bytes)")
        return Completion.decode(raw)

    def request(self, what: str, fmt: int, address: int, value: int = 0, byte_enable: int = 0xF) -> Completion:
        """A non-posted TLP and its completion, under the retry rule of docs/bridge.md.

        An engine error or poll timeout is retried (the TLP may not have left the bridge);
        a completion status other than SC is the completer's final answer.
        """
        for attempt in range(1 + TLP_RESENDS):
            if attempt:
                self.clock.sleep(TLP_RETRY_WAIT)
            self._send(what, fmt, address, value, byte_enable, MODE_SINGLE)
            completion = self._completion(what)
            if completion.ret == 0:
                break
        else:
            reason = RETURN_NAMES.get(completion.ret, f"return status {completion.ret:#x}")
            raise TransportError(f"{self.name}: {what}: TLP engine {reason} on all {1 + TLP_RESENDS} attempts")
        if completion.status:
            name = COMPLETION_NAMES.get(completion.status, f"completion status {completion.status}")
            raise CompletionError(f"{self.name}: {what}: {name}", completion.status)
        return completion

    def memory_read32(self, address: int, what: str) -> int:
        # Byte 6 bit 0 ("carried data") is advisory here: tinygrad's host code, which the
        # reference client ran on, does not test it on memory reads, and the firmware's own
        # probe script checks it on config reads only. A successful completion (status SC,
        # return status 0) of a memory read is its data. Config reads keep the check.
        return self.request(what, MEM_READ, address).data

    def memory_write32(self, address: int, value: int, what: str) -> None:
        self._send(what, MEM_WRITE, address, value, 0xF, MODE_SINGLE)     # posted: no completion

    def config_read(self, bus: int, reg: int, size: int = 4) -> int:
        shift, mask = 8 * (reg & 3), (1 << 8 * size) - 1
        what = f"config read {bus}:00.0 +{reg:#x}"
        completion = self.request(what, CFG_READ | (bus > 0), config_address(bus, reg), 0,
                                  ((1 << size) - 1) << (reg & 3))
        if not completion.carried:
            raise TransportError(f"{self.name}: {what}: the completion carried no data")
        return completion.data >> shift & mask

    def config_write(self, bus: int, reg: int, value: int, size: int = 4) -> None:
        shift = 8 * (reg & 3)
        self.request(f"config write {bus}:00.0 +{reg:#x}", CFG_WRITE | (bus > 0), config_address(bus, reg),
                     value << shift, ((1 << size) - 1) << (reg & 3))

    # -- modes 1 and 2: streams -----------------------------------------------------------
    def stream_read(self, address: int, size: int, what: str) -> bytes:
        out = bytearray()
        for start in range(0, size, STREAM_CHUNK):
            n = min(STREAM_CHUNK, size - start)
            self._send(what, MEM_READ, address + start, n // 4, 0xF, MODE_STREAM_READ)
            buf = usb.util.create_buffer(n)
            got = self._io(what, self.device.read, EP_IN, buf, BULK_IN_TIMEOUT_MS)
            if got != n:
                # The rest is still armed in the bridge: flush it, or it would lead the next read.
                self._abort(EP_IN, what)
                raise TransportError(f"{self.name}: {what}: streamed read returned {got} of {n} bytes")
            out += buf
        return bytes(out)

    def stream_write(self, address: int, data: bytes, what: str) -> None:
        for start in range(0, len(data), STREAM_CHUNK):
            chunk = data[start:start + STREAM_CHUNK]
            self._send(what, MEM_WRITE, address + start, len(chunk) // 4, 0xF, MODE_STREAM_WRITE)
            sent = self._io(what, self.device.write, EP_OUT, chunk, _bulk_out_timeout(len(chunk)))
            if sent != len(chunk):
                self._abort(EP_OUT, what)
                raise TransportError(f"{self.name}: {what}: streamed write took {sent} of {len(chunk)} bytes")

    def _abort(self, endpoint: int, what: str) -> None:
        """End the stream. After CLEAR_FEATURE(HALT) on the IN endpoint a chunk the bridge had
        already queued may still arrive: drain it, or it would lead the next read."""
        try:
            self._io(f"{what} (aborting the stream)", self.device.clear_halt, endpoint)
            if endpoint == EP_IN:
                self.drain_in(what)
        except TransportError:
            pass        # the original failure is the one worth reporting

    def drain_in(self, what: str) -> int:
        """Read and discard whatever waits on the IN endpoint; returns the bytes dropped."""
        dropped = 0
        for _ in range(DRAIN_LIMIT):
            buf = usb.util.create_buffer(STREAM_CHUNK)
            try:
                got = self.device.read(EP_IN, buf, DRAIN_TIMEOUT_MS)
            except usb.core.USBTimeoutError:
                break
            except usb.core.USBError as e:
                if _is_disconnect(e):
                    self.gone = True
                raise describe_usb_error(f"{self.name}: {what} (draining the stream)", e) from None
            dropped += got
            if not got:
                break
        return dropped


def _bulk_out_timeout(size: int) -> int:
    return BULK_OUT_TIMEOUT_BASE_MS + size // BULK_BYTES_PER_MS


# -- PCIe bring-up --------------------------------------------------------------------------------

@dataclass(frozen=True)
class BarPlacement:
    index: int
    base: int
    size: int
    prefetchable: bool
    is64: bool


@dataclass
class Hierarchy:
    """What bring-up found and programmed."""

    link_trained_by_host: bool = False
    vendor_id: int = 0
    device_id: int = 0
    bar0_size: int | None = None
    bars: list[BarPlacement] = field(default_factory=list)

    @property
    def bar5(self) -> BarPlacement | None:
        return next((b for b in self.bars if b.index == 5), None)


def ensure_link(asm: Asm24) -> bool:
    """Bring the PCIe link to L0; True when this took an F3 (power on and train).

    Never F3 while the link is up: the firmware's power-on always asserts PERST# and trains
    again, which resets the GPU (BARs lost, engines back at power-on values) — on a board
    being recovered, that would undo whatever state the host relies on.
    """
    trained = asm.xdata_read(XDATA_LTSSM)[0] != LTSSM_L0
    if trained:
        asm.pcie_power(True)
    # Read again whether or not F3 was sent, as tinygrad's open does.
    state = asm.xdata_read(XDATA_LTSSM)[0]
    if state != LTSSM_L0:
        raise LinkDown(f"{asm.name}: PCIe link not up (LTSSM state {state:#04x} after power-on and "
                             "training; expected 0x78 = L0). Is the GPU powered and seated?")
    return trained


def open_bridge_windows(asm: Asm24) -> None:
    """Number the bridges on buses 0-3 and open their windows all the way down to the GPU."""
    for bus in BRIDGE_BUSES:
        asm.config_write(bus, 0x18, (bus + 1) << 8 | GPU_BUS << 16)     # primary, secondary, subordinate
        asm.config_write(bus, 0x20, 0x1000, 2)                          # memory base 0x1000_0000
        asm.config_write(bus, 0x22, 0xFFFF, 2)
        asm.config_write(bus, 0x24, 0x0000, 2)                          # prefetchable, 64-bit
        asm.config_write(bus, 0x26, 0xFFFF, 2)
        asm.config_write(bus, 0x28, PREFETCH_WINDOW_BASE >> 32)
        asm.config_write(bus, 0x2C, 0xFFFFFFFF)
        # One byte, as tinygrad writes it: COMMAND[15:8] (SERR# enable, INTx disable) stay as found.
        asm.config_write(bus, 0x04, COMMAND_IO_MEMORY_MASTER, 1)


def check_gpu(asm: Asm24) -> tuple[int, int]:
    try:
        ids = asm.config_read(GPU_BUS, 0x00)
    except CompletionError as e:
        if e.status != CPL_UR:
            raise
        raise TransportError(f"{asm.name}: nothing answers at {GPU_BUS}:00.0 behind the bridges "
                             "(unsupported request): no GPU found") from None
    vendor, device = ids & 0xFFFF, ids >> 16
    if (vendor, device) != NAVI31:
        found = "nothing (reads all ones)" if ids == 0xFFFFFFFF else f"{vendor:04x}:{device:04x}"
        raise UnexpectedDevice(f"{asm.name}: the device behind the bridge is {found}, not a Navi31 GPU "
                               f"({NAVI31[0]:04x}:{NAVI31[1]:04x}); refusing to touch its BAR5",
                               vendor, device)
    return vendor, device


def resize_bar0(asm: Asm24) -> int | None:
    """Walk the GPU's extended capabilities from 0x100 (id in the low 16 bits, next at bits
    31:20) and give BAR0 the largest size its Resizable BAR entry supports; the size, or None.

    In tinygrad's order, access for access: a Resizable BAR capability is handled as the walk
    reaches it (capability, then control, then the control write) and the walk goes on to its
    end. The first entry is BAR0's on every Navi31; another one is searched only when it is not.
    """
    size: int | None = None
    offset, seen = EXT_CAP_START, set[int]()
    while offset and offset not in seen and len(seen) < 64:      # a looping chain must not hang bring-up
        seen.add(offset)
        header = asm.config_read(GPU_BUS, offset)
        if header in (0, 0xFFFFFFFF):
            break
        if header & 0xFFFF == EXT_CAP_REBAR and size is None:
            size = _resize_entry(asm, offset)
        offset = header >> 20 & 0xFFC
    return size


def _resize_entry(asm: Asm24, rebar: int) -> int | None:
    entries = 1
    for n in range(8):
        supported = asm.config_read(GPU_BUS, rebar + 4 + 8 * n) >> 4 & 0x0FFFFFFF
        control = asm.config_read(GPU_BUS, rebar + 8 + 8 * n)
        if n == 0:
            entries = max(control >> 5 & 0x7, 1)
        if control & 0x7 == 0:
            if not supported:
                return None
            largest = supported.bit_length() - 1
            asm.config_write(GPU_BUS, rebar + 8 + 8 * n, control & ~0x3F00 | largest << 8)
            return 0x100000 << largest
        if n + 1 >= entries:
            return None
    return None


def place_bars(asm: Asm24) -> list[BarPlacement]:
    """Size BARs 0-5 and place the memory BARs: prefetchable from 32 GiB, the rest from 256 MiB.

    Each BAR is read first, as tinygrad does, and its type taken from the bits it reads: an
    I/O BAR (the Navi31's BAR4) is left as it is — never written, so never sized — since
    nothing here decodes I/O space.
    """
    cursors = {True: PREFETCH_WINDOW_BASE, False: MEMORY_WINDOW_BASE}
    placed: list[BarPlacement] = []
    index = 0
    while index < 6:
        reg = 0x10 + 4 * index
        found = asm.config_read(GPU_BUS, reg)
        is64, prefetchable = found & 0x7 == 0x4, bool(found & 0x8)
        if found & 1:
            index += 1
            continue
        asm.config_write(GPU_BUS, reg, 0xFFFFFFFF)
        mask = asm.config_read(GPU_BUS, reg) & ~0xF
        if is64:
            asm.config_write(GPU_BUS, reg + 4, 0xFFFFFFFF)
            mask |= asm.config_read(GPU_BUS, reg + 4) << 32
            size = (~mask + 1) & (1 << 64) - 1
        else:
            size = (~mask + 1) & 0xFFFFFFFF
        if not mask:
            # Unimplemented: it reads 0 whatever is written. Nothing to place.
            asm.config_write(GPU_BUS, reg, 0)
            index += 1
            continue
        base = -(-cursors[prefetchable] // size) * size          # naturally aligned
        asm.config_write(GPU_BUS, reg, base & 0xFFFFFFFF)
        if is64:
            asm.config_write(GPU_BUS, reg + 4, base >> 32)
        cursors[prefetchable] = base + -(-size // BAR_GRANULE) * BAR_GRANULE
        placed.append(BarPlacement(index, base, size, prefetchable, is64))
        index += 2 if is64 else 1
    return placed


def bring_up(asm: Asm24) -> Hierarchy:
    found = Hierarchy()
    found.link_trained_by_host = ensure_link(asm)
    open_bridge_windows(asm)
    found.vendor_id, found.device_id = check_gpu(asm)
    # Not in tinygrad's sequence (docs/bridge.md): decoding off while BARs are resized and hold
    # all ones, as Linux's __pci_read_base does, so the GPU never answers at a half-programmed
    # address. One byte: COMMAND[15:8] (SERR#, INTx disable) stays as found.
    asm.config_write(GPU_BUS, 0x04, 0, 1)
    found.bar0_size = resize_bar0(asm)
    found.bars = place_bars(asm)
    bar5 = found.bar5
    if bar5 is None or bar5.is64 or bar5.prefetchable or bar5.size < BAR5_SIZE:
        raise TransportError(f"{asm.name}: BAR5 is not the 1 MiB 32-bit register aperture "
                             f"(found {bar5 or 'no BAR5'})")
    asm.config_write(GPU_BUS, 0x04, COMMAND_IO_MEMORY_MASTER, 1)
    return found


# -- the transport --------------------------------------------------------------------------------

class UsbBar5:
    """BAR5 of the Navi31 behind one ASM24 bridge."""

    def __init__(self, bridge: BridgeInfo, backend: Any = None, on_close: Callable[[], None] | None = None):
        if bridge.error:
            raise TransportError(f"USB bridge {bridge.serial or bridge.usb_id} (bus {bridge.bus} address "
                                 f"{bridge.address}): {bridge.error}")
        self.bridge = bridge
        self._on_close = on_close
        self._closed = False
        self.clock: Clock = clock_for(backend, bridge.device)
        hook = getattr(backend, "diagnostics_for", None)    # an emulated bridge: what its board saw
        if hook is not None:
            self.diagnostics = hook(bridge.device)
        self.asm24 = Asm24(bridge.device, self.clock, f"USB bridge {bridge.serial}")
        try:
            self.asm24.claim()
            self.hierarchy = bring_up(self.asm24)
        except BaseException:
            self.close()
            raise
        bar5 = self.hierarchy.bar5
        assert bar5 is not None
        self._base = bar5.base
        self.identity = BoardIdentity(
            spec=f"usb:{bridge.serial}", kind="usb", serial=bridge.serial,
            vendor_id=self.hierarchy.vendor_id, device_id=self.hierarchy.device_id,
            extra={"bus": bridge.bus, "address": bridge.address, "port": bridge.port_path,
                   "usb_id": bridge.usb_id, "product": bridge.product, "link": "up",
                   "link_trained_by_host": self.hierarchy.link_trained_by_host,
                   "bar5": f"{self._base:#x}", "bar0_size": self.hierarchy.bar0_size},
        )

    def _check(self, offset: int, size: int) -> None:
        if offset & 3 or size & 3 or offset < 0 or size < 0 or offset + size > BAR5_SIZE:
            raise ValueError(f"BAR5 access {offset:#x}+{size:#x}: dword-aligned and inside the 1 MiB "
                             "aperture only")

    def read32(self, offset: int) -> int:
        self._check(offset, 4)
        return self.asm24.memory_read32(self._base + offset, f"read32 BAR5+{offset:#x}")

    def write32(self, offset: int, value: int) -> None:
        self._check(offset, 4)
        self.asm24.memory_write32(self._base + offset, value, f"write32 BAR5+{offset:#x}")

    def read_block(self, offset: int, size: int) -> bytes:
        self._check(offset, size)
        if not size:
            return b""
        return self.asm24.stream_read(self._base + offset, size, f"read_block BAR5+{offset:#x}+{size:#x}")

    def write_block(self, offset: int, data: bytes) -> None:
        self._check(offset, len(data))
        if data:
            self.asm24.stream_write(self._base + offset, bytes(data),
                                    f"write_block BAR5+{offset:#x}+{len(data):#x}")

    def close(self) -> None:
        """Release the bridge. Never raises, also after a disconnect; safe to repeat."""
        if self._closed:
            return
        self._closed = True
        self.asm24.release()
        if self._on_close is not None:
            try:
                self._on_close()
            except Exception:
                pass
