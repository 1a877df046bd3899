"""The amdflash command line: parse, configure output, call a command, map the outcome to an
exit status.

Every command group registers itself through its module's `add_parsers(sub)`; `COMMANDS`
names that module for each command, with the command's one-line help, so that `--help`,
`--version` and a mistyped command are answered without importing any command module, and a
command imports only its own group's. Global options (--db, --config, -v/-q, --log-json,
--no-progress) are accepted before or after the command. Whatever a user types ends in an
exit status (0, 1, 2 or 130) and, on an error, one `error: …` line on stderr: never a
traceback (-v adds one for internal errors).
"""
from __future__ import annotations

import argparse
import re
import signal
import os
import sys
from typing import Any, NoReturn
from collections.abc import Callable, Collection, Sequence

from amdflash.pipeline.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_REFUSED, Refusal, UsageError
from amdflash.pipeline.cli.parsing import subparsers

PROG = "amdflash"

_BOARD = "amdflash.pipeline.cli.board:add_parsers"
_DISABLED = "disabled: failed validation on a stock board"
# Every top-level command, in --help's order: its one-line help (what --help lists, without
# importing its module) and the function that registers its parser, "module:function". A
# module that registers several commands is named for each of them; it must register exactly
# those (tests/pipeline/cli/test_startup.py compares this table with the whole parser).
COMMANDS: dict[str, tuple[str, str]] = {
    "list": ("boards found, with their spec and identity", _BOARD),
    "info": ("JEDEC, SR1/SR2/SR3, CMP, protection, SFDP, unique ID", _BOARD),
    "read": ("read a flash range (hex to stdout unless -o)", _BOARD),
    "dump": ("dump the whole 2 MiB flash to a file", _BOARD),
    "verify": ("compare the whole flash with an image", _BOARD),
    "flash": ("write an image: backup, plan, erase, program, verify", _BOARD),
    "restore-original": ("write back the content amdflash first found on a board", _BOARD),
    "resume": ("finish an interrupted flash run", _BOARD),
    "probe": ("PSP boot mailbox state (boot partition, FB state, model id, transfer type)", _BOARD),
    "ifwi-all": ("stream the IFWI items the PSP bootloader requests", _BOARD),
    "stream": (_DISABLED, _BOARD),
    "ifwi-step": (_DISABLED, _BOARD),
    "live-flash": (_DISABLED, _BOARD),
    "hardware-report": ("measure a board and write the JSON report to send when it behaves unexpectedly",
                        "amdflash.pipeline.cli.hardware_report:add_parsers"),
    "runs": ("list runs in the audit database", "amdflash.pipeline.cli.trail:add_parsers"),
    "report": ("one run's report (text, JSON or HTML)", "amdflash.pipeline.cli.trail:add_parsers"),
    "audit": ("check or export the audit trail", "amdflash.pipeline.cli.audit:add_parsers"),
    "replay": ("re-apply a run's register writes to an emulated board from its backup; show where hardware "
               "and replay diverge", "amdflash.pipeline.cli.replay:add_parsers"),
    "demo": ("a full recovery on an emulated board, no hardware needed", "amdflash.pipeline.cli.review:add_parsers"),
    "sim": ("emulated boards: create, export, counters, synthetic images", "amdflash.pipeline.cli.sim:add_parser"),
    "image": ("inspect an IFWI image file (no board needed)", "amdflash.pipeline.cli.image:add_parsers"),
    "fleet": ("a line of boards on many hosts, through labgrid", "amdflash.pipeline.cli.fleet:add_parsers"),
    "restore": ("put back registers an interrupted run left changed", "amdflash.pipeline.cli.restore:add_parsers"),
    "udev-rules": ("print (or install) the udev rules for the USB bridge", "amdflash.pipeline.cli.extras:add_parsers"),
    "completion": ("print the shell completion script (bash, zsh or fish)",
                   "amdflash.pipeline.cli.extras:add_parsers"),
    "man": ("print the manual page (roff), generated from the command line itself",
            "amdflash.pipeline.cli.extras:add_parsers"),
}


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is a one-line UsageError with a suggestion for a typo."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)   # a flashing tool does not guess what --f meant
        super().__init__(*args, **kwargs)

    def _get_formatter(self) -> argparse.HelpFormatter:
        # argparse asks for a formatter on every add_argument; its default width comes from
        # shutil, whose import brings zlib, bz2 and lzma to `amdflash --version`. The same
        # width, asked of os directly (shutil.get_terminal_size's rule: $COLUMNS, the
        # terminal, else 80).
        # Every formatter class used here is a HelpFormatter, which takes width (typeshed's
        # _FormatterClass protocol names only prog).
        formatter: Callable[..., argparse.HelpFormatter] = self.formatter_class
        return formatter(prog=self.prog, width=_columns() - 2)

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self._suggest(message)} (see '{self.prog} --help')")

    def _suggest(self, message: str) -> str:
        import difflib

        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice:
            typed, offered = choice.group(1), re.findall(r"'([^']*)'", choice.group(2))
            what = "command" if message.startswith("argument COMMAND") or "_COMMAND" in message else "value"
            near = difflib.get_close_matches(typed, offered, n=1, cutoff=0.5)
            head = message.split(":")[0] + ": " if what == "value" else ""
            hint = f"; did you mean '{near[0]}'?" if near else f"; one of {', '.join(offered)}"
            return f"{head}unknown {what} '{typed}'{hint}"
        unknown = re.match(r"unrecognized arguments: (.*)", message)
        if unknown:
            options = [o for a in self._actions for o in a.option_strings]
            for token in unknown.group(1).split():
                near = difflib.get_close_matches(token.split("=")[0], options, n=1, cutoff=0.6)
                if token.startswith("-") and near:
                    return f"unknown option '{token}'; did you mean '{near[0]}'?"
        return message


