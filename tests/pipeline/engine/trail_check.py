"""Comparing what an emulated board received with what the audit trail holds."""
from __future__ import annotations

import sqlite3
from pathlib import Path

from amdflash.stages.sim import command_log

UNIT = 0x1000
ERASE_SIZES = {0x20: 0x1000, 0x52: 0x8000, 0xD8: 0x10000, 0x60: 0x200000, 0xC7: 0x200000}


def uncovered_commands(db: Path, board: Path) -> list[command_log.Command]:
    """The destructive commands in the board's own log that the committed trail does not
    account for: neither the transaction row itself nor a unit intent of a run on this
    board covering the whole span it changes. Status-register writes need their own row."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        spec = f"sim:{board.resolve()}"
        runs = [r for (r,) in conn.execute("SELECT run_id FROM runs WHERE board_spec = ?", [spec])]
        marks = ",".join("?" * len(runs))
        rows = set(conn.execute(f"SELECT opcode, address FROM spi_transactions WHERE run_id IN ({marks}) "
                                "AND opcode IN (1, 2, 17, 32, 49, 66, 68, 82, 96, 199, 216)", runs).fetchall())
        intents = {a for (a, size) in conn.execute(
            f"SELECT address, size FROM units WHERE run_id IN ({marks}) AND state = 'intent'", runs)
            for a in range(a, a + size, UNIT)}
    finally:
        conn.close()
    missing = []
    for c in command_log.read(board):
        if (c.opcode, c.address) in rows:
            continue
        if c.opcode == 0x02:
            span = range(c.address - c.address % UNIT, c.address + max(len(c.data), 1), UNIT)
        elif c.opcode in ERASE_SIZES:
            size = ERASE_SIZES[c.opcode]
            start = c.address - c.address % size if size < 0x200000 else 0
            span = range(start, start + size, UNIT)
        else:
            span = range(0)    # status and security registers: only their own row will do
        if not span or not all(a in intents for a in span):
            missing.append(c)
    return missing
