"""Calibration profiles: an emulated board whose timings, SFDP and register values come from a
real board (a hardware report or a recorded run) instead of the project's assumed figures.

A board made with `sim create --from-report` / `--from-run` carries a "calibration" object in
its board.json; a board without one behaves exactly as before (the default cost profiles of
cost.py, the part's typical busy times, the assumed power-on registers). The object:

    {"source": "...",                         # what it was made from (said by `sim create`)
     "transport": {"control": s, ...},        # CostProfile fields replacing the profile's own; a
                                              # transfer's latency may be {"median", "stdev",
                                              # "min", "max"} when transfers took varying times
     "busy": {"0x20": s, ...},                # typical busy seconds by the opcode that starts them,
                                              # or {"median": s, "stdev": s, "min": s, "max": s}
                                              # for a chip whose operations took varying times
     "sfdp": "hex",                           # the SFDP space the chip answers 5Ah with
     "registers": {"0x5a3a0": v, ...},        # BAR5 values at power-on (plain registers only)
     "protection": "spi25"}                   # the protection reading the chip follows (parts.py)

Everything here is read from files a user sent: each field is checked for type and range and
refused with a message naming it (CalibrationError); nothing is evaluated.
"""
from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any, Literal

from amdflash.stages.sim.cost import CostProfile
from amdflash.stages.sim.parts import PartSpec

# The CostProfile figures a calibration may replace, each with the largest value believed
# (a link slower than a second per transfer is not a link; a refclk outside 1 MHz..1 GHz is not SPI).
TRANSPORT_FIELDS: dict[str, tuple[float, float]] = {
    "control": (0.0, 1.0), "bulk": (0.0, 1.0), "write_byte": (0.0, 1e-3), "read_byte": (0.0, 1e-3),
    "pcie_read_dword": (0.0, 1e-2), "pcie_write_dword": (0.0, 1e-2),
    "spi_overhead": (0.0, 1e-3), "spi_refclk_hz": (1e6, 1e9),
}
MAX_BUSY_SECONDS = 200.0          # no NOR chip erases slower than this (chip erase maxima are ~100 s)
MAX_SFDP = 0x1000                 # the SFDP space amdflash reads and serves
KEYS = ("source", "transport", "busy", "sfdp", "registers", "protection")
PROTECTION_READINGS = ("", "spi25", "spi25-bp11-all")
SPREAD_KEYS = ("median", "stdev", "min", "max")   # a figure that varies


MAX_DIGITS = 20                   # an integer in a report: 64 bits take at most 20 decimal digits


class CalibrationError(ValueError):
    """A calibration (or the report it comes from) that cannot be taken as it is."""


class LongInteger:
    """An integer literal of more than MAX_DIGITS digits in a report, kept unconverted: the
    check of its field refuses it by name (Python would refuse to convert 4300 digits, and a
    float comparison overflows long before)."""

    def __init__(self, text: str):
        self.digits = len(text.lstrip("-"))

    def __repr__(self) -> str:
        return f"a {self.digits}-digit integer"


def _int_literal(text: str) -> int | LongInteger:
    return int(text) if len(text.lstrip("-")) <= MAX_DIGITS else LongInteger(text)


def loads(text: str) -> Any:
    """A report's JSON, its over-long integers left for the field checks to name."""
    return json.loads(text, parse_int=_int_literal)


def _out_of_range(value: Any, what: str) -> None:
    if isinstance(value, LongInteger):
        raise CalibrationError(f"{what}: {value!r} is out of range")


def number(value: Any, what: str, lo: float, hi: float) -> float:
    """A finite number in [lo, hi] (bool is not a number here)."""
    _out_of_range(value, what)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise CalibrationError(f"{what}: expected a number, got {value!r:.60}")
    if not lo <= value <= hi:
        raise CalibrationError(f"{what}: {value!r} is outside {lo:g}..{hi:g}")
    return float(value)


def integer(value: Any, what: str, lo: int, hi: int) -> int:
    _out_of_range(value, what)
    if isinstance(value, bool) or not isinstance(value, int):
        raise CalibrationError(f"{what}: expected an integer, got {value!r:.60}")
    if not lo <= value <= hi:
        raise CalibrationError(f"{what}: {value:#x} is outside {lo:#x}..{hi:#x}")
    return value


def hex_key(text: Any, what: str, hi: int) -> int:
    """A mapping key written as hex ("0x20")."""
    if not isinstance(text, str) or not text.startswith("0x") or len(text) > 10:
        raise CalibrationError(f"{what}: key {text!r:.40} is not a hex number like 0x20")
    try:
        value = int(text, 16)
    except ValueError:
        raise CalibrationError(f"{what}: key {text!r:.40} is not a hex number like 0x20") from None
    return integer(value, what, 0, hi)


def hex_bytes(text: Any, what: str, limit: int) -> bytes:
    if not isinstance(text, str) or len(text) > 2 * limit:
        raise CalibrationError(f"{what}: expected at most {limit} bytes as a hex string")
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise CalibrationError(f"{what}: not a hex string") from None


