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
        version = _installed_version()
        globals()["__version__"] = version       # asked once: the metadata scan is slow
        return version
    if name == "api":
        # The Python API lives beside the commands (pipeline/api.py); imported only when asked
        # for, so that `import amdflash` (and the console script's first line) stays instant.
        from amdflash.pipeline import api

        globals()["api"] = api
        return api
    raise AttributeError(f"module 'amdflash' has no attribute {name!r}")


def _installed_version() -> str:
    """What `importlib.metadata.version("amdflash")` answers, read the way it finds it (the
    first entry of sys.path holding amdflash's .dist-info or .egg-info) without importing
    importlib.metadata, which brings ~70 modules (email, zipfile, csv…) to `amdflash --version`."""
    import os
    import sys

    for entry in sys.path:
        try:
            names = sorted(os.listdir(entry or "."))
        except OSError:         # not a directory (a zip), or gone
            continue
        for name in names:
            stem, _, suffix = name.rpartition(".")
            if suffix not in ("dist-info", "egg-info") or stem.split("-")[0].lower() != "amdflash":
                continue
            path = os.path.join(entry or ".", name)
            if os.path.isdir(path):
                path = os.path.join(path, "METADATA" if suffix == "dist-info" else "PKG-INFO")
            try:
                with open(path, encoding="utf-8") as f:
                    for line in f:
                        if line.startswith("Version:"):
                            return line.split(":", 1)[1].strip()
                        if not line.strip():      # the end of the headers
                            break
            except OSError:
                continue
    from importlib import metadata

    try:   # not found that way (an unusual installation): ask importlib.metadata itself
        return metadata.version("amdflash")
    except metadata.PackageNotFoundError:   # running from a tree that was never installed
        return "0+unknown"
