"""`fleet serve` against what hosts write (issue 28, the view side): a progress row no reader
can take, a host's words in a notification, a restart or an outage between a failure and its
notification, a leftover running row, a request for another name, a malformed query, and
secrets on the command line. Each test is one attack, driven through the real server, reader,
notifier (Apprise to a local webhook and a local SMTP server) and command line."""
from __future__ import annotations

import email
import json
import os
import socketserver
import subprocess
import sys
import threading
import time

import pytest

from tests.pipeline.fleet.central_trail import psql
from tests.pipeline.fleet.lab import free_port, wait_for
from tests.pipeline.fleet.test_central import make_central
from tests.pipeline.fleet.test_central_trust import as_login, become, enrol, host_id
from tests.pipeline.fleet.test_serve import Receiver, _client, _rows, central, line_record  # noqa: F401 - fixtures
from tests.pipeline.engine.conftest import ROOT, cli_shown  # noqa: F401 - a fixture: the CLI without -q

psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed (pip install '.[test]' brings it)")
pytest.importorskip("starlette", reason="starlette is not installed (pip install '.[test]' brings it)")

RUN_A1, RUN_A2, RUN_B = "20261201T000000-aaaaaaa1", "20261201T000000-aaaaaaa2", "20261201T000000-bbbbbbb1"


@pytest.fixture
def two_hosts(cli, postgres, tmp_path, monkeypatch) -> dict:
    url = make_central(postgres)
    for name in ("hosta", "hostb"):
        become(monkeypatch, tmp_path, name)
        enrol(cli, url, tmp_path, name)
    return {"url": url, "a": host_id(url, "hosta"), "b": host_id(url, "hostb")}


def say(url: str, login: str, host: int, run_id: str | None, state: str, **extra) -> None:
    """A progress row as a host's push login inserts it (its clock: now)."""
    columns = {"host_id": host, "run_id": run_id, "state": state, "at": "now", **extra}
    with psycopg.connect(as_login(url, login), autocommit=True) as pg:
        pg.execute(f"INSERT INTO amdflash.progress ({', '.join(columns)}) VALUES "
                   f"({', '.join(['%s'] * len(columns))})", list(columns.values()))


def slip_in(url: str, host: int, **row) -> None:
    """A progress row the database's own checks would now refuse, stored as it was before they
    existed (a record set up earlier keeps such rows: its checks are NOT VALID): the model of a
    row that slipped through. As the administrator, the checks off for this one insert."""
    columns = {"host_id": host, "state": "running", "at": "now", **row}
    with psycopg.connect(url) as pg:
        pg.execute("ALTER TABLE amdflash.progress DISABLE TRIGGER progress_checked")
        for (name,) in pg.execute("SELECT conname FROM pg_constraint WHERE conrelid = 'amdflash.progress'::regclass "
                                  "AND contype = 'c' AND conname LIKE 'progress\\_%\\_checked'").fetchall():
            pg.execute(f"ALTER TABLE amdflash.progress DROP CONSTRAINT {name}")
        pg.execute(f"INSERT INTO amdflash.progress (id, received_at, sent_by, {', '.join(columns)}) VALUES "
                   f"(nextval('amdflash.progress_id'), clock_timestamp(), 'slipped', "
                   f"{', '.join(['%s'] * len(columns))})", list(columns.values()))
        pg.execute("ALTER TABLE amdflash.progress ENABLE TRIGGER progress_checked")
        pg.commit()
    psql(url, "NOTIFY amdflash_progress")


def _line(url: str, **options):
    from amdflash.pipeline.fleet.serve.line import Line

    # These rows have no signed end in the record, so a failure's notification goes out after
    # end_wait without its end's words (the default, 10 s, is a service's): not what these tests
    # are about (test_serve.py's notifications wait for ends that come).
    options.setdefault("end_wait", 1.0)
    line = Line(url, log=lambda m: None, **options)
    line.start()
    wait_for(lambda: line.version > 0, 30, "the line to load")
    return line