def mapping(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise CalibrationError(f"{what}: expected an object")
    return value


def check(cal: Any, part: PartSpec | None = None) -> dict[str, Any]:
    """The calibration object, checked (raises CalibrationError); returns it unchanged."""
    cal = mapping(cal, "calibration")
    unknown = set(cal) - set(KEYS)
    if unknown:
        raise CalibrationError(f"calibration: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
    if not isinstance(cal.get("source", ""), str) or len(cal.get("source", "")) > 200:
        raise CalibrationError("calibration.source: expected a short string")
    transport(cal)
    busy(cal, part)
    sfdp(cal)
    registers(cal)
    protection_reading(cal)
    return dict(cal)


def protection_reading(cal: Mapping[str, Any]) -> Literal["", "spi25", "spi25-bp11-all"]:
    value = cal.get("protection", "")
    if value == "spi25" or value == "spi25-bp11-all" or value == "":
        return value
    raise CalibrationError(f"calibration.protection: one of {', '.join(map(repr, PROTECTION_READINGS))}")


# Figures that are one transfer's latency, and so may vary from transfer to transfer.
VARYING_TRANSPORT = ("control", "bulk", "pcie_read_dword", "pcie_write_dword")


def transport(cal: Mapping[str, Any]) -> dict[str, float]:
    """The cost-profile figures (a varying one's median)."""
    return {name: spread[0] for name, spread in _transport(cal).items()}


def transport_spread(cal: Mapping[str, Any] | None) -> dict[str, tuple[float, float, float, float]]:
    """(median, stdev, least, most) of the link figures whose transfers took varying times."""
    return {name: s for name, s in _transport(cal).items() if len(s) == 4} if cal else {}


def _transport(cal: Mapping[str, Any]) -> dict[str, tuple[float, ...]]:
    figures = mapping(cal.get("transport", {}), "calibration.transport")
    out: dict[str, tuple[float, ...]] = {}
    for name, value in figures.items():
        if name not in TRANSPORT_FIELDS:
            raise CalibrationError(f"calibration.transport: unknown figure {name!r:.40}")
        what = f"calibration.transport.{name}"
        if not isinstance(value, dict) or name not in VARYING_TRANSPORT:
            out[name] = (number(value, what, *TRANSPORT_FIELDS[name]),)
            continue
        out[name] = _spread(value, what, *TRANSPORT_FIELDS[name])
    return out


def _spread(value: Mapping[str, Any], what: str, lo: float, hi: float) -> tuple[float, float, float, float]:
    """(median, stdev, min, max) of a figure that varies, checked."""
    if sorted(value) != sorted(SPREAD_KEYS):
        raise CalibrationError(f"{what}: expected a number or an object with {', '.join(SPREAD_KEYS)}")
    median, stdev, least, most = (number(value[k], f"{what}.{k}", lo, hi) for k in SPREAD_KEYS)
    if not least <= median <= most:
        raise CalibrationError(f"{what}: min <= median <= max does not hold")
    return median, stdev, least, most


def busy(cal: Mapping[str, Any], part: PartSpec | None = None) -> dict[int, float]:
    """The typical busy seconds by opcode (a varying kind's median)."""
    return {opcode: spread[0] for opcode, spread in _busy(cal, part).items()}


def busy_spread(cal: Mapping[str, Any], part: PartSpec | None = None) -> dict[int, tuple[float, float, float]]:
    """(stdev, least, most) of the kinds whose busy time varies."""
    return {opcode: s[1:] for opcode, s in _busy(cal, part).items() if len(s) == 4}


def _busy(cal: Mapping[str, Any], part: PartSpec | None) -> dict[int, tuple[float, ...]]:
    times = mapping(cal.get("busy", {}), "calibration.busy")
    out: dict[int, tuple[float, ...]] = {}
    for key, value in times.items():
        opcode = hex_key(key, "calibration.busy", 0xFF)
        what = f"calibration.busy.{key}"
        if part is not None and opcode not in part.busy:
            raise CalibrationError(f"calibration.busy: the {part.name} has no busy time for opcode {opcode:#04x}")
        if not isinstance(value, dict):
            out[opcode] = (number(value, what, 0.0, MAX_BUSY_SECONDS),)
            continue
        out[opcode] = _spread(value, what, 0.0, MAX_BUSY_SECONDS)
    return out


def sfdp(cal: Mapping[str, Any]) -> bytes | None:
    if cal.get("sfdp") is None:
        return None
    return hex_bytes(cal["sfdp"], "calibration.sfdp", MAX_SFDP)


def registers(cal: Mapping[str, Any]) -> dict[int, int]:
    from amdflash.stages.drivers.navi31 import regs as R

    values = mapping(cal.get("registers", {}), "calibration.registers")
    out = {}
    for key, value in values.items():
        offset = hex_key(key, "calibration.registers", R.BAR5_SIZE - 4)
        if offset & 3:
            raise CalibrationError(f"calibration.registers: {key} is not dword-aligned")
        out[offset] = integer(value, f"calibration.registers.{key}", 0, 0xFFFFFFFF)
    return out


# -- applied by the board -----------------------------------------------------------------------

def cost_profile(base: CostProfile, cal: Mapping[str, Any] | None) -> CostProfile:
    """The board's cost profile: `base` with the calibration's figures (under the base's name,
    which is what the profile is a calibration of)."""
    figures = transport(cal) if cal else {}
    if not figures:
        return base
    return dataclasses.replace(base, **figures)  # type: ignore[arg-type]  # the names are checked above


def calibrated_part(part: PartSpec, cal: Mapping[str, Any] | None) -> PartSpec:
    """The part with the calibration's busy times (as typical; the maximum never below them,
    nor below the most a varying kind took), their spread, and SFDP."""
    if not cal:
        return part
    times = busy(cal, part)
    spread = busy_spread(cal, part)
    table = sfdp(cal)
    follows = protection_reading(cal)
    if follows:
        part = dataclasses.replace(part, protection=dataclasses.replace(part.protection, follows=follows))
    if not times and table is None:
        return part
    merged = dict(part.busy)
    for opcode, seconds in times.items():
        most = spread[opcode][2] if opcode in spread else seconds
        merged[opcode] = (seconds, max(most, part.busy[opcode][1]))
    return dataclasses.replace(part, busy=merged, sfdp=part.sfdp if table is None else table, busy_spread=spread)


def power_on_values(cal: Mapping[str, Any] | None) -> dict[int, int]:
    return registers(cal) if cal else {}
