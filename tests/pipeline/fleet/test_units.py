"""The files an operator installs on a line's machines: they name commands and options that exist."""
from __future__ import annotations

import configparser
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from amdflash.pipeline.cli.main import build_parser
from amdflash.stages.transport.usb import BRIDGE_IDS

UNITS = Path(__file__).resolve().parents[3] / "pipeline" / "fleet" / "units"
BIN = Path(sys.executable).parent


def unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read(UNITS / name)
    return parser


def test_exporter_unit_writes_the_board_list_then_exports_it() -> None:
    service = unit("amdflash-exporter.service")["Service"]
    pre = shlex.split(service["ExecStartPre"])
    start = shlex.split(service["ExecStart"])
    assert Path(pre[0]).name == "amdflash" and Path(start[0]).name == "labgrid-exporter"
    args = build_parser().parse_args(pre[1:])            # options the command line really has
    assert (args.command, args.fleet_command) == ("fleet", "exporter-config")
    assert str(args.output) == start[-1]                  # the exporter reads what was just written
    assert Path(args.db).parent == Path("/var/lib") / service["StateDirectory"]
    assert str(args.output).startswith("/run/" + service["RuntimeDirectory"] + "/")


@pytest.mark.parametrize("name, tool", [("amdflash-exporter.service", "labgrid-exporter"),
                                        ("labgrid-coordinator.service", "labgrid-coordinator")])
def test_labgrid_options_in_the_units_exist(name: str, tool: str) -> None:
    pytest.importorskip("labgrid")
    start = shlex.split(unit(name)["Service"]["ExecStart"])
    usage = subprocess.run([str(BIN / tool), "--help"], capture_output=True, text=True, timeout=60).stdout
    for option in (a for a in start[1:] if a.startswith("--")):
        assert option in usage


def test_udev_rules_name_the_bridges_the_driver_opens() -> None:
    rules = (UNITS / "70-amdflash-fleet.rules").read_text()
    ids = {(int(v, 16), int(p, 16)) for v, p in re.findall(r'idVendor}=="(\w+)", ATTRS{idProduct}=="(\w+)"', rules)}
    assert ids == set(BRIDGE_IDS)
    products = re.search(r'ENV{PRODUCT}=="([^"]+)"', rules).group(1).split("|")
    assert {tuple(int(x, 16) for x in p.split("/")[:2]) for p in products} == set(BRIDGE_IDS)
    assert "restart amdflash-exporter.service" in rules


def test_push_unit_pushes_the_exporters_trail_on_a_timer() -> None:
    service = unit("amdflash-push.service")["Service"]
    argv = shlex.split(service["ExecStart"])
    assert Path(argv[0]).name == "amdflash"
    args = build_parser().parse_args(argv[1:])
    assert (args.command, args.audit_command) == ("audit", "push")
    exporter = shlex.split(unit("amdflash-exporter.service")["Service"]["ExecStartPre"])
    assert args.db == build_parser().parse_args(exporter[1:]).db          # the trail the jobs write
    assert service["User"] == unit("amdflash-exporter.service")["Service"]["User"]   # and its host key
    assert "AMDFLASH_CENTRAL" in (UNITS / "amdflash-push.service").read_text()
    assert unit("amdflash-push.timer")["Timer"]["OnUnitActiveSec"]


def seconds(span: str) -> float:
    """A systemd time span ("30s", "1min 30s", "5min", "2h") in seconds (systemd.time(7))."""
    units = {"us": 1e-6, "ms": 1e-3, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600}
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", span)
    assert parts and "".join(n + u for n, u in parts) == span.replace(" ", ""), span
    return sum(float(n) * units[u or "s"] for n, u in parts)


def test_every_sealed_checkpoint_is_pushed_within_a_minute() -> None:
    """The window in which a stolen key can rewrite history nobody else holds is the push
    interval: the timer's period, plus how late systemd may fire it (AccuracySec, a minute by
    default), plus any random delay, stays within a minute."""
    timer = unit("amdflash-push.timer")["Timer"]
    window = (seconds(timer["OnUnitActiveSec"]) + seconds(timer.get("AccuracySec", "1min"))
              + seconds(timer.get("RandomizedDelaySec", "0")))
    assert window <= 60, window
    assert seconds(timer["OnBootSec"]) <= 60
    assert "every 30 seconds" in (UNITS / "amdflash-push.service").read_text()


