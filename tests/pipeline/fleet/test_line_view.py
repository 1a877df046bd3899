"""The line, watched (issue 22's Done-when): the whole line on one machine — coordinator, two
exporters acting as hosts, sshd, a throwaway PostgreSQL — each host's follow service, `fleet
serve`, and a real browser (Playwright driving Debian's Chromium, as the HTML report's browser
test does) on its page while `fleet flash` writes 8 boards, one of them failing on an
emulated stuck bit and one host's job SIGKILLed, then the next flash resuming those."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from tests.pipeline.fleet.lab import FleetOutcome, Lab, wait_for
from tests.pipeline.fleet.conftest import job_processes
from tests.pipeline.fleet.test_line import place_of
from tests.pipeline.fleet.test_serve import Receiver
from tests.store import screenshots

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(screenshots.browser_missing() is not None, reason=str(screenshots.browser_missing()))]
psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed (pip install '.[test]' brings it)")

ROWS_JS = """() => Array.from(document.querySelectorAll('#boards tr[data-place]')).map(tr => {
    const bar = tr.querySelector('progress'); const link = tr.querySelector('a[href^="runs/"]');
    return {place: tr.dataset.place, state: tr.dataset.state, run: tr.dataset.run, job: tr.dataset.job,
            source: tr.dataset.source, done: bar ? Number(bar.value) : 0, total: bar ? Number(bar.max) : 0,
            href: link ? link.getAttribute('href') : null};
})"""


class Watcher:
    """What the browser's page showed, and when (polled from the page: the page itself is never
    reloaded, so everything seen arrived as a live update)."""

    def __init__(self, page: Any):
        self.page = page
        self.first: dict[tuple[str, str], float] = {}       # (place, state) → first seen (wall clock)
        self.progress: dict[str, int] = {}                   # place → most bytes seen while running
        self.bars: set[str] = set()                           # places seen running with a progress bar
        self.rows: dict[str, dict[str, Any]] = {}

    def look(self) -> None:
        now = time.time()
        for row in self.page.evaluate(ROWS_JS):
            self.rows[row["place"]] = row
            self.first.setdefault((row["place"], row["state"]), now)
            if row["state"] == "running" and row["total"]:
                self.bars.add(row["place"])
                self.progress[row["place"]] = max(self.progress.get(row["place"], 0), row["done"])

    def until(self, check, timeout: float, what: str) -> None:
        def ok() -> bool:
            self.look()
            return bool(check())

        try:
            wait_for(ok, timeout, what, interval=0.1)
        except TimeoutError as e:
            seen = {p: (r["state"], r["done"], r["total"]) for p, r in sorted(self.rows.items())}
            raise TimeoutError(f"{e}; the page showed {seen}") from None


def ended_at(db: Path, run_id: str) -> float:
    import datetime as dt

    con = sqlite3.connect(db)
    try:
        at = con.execute("SELECT at FROM run_status WHERE run_id = ? ORDER BY seq DESC LIMIT 1",
                         (run_id,)).fetchone()[0]
    finally:
        con.close()
    return dt.datetime.fromisoformat(at).timestamp()


def _count(db: Path, sql: str, *args: object) -> int:
    """One number from a host's trail, read-only (0 while it has no trail yet)."""
    if not db.exists():
        return 0
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return con.execute(sql, args).fetchone()[0] or 0
    except sqlite3.OperationalError:      # its schema not made yet
        return 0
    finally:
        con.close()


def newest_run(db: Path) -> int:
    return _count(db, "SELECT max(seq) FROM runs")


def boards_with_a_verified_unit(db: Path, since: int) -> int:
    """How many runs after the runs row at `since` have a unit verified (or failed) in the
    trail: what the page's bar counts as done (pipeline/fleet/live.py)."""
    return _count(db, "SELECT count(DISTINCT u.run) FROM log_units u JOIN runs r ON r.seq = u.run "
                      "WHERE r.seq > ? AND u.state IN ('verified', 'failed')", since)


