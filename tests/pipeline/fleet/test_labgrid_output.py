"""What labgrid's helpers say never reaches the fleet's stdout, which carries its table or JSON.

labgrid copies an image to a host with rsync (`--verbose --progress`) and prints rsync's lines
with print() whenever its "Process" logger would not show them: on a real line (hosts that do
not see the client's files) every `fleet flash --format json` began with rsync's transfer lines.
The same call as labgrid's put_file makes, with and without the fleet's logging set up."""
from __future__ import annotations

import argparse
import logging

import pytest

pytest.importorskip("labgrid", reason="labgrid is not installed (pip install '.[test]' brings it)")

RSYNC_SAYS = "sent 1,234 bytes  received 35 bytes  2,538.00 bytes/sec"


def _rsync_like() -> None:
    from labgrid.util.helper import processwrapper

    processwrapper.check_output(["sh", "-c", f"echo '{RSYNC_SAYS}'"], stdin=None, print_on_silent_log=True)


def test_labgrid_s_program_output_stays_off_the_fleet_s_stdout(monkeypatch, capsys) -> None:
    from amdflash.pipeline.cli.fleet import _need_labgrid

    # The loggers are the process's: a fleet command run in this process earlier (another test,
    # same xdist worker) has set them already. Start from a fresh process's state; put back after.
    process, root = logging.getLogger("Process"), logging.getLogger()
    monkeypatch.setattr(process, "handlers", [])
    monkeypatch.setattr(process, "level", logging.NOTSET)
    monkeypatch.setattr(process, "propagate", True)
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", logging.WARNING)
    _rsync_like()
    assert RSYNC_SAYS in capsys.readouterr().out        # labgrid's own way: printed on stdout
    _need_labgrid(argparse.Namespace(verbose=0))           # as every fleet command that runs jobs does
    _rsync_like()
    captured = capsys.readouterr()
    assert captured.out == "" and RSYNC_SAYS not in captured.err
