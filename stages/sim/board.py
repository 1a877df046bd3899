"""The emulated Navi31 board: BAR5 register file with behaviour, wired to its models.

`Board` is the hardware. It knows nothing about drivers; it offers BAR5 the way the
physical paths do, each charged on the virtual clock by the active cost profile:

* `stream_read` / `stream_write`: one streamed BAR access (ASM24 modes 2/1, or a run of
  PCIe dwords);
* `tlp_read32` / `tlp_write32`: one single-TLP register access (ASM24 mode 0);
* `reg_read` / `reg_write`: the raw access underneath, uncharged, used by the emulated
  USB bridge, which charges its own USB transfers.

Each charged access lands when the cost model says (`cost.py` states the rule): the clock
first advances to the moment the request reaches the board, the board acts, then the
clock advances by the rest of the access. The ROM_SW engine and the flash run on the same
clock, so an access sees exactly what the silicon would show at that moment. With
`trace` set to a list, every charged access appends (kind, offset, size, started, landed,
ended) to it.

Registers without behaviour read back what was written. Registers with behaviour have
hooks: a write hook sees the merged 32-bit value after the bytes landed, a read hook
supplies the value. Block accesses visit hooked dwords in ascending address order, as the
TLPs of a streamed access do.
"""
from __future__ import annotations

import functools
import os
import signal
import struct
from pathlib import Path
from typing import TypeVar
from collections.abc import Callable

from amdflash.stages.drivers.navi31 import regs as R
from amdflash.stages.sim import calibration
from amdflash.stages.sim import cost as costmod
from amdflash.stages.sim.clock import SimClock
from amdflash.stages.sim.cost import Access
from amdflash.stages.sim.jitter import LinkJitter
from amdflash.stages.sim.faults import Faults
from amdflash.stages.sim.romsw import BLOCK_END, BLOCK_START
from amdflash.stages.sim.power_on import power_on_registers
from amdflash.stages.sim.state import F_KILL_FIRED, F_WRITES, C, BoardFiles

T = TypeVar("T")
ReadHook = Callable[[], int]
WriteHook = Callable[[int], None]


_U32 = struct.Struct("<I")

# Counter slots, bound once: these are touched on every access.
_CONTROL, _BULK, _BULK_BYTES, _TLPS = C["control_transfers"], C["bulk_transfers"], C["bulk_bytes"], C["tlps"]
_REG_READS, _REG_WRITES = C["reg_reads"], C["reg_writes"]


