"""A push whose login has no password where libpq looks (issue 27 item 11): the error says where
the password goes, not only libpq's `fe_sendauth: no password supplied`."""
from __future__ import annotations

import socket
import struct
import threading
from pathlib import Path

import pytest

pytest.importorskip("psycopg")


def _server_asking_for_a_password(path: Path) -> socket.socket:
    """A unix socket that answers every PostgreSQL start-up as a server with password
    authentication does (AuthenticationCleartextPassword), then waits for the client to go."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(4)

    def answer() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)                                 # the start-up message
                conn.sendall(b"R" + struct.pack("!ii", 8, 3))    # "send me your password"
                conn.recv(65536)                                 # libpq hangs up: it has none

    threading.Thread(target=answer, daemon=True).start()
    return server


def test_a_push_without_a_password_says_where_the_password_goes(tmp_path: Path, monkeypatch, cli) -> None:
    from amdflash.stages.sim import create_board

    sockets = tmp_path / "pg"
    sockets.mkdir()
    server = _server_asking_for_a_password(sockets / ".s.PGSQL.5432")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PGPASSFILE", raising=False)
    monkeypatch.delenv("PGPASSWORD", raising=False)
    db = tmp_path / "audit.sqlite"
    board = create_board(tmp_path / "board", seed=5)
    assert cli("--db", str(db), "info", "--board", f"sim:{board}").code == 0
    try:
        done = cli("--db", str(db), "audit", "push", "--to", f"postgresql://hosta@/amdflash?host={sockets}&port=5432")
    finally:
        server.close()
    assert done.code == 1, done
    assert "no password supplied" in done.err
    assert f"put the login's password in {tmp_path / 'home' / '.pgpass'} (mode 0600)" in done.err, done.err
    assert f"'{sockets}:5432:amdflash:hosta:PASSWORD'" in done.err and "~amdflash/.pgpass" in done.err
