"""GigaDevice GD25LQ16E SPI NOR model (HARDWARE.md §7). STUB: being written.

Contract used by the rest of the emulator:

    chip = Gd25Chip(board)
    chip.transaction(out: bytes, rx_len: int) -> bytes   # one chip-select assertion
    chip.aperture_read(address: int, size: int) -> bytes # SMUIO controller read path
    chip.psp_update(address: int, data: bytes) -> bool  # PSP's own SPI writes (§5)
    chip.close()
    Gd25Chip.initial_state(cmp: bool, bp: int) -> bytes  # chip region at `sim create`
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stages.transport.sim.board import Board


class Gd25Chip:
    def __init__(self, board: "Board"):
        self.board = board
        self.flash = board.files.flash

    def transaction(self, out: bytes, rx_len: int) -> bytes:
        op = out[0]
        if op == 0x03 and len(out) >= 4:
            a = int.from_bytes(out[1:4], "big")
            return bytes(self.flash[a:a + rx_len])
        if op == 0x9F:
            return (b"\xc8\x60\x15" * 100)[:rx_len]
        return b"\x00" * rx_len

    def aperture_read(self, address: int, size: int) -> bytes:
        return bytes(self.flash[address:address + size])

    def psp_update(self, address: int, data: bytes) -> bool:
        self.flash[address:address + len(data)] = data
        return True

    @staticmethod
    def initial_state(cmp: bool, bp: int) -> bytes:
        return b""

    def close(self) -> None:
        pass