def _serve(url: str, tmp_path, *options: str) -> tuple[subprocess.Popen, str]:
    """`fleet serve` as a process, as a reviewer login; (process, base URL) once it answers."""
    import httpx

    viewer = f"viewer_{os.getpid()}_{time.monotonic_ns()}"   # roles are the cluster's, shared by every test database
    psql(url, f"CREATE ROLE {viewer} LOGIN IN ROLE amdflash_read")
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    server = subprocess.Popen([sys.executable, "-m", "amdflash.pipeline.cli", "fleet", "serve", "--from",
                               as_login(url, viewer), "--listen", f"127.0.0.1:{port}", "--state-dir",
                               str(tmp_path / "state"), *options], env=env,
                              stdout=(tmp_path / "serve.log").open("w"), stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}/"

    def up() -> bool:
        try:
            return httpx.get(base, timeout=2).status_code == 200
        except httpx.HTTPError:
            return server.poll() is not None
    wait_for(up, 60, "fleet serve to answer")
    assert server.poll() is None, (tmp_path / "serve.log").read_text()
    return server, base


def _first_event(base: str) -> dict:
    import httpx

    with httpx.stream("GET", base + "events", timeout=30) as stream:
        for line in stream.iter_lines():
            if line.startswith("data:"):
                return json.loads(line[5:])
    raise AssertionError("the live stream ended before its first event")


# -- attacks 2 and 3: a row no reader can take --------------------------------------------------

def test_a_row_with_an_infinite_rate_or_time_is_shown_unreadable_and_the_rest_of_the_line_stays(two_hosts,
                                                                                                 tmp_path):
    """hostb's rows say rate Infinity, rate NaN and at 'infinity' (year 10000 too): `GET /` still
    answers 200 for every viewer, the stream still streams, those rows say unreadable, and hosta's
    real failure is on the page."""
    import httpx

    h = two_hosts
    say(h["url"], "hosta", h["a"], RUN_A1, "failed", board="sim:/a/0", place="hosta-sim-0", command="flash",
        error="verify of unit 0x002000 failed")
    slip_in(h["url"], h["b"], run_id=RUN_B, board="sim:/b/0", place="hostb-sim-0", rate="Infinity",
            bytes_done=1, bytes_total=2)
    slip_in(h["url"], h["b"], run_id=RUN_B, board="sim:/b/1", place="hostb-sim-1", rate="NaN",
            bytes_done=1, bytes_total=2)
    slip_in(h["url"], h["b"], run_id=RUN_B, board="sim:/b/2", place="hostb-sim-2", at="infinity")
    slip_in(h["url"], h["b"], run_id=RUN_B, board="sim:/b/3", place="hostb-sim-3", at="10000-01-01T00:00:00Z")
    server, base = _serve(h["url"], tmp_path)
    try:
        page = httpx.get(base, timeout=10)
        assert page.status_code == 200
        rows = {r["place"]: r["state"] for r in _rows(page.text)}
        assert rows == {"hosta-sim-0": "failed", "hostb-sim-0": "unreadable", "hostb-sim-1": "unreadable",
                        "hostb-sim-2": "unreadable", "hostb-sim-3": "unreadable"}, rows
        assert "rate inf is not a finite number" in page.text and "at (the host&#x27;s clock, inf s" in page.text
        assert "5 board(s)" in page.text and "central database:" not in page.text
        event = _first_event(base)
        assert "hosta-sim-0" in event["rows"] and event["rows"].count('data-state="unreadable"') == 4
        # a row that slips in while the page is served: the stream carries it, and still serves
        slip_in(h["url"], h["b"], run_id=RUN_B, board="sim:/b/4", place="hostb-sim-4", eta="Infinity")
        wait_for(lambda: "hostb-sim-4" in httpx.get(base, timeout=10).text, 15, "the new row")
        assert _first_event(base)["rows"].count('data-state="unreadable"') == 5
    finally:
        server.terminate()
        server.wait(30)
    assert "Traceback" not in (tmp_path / "serve.log").read_text()


