"""The amdflash command line (DESIGN.md "Command line" is the contract)."""
from __future__ import annotations

import argparse
import sys

from amdflash.pipeline import audit_commands, commands, replay_command, review_commands, sim_commands
from amdflash.pipeline.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_REFUSED, Refusal


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="amdflash",
        description="Dump, verify and recover the SPI flash of AMD Navi31 boards (RX 7900 XT/XTX) over "
                    "the ASM24 USB bridge or native PCIe. Every register write and verify result is "
                    "recorded in an append-only SQLite audit trail.")
    p.add_argument("--db", metavar="PATH", help="audit database (default $AMDFLASH_DB, else "
                   "~/.local/share/amdflash/audit.sqlite)")
    p.add_argument("--operator", metavar="NAME", help="who says they run this; recorded as claimed, beside the "
                   "OS account the run is recorded under")
    p.add_argument("--log-json", action="store_true", help="log events as JSON lines on stderr")
    verbosity = p.add_mutually_exclusive_group()
    verbosity.add_argument("-v", "--verbose", action="store_true", help="more log output")
    verbosity.add_argument("-q", "--quiet", action="store_true", help="errors only")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    audit_sub = commands.add_parsers(sub)
    replay_command.add_parsers(sub, audit_sub)
    review_commands.add_parsers(sub, audit_sub)
    audit_commands.add_parsers(sub, audit_sub)
    sim_commands.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # argparse will not take positionals after an option once it has matched them
    # ("sim fault PATH --clear SPEC"); commands that list SPECs say where extras belong.
    args, extra = parser.parse_known_args(argv)
    trailing = getattr(args, "trailing_positionals", None)
    if extra and trailing and not any(e.startswith("-") for e in extra):
        setattr(args, trailing, [*getattr(args, trailing), *extra])
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    from amdflash.pipeline.logsetup import configure

    configure(json_lines=args.log_json, verbose=args.verbose, quiet=args.quiet)
    try:
        return int(args.func(args) or 0)
    except Refusal as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_REFUSED
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (OSError, RuntimeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
