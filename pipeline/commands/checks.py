"""Checks that need no board: they all run before any run starts, and each failure is a
one-line Refusal (exit 2) with nothing touched.

Images are checked with stat() before they are opened: a device (/dev/zero), a FIFO or
a directory is refused without being read, and a regular file is read to at most one
byte past the flash size, so no input can exhaust memory or block forever.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import stat
from pathlib import Path

from amdflash.pipeline.errors import Refusal
from amdflash.stages.terminal import printable
from amdflash.stages.image import ifwi
from amdflash.stages.drivers.navi31 import aperture
from amdflash.stages.files import room_problem, write_new
from amdflash.stages.open_transport import BoardSpec, BoardSpecError, parse_spec
from amdflash.store.files import NotAFile, kind_of, read_regular
from amdflash.stages.drivers.flash.geometry import FLASH_SIZE, UNIT

SECTORS = FLASH_SIZE // UNIT
PRESCALE_MAX = 15


def recordable(path: Path | str, what: str) -> None:
    """A path the trail can record as text: a name that is not UTF-8 (the system hands its bytes
    over as surrogate escapes) is refused before anything runs, with the bytes shown."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        raise Refusal(f"{what} {printable(str(path))}: the name is not valid UTF-8, and the audit trail "
                      "records names as text; rename the file (or link it under a UTF-8 name)") from None


def read_image(path: Path, what: str = "image", range_size: int = FLASH_SIZE) -> bytes:
    """The 2 MiB image at `path`; Refusal unless it is a regular file of exactly 2 MiB — or of
    exactly `range_size` bytes, a sector range's own content (a range flash's backup)."""
    recordable(path, what)
    try:
        st = os.stat(path)
    except OSError as e:
        raise Refusal(f"cannot read {what} {path}: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise Refusal(f"{what} {path} is {kind_of(st.st_mode)}, not a regular file")
    if st.st_size not in (FLASH_SIZE, range_size):
        also = f" (or {range_size:#x}, the sectors named)" if range_size != FLASH_SIZE else ""
        raise Refusal(f"{what} {path} is {st.st_size:#x} bytes; a Navi31 flash image is exactly {FLASH_SIZE:#x}"
                      + also)
    try:
        data = read_regular(path, st.st_size)     # it may have been swapped since the stat
    except OSError as e:
        raise Refusal(f"cannot read {what} {path}: {e.strerror}") from None
    except NotAFile as e:
        raise Refusal(f"{what} {e}") from None
    if len(data) != st.st_size:
        raise Refusal(f"{what} {path} changed while it was read ({len(data):#x} bytes)")
    return data


def check_signature(data: bytes, path: Path, force: bool) -> None:
    if data[:4] != aperture.IFWI_MAGIC and not force:
        raise Refusal(f"image {path} does not start with the IFWI signature AA55AA55 "
                      f"(starts {data[:4].hex()}); pass --force if you are sure")


def check_ifwi(data: bytes, path: Path) -> None:
    problems = ifwi.check_image(data)
    if problems:
        raise Refusal(f"image {path}: " + "; ".join(problems))


def backup_folder(path: Path) -> Path:
    """The folder a flash keeps its backup of the original content in: a directory it can
    write, or one it can create (checked before the run, not when the backup is written)."""
    if path.exists() or path.is_symlink():
        if not path.is_dir():
            raise Refusal(f"backup folder {path} exists and is not a directory; move it away "
                          "(flash keeps its backups of the original content there)")
        if not os.access(path, os.W_OK | os.X_OK):
            raise Refusal(f"cannot write backup folder {path}: permission denied")
    elif path.parent.is_dir() and not os.access(path.parent, os.W_OK | os.X_OK):
        # (No folder there at all: the audit database's own check names that.)
        raise Refusal(f"cannot create backup folder {path}: permission denied")
    return path


def writable_output(path: Path, what: str = "output", overwrite: bool = False, need: int = 0) -> None:
    """A file we are about to create: a name the trail can record and the system can hold, its
    directory exists and is writable, and it is not a directory or a device itself — nor an
    existing file, unless `overwrite` (nothing the user did not ask to lose is replaced)."""
    recordable(path, what)
    limit = _name_max(path.parent if str(path.parent) else Path("."))
    if len(os.fsencode(path.name)) > limit:
        raise Refusal(f"{what} {path}: the file name is {len(os.fsencode(path.name))} bytes long; "
                      f"this file system allows {limit}")
    if path.is_dir():
        raise Refusal(f"{what} {path} is a directory")
    if path.exists() and not path.is_file():
        raise Refusal(f"{what} {path} exists and is not a regular file")
    if (path.exists() or path.is_symlink()) and not overwrite:
        raise Refusal(f"{what} {path} exists; amdflash does not replace a file unless --overwrite is given")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise Refusal(f"cannot write {what} {path}: directory {parent} does not exist")
    problem = room_problem(parent, need)    # a /proc path, a read-only mount, a full disk: before any run
    if problem:
        raise Refusal(f"cannot write {what} {path}: {problem}")
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise Refusal(f"cannot write {what} {path}: permission denied")


def output_option(p: argparse.ArgumentParser, help: str, required: bool = False) -> None:
    """-o/--output FILE and --overwrite."""
    p.add_argument("-o", "--output", type=output_file, metavar="FILE", required=required, help=help)
    overwrite_option(p)


def write_output(args: argparse.Namespace, data: bytes | str, what: str = "output") -> None:
    """Write args.output whole (see stages.files.write_new), after the checks every output gets."""
    writable_output(args.output, what, args.overwrite)
    write_new(args.output, data, overwrite=args.overwrite)


def overwrite_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--overwrite", action="store_true",
                   help="replace the output file if it exists (by default an existing file is refused, exit 2)")


