"""The board commands on the command line: their arguments, and how their results are shown.

Parsing and printing only: every check and every run is in commands.py. Results go to
stdout (text, or with --json one JSON object per board with the keys of
`report --format json`); errors are one `error: …` line per board on stderr. With -q a
command that acts (dump, verify, flash, resume, ifwi-all) prints nothing on success; one
that shows something (info, read, probe, list) still shows it.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any
from collections.abc import Sequence

from amdflash.pipeline.commands import board as commands
from amdflash.pipeline.commands import run_end
from amdflash.pipeline.engine import next_step
from amdflash.pipeline.cli import output
from amdflash.pipeline.commands.checks import output_file, overwrite_option
from amdflash.pipeline.errors import EXIT_OK, Refusal
from amdflash.pipeline.logsetup import settings
from amdflash.pipeline.commands.results import ProbeResult, ReadResult, RunOutcome
from amdflash.stages.drivers.navi31.psp import DISABLED_REASON, ERRORS, TRANSFER_TYPE_GATED
from amdflash.stages.open_transport import SPEC_GRAMMAR
from amdflash.stages.terminal import printable

DEFAULT_PRESCALE = 8
STATE_MACHINE_ERROR = 0x11    # GET_TRANSFER_TYPE once a stream has ended: only a power cycle restarts it
SHOWS = {"info", "read", "probe", "restore"}     # commands whose output is the point: printed even with -q


def number(text: str) -> int:
    """An integer in decimal or 0x hex (also 0o, 0b)."""
    try:
        return int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (decimal, or hex with 0x)") from None


def ranged(lo: int, hi: int) -> Any:
    def parse(text: str) -> int:
        value = number(text)
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{value} is not in {lo}..{hi}")
        return value
    parse.__name__ = f"number {lo}..{hi}"
    return parse


def board_options(p: argparse.ArgumentParser, json_output: bool = True) -> None:
    g = p.add_argument_group("boards")
    g.add_argument("--board", action="append", metavar="SPEC", dest="boards",
                   help=f"board to use, repeatable (all run concurrently, one audited run each): {SPEC_GRAMMAR}. "
                        "Default: 'board' in the config file, else auto (the first USB bridge, else native PCI)")
    g.add_argument("--unbind-driver", action="store_true",
                   help="pci boards only: if a kernel driver (amdgpu) is bound to the device, unbind it first "
                        "(writes the device address to the driver's sysfs 'unbind' file); without this a "
                        "bound device is refused")
    if json_output:
        p.add_argument("--json", action="store_true",
                       help="print one JSON object per board on stdout (the keys of 'report --format json')")


def engine_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("ROM_SW engine")
    g.add_argument("--prescale", type=ranged(0, 15), metavar="N",
                   help=f"SPI clock 100 MHz/(N+1), N 0..15 (default {DEFAULT_PRESCALE}, or 'prescale' in the config)")
    g.add_argument("--rx-mode", choices=("primed", "chained"),
                   help="RX quirk handling: chained (default: each transaction yields its predecessor's data, "
                        "half the transactions; checked against primed reads on each board when it is opened, "
                        "and primed there if they disagree) or primed (every read issued twice, as validated "
                        "on hardware); or 'rx_mode' in the config")
    g.add_argument("--restore-each", action="store_true", default=None,
                   help="save/configure/restore the engine registers around every transaction, as the reference does")
    g.add_argument("--reads", type=ranged(1, 9), metavar="N",
                   help="agreeing reads that confirm every byte kept (dump, backup, verify; default 2, or 'reads' in "
                        "the config); where reads disagree, more are taken and a byte needs a majority of at least "
                        "3; 1 opts out (recorded as unconfirmed)")


def hardware_report_option(p: argparse.ArgumentParser) -> None:
    # A group of its own: the manual page lists it once, as it does the ROM_SW engine options.
    p.add_argument_group("hardware report").add_argument("--hardware-report", type=Path, metavar="FILE",
                   help="this board's report from 'amdflash hardware-report' (refused unless it is of this board: "
                        "the flash's JEDEC id and unique ID): busy limits raised to its measured maxima, and a "
                        "protection reading its --scratch-sector probe showed the chip does not follow set aside")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    F = argparse.RawDescriptionHelpFormatter
    ro = ("Read-only for the flash: the ROM_SW engine registers (SPI pads, page mirror, clock) are "
          "configured and restored on every exit path; every register write is audited.")

    p = sub.add_parser("list", help="boards found, with their spec and identity",
                       description="List USB bridges and native PCI Navi31 devices (and emulated USB bridges "
                                   "named by AMDFLASH_SIM_USB), with the --board spec to use. Where the ROM_SW "
                                   "engine or the aperture answers, shows the JEDEC id and flash unique id. "
                                   "Writes nothing to the flash; nothing is recorded.")
    p.add_argument("--format", choices=("text", "json"), default="text",
                   help="text: one line per board (default); json: one array of objects")
    p.add_argument("--json", dest="format", action="store_const", const="json", help="same as --format json")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("info", help="JEDEC, SR1/SR2/SR3, CMP, protection, SFDP, unique ID",
                       description="Identify the flash through the ROM_SW engine. " + ro)
    board_options(p)
    engine_options(p)
    hardware_report_option(p)
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("read", help="read a flash range (hex to stdout unless -o)",
                       description="Read SIZE bytes at ADDRESS through the ROM_SW engine. " + ro)
    p.add_argument("address", type=number, metavar="ADDRESS",
                   help="flash byte address, decimal or 0x hex (0 .. 0x1fffff)")
    p.add_argument("size", type=number, metavar="SIZE", help="bytes to read, decimal or 0x hex (at least 1)")
    p.add_argument("-o", "--output", type=output_file, metavar="FILE",
                   help="write the bytes to FILE instead of hex (32 bytes a line) on stdout")
    overwrite_option(p)
    board_options(p)
    engine_options(p)
    hardware_report_option(p)
    p.set_defaults(func=cmd_read)

    p = sub.add_parser("dump", help="dump the whole 2 MiB flash to a file",
                       description="Dump the whole flash to OUTPUT. Writes OUTPUT only when the dump is "
                                   "complete. " + ro)
    p.add_argument("output", type=output_file, metavar="OUTPUT",
                   help="the file to write (2 MiB); with several --board a template: {serial}, {n} (place in "
                        "the --board list) or {spec}, e.g. dump-{serial}.bin")
    overwrite_option(p)
    p.add_argument("--via", choices=("rom-sw", "aperture"), default="rom-sw",
                   help="rom-sw (default): through the ROM_SW engine, which works on a stalled board; "
                        "aperture: through ROM_INDEX/ROM_DATA after an autonomous boot, refusing a board "
                        "without the raw controller, a mirrored 1 MiB aperture or a dump without the IFWI "
                        "signature")
    board_options(p)
    engine_options(p)
    hardware_report_option(p)
    p.set_defaults(func=cmd_dump)

    p = sub.add_parser("verify", help="compare the whole flash with an image",
                       description="Read the whole flash and compare it with IMAGE (exactly 2 MiB), recording a "
                                   "verify result per 4 KiB unit; exit 1 naming the first differing address and "
                                   "both bytes. " + ro)
    p.add_argument("image", type=Path, metavar="IMAGE", help="the 2 MiB image to compare with")
    board_options(p)
    engine_options(p)
    hardware_report_option(p)
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser(
        "flash", help="write an image: backup, plan, erase, program, verify", formatter_class=F,
        description="Write IMAGE to the flash through the ROM_SW engine: a whole 2 MiB image, or with\n"
                    "--start-sector and --sector-count either a whole image (its sectors in that range are\n"
                    "written) or those sectors' content alone, as a range flash's backup holds it.\n\n"
                    "Stages: identify, register snapshot, backup read (stored content-addressed beside the audit\n"
                    "database), plan (units already equal are skipped; 1->0-only units are programmed without\n"
                    "erase; otherwise the largest aligned erase covering only units that need it), erase,\n"
                    "program, verify (every written unit read back; bounded retries), restore registers.\n\n"
                    "Safety rails: nothing is written before the image (size, AA55AA55 signature unless --force),\n"
                    "the board identity, the protection state (CMP needs --clear-cmp; BP-protected targets are\n"
                    "refused) and the audit database (writable) have all been checked. Each unit's intent is\n"
                    "committed to the audit trail before it is erased, so a killed run can be resumed\n"
                    "('amdflash resume'). Ctrl-C stops at the next safe point (exit 130).")
    p.add_argument("image", type=Path, metavar="IMAGE",
                   help="the image to write: 2 MiB, or the content of the sectors --start-sector and "
                        "--sector-count name (a range flash's backup)")
    p.add_argument("--yes", action="store_true", help="required: confirm that the flash may be written")
    p.add_argument("--clear-cmp", action="store_true",
                   help="allow clearing SR2.CMP (which, with BP=0, protects the whole array); other bits are kept")
    p.add_argument("--start-sector", type=ranged(0, 511), default=0, metavar="N",
                   help="first 4 KiB sector, 0..511 (default 0)")
    p.add_argument("--sector-count", type=ranged(1, 512), metavar="M",
                   help="number of sectors, 1..512 (default: to the end of the flash)")
    p.add_argument("--force", action="store_true",
                   help="accept an image without the AA55AA55 signature, or whose VBIOS part number differs from "
                        "the board's (or cannot be read)")
    p.add_argument("--expect-part", metavar="NUMBER",
                   help="the board's VBIOS part number, when its flash is blank or unreadable (a bricked board): "
                        "the image's must match (first ten characters, as fwupd compares)")
    p.add_argument("--retries", type=ranged(0, 100), default=2, metavar="N",
                   help="re-erase/program attempts per unit after a failed verify, 0..100 (default 2)")
    p.add_argument("--unknown-chip-ok", action="store_true",
                   help="write a flash part that is not in the chip table, using only its SFDP facts (erase "
                        "types and times, page size); refused if they are missing or protection knowledge is needed")
    p.add_argument("--start-over", action="store_true",
                   help="flash a board whose last flash never finished (stopped or failed after it began writing) "
                        "instead of refusing and naming the 'amdflash resume' that finishes it; the backup this "
                        "run makes is then the content as found, and the board's original stays the earlier one")
    board_options(p)
    engine_options(p)
    hardware_report_option(p)
    p.set_defaults(func=cmd_flash)

    p = sub.add_parser("restore-original", help="write back the content amdflash first found on a board",
                       description="Write back the board's original content: the backup its first flash on "
                                   "record made before writing anything (with, when range flashes came first, their "
                                   "backups of those sectors), as the audit database names it for the board (flash "
                                   "unique ID and chip of the newest run at --board). Refuses (exit 2) before "
                                   "writing anything when a backup file is gone or no longer matches the SHA-256 "
                                   "on record. A flash of the board left unfinished is started over. Each backup "
                                   "is written by a flash run of its own, audited like any flash.")
    p.add_argument("--yes", action="store_true", help="required: confirm that the flash may be written")
    board_options(p)
    engine_options(p)
    hardware_report_option(p)
    from amdflash.pipeline.cli.bundle import from_bundle_option

    from_bundle_option(p)
    p.set_defaults(func=cmd_restore_original)

    p = sub.add_parser("resume", help="finish an interrupted flash run",
                       description="Resume RUN_ID (default: the latest unfinished flash run of --board): checks that "
                                   "the board is the same board (flash unique ID, chip, bridge serial) and the image "
                                   "the same image (SHA-256), reads every unit again and rewrites only what "
                                   "differs, finishes and verifies. Refuses (exit 2) on any mismatch.")
    p.add_argument("run_id", nargs="?", metavar="RUN_ID", help="the run to resume (a unique prefix is enough)")
    p.add_argument("--yes", action="store_true", help="required: confirm that the flash may be written")
    p.add_argument("--image", type=Path, metavar="FILE",
                   help="the image, if it moved since the original run (its SHA-256 must match)")
    board_options(p)
    hardware_report_option(p)
    p.set_defaults(func=cmd_resume)

    p = sub.add_parser("probe", help="PSP boot mailbox state (boot partition, FB state, model id, transfer type)",
                       description="Query the PSP boot-firmware mailbox. Sends only query commands; says when "
                                   "update commands are gated (transfer type 0xA).")
    board_options(p)
    p.set_defaults(func=cmd_probe)

    p = sub.add_parser("ifwi-all", help="stream the IFWI items the PSP bootloader requests",
                       description="Stream, item by item, what the early PSP bootloader requests (at most 19 items) "
                                   "until the terminal phase-2 item; the PSP writes partition B itself. Needs --yes. "
                                   "A hard power cycle is required afterwards.")
    p.add_argument("image", type=Path, metavar="IMAGE", help="the 2 MiB IFWI image to stream from")
    p.add_argument("--yes", action="store_true", help="required: confirm that the PSP may write the flash")
    board_options(p)
    p.set_defaults(func=cmd_ifwi_all)

    for name in ("stream", "ifwi-step", "live-flash"):
        p = sub.add_parser(name, help="disabled: failed validation on a stock board",
                           description=f"Disabled. {DISABLED_REASON}.")
        p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
        p.set_defaults(func=cmd_disabled)


# -- from arguments to a session ---------------------------------------------------------------------

def session(args: argparse.Namespace) -> commands.Session:
    configured = getattr(args, "settings", {}) or {}
    boards = args.boards or configured.get("board") or ["auto"]
    if isinstance(boards, str):
        boards = [boards]
    return commands.Session(tuple(boards), commands.db_path(args), bool(getattr(args, "unbind_driver", False)),
                            progress=not args.no_progress and configured.get("progress", True),
                            operator=getattr(args, "operator", None), advice=args.advice)


def engine(args: argparse.Namespace) -> commands.EngineOptions:
    configured = getattr(args, "settings", {}) or {}

    def pick(name: str, default: Any) -> Any:
        value = getattr(args, name, None)
        return value if value is not None else configured.get(name, default)
    return commands.EngineOptions(pick("prescale", DEFAULT_PRESCALE), pick("rx_mode", "chained"),
                                  bool(pick("restore_each", False)), pick("reads", 2),
                                  getattr(args, "hardware_report", None))


def _require_yes(args: argparse.Namespace, what: str) -> None:
    if not args.yes:
        raise Refusal(f"refusing to write without --yes ({args.command} {what})")


# -- handlers ----------------------------------------------------------------------------------------

def cmd_info(args: argparse.Namespace) -> int:
    return show(args, commands.info(session(args), engine(args)))


def cmd_read(args: argparse.Namespace) -> int:
    return show(args, commands.read(session(args), args.address, args.size, args.output, engine(args),
                                           args.overwrite))


def cmd_dump(args: argparse.Namespace) -> int:
    return show(args, commands.dump(session(args), args.output, args.via, engine(args), args.overwrite))


def cmd_verify(args: argparse.Namespace) -> int:
    return show(args, commands.verify(session(args), args.image, engine(args)))


def cmd_flash(args: argparse.Namespace) -> int:
    _require_yes(args, "writes the flash")
    options = commands.FlashOptions(args.clear_cmp, args.start_sector, args.sector_count, args.force, args.retries,
                                    args.expect_part, args.unknown_chip_ok, args.start_over)
    return show(args, commands.flash(session(args), args.image, options, engine(args)))


def cmd_restore_original(args: argparse.Namespace) -> int:
    _require_yes(args, "writes the flash")
    if args.from_bundle is not None:
        from amdflash.pipeline.cli.bundle import restore_from_bundle

        return show(args, restore_from_bundle(args, session(args), engine(args)))
    if args.force:
        raise Refusal("--force goes with --from-bundle (a board that is not the bundle's): restore-original from the "
                      "trail writes only the board's own backups")
    return show(args, commands.restore_original(session(args), engine(args)))


def cmd_resume(args: argparse.Namespace) -> int:
    _require_yes(args, "writes the flash")
    return show(args, commands.resume(session(args), args.run_id, args.image, args.hardware_report))


def cmd_probe(args: argparse.Namespace) -> int:
    return show(args, commands.probe(session(args)))


def cmd_ifwi_all(args: argparse.Namespace) -> int:
    _require_yes(args, "makes the PSP write the flash")
    return show(args, commands.ifwi_all(session(args), args.image))


def cmd_disabled(args: argparse.Namespace) -> int:
    raise Refusal(f"'{args.command}' is disabled: {DISABLED_REASON}")


def cmd_list(args: argparse.Namespace) -> int:
    boards = commands.list_boards(lambda message: output.note(message))
    if args.format == "json":
        output.result_json(boards, indent=2)
    elif not boards:
        output.note("no boards found (no ASM24 USB bridge, no native Navi31 PCI device)")
    else:
        for b in boards:
            output.result("  ".join(f"{k}={v}" for k, v in b.items() if v is not None))
    return EXIT_OK


# -- showing results -----------------------------------------------------------------------------------

def show(args: argparse.Namespace, results: Sequence[RunOutcome]) -> int:
    many = len(results) > 1
    quiet = args.quiet
    for r in results:
        if args.json:
            shown = r.report or _unrecorded(r)
            if isinstance(r, ReadResult) and r.output is None and r.ok:
                shown = {**shown, "data": "".join(r.lines)}     # the bytes read, as hex
            output.result_json(shown)
        elif r.ok and (args.command in SHOWS or not quiet):
            prefix = f"[{r.board}] " if many else ""
            # A probe's own lines are its answers in words; r.lines holds what the run said besides.
            for line in ([*r.lines, *probe_lines(r, args.advice)] if isinstance(r, ProbeResult) else r.lines):
                output.result(printable(prefix + line))   # one line each: a newline from the trail escaped
    for r in results:
        if r.error:
            where = f"[{r.board}] " if many else ""
            run = f" (run {r.run_id}, {r.status})" if r.run_id else ""
            output.error(f"{where}{r.error}{run}", advice=r.advice)
    if many and not args.json and (not quiet or any(not r.ok for r in results)):
        output.result()
        output.result(f"{'board':40} {'status':12} {'run':26} error")
        for r in results:
            output.result(f"{r.board[-40:]:40} {r.status:12} {r.run_id:26} {r.error or ''}")
    for r in results:
        if settings().json_lines:
            # One structured end per run, for whatever reads the JSON lines.
            output.note("run ended", event_kind="run_end", run_id=r.run_id or None, board=r.board,
                        command=r.command, status=r.status, exit_code=r.exit_code, error=r.error,
                        report=args.advice.command("report", args=[r.run_id]) if r.run_id else None,
                        witnesses=r.summary.get("witnesses"))   # where its tree head stands, when configured
        elif r.ok and r.run_id:
            output.note(f"run {r.run_id}: {run_end.status_words(r.status, r.summary)}")   # and its witnesses
    return commands.exit_code(results)


def _unrecorded(r: RunOutcome) -> dict[str, Any]:
    """The report's shape for a run that was cancelled before it reached the audit trail."""
    return {"run_id": r.run_id or None, "command": r.command, "status": r.status, "board": {"spec": r.board},
            "image_sha256": None, "result_sha256": None, "units": [], "register_writes": 0, "error": r.error}