def test_follow_unit_publishes_the_exporters_trail_and_names_its_places() -> None:
    service = unit("amdflash-follow.service")["Service"]
    argv = shlex.split(service["ExecStart"].replace("%H", "hosta"))
    assert Path(argv[0]).name == "amdflash"
    args = build_parser().parse_args(argv[1:])
    assert (args.command, args.audit_command, args.follow) == ("audit", "push", True)
    exporter = unit("amdflash-exporter.service")["Service"]
    pre = build_parser().parse_args(shlex.split(exporter["ExecStartPre"])[1:])
    assert args.db == pre.db and args.exporter_config == pre.output        # the jobs' trail, the exporter's list
    assert "--hostname %H" in exporter["ExecStart"] and "--host-name %H" in service["ExecStart"]
    assert service["User"] == exporter["User"] and service["Restart"] == "always"
    assert args.push_every <= 30                                             # no longer a window than the timer's


def test_serve_unit_listens_on_loopback_read_only_with_its_secrets_as_credentials() -> None:
    service = unit("amdflash-serve.service")["Service"]
    argv = shlex.split(service["ExecStart"])
    args = build_parser().parse_args(argv[1:])
    assert (args.command, args.fleet_command) == ("fleet", "serve")
    assert args.listen.startswith("127.0.0.1:")
    text = (UNITS / "amdflash-serve.service").read_text()
    assert "amdflash_read" in text and "DynamicUser=yes" in text
    assert "PGPASSFILE=%d/pgpass" in text and "AMDFLASH_CONFIG=%d/config" in text


def test_the_readme_s_exporter_override_changes_only_what_it_says() -> None:
    """The README's override for a host whose OS name is not its line name, with emulated
    boards: the unit's own commands with `--sim DIR` added and `--name/--hostname` given, and
    each line cleared before it is set (systemd appends ExecStartPre= lines otherwise)."""
    readme = (UNITS.parents[2] / "README.md").read_text()
    block = re.search(r"```ini\n(\s*\[Service\]\n.*?)```", readme, re.S).group(1)
    lines = [line.strip() for line in block.splitlines() if line.strip()]
    assert lines[:2] == ["[Service]", "ExecStartPre="] and lines[3] == "ExecStart=", lines
    service = unit("amdflash-exporter.service")["Service"]
    pre = shlex.split(lines[2].removeprefix("ExecStartPre="))
    assert pre[:len(shlex.split(service["ExecStartPre"]))] == shlex.split(service["ExecStartPre"])
    extra = pre[len(shlex.split(service["ExecStartPre"])):]
    assert extra and extra[::2] == ["--sim"] * (len(extra) // 2) and len(extra) % 2 == 0
    assert [str(d) for d in build_parser().parse_args(pre[1:]).sim] == extra[1::2]
    start = shlex.split(lines[4].removeprefix("ExecStart="))
    unit_start = shlex.split(service["ExecStart"])
    assert start[0] == unit_start[0] and start[-1] == unit_start[-1]
    assert start[1:-1] == ["--name", "hosta", "--hostname", "hosta"]


def test_the_readme_s_follow_override_names_the_host_as_the_line_does() -> None:
    readme = (UNITS.parents[2] / "README.md").read_text()
    blocks = [b for b in re.findall(r"```ini\n(.*?)```", readme, re.S) if "audit push --follow" in b]
    assert len(blocks) == 1
    lines = [line.strip() for line in blocks[0].splitlines() if line.strip()]
    assert lines[:2] == ["[Service]", "ExecStart="], lines
    start = shlex.split(lines[2].removeprefix("ExecStart="))
    unit_start = shlex.split(unit("amdflash-follow.service")["Service"]["ExecStart"])
    assert unit_start[-2:] == ["--host-name", "%H"] and start == [*unit_start[:-1], "hosta"]
