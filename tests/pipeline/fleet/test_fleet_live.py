"""`fleet flash` as an operator sees it (issue 27 item 9): on a terminal, each board's stage and
progress while the job runs, then the table whose failed row says what to do next."""
from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.pipeline.fleet.lab import Lab
from tests.pipeline.fleet.test_line import place_of, two_hosts

pytestmark = pytest.mark.slow

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def test_fleet_flash_on_a_terminal_shows_each_board_live_and_the_failed_row_names_its_next_step(
        lab: Lab, fleet_image: Path) -> None:
    image = fleet_image.read_bytes()
    stuck = next(a for a in range(0x10000, len(image)) if not image[a] & 1)   # a bit the image needs at 0
    places = two_hosts(lab, 1, realtime=0.25, hostb={"faults": {0: [f"stuck-bit={stuck:#x}:0"]}})
    bad = place_of(places, lab.hosts["hostb"].boards[0])

    terminal, their_end = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "amdflash.pipeline.cli", "fleet", "flash", str(fleet_image),
                             "--where", "line=a", "--yes"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=their_end, text=True, env=lab.env(COLUMNS="250", LINES="50", TERM="xterm"),
                            cwd=lab.root, start_new_session=True)
    os.close(their_end)
    screens: list[tuple[str, bool]] = []    # (what the terminal got, whether the job was still running)

    def watch() -> None:
        while True:
            try:
                chunk = os.read(terminal, 65536)
            except OSError:                 # EIO: the other end is closed
                return
            if not chunk:
                return
            screens.append((ANSI.sub("", chunk.decode(errors="replace")), proc.poll() is None))

    reader = threading.Thread(target=watch, daemon=True)
    reader.start()
    table = proc.stdout.read() if proc.stdout else ""
    proc.wait(timeout=300)
    reader.join(10)
    os.close(terminal)
    assert proc.returncode == 1, (table, screens[-3:])

    # While the job ran (screens read before the command ended), a row per board with its host,
    # stage, bytes, rate and ETA.
    during = "".join(text for text, running in screens if running)
    for place, host in ((place_of(places, lab.hosts["hosta"].boards[0]), "hosta"), (bad, "hostb")):
        rows = [line for line in during.splitlines() if place[:20] in line and f" {host} " in line]
        assert any(re.search(r"(backup|erase|program|verify) +[0-9.]+ [KM]iB/2\.00 MiB", r) for r in rows), rows[-5:]
        assert any(re.search(r"[0-9.]+ [KM]iB/s +[0-9]+:[0-9]{2} +running", r) for r in rows), rows[-5:]

    # The final table: the failed row, then its next step on the host that holds the run.
    lines = table.splitlines()
    failed = next(i for i, line in enumerate(lines) if line.startswith(bad[-34:]) and " failed " in line)
    assert lines[failed + 1].strip().startswith("next: on hostb: "), lines[failed:failed + 2]
    assert "amdflash --db " in lines[failed + 1] and str(lab.hosts["hostb"].db) in lines[failed + 1]