@pytest.mark.slow
def test_a_failure_is_notified_once_through_an_unreadable_row_a_restart_and_an_outage(two_hosts, tmp_path):
    """Notifications are decided from the record's rows in order, what was sent kept in the state
    directory: a row no reader can take does not stop them, a failure while the serve was stopped
    is sent when it starts again, and nothing is sent twice."""
    from amdflash.pipeline.fleet.serve.notify import Notifier

    h = two_hosts
    state = tmp_path / "state" / "notified.json"
    receiver = Receiver()

    def failures() -> list[str]:
        return [t for t in receiver.titles() if t.startswith("amdflash: run ")]

    line = _line(h["url"], notifier=Notifier([receiver.url], lambda m: None), state=state)
    try:
        slip_in(h["url"], h["b"], run_id=RUN_B, board="sim:/b/0", place="hostb-sim-0", at="infinity")
        say(h["url"], "hosta", h["a"], RUN_A1, "failed", board="sim:/a/0", place="hosta-sim-0", error="stuck bit")
        wait_for(lambda: failures(), 20, "hosta's failure notified")
    finally:
        line.close()
    assert state.stat().st_mode & 0o777 == 0o600
    # stopped (or central out of reach): a failure meanwhile
    say(h["url"], "hosta", h["a"], RUN_A2, "interrupted", board="sim:/a/1", place="hosta-sim-1")
    for _ in range(2):     # started again, twice: the missed one once, the first never again
        line = _line(h["url"], notifier=Notifier([receiver.url], lambda m: None), state=state)
        try:
            wait_for(lambda: any(RUN_A2 in t for t in failures()), 20, "the failure while stopped notified")
            time.sleep(2.5)
        finally:
            line.close()
    receiver.close()
    assert sorted(failures()) == sorted([f"amdflash: run {RUN_A1} failed on hosta (hosta-sim-0)",
                                         f"amdflash: run {RUN_A2} interrupted on hosta (hosta-sim-1)"])


# -- attack 4: notifications carry what a host says ----------------------------------------------

class SmtpSink:
    """A local SMTP server: every message delivered to it, as bytes."""

    def __init__(self) -> None:
        got = self.got = []

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                self.wfile.write(b"220 sink\r\n")
                data: list[bytes] | None = None
                while line := self.rfile.readline():
                    if data is not None:
                        if line.rstrip(b"\r\n") == b".":
                            got.append(b"".join(data))
                            data = None
                            self.wfile.write(b"250 ok\r\n")
                        else:
                            data.append(line[1:] if line.startswith(b"..") else line)
                        continue
                    verb = line[:4].upper()
                    self.wfile.write({b"DATA": b"354 go\r\n", b"QUIT": b"221 bye\r\n"}.get(verb, b"250 ok\r\n"))
                    if verb == b"DATA":
                        data = []
                    elif verb == b"QUIT":
                        return

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.url = (f"mailto://127.0.0.1:{self.server.server_address[1]}?from=line@example.org&to=ops@example.org"
                    "&mode=insecure")
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


