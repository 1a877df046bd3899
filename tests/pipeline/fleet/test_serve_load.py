"""`fleet serve` against one local user (issue 41, items 3 and 5): idle and half-sent
connections, a flood of malformed requests, accept errors, many live streams, a notification
service that is down (across a restart), and a state directory another user could steer.
Each through the real `fleet serve` process and PostgreSQL, on loopback only; the loops are
bounded in count and time. Figures (GET / times, log sizes) are printed: run with -s."""
from __future__ import annotations

import os
import resource
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from tests.pipeline.fleet.central_trail import psql
from tests.pipeline.fleet.lab import free_port, wait_for
from tests.pipeline.fleet.test_central_trust import as_login
from tests.pipeline.fleet.test_serve import central  # noqa: F401 - a fixture
from tests.pipeline.fleet.test_serve_untrusted import RUN_A1, say, two_hosts  # noqa: F401 - a fixture
from tests.pipeline.engine.conftest import ROOT

psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed (pip install '.[test]' brings it)")
pytest.importorskip("starlette", reason="starlette is not installed (pip install '.[test]' brings it)")
httpx = pytest.importorskip("httpx")

HEADER_TIMEOUT = 5.0        # what the serve gives a request's head (app.py says the same)


class Serve:
    """`fleet serve` as a process, as a reviewer login, with its own file-descriptor limit."""

    def __init__(self, url: str, tmp_path: Path, *options: str, nofile: int | None = None, name: str = "serve",
                 viewer: str | None = None):
        if viewer is None:          # a new login (roles are the cluster's); a restart takes the same one,
            viewer = f"viewer_{os.getpid()}_{time.monotonic_ns()}"     # whose state it is
            psql(url, f"CREATE ROLE {viewer} LOGIN IN ROLE amdflash_read")
        self.viewer = viewer
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}/"
        self.log = tmp_path / f"{name}.log"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}

        def limit() -> None:
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self.process = subprocess.Popen(
            [sys.executable, "-m", "amdflash.pipeline.cli", "fleet", "serve", "--from", as_login(url, viewer),
             "--listen", f"127.0.0.1:{self.port}", "--state-dir", str(tmp_path / "state"), *options],
            env=env, stdout=self.log.open("w"), stderr=subprocess.STDOUT, preexec_fn=limit)

        def up() -> bool:
            try:
                return httpx.get(self.base, timeout=2).status_code == 200
            except httpx.HTTPError:
                return self.process.poll() is not None
        wait_for(up, 60, "fleet serve to answer")
        assert self.process.poll() is None, self.log.read_text()

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def get(self, path: str = "", timeout: float = 10.0) -> tuple[int | None, float]:
        """(status or None when it did not answer in time, seconds)."""
        started = time.monotonic()
        try:
            status: int | None = httpx.get(self.base + path, timeout=timeout).status_code
        except httpx.HTTPError:
            status = None
        return status, time.monotonic() - started

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def _closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closed this connection (what it sent before, e.g. a 503, is read away)."""
    sock.setblocking(False)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except BlockingIOError:
        return False
    except OSError:          # reset
        return True


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


# -- item 3: idle and half-sent connections ------------------------------------------------------

@pytest.mark.slow
def test_idle_and_half_sent_connections_neither_take_the_view_down_nor_outlive_the_header_timeout(two_hosts,
                                                                                                  tmp_path):
    """Under a file-descriptor limit of 512, 600 idle sockets and 10 that send half a request and
    then one header line a second (slowloris): `GET /` still answers at once, and the server drops
    every one of them within a few seconds of the header timeout."""
    serve = Serve(two_hosts["url"], tmp_path, nofile=512)
    idle: list[socket.socket] = []
    half: list[socket.socket] = []
    try:
        baseline = serve.get()
        idle = [_connect(serve.port) for _ in range(600)]
        for _ in range(10):
            s = _connect(serve.port)
            s.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            half.append(s)
        time.sleep(0.5)
        status, took = serve.get()
        print(f"\nGET / {baseline[1]:.3f} s alone; with 610 idle or half-sent sockets under nofile 512: "
              f"{status} in {took:.3f} s")
        assert status == 200 and took < 3.0, (status, took)
        started = time.monotonic()
        while time.monotonic() - started < HEADER_TIMEOUT + 3:      # the slow ones keep sending
            for s in half:
                try:
                    s.sendall(b"X-Slow: 1\r\n")
                except OSError:
                    pass
            time.sleep(1.0)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not all(_closed_by_server(s) for s in idle + half):
            time.sleep(0.5)
        open_ = sum(not _closed_by_server(s) for s in idle + half)
        print(f"open after {time.monotonic() - started:.1f} s: {open_} of {len(idle) + len(half)}; "
              f"log {len(serve.text())} bytes")
        assert open_ == 0
        assert serve.get()[0] == 200 and serve.process.poll() is None
        assert len(serve.text()) < 20_000, serve.text()[-3000:]
    finally:
        for s in idle + half:
            s.close()
        serve.stop()
    assert "Traceback" not in serve.text()


@pytest.mark.slow
def test_accept_errors_are_logged_once_a_minute_with_a_count_not_flooded(two_hosts, tmp_path):
    """The process out of file descriptors (its limit lowered under it: what a reserve too small
    would do): accept fails again and again; the log says so in a line or two, not a line per
    attempt, and the view answers again once descriptors are free."""
    serve = Serve(two_hosts["url"], tmp_path)
    socks: list[socket.socket] = []
    pid = serve.process.pid
    before = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    try:
        used = len(os.listdir(f"/proc/{pid}/fd"))
        start = len(serve.text())
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (used, before[1]))
        socks = [_connect(serve.port) for _ in range(20)]
        time.sleep(5.0)
        grown = serve.text()[start:]
        print(f"\nout of descriptors for 5 s: the log grew {len(grown)} bytes, {grown.count(chr(10))} lines")
        resource.prlimit(pid, resource.RLIMIT_NOFILE, before)
        for s in socks:
            s.close()
        socks = []
        assert wait_for(lambda: serve.get(timeout=5)[0] == 200, 20, "the view to answer again")
        assert len(grown) < 5_000 and grown.count("out of system resource") <= 2, grown[:300]
    finally:
        for s in socks:
            s.close()
        serve.stop()


def test_a_flood_of_malformed_requests_is_logged_in_a_few_lines(two_hosts, tmp_path):
    """300 malformed requests in a row: one log line for them (and the count of those not
    logged), not 300."""
    serve = Serve(two_hosts["url"], tmp_path)
    try:
        start = len(serve.text())
        for _ in range(300):
            with _connect(serve.port) as s:
                s.sendall(b"GET /\x00 HTTP/1.1\r\n\r\n")
                try:
                    s.recv(100)
                except OSError:
                    pass
        time.sleep(0.5)
        grown = serve.text()[start:]
        assert 1 <= grown.count("Invalid HTTP request") <= 2, grown[:300]
        assert serve.get()[0] == 200
    finally:
        serve.stop()


# -- item 3: live streams --------------------------------------------------------------------------

class Streams:
    """Raw /events connections, every one read as it arrives (a thread), its status and events counted."""

    def __init__(self, port: int, count: int):
        self.selector = selectors.DefaultSelector()
        self.status: dict[int, int] = {}
        self.events: dict[int, int] = {}
        self.socks = []
        for i in range(count):
            s = _connect(port)
            s.sendall(b"GET /events HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n")
            s.setblocking(False)
            self.socks.append(s)
            self.selector.register(s, selectors.EVENT_READ, i)
        self.buffers = {i: b"" for i in range(count)}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while not self.stop.is_set():
            for key, _ in self.selector.select(0.2):
                i = key.data
                try:
                    data = key.fileobj.recv(1 << 20)
                except OSError:
                    data = b""
                if not data:
                    self.selector.unregister(key.fileobj)
                    continue
                buf = self.buffers[i] + data
                if i not in self.status and b"\r\n" in buf:
                    self.status[i] = int(buf.split(b" ", 2)[1])
                self.events[i] = self.events.get(i, 0) + buf.count(b"event: line")
                self.buffers[i] = buf[-20:]

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        for s in self.socks:
            s.close()


@pytest.mark.slow
def test_live_streams_are_capped_and_get_stays_quick_while_they_update(two_hosts, tmp_path):
    """Under the unit's file-descriptor limit (1024): 300 live streams are asked for; those over
    the cap are refused (503) at once, the rest stream; while 100 boards change, `GET /` stays
    quick."""
    h = two_hosts
    for i in range(100):
        say(h["url"], "hosta", h["a"], f"20261201T000000-c{i:07x}", "running", board=f"sim:/a/{i}",
            place=f"hosta-sim-{i}", stage="program", bytes_done=i, bytes_total=1000)
    serve = Serve(h["url"], tmp_path, nofile=1024)
    streams = None
    try:
        alone = sorted(serve.get()[1] for _ in range(5))
        streams = Streams(serve.port, 300)
        wait_for(lambda: len(streams.status) == 300, 30, "every stream answered")
        times = []
        for step in range(20):                # a board changes every 0.25 s, for 5 s
            say(h["url"], "hosta", h["a"], f"20261201T000000-c{step:07x}", "running", board=f"sim:/a/{step}",
                place=f"hosta-sim-{step}", stage="verify", bytes_done=500 + step, bytes_total=1000)
            times.append(serve.get()[1])
            time.sleep(0.25)
        counts = sorted(streams.status.values())
        refused, served = counts.count(503), counts.count(200)
        streaming = sum(1 for i, s in streams.status.items() if s == 200 and streams.events.get(i, 0) >= 2)
        times.sort()
        print(f"\nGET / alone: median {alone[2]:.3f} s; with {served} streams open and a change every 0.25 s: "
              f"median {times[10]:.3f} s, max {times[-1]:.3f} s; {refused} streams refused, {streaming} streaming")
        assert refused >= 1 and served + refused == 300, counts
        assert streaming == served
        assert times[-1] < 3.0 and times[10] < 1.0, times
    finally:
        if streams is not None:
            streams.close()
        serve.stop()


def test_the_table_is_rendered_once_per_change_whatever_the_number_of_streams(two_hosts, monkeypatch):
    """20 live streams and 3 changes: the table is rendered about once per change and the same
    rendering sent to every stream, not once per stream (which lets the streams, not the changes,
    decide the server's work)."""
    import uvicorn

    from amdflash.pipeline.fleet.serve import app as app_module
    from amdflash.pipeline.fleet.serve.line import Line

    h = two_hosts
    rendered = []
    real = app_module.rows_html
    monkeypatch.setattr(app_module, "rows_html", lambda *a, **k: rendered.append(1) or real(*a, **k))
    line = Line(h["url"], log=lambda m: None)
    line.start()
    server = None
    streams = None
    try:
        wait_for(lambda: line.version > 0, 30, "the line to load")
        port = free_port()
        server = uvicorn.Server(app_module.server_config(app_module.app(line, h["url"]), "127.0.0.1", port))
        threading.Thread(target=server.run, daemon=True).start()
        wait_for(lambda: server.started, 30, "the server")
        streams = Streams(port, 20)
        wait_for(lambda: sum(streams.events.values()) >= 20, 30, "every stream's first event")
        before = len(rendered)
        for i in range(3):
            seen = sum(streams.events.values())
            say(h["url"], "hosta", h["a"], RUN_A1, "running", board="sim:/a/0", place="hosta-sim-0",
                bytes_done=i, bytes_total=10)
            wait_for(lambda s=seen: sum(streams.events.values()) >= s + 20, 30, "every stream's update")
        renders = len(rendered) - before
        assert renders <= 3 * 2, renders         # a change may come as two wake-ups: never once per stream
    finally:
        if streams is not None:
            streams.close()
        if server is not None:
            server.should_exit = True
        line.close()


# -- item 3: a notification while the service is down, across a restart ---------------------------

class Webhook:
    """A webhook on a fixed loopback port, started when the test says (down until then)."""

    def __init__(self, port: int):
        got = self.got = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                import json

                got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        HTTPServer.allow_reuse_address = True
        self.server = HTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def titles(self) -> list[str]:
        return [m["title"] for m in self.got]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.slow
def test_a_failure_s_notification_waits_out_an_outage_and_a_restart_and_arrives_once(two_hosts, tmp_path):
    """The webhook is down when a run fails: the notification is not lost. It waits in the state
    directory through a kill of `fleet serve` and a restart, is retried, and arrives once the
    webhook is up; restarted again, the serve does not send it twice."""
    h = two_hosts
    port = free_port()
    hook = f"json://127.0.0.1:{port}/hook"
    title = f"amdflash: run {RUN_A1} failed on hosta (hosta-sim-0)"
    state = tmp_path / "state"
    serve = Serve(h["url"], tmp_path, "--notify", hook, name="serve1")
    webhook = None
    try:
        say(h["url"], "hosta", h["a"], RUN_A1, "failed", board="sim:/a/0", place="hosta-sim-0", error="stuck bit")
        wait_for(lambda: "not delivered" in serve.text(), 60, "a first attempt, refused")
        wait_for(lambda: any(RUN_A1 in p.read_text() for p in state.glob("notified-*.json")), 10,
                 "the notification kept in the state directory")
        serve.stop(signal.SIGKILL)
        serve = Serve(h["url"], tmp_path, "--notify", hook, name="serve2", viewer=serve.viewer)
        wait_for(lambda: "not delivered" in serve.text(), 30, "a retry after the restart, refused")
        webhook = Webhook(port)
        up = time.monotonic()
        wait_for(lambda: title in webhook.titles(), 60, "the notification once the webhook is up")
        print(f"\ndelivered {time.monotonic() - up:.1f} s after the webhook came up")
        serve.stop()
        serve = Serve(h["url"], tmp_path, "--notify", hook, name="serve3", viewer=serve.viewer)
        time.sleep(4.0)
        assert webhook.titles().count(title) == 1, webhook.titles()
    finally:
        serve.stop()
        if webhook is not None:
            webhook.close()


# -- item 5: the state directory ------------------------------------------------------------------

def test_a_state_dir_others_can_write_or_another_user_owns_is_refused(cli, central, tmp_path):
    """`--state-dir` writable by group or others, or owned by another user: refused, exit 2, one
    line, before anything is written there or anything listens."""
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    got = cli("fleet", "serve", "--from", central, "--state-dir", open_dir)
    assert got.code == 2 and "--state-dir" in got.err and "writable by" in got.err, got.err
    assert len(got.err.strip().splitlines()) == 1 and list(open_dir.iterdir()) == []
    group = tmp_path / "group"
    group.mkdir()
    group.chmod(0o770)
    got = cli("fleet", "serve", "--from", central, "--state-dir", group)
    assert got.code == 2 and "writable by" in got.err, got.err
    if os.geteuid() == 0:
        import pwd

        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, pwd.getpwnam("nobody").pw_uid, -1)
        got = cli("fleet", "serve", "--from", central, "--state-dir", theirs)
        assert got.code == 2 and "owned by" in got.err, got.err
        assert list(theirs.iterdir()) == []


