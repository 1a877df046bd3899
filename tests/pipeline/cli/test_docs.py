"""The code cites the project's own hardware notes (docs/), and only notes that exist."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
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


def test_every_test_the_threat_model_names_exists():
    """docs/threat-model.md backs each promise with a test (`tests/…py::name`, or `::name` for
    another test of the file named just before it): every one must exist, so that a promise
    never outlives the test that showed it."""
    text = (ROOT / "docs" / "threat-model.md").read_text(encoding="utf-8")
    named: list[tuple[Path, str]] = []
    current: Path | None = None
    for m in re.finditer(r"((?:[\w/]+/)?test_\w+\.py)?::(test_\w+)", text):
        if m.group(1):
            hits = [ROOT / m.group(1)] if "/" in m.group(1) else sorted((ROOT / "tests").rglob(m.group(1)))
            assert len(hits) == 1 and hits[0].is_file(), f"{m.group(1)}: no such test file"
            current = hits[0]
        assert current is not None, f"::{m.group(2)} names no file"
        named.append((current, m.group(2)))
    assert len(named) > 40
    missing = [f"{p.relative_to(ROOT)}::{name}" for p, name in named
               if not re.search(rf"^\s*(async )?def {name}\(", p.read_text(encoding="utf-8"), re.M)]
    assert missing == []
