"""`amdflash sim ...`: make, inspect and export emulated boards."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from amdflash.pipeline.commands.checks import output_option, read_image, write_output
from amdflash.pipeline.errors import Refusal
from amdflash.stages.terminal import printable
from amdflash.stages.sim import Board, create_board
from amdflash.stages.sim.create import BoardExistsError
from amdflash.stages.sim.faults import FAULT_HELP, Faults, FaultSpecError
from amdflash.stages.sim.catalog import DEFAULT_PART, all_parts
from amdflash.stages.sim.state import COUNTER_NAMES, BoardFiles
from amdflash.pipeline.cli import output


def _int(text: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (decimal, or hex with 0x)") from None


# --bridge-link -> the emulated bridge's (pcie_on_at_boot, link_trains).
BRIDGE_LINKS = {"up": (True, True), "down": (False, True), "never": (False, False)}


def _bridge_options(args: argparse.Namespace) -> dict[str, object] | None:
    bridge: dict[str, object] = {}
    if args.bridge_link:
        bridge["pcie_on_at_boot"], bridge["link_trains"] = BRIDGE_LINKS[args.bridge_link]
    if args.gpu_device_id is not None:
        if not 0 <= args.gpu_device_id <= 0xFFFF:
            raise Refusal(f"--gpu-device-id {args.gpu_device_id:#x} is not a 16-bit PCI device id")
        bridge["gpu_device_id"] = args.gpu_device_id
    return bridge or None


def _describe_bridge(bridge: dict[str, object]) -> str:
    return ", ".join(f"{k}={v:#06x}" if k == "gpu_device_id" else f"{k}={v}" for k, v in bridge.items())


def add_parser(sub: argparse._SubParsersAction) -> None:
    sim = sub.add_parser(
        "sim", help="emulated boards: create, export, counters, synthetic images",
        description="Emulated Navi31 boards for tests, the demo and benchmarks. A board is a directory; "
                    "every amdflash command reaches it as --board sim:PATH, through the same "
                    "interfaces as hardware. Everything here is synthetic, never an AMD image.")
    ssub = sim.add_subparsers(dest="sim_command", required=True, metavar="SIM_COMMAND")

    c = ssub.add_parser(
        "create", help="make a new emulated board directory",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Create an emulated board at PATH (an empty or new directory). Default content: a "
                    "synthetic IFWI. Writes only PATH.",
        epilog="faults (--fault, repeatable; seeded and deterministic):\n" + FAULT_HELP)
    c.add_argument("path", type=Path, metavar="PATH", help="the board directory to create (new or empty)")
    content = c.add_mutually_exclusive_group()
    content.add_argument("--synthetic", action="store_true", help="synthetic IFWI content (default)")
    content.add_argument("--image", type=Path, metavar="FILE", help="start with this 2 MiB image")
    content.add_argument("--blank", action="store_true", help="start erased (all 0xFF)")
    c.add_argument("--chip", choices=tuple(all_parts()), default=DEFAULT_PART, metavar="NAME",
                   help="the emulated flash part: " + ", ".join(all_parts()) + f" (default {DEFAULT_PART}); "
                        "UNKNOWN and UNKNOWN-SFDP10 are fictional parts absent from the chip table")
    c.add_argument("--cmp", action="store_true", help="set SR2.CMP (with BP=0: the whole array is protected)")
    c.add_argument("--bp", type=int, default=0, metavar="N",
                   help="block-protect value: 0..7 (BP2..BP0), 0..15 on the MX25U1635F (BP3..BP0)")
    c.add_argument("--gated", action="store_true",
                   help="healthy autonomous boot: the ROM_SW engine is gated (STATUS 0x04000800)")
    c.add_argument("--sos", action="store_true", help="SOS is up: PSP update commands answer gated (0xA)")
    c.add_argument("--no-raw-rom", action="store_true", help="raw SMUIO ROM controller unavailable")
    c.add_argument("--mirrored-rom", action="store_true", help="ROM aperture mirrors a 1 MiB window")
    c.add_argument("--transport", choices=("asm24", "pcie", "ideal"), default="asm24",
                   help="cost profile charged on the virtual clock (default asm24)")
    c.add_argument("--realtime", type=float, default=0.0, metavar="SCALE",
                   help="sleep SCALE wall seconds per modelled second (default 0: virtual time only)")
    c.add_argument("--seed", type=_int, help="seed for content, identity and faults (default random)")
    c.add_argument("--psp-order", help="comma-separated item ids the PSP bootloader requests, e.g. 0x01,0x08")
    c.add_argument("--fault", action="append", default=[], metavar="SPEC", help="inject a fault (see below)")
    c.add_argument("--lenient", action="store_true",
                   help="count ROM_SW protocol violations (see 'sim stats') instead of failing on them; "
                        "the default, strict, fails the access loudly")
    c.add_argument("--bridge-link", choices=tuple(BRIDGE_LINKS),
                   help="PCIe link of the emulated USB bridge: up at plug-in (default), down (the host must "
                        "power it on and train it) or never (training never reaches L0)")
    c.add_argument("--from-report", type=Path, metavar="FILE",
                   help="a board like the one a hardware report describes (amdflash hardware-report): its chip, "
                        "status registers, SFDP, registers as found and measured timings; the divergences from "
                        "the emulator's model are printed")
    c.add_argument("--from-run", nargs=2, metavar=("TRAIL", "RUN"),
                   help="as --from-report, from the report a hardware-report run RUN recorded in the audit "
                        "database TRAIL (the run must verify); any other run that identified its board gives its "
                        "chip, status registers and registers as found, with the model's timings and SFDP "
                        "(said as divergences: a dump or flash measures none)")
    c.add_argument("--gpu-device-id", type=_int, metavar="ID",
                   help="PCI device id of the GPU behind the emulated USB bridge (default 0x744C, Navi31)")
    c.set_defaults(func=cmd_create)

    i = ssub.add_parser("image", help="export the raw flash content, bypassing every driver",
                        description="Copy the board's flash array to FILE: the physical truth, read "
                                    "without any driver. Writes only FILE.")
    i.add_argument("path", type=Path, metavar="PATH", help="the board directory")
    output_option(i, "the file to write (2 MiB)", required=True)
    i.set_defaults(func=cmd_image)

    s = ssub.add_parser("stats", help="print the board's counters as JSON",
                        description="Counters: USB transfers, TLPs, register accesses, SPI transactions, "
                                    "flash busy seconds, modelled seconds, ROM_SW protocol violations and "
                                    "completions touched before their done bit was read. --reset zeroes them.")
    s.add_argument("path", type=Path, metavar="PATH", help="the board directory")
    s.add_argument("--reset", action="store_true", help="zero the counters after printing them")
    s.set_defaults(func=cmd_stats)

    y = ssub.add_parser("synth", help="write a synthetic IFWI image (labelled synthetic)",
                        description="Write a 2 MiB synthetic IFWI with the Navi31 layout and seeded "
                                    "pseudo-random payloads. Not an AMD image.")
    output_option(y, "the file to write (2 MiB)", required=True)
    y.add_argument("--seed", type=_int, default=0, metavar="N",
                   help="seed of the pseudo-random payloads (default 0); the same seed gives the same image")
    y.set_defaults(func=cmd_synth)

    f = ssub.add_parser("fault", help="add or clear faults on an existing board",
                        formatter_class=argparse.RawDescriptionHelpFormatter,
                        description="Change the board's injected faults.",
                        epilog="faults:\n" + FAULT_HELP)
    f.add_argument("path", type=Path, metavar="PATH", help="the board directory")
    f.add_argument("specs", nargs="*", metavar="SPEC", help="faults to add (see below)")
    f.add_argument("--clear", action="store_true", help="remove every fault first")
    f.set_defaults(func=cmd_fault, trailing_positionals="specs")

    c = ssub.add_parser("power-cycle", help="switch the board off and on (after ifwi-all, or a chip left in a mode)",
                        description="Remove and restore the board's power, as a hard power cycle of a real "
                                    "card does: the GPU's registers return to their power-on values, the PSP "
                                    "boot firmware starts over (an IFWI stream it finished or abandoned is "
                                    "gone), and the flash chip loses its volatile state (status registers "
                                    "reload, deep power-down, QPI and suspended operations end). The flash "
                                    "content is kept. Refused while a job holds the board.")
    c.add_argument("path", type=Path, metavar="PATH", help="the board directory")
    c.set_defaults(func=cmd_power_cycle)


def cmd_create(args: argparse.Namespace) -> int:
    if args.image:
        content: str | bytes = read_image(args.image)   # stat first: never reads a device or a FIFO
    else:
        content = "blank" if args.blank else "synthetic"
    psp_order = None
    if args.psp_order:
        try:
            psp_order = [int(x, 0) for x in args.psp_order.split(",")]
        except ValueError:
            raise Refusal(f"--psp-order: {args.psp_order!r} is not a comma-separated list of numbers") from None
    chosen = {"chip": args.chip, "transport": args.transport, "bridge": _bridge_options(args)}
    divergences: list[str] = []
    if args.from_report is not None and args.from_run is not None:
        raise Refusal("--from-report and --from-run: one or the other")
    if args.from_report is not None or args.from_run is not None:
        chosen, divergences = _from_report(args)
    try:
        path = create_board(
            args.path, content=content, cmp=args.cmp, bp=args.bp, gated=args.gated, sos=args.sos,
            no_raw_rom=args.no_raw_rom, mirrored_rom=args.mirrored_rom,
            seed=args.seed, faults=args.fault, realtime_scale=args.realtime, psp_order=psp_order,
            strict=not args.lenient, **chosen)
    except (BoardExistsError, FaultSpecError, ValueError) as e:
        raise Refusal(str(e)) from None
    except OSError as e:        # the directory could not be made (permissions, a missing parent's parent...)
        raise Refusal(f"{args.path}: cannot create the board ({e.strerror or e})") from None
    for line in divergences:
        output.result(f"  diverges:  {line}")
    files = BoardFiles(path)
    try:
        cfg = files.config
        output.result(f"created emulated board {path} (synthetic hardware, not an AMD device)")
        output.result(f"  spec:      sim:{path}")
        output.result(f"  content:   {cfg['content']}   transport: {cfg['transport']}   seed: {cfg['seed']}")
        output.result(f"  serial:    {cfg['serial']}   unique id: {cfg['unique_id']}")
        output.result(f"  chip:      {all_parts()[cfg['chip']].description}")
        variant = [k for k, v in cfg["variant"].items() if v]
        if not cfg.get("strict", True):
            variant.append("lenient (protocol violations counted, not raised)")
        if args.cmp or args.bp:
            variant.append(f"SR: CMP={int(args.cmp)} BP={args.bp}")
        if variant:
            output.result(f"  variant:   {', '.join(variant)}")
        if cfg.get("bridge"):
            output.result(f"  bridge:    {_describe_bridge(cfg['bridge'])}")
        faults = Faults.from_json(cfg["faults"]).describe()
        if faults:
            output.result(f"  faults:    {', '.join(faults)}")
    finally:
        files.close()
    return 0


def _from_report(args: argparse.Namespace) -> tuple[dict[str, object], list[str]]:
    """create_board options from a hardware report (an untrusted file: checked field by field)."""
    if args.chip != DEFAULT_PART or args.transport != "asm24" or args.cmp or args.bp or _bridge_options(args):
        raise Refusal("--from-report sets the chip, transport, status registers and bridge itself: "
                      "--chip, --transport, --cmp, --bp, --bridge-link and --gpu-device-id do not go with it")
    if args.from_run is not None:
        what = f"--from-run {args.from_run[0]} {args.from_run[1]}"
        recorded = _recorded_report(*args.from_run)
        return _options(what, recorded) if isinstance(recorded, str) else _run_options(what, recorded)
    return report_options(args.from_report)


def report_options(path: Path) -> tuple[dict[str, object], list[str]]:
    """create_board options and the divergences from the model, from a hardware report file."""
    return _options(f"--from-report {path}", _report_text(path))


def read_report(path: Path) -> dict[str, Any]:
    """The report file, checked (report_model.check): for reading fields beside its options."""
    from amdflash.stages.sim.calibration import CalibrationError, loads
    from amdflash.stages.sim.report_model import check

    try:
        return dict(check(loads(_report_text(path))))
    except (CalibrationError, ValueError, RecursionError) as e:
        raise Refusal(f"--from-report {path}: {e}") from None


def _report_text(path: Path) -> str:
    what = f"--from-report {path}"
    try:
        if not path.is_file() or path.stat().st_size > MAX_REPORT:
            raise Refusal(f"{what}: not a regular file of at most 1 MiB")
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise Refusal(f"{what}: not a readable report ({e})") from None


def _options(what: str, text: str) -> tuple[dict[str, object], list[str]]:
    from amdflash.stages.sim.calibration import CalibrationError, loads
    from amdflash.stages.sim.report_model import board_options

    try:
        return board_options(loads(text))
    except json.JSONDecodeError as e:
        raise Refusal(f"{what}: not a JSON report ({e})") from None
    except (CalibrationError, RecursionError) as e:
        raise Refusal(f"{what}: {e}") from None


MAX_REPORT = 1 << 20


def _run_options(what: str, facts: dict[str, object]) -> tuple[dict[str, object], list[str]]:
    from amdflash.stages.sim.calibration import CalibrationError
    from amdflash.stages.sim.report_model import run_board_options

    try:
        return run_board_options(facts)
    except CalibrationError as e:
        raise Refusal(f"{what}: {e}") from None
    except (ValueError, TypeError, RecursionError) as e:      # a record no run of amdflash writes
        raise Refusal(f"{what}: the run's record of its board is malformed ({type(e).__name__})") from None


def _recorded_report(trail: str, run: str) -> str | dict[str, object]:
    """The hardware report a run recorded, once the run verifies; for any other run, what its
    record says of the board (identity, status registers, registers as found)."""
    from amdflash.pipeline.engine.auditdb import open_for_reading
    from amdflash.pipeline.commands.hardware_report import REPORT_EVENT
    from amdflash.store.queries import RunNotFound, first_board, register_snapshot, resolve_run, run_row, stage_details
    from amdflash.store.run_rows import RunUnverified, open_run
    from amdflash.store.verify import snapshot

    try:
        trail.encode("utf-8")       # SQLite takes a name as text: it failed with its own decoding error
    except UnicodeEncodeError:
        raise Refusal(f"--from-run {printable(trail)}: the name is not valid UTF-8; rename the file (or link it "
                      "under a UTF-8 name)") from None
    if not Path(trail).is_file():
        raise Refusal(f"--from-run: no audit database at {trail}")
    db = open_for_reading(trail)
    try:
        with snapshot(db.conn):
            try:
                run_id = resolve_run(db, run)
                rows = open_run(db.conn, run_id)
            except (RunNotFound, RunUnverified) as e:
                raise Refusal(f"--from-run: {e}") from None
            command = run_row(db, rows.key)["command"]
            # Only rows a checkpoint seals: an unsealed tail (a host that died with its writer) is
            # not verifiable, and a board is not made from what anyone could have added there.
            found = stage_details(db, rows, "measure", REPORT_EVENT, limit=1)
            if not found:
                board = first_board(db, rows, ("kind", "jedec", "chip", "sr1", "sr2", "sr3", "detail"))
                try:
                    registers = register_snapshot(db, rows, "before", sealed_only=True)
                except (ValueError, TypeError, AttributeError, RecursionError):
                    raise Refusal(f"--from-run: run {run_id}'s register snapshot is not a map of registers") from None
    finally:
        db.conn.close()
    if not found:
        if not board or not board["jedec"]:
            raise Refusal(f"--from-run: run {run_id} ({command}) recorded no identified board to make one from "
                          "(in the rows its checkpoints seal)")
        return {"run": f"run {run_id} ({command})", **board, "registers": registers or {}}
    text = found[0]
    if not isinstance(text, str) or len(text) > MAX_REPORT:
        raise Refusal(f"--from-run: run {run_id}'s recorded report is not a JSON text of at most 1 MiB")
    return text


def cmd_image(args: argparse.Namespace) -> int:
    files = _open_files(args.path)
    try:
        data = bytes(files.flash[:])
    finally:
        files.close()
    write_output(args, data)
    import hashlib

    output.result(f"wrote {args.output} ({len(data):#x} bytes) sha256={hashlib.sha256(data).hexdigest()}")
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    files = _open_files(args.path)
    try:
        counters = files.region("counters").cast("d")
        stats = {name: counters[i] for i, name in enumerate(COUNTER_NAMES)}
        for name in stats:
            if name not in ("modelled_seconds", "spi_seconds", "flash_busy_seconds", "sleep_seconds"):
                stats[name] = int(stats[name])
        json.dump(stats, sys.stdout, indent=2)
        output.result()
        if args.reset:
            for i in range(len(COUNTER_NAMES)):
                counters[i] = 0.0
        counters.release()
    finally:
        files.close()
    return 0


def cmd_synth(args: argparse.Namespace) -> int:
    from amdflash.stages.sim.synth import synthetic_ifwi

    data = synthetic_ifwi(args.seed)
    write_output(args, data)
    import hashlib

    output.result(f"wrote synthetic IFWI {args.output} (seed {args.seed}, not an AMD image) "
          f"sha256={hashlib.sha256(data).hexdigest()}")
    return 0


def cmd_fault(args: argparse.Namespace) -> int:
    files = _open_files(args.path)
    try:
        faults = Faults() if args.clear else Faults.from_json(files.config.get("faults", {}))
        try:
            for spec in args.specs:
                faults.add(spec)
        except FaultSpecError as e:
            raise Refusal(str(e)) from None
        files.config["faults"] = faults.to_json()
        files.save_config()
        _restart_fault_counts(files, faults)
        output.result(f"faults on {args.path}: {', '.join(faults.describe()) or 'none'}")
    finally:
        files.close()
    return 0


def _restart_fault_counts(files: BoardFiles, faults: Faults) -> None:
    """Counted faults count from the moment they are set, and may fire again."""
    from amdflash.stages.sim import state as slots   # the fault-state slots

    state = files.region("faults").cast("q")
    if faults.kill_after_writes is not None:
        state[slots.F_WRITES] = state[slots.F_KILL_FIRED] = 0
    if faults.usb_disconnect_after is not None:
        state[slots.F_USB_TRANSFERS] = state[slots.F_USB_FIRED] = 0
    if faults.stall_after is not None:
        state[slots.F_ENGINE_TXNS] = 0
    if faults.busy_read is not None:
        state[slots.F_BUSY_LEFT] = state[slots.F_BUSY_FIRED] = 0
    state.release()


def cmd_power_cycle(args: argparse.Namespace) -> int:
    from amdflash.stages.transport.lock import BoardBusy, sim_lock

    if not (args.path / "board.json").is_file():
        raise Refusal(f"{args.path} is not an emulated board (create one with 'amdflash sim create')")
    real = os.path.realpath(args.path)          # resolved once: the board locked is the board opened
    try:
        lock = sim_lock(real).acquire()      # never under a running job
    except BoardBusy as e:
        raise Refusal(str(e)) from None
    try:
        try:
            board = Board(real)
        except (FileNotFoundError, ValueError) as e:      # a link or a wrong file in it (state.py)
            raise Refusal(str(e)) from None
        with board:
            board.power_cycle()
    finally:
        lock.release()
    output.result(f"power-cycled {args.path}: registers, PSP boot firmware and the flash's volatile state "
                  "are as at power-on")
    return 0


def _open_files(path: Path) -> BoardFiles:
    try:
        return BoardFiles(path)
    except (FileNotFoundError, ValueError) as e:
        raise Refusal(str(e)) from None


__all__ = ["add_parser", "Board"]
