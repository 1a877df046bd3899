"""What users of flashrom, esptool and fwupdmgr expect around the tool: udev rules, shell
completion and a man page, all from what ships in the package and the parser itself."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from amdflash.pipeline import output
from amdflash.pipeline.checks import output_file
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
    p.add_argument("-o", "--output", type=output_file, metavar="FILE", help="write the page to FILE (e.g. amdflash.1)")
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


def manpage(parser: argparse.ArgumentParser) -> str:
    from argparse_manpage.manpage import Manpage

    import amdflash

    page = Manpage(parser, _data={"project_name": "amdflash", "version": amdflash.__version__,
                                  "manual_title": "amdflash manual", "manual_section": 1})
    return str(page)


def cmd_man(args: argparse.Namespace) -> int:
    text = manpage(args.root_parser)   # the whole command line, as main() built it
    if args.output:
        write_new(args.output, text)
        output.note(f"wrote {args.output}")
    else:
        output.result(text.rstrip("\n"))
    return EXIT_OK
