"""The HTML report shows what matters (issue 27, item 7): every status badge is legible — its
text against its own background meets WCAG AA (4.5:1) as a real browser computes the colours —
and every link in a written report leads somewhere: to a page written beside it, or an anchor
inside it."""
from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

from tests.store import screenshots

pytestmark = [pytest.mark.skipif(screenshots.browser_missing() is not None,
                                 reason=str(screenshots.browser_missing())),
              pytest.mark.slow]   # recorded runs and a browser: CI runs it (pytest -m slow)

AA = 4.5


@pytest.fixture(scope="module")
def trail(tmp_path_factory):
    """The review trail (clean, failed, killed, resumed), and a refused flash of a blank board."""
    work = tmp_path_factory.mktemp("legible")
    made = dict(screenshots.shared_trail(tmp_path_factory))
    made["pages"] = dict(made["pages"])
    blank = screenshots.create_board(work / "blank", content="blank", transport="ideal", seed=14)
    # The shared trail is read by other modules at the same time: the refused flash goes to a
    # trail of its own.
    db = work / "audit.sqlite"
    image = made["db"].parent / "image.bin"
    assert screenshots._amdflash(db, "flash", image, "--yes", "--board", f"sim:{blank}").returncode == 2
    refused = __import__("json").loads(screenshots._amdflash(db, "runs", "--json").stdout)[-1]["run_id"]
    page = work / "pages" / f"{refused}.html"      # another directory: no other run's page is there
    page.parent.mkdir()
    assert screenshots._amdflash(db, "report", refused, "--format", "html", "-o", page).returncode == 0
    made["pages"]["refused"] = page
    return made


def _luminance(rgb: tuple[float, ...]) -> float:
    def channel(c: float) -> float:
        c /= 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4
    r, g, b = (channel(c) for c in rgb[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(fg: str, bg: str) -> float:
    """WCAG contrast ratio of two CSS rgb()/rgba() colours (opaque: the badges' are)."""
    a, b = (_luminance(tuple(float(x) for x in re.findall(r"[\d.]+", c))) for c in (fg, bg))
    return (max(a, b) + 0.05) / (min(a, b) + 0.05)


def test_contrast_is_computed_as_wcag_says():
    assert round(contrast("rgb(255, 255, 255)", "rgb(0, 0, 0)"), 1) == 21.0
    assert contrast("rgb(199, 123, 18)", "rgb(199, 123, 18)") == 1.0


def test_every_status_badge_is_legible(trail):
    seen = {}
    with screenshots.browser() as page:
        for kind, path in trail["pages"].items():
            page.goto(path.as_uri())
            for badge in page.locator(".badge").all():
                fg, bg = badge.evaluate("e => [getComputedStyle(e).color, getComputedStyle(e).backgroundColor]")
                seen[(kind, badge.inner_text())] = contrast(fg, bg)
    statuses = {text for _, text in seen}
    assert {"succeeded", "failed", "interrupted", "refused", "emulated board"} <= statuses, seen
    assert all(ratio >= AA for ratio in seen.values()), seen


class _Refs(HTMLParser):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.hrefs: list[str] = []
        self.ids: set[str] = set()
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.hrefs += [v or "" for k, v in attrs if k == "href"]
        self.ids |= {v or "" for k, v in attrs if k in ("id", "name")}


def test_every_link_of_a_written_report_leads_somewhere(trail):
    linked = 0
    for kind, path in trail["pages"].items():
        refs = _Refs(path.read_text())
        for href in refs.hrefs:
            target, _, anchor = href.partition("#")
            if target:
                assert (path.parent / target).is_file(), (kind, href)
                linked += 1
            else:
                assert anchor in refs.ids, (kind, href)
    assert linked          # the resume's page links the killed run's page, written before it
    killed = _Refs(trail["pages"]["killed"].read_text())
    resumed = trail["runs"]["resumed"]
    assert f"{resumed}.html" not in killed.hrefs                      # not written when its page was
    assert resumed in trail["pages"]["killed"].read_text()             # named, as text
