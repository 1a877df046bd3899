"""The HTML report's page kinds, as a reviewer's browser shows them.

`python -m tests.store.screenshots` (from the project root) builds a small trail on emulated
boards — a clean recovery flash, a flash that fails verify on a stuck bit, a flash killed
mid-way and its resume — renders each run's page and saves a screenshot of each in docs/
(docs/report-*.png). The browser test (test_html_browser.py) uses the same trail.

Headless Chromium from Debian's `chromium` package, driven by Playwright (launched with
executable_path: Playwright's own browser download is not used).
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from amdflash.stages.sim import create_board
from amdflash.stages.sim.synth import PART_KEY, synthetic_ifwi

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path(os.environ.get("AMDFLASH_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
KINDS = ("clean", "failed", "killed", "resumed")


def browser_missing() -> str | None:
    """Why the browser tests cannot run here (None: they can)."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install '.[test]')"
    if not CHROMIUM.exists():
        return f"no Chromium at {CHROMIUM} (Debian: apt-get install chromium; .ci/run installs it)"
    return None


def _amdflash(db: Path, *args: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "amdflash", "--no-progress", "--db", str(db), *map(str, args)],
                          capture_output=True, text=True, env={**os.environ, **(env or {})})


def build_trail(work: Path) -> dict[str, Any]:
    """The four runs, in one audit database under `work`, and the HTML page of each."""
    work.mkdir(parents=True, exist_ok=True)
    db = work / "audit.sqlite"
    env = {"AMDFLASH_HOST_KEY": str(work / "host_key.pem")}
    image = work / "image.bin"
    img = synthetic_ifwi(1234)
    image.write_bytes(img)
    stuck = next(a for a in range(0x100000, len(img)) if img[a] & 0x01 == 0)
    boards = {
        "clean": create_board(work / "clean", transport="ideal", seed=11, cmp=True),
        "failed": create_board(work / "failed", transport="ideal", seed=12, faults=[f"stuck-bit={stuck:#x}:0"]),
        "killed": create_board(work / "killed", content="blank", transport="ideal", seed=13,
                               faults=["kill-after-writes=52000"]),
    }
    _amdflash(db, "flash", image, "--yes", "--clear-cmp", "--force", "--board", f"sim:{boards['clean']}", env=env)
    _amdflash(db, "flash", image, "--yes", "--force", "--board", f"sim:{boards['failed']}", env=env)
    _amdflash(db, "flash", image, "--yes", "--expect-part", PART_KEY, "--board", f"sim:{boards['killed']}", env=env)
    _amdflash(db, "sim", "fault", boards["killed"], "--clear", env=env)
    done = _amdflash(db, "resume", "--yes", "--board", f"sim:{boards['killed']}", env=env)
    assert done.returncode == 0, done.stderr
    import json

    runs = json.loads(_amdflash(db, "runs", "--json", env=env).stdout)
    by_kind = dict(zip(KINDS, (r["run_id"] for r in runs)))
    pages = {}
    for kind, run_id in by_kind.items():
        page = work / f"{run_id}.html"      # the name a run's link points at
        made = _amdflash(db, "report", run_id, "--format", "html", "-o", page, "--overwrite", env=env)
        assert made.returncode == 0, made.stderr
        pages[kind] = page
    return {"db": db, "runs": by_kind, "pages": pages, "stuck": stuck}


def shared_trail(tmp_path_factory: Any) -> dict[str, Any]:
    """The trail of `build_trail`, built once per test session and read by every browser test
    that only reads it (three full flashes and a resume: about 45 s of CPU each time). Under
    pytest-xdist the workers share it through a directory named by the session's run id, the
    first to take the lock building it; outside xdist, in this session's own temporary folder."""
    uid = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not uid:
        return build_trail(tmp_path_factory.mktemp("html-trail"))
    import fcntl
    import json
    import tempfile

    root = Path(tempfile.gettempdir()) / f"amdflash-html-trail-{uid}"
    root.mkdir(mode=0o700, exist_ok=True)
    made = root / "trail.json"
    with open(root / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not made.exists():
            trail = build_trail(root / "work")
            made.write_text(json.dumps(trail, default=str))
    loaded = json.loads(made.read_text())
    return {"db": Path(loaded["db"]), "runs": loaded["runs"], "stuck": loaded["stuck"],
            "pages": {k: Path(v) for k, v in loaded["pages"].items()}}


@contextlib.contextmanager
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = chromium.new_page(viewport={"width": 1280, "height": 900})
            yield page
        finally:
            chromium.close()


def screenshots(work: Path, out: Path) -> list[Path]:
    trail = build_trail(work)
    written = []
    with browser() as page:
        for kind, path in trail["pages"].items():
            page.goto(path.as_uri())
            shot = out / f"report-{kind}.png"
            page.screenshot(path=str(shot), full_page=True)
            written.append(shot)
    return written


if __name__ == "__main__":
    import tempfile

    missing = browser_missing()
    if missing:
        sys.exit(f"cannot take the screenshots: {missing}")
    with tempfile.TemporaryDirectory(prefix="amdflash-screenshots-") as tmp:
        for shot in screenshots(Path(tmp), ROOT / "docs"):
            print(f"wrote {shot.relative_to(ROOT)}")
