"""The HTML report as a reviewer uses it (issue 40 item 7): its run ids lead to the runs' pages,
and the steps it offers are the text report's and the command line's, word for word.

A page links another run only when that run's page is beside it (a link must lead somewhere),
so a page written alone linked nothing: `report RUN --pages DIR` writes the pages of a run's
story together (the run it resumes, its resumes, the run that fixed or superseded it, the runs
whose backups it names, and theirs), each DIR/RUN.html, linked to each other."""
from __future__ import annotations

import html
import json
import re

import pytest

from tests.pipeline.cli import test_original_across_runs as across

killed = across.killed        # the fixture: a board whose flash was killed while writing units

HREF = re.compile(r'<a class="mono" href="([0-9]{8}T[0-9]{6}-[0-9a-f]{8})\.html">\1</a>')


def _field(page: str, name: str) -> str:
    """The text a data-field element shows (its markup dropped, entities read)."""
    m = re.search(rf'data-field="{name}"[^>]*>(.*?)</(?:td|code)>', page, re.S)
    assert m, name
    return html.unescape(re.sub(r"<[^>]+>", "", m.group(1)))


@pytest.mark.slow
def test_report_pages_writes_a_run_s_story_linked(amdflash, killed, tmp_path):
    board, run = killed["board"], killed["run"]
    assert amdflash("--no-progress", "resume", run, "--board", f"sim:{board}", "--yes").code == 0
    fix = json.loads(amdflash("runs", "--json").out)[-1]["run_id"]
    pages = tmp_path / "pages"
    pages.mkdir()
    r = amdflash("report", run[:-3], "--pages", pages)          # a unique prefix, as RUN_ID takes
    assert r.code == 0, r.err
    assert sorted(p.name for p in pages.iterdir()) == sorted([f"{run}.html", f"{fix}.html"])
    killed_page, fix_page = ((pages / f"{x}.html").read_text() for x in (run, fix))
    # Each names the other as a link to its page, beside it.
    assert f'<a class="mono" href="{fix}.html">{fix}</a>' in killed_page
    assert f'<a class="mono" href="{run}.html">{run}</a>' in fix_page
    # Every link leads to a page that is there.
    for page in (killed_page, fix_page):
        assert all((pages / f"{target}.html").is_file() for target in HREF.findall(page))
    # Written again only with --overwrite; nothing is written when refused.
    before = {p.name: p.stat().st_mtime_ns for p in pages.iterdir()}
    r = amdflash("report", run, "--pages", pages)
    assert r.code == 2 and "exists" in r.err and "--overwrite" in r.err, r.err
    assert {p.name: p.stat().st_mtime_ns for p in pages.iterdir()} == before
    assert amdflash("report", run, "--pages", pages, "--overwrite").code == 0
    # Refusals of what is not a directory, and of -o beside it.
    assert amdflash("report", run, "--pages", tmp_path / "missing").code == 2
    r = amdflash("report", run, "--pages", pages, "-o", tmp_path / "x.html")
    assert r.code == 2 and "one or the other" in r.err, r.err


def test_a_page_written_alone_links_the_runs_whose_pages_are_beside_it(amdflash, killed, tmp_path):
    """The run that wrote a backup is a run id like the others: linked once its page is there."""
    board, run = killed["board"], killed["run"]
    pages = tmp_path / "alone"
    pages.mkdir()
    assert amdflash("report", run, "--format", "html", "-o", pages / "mine.html").code == 0
    assert HREF.findall((pages / "mine.html").read_text()) == []          # nothing beside it yet
    assert amdflash("report", run, "--format", "html", "-o", pages / f"{run}.html").code == 0
    assert amdflash("report", run, "--format", "html", "-o", pages / "mine.html", "--overwrite").code == 0
    page = (pages / "mine.html").read_text()
    backup = re.search(r'data-field="backup">(.*?)</td>', page, re.S).group(1)
    assert f'(run <a class="mono" href="{run}.html">{run}</a>)' in backup, backup


def test_the_html_offers_the_steps_the_text_report_offers(amdflash, killed, tmp_path):
    """The same put-back and the same next step, word for word: the HTML takes them from the
    run's end as the text report does (pipeline.commands.run_end), never a second making."""
    run = killed["run"]
    text = amdflash("report", run).out
    assert amdflash("report", run, "--format", "html", "-o", tmp_path / "r.html").code == 0
    page = (tmp_path / "r.html").read_text()
    said = {line[11:] for line in text.splitlines() if line.startswith("next       ")}
    assert said == {_field(page, "next_step")}, (said, _field(page, "next_step"))
    backup = next(line for line in text.splitlines() if line.startswith("backup     "))
    put_back = _field(page, "put-back")
    assert backup.split("to put it back: ")[1].split(";")[0].rstrip(")") == put_back, (backup, put_back)
