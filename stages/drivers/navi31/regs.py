"""Navi31 BAR5 register map (SMUIO 13.0.6 and MP0), byte offsets.

Facts only: shared by the drivers and by the emulated board, which both describe the
same silicon. Older SMUIO versions place ROM_SW elsewhere; this map is Navi31's.
"""
from typing import Final

BAR5_SIZE: Final = 0x100000

ROM_CNTL: Final = 0x5A380
PAGE_MIRROR_CNTL: Final = 0x5A384
ROM_STATUS: Final = 0x5A388
ROM_INDEX: Final = 0x5A390
ROM_DATA: Final = 0x5A394
ROM_START: Final = 0x5A398
ROM_SW_CNTL: Final = 0x5A3A0
ROM_SW_STATUS: Final = 0x5A3A4
ROM_SW_COMMAND: Final = 0x5A3A8
ROM_SW_DATA: Final = 0x5A3B0          # ROM_SW_DATA_1 .. ROM_SW_DATA_64
ROM_SW_DATA_SIZE: Final = 0x100
GPIOPAD_MASK: Final = 0x5A504
GPIOPAD_A: Final = 0x5A508
GPIOPAD_EN: Final = 0x5A510

MP0_C2PMSG_73: Final = 0x58224        # doorbell
MP0_C2PMSG_115: Final = 0x582CC       # command / status
MP0_C2PMSG_116: Final = 0x582D0       # argument / response

# Field values.
SPI_PAD_BITS: Final = 0x780
ROM_SW_RETURN_DATA_ENABLE: Final = 0x80000
ROM_SW_DONE: Final = 0x1
ROM_SW_GATED_STATUS: Final = 0x04000800
PAGE_MIRROR_USAGE_MASK: Final = 0x0C000000   # b27:26
PAGE_MIRROR_USAGE_SPI: Final = 0x06000000    # as the validated client sets it
ROM_CNTL_AUTO_INCREMENT: Final = 1 << 29
ROM_CNTL_RAW_UNAVAILABLE: Final = 0xFFFFFFFF
PSP_READY: Final = 0x80000000

# Registers the ROM_SW engine changes and must put back.
ROM_SW_SAVED: Final = (GPIOPAD_MASK, GPIOPAD_A, GPIOPAD_EN, PAGE_MIRROR_CNTL, ROM_CNTL)
