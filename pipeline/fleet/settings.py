"""The operator's fleet settings: which hosts the client may reach, and the command it runs there.

Both come from the operator — the command line or the config file — and never from the
coordinator (pipeline/fleet/trust.py says why):

    fleet_hosts = ["hosta", "hostb=/srv/amdflash/audit.sqlite"]   # or --hosts hosta,hostb
    fleet_host_command = "/opt/amdflash/bin/amdflash"               # default: this amdflash
"""
from __future__ import annotations

import shlex
from typing import Any

from amdflash.pipeline import config
from amdflash.pipeline.fleet.trust import Allowlist, Untrusted


def configured_hosts(given: list[str] | None = None) -> tuple[list[Any], str]:
    """The allowlist's entries and where they come from: `--hosts`, else `fleet_hosts` in the
    config file; Untrusted when the operator named none (the fleet then connects nowhere)."""
    if given:
        return list(given), "--hosts"
    hosts = config.load().get("fleet_hosts")
    if not hosts:
        raise Untrusted("no hosts allowed: the fleet connects only to the hosts the operator names, with --hosts "
                        f"HOST[,HOST…] or fleet_hosts = [\"HOST\", …] in {config.config_path()} (README, "
                        "'Running a line')")
    return ([hosts] if isinstance(hosts, str) else list(hosts)), f"fleet_hosts in {config.config_path()}"


def allowlist(given: list[str] | None = None) -> Allowlist:
    return Allowlist.parse(*configured_hosts(given))


def host_command() -> list[str]:
    """amdflash on the boards' hosts: `fleet_host_command` in the config file, else this amdflash
    (the same path on every machine of a line, as the README installs it)."""
    from amdflash.pipeline.fleet.export import amdflash_command

    configured = config.load().get("fleet_host_command")
    words = shlex.split(configured or amdflash_command())
    if not words:
        raise Untrusted(f"fleet_host_command in {config.config_path()} is empty")
    return words