def probe_lines(r: ProbeResult, advice: next_step.Advice) -> list[str]:
    """The PSP mailbox answers in words: what each query said, and what it means."""
    lines = []
    names = {"boot_partition": "boot partition", "fb_state": "FB state", "model_id": "model id",
             "transfer_type": "transfer type"}
    for key, (error, response) in r.answers.items():
        if error and not (key == "transfer_type" and error == TRANSFER_TYPE_GATED):
            said = f"error {error:#x} ({ERRORS.get(error, 'unknown error')})"
        elif key == "transfer_type":
            phase, item = response >> 8, response & 0xFF
            said = (f"{response:#x}: the bootloader requests item {item:#04x}, phase {phase}"
                    + (" (terminal)" if phase == 2 else ""))
        else:
            said = f"{response:#x}"
        lines.append(f"{names.get(key, key):15} {said}")
    transfer_error, transfer = r.answers.get("transfer_type", (0, 0))
    if transfer_error == STATE_MACHINE_ERROR:
        cycle = advice.command("sim", "power-cycle", args=[next_step.sim_dir(r.board)])
        lines.append("the bootloader takes no stream (it finished or abandoned one): power the board off and on "
                     f"before streaming again (an emulated board: {cycle})")
    if TRANSFER_TYPE_GATED in (transfer_error, transfer):
        lines.append("update commands are gated (transfer type 0xA): reset the card and do not initialise "
                     "a driver/SOS before streaming")
    return lines
