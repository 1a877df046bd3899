"""The SMUIO ROM aperture: ROM_INDEX / ROM_DATA, a read-only window onto the flash (§4).

Encoding as the hardware-validated reference drives it: ROM_CNTL and ROM_INDEX take
byte-swapped values. Auto-increment is bit 29 of the byte-swapped ROM_CNTL; the flash
address is the byte-swapped ROM_INDEX times 256. Each ROM_DATA read returns the next
little-endian dword and, with auto-increment on, advances the address by 4.

Variants: "raw controller unavailable" (the SMUIO ROM block reads all ones — installed by
the ROM_SW engine model, which owns that block) and "mirrored 1 MiB aperture" (the address
wraps at 1 MiB, so both halves of a dump are identical).

Fault read-flip=P flips bits of the bytes read here as it does for ROM_SW RX: the aperture
reads the flash over the same SPI bus.
"""
from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from amdflash.stages.drivers.navi31 import regs as R

if TYPE_CHECKING:
    from amdflash.stages.sim.board import Board

_ADDRESS = struct.Struct("<I")


def bswap32(value: int) -> int:
    return int.from_bytes((value & 0xFFFFFFFF).to_bytes(4, "little"), "big")


class RomAperture:
    def __init__(self, board: Board):
        self.board = board
        # The internal read pointer lives with the board, so it survives a host process.
        self._pointer = board.files.region("aperture")[0:4]
        self.window = 0x100000 if board.variant.get("mirrored_rom") else 0x200000
        if board.variant.get("no_raw_rom"):
            return
        board.on_write(R.ROM_INDEX, self._set_index)
        board.on_read(R.ROM_DATA, self._read_data)
        board.on_write(R.ROM_DATA, self._ignore_data_write)

    def reset(self) -> None:
        """Power-on: the read pointer at 0."""
        _ADDRESS.pack_into(self._pointer, 0, 0)

    def _set_index(self, value: int) -> None:
        _ADDRESS.pack_into(self._pointer, 0, (bswap32(value) << 8) & 0xFFFFFF)

    def _read_data(self) -> int:
        address = _ADDRESS.unpack_from(self._pointer)[0]
        board = self.board
        # A ROM_SW transaction whose time has passed reaches the chip first (the board's clock
        # runs whichever path the host reads through).
        board.engine.settle(board.clock.now())
        raw = board.chip.aperture_read(address % self.window, 4)
        if board.faults.read_flip:
            raw = board.engine._flip(raw)   # the noisy SPI line the ROM_SW engine reads through too
        if bswap32(board.get32(R.ROM_CNTL)) & R.ROM_CNTL_AUTO_INCREMENT:
            _ADDRESS.pack_into(self._pointer, 0, (address + 4) & 0xFFFFFF)
        return int.from_bytes(raw, "little")

    def _ignore_data_write(self, _value: int) -> None:
        self.board.set32(R.ROM_DATA, 0)  # read-only: nothing the host writes sticks

    def close(self) -> None:
        self._pointer.release()
