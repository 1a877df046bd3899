"""The README's code blocks as tests read them: optional parts as a reader drops them."""
from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def drop_optional(line: str) -> str:
    """`line` without its optional parts in [brackets], innermost first (`[HOST/]RUN`: RUN)."""
    while re.search(r"\[[^\[\]]*\]", line):
        line = re.sub(r"\s*\[[^\[\]]*\](?=\S)", " ", line)
        line = re.sub(r"\s*\[[^\[\]]*\]", "", line)
    return line
