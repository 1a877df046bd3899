"""`fleet serve --log-json`: uvicorn's own lines (here a malformed request from any client)
are JSON events like every other line, not uvicorn's plain-text format (an attack review).
In a process of its own: logging's configuration is the process's."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("uvicorn", reason="uvicorn is not installed (pip install '.[test]' brings it)")

SERVER = """
import socket, threading, time
from amdflash.pipeline import logsetup
from amdflash.pipeline.fleet.serve.app import server_config
import uvicorn

logsetup.configure(json_lines={json_lines})
logsetup.apply()

async def view(scope, receive, send):     # the view's lifespan; no request gets this far
    while scope["type"] == "lifespan":
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({{"type": "lifespan.startup.complete"}})
        else:
            await send({{"type": "lifespan.shutdown.complete"}})
            return

server = uvicorn.Server(server_config(view, "127.0.0.1", 0))
thread = threading.Thread(target=server.run)
thread.start()
while not server.started:
    time.sleep(0.02)
port = server.servers[0].sockets[0].getsockname()[1]
with socket.create_connection(("127.0.0.1", port)) as c:
    c.sendall(b"GET /\\x00\\x1b[2J\\r\\n\\r\\n")
    c.recv(100)
time.sleep(0.3)
server.should_exit = True
thread.join(10)
"""


@pytest.mark.parametrize("json_lines", [True, False])
def test_uvicorn_s_own_lines_are_amdflash_s_words(json_lines: bool) -> None:
    done = subprocess.run([sys.executable, "-c", SERVER.format(json_lines=json_lines)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert any("Invalid HTTP request" in line for line in lines), done.stderr
    if json_lines:
        events = [json.loads(line) for line in lines]          # each line one JSON object
        assert any(e["event"] == "Invalid HTTP request received." and e["level"] == "warning" for e in events)
    else:
        assert "WARNING:  Invalid" not in done.stderr           # uvicorn's own format
