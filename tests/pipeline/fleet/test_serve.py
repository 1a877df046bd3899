"""`amdflash fleet serve` (issue 22): the line's read-only web view over the central record — the
line at a glance, run pages, history, health, /metrics, live updates and notifications."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from tests.pipeline.fleet.central_trail import psql
from tests.pipeline.fleet.lab import free_port, wait_for
from tests.pipeline.fleet.test_central import make_central, push
from tests.pipeline.fleet.test_central_trust import as_login, become, enrol, host_id
from tests.pipeline.fleet.test_live import insert
from tests.pipeline.engine.conftest import ROOT

psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed (pip install '.[test]' brings it)")
pytest.importorskip("starlette", reason="starlette is not installed (pip install '.[test]' brings it)")

HOSTILE = "<script>alert(1)</script>\"'><img src=x onerror=alert(2)>\u202e"
# What a host may store of it: the database refuses a control or format character (the bidi
# override) in any text a host writes (test_central_bounds.py).
STORABLE = HOSTILE.replace("\u202e", "")
LIVE_ONLY = "20260101T000000-abcdef03"      # a run the record does not hold (the host's word only)


@pytest.fixture
def central(postgres) -> str:
    return make_central(postgres)


def _flash(cli, board, image, *extra) -> str:
    cli("flash", image, "--yes", "--sector-count", "16", *extra, "--board", f"sim:{board}")
    return json.loads(cli("runs", "--format", "json").out)[-1]["run_id"]


@pytest.fixture
def line_record(cli, make_board, image, central, tmp_path, monkeypatch):
    """Two hosts in the record: hosta's flash succeeded, hostb's failed on a stuck bit (both
    pushed), and hostb has another run that was never pushed."""
    become(monkeypatch, tmp_path, "hosta")
    enrol(cli, central, tmp_path, "hosta")
    ok = _flash(cli, make_board(transport="ideal"), image)
    assert push(cli, as_login(central, "hosta"))[0].code == 0
    become(monkeypatch, tmp_path, "hostb")
    enrol(cli, central, tmp_path, "hostb")
    img = image.read_bytes()
    stuck = next(a for a in range(0x10000, 0x20000) if not img[a] & 1)
    bad = _flash(cli, make_board(transport="ideal", faults=[f"stuck-bit={stuck:#x}:0"]), image, "--sector-count", "32")
    assert push(cli, as_login(central, "hostb"))[0].code == 0
    unpushed = _flash(cli, make_board(transport="ideal"), image)
    return {"url": central, "ok": ok, "bad": bad, "unpushed": unpushed, "a": host_id(central, "hosta"),
            "b": host_id(central, "hostb"), "stuck": stuck}


def _line(url: str, **options):
    from amdflash.pipeline.fleet.serve.line import Line

    line = Line(url, log=lambda m: None, **options)
    line.start()
    wait_for(lambda: line.version > 0, 30, "the line to load")
    return line


def _client(line, url: str):
    from starlette.testclient import TestClient

    from amdflash.pipeline.fleet.serve.app import app

    return TestClient(app(line, url), base_url="http://localhost")


def _rows(page: str) -> list[dict[str, str]]:
    return [dict(re.findall(r'data-([a-z]+)="([^"]*)"', tr)) for tr in re.findall(r"<tr class=[^>]*>", page)]


def test_the_line_shows_every_board_failures_first_and_escapes_what_the_record_says(line_record):
    r = line_record
    url, a, b = r["url"], r["a"], r["b"]
    insert(as_login(url, "hosta"), a, run_id=r["ok"], state="succeeded", board="sim:/a/0", place="hosta-sim-0",
           bytes_done=65536, bytes_total=65536, command="flash")
    insert(as_login(url, "hostb"), b, run_id=r["bad"], state="failed", board="sim:/b/0", place="hostb-sim-0",
           error=STORABLE, command="flash")
    # (the database refuses a run id or place not of their shape: HOSTILE goes where free text may)
    insert(as_login(url, "hostb"), b, run_id=LIVE_ONLY, state="running", board="sim:/b/1",
           place="hostb-sim-1", stage=STORABLE, bytes_done=4096, bytes_total=8192, rate=1000.0, eta=4.1,
           command="flash")
    insert(as_login(url, "hostb"), b, run_id=r["unpushed"], state="interrupted", board="sim:/b/2",
           place="hostb-sim-2", error="no end recorded and its process is gone", command="flash")
    line = _line(url)
    try:
        with _client(line, url) as client:
            got = client.get("/")
        assert got.status_code == 200
        assert "script-src 'self'" in got.headers["content-security-policy"]
        page = got.text
        rows = _rows(page)
        assert [x["state"] for x in rows] == ["failed", "interrupted", "running", "succeeded"], rows
        by_run = {x["run"]: x for x in rows}
        # The signed record's verdict where the run was pushed; the host's live word otherwise.
        assert by_run[r["bad"]]["source"] == "signed" and by_run[r["ok"]]["source"] == "signed"
        assert by_run[r["unpushed"]]["source"] == "live"
        assert "<script>alert" not in page and "<img src=x" not in page and "\u202e" not in page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
        # Links only to its own pages: a run id of the run-id shape with the host's id, never a recorded value.
        hrefs = set(re.findall(r'(?:href|src)="([^"]*)"', page))
        own = {"./", "history", "health", "static/line.js", f"runs/{a}/{r['ok']}.html", f"runs/{b}/{r['bad']}.html",
               f"runs/{b}/{r['unpushed']}.html", f"runs/{b}/{LIVE_ONLY}.html"}
        assert hrefs == own, hrefs - own
        assert "<progress value=\"4096\" max=\"8192\">" in page and "4 s" in page    # bar and ETA
        assert "<noscript>" in page          # the page is whole without JavaScript
    finally:
        line.close()


def test_a_run_page_is_its_report_checked_again_against_the_enrolled_key(line_record):
    r = line_record
    line = _line(r["url"])
    try:
        with _client(line, r["url"]) as client:
            page = client.get(f"/runs/{r['b']}/{r['bad']}.html")
            assert page.status_code == 200
            assert "verified here" in page.text and "against the host's enrolled key" in page.text
            assert 'data-field="status-badge">failed' in page.text.replace("\n", "")
            assert "signature: verified against the given key" in page.text.replace("</th><td>", ": ") or \
                "verified against the given key" in page.text
            wrong_host = client.get(f"/runs/{r['a']}/{r['bad']}.html")       # the run is hostb's
            assert wrong_host.status_code == 404 and "no run" in wrong_host.text
            waiting = client.get(f"/runs/{r['b']}/{r['unpushed']}.html")     # not pushed yet
            assert waiting.status_code == 404 and "once its host has pushed it" in waiting.text
            assert client.get("/runs/1/..%2F..%2Fetc%2Fpasswd").status_code == 404
            assert client.get("/runs/1/x.html").status_code == 404
    finally:
        line.close()


def test_history_filters_by_host_board_status_part_and_date(line_record, cli):
    r = line_record
    line = _line(r["url"])

    def shown(**query) -> list[str]:
        page = client.get("/history", params=query).text
        return re.findall(r'<tr data-run="([^"]+)"', page)

    try:
        with _client(line, r["url"]) as client:
            everything = shown()
            assert set(everything) >= {r["ok"], r["bad"]} and r["unpushed"] not in everything
            assert r["ok"] in shown(host="hosta") and r["bad"] not in shown(host="hosta")
            assert shown(status="failed") == [r["bad"]]
            assert set(shown(part="SYNTH")) == {r["ok"], r["bad"]} and shown(part="NO-SUCH-PART") == []
            board = json.loads(cli("fleet", "runs", "--from", r["url"], "--format", "json").out)
            spec = next(x["board_spec"] for x in board if x["run_id"] == r["ok"])
            assert shown(board=spec[-8:]) == [r["ok"]]
            assert shown(since="2000-01-01") == everything and shown(until="2000-01-01") == []
            page = client.get("/history", params={"host": HOSTILE, "board": HOSTILE}).text
            assert "<script>alert" not in page and "no run matches" in page
    finally:
        line.close()


def test_health_says_each_hosts_last_push_and_lag(line_record):
    r = line_record
    insert(as_login(r["url"], "hostb"), r["b"], run_id=None, state="alive", checkpoint=10_000)
    line = _line(r["url"])
    try:
        with _client(line, r["url"]) as client:
            page = client.get("/health").text
        rows = dict(re.findall(r'<tr data-host="([^"]+)">(.*?)</tr>', page))
        assert set(rows) == {"hosta", "hostb"}
        assert "verified by the central database at every push, through #" in rows["hosta"]
        assert "checkpoint(s) not pushed yet" in rows["hostb"]        # the host said it has more
    finally:
        line.close()


def test_metrics_count_what_fleet_runs_lists(line_record, cli):
    from prometheus_client.parser import text_string_to_metric_families

    r = line_record
    line = _line(r["url"])
    try:
        with _client(line, r["url"]) as client:
            text = client.get("/metrics").text
    finally:
        line.close()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    counted = {(s.labels["host"], s.labels["status"]): int(s.value) for s in families["amdflash_runs"].samples}
    listed: dict[tuple[str, str], int] = {}
    for run in json.loads(cli("fleet", "runs", "--from", r["url"], "--format", "json").out):
        listed[(run["host"], run["status"])] = listed.get((run["host"], run["status"]), 0) + 1
    assert counted == listed and sum(counted.values()) >= 2
    written = {s.labels["host"]: s.value for s in families["amdflash_bytes_written"].samples
               if s.name.endswith("_total")}
    assert written["hosta"] > 0
    assert {s.labels["command"] for s in families["amdflash_run_seconds"].samples} >= {"flash"}
    assert "amdflash_push_lag_seconds" in families and "amdflash_boards_in_progress" in families


class Receiver:
    """A local webhook: every JSON body posted to it."""

    def __init__(self) -> None:
        got = self.got = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"json://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def titles(self) -> list[str]:
        return [m["title"] for m in self.got]

    def close(self) -> None:
        self.server.shutdown()


@pytest.mark.slow
def test_notifications_reach_a_webhook(line_record):
    """A run failed, a host silent too long, the line done — each once, with links to the reports."""
    from amdflash.pipeline.fleet.serve.notify import Notifier

    r = line_record
    url = r["url"]
    receiver = Receiver()
    insert(as_login(url, "hosta"), r["a"], run_id=None, state="alive")
    time.sleep(1.5)
    line = _line(url, notifier=Notifier([receiver.url], lambda m: None), settle=1.0, silent_after=1.0,
                 public_url="https://line.example/")
    try:
        insert(as_login(url, "hostb"), r["b"], run_id=r["bad"], state="running", board="sim:/b/0", place="hostb-b0")
        insert(as_login(url, "hosta"), r["a"], run_id=r["ok"], state="running", board="sim:/a/0", place="hosta-a0")
        insert(as_login(url, "hostb"), r["b"], run_id=r["bad"], state="failed", board="sim:/b/0", place="hostb-b0",
               error="verify of unit 0x002000 failed")
        insert(as_login(url, "hosta"), r["a"], run_id=r["ok"], state="succeeded", board="sim:/a/0", place="hosta-a0")
        wait_for(lambda: any("line done" in t for t in receiver.titles()), 30, "the line-done message")
        failed = [m for m in receiver.got if r["bad"] in m["title"]]
        assert len(failed) == 1 and "failed on hostb (hostb-b0)" in failed[0]["title"]
        assert f"https://line.example/runs/{r['b']}/{r['bad']}.html" in failed[0]["message"]
        assert "verify of unit 0x002000 failed" in failed[0]["message"]
        done = next(m for m in receiver.got if "line done" in m["title"])
        assert "2 run(s) ended: 1 failed, 1 succeeded" in done["message"]
        assert f"https://line.example/runs/{r['b']}/{r['bad']}.html" in done["message"]
        # hosta said nothing after its heartbeat (the other rows came later): silent
        wait_for(lambda: any("silent" in t for t in receiver.titles()), 30, "a silent host")
        time.sleep(2.5)
        assert sum("line done" in t for t in receiver.titles()) == 1       # once, not at every tick
        assert sum(r["bad"] in t for t in receiver.titles()) == 1
    finally:
        line.close()
        receiver.close()


@pytest.mark.wall_clock   # its 2-second target: CI runs it on its own (pytest -m wall_clock -n 0)
def test_the_live_stream_brings_a_change_within_two_seconds(line_record, tmp_path):
    """`fleet serve` as a process: a progress row inserted by a host reaches an /events listener
    (the browser's EventSource) within two seconds."""
    import httpx

    r = line_record
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    log = tmp_path / "serve.log"
    viewer = f"viewer_{os.getpid()}_{time.monotonic_ns()}"   # roles are the cluster's, shared by every test database
    psql(r["url"], f"CREATE ROLE {viewer} LOGIN IN ROLE amdflash_read")
    server = subprocess.Popen([sys.executable, "-m", "amdflash.pipeline.cli", "fleet", "serve", "--from",
                               as_login(r["url"], viewer), "--state-dir", str(tmp_path / "state"),
                               "--listen", f"127.0.0.1:{port}"], env=env, stdout=log.open("w"),
                              stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}/"

        def up() -> bool:
            try:
                return httpx.get(base, timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, 60, "fleet serve to answer")
        started = time.monotonic()
        assert httpx.get(base, timeout=5).status_code == 200
        assert time.monotonic() - started < 1.0                    # the first paint's document
        arrived: list[float] = []
        with httpx.stream("GET", base + "events", timeout=30) as stream:
            sent = None
            for line in stream.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = json.loads(line[5:])
                if sent is None:
                    sent = time.monotonic()
                    insert(as_login(r["url"], "hosta"), r["a"], run_id="20260101T000000-abcdef01", state="running",
                           board="sim:/a/9", place="hosta-a9", stage="erase", bytes_done=1, bytes_total=2)
                elif "hosta-a9" in data["rows"]:
                    arrived.append(time.monotonic() - sent)
                    break
        assert arrived and arrived[0] < 2.0, arrived
    finally:
        server.terminate()
        server.wait(30)
    assert "Traceback" not in log.read_text(), log.read_text()


def test_serve_checks_its_options_and_its_login_before_listening(cli, central, tmp_path, monkeypatch):
    bad = cli("fleet", "serve", "--from", central, "--listen", "nowhere")
    assert bad.code == 2 and "HOST:PORT" in bad.err
    bad = cli("fleet", "serve", "--from", central, "--notify", "notascheme")
    assert bad.code == 2 and "not a notification URL" in bad.err
    # read role only: a superuser or a push login is refused before anything listens
    bad = cli("fleet", "serve", "--from", central)
    assert bad.code == 2 and "is a superuser" in bad.err and "amdflash_read" in bad.err
    become(monkeypatch, tmp_path, "hosta")
    enrol(cli, central, tmp_path, "hosta")
    bad = cli("fleet", "serve", "--from", as_login(central, "hosta"))
    assert bad.code == 2 and "push login" in bad.err



@pytest.mark.slow
def test_a_failure_s_notification_and_row_repeat_its_end_as_fleet_report_tells_it(cli, line_record):
    """Issue 27 item 1: the notification of a failed run, and its row on the line, repeat what the
    run's report says of its end, from the signed record: the state the flash is in, the backup
    with the command that puts it back, and the next step on its host."""
    import html

    from amdflash.pipeline.commands.run_end import backup_words
    from amdflash.pipeline.fleet.serve.notify import Notifier

    r = line_record
    url = r["url"]
    there = json.loads(cli("fleet", "report", f"hostb/{r['bad']}", "--from", url, "--format", "json").out)
    end = there["outcome"]
    assert there["status"] == "failed" and end["next_step"].startswith("on hostb: ") and end["state"], there
    said = [f"state: {end['state']}", f"backup: {backup_words(end)}", f"next: {end['next_step']}"]
    receiver = Receiver()
    line = _line(url, notifier=Notifier([receiver.url], lambda m: None), settle=1.0)
    try:
        insert(as_login(url, "hostb"), r["b"], run_id=r["bad"], state="failed", board="sim:/b/0", place="hostb-b0",
               error="verify of unit 0x010000 failed", command="flash")
        wait_for(lambda: any(r["bad"] in t for t in receiver.titles()), 30, "the failure notified")
        [message] = [m["message"] for m in receiver.got if r["bad"] in m["title"]]
        for words in said:
            assert words in message, message
        wait_for(lambda: 'data-field="end"' in _client(line, url).get("/").text, 30, "the end on the line")
        [row] = [tr for tr in _client(line, url).get("/").text.split("<tr ") if f'data-run="{r["bad"]}"' in tr]
        shown = html.unescape(row.split('data-field="end">')[1].split("</div>")[0]).split("<br>")
        assert shown == said, shown
    finally:
        line.close()
        receiver.close()


def test_a_run_page_that_does_not_verify_names_the_check_on_its_host_not_this_server_s_copy(line_record,
                                                                                           monkeypatch):
    """A run that does not verify here (forged after its push, or its host's key changed) is
    shown NOT verified, saying what does not match: its check is `audit verify` on its host,
    not one naming the temporary copy this server checked (which the message of a run that
    does not verify names since it carries --db)."""
    from amdflash.store import run_rows
    from amdflash.store.verify import VerifyReport

    def broken(conn, run_id, keyfiles=None):
        report = VerifyReport(False, f"run {run_id}")
        report.problem, report.key = "checkpoint #2 (commit of run x): its hash does not match", 1
        return report

    monkeypatch.setattr(run_rows, "verify_run", broken)
    r = line_record
    line = _line(r["url"])
    try:
        with _client(line, r["url"]) as client:
            page = client.get(f"/runs/{r['b']}/{r['bad']}.html")
    finally:
        line.close()
    assert page.status_code == 409 and "NOT verified" in page.text, page.text
    assert "its hash does not match" in page.text
    assert f"amdflash audit verify --run {r['bad']} on hostb checks its own trail" in page.text, page.text
    assert "--db" not in page.text and "amdflash-serve-" not in page.text
