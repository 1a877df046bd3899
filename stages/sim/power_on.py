"""BAR5 as the GPU comes out of reset (board creation and PERST# both start from it)."""
from __future__ import annotations

from collections.abc import Mapping

from amdflash.stages.drivers.navi31 import regs as R
from amdflash.stages.sim.state import BAR5_SIZE

# Power-on register values (assumptions: no dump of a stalled Navi31 is public). They are
# chosen so that a driver which skips a documented step fails visibly: the SPI pads start
# owned by GPIO and page-mirror usage starts clear.
POWER_ON_REGISTERS = {
    R.ROM_CNTL: 0x0A000002,
    R.PAGE_MIRROR_CNTL: 0x00000000,
    R.GPIOPAD_MASK: 0x00001F80,
    R.GPIOPAD_A: 0x00000780,
    R.GPIOPAD_EN: 0x00000F80,
}


def power_on_registers(observed: Mapping[int, int] | None = None) -> bytes:
    """BAR5 as the GPU comes out of reset: zero but for the registers above, and for the
    values a real board was `observed` to hold (a calibrated board: calibration.py)."""
    regs = bytearray(BAR5_SIZE)
    for offset, value in {**POWER_ON_REGISTERS, **(observed or {})}.items():
        regs[offset:offset + 4] = value.to_bytes(4, "little")
    return bytes(regs)