# Wall seconds: the page paints within 5 s and shows a failure within 5 s of its host's trail
# recording it, which other tests running beside it would decide (issue 31).
@pytest.mark.wall_clock
def test_the_line_view_shows_every_board_live_a_failure_within_5_s_a_kill_and_its_resume(lab: Lab, fleet_image: Path,
                                                                                          postgres) -> None:
    image = fleet_image.read_bytes()
    stuck = next(a for a in range(0x10000, len(image)) if not image[a] & 1)
    # hosta's boards run slower, so that none of them has finished by the time its job is
    # killed (once every board's bar moves: hostb's may start last on a loaded machine).
    for name, seed in (("hosta", 100), ("hostb", 200)):
        lab.add_host(name, 4, seed=seed, realtime=0.8 if name == "hosta" else 0.4,
                     faults={1: [f"stuck-bit={stuck:#x}:0"]} if name == "hostb" else None)
    _, viewer, made = lab.watched_line(postgres, "line=a")
    places = {p["place"]: p for p in made}
    receiver = Receiver()
    base = lab.start_serve(viewer, "--notify", receiver.url, "--settle", "4", "--public-url", "https://view.example/")
    failing = place_of(places, lab.hosts["hostb"].boards[1])
    killed = {place_of(places, b) for b in lab.hosts["hosta"].boards}

    try:
        with screenshots.browser() as page:
            started = time.monotonic()
            page.goto(base)
            assert time.monotonic() - started < 5
            watch = Watcher(page)
            since = {name: newest_run(host.db) for name, host in lab.hosts.items()}
            running = lab.fleet_popen("flash", str(fleet_image), "--where", "line=a", "--yes")
            # Every board's progress, live: each on the page running, its bar moving. The boards
            # keep emulated time, which a loaded machine does not slow, while the page's feed
            # slows with it (a slow run under load saw all eight end before the page showed one
            # moving): so each host's job is held (SIGSTOP) once its trail has a verified unit of
            # each of its boards, and let go only after the page has shown them all moving.
            held: dict[str, int] = {}

            def hold() -> bool:
                for name, host in lab.hosts.items():
                    if name not in held and boards_with_a_verified_unit(host.db, since[name]) == 4:
                        pids = job_processes(host.boards[1])
                        assert len(pids) == 1, f"{name}'s job: {pids}"
                        os.kill(pids[0], signal.SIGSTOP)
                        held[name] = pids[0]
                return len(held) == len(lab.hosts)

            try:
                wait_for(hold, 120, "each host's four boards past their first verified unit", interval=0.05)
                watch.until(lambda: len(watch.bars) == 8 and all(watch.progress.get(p, 0) > 0 for p in places), 120,
                            "every board's progress bar moving on the page")
            finally:
                # then hosta's job (one process: its four boards, held mid-write) is SIGKILLed
                if "hosta" in held:
                    os.kill(held.pop("hosta"), signal.SIGKILL)
                for pid in held.values():
                    os.kill(pid, signal.SIGCONT)
            watch.until(lambda: running.poll() is not None and all(
                watch.rows.get(p, {}).get("state") in ("interrupted", "failed", "succeeded") for p in places),
                300, "the flash to end and every board to show it")
            first = FleetOutcome.parse(running.returncode, *running.communicate())
            assert first.code == 130, first.boards

            # The failure: within 5 s of its host's trail recording it, with a link to its report.
            failed_run = first.boards[failing]["run_id"]
            assert first.boards[failing]["status"] == "failed"
            shown_at = watch.first[(failing, "failed")]
            assert shown_at - ended_at(lab.hosts["hostb"].db, failed_run) < 5.0
            row = watch.rows[failing]
            assert row["run"] == failed_run and row["href"] and row["href"].endswith(f"/{failed_run}.html")
            for place in killed:
                assert first.boards[place]["status"] == "interrupted", first.boards[place]
                assert watch.rows[place]["state"] == "interrupted", watch.rows[place]
                assert watch.rows[place]["run"] == first.boards[place]["run_id"]
            assert {watch.rows[p]["state"] for p in places if p not in killed and p != failing} == {"succeeded"}
            ordered = [r["state"] for r in page.evaluate(ROWS_JS)]
            assert ordered[0] == "failed" and ordered[1:5] == ["interrupted"] * 4      # failures first

            # Its report, from the signed record (pushed by the follow service after the end).
            report = base + row["href"]
            wait_for(lambda: page.goto(report).status == 200, 60, "the failed run's report", interval=1.0)
            assert page.inner_text("[data-field=status-badge]") == "failed"
            assert page.inner_text("[data-field=host]") == "hostb"      # the line's name for it, not the OS's
            assert "verified here" in page.inner_text("[data-field=verification]")
            assert f"{stuck:#08x}" in page.inner_text("body") or f"{stuck:#x}" in page.inner_text("body")

            # The line done: quiet for --settle seconds after the first flash's last end. Waited
            # for, since a next flash started sooner is the same round of the line (CI saw one
            # "line done" for both flashes, 16 runs, once the report came quickly).
            wait_for(lambda: any("line done" in t for t in receiver.titles()), 60, "the first flash's line done")

            # The next flash resumes the killed boards; the page shows them succeeding.
            page.goto(base)
            watch = Watcher(page)
            second = lab.fleet_popen("flash", str(fleet_image), "--where", "line=a", "--yes")
            watch.until(lambda: second.poll() is not None and all(
                watch.rows.get(p, {}).get("state") == "succeeded" and watch.rows[p]["job"] == "resume"
                for p in killed), 300, "the resumed runs to succeed on the page")
            again = FleetOutcome.parse(second.returncode, *second.communicate())
            for place in killed:
                assert again.boards[place]["job"] == "resume" and watch.rows[place]["run"] == again.boards[place][
                    "run_id"]
            assert ("running" in {s for (p, s) in watch.first if p in killed})     # seen running, live
            page.goto(base)
            lab_shot = lab.root / "line.png"
            page.screenshot(path=str(lab_shot), full_page=True)

        # The webhook: the failure, and the line done (twice: each flash).
        try:
            wait_for(lambda: sum("line done" in t for t in receiver.titles()) >= 2, 60, "two line-done messages")
        except TimeoutError as e:
            raise TimeoutError(f"{e}; the webhook got {receiver.got}") from None
        failure = [m for m in receiver.got if failed_run in m["title"]]
        assert len(failure) == 1 and "failed on hostb" in failure[0]["title"]
        assert "https://view.example/runs/" in failure[0]["message"] and f"{failed_run}.html" in failure[0]["message"]
        # ... saying what its report says of its end: the flash's state, the backup, the next step there
        assert "\nstate: " in failure[0]["message"] and "\nnext: on hostb: " in failure[0]["message"], failure
        for place in killed:
            [told] = [m["message"] for m in receiver.got if first.boards[place]["run_id"] in m["title"]]
            assert "\nnext: on hosta: " in told and "amdflash resume " in told, told
        done = next(m for m in receiver.got if "line done" in m["title"])
        assert "8 run(s) ended" in done["message"] and "1 failed" in done["message"] \
            and "4 interrupted" in done["message"] and failed_run in done["message"]

        # /metrics counts the runs `fleet runs` lists.
        from prometheus_client.parser import text_string_to_metric_families
        import urllib.request

        def same() -> bool:
            listed: dict[tuple[str, str], int] = {}
            for run in json.loads(lab.amdflash("fleet", "runs", "--from", viewer, "--format", "json").stdout):
                listed[(run["host"], run["status"])] = listed.get((run["host"], run["status"]), 0) + 1
            with urllib.request.urlopen(base + "metrics", timeout=10) as r:
                text = r.read().decode()
            metric = next(f for f in text_string_to_metric_families(text) if f.name == "amdflash_runs")
            counted = {(s.labels["host"], s.labels["status"]): int(s.value) for s in metric.samples}
            trails = sum(len(json.loads(lab.amdflash("--db", str(h.db), "runs", "--format", "json").stdout))
                         for h in lab.hosts.values())
            return counted == listed and sum(listed.values()) == trails

        wait_for(same, 90, "/metrics to count what fleet runs lists, every run pushed", interval=2.0)
    finally:
        receiver.close()
        for log in ("serve.log", "follow-hosta.log", "follow-hostb.log"):
            text = (lab.root / log).read_text() if (lab.root / log).exists() else ""
            assert "Traceback" not in text, f"{log}:\n{text}"


