"""Output file names of a job that runs on several boards at once (`dump` with several --board).

OUTPUT may be a template: `{n}` is the board's place in the --board list (1, 2, …),
`{spec}` its spec made file-name safe, `{serial}` its bridge or board serial. With more
than one board the template must tell them apart: a name two boards would share is refused
before any board is opened. A serial that only the opened board can tell (usb:N, auto, pci)
is filled in when the run opens it, and a name already taken by another board of the same
command is refused then.
"""
from __future__ import annotations

import json
import re
import threading
from pathlib import Path

from amdflash.pipeline.errors import Refusal
from amdflash.stages.open_transport import BoardSpec

FIELDS = ("{n}", "{spec}", "{serial}")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_claims: dict[Path, str] = {}
_claims_lock = threading.Lock()


def has_fields(template: Path) -> bool:
    return any(f in str(template) for f in FIELDS)


def field_value(text: str) -> str:
    """A value a board or the user's spec gave, as part of a file name: letters, digits, '.',
    '-' and '_' only, starting and ending with neither '.' nor '_' — a serial cannot reach another directory."""
    safe = _UNSAFE.sub("_", text).strip("_.")
    return safe or "unknown"


def for_board(template: Path, n: int, spec: BoardSpec) -> Path:
    """The template with {n} and {spec} filled in, and {serial} if the spec already names it."""
    text = str(template).replace("{n}", str(n)).replace("{spec}", field_value(str(spec)))
    serial = known_serial(spec)
    return Path(text.replace("{serial}", serial) if serial else text)


def with_serial(path: Path, serial: str | None) -> Path:
    return Path(str(path).replace("{serial}", field_value(serial or "unknown")))


def known_serial(spec: BoardSpec) -> str | None:
    if spec.kind == "usb" and re.fullmatch(r"[0-9a-f]{8}", spec.selector):
        return spec.selector
    if spec.kind == "sim":
        try:
            serial = json.loads((Path(spec.selector) / "board.json").read_text()).get("serial")
        except (OSError, ValueError, AttributeError):
            return None
        return field_value(str(serial)) if serial else None
    return None


def check(template: Path, specs: list[BoardSpec]) -> None:
    """Refuse, before any board is opened, outputs that two boards would share. A command
    starts here: no output of an earlier command (in this process) is claimed any more."""
    with _claims_lock:
        _claims.clear()
    if len(specs) < 2:
        return
    if not has_fields(template):
        raise Refusal(f"{len(specs)} boards would all write {template}: use a name with {{serial}}, {{n}} or "
                      "{spec} in it, e.g. dump-{serial}.bin")
    names: dict[str, BoardSpec] = {}
    for n, spec in enumerate(specs, 1):
        name = str(for_board(template, n, spec))
        if "{serial}" in name:
            name = name.replace("{serial}", f"\0{n}")    # told apart once opened (checked then)
        if name in names:
            raise Refusal(f"boards {names[name]} and {spec} would both write {name}: "
                          "use {n} or {spec} in the output name")
        names[name] = spec


def claim(path: Path, spec: str) -> None:
    """Take `path` for this board, or fail naming the board of this command that has it."""
    key = path.resolve()
    with _claims_lock:
        owner = _claims.setdefault(key, spec)
    if owner != spec:
        raise Refusal(f"{path} is already the output of board {owner} in this command")
