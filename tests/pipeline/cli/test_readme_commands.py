"""Every amdflash command line the README shows parses: a command and options that exist, in
an order the command line takes (a reader pastes them, as they paste a printed next step).
Placeholders stand as written (IMAGE, RUN, PATH); optional parts in [brackets] are dropped
and, of alternatives (`a | b`, `text|json`), the first is taken."""
from __future__ import annotations

import re
import shlex

import pytest

from amdflash.pipeline.cli.main import build_parser
from tests.support.readme import README, drop_optional


def _is_amdflash(word: str) -> bool:
    return word == "amdflash" or word.endswith("/bin/amdflash")


def _command_lines() -> list[str]:
    """Each command line whose program is amdflash (also after `sudo -u USER`), from the
    README's code blocks: optional parts dropped first, then cut at pipes, `&&`, `;`, a
    redirect, a comment, or a wide gap (two commands side by side)."""
    lines = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", README.read_text(), re.S):
        for line in block.splitlines():
            if "│" in line or line.lstrip().startswith(("#", "from ")):
                continue        # the line's drawing, a comment, Python
            line = drop_optional(line)
            for segment in re.split(r"\s+#.*$|\s\|\s|&&|;|\s{3,}", line):
                words = (segment or "").split(">")[0].split()
                if words[:1] == ["sudo"]:
                    words = words[3:] if words[1:2] == ["-u"] else words[1:]
                if words and _is_amdflash(words[0]) and len(words) > 1:
                    lines.append(" ".join(words[1:]))
    return lines


def _tokens(command: str) -> list[str]:
    tokens = []
    for token in shlex.split(command):
        token = token.replace("…", "").replace("...", "")
        if "|" in token:                                      # text|json: one of them
            token = token.split("|")[0]
        if token:
            tokens.append(token)
    return tokens


COMMANDS = _command_lines()


def test_the_readme_shows_command_lines() -> None:
    assert len(COMMANDS) >= 20, COMMANDS


@pytest.mark.parametrize("command", COMMANDS)
def test_a_readme_command_line_parses(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    tokens = _tokens(command)
    if tokens[0] == "COMMAND":        # the synopsis of every command
        tokens = ["info", *tokens[1:]]
    try:
        build_parser().parse_args(tokens)
    except SystemExit as e:
        if e.code in (0, None):       # --version, --help: answered
            return
        pytest.fail(f"amdflash {' '.join(tokens)}: exit {e.code}: {capsys.readouterr().err.strip()}")


def test_every_file_of_the_repository_the_readme_names_exists() -> None:
    """The units, rules and configs a line is brought up with (`pipeline/fleet/units/…` →
    /etc/systemd/system/) are copied from the paths the README gives; the benches and tools
    it runs (`python -m tests.bench.…`) are there."""
    named = set()
    for path in re.findall(r"\b((?:pipeline|stages|store|docs|tests)/[\w./{},*-]*[\w}])", README.read_text()):
        braces = re.search(r"\{([^}]*)\}", path)
        for choice in braces.group(1).split(",") if braces else [""]:
            named.add(path[:braces.start()] + choice + path[braces.end():] if braces else path)
    for module in re.findall(r"python -m (tests\.[\w.]+)", README.read_text()):   # the benches, tools
        named.add(module.replace(".", "/") + ".py")
    root = README.parent
    assert len(named) >= 10, named
    # A placeholder (NAME.json) or a pattern (*.json) names the folder it is in.
    place = {p: p.rsplit("/", 1)[0] if re.search(r"[A-Z]{3,}\.|\*", p) else p for p in named}
    missing = [p for p in named if not (root / place[p]).exists()]
    assert sorted(missing) == []
