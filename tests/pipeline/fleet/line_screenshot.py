"""The line view's screenshot in docs/ (docs/line-view.png), made by one command:

    python -m tests.pipeline.fleet.line_screenshot

It brings up a line as the fleet tests do (labgrid coordinator, two exporters acting as hosts
over a loopback sshd, a throwaway PostgreSQL), each host's follow service and `fleet serve`,
starts `fleet flash` on 8 emulated boards of which one has a stuck bit, and photographs the
page in Debian's Chromium (tests/store/screenshots.py) once the failure is on it while the
others are still flashing.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from amdflash.stages.sim.synth import synthetic_ifwi

from tests.pipeline.fleet.lab import Lab, missing, wait_for
from tests.pipeline.fleet.pgcluster import PostgresCluster, server_binaries
from tests.store import screenshots

ROOT = Path(__file__).resolve().parents[3]


def take(work: Path, out: Path) -> Path:
    image = work / "image.bin"
    data = synthetic_ifwi(4242)
    image.write_bytes(data)
    stuck = next(a for a in range(0x40000, len(data)) if not data[a] & 1)
    cluster = PostgresCluster(server_binaries()).start()   # type: ignore[arg-type]
    lab = Lab(work / "line")
    try:
        lab.start_sshd()
        lab.start_coordinator()
        for name, seed in (("hosta", 100), ("hostb", 200)):
            lab.add_host(name, 4, seed=seed, realtime=0.3,
                         faults={2: [f"stuck-bit={stuck:#x}:0"]} if name == "hostb" else None)
        _, viewer, _ = lab.watched_line(cluster, "line=a")
        base = lab.start_serve(viewer)
        with screenshots.browser() as page:
            page.set_viewport_size({"width": 1400, "height": 520})
            page.goto(base)
            running = lab.fleet_popen("flash", str(image), "--where", "line=a", "--yes")

            def ready() -> bool:
                states = page.eval_on_selector_all("#boards tr[data-place]", "rows => rows.map(r => r.dataset.state)")
                return "failed" in states and states.count("running") >= 3 and len(states) == 8

            wait_for(ready, 600, "the failure on the page while the others flash", interval=0.2)
            shot = out / "line-view.png"
            page.screenshot(path=str(shot), full_page=True)
            running.communicate(timeout=900)
        return shot
    finally:
        lab.close()
        cluster.stop()


if __name__ == "__main__":
    why = screenshots.browser_missing() or missing() or (None if server_binaries() else "no PostgreSQL server")
    if why:
        sys.exit(f"cannot take the screenshot: {why}")
    with tempfile.TemporaryDirectory(prefix="amdflash-line-shot-") as tmp:
        print(f"wrote {take(Path(tmp), ROOT / 'docs').relative_to(ROOT)}")
