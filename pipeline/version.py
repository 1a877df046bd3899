"""The installed amdflash's version, as `importlib.metadata.version("amdflash")` answers it,
read without importing importlib.metadata (~70 modules: email, zipfile, csv…): `--version`
answers with it, and every run records it (engine/run_facts.py)."""
from __future__ import annotations

import os
import sys


def installed_version() -> str:
    """Read the way importlib.metadata finds it: the first entry of sys.path holding amdflash's
    .dist-info or .egg-info, its Version header."""
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
