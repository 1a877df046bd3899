"""The board and audit commands of the CLI contract (DESIGN.md "Command line")."""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

import anyio

from amdflash.pipeline import jobs
from amdflash.pipeline.audit_commands import host_key_path, open_for_reading
from amdflash.pipeline.errors import EXIT_FAILED, EXIT_OK, EXIT_REFUSED, Refusal
from amdflash.pipeline.runner import RunInfo, RunResult, exit_code, new_run_id, run_boards
from amdflash.stages.navi31.psp import DISABLED_REASON
from amdflash.stages.open_transport import BoardSpec, BoardSpecError, parse_spec
from amdflash.store.queries import (RunNotFound, finished_by, has_intents, latest_unfinished, register_snapshot, report,
                           resolve_run, runs, unit_states, writes_since)
from amdflash.store.writer import AuditWriter, StoreUnavailable

FLASH_SIZE = jobs.FLASH_SIZE
SECTORS = FLASH_SIZE // jobs.UNIT


def default_db() -> str:
    return os.environ.get("AMDFLASH_DB") or os.path.expanduser("~/.local/share/amdflash/audit.sqlite")


def db_path(args: argparse.Namespace) -> str:
    return args.db or default_db()


def _int(text: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (decimal or 0x hex)") from None


# -- argument definitions ------------------------------------------------------------------------

def _board_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--board", action="append", metavar="SPEC", dest="boards",
                   help="board to use, repeatable (all run concurrently): auto (default: first USB bridge, "
                        "else native PCI), usb, usb:N, usb:SERIAL, pci, pci:DDDD:BB:DD.F, sim:PATH")
    p.add_argument("--unbind-driver", action="store_true",
                   help="pci boards only: if a kernel driver (amdgpu) is bound to the device, unbind it first "
                        "(writes the device address to the driver's sysfs 'unbind' file); without this a "
                        "bound device is refused")


def _engine_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("ROM_SW engine")
    g.add_argument("--prescale", type=int, default=8, metavar="N", help="SPI clock 100 MHz/(N+1), N 0..15 (default 8)")
    g.add_argument("--rx-mode", choices=("primed", "chained"), default="primed",
                   help="RX quirk handling: primed (validated on hardware, default) or chained (each "
                        "transaction yields its predecessor's data; fewer transactions; NOT yet validated on hardware)")
    g.add_argument("--restore-each", action="store_true",
                   help="save/configure/restore the engine registers around every transaction, as the reference does")


