"""amdflash: dump, verify and recover the SPI flash of AMD Navi31 boards.

This directory is the `amdflash` package itself (pyproject maps it there); the code lives
in its subpackages `amdflash.pipeline`, `amdflash.stages` and `amdflash.store`, which are
the repository's top-level folders installed under this one name so that they never
collide with other distributions' top-level modules.
"""
from __future__ import annotations

from importlib import metadata

try:
    __version__ = metadata.version("amdflash")
except metadata.PackageNotFoundError:   # running from a tree that was never installed
    __version__ = "0+unknown"
