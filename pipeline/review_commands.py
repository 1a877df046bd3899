"""Commands for reviewers and first-time users: demo, audit export. (Being written.)"""
from __future__ import annotations

import argparse


def add_parsers(sub: argparse._SubParsersAction, audit_sub: argparse._SubParsersAction) -> None:
    pass