def _name_max(directory: Path) -> int:
    try:
        return os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def output_file(text: str) -> Path:
    """argparse type of every option that names a file to write. Writers create a new file and
    rename it into place, which would replace a device node (`-o /dev/zero`), a FIFO or a
    socket with a regular file; such a path is a usage error before anything runs."""
    path = Path(text)
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return path          # not there yet (or unreachable): the command's own checks say why
    if not stat.S_ISREG(mode):
        raise argparse.ArgumentTypeError(f"{path} is {kind_of(mode)}; give the name of a regular file to write")
    return path


def board_specs(texts: list[str] | None, unbind_driver: bool = False) -> list[BoardSpec]:
    """The --board values as specs: well-formed, each named once, emulated boards present."""
    try:
        specs = [parse_spec(s) for s in (texts or ["auto"])]
    except BoardSpecError as e:
        raise Refusal(str(e)) from None
    seen: set[str] = set()
    for s in specs:
        # The same emulated board through a symlink is the same board (its lock says so too).
        key = f"sim:{os.path.realpath(s.selector)}" if s.kind == "sim" else str(s)
        if key in seen:
            raise Refusal(f"board {s} is named twice" + (f" (it is {key})" if key != str(s) else ""))
        seen.add(key)
        if s.kind == "sim" and not (Path(s.selector) / "board.json").is_file():
            raise Refusal(f"{s.selector} is not an emulated board (create one with 'amdflash sim create')")
    if unbind_driver:
        specs = [dataclasses.replace(s, unbind_driver=True) for s in specs]
    return specs


OPERATOR_MAX = 256   # characters: a name, a team, a ticket; not a document


def operator_name(value: str | None) -> str | None:
    """--operator as the trail may keep it: one line of printable text. It is shown in every
    report of the run (a newline there would forge a line of the report, an escape sequence
    repaint the reader's terminal), and a fleet job carries it to each host's command line."""
    if value is None:
        return None
    if not value or len(value) > OPERATOR_MAX or not value.isprintable():
        raise Refusal(f"--operator {printable(value[:60])}{'…' if len(value) > 60 else ''}: one line of printable "
                      f"text, 1 to {OPERATOR_MAX} characters")
    return value


def prescale(value: int) -> int:
    if not 0 <= value <= PRESCALE_MAX:
        raise Refusal(f"--prescale {value}: must be 0..{PRESCALE_MAX} (SPI clock 100 MHz/(N+1))")
    return value


def read_range(address: int, size: int) -> None:
    if address < 0 or address >= FLASH_SIZE:
        raise Refusal(f"read address {address:#x} is outside the 2 MiB flash (0..{FLASH_SIZE - 1:#x})")
    if size <= 0:
        raise Refusal(f"read size {size:#x}: must be at least 1 byte")
    if address + size > FLASH_SIZE:
        raise Refusal(f"read {address:#x}+{size:#x} runs past the end of the 2 MiB flash "
                      f"(at most {FLASH_SIZE - address:#x} bytes from {address:#x})")


def sector_range(start: int, count: int | None) -> int:
    """The sector count to flash (default: to the end); Refusal if the range leaves the flash."""
    if not 0 <= start < SECTORS:
        raise Refusal(f"--start-sector {start}: the flash has sectors 0..{SECTORS - 1} (4 KiB each)")
    if count is None:
        return SECTORS - start
    if not 1 <= count <= SECTORS - start:
        raise Refusal(f"--sector-count {count}: from sector {start} there are 1..{SECTORS - start} sectors")
    return count


def retries(value: int) -> int:
    if not 0 <= value <= 100:
        raise Refusal(f"--retries {value}: must be 0..100")
    return value