def add_parsers(sub: argparse._SubParsersAction) -> argparse._SubParsersAction:
    """Add the board and audit commands; returns the `audit` group for other modules."""
    F = argparse.RawDescriptionHelpFormatter
    ro = ("Read-only for the flash: the ROM_SW engine registers (SPI pads, page mirror, clock) are "
          "configured and restored on every exit path; every register write is audited.")

    p = sub.add_parser("list", help="boards found, with their spec and identity",
                       description="List USB bridges and native PCI Navi31 devices (and emulated USB bridges "
                                   "named by AMDFLASH_SIM_USB), with the --board spec to use. Where the ROM_SW "
                                   "engine or the aperture answers, shows the JEDEC id and flash unique id. "
                                   "Writes nothing to the flash; nothing is recorded.")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("info", help="JEDEC, SR1/SR2/SR3, CMP, protection, SFDP, unique ID",
                       description="Identify the flash through the ROM_SW engine. " + ro)
    _board_option(p)
    _engine_options(p)
    p.set_defaults(func=cmd_board, job="info")

    p = sub.add_parser("read", help="read a flash range (hex to stdout unless -o)",
                       description="Read SIZE bytes at ADDRESS through the ROM_SW engine. " + ro)
    p.add_argument("address", type=_int)
    p.add_argument("size", type=_int)
    p.add_argument("-o", "--output", type=Path, help="write the bytes to this file instead of hex on stdout")
    _board_option(p)
    _engine_options(p)
    p.set_defaults(func=cmd_board, job="read")

    p = sub.add_parser("dump", help="dump the whole 2 MiB flash to a file",
                       description="Dump the whole flash to OUTPUT. --via rom-sw (default) reads through the "
                                   "ROM_SW engine (works on a stalled board); --via aperture reads through "
                                   "ROM_INDEX/ROM_DATA (after autonomous boot) and refuses a board without the raw "
                                   "controller, a mirrored 1 MiB aperture or a dump without the IFWI signature. "
                                   "Writes OUTPUT only when the dump is complete. " + ro)
    p.add_argument("output", type=Path)
    p.add_argument("--via", choices=("rom-sw", "aperture"), default="rom-sw")
    _board_option(p)
    _engine_options(p)
    p.set_defaults(func=cmd_board, job="dump")

    p = sub.add_parser("verify", help="compare the whole flash with an image",
                       description="Read the whole flash and compare it with IMAGE (exactly 2 MiB), recording a "
                                   "verify result per 4 KiB unit; exit 1 naming the first differing address and both "
                                   "bytes. " + ro)
    p.add_argument("image", type=Path)
    _board_option(p)
    _engine_options(p)
    p.set_defaults(func=cmd_board, job="verify")

    p = sub.add_parser(
        "flash", help="write an image: backup, plan, erase, program, verify",
        formatter_class=F,
        description="Write IMAGE (exactly 2 MiB) to the flash through the ROM_SW engine.\n\n"
                    "Stages: identify, register snapshot, backup read (stored content-addressed beside the audit\n"
                    "database), plan (units already equal are skipped; 1->0-only units are programmed without\n"
                    "erase; otherwise the largest aligned erase covering only units that need it), erase,\n"
                    "program, verify (every written unit read back; bounded retries), restore registers.\n\n"
                    "Safety rails: nothing is written before the image (size, AA55AA55 signature unless --force),\n"
                    "the board identity, the protection state (CMP needs --clear-cmp; BP-protected targets are\n"
                    "refused) and the audit database (writable) have all been checked. Each unit's intent is\n"
                    "committed to the audit trail before it is erased, so a killed run can be resumed\n"
                    "('amdflash resume'). Ctrl-C stops at the next safe point (exit 130).")
    p.add_argument("image", type=Path)
    p.add_argument("--yes", action="store_true", help="required: confirm that the flash may be written")
    p.add_argument("--clear-cmp", action="store_true",
                   help="allow clearing SR2.CMP (which, with BP=0, protects the whole array); other bits are kept")
    p.add_argument("--start-sector", type=_int, default=0, metavar="N", help="first 4 KiB sector (default 0)")
    p.add_argument("--sector-count", type=_int, metavar="M", help="number of sectors (default: to the end)")
    p.add_argument("--force", action="store_true", help="accept an image without the AA55AA55 signature")
    p.add_argument("--retries", type=int, default=2, metavar="N", help="re-erase/program attempts per unit (default 2)")
    _board_option(p)
    _engine_options(p)
    p.set_defaults(func=cmd_board, job="flash")

    p = sub.add_parser("resume", help="finish an interrupted flash run",
                       description="Resume RUN_ID (default: the latest unfinished flash run of --board): checks that "
                                   "the board is the same board (flash unique ID, chip, bridge serial) and the image "
                                   "the same image (SHA-256), skips units already verified, redoes units that have an "
                                   "intent but no verify, finishes and verifies. Refuses (exit 2) on any mismatch.")
    p.add_argument("run_id", nargs="?")
    p.add_argument("--yes", action="store_true", help="required: confirm that the flash may be written")
    p.add_argument("--image", type=Path, help="the image, if it moved since the original run (hash must match)")
    _board_option(p)
    p.set_defaults(func=cmd_board, job="resume")

    p = sub.add_parser("probe", help="PSP boot mailbox state (boot partition, FB state, model id, transfer type)",
                       description="Query the PSP boot-firmware mailbox. Sends only query commands; shows the "
                                   "gated hint when update commands are gated (transfer type 0xA).")
    _board_option(p)
    p.set_defaults(func=cmd_board, job="probe")

    p = sub.add_parser("ifwi-all", help="stream the IFWI items the PSP bootloader requests",
                       description="Stream, item by item, what the early PSP bootloader requests (at most 19 items) "
                                   "until the terminal phase-2 item; the PSP writes partition B itself. Needs --yes. "
                                   "A hard power cycle is required afterwards.")
    p.add_argument("image", type=Path)
    p.add_argument("--yes", action="store_true")
    _board_option(p)
    p.set_defaults(func=cmd_board, job="ifwi-all")

    for name in ("stream", "ifwi-step", "live-flash"):
        p = sub.add_parser(name, help="disabled: failed validation on a stock board",
                           description=f"Disabled. {DISABLED_REASON}.")
        p.add_argument("rest", nargs=argparse.REMAINDER)
        p.set_defaults(func=cmd_disabled)

    p = sub.add_parser("runs", help="list runs in the audit database",
                       description="List every run with its status. Read-only.")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=cmd_runs)

    p = sub.add_parser("report", help="one run's report (text, JSON or HTML)",
                       description="Report RUN_ID (a unique prefix is enough): identity, image and result hashes, "
                                   "every unit's action and state, verify results, stages, errors. text and "
                                   "json print to stdout; html is one self-contained file with a sector map "
                                   "(use -o). Reads the audit database only; writes nothing but -o FILE.")
    p.add_argument("run_id")
    p.add_argument("--format", choices=("text", "json", "html"), default="text")
    p.add_argument("-o", "--output", type=Path, help="write the report to this file")
    p.set_defaults(func=cmd_report)

    a = sub.add_parser("audit", help="check or export the audit trail")
    asub = a.add_subparsers(dest="audit_command", required=True, metavar="AUDIT_COMMAND")
    p = asub.add_parser("verify", help="recompute the hash chain; name the first row that does not match",
                        description="Recompute the hash chain over every audit row. Exit 1 naming the first row "
                                    "that does not match. Read-only.")
    p.set_defaults(func=cmd_audit_verify)
    return asub


