"""What the fleet client trusts: the operator's own settings, never the coordinator.

labgrid's coordinator has no authentication: anyone who reaches it can run an exporter and
publish resources, or stand in for the coordinator. Everything the client learns from it —
places, board resources, their attributes, an exporter's proxy settings — is a claim. So:

* the client connects only to the hosts in the operator's allowlist (`--hosts` or
  `fleet_hosts` in the config file), each with the audit database its jobs must write
  (`HOST=PATH`; `HOST` alone: the line's standard `/var/lib/amdflash/audit.sqlite`): a board
  whose trail would go elsewhere would escape the host's push to the central record;
* it runs only its own host-job command (`fleet_host_command` in the config file, else
  this amdflash), with arguments it builds from checked values — a resource never names
  a command;
* a board resource is used only if it is a `NetworkAmdflashBoard` whose host is its own
  exporter's name and allowlisted, that asks for no SSH proxy, and whose attributes are the
  board attributes, each of its expected form; anything else is refused and reported,
  never run;
* SSH runs with strict host-key checking on a connection of its own (not one multiplexed
  over a master opened elsewhere), so the host's key must be the one in known_hosts.
"""
from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from amdflash.pipeline.config import LINE_DB
from amdflash.pipeline.fleet.attributes import BOARD_ATTRIBUTES, RESOURCE_CLASS

#: Where a line host's jobs write their trail (the units' StateDirectory), unless pinned otherwise.
DEFAULT_DB = LINE_DB

_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,252}")   # a host name, as the exporter publishes it
_HEX8 = r"[0-9A-Fa-f]{8}"
_PCI = r"[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]"
_SPECS = {"usb": re.compile(rf"usb:(?:{_HEX8}|[0-9]{{1,3}})"), "pci": re.compile(rf"pci:{_PCI}")}
# Per attribute: (the types it may have, the form of its text).
_FORMS: dict[str, tuple[tuple[type, ...], re.Pattern[str] | None]] = {
    "kind": ((str,), re.compile(r"usb|pci|sim")),
    "chip": ((str,), re.compile(r"[ -~]{1,80}")),
    "jedec": ((str,), re.compile(r"[0-9a-f]{6}")),
    "unique_id": ((str,), re.compile(r"[0-9a-f]{1,64}")),
    "bridge_serial": ((str,), re.compile(_HEX8)),
    "pci_address": ((str,), re.compile(_PCI)),
    "emulated": ((bool,), None),
}


class Untrusted(ValueError):
    """A setting of the operator's is malformed (the message names it)."""


@dataclass(frozen=True)
class Allowlist:
    """The hosts the fleet client may connect to, each with the audit database its jobs write."""

    hosts: dict[str, str]

    @classmethod
    def parse(cls, entries: Iterable[Any], what: str) -> Allowlist:
        """`HOST` or `HOST=/path/to/audit.sqlite` entries (a comma-separated string may hold several)."""
        hosts: dict[str, str] = {}
        for entry in entries:
            if not isinstance(entry, str):
                raise Untrusted(f"{what}: {entry!r} is not HOST or HOST=DATABASE")
            for item in filter(None, (e.strip() for e in entry.split(","))):
                name, sep, db = item.partition("=")
                if not _HOST.fullmatch(name):
                    raise Untrusted(f"{what}: {name!r} is not a host name")
                if sep and not _safe_path(db):
                    raise Untrusted(f"{what}: {item!r}: the database must be an absolute, normalised path")
                hosts[name] = db if sep else DEFAULT_DB
        if not hosts:
            raise Untrusted(f"{what} names no host")
        return cls(hosts)

    def describe(self) -> str:
        return ", ".join(sorted(self.hosts))


def _safe_path(path: str) -> bool:
    """An absolute, normalised path of printable characters (no `..`, no control characters)."""
    return (path.startswith("/") and os.path.normpath(path) == path and path.isprintable()
            and ".." not in path.split("/"))


def board_problem(cls: str, args: Mapping[str, Any], extra: Mapping[str, Any], allow: Allowlist,
                  exporter: str | None = None) -> str | None:
    """Why this board resource must not be used (None: it may). `exporter`: the name of the
    exporter that published it, when known (the coordinator's word for it)."""
    if cls != RESOURCE_CLASS:
        return (f"its class is {cls}, not {RESOURCE_CLASS} (a resource of another class would run its job on this "
                "machine, or not through amdflash)")
    host = args.get("host")
    if not isinstance(host, str) or not _HOST.fullmatch(host):
        return f"its host {host!r} is not a host name"
    if exporter is not None and host != exporter:
        return (f"exporter {shown(exporter)} publishes it for host {host}: an exporter publishes only its own "
                "host's boards")
    if host not in allow.hosts:
        # The usual cause on a new line: the exporter publishes under its machine's OS name.
        return (f"host {host} is not in the operator's allowlist ({allow.describe()}; --hosts or fleet_hosts); if "
                f"{host} is the OS name of a machine the line calls otherwise, give its exporter the line's name "
                "(--name NAME --hostname NAME: README, 'Running a line', each host, step 5)")
    if extra.get("proxy_required"):
        return f"it asks to be reached through the SSH proxy {extra.get('proxy')!r}, which the fleet does not use"
    unexpected = sorted(set(args) - {"host", *BOARD_ATTRIBUTES})
    if unexpected:
        named = ", ".join(f"{shown(str(k))}={_short(args[k])}" for k in unexpected)
        return f"it carries attributes a board does not have ({named}): the fleet runs only its own command"
    kind, spec = args.get("kind"), args.get("spec")
    for key, (types, form) in _FORMS.items():
        value = args.get(key)
        if value is not None and (type(value) not in types or (form and not form.fullmatch(str(value)))):
            return f"its {key} {_short(value)} is not of the form a board's {key} has"
    if not isinstance(spec, str) or not _spec_ok(spec, kind):
        return f"its spec {_short(spec)} is not a {kind or 'board'} spec (usb:SERIAL, usb:N, pci:ADDRESS, sim:/PATH)"
    db = args.get("db")
    if db != allow.hosts[host]:
        return (f"it names the audit database {_short(db)}, and {host}'s jobs write {allow.hosts[host]} (the "
                "allowlist's HOST=DATABASE): a trail elsewhere would not reach the central record")
    return None


def _spec_ok(spec: str, kind: Any) -> bool:
    prefix = spec.split(":", 1)[0]
    if prefix != kind:
        return False
    if kind == "sim":
        return _safe_path(spec[4:])
    pattern = _SPECS.get(kind)
    return pattern is not None and pattern.fullmatch(spec) is not None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def shown(name: str) -> str:
    """A name the coordinator gave (exporter, group, place), safe for a terminal."""
    return name if name.isprintable() and len(name) <= 120 else _short(name)


def ssh_argv(host: str, command: list[str]) -> list[str]:
    """ssh to an allowlisted host, running `command` there: strict host-key checking, no
    password prompt, and a connection of its own — not a master connection someone opened
    with other options, whose host key this command would then never check."""
    options = ("BatchMode=yes", "StrictHostKeyChecking=yes", "PasswordAuthentication=no", "ControlMaster=no",
               "ControlPath=none", "ConnectTimeout=30", "LogLevel=ERROR")
    return ["ssh", "-x", *(a for o in options for a in ("-o", o)), "--", host, shlex.join(command)]


HOST_KEY_FAILED = "Host key verification failed"
