"""A throwaway PostgreSQL cluster for tests: initdb and pg_ctl in a temporary directory.

The server listens on a unix socket in that directory only (no TCP), trusts local
connections (nobody else can reach the socket) and runs without fsync. PostgreSQL refuses
to run as root, so under root the cluster belongs to the `postgres` account (or `nobody`).
The central database of a line (`amdflash audit push`) is tested against this.
"""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

SUPERUSER = "amdflash"
PORT = 5432   # names the socket file only: the server has no TCP listener


def server_binaries() -> Path | None:
    """The directory holding initdb, pg_ctl and postgres (PATH first, then Debian's layout)."""
    on_path = shutil.which("pg_ctl")
    candidates = [Path(on_path).resolve().parent] if on_path else []
    candidates += sorted((Path(p).parent for p in glob.glob("/usr/lib/postgresql/*/bin/pg_ctl")),
                         key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0, reverse=True)
    for d in candidates:
        if all((d / tool).is_file() for tool in ("initdb", "pg_ctl", "postgres")):
            return d
    return None


class PostgresCluster:
    def __init__(self, bin_dir: Path):
        self.bin = bin_dir
        self.dir = Path(tempfile.mkdtemp(prefix="amdflash-pg-"))
        self.data = self.dir / "data"
        self.socket_dir = self.dir
        self._run_as: dict[str, int] = {}
        if os.geteuid() == 0:
            try:
                account = pwd.getpwnam("postgres")
            except KeyError:
                account = pwd.getpwnam("nobody")
            self._run_as = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}
            os.chown(self.dir, account.pw_uid, account.pw_gid)
        self.dir.chmod(0o700)

    @property
    def dsn(self) -> str:
        """libpq connection URI (psql, psycopg) for the `postgres` database over the socket."""
        return f"postgresql://{SUPERUSER}@/postgres?host={self.socket_dir}&port={PORT}"

    def _tool(self, name: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.bin / name), *args], capture_output=True, text=True, timeout=120,
                              check=True, cwd=self.dir, **self._run_as)

    def start(self) -> "PostgresCluster":
        try:
            self._tool("initdb", "-D", str(self.data), "-U", SUPERUSER, "--auth=trust", "--no-sync",
                       "-E", "UTF8", "--locale=C")
            options = f"-k {self.socket_dir} -c listen_addresses='' -p {PORT} -F"
            self._tool("pg_ctl", "-D", str(self.data), "-l", str(self.dir / "server.log"), "-w", "-t", "60",
                       "-o", options, "start")
        except subprocess.CalledProcessError as e:
            log = (self.dir / "server.log").read_text() if (self.dir / "server.log").exists() else ""
            shutil.rmtree(self.dir, ignore_errors=True)
            raise RuntimeError(f"{e.cmd[0]} failed: {e.stderr or e.stdout}\n{log}") from None
        return self

    def psql(self, sql: str) -> str:
        """Run SQL with psql; its unaligned, tuples-only output."""
        psql = self.bin / "psql" if (self.bin / "psql").is_file() else Path(shutil.which("psql") or "psql")
        done = subprocess.run([str(psql), self.dsn, "-X", "-v", "ON_ERROR_STOP=1", "-At", "-c", sql],
                              capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(done.stderr.strip())
        return done.stdout.strip()

    def stop(self) -> None:
        try:
            self._tool("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        except subprocess.CalledProcessError:
            pass   # not running (it failed to start, or was stopped by the test)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