@pytest.mark.wall_clock   # wall seconds: CI runs it on its own (pytest -m wall_clock -n 0)
def test_sixty_four_boards_paint_within_1_s_and_their_updates_arrive_within_2_s(tmp_path: Path) -> None:
    """Issue 22's scale target, measured as tests/bench/bench_line_view.py measures it (and
    prints the same table): 64 emulated boards over 4 exporters flash at once while Chromium
    watches `fleet serve`. The first paint is the browser's own first-contentful-paint time of
    the page loaded afresh with 3/4 of the boards running; an update's latency runs from the
    event (an end: when the host's trail recorded it; progress: when the host's follow service
    read it) to the first moment the open page showed it. The jobs run at low CPU priority
    (Lab's jobs_nice): each carries an emulated board, whose CPU is work a real board does in
    its own silicon on another machine."""
    import statistics

    from tests.bench.bench_line_view import FIRST_PAINT_TARGET, UPDATE_TARGET, measure, p95
    from tests.pipeline.fleet.lab import missing
    from tests.pipeline.fleet.pgcluster import server_binaries

    why = missing() or (None if server_binaries() else "no PostgreSQL server")
    if why:
        pytest.skip(why)
    result = measure(tmp_path, boards=16, hosts=4, report=print)
    print(result.describe())
    assert result.boards == 64 and len(result.end_latencies) == 64, result.describe()   # every end was shown
    assert result.first_paint and statistics.median(result.first_paint) < FIRST_PAINT_TARGET, result.describe()
    assert statistics.median(result.load) < FIRST_PAINT_TARGET, result.describe()
    # "Within 2 s" is held at the 95th percentile, of every update and of the ends alone: a
    # wall-clock maximum over thousands of rows on a shared 2-core machine measures its worst
    # hiccup (the slowest seen: three first rows shown 3.3 s late while 64 SSH sessions started).
    assert len(result.latencies) > 10 * 64 and result.overtaken < 0.05 * result.rows, result.describe()
    assert p95(result.latencies) < UPDATE_TARGET, result.describe()
    assert p95(result.end_latencies) < UPDATE_TARGET, result.describe()