def test_the_state_is_written_through_a_fresh_name_never_through_a_link(tmp_path, monkeypatch):
    """A link at the name the state used to be written through (fixed, the pid's) is left alone:
    each write opens a fresh random name with O_CREAT|O_EXCL|O_NOFOLLOW, fsyncs it, and renames it
    into place; the file it pointed at is untouched and the state is a file of its own."""
    from amdflash.pipeline.fleet.serve.notify import Memory

    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("root's\n")
    path = state / "notified-0123456789abcdef.json"
    (state / f".{path.name}.{os.getpid()}.tmp").symlink_to(victim)
    opened: list[tuple[str, int]] = []
    real_open = os.open

    def spy(name, flags, *args, **kwargs):
        opened.append((str(name), flags))
        return real_open(name, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", spy)
    memory = Memory.load(path)
    memory.seen_id = 7
    memory.save(wait=True)
    memory.seen_id = 8
    memory.save(wait=True)
    monkeypatch.undo()
    assert victim.read_text() == "root's\n"
    assert not path.is_symlink() and '"seen_id": 8' in path.read_text()
    assert path.stat().st_mode & 0o777 == 0o600
    writes = [(n, f) for n, f in opened if f & os.O_CREAT]
    assert len(writes) == 2 and writes[0][0] != writes[1][0], writes
    for _, flags in writes:
        assert flags & os.O_EXCL and flags & os.O_NOFOLLOW
    assert sorted(p.name for p in state.iterdir()) == sorted([path.name, f".{path.name}.{os.getpid()}.tmp"])


def test_the_serve_unit_sets_its_own_descriptor_limit_and_the_caps_fit_under_it() -> None:
    """The unit's LimitNOFILE= is what `fleet serve` derives its caps from: its connections and
    streams fit under it with the reserve left, and a limit too small is refused before serving."""
    import configparser

    from amdflash.pipeline.fleet.serve.guard import RESERVE, limits

    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.read(ROOT / "pipeline" / "fleet" / "units" / "amdflash-serve.service")
    nofile = int(parser["Service"]["LimitNOFILE"])
    caps = limits(nofile)
    assert caps.connections + RESERVE <= nofile and caps.streams < caps.connections
    with pytest.raises(ValueError, match="file-descriptor limit"):
        limits(RESERVE + 8)


def test_a_notification_a_service_refuses_does_not_hold_up_the_others_and_is_kept() -> None:
    """A webhook that answers 400 to one notification (and always will): the ones after it are
    still delivered, and the refused one is kept to be tried again, not dropped as sent."""
    from amdflash.pipeline.fleet.serve.notify import Notifier

    port = free_port()
    webhook = Webhook(port)
    real = webhook.server.RequestHandlerClass.do_POST

    def picky(handler) -> None:
        if int(handler.headers["Content-Length"]) > 0 and b"refused" in handler.rfile.peek(4096):
            handler.rfile.read(int(handler.headers["Content-Length"]))
            handler.send_response(400)
            handler.end_headers()
            return
        real(handler)

    webhook.server.RequestHandlerClass.do_POST = picky
    said: list[str] = []
    notifier = Notifier([f"json://127.0.0.1:{port}/hook"], said.append)
    try:
        notifier.send("amdflash: refused", "this one the service refuses")
        notifier.send("amdflash: taken", "this one it takes")
        wait_for(lambda: "amdflash: taken" in webhook.titles(), 30, "the second notification")
        # The service has it once its handler has read it; the notifier takes it out of its
        # outbox once the answer is back, a moment later (a busy machine shows the gap).
        wait_for(lambda: [n["title"] for n in notifier.outbox.items] == ["amdflash: refused"], 30,
                 "the delivered notification out of the outbox")
        assert [n["title"] for n in notifier.outbox.items] == ["amdflash: refused"]
        assert any("not delivered" in line and "amdflash: refused" in line for line in said), said
    finally:
        notifier.close(grace=0)
        webhook.close()


def test_a_descriptor_limit_too_small_for_the_caps_is_refused_before_anything_is_made(central, tmp_path) -> None:
    """Under a file-descriptor limit that leaves room for too few connections, `fleet serve`
    says so in one line, exit 2, and makes nothing (not its state directory)."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (280, 280))

    state = tmp_path / "state"
    done = subprocess.run([sys.executable, "-m", "amdflash.pipeline.cli", "fleet", "serve", "--from", central,
                           "--state-dir", str(state)], env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120, preexec_fn=limit)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if "imghdr" not in line and line.strip()]
    assert len(lines) == 1 and "file-descriptor limit (280)" in lines[0], done.stderr
    assert not state.exists()


@pytest.mark.slow
def test_an_answer_not_taken_within_the_response_timeout_closes_its_connection() -> None:
    """A client that asks for a long page and reads none of it holds a connection no new one may
    take over (it is being answered): the view's own protocol closes it once the answer has not
    been taken within the response timeout (here 20 s; a live stream has sse's send timeout). A
    client that reads the same page slowly but steadily, for longer than the header timeout,
    gets it whole."""
    import uvicorn

    from amdflash.pipeline.fleet.serve.app import server_config
    from amdflash.pipeline.fleet.serve.guard import Limits

    big = b"x" * (12 << 20)

    async def view(scope, receive, send):     # a stand-in for a long page (a run's report, the history)
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": big})

    def asking(port: int, window: int) -> socket.socket:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, window)
        s.connect(("127.0.0.1", port))
        s.sendall(b"GET /big HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        return s

    port = free_port()
    server = uvicorn.Server(server_config(view, "127.0.0.1", port, Limits(64, 8, response_timeout=20.0),
                                          log=lambda m: None))
    threading.Thread(target=server.run, daemon=True).start()
    socks: list[socket.socket] = []
    try:
        wait_for(lambda: server.started, 30, "the server")
        started = time.monotonic()
        slow, steady = asking(port, 4096), asking(port, 65536)
        socks += [slow, steady]
        got = 0
        steady.settimeout(10)
        while got < len(big):                 # a window's worth every 0.05 s: over 5 s for the page
            data = steady.recv(1 << 20)
            assert data, f"cut after {got} bytes, {time.monotonic() - started:.1f} s"
            got += len(data)
            time.sleep(0.05)
        took = time.monotonic() - started
        print(f"\nthe steady reader took its 12 MiB in {took:.1f} s")
        assert HEADER_TIMEOUT < took < 20.0, took
        time.sleep(max(0.0, 22.0 - (time.monotonic() - started)))
        assert _closed_by_server(slow)
    finally:
        for s in socks:
            s.close()
        server.should_exit = True
