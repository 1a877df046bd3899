"""What users of flashrom, esptool and fwupdmgr expect around the tool: udev rules, shell
completion and a man page, all from what ships in the package and the parser itself."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from amdflash.pipeline.cli import output
from amdflash.pipeline.commands.checks import output_option, write_output
from amdflash.pipeline.errors import EXIT_OK, Refusal
from amdflash.stages.files import write_new

UDEV_RULES_FILE = "70-amdflash.rules"
UDEV_DIR = Path("/etc/udev/rules.d")
SHELLS = ("bash", "zsh", "fish")


def udev_rules() -> str:
    """The udev rules file shipped in the package."""
    import amdflash

    return (Path(amdflash.__file__).with_name(UDEV_RULES_FILE)).read_text(encoding="utf-8")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("udev-rules", help="print (or install) the udev rules for the USB bridge",
                       description="Print the udev rules that let the logged-in user open the ASM24 USB bridge "
                                   "(add1:0001, 3801:0001) without root; --install writes them to "
                                   f"{UDEV_DIR / UDEV_RULES_FILE} (needs root). Reload afterwards: "
                                   "udevadm control --reload && udevadm trigger.")
    p.add_argument("--install", action="store_true", help=f"write the rules to DIR/{UDEV_RULES_FILE}")
    p.add_argument("--dir", type=Path, default=UDEV_DIR, metavar="DIR",
                   help=f"the rules directory for --install (default {UDEV_DIR})")
    p.set_defaults(func=cmd_udev_rules)

    p = sub.add_parser("completion", help="print the shell completion script (bash, zsh or fish)",
                       description="Print a completion script for SHELL. bash: eval \"$(amdflash completion "
                                   "bash)\" in ~/.bashrc; zsh: the same in ~/.zshrc; fish: amdflash completion "
                                   "fish > ~/.config/fish/completions/amdflash.fish")
    p.add_argument("shell", choices=SHELLS, metavar="SHELL", help="bash, zsh or fish")
    p.set_defaults(func=cmd_completion)

    p = sub.add_parser("man", help="print the manual page (roff), generated from the command line itself",
                       description="Print amdflash(1) in roff, generated from the argument parser, so it never "
                                   "disagrees with --help. View it with: amdflash man | man -l -")
    output_option(p, "write the page to FILE (e.g. amdflash.1)")
    p.set_defaults(func=cmd_man)


def cmd_udev_rules(args: argparse.Namespace) -> int:
    rules = udev_rules()
    if not args.install:
        output.result(rules.rstrip("\n"))
        return EXIT_OK
    target = args.dir / UDEV_RULES_FILE
    if not args.dir.is_dir():
        raise Refusal(f"{args.dir} is not a directory (is udev installed?)")
    if not os.access(args.dir, os.W_OK):
        raise Refusal(f"cannot write {target}: permission denied (run as root, e.g. with sudo)")
    write_new(target, rules)
    output.note(f"wrote {target}; now run: udevadm control --reload && udevadm trigger")
    return EXIT_OK


def cmd_completion(args: argparse.Namespace) -> int:
    from argcomplete import shellcode

    output.result(shellcode(["amdflash"], shell=args.shell).rstrip("\n"))
    return EXIT_OK


MAN_SECTIONS = {
    "exit status": """.TP
.B 0
success
.TP
.B 1
a failure during an operation (the run is recorded as failed; the error names the address and the bytes,
and says what state the board is in and what to do next)
.TP
.B 2
a usage error or a refusal before anything was written: a malformed option, no such board, a busy board,
a bad image, an output that exists (see --overwrite), an unusable audit database
.TP
.B 130
interrupted (Ctrl-C or SIGTERM): a flash stops at a safe point and can be resumed
.PP
With several --board: 130 if any board was interrupted, else 1 if any failed, else 2 if any was refused,
else 0.""",
    "environment": """.TP
.B AMDFLASH_DB
the audit database (--db wins over it)
.TP
.B AMDFLASH_CONFIG
the config file (--config wins over it)
.TP
.B AMDFLASH_HOST_KEY
the host's private signing key (default: host_key.pem in the data directory, one for every
database of the account; a key an older amdflash made beside a database goes on signing it)
.TP
.B AMDFLASH_ANCHOR
the anchor file (default: the database's path with .anchor)
.TP
.B AMDFLASH_CENTRAL
the central PostgreSQL record for audit push, fleet runs and fleet report
.TP
.B AMDFLASH_SIM_USB
PATH[,PATH...]: USB specs reach these emulated boards through the real USB driver
.TP
.B AMDFLASH_LOCK_DIR
where lock files go for boards without a device node of their own
.TP
.B LG_COORDINATOR
the labgrid coordinator of the fleet commands""",
    "files": """.TP
.I $XDG_DATA_HOME/amdflash/audit.sqlite
the audit trail (~/.local/share/amdflash; directory 0700, files 0600), with its anchor
.I audit.sqlite.anchor,
the host key
.I host_key.pem
and the backups of original flash content in
.I backups/
.TP
.I $XDG_CONFIG_HOME/amdflash/config.toml
defaults: db, board, prescale, rx_mode, restore_each, reads, progress
.TP
.I /run/lock/amdflash
root's lock files for boards without a device node (boards are locked on their device node or sysfs
directory, shared by every user)""",
    "examples": """.nf
