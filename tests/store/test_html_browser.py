"""The HTML report in a real browser (headless Chromium through Playwright): what a reviewer
sees on each page kind — a clean recovery, a failed verify, a killed flash and its resume."""
from __future__ import annotations

import pytest

from tests.store import screenshots

pytestmark = [pytest.mark.skipif(screenshots.browser_missing() is not None,
                                 reason=str(screenshots.browser_missing())),
              pytest.mark.slow]   # four recorded runs and a browser: CI runs it (pytest -m slow)


@pytest.fixture(scope="module")
def trail(tmp_path_factory):
    return screenshots.shared_trail(tmp_path_factory)


@pytest.fixture(scope="module")
def page():
    with screenshots.browser() as p:
        yield p


def visible_text(page) -> str:  # noqa: ANN001
    return page.inner_text("body")


def test_a_clean_run_raises_no_alarm(trail, page):
    page.goto(trail["pages"]["clean"].as_uri())
    text = visible_text(page)
    assert "no end recorded" not in text and "not verified" not in text.replace("touched (erased or programmed), "
                                                                                 "not verified", "")
    assert page.locator(".bar.open").count() == 0
    assert page.inner_text("[data-field=status-badge]") == "succeeded"
    # The fast paths' verdicts and the diagnostics are facts at a moment, not stages without an end.
    facts = page.locator("#facts")
    assert facts.locator("[data-fact=rom_sw]").count() >= 1 and facts.locator("[data-fact=transport]").count() == 1
    assert page.locator("#timeline [data-stage=rom_sw]").count() == 0
    assert page.locator("#timeline [data-stage=process]").count() == 0


def test_details_are_readable_not_raw_json(trail, page):
    for kind in ("clean", "failed", "resumed"):
        page.goto(trail["pages"][kind].as_uri())
        for where in ("[data-field=arguments]", "#facts", "#timeline"):
            shown = page.inner_text(where)
            assert '{"' not in shown and '": ' not in shown and "{'" not in shown, (kind, where, shown[:300])
        assert "start sector" in page.inner_text("[data-field=arguments]")


def test_the_legend_entries_look_different_from_each_other(trail, page):
    page.goto(trail["pages"]["clean"].as_uri())
    swatches = page.locator(".legend .cell")
    looks = [swatches.nth(i).evaluate(
        "e => { const s = getComputedStyle(e); return [s.backgroundColor, s.backgroundImage, s.borderTopStyle, "
        "s.borderTopColor].join(' ') }") for i in range(swatches.count())]
    assert len(looks) == len(set(looks)), looks


def test_a_failed_run_shows_its_first_error_and_the_failed_unit(trail, page):
    page.goto(trail["pages"]["failed"].as_uri())
    assert page.inner_text("[data-field=status-badge]") == "failed"
    assert "verify of unit" in page.inner_text("[data-field=first-error]")
    unit = trail["stuck"] - trail["stuck"] % 0x1000
    assert "failed" in page.locator(f".cell[data-address='{unit:#08x}']").get_attribute("class").split()


def test_a_resume_shows_the_earlier_runs_work_not_as_skipped(trail, page):
    page.goto(trail["pages"]["killed"].as_uri())
    assert page.inner_text("[data-field=status-badge]") == "interrupted"
    written_before = page.locator(".map .cell.erase, .map .cell.program").count()
    assert written_before > 16
    page.goto(trail["pages"]["resumed"].as_uri())
    earlier = page.locator(".map .cell.earlier")
    # Every unit the killed run wrote, but the block it was in the middle of (rewritten by the resume).
    assert written_before - 16 <= earlier.count() <= written_before, (earlier.count(), written_before)
    assert "written by run" in earlier.first.get_attribute("title")
    legend = page.inner_text(".legend")
    assert "written by an earlier run of this flash" in legend
    link = page.locator("[data-field=resumes_run_id] a")
    assert link.get_attribute("href") == f"{trail['runs']['killed']}.html"


def test_screenshots_of_each_page_kind(trail, page, tmp_path):
    for kind, path in trail["pages"].items():
        page.goto(path.as_uri())
        shot = tmp_path / f"report-{kind}.png"
        page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 20_000