# -- board commands ------------------------------------------------------------------------------

def _specs(args: argparse.Namespace) -> list[BoardSpec]:
    try:
        specs = [parse_spec(s) for s in (args.boards or ["auto"])]
    except BoardSpecError as e:
        raise Refusal(str(e)) from None
    if len({str(s) for s in specs}) != len(specs):
        raise Refusal("the same board is named twice")
    for s in specs:
        if s.kind == "sim" and not (Path(s.selector) / "board.json").is_file():
            raise Refusal(f"{s.selector} is not an emulated board (create one with 'amdflash sim create')")
    if getattr(args, "unbind_driver", False):
        specs = [dataclasses.replace(s, unbind_driver=True) for s in specs]
    return specs


def _read_image(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise Refusal(f"cannot read image {path}: {e.strerror}") from None


def _engine(args: argparse.Namespace) -> jobs.EngineOptions:
    if not 0 <= args.prescale <= 15:
        raise Refusal("--prescale must be 0..15")
    return jobs.EngineOptions(args.prescale, args.rx_mode, args.restore_each)


def _open_writer(args: argparse.Namespace):  # noqa: ANN202
    path = db_path(args)
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise Refusal(f"audit database {path} is not writable: cannot create its directory "
                      f"({e.strerror})") from None
    try:
        return AuditWriter(path, key_path=host_key_path()).open()
    except StoreUnavailable as e:
        raise Refusal(str(e)) from None


def cmd_board(args: argparse.Namespace) -> int:
    """Every job that runs on boards: checks first, then one audited run per board."""
    specs = _specs(args)
    job = args.job
    image: bytes | None = None
    image_path: str | None = None
    arguments: dict[str, Any] = {}
    resume_of: dict[str, dict[str, Any]] = {}

    if job in ("flash", "ifwi-all") and not args.yes:
        raise Refusal(f"refusing to write without --yes ({job} writes the flash)")
    if job in ("verify", "flash", "ifwi-all"):
        image = _read_image(args.image)
        image_path = str(args.image.resolve())
        jobs.check_image(image, str(args.image), getattr(args, "force", False))
        if job == "ifwi-all":
            jobs.check_ifwi(image, str(args.image))
    if job == "flash":
        count = args.sector_count if args.sector_count is not None else SECTORS - args.start_sector
        if not 0 <= args.start_sector < SECTORS or not 1 <= count <= SECTORS - args.start_sector:
            raise Refusal(f"invalid sector range: start {args.start_sector}, count {count} "
                          f"(the flash has {SECTORS} sectors of 4 KiB)")
        arguments = {"image": image_path, "clear_cmp": args.clear_cmp, "start_sector": args.start_sector,
                     "sector_count": count, "force": args.force, "retries": args.retries,
                     "prescale": args.prescale, "rx_mode": args.rx_mode, "restore_each": args.restore_each}
    if job == "resume":
        if not args.yes:
            raise Refusal("refusing to write without --yes (resume writes the flash)")
        if len(specs) != 1 or specs[0].kind == "auto" and not args.run_id:
            raise Refusal("resume needs exactly one --board (and a RUN_ID unless the board is named)")
        resume_of[str(specs[0])], image, image_path = _resume_plan(args, specs[0])
    if job == "read" and (args.address < 0 or args.size <= 0 or args.address + args.size > FLASH_SIZE):
        raise Refusal(f"read {args.address:#x}+{args.size:#x} is outside the 2 MiB flash")
    if job == "dump" and args.output.is_dir():
        raise Refusal(f"{args.output} is a directory")

    writer = _open_writer(args)
    image_sha = hashlib.sha256(image).hexdigest() if image is not None else None
    backup_dir = Path(db_path(args)).parent / "backups"

    def make(spec: BoardSpec):  # noqa: ANN202
        info = RunInfo(new_run_id(), spec, job, arguments or _plain_args(args), image_sha,
                       operator_claimed=getattr(args, "operator", None))
        if job == "info":
            body = jobs.InfoJob(_engine(args))
        elif job == "read":
            body = jobs.ReadJob(_engine(args), args.address, args.size, args.output)
        elif job == "dump":
            body = jobs.DumpJob(_engine(args), args.output, args.via)
        elif job == "verify":
            body = jobs.VerifyJob(_engine(args), image)
        elif job == "flash":
            body = jobs.FlashJob(_engine(args), image, args.start_sector, arguments["sector_count"],
                                 args.clear_cmp, args.retries, backup_dir)
        elif job == "resume":
            plan = resume_of[str(spec)]
            info.resumes_run_id = plan["run_id"]
            info.arguments = {**plan["arguments"], "resumes": plan["run_id"]}
            a = plan["arguments"]
            engine = jobs.EngineOptions(a.get("prescale", 8), a.get("rx_mode", "primed"), a.get("restore_each", False))
            body = jobs.FlashJob(engine, image, a["start_sector"], a["sector_count"], a["clear_cmp"],
                                 a.get("retries", 2), backup_dir, frozenset(plan["verified"]), True,
                                 plan["identity"], plan["registers"])
        elif job == "probe":
            body = jobs.ProbeJob()
        elif job == "ifwi-all":
            body = jobs.IfwiAllJob(image)
        else:
            raise AssertionError(job)
        return body, info

    try:
        results = anyio.run(run_boards, make, specs, writer, not args.quiet, image_path)
    finally:
        writer.close()
    _print_results(results, len(specs) > 1)
    return exit_code(results)


def _plain_args(args: argparse.Namespace) -> dict[str, Any]:
    skip = {"func", "boards", "db", "log_json", "verbose", "quiet", "job", "operator"}
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k not in skip}


