"""The PCIe hierarchy behind the emulated ASM24 bridge: config spaces and routing.

A chain of four PCIe bridges (one per link, each at device 0 function 0) leads from the
bridge's TLP engine to the Navi31 GPU; with the bus numbers that bring-up programs
(docs/bridge.md) they sit on buses 0..3 and the GPU is 4:0.0. Nothing here is pre-programmed:
bus numbers, windows, BARs and command registers start at their reset values, so a
driver that skips a bring-up step finds requests failing as they would on hardware.

Routing follows the PCI-to-PCI bridge rules:

* type 0 config requests are consumed by the device on the engine's own link, whatever
  bus number they name; type 1 requests travel down while a bridge's secondary..subordinate
  range claims the bus, and turn into type 0 on the bridge's secondary bus. Unclaimed
  buses, device numbers other than 0 and functions other than 0 are Unsupported Requests;
* memory requests travel down through bridges whose Memory Space Enable is set and whose
  memory or prefetchable window holds the address; the GPU claims them in BAR5 when its
  own Memory Space Enable is set. Only BAR5 is backed (by the board's registers): every
  other address is an Unsupported Request (reads) or dropped (posted writes).

Assumed, not known (no config dump of this exact chain is public): the bridge IDs
(ASMedia 1B21:2463 for the two bridges inside the ASM2464, Navi31's own switch 1002:1478
upstream / 1002:1479 downstream), the GPU's revision C8 and subsystem 1002:0E3B, its
capability chains (headers only, contents zero), an I/O BAR4 of 256 bytes, a 128 KiB
expansion ROM BAR, no second function (the HDMI audio function 4:0.1 is absent), and the
Resizable BAR entries: BAR0 256 MiB..32 GiB (power-on 256 MiB), BAR2 2..256 MiB.
"""
from __future__ import annotations

from typing import Final

CONFIG_SIZE: Final = 0x1000
BAR5_SIZE: Final = 0x100000

GPU_VENDOR: Final = 0x1002
NAVI31_DEVICE: Final = 0x744C

CMD_IO, CMD_MEMORY, CMD_BUS_MASTER = 0x1, 0x2, 0x4
_COMMAND_RW: Final = 0x0547           # I/O, memory, bus master, parity, SERR#, INTx disable
_STATUS_CAP_LIST: Final = 0x0010

# PCI Express capability device/port types.
_ROOT_PORT, _UPSTREAM, _DOWNSTREAM = 4, 5, 6

# (vendor, device, port type) of the bridge on each link, upstream first.
BRIDGE_IDS: Final = (
    (0x1B21, 0x2463, _ROOT_PORT),
    (0x1B21, 0x2463, _DOWNSTREAM),
    (0x1002, 0x1478, _UPSTREAM),
    (0x1002, 0x1479, _DOWNSTREAM),
)

# Extended capabilities of the GPU from 0x100: (offset, id, version).
_EXT_CAPS: Final = (
    (0x100, 0x000B, 1),   # vendor-specific
    (0x150, 0x0001, 2),   # AER
    (0x200, 0x0015, 1),   # Resizable BAR
    (0x240, 0x0004, 1),   # power budgeting
    (0x270, 0x0019, 1),   # secondary PCI Express
    (0x320, 0x0018, 1),   # LTR
)
REBAR_CAP: Final = 0x200
# Resizable BAR entries: (BAR index, smallest and largest size index, power-on index);
# size index k means 1 MiB << k.
REBAR_ENTRIES: Final = ((0, 8, 15, 8), (2, 1, 8, 1))

_MASK64: Final = (1 << 64) - 1


def _le(value: int, size: int) -> bytes:
    return value.to_bytes(size, "little")


