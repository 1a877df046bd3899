"""Nothing but a status read reaches the chip while it programs or erases, on any link.

A busy chip ignores every other command and the line reads 0xFF. On the asm24 bridge a
read of the array comes late enough that the last page program has always ended; on a
native PCIe link it does not, so a read that skips the wait shows erased bytes where the
page is being written. The emulated board counts every command the busy chip ignored.
"""
from __future__ import annotations

import random
import sqlite3

import pytest

from amdflash.stages.sim import Board

SIZE = 0x200000


@pytest.mark.parametrize("reads", [1, 2])
@pytest.mark.parametrize("profile", ["pcie", "ideal", "asm24"])
def test_a_flash_never_talks_to_a_busy_chip(amdflash, make_board, tmp_path, profile, reads):
    rng = random.Random(4)
    current = rng.randbytes(SIZE)
    image = bytearray(rng.randbytes(SIZE))
    image[:4] = b"\xaa\x55\xaa\x55"
    (tmp_path / "image.bin").write_bytes(image)
    board = make_board(content=current, transport=profile)
    r = amdflash("flash", tmp_path / "image.bin", "--yes", "--force", "--start-sector", 32, "--sector-count", 24,
                 "--reads", reads, "--board", f"sim:{board}")
    assert r.code == 0, r.err
    with Board(board) as b:
        stats = b.stats()
    assert stats["ignored_while_busy"] == 0
    assert stats["protocol_violations"] == 0 and stats["unobserved_completions"] == 0
    assert (board / "flash.bin").read_bytes()[32 * 0x1000:56 * 0x1000] == bytes(image[32 * 0x1000:56 * 0x1000])
    # Confirmed reads of a faithful board agree the first time: no disagreement is on record.
    with sqlite3.connect(tmp_path / "audit.sqlite") as db:
        assert db.execute("SELECT count(*) FROM read_disagreements").fetchone()[0] == 0
        attempts = db.execute("SELECT max(attempt) FROM verifies").fetchone()[0]
    assert attempts == 1
