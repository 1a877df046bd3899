"""`amdflash restore`: put back the registers an earlier run left changed on a board — and
nothing else (commands.restore; every other command does this first anyway)."""
from __future__ import annotations

import argparse

from amdflash.pipeline.cli import board as board_cli
from amdflash.pipeline.commands import board as commands


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "restore", help="put back registers an interrupted run left changed",
        description="Put back the registers (ROM_SW engine pads, page mirror, ROM_CNTL, aperture index) that an "
                    "earlier run on this board left changed because its host was killed or its link was lost: "
                    "the values that run recorded before it changed anything. Matched by bridge (or emulated "
                    "board) serial, else PCI address. Every other command does this first anyway; this one does "
                    "only that. Nothing is written when the registers already hold those values or were set up "
                    "by something else since. Recorded in the audit trail.")
    board_cli.board_options(p)
    p.set_defaults(func=cmd_restore)


def cmd_restore(args: argparse.Namespace) -> int:
    return board_cli.show(args, commands.restore(board_cli.session(args)))