class ConfigSpace:
    """4 KiB of configuration registers. `rw` holds the writable bits of each byte."""

    def __init__(self) -> None:
        self.data = bytearray(CONFIG_SIZE)
        self.rw = bytearray(CONFIG_SIZE)

    def init(self, offset: int, value: int, size: int, rw: int = 0) -> None:
        self.data[offset:offset + size] = _le(value, size)
        self.rw[offset:offset + size] = _le(rw, size)

    def read(self, reg: int) -> int:
        return int.from_bytes(self.data[reg:reg + 4], "little")

    def write(self, reg: int, value: int, byte_enable: int) -> None:
        data, rw = self.data, self.rw
        for i in range(4):
            if byte_enable >> i & 1:
                mask = rw[reg + i]
                data[reg + i] = (data[reg + i] & ~mask) | (value >> 8 * i & mask)

    def u8(self, offset: int) -> int:
        return self.data[offset]

    def u16(self, offset: int) -> int:
        return int.from_bytes(self.data[offset:offset + 2], "little")

    def u32(self, offset: int) -> int:
        return int.from_bytes(self.data[offset:offset + 4], "little")

    def _header(self, vendor: int, device: int, class_rev: int, header_type: int) -> None:
        self.init(0x00, vendor | device << 16, 4)
        self.init(0x04, 0, 2, _COMMAND_RW)
        self.init(0x06, _STATUS_CAP_LIST, 2)
        self.init(0x08, class_rev, 4)
        self.init(0x0C, header_type << 16, 4, 0xFF)      # cache line size is writable

    def _cap(self, offset: int, cap_id: int, next_offset: int, word: int = 0) -> None:
        self.init(offset, cap_id | next_offset << 8 | word << 16, 4)


class Bridge(ConfigSpace):
    """A PCI-to-PCI bridge (type 1 header) with bus numbers and memory windows."""

    def __init__(self, vendor: int, device: int, port_type: int):
        super().__init__()
        self._header(vendor, device, 0x06040000, 0x01)
        self.init(0x18, 0, 3, 0xFFFFFF)              # primary, secondary, subordinate
        self.init(0x1C, 0, 2, 0xF0F0)                # I/O base/limit (16-bit decode)
        self.init(0x20, 0, 4, 0xFFF0FFF0)            # memory base/limit
        self.init(0x24, 0x00010001, 4, 0xFFF0FFF0)   # prefetchable base/limit, 64-bit
        self.init(0x28, 0, 8, _MASK64)               # prefetchable upper base/limit
        self.init(0x30, 0, 4, 0xFFFFFFFF)            # I/O upper base/limit
        self.init(0x34, 0x40, 1)
        self.init(0x3C, 0, 4, 0x0FFF00FF)            # interrupt line; bridge control
        self._cap(0x40, 0x10, 0, 0x0002 | port_type << 4)

    @property
    def secondary(self) -> int:
        return self.data[0x19]

    @property
    def subordinate(self) -> int:
        return self.data[0x1A]

    def claims_bus(self, bus: int) -> bool:
        return self.secondary <= bus <= self.subordinate

    def forwards_memory(self, address: int) -> bool:
        if not self.data[0x04] & CMD_MEMORY:
            return False
        base = (self.u16(0x20) & 0xFFF0) << 16
        limit = (self.u16(0x22) & 0xFFF0) << 16 | 0xFFFFF
        if base <= address <= limit:
            return True
        pbase = self.u32(0x28) << 32 | (self.u16(0x24) & 0xFFF0) << 16
        plimit = self.u32(0x2C) << 32 | (self.u16(0x26) & 0xFFF0) << 16 | 0xFFFFF
        return pbase <= address <= plimit


