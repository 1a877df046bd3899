"""Start-up (issue 29): `--version` and `--help` answer without importing any command module,
and a command imports only its own group's. Module counts here; the wall times are
tests/bench/bench_startup.py's."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from amdflash.pipeline.cli import main as cli_main
from amdflash.pipeline.cli.parsing import subparsers

# Run as the console script runs it (pipeline/launch.py), then list sys.modules at exit.
_LAUNCH = ("import atexit, json, sys\n"
           "atexit.register(lambda: print(json.dumps(sorted(sys.modules)), file=sys.__stderr__))\n"
           "sys.argv = ['amdflash', *sys.argv[1:]]\n"
           "from amdflash.pipeline.launch import run\n"
           "run()\n")
# Imported only by the commands that use them.
HEAVY = ("structlog", "rich", "cryptography", "sqlite_utils", "anyio", "amdflash.stages.sim")
# What the command line itself needs to parse (pipeline/cli/parsing.py, main.py, output.py).
CLI_CORE = {"amdflash.pipeline.cli", "amdflash.pipeline.cli.main", "amdflash.pipeline.cli.parsing",
            "amdflash.pipeline.cli.output"}


def _bare() -> set[str]:
    out = subprocess.run([sys.executable, "-c", "import json, sys; print(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True).stdout
    return set(json.loads(out)) - {"json", "json.decoder", "json.scanner", "json.encoder", "_json"}


def _imported(*argv: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    p = subprocess.run([sys.executable, "-c", _LAUNCH, *argv], capture_output=True, text=True, timeout=120)
    modules = set(json.loads(p.stderr.strip().splitlines()[-1]))
    # the atexit hook's own imports
    return p, modules - {"atexit", "json", "json.decoder", "json.scanner", "json.encoder", "_json"}


def _heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


@pytest.mark.parametrize("argv, most", [(["--version"], 40), (["--help"], 150), (["-q", "--version"], 40)])
def test_version_and_help_import_few_modules_and_no_command_module(argv, most):
    p, modules = _imported(*argv)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("amdflash " if "--version" in argv else "usage: amdflash")
    beyond = modules - _bare()
    assert len(beyond) <= most, sorted(beyond)
    assert _heavy(modules) == []
    commands = sorted(m for m in modules if m.startswith("amdflash.pipeline.cli.") and m not in CLI_CORE
                      or m.startswith(("amdflash.pipeline.commands", "amdflash.pipeline.fleet",
                                       "amdflash.pipeline.engine", "amdflash.store")))
    assert commands == []


def test_a_mistyped_command_is_answered_without_importing_any_command_module():
    p, modules = _imported("inof")
    assert p.returncode == 2
    assert "did you mean 'info'?" in p.stderr
    assert not any(m.startswith("amdflash.pipeline.commands") for m in modules)
    assert not [m for m in modules if m.startswith("amdflash.pipeline.cli.") and m not in CLI_CORE]


def test_a_command_imports_its_own_group_only():
    p, modules = _imported("image", "--help")
    assert p.returncode == 0, p.stderr
    assert "amdflash.pipeline.cli.image" in modules
    others = {"amdflash.pipeline.cli." + m for m in ("board", "trail", "audit", "review", "replay", "sim", "fleet",
                                                     "central", "restore", "extras")}
    assert sorted(others & modules) == []
    assert _heavy(modules) == []


def test_structlog_is_imported_by_a_command_only_when_it_logs(tmp_path):
    p, modules = _imported("udev-rules")
    assert p.returncode == 0 and "amdflash" in p.stdout
    assert not [m for m in modules if m.split(".")[0] in ("structlog", "rich")]
    # its refusal is a message: structlog configured then, the line as ever
    p, modules = _imported("--log-json", "udev-rules", "--install", "--dir", str(tmp_path / "none"))
    assert p.returncode == 2
    event = json.loads(p.stderr.splitlines()[0])
    assert (event["level"], event["event"]) == ("error", f"{tmp_path / 'none'} is not a directory (is udev installed?)")
    assert "structlog" in modules


def _listed(parser) -> dict[str, str | None]:
    """The commands a parser's --help lists, with their one-line help."""
    action = parser._subparsers._group_actions[0]
    return {a.dest: a.help for a in action._choices_actions}


