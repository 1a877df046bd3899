"""`amdflash restore`: put back the registers an earlier run left changed on a board — and
nothing else.

Every run does this first anyway (pipeline.settle); this command does only that, for a
board that should be left as it was found without running a job on it.
"""
from __future__ import annotations

import argparse
from typing import Any

import anyio

from amdflash.pipeline.runner import RunInfo, exit_code, new_run_id, run_boards
from amdflash.stages.device import Device


class RestoreJob:
    """The job body: the work was done before it (pipeline.settle); it only reports."""

    async def __call__(self, dev: Device, info: RunInfo) -> dict[str, Any]:
        stranded = dev.extra.get("stranded")
        if stranded is None:
            info.output.append("no earlier run left this board's registers changed: nothing to put back")
        return {"put_back_for": stranded.run_id if stranded else None}


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "restore", help="put back registers an interrupted run left changed",
        description="Put back the registers (ROM_SW engine pads, page mirror, ROM_CNTL, aperture index) that an "
                    "earlier run on this board left changed because its host was killed or its link was lost: "
                    "the values that run recorded before it changed anything. Matched by bridge (or emulated "
                    "board) serial, else PCI address. Every other command does this first anyway; this one does "
                    "only that. Nothing is written when the registers already hold those values or were set up "
                    "by something else since. Recorded in the audit trail.")
    p.add_argument("--board", action="append", metavar="SPEC", dest="boards",
                   help="board(s) to put back (default auto; same specs as every board command)")
    p.set_defaults(func=cmd_restore)


def cmd_restore(args: argparse.Namespace) -> int:
    from amdflash.pipeline import commands

    specs = commands._specs(args)
    writer = commands._open_writer(args)

    def make(spec):  # noqa: ANN001, ANN202
        return RestoreJob(), RunInfo(new_run_id(), spec, "restore", {})

    try:
        results = anyio.run(run_boards, make, specs, writer, not args.quiet, None)
    finally:
        writer.close()
    commands._print_results(results, len(specs) > 1)
    return exit_code(results)