amdflash list
amdflash info --board usb:0
amdflash dump backup.bin --board usb:0
amdflash flash known-good.bin --yes --board usb:0
amdflash resume --yes --board usb:0
amdflash report RUN --format html -o run.html
amdflash audit verify --key host.pub
amdflash demo
.fi""",
    "see also": "amdflash GROUP COMMAND \\-\\-help for the options of a command in a group (audit, fleet, image, "
                "report, sim); fwupdmgr(1), flashrom(8), labgrid-client(1); the README and docs/ of amdflash",
}


SHARED_GROUPS = ("boards", "ROM_SW engine", "hardware report")     # option groups many commands share: listed once


def _roff(text: str) -> str:
    return text.replace("\\", "\\\\").replace("-", "\\-")


def _shared_options(parser: argparse.ArgumentParser) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Take the shared option groups out of every command (the page lists them once) and
    return them as roff, by group title, with the commands that take each group."""
    from amdflash.pipeline.cli.parsing import subparsers

    shared: dict[str, str] = {}
    takers: dict[str, list[str]] = {}
    for sub in subparsers(parser):
        if sub.description:     # the page gives each command's first sentence; --help has the rest
            sub.description = sub.description.split(". ")[0].rstrip(".") + "."
        if len(sub.prog.split()) > 2:
            # A command of a group (audit, fleet, sim, report…): its synopsis and first sentence;
            # its options are in `amdflash GROUP COMMAND --help`, as git's page leaves its
            # commands' to their own pages.
            for group in list(sub._action_groups):
                for action in [a for a in group._group_actions if a.option_strings]:
                    group._group_actions.remove(action)
                    sub._actions.remove(action)
            continue
        for group in [g for g in sub._action_groups if g.title in SHARED_GROUPS]:
            sub._action_groups.remove(group)
            takers.setdefault(group.title or "", []).append(sub.prog.split()[-1])
            for action in group._group_actions:
                # --board stays in the command's usage line (the board it works on is the point
                # of the command); the shared sections below say what the rest are.
                if action in sub._actions and "--board" not in action.option_strings:
                    sub._actions.remove(action)
            if group.title and group.title not in shared:
                lines = []
                for action in group._group_actions:
                    names = ", ".join(action.option_strings)
                    metavar = f" {action.metavar}" if isinstance(action.metavar, str) else ""
                    lines += [".TP", f"\\fB{_roff(names)}\\fR{_roff(metavar)}", _roff(action.help or "")]
                shared[group.title] = "\n".join(lines)
    return shared, takers


def _listing(commands: list[str]) -> str:
    """"info, read and dump" — from the parser, so never a list that disagrees with it."""
    names = [_roff(c) for c in commands]
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else "".join(names)


def manpage(parser: argparse.ArgumentParser) -> str:
    from argparse_manpage.manpage import Manpage

    import amdflash

    shared, takers = _shared_options(parser)
    page = Manpage(parser, _data={"project_name": "amdflash", "version": amdflash.__version__,
                                  "manual_title": "amdflash manual", "manual_section": 1,
                                  "description": "dump, verify and recover the SPI flash of AMD Navi31 boards"})
    page.add_section("board options", "=", "Every command that works on boards takes these: "
                     f"{_listing(takers.get('boards', []))}.\n" + shared.get("boards", ""))
    page.add_section("rom_sw engine options", "=", f"{_listing(takers.get('ROM_SW engine', []))} take these.\n"
                     + shared.get("ROM_SW engine", ""))
    page.add_section("hardware report option", "=", f"{_listing(takers.get('hardware report', []))} take this.\n"
                     + shared.get("hardware report", ""))
    for heading, content in MAN_SECTIONS.items():
        page.add_section(heading, "=", content)
    return str(page)


def cmd_man(args: argparse.Namespace) -> int:
    # The whole command line, its global options listed once.
    text = manpage(args.build_parser(globals_everywhere=False))
    if args.output:
        write_output(args, text, "manual page")
        output.note(f"wrote {args.output}")
    else:
        output.result(text.rstrip("\n"))
    return EXIT_OK
