"""Walking an argparse command line (the CLI, its manual page and its completion share it)."""
from __future__ import annotations

import argparse


def subparsers(p: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every (sub)command parser below `p`, depth first, each once."""
    found = []
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                found += [child, *subparsers(child)]
    return found
