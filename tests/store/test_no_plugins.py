"""sqlite-utils plugins are not run on the trail's connections.

Any installed distribution may declare one (entry point group `sqlite_utils`); sqlite-utils
would load it on the first Database() and hand it every connection (`prepare_connection`),
inside a process that often runs as root. amdflash opens its trail without them; finding
them would also scan every installed package's metadata on each command that reads it."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from amdflash.stages.sim import create_board


def test_an_installed_sqlite_utils_plugin_is_not_run_when_amdflash_reads_the_trail(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    marker = tmp_path / "plugin-ran"
    (site / "trail_hook.py").write_text(
        "import sqlite_utils\n"
        "@sqlite_utils.hookimpl\n"
        "def prepare_connection(conn):\n"
        f"    open({str(marker)!r}, 'a').write('prepare_connection\\n')\n")
    dist = site / "trail_hook-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: trail-hook\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[sqlite_utils]\ntrail_hook = trail_hook\n")
    board, db = tmp_path / "board", tmp_path / "audit.sqlite"
    create_board(board, content="blank", transport="ideal")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    # The plugin is installed and sqlite-utils finds it: its own discovery runs it.
    probe = subprocess.run([sys.executable, "-c", "import sqlite_utils; sqlite_utils.Database(memory=True)"],
                           env=env, capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0 and marker.read_text() == "prepare_connection\n", probe.stderr
    marker.unlink()
    for argv in (["info", "--board", f"sim:{board}"], ["runs"]):
        r = subprocess.run([sys.executable, "-m", "amdflash", "-q", "--db", str(db), *argv],
                           env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
    assert not marker.exists()
