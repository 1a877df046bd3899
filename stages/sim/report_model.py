"""Hardware reports against the emulator's model: which assumed facts a report confirms or
contradicts, the checks every report passes before anything uses it, and the emulated board
(`sim create --from-report`) that reproduces it.

A report is untrusted input (a file a user sent): `check` validates every field this module
reads — types, ranges, sizes — and raises CalibrationError naming the field.
"""
from __future__ import annotations

import json
import statistics
from collections.abc import Mapping
from typing import Any

from amdflash.stages.sim import cost
from amdflash.stages.sim.parts import PartSpec
from amdflash.stages.sim.calibration import (MAX_BUSY_SECONDS, MAX_SFDP, CalibrationError, hex_bytes,
                                             hex_key, integer, mapping, number)

FORMAT, VERSION = "amdflash-hardware-report", 1
BLOCK_SIZES = ("4", "16", "64", "256")
MAX_LATENCY = 1.0              # seconds: no register access takes longer on a working link
TOLERANCE = 0.10               # a figure within 10 % (or its stated error) of the model agrees with it
BUSY_TOLERANCE = 0.25          # busy times vary from part to part more than links do
BUSY_KINDS = {"0x02": "page program", "0x20": "4 KiB erase", "0x52": "32 KiB erase", "0xd8": "64 KiB erase"}
# Registers whose value a model owns (the ROM_SW engine's CNTL/STATUS/COMMAND, the PSP mailbox):
# states of the moment, not settings a board is found with.
MODEL_REGISTERS = (0x5A3A0, 0x5A3A4, 0x5A3A8, 0x582CC, 0x582D0)


# -- validation ----------------------------------------------------------------------------------

def _dist(value: Any, what: str) -> Mapping[str, Any]:
    d = mapping(value, what)
    integer(d.get("n"), f"{what}.n", 1, 100000)
    for key in ("min", "median", "mean", "max", "stdev"):
        number(d.get(key), f"{what}.{key}", 0.0, MAX_LATENCY)
    if not d["min"] <= d["median"] <= d["max"]:
        raise CalibrationError(f"{what}: min <= median <= max does not hold")
    return d