def _resume_plan(args: argparse.Namespace, spec: BoardSpec) -> tuple[dict[str, Any], bytes, str]:
    path = db_path(args)
    if not Path(path).exists():
        raise Refusal(f"no audit database at {path}: nothing to resume")
    db = open_for_reading(path)
    try:
        run_id = args.run_id
        if run_id:
            run_id = resolve_run(db, run_id)
        else:
            run_id = latest_unfinished(db, str(spec))
            if not run_id:
                raise Refusal(f"no unfinished flash run of {spec} to resume")
        rep = report(db, run_id)
        if rep["command"] not in ("flash", "resume"):
            raise Refusal(f"run {run_id} is a {rep['command']} run; only flash runs can be resumed")
        if rep["status"] == "succeeded":
            raise Refusal(f"run {run_id} already succeeded; nothing to resume")
        done = finished_by(db, run_id)
        if done:
            raise Refusal(f"run {run_id} was already completed by resume run {done}; nothing to resume")
        arguments = rep["arguments"]
        image_file = Path(args.image) if args.image else Path(arguments.get("image") or rep["image_path"] or "")
        image = _read_image(image_file)
        if hashlib.sha256(image).hexdigest() != rep["image_sha256"]:
            raise Refusal(f"image {image_file} is not the image of run {run_id} "
                          f"(sha256 {hashlib.sha256(image).hexdigest()[:16]}…, the run used {rep['image_sha256'][:16]}…)")
        lineage = _run_lineage(db, run_id)
        verified: set[int] = set()
        for rid in lineage:
            verified |= {a for a, u in unit_states(db, rid).items() if u["state"] == "verified"}
        identity = {}
        for rid in lineage:
            b = report(db, rid)["board"]
            if b["unique_id"]:
                identity = {"unique_id": b["unique_id"], "jedec_chip": b["chip"] or "",
                            "bridge_serial": b["bridge_serial"] or ""}
                break
        if identity and identity["unique_id"] in ("f" * 32, "0" * 32) and str(spec) != rep["board"]["spec"]:
            # An unprogrammed unique ID tells no two boards apart: then only the same spec will do.
            raise Refusal(f"the flash of run {run_id} has no usable unique ID ({identity['unique_id']}); "
                          f"resume it with the same --board {rep['board']['spec']}")
        if identity:
            later = writes_since(db, lineage[0], identity["unique_id"], lineage)
            if later:
                raise Refusal(f"run {later[0]['run_id']} ({later[0]['command']}) wrote this board after run "
                              f"{run_id} began; resuming would overwrite it — start a new flash instead")
        else:
            if any(has_intents(db, rid) for rid in lineage):
                raise Refusal(f"run {run_id} began writing but recorded no board identity; refusing to guess")
            if str(spec) != rep["board"]["spec"]:
                raise Refusal(f"run {run_id} died before identifying its board; resume it with the same "
                              f"--board {rep['board']['spec']}")
        # Registers as they were before the first run touched them: restored at the end.
        original = register_snapshot(db, lineage[0], "before")
    except RunNotFound as e:
        raise Refusal(str(e)) from None
    finally:
        db.conn.close()
    return ({"run_id": run_id, "arguments": arguments, "verified": verified, "identity": identity,
             "registers": original}, image, str(image_file.resolve()))


