"""The custom ASM24 firmware of the emulated bridge: what a transfer does once it reaches it.

The firmware's half of docs/bridge.md: its control requests, bridge memory (XDATA), PCIe
power and link training, the TLP engine and the streamed modes, and the cost of each
transfer. The bus around it (descriptors, libusb's errors, the root hub) is usb_bus.py; the
pyusb backend that hands it transfers is usb.py.

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
  engine.

Fault usb-disconnect-after=N: transfers 1..N to that bridge work, number N+1 and every
later one fail with LIBUSB_ERROR_NO_DEVICE and the bridge leaves the bus (`gone`).
The count lives in the board's fault state (F_USB_TRANSFERS), so it runs on across
processes; firing is recorded in slot F_USB_DISCONNECTED and never repeats.
"""
from __future__ import annotations

import re
import struct
from collections import deque
from dataclasses import dataclass, fields, replace
from typing import Any
from collections.abc import Callable, Mapping

from amdflash.stages.sim.board import Board
from amdflash.stages.sim.state import F_USB_FIRED as F_USB_DISCONNECTED
from amdflash.stages.sim.state import F_USB_TRANSFERS
from amdflash.stages.sim.cost import ASM24
from amdflash.stages.sim.pcie import BAR5_SIZE, NAVI31_DEVICE, PcieTopology
from amdflash.stages.sim.state import C
from amdflash.stages.sim.usb_bus import (LIBUSB_ERROR_IO, LIBUSB_ERROR_NO_DEVICE, LIBUSB_ERROR_OVERFLOW,
                                        LIBUSB_ERROR_TIMEOUT, MAX_PACKET, USB2_MAX_PACKET, RootHub, SimDevice,
                                        bridge_descriptors, usb_error)

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


class _Timeout(Exception):
    """The device never answers: the host waits out its timeout."""


class Asm24(SimDevice):
    """One bridge: the firmware's USB behaviour, XDATA, the TLP engine and its streams."""

    def __init__(self, board: Board, options: BridgeOptions, hub: RootHub, address: int, port: int):
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
        self.descriptors = bridge_descriptors(
            usb2=self.usb2, vendor_id=options.vendor_id, product_id=options.product_id, product=options.product,
            serial=serial if options.serial_string is None else options.serial_string,
            bus=hub.descriptors.device.bus, address=address, port=port)

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
