"""The emulated flash chip's own log of the destructive commands that reached it.

What a logic analyser on the SPI bus would show: every erase, page program and status or
security register write, as it arrives at the chip — whether or not the chip then acts on
it (write enable latch, protection, busy). Each is appended at once to `commands.log` in
the board directory, one line per command:

    <opcode hex> <24-bit address hex> <data bytes hex>

so the log survives a host killed at any instant, and tests can compare what the board
received with what the audit trail holds.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

LOG_NAME = "commands.log"
# Page program, sector/block/chip erase, status register writes, security register program/erase.
LOGGED = frozenset({0x02, 0x20, 0x52, 0xD8, 0x60, 0xC7, 0x01, 0x31, 0x11, 0x42, 0x44})
_ADDRESSED = frozenset({0x02, 0x20, 0x52, 0xD8, 0x42, 0x44})


@dataclass(frozen=True)
class Command:
    opcode: int
    address: int
    data: bytes


_OPEN: dict[Path, int] = {}     # the logs this process appends to (a few at a time)


def record(board_dir: Path, out: bytes) -> None:
    """Append one command (the bytes the chip received: opcode, address, data). Each line
    goes to the file with one write, so it is there even if the process dies next."""
    op = out[0]
    address, data = (int.from_bytes(out[1:4], "big"), out[4:]) if op in _ADDRESSED else (0, out[1:])
    fd = _OPEN.get(board_dir)
    if fd is not None and os.fstat(fd).st_nlink == 0:     # the board was removed and made again
        os.close(_OPEN.pop(board_dir))
        fd = None
    if fd is None:
        if len(_OPEN) >= 8:
            os.close(_OPEN.pop(next(iter(_OPEN))))
        # Never through a link planted at the name (the board directory may be shared).
        fd = _OPEN[board_dir] = os.open(board_dir / LOG_NAME,
                                        os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    os.write(fd, f"{op:02x} {address:06x} {data.hex()}\n".encode())


def read(board_dir: Path) -> list[Command]:
    """The commands the chip has received so far. A reader beside a running board may see
    the last line half-written (a read does not wait for a write to a regular file to
    finish), so only lines ended by their newline are commands yet."""
    path = Path(board_dir) / LOG_NAME
    if not path.exists():
        return []
    out = []
    text = path.read_text()
    for line in text[:text.rfind("\n") + 1].splitlines():
        op, address, *data = line.split(" ")
        out.append(Command(int(op, 16), int(address, 16), bytes.fromhex(data[0] if data else "")))
    return out