def _columns() -> int:
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        stdout = sys.__stdout__   # None when Python started without one
        try:
            columns = os.get_terminal_size(stdout.fileno()).columns if stdout else 0
        except (ValueError, OSError):
            columns = 0
    return columns if columns > 0 else 80


class _Count(argparse.Action):
    """-v, counted over every level of the command line (before and after the command)."""

    def __init__(self, option_strings: Sequence[str], dest: str, counter: list[int], **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)
        self.counter = counter

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        self.counter[0] += 1


class _Version(argparse._VersionAction):
    """--version, the version looked up only when it is asked for (the lookup reads the
    installed metadata: not for every command line)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        from amdflash import __version__

        # What argparse's own action prints, without its help formatter (which imports shutil,
        # and shutil zlib, bz2 and lzma).
        parser._print_message(f"{PROG} {__version__}\n", sys.stdout)
        parser.exit()


def _add_globals(p: argparse.ArgumentParser, counter: list[int], root: bool) -> None:
    # Below the root the defaults are SUPPRESS, so an option not given there keeps the value
    # given (or defaulted) at the root.
    d = (lambda value: value) if root else (lambda value: argparse.SUPPRESS)
    g = p.add_argument_group("global options")
    g.add_argument("--db", metavar="PATH", default=d(None),
                   help="audit database (default $AMDFLASH_DB, else 'db' in the config file, else "
                        "$XDG_DATA_HOME/amdflash/audit.sqlite)")
    g.add_argument("--operator", metavar="NAME", default=d(None),
                   help="who says they run this; recorded as claimed, beside the OS account the run is recorded under")
    g.add_argument("--config", metavar="FILE", default=d(None),
                   help="config file (default $AMDFLASH_CONFIG, else $XDG_CONFIG_HOME/amdflash/config.toml)")
    g.add_argument("--log-json", action="store_true", default=d(False),
                   help="stderr as JSON lines only: messages, progress (numeric done/total) and errors")
    g.add_argument("-v", "--verbose", action=_Count, counter=counter,
                   help="debug events of every layer; -vv adds every ROM_SW transaction and register write")
    g.add_argument("-q", "--quiet", action="store_true", default=d(False),
                   help="nothing on success but the results asked for; errors only on stderr")
    g.add_argument("--no-progress", action="store_true", default=d(False), help="no progress display")
    g.add_argument("--version", action=_Version, help="print the version and exit")


def _root(counter: list[int]) -> Parser:
    p = Parser(prog=PROG, description="Dump, verify and recover the SPI flash of AMD Navi31 boards (RX 7900 "
                                      "XT/XTX) over the ASM24 USB bridge or native PCIe. Every register write and "
                                      "verify result is recorded in an append-only SQLite audit trail.",
               epilog="Exit status: 0 success; 2 usage error or refusal before anything was written (no such "
                      "board, busy board, bad image, unusable audit database); 1 a failure during an "
                      "operation; 130 interrupted.")
    _add_globals(p, counter, root=True)
    return p


def build_parser(globals_everywhere: bool = True, commands: Collection[str] | None = None) -> Parser:
    """The whole command line. `globals_everywhere`: accept the global options after the
    command too (the CLI); the manual page lists them once instead. `commands`: register
    only the parsers of these commands' modules (the others stand in, with their help line
    and nothing else, so that --help and a mistyped command read the same); None: every one."""
    import importlib

    counter = [0]
    p = _root(counter)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    wanted = None if commands is None else {COMMANDS[c][1] for c in commands}
    registered: set[str] = set()
    stand_ins: list[argparse.ArgumentParser] = []
    for name, (one_line, where) in COMMANDS.items():
        if wanted is not None and where not in wanted:
            stand_ins.append(sub.add_parser(name, help=one_line))
        elif where not in registered:
            registered.add(where)
            module, function = where.split(":")
            getattr(importlib.import_module(module), function)(sub)
    for child in subparsers(p) if globals_everywhere else ():
        if not any(child is s for s in stand_ins):
            _add_globals(child, counter, root=False)
    p.set_defaults(verbosity_counter=counter)
    return p


def _command_typed(argv: Sequence[str]) -> list[str] | None:
    """The command `argv` names, [] for none (--help, --version, a misspelt command), or None
    when only the whole parser can tell: an option before the command that is not a global
    one (misplaced or misspelt: said with the whole command line's options), a `--`, or a
    shell asking for completions."""
    import os

    if "_ARGCOMPLETE" in os.environ:
        return None
    root = _root([0])
    known = {o for a in root._actions for o in a.option_strings}
    for at, token in enumerate(argv):
        if token == "--":
            return None
        if _is_command_slot(root, list(argv), at):
            return [token] if token in COMMANDS else []
        if token.startswith("-") and token.split("=", 1)[0] not in known:
            return None
    return []


def _early_flags(argv: Sequence[str]) -> tuple[bool, int]:
    """--log-json and -q/-v as typed, for errors raised before parsing has finished."""
    head = list(argv[:list(argv).index("--")] if "--" in argv else argv)
    verbosity = -1 if ("-q" in head or "--quiet" in head) else 0
    return "--log-json" in head, verbosity


def parse(argv: Sequence[str]) -> argparse.Namespace:
    argv = list(argv)
    typed = _command_typed(argv)
    parser = build_parser(commands=typed)
    if typed is None:
        if "_ARGCOMPLETE" in __import__("os").environ:   # a shell asking for completions
            import argcomplete

            argcomplete.autocomplete(parser)
        misplaced = _misplaced_option(parser, argv)
        if misplaced:
            raise UsageError(f"{misplaced} goes after the command, e.g. 'amdflash info {misplaced} …' "
                             f"(see '{PROG} --help')")
        unknown = _unknown_before_command(parser, argv)
        if unknown:
            parser.error(unknown)
    # argparse will not take positionals after an option once it has matched them
    # ("sim fault PATH --clear SPEC"); commands that list SPECs say where extras belong.
    args, extra = parser.parse_known_args(argv)
    trailing = getattr(args, "trailing_positionals", None)
    if extra and trailing and not any(e.startswith("-") for e in extra):
        setattr(args, trailing, [*getattr(args, trailing), *extra])
    elif extra:
        leaf = _leaf(parser, args)
        leaf.error(f"unrecognized arguments: {' '.join(extra)}")
    args.verbose = args.verbosity_counter[0]
    if args.verbose and args.quiet:
        parser.error("-v and -q contradict each other")
    args.root_parser = parser
    return args


def _misplaced_option(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """An option of the commands (`--board`, `--json`, …) typed before any command: argparse
    would take its value for the command ("unknown command 'sim:b1'")."""
    root = {o for a in parser._actions for o in a.option_strings}
    commands: set[str] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            commands = set(action.choices)
    for at, token in enumerate(argv):
        if token in commands or token == "--" or _is_command_slot(parser, argv, at):
            return None     # the command (or a misspelling of it, which argparse names first)
        name = token.split("=", 1)[0]
        if name.startswith("--") and name not in root and any(
                name in a.option_strings for sub in subparsers(parser) for a in sub._actions):
            return name
    return None


def _is_command_slot(parser: argparse.ArgumentParser, argv: list[str], at: int) -> bool:
    """argv[at] stands where the command goes: not an option, nor the value of a root option."""
    if argv[at].startswith("-"):
        return False
    before = argv[at - 1] if at else ""
    takes_value = {o for a in parser._actions if a.nargs is None and a.option_strings for o in a.option_strings}
    return before not in takes_value


def _unknown_before_command(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """An option no command knows, typed before the command (`--versoin`): argparse would first
    complain that the command is missing; the misspelling is what to fix."""
    known = {o for p in (parser, *subparsers(parser)) for a in p._actions for o in a.option_strings}
    for at, token in enumerate(argv):
        if token == "--" or _is_command_slot(parser, argv, at):
            return None
        name = token.split("=", 1)[0]
        if name.startswith("-") and name not in known:
            return f"unrecognized arguments: {token}"
    return None


def _leaf(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the (sub)command that was chosen, for its error messages."""
    current = parser
    while True:
        chosen = None
        for action in current._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = action.choices.get(getattr(args, action.dest, None) or "")
        if chosen is None:
            return current
        current = chosen


def _configure(args: argparse.Namespace) -> None:
    import os

    from amdflash.pipeline import config
    from amdflash.pipeline.logsetup import QUIET, apply, configure

    configure(json_lines=args.log_json, verbosity=QUIET if args.quiet else args.verbose)
    apply(lazily=True)   # a command about to run: logging set up (structlog when it first logs)
    config.choose(args.config)
    args.settings = config.load()   # a malformed config file is a usage error, whatever the command
    if args.db:
        # Resolved once, here (config.real_db): every use below names the same real file, and a
        # name that is not UTF-8 or a link to nothing is refused before anything is created.
        args.db = config.real_db(args.db)
    if args.db and os.path.exists(args.db) and not os.path.isfile(args.db):
        # Whatever command reads it: SQLite would block on a FIFO and fail obscurely on a device.
        raise UsageError(f"--db {args.db} is not a regular file")


def _own_places(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """The audit database this command line uses unless it is the default one, and its config
    file if it reads one: named by every command it suggests, so that pasted into any shell
    (without this one's $AMDFLASH_DB or $AMDFLASH_CONFIG, from another directory) the command
    reaches the same trail with the same settings."""
    from amdflash.pipeline import config

    try:
        chosen: str | None = config.audit_db(args.db, args.settings)   # its real path, however it was named
        if chosen == os.path.realpath(config.data_dir() / "audit.sqlite"):
            chosen = None
    except UsageError:     # a bad name: refused by the command that uses it, not by one that does not
        chosen = args.db or os.environ.get(config.ENV_DB) or args.settings.get("db")
    read = str(config.config_path())      # --config, else $AMDFLASH_CONFIG, else the default place
    return chosen, (read if os.path.isfile(read) else None)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command line; returns the exit status (never raises, never prints a traceback)."""
    own_line = argv is None       # the process's own command line: it ends after this one
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        from amdflash.pipeline.cli import output

        output.reset()
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    json_lines, verbosity = _early_flags(argv)
    try:
        if getattr(signal.getsignal(signal.SIGINT), "__module__", "") == "amdflash.pipeline.launch":
            signal.signal(signal.SIGINT, signal.default_int_handler)   # from here on: KeyboardInterrupt
        from amdflash.pipeline.logsetup import configure

        configure(json_lines=json_lines, verbosity=verbosity)
        args = parse(argv)
        from amdflash.pipeline.engine import next_step

        _configure(args)
        # Every command this command line suggests names its places; passed down as a value
        # (a command line run inside another, as the demo does, has its own).
        args.advice = next_step.Advice(*_own_places(args))
        args.main = main   # for a command that runs others (the demo): no import back up to here
        args.build_parser = build_parser   # for the manual page, likewise
        from amdflash.pipeline.engine.interrupts import command_line

        with command_line(ends_process=own_line):
            return int(args.func(args) or 0)
    except SystemExit as e:          # --help, --version: argparse has printed what was asked
        return e.code if isinstance(e.code, int) else EXIT_OK
    except KeyboardInterrupt:
        _say_interrupted(json_lines)
        return EXIT_INTERRUPTED
    except BrokenPipeError:          # stdout closed by its reader: nothing more to say
        output._stdout_gone()
        return EXIT_OK
    except BaseException as raised:
        return _report(raised)
    finally:
        from amdflash.pipeline import config

        config.choose(None)   # --config held for this command line only


def _say_interrupted(json_lines: bool) -> None:
    """'interrupted', however far the imports got. A Ctrl-C that lands while a module is being
    imported (structlog is imported lazily, at the first message) can leave that module half
    made, so that importing it again to say so fails; then the line is written as the console
    script writes it before anything is imported."""
    from amdflash.pipeline.cli import output

    try:
        output.error("interrupted")
    except Exception:
        os.write(2, b'{"event": "interrupted", "level": "error"}\n' if json_lines else b"error: interrupted\n")


def _report(raised: BaseException) -> int:
    from amdflash.pipeline.cli import output
    from amdflash.pipeline.errors import leaves, one_line
    from amdflash.pipeline.logsetup import logger

    causes = [e for e in leaves(raised) if not isinstance(e, GeneratorExit)]
    if any(isinstance(e, KeyboardInterrupt) for leaf in causes for e in _chain(leaf)):
        # Also a Ctrl-C that Python wrapped while it ran (an import building a class wraps it
        # in "Error calling __set_name__"): the user interrupted, nothing failed.
        _say_interrupted("--log-json" in sys.argv)
        return EXIT_INTERRUPTED
    refusals = [e for e in causes if isinstance(e, Refusal)]
    if refusals:
        output.error(one_line(refusals[0]))
        return EXIT_REFUSED
    first = causes[0] if causes else raised
    import sqlite3

    if isinstance(first, (OSError, RuntimeError, ValueError, TimeoutError, sqlite3.Error)):
        output.error(one_line(first))
    else:
        output.error(f"internal error {type(first).__name__}: {one_line(first)} (-v shows where)")
    logger().debug("traceback", exc_info=first)
    return EXIT_FAILED


def _chain(e: BaseException) -> list[BaseException]:
    """`e` and the exceptions it was raised from or while handling."""
    seen: list[BaseException] = []
    while e is not None and not any(e is s for s in seen):
        seen.append(e)
        e = e.__cause__ or e.__context__  # type: ignore[assignment]
    return seen


def entry() -> None:
    """The `amdflash` console script: main(), and a Ctrl-C after it has finished changes nothing."""
    try:
        code = main()
    except KeyboardInterrupt:   # past main's own handlers (it landed while an outcome was printed)
        code = EXIT_INTERRUPTED
        _say_interrupted("--log-json" in sys.argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):
        pass
    sys.exit(code)


if __name__ == "__main__":
    entry()