def check(report: Any) -> Mapping[str, Any]:
    """The report, validated (CalibrationError otherwise)."""
    r = mapping(report, "report")
    if r.get("format") != FORMAT or type(r.get("version")) is not int or r["version"] != VERSION:
        raise CalibrationError(f"not an {FORMAT} version {VERSION} document")
    board = mapping(r.get("board"), "board")
    if not isinstance(board.get("kind"), str) or board["kind"] not in ("usb", "pci", "sim"):
        raise CalibrationError("board.kind: usb, pci or sim")
    if not isinstance(board.get("profile"), str) or board["profile"] not in cost.PROFILES:
        raise CalibrationError(f"board.profile: one of {', '.join(cost.PROFILES)}")
    if board.get("device_id") is not None:
        integer(board["device_id"], "board.device_id", 0, 0xFFFF)
    flash = mapping(r.get("flash"), "flash")
    jedec = hex_bytes(flash.get("jedec"), "flash.jedec", 8)
    if len(jedec) < 3:
        raise CalibrationError("flash.jedec: at least 3 bytes")
    if not isinstance(flash.get("chip"), str) or len(flash["chip"]) > 64:
        raise CalibrationError("flash.chip: a part name")
    for name, value in mapping(flash.get("status_registers"), "flash.status_registers").items():
        if not isinstance(name, str) or len(name) > 8:
            raise CalibrationError("flash.status_registers: register names are short strings")
        integer(value, f"flash.status_registers.{name}", 0, 0xFF)
    hex_bytes(flash.get("sfdp"), "flash.sfdp", MAX_SFDP)
    for key, value in mapping(r.get("registers_found"), "registers_found").items():
        if hex_key(key, "registers_found", 0xFFFFC) & 3:
            raise CalibrationError(f"registers_found: {key} is not dword-aligned")
        integer(value, f"registers_found.{key}", 0, 0xFFFFFFFF)
    timings = mapping(r.get("timings"), "timings")
    t = mapping(timings.get("transport"), "timings.transport")
    _dist(t.get("read32"), "timings.transport.read32")
    _dist(t.get("write32"), "timings.transport.write32")
    for kind in ("read_block", "write_block"):
        blocks = mapping(t.get(kind), f"timings.transport.{kind}")
        if set(blocks) != set(BLOCK_SIZES):
            raise CalibrationError(f"timings.transport.{kind}: sizes {', '.join(BLOCK_SIZES)}")
        for size in BLOCK_SIZES:
            _dist(blocks[size], f"timings.transport.{kind}.{size}")
    spi = mapping(timings.get("spi"), "timings.spi")
    integer(spi.get("prescale"), "timings.spi.prescale", 0, 15)
    number(spi.get("read_landing"), "timings.spi.read_landing", 0.0, MAX_LATENCY)
    for size, s in mapping(spi.get("sizes"), "timings.spi.sizes").items():
        if not (isinstance(size, str) and size.isdigit() and len(size) <= 3):
            raise CalibrationError(f"timings.spi.sizes: key {size!r:.20} is not a transaction size 1..256")
        integer(int(size), "timings.spi.sizes", 1, 256)
        s = mapping(s, f"timings.spi.sizes.{size}")
        integer(s.get("wire_bytes"), f"timings.spi.sizes.{size}.wire_bytes", 1, 260)
        # Either a measurement with its error, or only a bound; always the model's figure.
        for key in ("nominal", *(("seconds", "error") if "seconds" in s else ("seconds_at_most",))):
            number(s.get(key), f"timings.spi.sizes.{size}.{key}", 0.0, MAX_LATENCY)
    busy = mapping(timings.get("busy", {}), "timings.busy")
    if busy:
        for op, k in mapping(busy.get("kinds"), "timings.busy.kinds").items():
            if op not in BUSY_KINDS:
                raise CalibrationError(f"timings.busy.kinds: unknown kind {op!r:.20}")
            k = mapping(k, f"timings.busy.kinds.{op}")
            if "seconds_at_most" in k:
                number(k["seconds_at_most"], f"timings.busy.kinds.{op}.seconds_at_most", 0.0, MAX_BUSY_SECONDS)
            else:
                number(k.get("seconds"), f"timings.busy.kinds.{op}.seconds", 0.0, MAX_BUSY_SECONDS)
                number(k.get("error"), f"timings.busy.kinds.{op}.error", 0.0, MAX_BUSY_SECONDS)
                if "per_operation" in k:                # a kind whose operations took varying times
                    _spread(k, f"timings.busy.kinds.{op}.per_operation")
    return r


def _spread(k: Mapping[str, Any], what: str) -> dict[str, float]:
    """The calibration of a varying busy kind (calibration.py): its median, stdev, least and most."""
    d = mapping(k["per_operation"], what)
    integer(d.get("n"), f"{what}.n", 2, 1 << 20)
    out = {"median": k["seconds"]}
    for key in ("stdev", "min", "max"):
        out[key] = number(d.get(key), f"{what}.{key}", 0.0, MAX_BUSY_SECONDS)
    if not out["min"] <= out["median"] <= out["max"]:
        raise CalibrationError(f"{what}: min <= seconds <= max does not hold")
    return out


# -- the model's view of a report -----------------------------------------------------------------

def transport_fit(report: dict[str, Any]) -> dict[str, float]:
    """The cost-profile figures (cost.py) that reproduce the report's transfer timings."""
    t = report["timings"]["transport"]
    profile = report["board"]["profile"]
    read32, write32 = t["read32"]["median"], t["write32"]["median"]
    if profile == "asm24":
        # Single TLP: a write is one control transfer, a read two; streamed: control + bulk + payload.
        read_a, read_b = _line(t["read_block"])
        write_a, write_b = _line(t["write_block"])
        control = write32
        return {"control": control, "bulk": max(0.0, (read_a + write_a) / 2 - control),
                "read_byte": max(0.0, read_b), "write_byte": max(0.0, write_b)}
    if profile == "pcie":
        return {"pcie_read_dword": read32, "pcie_write_dword": write32}
    return {}


