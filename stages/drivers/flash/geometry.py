"""The flash's geometry, one definition for every module (docs/flash-chip.md).

Every Navi31 board this tool serves keeps its IFWI in a 2 MiB SPI NOR part programmed in
256-byte pages and erased, at the finest, in 4 KiB sectors. The pipeline works in sectors:
planning, the audit trail's unit states and resume all count 4 KiB units, so UNIT is a
sector by definition (chips.py's write_gaps refuses a part without a 4 KiB erase).
"""
from __future__ import annotations

from typing import Final

FLASH_SIZE: Final = 0x200000    # 2 MiB: the whole array, every board
SECTOR: Final = 0x1000          # 4 KiB: the smallest erase (opcode 20h)
UNIT: Final = SECTOR            # the pipeline's erase unit: plans, unit states, resume
PAGE: Final = 0x100             # 256 bytes: one page program (opcode 02h) wraps within it
