"""The code cites the project's own hardware notes (docs/), and only notes that exist."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [p for folder in ("pipeline", "stages", "store", "tests") for p in (ROOT / folder).rglob("*.py")]


def test_every_docs_citation_names_an_existing_note():
    cited = {(path, m.group(0)) for path in [*SOURCES, ROOT / "README.md"]
             for m in re.finditer(r"docs/[\w.-]+\.md", path.read_text(encoding="utf-8"))}
    assert cited, "the code cites no hardware notes at all"
    missing = sorted(f"{p.relative_to(ROOT)}: {doc}" for p, doc in cited if not (ROOT / doc).is_file())
    assert missing == []


def test_no_citation_of_documents_outside_the_repository():
    outside = re.compile("(HARDWARE|DESIGN)" + r"\.md|ASM24\.md")
    offenders = [str(p.relative_to(ROOT)) for p in [*SOURCES, ROOT / "README.md"]
                 if outside.search(p.read_text(encoding="utf-8"))]
    assert offenders == []
