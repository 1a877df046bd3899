"""The emulated backends a transport may be handed: named here, never imported here.

A real transport never imports the emulator (stages/sim). When an operator chooses an
emulated board explicitly — AMDFLASH_SIM_USB for the USB bridges, AMDFLASH_SIM_AMDGPU for
the amdgpu driver — the transport builds it through an `Emulators` it was given, and only
stages/open_transport.py, the one place that opens boards, gives one that can. A transport
handed none refuses the variable rather than reach for hardware in its place.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from collections.abc import Callable

if TYPE_CHECKING:
    from amdflash.stages.transport.amdgpu import AttributeIo

ENV_SIM_USB = "AMDFLASH_SIM_USB"
ENV_SIM_AMDGPU = "AMDFLASH_SIM_AMDGPU"


@dataclass(frozen=True)
class Emulators:
    # The board directories of AMDFLASH_SIM_USB -> a pyusb backend serving them (one that
    # offers `clock_for` and `lock_path_for`, as the USB transport and discovery expect).
    usb_backend: Callable[[list[str]], Any] | None = None
    # The tree of AMDFLASH_SIM_AMDGPU -> the attribute calls its emulated kernel answers.
    kernel_io: Callable[[Path], AttributeIo] | None = None


NO_EMULATORS = Emulators()
