"""The words of the manual page and --help agree with what the commands do (issue 40 item 7):
restore-original's usage lacked --board (every board command's did: the shared options were taken
out of each usage line), and flash said IMAGE is "exactly 2 MiB" while a range flash takes its
sectors' content alone (the put-back of a range flash's backup)."""
from __future__ import annotations

import re

from amdflash.pipeline.cli.main import build_parser
from amdflash.pipeline.cli.parsing import subparsers


def _sections(page: str) -> dict[str, str]:
    """The manual's section of each command, by name."""
    parts = re.split(r"^\.SH COMMAND \\fI\\,'amdflash ([^']*)'\\/\\fR$", page, flags=re.M)
    return {name.replace("\\-", "-"): body for name, body in zip(parts[1::2], parts[2::2])}


def _board_commands() -> list[str]:
    return [p.prog.split()[-1] for p in subparsers(build_parser())
            if any(g.title == "boards" for g in p._action_groups) and len(p.prog.split()) == 2]


def test_every_board_command_s_usage_in_the_manual_names_board(amdflash):
    page = amdflash("man").out
    sections = _sections(page)
    commands = _board_commands()
    assert "restore-original" in commands and "flash" in commands
    for command in commands:
        usage = sections[command].split("\n\n")[0].replace("\\-", "-")
        assert "[--board SPEC]" in usage, (command, usage)
    # The sections that list the shared options once name every command that takes them.
    listed = page.split(".SH BOARD OPTIONS")[1].split("\n")[1].replace("\\-", "-")
    assert all(c in listed for c in commands) and "restore-original" in listed, listed
    engine = page.split(".SH ROM_SW ENGINE OPTIONS")[1].split("\n")[1].replace("\\-", "-")
    assert "restore-original" in engine, engine


def test_flash_says_its_image_may_be_the_content_of_the_sectors_named(amdflash):
    """What a range flash's put-back runs (`flash BACKUP --start-sector N --sector-count M`) is
    what the words allow."""
    for words in (amdflash("man").out.replace("\\-", "-"), amdflash("flash", "--help").out):
        flash = words[words.index("amdflash flash"):]
        assert "exactly 2 MiB" not in flash[:3000], flash[:3000]
        assert "those sectors' content alone" in " ".join(flash.split()), flash[:3000]
