"""`amdflash fleet exporter-config`: this host's boards as a labgrid exporter configuration.

The boards come from `amdflash list --format json` (USB bridges by serial, native PCI
boards by address); emulated boards only when named (`--sim DIR`), each listed through the
real USB driver with `AMDFLASH_SIM_USB` so that its identity is what the driver reads.

One resource group per board, holding one `NetworkAmdflashBoard`. labgrid's exporter does
not need amdflash to publish it: the class is resolved by the client. The file is a
labgrid template: `host` is the exporter's `--hostname` (what clients SSH to), and
comments start with `##` because labgrid reads `#` lines as template statements.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import shlex
import socket
import subprocess
import sys
import unicodedata
from pathlib import Path
from typing import Any

from amdflash.pipeline.fleet.attributes import BOARD_ATTRIBUTES, RESOURCE_CLASS
from amdflash.stages.terminal import printable


def amdflash_command() -> str:
    """How this machine runs amdflash: the running entry script, else this interpreter's module
    (the fleet client's default host-job command: the README installs amdflash at the same
    place on every machine of a line)."""
    script = Path(sys.argv[0])
    if script.name == "amdflash" and os.access(script, os.X_OK):
        return str(script.resolve())
    return f"{shlex.quote(sys.executable)} -m amdflash.pipeline.cli"


def _list_boards(env_sim: str | None) -> list[dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if k != "AMDFLASH_SIM_USB"}
    if env_sim:
        env["AMDFLASH_SIM_USB"] = env_sim
    done = subprocess.run([sys.executable, "-m", "amdflash.pipeline.cli", "-q", "list", "--format", "json"],
                          env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"amdflash list failed: {done.stderr.strip()}")
    return json.loads(done.stdout)


def _group(kind: str, key: str) -> str:
    return f"{kind}-" + "".join(c if c.isalnum() else "_" for c in key.lower())


def board_entry(listed: dict[str, Any], db: str, sim_dir: str | None = None) -> tuple[str, dict[str, Any]]:
    """(group name, resource attributes) of one board as `amdflash list` shows it."""
    if sim_dir is not None:
        spec = f"sim:{os.path.abspath(sim_dir)}"
        group = _group("sim", (listed.get("unique_id") or "")[:12] or listed.get("serial") or os.path.basename(sim_dir))
        kind = "sim"
    elif listed["kind"] == "usb":
        spec = listed.get("spec_serial") or listed["spec"]
        group = _group("usb", listed.get("serial") or listed["spec"].split(":", 1)[1])
        kind = "usb"
    else:
        spec = listed["spec"]
        group = _group("pci", listed["pci_address"])
        kind = "pci"
    attributes = {
        "spec": spec, "kind": kind, "chip": listed.get("chip"), "jedec": listed.get("jedec"),
        "unique_id": listed.get("unique_id"), "bridge_serial": listed.get("serial"),
        "pci_address": listed.get("pci_address"), "emulated": True if sim_dir or listed.get("emulated") else None,
        "db": db,
    }
    return group, {k: attributes[k] for k in BOARD_ATTRIBUTES if attributes.get(k) is not None}


def previous_identities(path: Path | None) -> dict[str, dict[str, Any]]:
    """{spec: attributes} from an earlier configuration, for boards busy with a job now."""
    if path is None or not path.is_file():
        return {}
    import yaml   # comes with labgrid, which an exporter host has

    try:
        groups = yaml.safe_load(path.read_text()) or {}
        return {r[RESOURCE_CLASS]["spec"]: r[RESOURCE_CLASS] for r in groups.values() if RESOURCE_CLASS in r}
    except (yaml.YAMLError, AttributeError, KeyError, TypeError):
        return {}


def _list_sim(d: str, earlier: dict[str, Any] | None) -> dict[str, Any] | None:
    """`amdflash list` of one emulated board, or what an earlier configuration knew while it is busy.

    The emulated bridge in front of the board takes the board's own lock (its directory, as a
    job's sim: spec does), so a board busy with a job lists as busy without being touched.
    """
    found = _list_boards(d)
    if len(found) != 1:
        raise RuntimeError(f"{d}: expected one emulated bridge, amdflash list shows {len(found)}")
    entry = found[0]
    if not str(entry.get("status") or "").startswith("busy"):
        return entry
    if not earlier:
        return None
    return {**entry, "serial": entry.get("serial") or earlier.get("bridge_serial"),
            **{k: earlier[k] for k in ("chip", "jedec", "unique_id") if k in earlier}}


def host_boards(sim_dirs: list[str], hardware: bool, db: str,
                previous: dict[str, dict[str, Any]] | None = None) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """{group: attributes} of this host's boards, and notes on boards left out.

    A board busy with a job cannot be probed (listing never waits for it): it keeps the
    identity an earlier configuration (`previous`, by spec) gave it.
    """
    previous = previous or {}
    groups: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    listed: list[tuple[dict[str, Any], str | None]] = []
    if hardware:
        listed += [(b, None) for b in _list_boards(None)]
    for d in sim_dirs:
        if not (Path(d) / "board.json").is_file():
            raise ValueError(f"{d} is not an emulated board (create one with 'amdflash sim create')")
        d = os.path.abspath(d)
        found = _list_sim(d, previous.get(f"sim:{d}"))
        if found is None:
            notes.append(f"left out sim:{d}: busy with a job, and no earlier configuration names it")
            continue
        listed.append((found, d))
    for board, sim_dir in listed:
        if board.get("spec") is None:
            notes.append(f"left out {board.get('usb_id')} (serial {board.get('serial')}): "
                         f"{board.get('error') or 'not an amdflash bridge'}")
            continue
        busy = str(board.get("status", "")).startswith("busy")
        earlier = previous.get(board_entry(board, db, sim_dir)[1]["spec"]) if busy else None
        if earlier:
            board = {**{k: earlier[k] for k in ("chip", "jedec", "unique_id") if k in earlier}, **board}
            notes.append(f"{earlier['spec']} is busy with a job: its identity is kept from the previous configuration")
        group, attributes = board_entry(board, db, sim_dir)
        if group in groups:
            notes.append(f"left out a second board named {group} ({attributes['spec']})")
            continue
        if board.get("kind") == "usb" and not board.get("serial") and sim_dir is None:
            notes.append(f"{attributes['spec']} has no serial: its index changes when bridges are re-plugged")
        for key in ("status", "error"):
            if board.get(key):
                notes.append(f"{attributes['spec']}: {board[key]}")
        groups[group] = attributes
    return groups, notes


def _escaped(c: str) -> bool:
    # labgrid renders the file with Jinja2 before reading the YAML: `{{`, `{%`, `{#` would start
    # an expression (one that can run code), and `##` after any text a comment that cuts the
    # line. YAML folds C1 controls and line or paragraph separators inside a quoted string.
    return c in "{}%#" or (c <= "\uffff" and unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp"))


def _scalar(value: Any) -> str:
    # JSON scalars are YAML scalars; strings stay quoted so no value is read as a number or date.
    # Characters above are written as \u escapes, which YAML's double-quoted strings read back as
    # themselves; others as they are (a character beyond U+FFFF escaped would be two surrogates,
    # which YAML reads back as two lone surrogates, and the exporter could not publish it).
    text = json.dumps(value, ensure_ascii=False)
    return "".join(f"\\u{ord(c):04x}" if _escaped(c) else c for c in text) if isinstance(value, str) else text


def _comment(text: str) -> str:
    # One line: `##` starts a comment that ends with the line, so text from a board or a path
    # (a newline, then YAML or a Jinja expression) must never begin another.
    return "## " + printable(text)


def render(groups: dict[str, dict[str, Any]], notes: list[str]) -> str:
    lines = [
        _comment(f"labgrid exporter configuration for {socket.gethostname()}, written by "
                 f"'amdflash fleet exporter-config' at {dt.datetime.now(dt.UTC).isoformat(timespec='seconds')}."),
        "## Regenerate it when boards are plugged or unplugged, then restart the exporter",
        "## (README, 'Running a line'). host is the exporter's --hostname: clients SSH there.",
    ]
    lines += [_comment(f"note: {n}") for n in notes]
    if not groups:
        lines.append("## no boards found on this host")
        return "\n".join(lines) + "\n{}\n"
    for group, attributes in groups.items():
        lines += [f"{group}:", f"  {RESOURCE_CLASS}:", "    host: '{{ hostname }}'"]
        lines += [f"    {k}: {_scalar(v)}" for k, v in attributes.items()]
    return "\n".join(lines) + "\n"