def test_a_notification_carries_only_the_records_checked_words_as_plain_text(two_hosts, tmp_path):
    """hostb's row claims, in its run id, that hosta's run succeeded, with a newline; its place holds
    a bidi override and ESC; its error a link and a remote image. The webhook's title and the
    e-mail name hostb (as the record knows the row's host), no run id that is not one, no control
    character; the e-mail is plain text only (no HTML part to render the link or load the image)."""
    from amdflash.pipeline.fleet.serve.notify import Notifier

    h = two_hosts
    receiver, smtp = Receiver(), SmtpSink()
    line = _line(h["url"], notifier=Notifier([receiver.url, smtp.url], lambda m: None), state=None)
    try:
        slip_in(h["url"], h["b"], run_id=f"{RUN_A1} succeeded on hosta (fixed)\n", state="failed",
                board="sim:/b/0", place="b0\u202eevil\x1b[2J", command="flash",
                error='<a href="https://evil.example/">fix it</a><img src="https://evil.example/x.png">')
        wait_for(lambda: receiver.got and smtp.got, 20, "the failure notified by webhook and e-mail")
    finally:
        line.close()
        receiver.close()
        smtp.close()
    title, message = receiver.got[0]["title"], receiver.got[0]["message"]
    for text in (title, message):
        assert not any(c in text for c in "\u202e\x1b\r"), repr(text)
    assert "\n" not in title and "succeeded" not in title and RUN_A1 not in title, title
    assert title == "amdflash: run (not a run id) failed on hostb (b0\\u202eevil\\x1b[2J)"
    mail = email.message_from_bytes(smtp.got[0])
    assert [p.get_content_type() for p in mail.walk()] == ["text/plain"]
    assert "hostb" in mail["Subject"] and "succeeded" not in mail["Subject"]
    text = mail.get_payload(decode=True).decode()
    assert '<a href="https://evil.example/">' in text      # what the host wrote, as words, never a link


@pytest.mark.slow
def test_a_host_speaks_only_for_its_own_runs(request):
    """hostb says a run under hosta's pushed run id failed: a run is named by its host and run id,
    so that is hostb's own run (and its own failure, notified naming hostb, linking hostb's run);
    hosta's run of that id keeps its signed status and nothing is said of it (issue 41 item 1)."""
    from amdflash.pipeline.fleet.serve.notify import Notifier

    r = request.getfixturevalue("line_record")
    receiver = Receiver()
    line = _line(r["url"], notifier=Notifier([receiver.url], lambda m: None))
    try:
        say(r["url"], "hosta", r["a"], r["ok"], "succeeded", board="sim:/a/0", place="hosta-sim-0")
        say(r["url"], "hostb", r["b"], r["ok"], "failed", board="sim:/b/9", place="hostb-sim-9", error="it broke")
        wait_for(lambda: any(f"run {r['ok']} failed on hostb" in t for t in receiver.titles()), 20,
                 "hostb's failure notified as its own")
        with _client(line, r["url"]) as client:
            page = client.get("/").text
    finally:
        line.close()
        receiver.close()
    told = next(m for m in receiver.got if f"run {r['ok']} failed on hostb" in m["title"])
    assert f"runs/{r['b']}/{r['ok']}.html" in told["message"], told
    assert not any("on hosta" in m["title"] for m in receiver.got), receiver.got
    states = {x["place"]: x["state"] for x in _rows(page)}
    assert states["hosta-sim-0"] == "succeeded" and states["hostb-sim-9"] == "failed", states
    assert "another host" not in page


# -- attack 11: a leftover running row --------------------------------------------------------

@pytest.mark.slow
def test_a_leftover_running_row_does_not_hold_the_line_done_back(two_hosts):
    """hosta's board said running once and never again; hostb's run ran and succeeded. Once the
    leftover is older than stale_after, the line is done (and says which it did not wait for)."""
    from amdflash.pipeline.fleet.serve.notify import Notifier

    h = two_hosts
    receiver = Receiver()
    say(h["url"], "hosta", h["a"], RUN_A1, "running", board="sim:/a/0", place="hosta-sim-0")
    line = _line(h["url"], notifier=Notifier([receiver.url], lambda m: None), settle=0.5, stale_after=3.0)
    try:
        say(h["url"], "hostb", h["b"], RUN_B, "running", board="sim:/b/0", place="hostb-sim-0")
        say(h["url"], "hostb", h["b"], RUN_B, "succeeded", board="sim:/b/0", place="hostb-sim-0")
        wait_for(lambda: any("line done" in t for t in receiver.titles()), 20, "the line done")
        done = next(m for m in receiver.got if "line done" in m["title"])
        assert "1 run(s) ended: 1 succeeded" in done["message"]
        assert "1 board(s) said running but nothing for over 3 s: not waited for" in done["message"]
    finally:
        line.close()
        receiver.close()