class Board:
    def __init__(self, path: str | os.PathLike[str], profile: str | None = None,
                 realtime_scale: float | None = None, strict: bool | None = None):
        self.path = Path(path)
        self.files = BoardFiles(self.path)
        self.config = self.files.config
        self.regs = self.files.regs
        self.counters = self.files.region("counters").cast("d")
        self.fault_state = self.files.region("faults").cast("q")
        self.faults = Faults.from_json(self.config.get("faults", {}))
        # A board calibrated from a real one (calibration.py) replaces the profile's figures.
        self.calibration = self.config.get("calibration")
        self.cost = calibration.cost_profile(costmod.profile(profile or self.config.get("transport", "asm24")),
                                             self.calibration)
        scale = self.config.get("realtime_scale", 0.0) if realtime_scale is None else realtime_scale
        self.clock = SimClock(self.counters, C["modelled_seconds"], C["sleep_seconds"], float(scale))
        self.variant: dict = self.config.get("variant", {})
        self.seed: int = int(self.config.get("seed", 0))
        # Strict: a protocol violation raises (see sim/romsw.py). Boards are strict unless
        # made with `sim create --lenient`.
        self.strict = bool(self.config.get("strict", True)) if strict is None else strict
        self.trace: list[tuple[str, int, int, float, float, float]] | None = None
        cost = self.cost
        self._tlp_read, self._tlp_write = cost.tlp_read32(), cost.tlp_write32()
        self._stream_read_cost = functools.lru_cache(maxsize=64)(cost.stream_read)
        self._stream_write_cost = functools.lru_cache(maxsize=64)(cost.stream_write)
        # A calibrated link whose transfers took varying times (jitter.py); None for the rest.
        spreads = calibration.transport_spread(self.calibration) if cost.physical else {}
        self.jitter = LinkJitter(cost, spreads, self.seed, self.clock.now()) if spreads else None

        self._read_hooks: dict[int, ReadHook] = {}
        self._write_hooks: dict[int, WriteHook] = {}
        self._hooked = bytearray(R.BAR5_SIZE >> 2)  # 1 per dword with behaviour
        self._kill_at = self.faults.kill_after_writes if not self.fault_state[F_KILL_FIRED] else None

        # The models, wired onto the register file. Imported here so each stays a leaf.
        from amdflash.stages.sim.aperture import RomAperture
        from amdflash.stages.sim.nor import NorChip
        from amdflash.stages.sim.psp import PspMailbox
        from amdflash.stages.sim.romsw import RomSwEngine

        self.chip = NorChip(self)          # the part named in board.json ("chip")
        self.engine = RomSwEngine(self)
        self.aperture = RomAperture(self)
        self.psp = PspMailbox(self)
        # The ROM_SW block (CNTL .. end of the data window) goes to the engine model.
        self._engine_lo, self._engine_hi = (BLOCK_START, BLOCK_END) if self.engine.wired else (0, 0)
        self._closed = False

    # -- wiring for the models ------------------------------------------------------------
    def on_read(self, offset: int, hook: ReadHook) -> None:
        self._read_hooks[offset] = hook
        self._hooked[offset >> 2] = 1

    def on_write(self, offset: int, hook: WriteHook) -> None:
        self._write_hooks[offset] = hook
        self._hooked[offset >> 2] = 1

    def get32(self, offset: int) -> int:
        return _U32.unpack_from(self.regs, offset)[0]

    def set32(self, offset: int, value: int) -> None:
        _U32.pack_into(self.regs, offset, value & 0xFFFFFFFF)

    def count(self, name: str, n: float = 1) -> None:
        self.counters[C[name]] += n

    # -- raw BAR5 access ------------------------------------------------------------------
    def reg_read(self, offset: int, size: int) -> bytes:
        end = offset + size
        if offset < 0 or size <= 0 or end > R.BAR5_SIZE:
            self._out_of_range(offset, size)
        self.counters[_REG_READS] += 1
        if offset < self._engine_hi and end > self._engine_lo:
            if offset >= self._engine_lo and end <= self._engine_hi:
                return self.engine.read(offset, size)
            return self._split_read(offset, size)
        return self._plain_read(offset, size)

    def _split_read(self, offset: int, size: int) -> bytes:
        lo, hi, end = max(offset, self._engine_lo), min(offset + size, self._engine_hi), offset + size
        out = self._plain_read(offset, lo - offset) if lo > offset else b""
        out += self.engine.read(lo, hi - lo)
        return out + (self._plain_read(hi, end - hi) if end > hi else b"")

    def _plain_read(self, offset: int, size: int) -> bytes:
        first, last = offset >> 2, (offset + size + 3) >> 2
        if self._hooked.find(1, first, last) < 0:
            return self.regs[offset:offset + size]
        out = bytearray()
        for dword in range(first, last):
            base = dword << 2
            hook = self._read_hooks.get(base)
            out += hook().to_bytes(4, "little") if hook else self.regs[base:base + 4]
        start = offset - (first << 2)
        return bytes(out[start:start + size])

    def reg_write(self, offset: int, data: bytes) -> None:
        size = len(data)
        end = offset + size
        if offset < 0 or size <= 0 or end > R.BAR5_SIZE:
            self._out_of_range(offset, size)
        self.counters[_REG_WRITES] += 1
        fs = self.fault_state
        fs[F_WRITES] += 1
        if self._kill_at is not None and fs[F_WRITES] >= self._kill_at:
            self._host_dies()
        if offset < self._engine_hi and end > self._engine_lo:
            if offset >= self._engine_lo and end <= self._engine_hi:
                self.engine.write(offset, data)
                return
            lo, hi = max(offset, self._engine_lo), min(end, self._engine_hi)
            if lo > offset:
                self._plain_write(offset, data[:lo - offset])
            self.engine.write(lo, data[lo - offset:hi - offset])
            if end > hi:
                self._plain_write(hi, data[hi - offset:])
            return
        self._plain_write(offset, data)

    def _plain_write(self, offset: int, data: bytes) -> None:
        size = len(data)
        first, last = offset >> 2, (offset + size + 3) >> 2
        if self._hooked.find(1, first, last) < 0:
            self.regs[offset:offset + size] = data
            return
        for dword in range(first, last):
            base = dword << 2
            lo, hi = max(base, offset), min(base + 4, offset + size)
            self.regs[lo:hi] = data[lo - offset:hi - offset]
            hook = self._write_hooks.get(base)
            if hook:
                hook(self.get32(base))

    @staticmethod
    def _out_of_range(offset: int, size: int) -> None:
        raise ValueError(f"BAR5 access {offset:#x}+{size:#x} is outside the 1 MiB aperture")

    def _host_dies(self) -> None:
        """kill-after-writes: the host dies here, before this write reaches the board."""
        self.fault_state[F_KILL_FIRED] = 1
        self.files.state.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    # -- charged frontends ----------------------------------------------------------------
    # Each: advance the clock to the moment the access lands, act, advance by the rest.
    def _traced(self, kind: str, offset: int, size: int, access: Access, act: Callable[[], T]) -> T:
        clock = self.clock
        start = clock.now()
        clock.advance(access.lands)
        landed = clock.now()
        result = act()
        self.trace.append((kind, offset, size, start, landed, landed + access.total - access.lands))  # type: ignore[union-attr]
        clock.advance(access.total - access.lands)
        return result

    def stream_read(self, offset: int, size: int) -> bytes:
        cost = self.cost
        c = self.counters
        if cost.usb:
            c[_CONTROL] += 1
            c[_BULK] += 1
            c[_BULK_BYTES] += size
        c[_TLPS] += (size + 3) >> 2
        access = self._stream_read_cost(size)
        if self.jitter is not None:
            access = self.jitter.stream_read(access, size)
        if self.trace is not None:
            return self._traced("stream read", offset, size, access, lambda: self.reg_read(offset, size))
        advance = self.clock.advance
        advance(access.lands)
        data = self.reg_read(offset, size)
        advance(access.total - access.lands)
        return data

    def stream_write(self, offset: int, data: bytes) -> None:
        cost = self.cost
        c = self.counters
        size = len(data)
        if cost.usb:
            c[_CONTROL] += 1
            c[_BULK] += 1
            c[_BULK_BYTES] += size
        c[_TLPS] += (size + 3) >> 2
        access = self._stream_write_cost(size)
        if self.jitter is not None:
            access = self.jitter.stream_write(access, size)
        if self.trace is not None:
            self._traced("stream write", offset, size, access, lambda: self.reg_write(offset, data))
            return
        advance = self.clock.advance
        advance(access.lands)
        self.reg_write(offset, data)
        advance(access.total - access.lands)

    def tlp_read32(self, offset: int) -> int:
        if self.cost.usb:
            self.counters[_CONTROL] += 2
        self.counters[_TLPS] += 1
        access = self._tlp_read if self.jitter is None else self.jitter.read32(self._tlp_read)
        if self.trace is not None:
            return _U32.unpack(self._traced("read32", offset, 4, access, lambda: self.reg_read(offset, 4)))[0]
        advance = self.clock.advance
        advance(access.lands)
        value = _U32.unpack(self.reg_read(offset, 4))[0]
        advance(access.total - access.lands)
        return value

    def tlp_write32(self, offset: int, value: int) -> None:
        if self.cost.usb:
            self.counters[_CONTROL] += 1
        self.counters[_TLPS] += 1
        access = self._tlp_write if self.jitter is None else self.jitter.write32(self._tlp_write)
        data = _U32.pack(value & 0xFFFFFFFF)
        if self.trace is not None:
            self._traced("write32", offset, 4, access, lambda: self.reg_write(offset, data))
            return
        advance = self.clock.advance
        advance(access.lands)
        self.reg_write(offset, data)
        advance(access.total - access.lands)

    def power_on_reset(self) -> None:
        """PERST#: the GPU starts over. BAR5 holds its power-on values, the ROM_SW engine
        drops whatever it was doing; the flash (a separate chip) keeps its state."""
        self.regs[:] = power_on_registers(calibration.power_on_values(self.calibration))
        self.engine.reset()
        self.aperture.reset()
        self.psp.power_on()

    def power_cycle(self) -> None:
        """All power off and on again (`amdflash sim power-cycle`): the GPU as after PERST#,
        the PSP boot firmware from the start, and the flash chip's volatile state lost."""
        self.power_on_reset()
        self.chip.power_cycle()

    # -- lifetime -------------------------------------------------------------------------
    def stats(self) -> dict[str, float]:
        from amdflash.stages.sim.state import COUNTER_NAMES

        return {name: self.counters[i] for i, name in enumerate(COUNTER_NAMES)}

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.psp.close()
        self.counters.release()
        self.fault_state.release()
        self.chip.close()
        self.engine.close()
        self.aperture.close()
        self.files.close()

    def __enter__(self) -> Board:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