def transport_spread_fit(report: dict[str, Any], medians: Mapping[str, float]) -> dict[str, dict[str, float]]:
    """The spread of each transfer latency whose accesses took varying times (calibration.py's
    {"median", "stdev", "min", "max"}), from the distributions the report measured: a control
    transfer's from a single-TLP write (one control transfer), a bulk transfer's from the
    smallest streamed write beyond it (its variance less the control's); a native link's
    dword costs from single-TLP reads and writes."""
    t = report["timings"]["transport"]
    kinds: dict[str, list[tuple[dict[str, Any], dict[str, Any] | None]]] = {}
    if report["board"]["profile"] == "asm24":
        smallest = t["write_block"][min(t["write_block"], key=int)]
        kinds = {"control": [(t["write32"], None)], "bulk": [(smallest, t["write32"])]}
    elif report["board"]["profile"] == "pcie":
        kinds = {"pcie_read_dword": [(t["read32"], None)], "pcie_write_dword": [(t["write32"], None)]}
    out = {}
    for name, [(d, less)] in kinds.items():
        variance = d["stdev"] ** 2 - (less["stdev"] ** 2 if less else 0.0)
        if d["n"] < 2 or name not in medians:
            continue
        median = medians[name]
        # Steadier than 1 % of the figure (or 1 ns): constant, as the model is — a variance left
        # by floating-point rounding is not a link that varies.
        if variance <= max(0.01 * median, 1e-9) ** 2:
            continue
        # The observed range around the access's median, moved onto this figure's median.
        out[name] = {"median": median, "stdev": variance ** 0.5,
                     "min": max(0.0, median - (d["median"] - d["min"])), "max": median + (d["max"] - d["median"])}
    return out


