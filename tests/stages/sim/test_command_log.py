"""The chip's command log read beside a board that is still writing it."""
from __future__ import annotations

from pathlib import Path

from amdflash.stages.sim import command_log


def test_a_half_written_last_line_is_not_a_command_yet(tmp_path: Path) -> None:
    command_log.record(tmp_path, bytes([0x02]) + (0x1000).to_bytes(3, "big") + b"\xaa" * 4)
    command_log.record(tmp_path, bytes([0x20]) + (0x2000).to_bytes(3, "big"))
    with open(tmp_path / command_log.LOG_NAME, "a") as log:      # a write caught half-way by a reader
        log.write("02 003000 aabb")
    assert command_log.read(tmp_path) == [command_log.Command(0x02, 0x1000, b"\xaa" * 4),
                                          command_log.Command(0x20, 0x2000, b"")]
    with open(tmp_path / command_log.LOG_NAME, "a") as log:      # the write finishes
        log.write("cc\n")
    assert command_log.read(tmp_path)[-1] == command_log.Command(0x02, 0x3000, b"\xaa\xbb\xcc")