class Gpu(ConfigSpace):
    """Navi31 function 0 (type 0 header): BARs with sizing semantics and Resizable BAR."""

    # BAR index -> (flag bits, 64-bit); sizes come from `bar_size`.
    _BARS: Final = {0: (0xC, True), 2: (0xC, True), 4: (0x1, False), 5: (0x0, False)}
    _ROM_SIZE: Final = 0x20000

    def __init__(self, device_id: int = NAVI31_DEVICE):
        super().__init__()
        self._header(GPU_VENDOR, device_id, 0x030000C8, 0x00)
        self.init(0x2C, 0x1002 | 0x0E3B << 16, 4)
        self.init(0x34, 0x48, 1)
        self.init(0x3C, 0x0100, 2, 0x00FF)           # interrupt line; pin INTA#
        self._cap(0x48, 0x09, 0x50)
        self._cap(0x50, 0x01, 0x64, 0x0003)
        self._cap(0x64, 0x10, 0xA0, 0x0002)
        self._cap(0xA0, 0x05, 0x00)
        for i, (offset, cap_id, version) in enumerate(_EXT_CAPS):
            nxt = _EXT_CAPS[i + 1][0] if i + 1 < len(_EXT_CAPS) else 0
            self.init(offset, cap_id | version << 16 | nxt << 20, 4)
        for n, (bar, smallest, largest, power_on) in enumerate(REBAR_ENTRIES):
            supported = sum(1 << (k + 4) for k in range(smallest, largest + 1))
            count = len(REBAR_ENTRIES) << 5 if n == 0 else 0
            self.init(REBAR_CAP + 4 + 8 * n, supported, 4)
            self.init(REBAR_CAP + 8 + 8 * n, bar | count | power_on << 8, 4, 0x3F00)
        self._bar_raw = [0] * 6
        self._rom_raw = 0

    # -- BARs -----------------------------------------------------------------------------
    def bar_size(self, bar: int) -> int:
        for n, entry in enumerate(REBAR_ENTRIES):
            if entry[0] == bar:
                return 1 << (20 + (self.u32(REBAR_CAP + 8 + 8 * n) >> 8 & 0x3F))
        return 0x100 if bar == 4 else BAR5_SIZE

    def bar_base(self, bar: int) -> int:
        flags, is64 = self._BARS[bar]
        raw = self._bar_raw[bar] & ~(0x3 if flags & 1 else 0xF)
        if is64:
            raw |= self._bar_raw[bar + 1] << 32
        return raw & ~(self.bar_size(bar) - 1) & _MASK64

    def read(self, reg: int) -> int:
        if 0x10 <= reg < 0x28:
            index = (reg - 0x10) >> 2
            if index in self._BARS:
                return (self.bar_base(index) & 0xFFFFFFFF) | self._BARS[index][0]
            return self.bar_base(index - 1) >> 32        # upper half of a 64-bit BAR
        if reg == 0x30:
            return self._rom_raw & ~(self._ROM_SIZE - 1) & 0xFFFFF800 | self._rom_raw & 1
        return super().read(reg)

    def write(self, reg: int, value: int, byte_enable: int) -> None:
        if 0x10 <= reg < 0x28:
            index = (reg - 0x10) >> 2
            self._bar_raw[index] = _merge(self._bar_raw[index], value, byte_enable)
        elif reg == 0x30:
            self._rom_raw = _merge(self._rom_raw, value, byte_enable)
        elif REBAR_CAP + 8 <= reg < REBAR_CAP + 8 + 8 * len(REBAR_ENTRIES) and not (reg - REBAR_CAP) & 4:
            old = self.u32(reg)
            super().write(reg, value, byte_enable)
            size = self.u32(reg) >> 8 & 0x3F
            if not self.u32(reg - 4) >> (size + 4) & 1:
                # Unsupported sizes are undefined by the spec; this device keeps the old one.
                self.init(reg, old, 4, 0x3F00)
        else:
            super().write(reg, value, byte_enable)

    @property
    def memory_enabled(self) -> bool:
        return bool(self.data[0x04] & CMD_MEMORY)


def _merge(old: int, value: int, byte_enable: int) -> int:
    for i in range(4):
        if byte_enable >> i & 1:
            mask = 0xFF << 8 * i
            old = (old & ~mask) | (value & mask)
    return old


class PcieTopology:
    """The four bridges and the GPU, and how requests find them."""

    def __init__(self, gpu_device_id: int = NAVI31_DEVICE):
        self.gpu_device_id = gpu_device_id
        self.reset()

    def reset(self) -> None:
        """Link down: every config space behind the engine returns to its reset state."""
        self.bridges = [Bridge(*ids) for ids in BRIDGE_IDS]
        self.gpu = Gpu(self.gpu_device_id)
        self._chain: list[ConfigSpace] = [*self.bridges, self.gpu]
        self._bar5: int | None = None
        self._stale = True

    def config_target(self, type1: bool, bus: int, device: int, function: int) -> ConfigSpace | None:
        """The config space a request reaches, or None for an Unsupported Request."""
        if device or function:
            return None
        if not type1:
            return self._chain[0]
        for i, node in enumerate(self._chain):
            if not isinstance(node, Bridge) or not node.claims_bus(bus):
                return None
            if bus == node.secondary:
                return self._chain[i + 1]
        return None

    def config_written(self) -> None:
        self._stale = True

    def bar5_base(self) -> int | None:
        """Where BAR5 answers, when every bridge forwards it and the GPU decodes memory.

        Windows are 1 MiB-granular and BAR5 is one aligned MiB, so each bridge forwards all
        of BAR5 or none of it; the answer only changes with a config write.
        """
        if self._stale:
            self._stale = False
            base = self.gpu.bar_base(5)
            ok = self.gpu.memory_enabled and all(b.forwards_memory(base) for b in self.bridges)
            self._bar5 = base if ok else None
        return self._bar5
