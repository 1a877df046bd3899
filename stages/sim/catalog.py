"""The emulated parts by name: the catalog `amdflash sim create --chip` chooses from.

Apart from parts.py (what a part is) so that the part modules can import the types and this
module can import the parts, without a loop between them.
"""
from __future__ import annotations

from amdflash.stages.sim.gd25 import GD25LQ16E
from amdflash.stages.sim.mx25u1633f import MX25U1633F
from amdflash.stages.sim.mx25u1635f import MX25U1635F
from amdflash.stages.sim.parts import PartSpec
from amdflash.stages.sim.unknown_part import UNKNOWN, UNKNOWN_2BFPT, UNKNOWN_SFDP2, UNKNOWN_SFDP10
from amdflash.stages.sim.w25q16dw import W25Q16DW
from amdflash.stages.sim.w25q16fw_jw import W25Q16FW, W25Q16JW

DEFAULT_PART = "GD25LQ16E"


def all_parts() -> dict[str, PartSpec]:
    return {p.name: p for p in (GD25LQ16E, W25Q16DW, W25Q16FW, W25Q16JW, MX25U1635F, MX25U1633F, UNKNOWN,
                                UNKNOWN_SFDP10, UNKNOWN_2BFPT, UNKNOWN_SFDP2)}


def part(name: str | None) -> PartSpec:
    parts = all_parts()
    try:
        return parts[name or DEFAULT_PART]
    except KeyError:
        raise ValueError(f"unknown emulated chip {name!r}; choose one of {', '.join(parts)}") from None
