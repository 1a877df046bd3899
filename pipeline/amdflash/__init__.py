"""amdflash: dump, verify and recover the SPI flash of AMD Navi31 boards.

This directory is the `amdflash` package itself (pyproject maps it there); the code lives
in its subpackages `amdflash.pipeline`, `amdflash.stages` and `amdflash.store`, which are
the repository's top-level folders installed under this one name so that they never
collide with other distributions' top-level modules. `amdflash.api` is the Python API (its
module is `amdflash.pipeline.api`; `from amdflash import api` finds it on first use).
"""
from __future__ import annotations


def __getattr__(name: str) -> object:
    # Looked up on first use: importing the package stays instant (the console script's
    # Ctrl-C handling starts right after it), and the version is the installed one.
    if name == "__version__":
        from amdflash.pipeline.version import installed_version

        version = installed_version()
        globals()["__version__"] = version       # asked once: the metadata scan is slow
        return version
    if name == "api":
        # The Python API lives beside the commands (pipeline/api.py); imported only when asked
        # for, so that `import amdflash` (and the console script's first line) stays instant.
        from amdflash.pipeline import api

        globals()["api"] = api
        return api
    raise AttributeError(f"module 'amdflash' has no attribute {name!r}")