def _run_lineage(db, run_id: str) -> list[str]:  # noqa: ANN001
    from amdflash.store.queries import run_chain

    return run_chain(db, run_id)


def _print_results(results: list[RunResult], many: bool) -> None:
    for r in results:
        prefix = f"[{r.spec}] " if many else ""
        for line in r.output:
            print(prefix + line)
        if r.error:
            print(f"error: {prefix}{r.error}", file=sys.stderr)
    if many:
        print()
        print(f"{'board':40} {'status':12} {'run':26} error")
        for r in results:
            print(f"{r.spec[-40:]:40} {r.status:12} {r.run_id:26} {r.error or ''}")
    for r in results:
        if r.run_id:
            print(f"run {r.run_id}: {r.status}", file=sys.stderr)


def cmd_disabled(args: argparse.Namespace) -> int:
    raise Refusal(f"'{args.command}' is disabled: {DISABLED_REASON}")


def cmd_list(args: argparse.Namespace) -> int:
    from amdflash.stages.identify import probe_flash
    from amdflash.stages.transport import discovery

    boards = discovery.list_boards(probe=probe_flash)
    if args.format == "json":
        json.dump(boards, sys.stdout, indent=2)
        print()
    elif not boards:
        print("no boards found (no ASM24 USB bridge, no native Navi31 PCI device)")
    else:
        for b in boards:
            print("  ".join(f"{k}={v}" for k, v in b.items() if v is not None))
    return EXIT_OK