# -- attack 12: another Host:, a malformed query -------------------------------------------------

@pytest.mark.slow
def test_serve_answers_only_its_own_names_and_refuses_a_malformed_query(two_hosts, tmp_path):
    import httpx

    h = two_hosts
    line = _line(h["url"])
    try:
        with _client(line, h["url"]) as client:
            assert client.get("/", headers={"host": "rebound.attacker.example"}).status_code == 400
            assert client.get("/metrics", headers={"host": "rebound.attacker.example:8470"}).status_code == 400
            assert client.get("/", headers={"host": "localhost:8470"}).status_code == 200
            for query, field in (({"board": "a\x00b"}, "board"), ({"since": "not-a-date"}, "since"),
                                 ({"until": "2026-13-45"}, "until"), ({"status": "pwned"}, "status")):
                got = client.get("/history", params=query)
                assert got.status_code == 400 and got.text.startswith(f"history: {field}"), (query, got.text)
            assert client.get("/runs/99999999999/20260101T000000-00000000.html").status_code == 404
    finally:
        line.close()
    server, base = _serve(h["url"], tmp_path, "--allowed-host", "line.example.org")
    try:
        assert httpx.get(base, headers={"host": "line.example.org"}, timeout=10).status_code == 200
        assert httpx.get(base, headers={"host": "localhost"}, timeout=10).status_code == 200
        assert httpx.get(base, headers={"host": "rebound.attacker.example"}, timeout=10).status_code == 400
        assert httpx.get(base + "history?board=%00", timeout=10).status_code == 400
    finally:
        server.terminate()
        server.wait(30)
    assert "Traceback" not in (tmp_path / "serve.log").read_text()


# -- attack 9: secrets in messages and on the command line ---------------------------------------

def test_notify_and_from_urls_are_masked_and_may_come_from_a_file_or_the_environment(cli, postgres, tmp_path,
                                                                                      monkeypatch, request):
    url = make_central(postgres)
    shown = request.getfixturevalue("cli_shown")     # without -q: notes too
    secret = "nosuchservice://ops:hunter2@hooks.example.org/T0KEN123?key=S3CRET"
    bad = shown("fleet", "serve", "--from", url, "--notify", secret)
    assert bad.code == 2 and "not a notification URL" in bad.err
    assert "hunter2" not in bad.err + bad.out and "T0KEN123" not in bad.err + bad.out and "S3CRET" not in bad.err
    assert "nosuchservice://***@hooks.example.org/***" in bad.err
    assert "seen by every local user (ps)" in bad.err                  # said, for a URL on the command line
    urls = tmp_path / "notify.urls"
    urls.write_text(f"# the line's notifications\n\n{secret}\n")
    urls.chmod(0o600)
    bad = shown("fleet", "serve", "--from", url, "--notify-file", urls)
    assert bad.code == 2 and "nosuchservice://***@hooks.example.org/***" in bad.err and "hunter2" not in bad.err
    assert "(ps)" not in bad.err
    monkeypatch.setenv("AMDFLASH_NOTIFY", f"json://127.0.0.1:9/ok {secret}")
    bad = cli("fleet", "serve", "--from", url)
    assert bad.code == 2 and "nosuchservice://***@hooks.example.org/***" in bad.err and "hunter2" not in bad.err
    monkeypatch.delenv("AMDFLASH_NOTIFY")
    url_file = tmp_path / "central.url"
    url_file.write_text(f"{url}\n")
    bad = cli("fleet", "serve", "--from-file", url_file, "--state-dir", tmp_path / "state")
    assert bad.code == 2 and "is a superuser" in bad.err                # the URL was read from the file
    bad = cli("fleet", "serve", "--from", "mysql://ops:hunter2@db.example.org/line")
    assert bad.code == 2 and "hunter2" not in bad.err and "mysql://***@db.example.org/***" in bad.err
