"""`amdflash replay`: re-apply a run's recorded register writes to an emulated board. (Being written.)"""
from __future__ import annotations

import argparse


def add_parsers(sub: argparse._SubParsersAction, audit_sub: argparse._SubParsersAction) -> None:
    pass
