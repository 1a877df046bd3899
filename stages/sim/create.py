"""Making an emulated board: a directory holding flash content, registers and identity."""
from __future__ import annotations

import datetime as _dt
import hashlib
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from amdflash.stages.sim import cost
from amdflash.stages.sim.faults import Faults
from amdflash.stages.sim.power_on import power_on_registers
from amdflash.stages.drivers.flash.geometry import FLASH_SIZE
from amdflash.stages.sim.state import create_files
from amdflash.stages.files import open_dir
from amdflash.stages.terminal import printable

class BoardExistsError(FileExistsError):
    pass


def _board_dir(path: Path) -> None:
    """Check the board's directory: a new one, or an existing empty directory — not a link —
    of the user running this. A directory another user made (an empty one in /tmp, say) is
    refused: they could put links in it between our writes."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    _check(path, st, lambda: any(path.iterdir()))


def _make_board_dir(path: Path) -> int:
    """Take the board's directory (made if new, checked again as `_board_dir` does), opened:
    the board's files are created in it by descriptor, never again by its path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        pass
    return _open_made(path)


def _open_made(path: Path) -> int:
    """The directory just made (or found empty), opened once: its parent resolved once, the
    directory itself and every name on the way never followed as a link. Whoever can write to
    the parent may swap the directory for a link to one of theirs the moment after mkdir: the
    open refuses the link, and nothing is written there."""
    where = Path(os.path.abspath(path))
    try:
        fd = open_dir(Path(os.path.realpath(where.parent)) / where.name)
    except NotADirectoryError:        # LinkInPath too
        raise BoardExistsError(f"{path} is no longer the directory just made (a link or a file is there now: "
                               f"another user who can write to {where.parent}?): nothing was written") from None
    try:
        _check(path, os.fstat(fd), lambda: bool(os.listdir(fd)))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check(path: Path, st: os.stat_result, nonempty: Callable[[], bool]) -> None:
    if not stat.S_ISDIR(st.st_mode):
        raise BoardExistsError(f"{path} already exists and is not a directory (a board is made in a new "
                               "or empty directory)")
    if st.st_uid != os.getuid():
        raise BoardExistsError(f"{path} is owned by uid {st.st_uid}, not by this user (uid {os.getuid()}): "
                               "a board is made only in a new directory or an empty one of your own")
    if nonempty():
        raise BoardExistsError(f"{path} already exists and is not an empty directory")


def utf8_name(path: Path) -> None:
    """A board's directory name the audit trail can record: its spec (sim:PATH) is recorded as
    text, and a name that is not UTF-8 (its bytes handed over as surrogate escapes) is not."""
    try:
        os.path.abspath(path).encode("utf-8")
        os.path.realpath(path).encode("utf-8")      # the board's spec is its resolved path
    except UnicodeEncodeError:
        raise ValueError(f"{printable(str(path))}: the name is not valid UTF-8, and the audit trail records a "
                         "board's spec (sim:PATH) as text; choose a UTF-8 name") from None


def create_board(
    path: str | os.PathLike[str],
    *,
    content: str | bytes = "synthetic",
    cmp: bool = False,
    bp: int = 0,
    gated: bool = False,
    no_raw_rom: bool = False,
    mirrored_rom: bool = False,
    sos: bool = False,
    transport: str = "asm24",
    seed: int | None = None,
    faults: list[str] | None = None,
    realtime_scale: float = 0.0,
    psp_order: list[int] | None = None,
    bridge: dict[str, Any] | None = None,
    strict: bool = True,
    chip: str | None = None,
    calibration: dict[str, Any] | None = None,
    status_registers: tuple[int, ...] | None = None,
) -> Path:
    """Create a board directory. `content` is "synthetic", "blank" or a 2 MiB image.

    `bridge`: options of the emulated ASM24 bridge in front of the board (see
    `amdflash.stages.sim.asm24_firmware.BridgeOptions`), stored as board.json's "bridge" object.
    `strict`: a ROM_SW protocol violation raises (default) rather than only being counted.
    `chip`: the emulated flash part (catalog.py; default GD25LQ16E).
    `calibration`: timings, SFDP and power-on registers measured on a real board
    (calibration.py); `status_registers`: the part's status registers as found there
    (instead of `cmp`/`bp`).
    """
    path = Path(path)
    utf8_name(path)
    _board_dir(path)     # refused before anything is made
    cost.profile(transport)  # validates the name
    from amdflash.stages.sim.nor import NorChip
    from amdflash.stages.sim.catalog import part

    spec = part(chip)
    # The chip's status registers (CMP, BP) are part of its persistent state; this validates them.
    chip_state = NorChip.initial_state(spec, cmp=cmp, bp=bp)
    if status_registers is not None:
        chip_state = NorChip.with_status_registers(spec, chip_state, status_registers)
    if calibration is not None:
        from amdflash.stages.sim.calibration import check

        calibration = check(calibration, spec)
    fault_set = Faults.parse(faults or [])
    from amdflash.stages.sim.psp import check_order

    check_order(psp_order)
    if bridge:
        from amdflash.stages.sim.asm24_firmware import BridgeOptions

        try:
            BridgeOptions.resolve(bridge)
        except TypeError as e:
            raise ValueError(str(e)) from None
    if seed is None:
        seed = secrets.randbits(32)

    if content == "synthetic":
        from amdflash.stages.sim.synth import synthetic_ifwi

        flash = synthetic_ifwi(seed)
    elif content == "blank":
        flash = b"\xff" * FLASH_SIZE
    elif isinstance(content, (bytes, bytearray)):
        if len(content) != FLASH_SIZE:
            raise ValueError(f"image must be exactly {FLASH_SIZE:#x} bytes, got {len(content):#x}")
        flash = bytes(content)
    else:
        raise ValueError(f"unknown board content {content!r}")

    identity = hashlib.sha256(f"amdflash-sim:{seed}:{path.resolve()}".encode()).digest()
    from amdflash.stages.sim.calibration import power_on_values

    regs = power_on_registers(power_on_values(calibration))

    config = {
        "format": 1,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "label": "amdflash emulated Navi31 board (synthetic, not an AMD device)",
        "seed": seed,
        "transport": transport,
        "content": content if isinstance(content, str) else "image",
        "variant": {"gated": gated, "no_raw_rom": no_raw_rom, "mirrored_rom": mirrored_rom, "sos": sos},
        "unique_id": identity[:16].hex(),
        "serial": identity[16:20].hex(),
        "faults": fault_set.to_json(),
        "realtime_scale": realtime_scale,
        "psp_order": psp_order,
        "strict": strict,
        "chip": spec.name,
    }
    if bridge:
        config["bridge"] = dict(bridge)
    if calibration:
        config["calibration"] = calibration
    fd = _make_board_dir(path)
    try:
        create_files(path, config, flash, regs, {"chip": chip_state}, dir_fd=fd)
    except FileExistsError as e:
        raise BoardExistsError(str(e)) from None
    finally:
        os.close(fd)
    return path

