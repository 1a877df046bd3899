"""Issue 41 item 7: a resume refusal said a run "wrote this board" when that run was killed
during its backup and changed nothing. Such a run is not a writer of the board: the resume of
the flash it came after goes on."""
from __future__ import annotations

import json
import signal

import pytest

from tests.pipeline.engine.conftest import flash_content
from tests.support import cli


def _runs(amdflash) -> list[dict]:  # noqa: ANN001
    return json.loads(amdflash("runs", "--format", "json").out)


@pytest.mark.slow
def test_a_flash_killed_in_its_backup_does_not_refuse_the_resume_of_the_one_before(amdflash, make_board, image,
                                                                                  tmp_path):
    board = make_board(content="blank", transport="ideal", faults=["kill-after-writes=52000"])   # while writing
    first = cli.run_process("--no-progress", "flash", image, "--yes", "--force", "--board", f"sim:{board}",
                            cwd=tmp_path)
    assert first.returncode == -signal.SIGKILL, first.stderr
    written = _runs(amdflash)[-1]["run_id"]
    assert amdflash("sim", "fault", board, "--clear", "kill-after-writes=8000").code == 0     # in its backup
    second = cli.run_process("--no-progress", "flash", image, "--yes", "--force", "--start-over",
                             "--board", f"sim:{board}", cwd=tmp_path)
    assert second.returncode == -signal.SIGKILL, second.stderr
    killed = _runs(amdflash)[-1]
    assert killed["run_id"] != written and killed["status"] == "interrupted", killed
    state = json.loads(amdflash("report", killed["run_id"], "--format", "json").out)["outcome"]["state"]
    assert state == "the flash was not changed", state        # killed while it read its backup
    half = flash_content(board)
    assert amdflash("sim", "fault", board, "--clear").code == 0
    done = amdflash("--no-progress", "resume", "--yes", "--board", f"sim:{board}", "--", written)
    assert "wrote this board" not in done.err, done.err
    assert done.code == 0, done.err
    assert flash_content(board) == image.read_bytes() != half
