"""The HTML report's commands in a real browser (headless Chromium through Playwright), as a
reviewer copies them (issue 40 item 7): the put-back and the next step wrapped mid-word
("amdflas|h", "ag|ain": the value cells broke anywhere), so what one read was not what one
pastes. A command wraps only between words; nothing widens the page."""
from __future__ import annotations

import pytest

from tests.store import screenshots

pytestmark = [pytest.mark.skipif(screenshots.browser_missing() is not None,
                                 reason=str(screenshots.browser_missing())),
              pytest.mark.slow]

# Each word of the element's text: the tops of the line boxes it lies on (one: not split).
SPLIT_WORDS = """el => {
  const split = [];
  const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    for (const m of node.textContent.matchAll(/\\S+/g)) {
      const r = document.createRange();
      r.setStart(node, m.index);
      r.setEnd(node, m.index + m[0].length);
      const tops = new Set([...r.getClientRects()].filter(x => x.width > 0).map(x => Math.round(x.top)));
      if (tops.size > 1) split.push(m[0]);
    }
  }
  return split;
}"""
LINES = "el => new Set([...el.getClientRects()].map(x => Math.round(x.top))).size + " \
        "Math.round(el.getBoundingClientRect().height / parseFloat(getComputedStyle(el).lineHeight || 16))"


@pytest.fixture(scope="module")
def trail(tmp_path_factory):
    return screenshots.shared_trail(tmp_path_factory)


@pytest.mark.parametrize("width", [1280, 720, 560])
def test_commands_wrap_only_between_words(trail, width):
    commands = 0
    wrapped = 0
    with screenshots.browser() as page:
        page.set_viewport_size({"width": width, "height": 900})
        for kind, path in trail["pages"].items():
            page.goto(path.as_uri())
            found = page.locator(".cmd, [data-field=next_step], [data-field=put-back]")
            for i in range(found.count()):
                el = found.nth(i)
                commands += 1
                assert el.evaluate(SPLIT_WORDS) == [], (kind, width, el.inner_text())
                height = el.evaluate("el => el.getBoundingClientRect().height")
                line = el.evaluate("el => parseFloat(getComputedStyle(el).lineHeight) || 16")
                wrapped += height > 1.5 * line
            for section in ("#identity", "#outcome"):      # values wrap in their cells (the sector map is fixed)
                box = page.locator(section)
                if box.count():
                    assert box.evaluate("e => e.scrollWidth <= e.clientWidth"), (kind, width, section)
    assert commands >= 2, "no command on the pages: the test checks nothing"
    if width < 800:
        assert wrapped, "no command wrapped at this width: the test checks nothing"