def test_the_table_lists_every_command_with_the_help_its_module_gives():
    whole = cli_main.build_parser()
    assert _listed(whole) == {name: one_line for name, (one_line, _) in cli_main.COMMANDS.items()}
    assert cli_main.build_parser(commands=[]).format_help() == whole.format_help()


@pytest.mark.parametrize("name", sorted(cli_main.COMMANDS))
def test_each_module_registers_exactly_the_commands_the_table_names_for_it(name):
    where = cli_main.COMMANDS[name][1]
    parser = cli_main.build_parser(commands=[name])
    choices = parser._subparsers._group_actions[0].choices
    real = {n for n, p in choices.items() if p._subparsers is not None or len(p._actions) > 1}
    assert real == {n for n, (_, w) in cli_main.COMMANDS.items() if w == where}
    # the registered command is the whole parser's, down to its subcommands and their help
    whole = cli_main.build_parser()
    wanted = [p.format_help() for p in subparsers(whole) if p.prog.split()[1] == name]
    assert [p.format_help() for p in subparsers(parser) if p.prog.split()[1] == name] == wanted


def test_every_audit_subcommand_is_registered_by_the_audit_module_alone():
    import argparse

    sub = cli_main.Parser(prog="amdflash").add_subparsers(dest="command")
    from amdflash.pipeline.cli import audit

    audit.add_parsers(sub)
    audit_sub = next(a for a in sub.choices["audit"]._actions if isinstance(a, argparse._SubParsersAction))
    assert list(audit_sub.choices) == ["verify", "export", "datasette-metadata", "key", "receipt", "log", "archive",
                                   "upgrade", "push",
                                   "witness", "bundle"]
    verify = {o for a in audit_sub.choices["verify"]._actions for o in a.option_strings}
    assert {"--export", "--run", "--key", "--anchor", "--central"} <= verify


@pytest.mark.parametrize("argv", [["--db", "x.sqlite", "-q", "runs"], ["runs", "--db", "x.sqlite", "-q"],
                                  ["-q", "runs", "--db", "x.sqlite"], ["--db=x.sqlite", "runs", "--quiet"]])
def test_global_options_work_before_and_after_the_command(argv):
    args = cli_main.parse(argv)
    assert (args.command, args.db, args.quiet, args.verbose) == ("runs", "x.sqlite", True, 0)
    assert args.func.__module__ == "amdflash.pipeline.cli.trail"


@pytest.mark.wall_clock
def test_version_and_help_start_within_their_multiple_of_a_bare_interpreter():
    """Median of 9, side by side with `python -c pass`: --version <= 5x, --help <= 10x."""
    import statistics
    import time

    def wall(argv: list[str]) -> float:
        start = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, timeout=120)
        return time.perf_counter() - start

    times: dict[str, list[float]] = {"pass": [], "--version": [], "--help": []}
    for _ in range(9):
        times["pass"].append(wall([sys.executable, "-c", "pass"]))
        for option in ("--version", "--help"):
            times[option].append(wall([sys.executable, "-m", "amdflash", option]))
    bare = statistics.median(times["pass"])
    assert statistics.median(times["--version"]) <= 5 * bare, times
    assert statistics.median(times["--help"]) <= 10 * bare, times


def test_a_command_off_a_terminal_logs_without_rich(tmp_path):
    """rich draws the live progress table on a terminal; structlog would take it too for renderers
    amdflash never uses (logsetup.load_structlog): `info` off a terminal logs, and loads no rich."""
    from amdflash.stages.sim import create_board

    board = create_board(tmp_path / "board", seed=3)
    p, modules = _imported("info", "--board", f"sim:{board}", "--db", str(tmp_path / "audit.sqlite"))
    assert p.returncode == 0, p.stderr
    assert "structlog" in modules and "succeeded" in p.stderr        # it logged, through structlog
    assert not [m for m in modules if m.split(".")[0] == "rich"]