def _line(points: dict[str, Any]) -> tuple[float, float]:
    xs = [float(k) for k in points]
    ys = [points[k]["median"] for k in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - slope * mx, slope


def predicted(profile: cost.CostProfile) -> dict[str, float]:
    """What the profile says each measured kind takes."""
    out = {"read32": profile.tlp_read32().total, "write32": profile.tlp_write32().total}
    for size in BLOCK_SIZES:
        out[f"read_block {size}"] = profile.stream_read(int(size)).total
        out[f"write_block {size}"] = profile.stream_write(int(size)).total
    return out


def measured(report: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """(median, spread) of each measured kind; the spread (max - min, at least 1 %) is its error."""
    t = report["timings"]["transport"]
    pairs = {"read32": t["read32"], "write32": t["write32"]}
    for size in BLOCK_SIZES:
        pairs[f"read_block {size}"] = t["read_block"][size]
        pairs[f"write_block {size}"] = t["write_block"][size]
    return {k: (d["median"], d["max"] - d["min"]) for k, d in pairs.items()}


def _agree(value: float, model: float, error: float, tolerance: float = TOLERANCE) -> bool:
    return abs(value - model) <= max(tolerance * model, error, 1e-9)


def facts(report: dict[str, Any], ident: Any = None) -> list[dict[str, str]]:
    """Each assumed fact of docs/ the report bears on, with the verdict of the measurements."""
    out: list[dict[str, str]] = []

    def fact(name: str, ok: bool | None, detail: str) -> None:
        verdict = "not measured" if ok is None else ("confirmed" if ok else "contradicted")
        out.append({"fact": name, "verdict": verdict, "detail": detail})

    profile = cost.PROFILES[report["board"]["profile"]]
    model = predicted(profile)
    for kind, (value, spread) in measured(report).items():
        if profile.name == "ideal":
            break
        fact(f"cost model ({profile.name}): {kind} takes {model[kind] * 1e6:.1f} us",
             _agree(value, model[kind], spread), f"measured median {value * 1e6:.2f} us, spread {spread * 1e6:.2f} us")
    spi = report["timings"]["spi"]
    for size, s in sorted(spi["sizes"].items(), key=lambda kv: int(kv[0])):
        name = (f"SPI bus: a {size}-byte ROM_SW read takes 1 us + 8 clocks a byte at 100 MHz/{spi['prescale'] + 1}"
                f" = {s['nominal'] * 1e6:.1f} us")
        if "seconds" in s:
            fact(name, _agree(s["seconds"], s["nominal"], s["error"], 0.0) if profile.physical else None,
                 f"measured {s['seconds'] * 1e6:.2f} us +- {s['error'] * 1e6:.2f} us")
        else:
            fact(name, None, f"over before one status read landed ({s['seconds_at_most'] * 1e6:.1f} us)")
    for finding in report.get("fast_paths", []):
        fact(f"fast path holds on this board: {finding['name']}", bool(finding["ok"]), str(finding["detail"])[:200])
    _model_facts(report, fact)
    busy = report["timings"].get("busy") or {}
    typical = _typical_busy(ident)
    for op, what in BUSY_KINDS.items():
        k = (busy.get("kinds") or {}).get(op)
        t = typical.get(op)
        if t is None:
            continue
        name = f"flash: a {what} takes {t * 1e3:g} ms (typical, the chip table's figure)"
        if k is None:
            fact(name, None, "no --scratch-sector: busy times not measured")
        elif "seconds_at_most" in k:
            fact(name, False if k["seconds_at_most"] < t * (1 - BUSY_TOLERANCE) else None,
                 f"over before a status read could land: at most {k['seconds_at_most'] * 1e3:.3f} ms")
        else:
            fact(name, _agree(k["seconds"], t, k["error"], BUSY_TOLERANCE) if profile.physical else None,
                 f"measured {k['seconds'] * 1e3:.3f} ms +- {k['error'] * 1e3:.3f} ms")
    return out


def _model_facts(report: dict[str, Any], fact: Any) -> None:
    """The emulated part's SFDP and the assumed power-on registers, against the board's."""
    from amdflash.stages.sim.catalog import all_parts
    from amdflash.stages.sim.power_on import POWER_ON_REGISTERS

    sfdp = bytes.fromhex(report["flash"]["sfdp"])
    jedec = bytes.fromhex(report["flash"]["jedec"])[:3]
    parts = [p for p in all_parts().values() if p.jedec == jedec]
    if parts:
        same = [p.name for p in parts if p.sfdp[:len(sfdp)] == sfdp and sfdp]
        fact(f"SFDP: the emulated {'/'.join(p.name for p in parts)} table is the board's", bool(same),
             f"{len(sfdp)} bytes read; " + (f"equal to the {same[0]}'s" if same else "no emulated table is equal"))
    found = {int(k, 16): v for k, v in report["registers_found"].items()}
    for offset, value in POWER_ON_REGISTERS.items():
        if offset in found:
            fact(f"register {offset:#07x} is {value:#010x} at power-on (assumed: no dump of a Navi31 is public)",
                 found[offset] == value, f"found {found[offset]:#010x} (as the run found the board, which an "
                                         "earlier tool may have changed)")
    fact("SEC=1 with BP=6 protects 32 KiB (flashrom's rule, docs/flash-chip.md)", None,
         "not measurable without changing the block-protect bits, which amdflash never does")


def _typical_busy(ident: Any) -> dict[str, float]:
    if ident is None:
        return {}
    chip = ident.chip
    out = {f"{e.opcode:#04x}": e.typical for e in chip.erase_types if e.typical}
    if chip.page_program:
        out["0x02"] = chip.page_program[0]
    return out


# -- a board from a report ---------------------------------------------------------------------------

def board_options(report: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """create_board keyword arguments reproducing the report, and the divergences from the
    emulator's model that the new board carries (said by `sim create`)."""
    from amdflash.stages.sim.catalog import all_parts

    check(report)
    flash = report["flash"]
    jedec = bytes.fromhex(flash["jedec"])[:3]
    parts = [p for p in all_parts().values() if p.jedec == jedec]
    if not parts:
        raise CalibrationError(f"flash.jedec {jedec.hex(' ')}: no emulated part has this JEDEC id; "
                               "the emulator cannot model this chip yet")
    # Parts sharing a JEDEC id (W25Q16DW/FW/JW) differ in their SFDP, as the driver tells them apart.
    sfdp = bytes.fromhex(flash["sfdp"])
    same = [p for p in parts if sfdp and p.sfdp[:len(sfdp)] == sfdp]
    named = [p for p in parts if p.name == flash["chip"]]
    spec = (same or named or parts)[0]
    names = [r.name for r in spec.registers]
    regs = flash["status_registers"]
    # A register the driver never reads (the MX25U1633F's CR) is absent from a report: its factory value.
    unread = spec.unread_registers
    if sorted(regs) != sorted(n for n in names if n not in unread):
        raise CalibrationError(f"flash.status_registers: the {spec.name} has {', '.join(names)}")
    regs = {**{r.name: r.initial for r in spec.registers if r.name in unread}, **regs}
    divergences: list[str] = []
    cal: dict[str, Any] = {"source": f"hardware report of a {report['board']['kind']} board ({flash['chip']})"}
    if sfdp != spec.sfdp[:len(sfdp)] or not sfdp:
        cal["sfdp"] = sfdp.hex()
        divergences.append(f"SFDP: the board's {len(sfdp)} bytes differ from the emulated {spec.name}'s table")
    transport: dict[str, Any] = dict(transport_fit(report))
    profile = cost.PROFILES[report["board"]["profile"]]
    for name, value in transport.items():
        if abs(value - getattr(profile, name)) > 1e-12:
            divergences.append(f"transport: {name} {value:.4g} s, the {profile.name} profile's is "
                               f"{getattr(profile, name):.4g} s")
    for name, spread in transport_spread_fit(report, transport).items():
        transport[name] = spread
        divergences.append(f"transport: {name} varies from transfer to transfer: stdev {spread['stdev']:.3g} s, "
                           f"{spread['min']:.4g}..{spread['max']:.4g} s; the {profile.name} profile's never does")
    spi = report["timings"]["spi"]
    refclk = _refclk(spi)
    if refclk is not None and abs(refclk - profile.spi_refclk_hz) > 0.005 * profile.spi_refclk_hz:
        transport["spi_refclk_hz"] = refclk
        divergences.append(f"SPI: the bus clocks as from a {refclk / 1e6:.2f} MHz reference, the model's is 100 MHz")
    cal["transport"] = transport
    busy: dict[str, Any] = {}
    measured_busy = ((report["timings"].get("busy") or {}).get("kinds") or {}) if profile.physical else {}
    for op, k in measured_busy.items():
        opcode = int(op, 16)
        if opcode not in spec.busy:
            raise CalibrationError(f"timings.busy.kinds: the {spec.name} has no busy time for {op}")
        if "seconds_at_most" in k:
            # Only a bound: the model's figure stands unless the bound rules it out.
            if k["seconds_at_most"] < spec.busy[opcode][0]:
                busy[f"{opcode:#04x}"] = k["seconds_at_most"]
                divergences.append(f"busy: {BUSY_KINDS[op]} at most {k['seconds_at_most'] * 1e3:.3f} ms, the "
                                   f"emulated {spec.name}'s typical is {spec.busy[opcode][0] * 1e3:g} ms")
            continue
        # A chip ten times slower than its datasheet's maximum is not one a board is made of.
        most = k["per_operation"].get("max") if "per_operation" in k else k["seconds"]
        if isinstance(most, (int, float)) and most > 10 * spec.busy[opcode][1]:
            raise CalibrationError(f"timings.busy.kinds.{op}: {most:g} s is over ten times the {spec.name}'s "
                                   f"datasheet maximum ({spec.busy[opcode][1]:g} s)")
        if "per_operation" in k:
            spread = _spread(k, f"timings.busy.kinds.{op}.per_operation")
            busy[f"{opcode:#04x}"] = spread
            divergences.append(f"busy: {BUSY_KINDS[op]} varies from operation to operation: median "
                               f"{spread['median'] * 1e3:.3f} ms, stdev {spread['stdev'] * 1e3:.3f} ms, "
                               f"{spread['min'] * 1e3:.3f}..{spread['max'] * 1e3:.3f} ms over "
                               f"{k['per_operation']['n']}; the emulated {spec.name}'s is always the same")
        else:
            busy[f"{opcode:#04x}"] = k["seconds"]
        if abs(k["seconds"] - spec.busy[opcode][0]) > max(k["error"], 0.01 * spec.busy[opcode][0]):
            divergences.append(f"busy: {BUSY_KINDS[op]} {k['seconds'] * 1e3:.3f} ms, the emulated "
                               f"{spec.name}'s typical is {spec.busy[opcode][0] * 1e3:g} ms")
    cal["busy"] = busy
    cal["registers"] = _found_registers(report["registers_found"], divergences)
    follows = _protection_reading(flash.get("protection_reading"), spec)
    if follows:
        cal["protection"] = follows
        divergences.append(f"protection: the chip follows the {follows} reading where the sources disagree "
                           f"(the emulated {spec.name} another)")
    options: dict[str, Any] = {"chip": spec.name, "transport": profile.name, "calibration": cal,
                               "status_registers": tuple(regs[n] for n in names)}
    if report["board"].get("device_id") not in (None, 0x744C):
        divergences.append(f"GPU device id {report['board']['device_id']:#06x} (only the USB bridge's "
                           "emulation carries it)")
        options["bridge"] = {"gpu_device_id": report["board"]["device_id"]}
    return options, divergences


def run_board_options(facts: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """create_board keyword arguments from what a run's record says of its board (`sim create
    --from-run` of a run that made no hardware report): its chip by JEDEC id (and the name it
    was identified as), its status registers, and its registers as the run found them. A dump
    or flash measures no timings and records no raw SFDP: those stay the model's, and the
    divergences say so. The record is read from an audit database that verifies, but is
    checked like any file a user sent."""
    from amdflash.stages.sim.catalog import all_parts

    jedec = hex_bytes(facts.get("jedec"), "boards.jedec", 8)[:3]
    chip = str(facts.get("chip") or "")
    parts = [p for p in all_parts().values() if p.jedec == jedec]
    if len(jedec) < 3 or not parts:
        raise CalibrationError(f"boards.jedec {jedec.hex(' ')}: no emulated part has this JEDEC id; "
                               "the emulator cannot model this chip yet")
    spec = next((p for p in parts if p.name in chip), parts[0])
    kind = facts.get("kind")
    profile = {"usb": "asm24", "pci": "pcie"}.get(kind) if isinstance(kind, str) else None
    if kind == "sim":
        detail = facts.get("detail")
        try:
            profile = json.loads(detail).get("profile") if isinstance(detail, str) else None
        except (ValueError, AttributeError, RecursionError):
            profile = None
    if not isinstance(profile, str) or profile not in cost.PROFILES:
        raise CalibrationError(f"boards.kind {kind!r:.20}: not a board amdflash knows the link of")
    status = [integer(facts.get(f"sr{i + 1}") or 0, f"boards.sr{i + 1}", 0, 0xFF) for i in range(3)]
    divergences = [f"timings: {facts.get('run', 'the run')} measured none; the board keeps the {profile} "
                   "profile's and the part's figures (a hardware-report run records them)",
                   f"SFDP: not in the run's record; the board answers with the emulated {spec.name}'s table"]
    cal: dict[str, Any] = {"source": f"record of {str(facts.get('run', 'a run'))[:80]} on a {kind} board ({spec.name})",
                           "registers": _found_registers(mapping(facts.get("registers") or {}, "registers"),
                                                         divergences)}
    return {"chip": spec.name, "transport": profile, "calibration": cal,
            "status_registers": tuple(status[:len(spec.registers)])}, divergences


def _protection_reading(probe: Any, spec: PartSpec) -> str:
    """The emulator's protection reading for what a report's protection probe found ("" : the part's own)."""
    if probe is None or "follows" not in mapping(probe, "flash.protection_reading"):
        return ""
    from amdflash.stages.drivers.flash.chips import CHIPS

    rules = {r.source: r for chip in CHIPS if chip.protection for r in chip.protection.all_readings()}
    follows = probe["follows"]
    if not isinstance(follows, list) or not follows or not all(isinstance(f, str) and f in rules for f in follows):
        raise CalibrationError("flash.protection_reading.follows: a list of readings amdflash knows")
    rule = rules[follows[0]]
    own = "table" if spec.protection.table is not None else "spi25"
    return "" if rule.rule == own or rule.tb is not None else rule.rule


def _found_registers(found: Mapping[Any, Any], divergences: list[str]) -> dict[str, int]:
    """The registers a board was found with, as a calibration's power-on values (not those the
    engine and PSP models own); each that differs from the model's is a divergence."""
    from amdflash.stages.sim.power_on import POWER_ON_REGISTERS

    registers: dict[str, int] = {}
    for key, value in found.items():
        offset = hex_key(key, "registers", 0xFFFFF) if isinstance(key, str) else integer(key, "registers", 0, 0xFFFFF)
        value = integer(value, f"registers.{offset:#07x}", 0, 0xFFFFFFFF)
        if offset in MODEL_REGISTERS:
            continue                            # the engine model's own state, not a setting
        registers[f"{offset:#07x}"] = value
        if value != POWER_ON_REGISTERS.get(offset, 0):
            divergences.append(f"register {offset:#07x}: found {value:#010x}, the model's power-on value is "
                               f"{POWER_ON_REGISTERS.get(offset, 0):#010x}")
    return registers


def _refclk(spi: dict[str, Any]) -> float | None:
    """The SPI reference clock the largest measured transaction implies (1 us overhead assumed)."""
    measured_sizes = [(int(k), s) for k, s in spi["sizes"].items() if "seconds" in s]
    if not measured_sizes:
        return None
    _, s = max(measured_sizes, key=lambda kv: kv[0])
    clocks = 8 * s["wire_bytes"] * (spi["prescale"] + 1)
    busy = s["seconds"] - 1e-6
    if busy <= 0 or abs(s["seconds"] - s["nominal"]) <= s["error"]:
        return None
    return clocks / busy