# -- audit commands ------------------------------------------------------------------------------

def _db_ro(args: argparse.Namespace):  # noqa: ANN202
    return open_for_reading(db_path(args))


def cmd_runs(args: argparse.Namespace) -> int:
    db = _db_ro(args)
    rows = runs(db)
    if args.format == "json":
        json.dump(rows, sys.stdout, indent=2)
        print()
        return EXIT_OK
    if not rows:
        print("no runs recorded")
    for r in rows:
        print(f"{r['run_id']:26} {r['command']:9} {r['status'] or '?':12} {r['started']:30} {r['board_spec']}")
    return EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    db = _db_ro(args)
    try:
        rep = report(db, args.run_id, getattr(args, "key", None))
    except RunNotFound as e:
        raise Refusal(str(e)) from None
    if args.format == "json":
        text = json.dumps(rep, indent=2, default=str)
    elif args.format == "html":
        from amdflash.store.html import render

        text = render(db, rep)
    else:
        text = render_text(rep)
    if args.output:
        args.output.write_text(text)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        print(text)
    return EXIT_OK


def render_text(rep: dict[str, Any]) -> str:
    b = rep["board"]
    counts: dict[str, int] = {}
    for u in rep["units"]:
        key = f"{u['action']}/{u['state']}"
        counts[key] = counts.get(key, 0) + 1
    badge = "  [EMULATED BOARD]" if rep.get("emulated") else ""
    claimed = f" (claims to be {rep['operator_claimed']})" if rep.get("operator_claimed") else ""
    lines = [
        f"run        {rep['run_id']}  ({rep['command']}, {rep['status']}){badge}",
        f"started    {rep['started']}   ended {rep['ended'] or '-'}   clock {rep.get('clock_sync') or 'unknown'}",
        f"operator   OS account {rep['operator']}{claimed} on {rep['host']} (machine-id {rep.get('machine_id') or '-'})",
        f"amdflash   {rep['tool_version']}{' ' + rep['tool_revision'] if rep.get('tool_revision') else ''}",
        f"board      {b['spec']}  chip {b['chip'] or '?'}  jedec {b['jedec'] or '?'}  uid {b['unique_id'] or '?'}"
        f"{'  bridge ' + b['bridge_serial'] if b['bridge_serial'] else ''}",
        f"image      {rep['image_path'] or '-'}  sha256 {rep['image_sha256'] or '-'}",
        f"result     sha256 {rep['result_sha256'] or '-'}",
        f"audit      {rep['register_writes']} register writes, {rep['spi_transactions']} SPI transactions, "
        f"{rep['verifies']['ok']}/{rep['verifies']['total']} verifies ok",
    ]
    if rep["resumes_run_id"]:
        lines.append(f"resumes    {rep['resumes_run_id']}")
    for r in rep.get("resumed_by") or []:
        lines.append(f"resumed by {r['run_id']} ({r['status']})")
    if counts:
        lines.append("units      " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    for f in rep["verifies"]["failed"][:5]:
        lines.append(f"mismatch   unit {f['address']:#08x} attempt {f['attempt']}: {f['mismatch_address']:#08x} "
                     f"flash={f['flash_byte']:02x} image={f['image_byte']:02x}")
    if rep["error"]:
        lines.append(f"error      {rep['error']}")
    c = rep.get("chain") or {}
    lines.append(f"chain      {'intact' if c.get('ok') else 'BROKEN: ' + str(c.get('problem'))}; checkpoint "
                 f"#{c.get('checkpoint')} ({c.get('sealed')}) head {c.get('head')}")
    lines.append(f"signature  {c.get('signature')}; signed by {c.get('signed_by')}")
    return "\n".join(lines)


def cmd_audit_verify(args: argparse.Namespace) -> int:
    from amdflash.pipeline.audit_commands import cmd_audit_verify as verify

    return verify(args)


__all__ = ["add_parsers", "EXIT_FAILED", "EXIT_REFUSED", "Callable"]
