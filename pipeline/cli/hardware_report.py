"""`amdflash hardware-report` on the command line: its arguments, the checks of them, the run.

What the report measures and holds is the command's (pipeline/commands/hardware_report.py).
"""
from __future__ import annotations

import argparse


def add_parsers(sub: argparse._SubParsersAction) -> None:
    from amdflash.pipeline.cli.board import board_options, engine_options, number
    from amdflash.pipeline.commands import hardware_report
    from amdflash.pipeline.commands.checks import output_option

    doc = hardware_report.__doc__
    p = sub.add_parser(
        "hardware-report", help="measure a board and write the JSON report to send when it behaves unexpectedly",
        description=doc.split("\n\n", 1)[1].replace("\n", " ") if doc else None)
    board_options(p, json_output=False)
    engine_options(p)
    output_option(p, "write the report to FILE (default: stdout)")
    p.add_argument("--include-ids", action="store_true",
                   help="put the flash unique ID and the bridge/board serial in the report as they are "
                        "(default: their SHA-256)")
    p.add_argument("--scratch-sector", type=number, metavar="N",
                   help="also time erases and page programs on the 64 KiB block holding 4 KiB sector N "
                        "(backed up beside -o FILE first, restored and read back); needs -o and --yes")
    p.add_argument("--samples", type=number, default=16, metavar="N", help="timings per transfer kind (2..256)")
    p.add_argument("--yes", action="store_true", help="allow --scratch-sector to erase and reprogram its block")
    p.set_defaults(func=cmd_hardware_report)


def cmd_hardware_report(args: argparse.Namespace) -> int:
    from amdflash.pipeline.cli import board as board_cli
    from amdflash.pipeline.commands import board as commands
    from amdflash.pipeline.commands.checks import writable_output
    from amdflash.pipeline.commands.hardware_report import HardwareReportJob
    from amdflash.pipeline.commands.results import RunOutcome
    from amdflash.pipeline.errors import Refusal

    session = board_cli.session(args)
    if len(session.boards) != 1:
        raise Refusal("hardware-report takes one --board at a time")
    if not 2 <= args.samples <= 256:
        raise Refusal(f"--samples {args.samples}: 2..256")
    if args.scratch_sector is not None:
        if not 0 <= args.scratch_sector < 0x200:
            raise Refusal(f"--scratch-sector {args.scratch_sector}: a 4 KiB sector number 0..511")
        if args.output is None:
            raise Refusal("--scratch-sector needs -o FILE: the block's backup is written beside it")
        if not args.yes:
            raise Refusal("refusing to erase the scratch block without --yes (hardware-report --scratch-sector)")
    if args.output is not None:
        writable_output(args.output, "report", args.overwrite)
    engine = board_cli.engine(args)
    job = HardwareReportJob(engine, args.output, args.include_ids, args.scratch_sector, args.samples,
                            args.overwrite)
    arguments = {**commands._engine_args(engine), "scratch_sector": args.scratch_sector, "samples": args.samples}
    results = commands._run(session, session.specs(), "hardware-report", arguments, lambda s, i: job, RunOutcome)
    args.json = False
    return board_cli.show(args, results)
