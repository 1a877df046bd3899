"""What the fleet client accepts from the coordinator, checked without one (pipeline/fleet/trust.py;
the same attacks through a real coordinator and rogue exporters: test_untrusted.py)."""
from __future__ import annotations

import pytest

from amdflash.pipeline.fleet.trust import DEFAULT_DB, Allowlist, Untrusted, board_problem, ssh_argv

labgrid = pytest.importorskip("labgrid", reason="labgrid is not installed (pip install '.[test]' brings it)")

ALLOW = Allowlist.parse(["hosta", "hostb=/srv/b/audit.sqlite"], "test")
GOOD = {"host": "hosta", "spec": "usb:0A1B2C3D", "kind": "usb", "chip": "GigaDevice GD25LQ16E", "jedec": "c86015",
        "unique_id": "e160ac3ae2e9026a3ef15b8cf29ef507", "bridge_serial": "0A1B2C3D", "emulated": None,
        "db": DEFAULT_DB}


def problem(**changes) -> str | None:
    args = {k: v for k, v in {**GOOD, **changes}.items() if v is not None}
    return board_problem("NetworkAmdflashBoard", args, {}, ALLOW, str(args["host"]))   # its own exporter


def test_a_well_formed_board_of_an_allowed_host_is_used() -> None:
    assert problem() is None
    assert problem(kind="pci", spec="pci:0000:03:00.0", pci_address="0000:03:00.0", bridge_serial=None) is None
    assert problem(kind="sim", spec="sim:/var/lib/amdflash/boards/b1", emulated=True) is None
    assert board_problem("NetworkAmdflashBoard", {**GOOD, "host": "hostb", "db": "/srv/b/audit.sqlite"}, {}, ALLOW,
                         "hostb") is None


@pytest.mark.parametrize("changes, why", [
    ({"host": "hostc"}, "host hostc is not in the operator's allowlist"),
    ({"host": "-oProxyCommand=touch x"}, "is not a host name"),
    ({"command": "sh -c 'touch /tmp/x'"}, "attributes a board does not have (command="),
    ({"spec": "usb:0A1B2C3D; reboot"}, "is not a usb spec"),
    ({"spec": "sim:/srv/../etc", "kind": "sim"}, "is not a sim spec"),
    ({"spec": "sim:relative/board", "kind": "sim"}, "is not a sim spec"),
    ({"spec": "pci:0000:03:00.0"}, "is not a usb spec"),                 # a spec of another kind
    ({"kind": "amdgpu"}, "its kind 'amdgpu' is not of the form"),
    ({"bridge_serial": "../../.."}, "its bridge_serial '../../..' is not of the form"),
    ({"chip": "Giga\x1b[2J"}, "its chip"),
    ({"emulated": "yes"}, "its emulated 'yes'"),
    ({"db": "/tmp/elsewhere.sqlite"}, "names the audit database '/tmp/elsewhere.sqlite'"),
    ({"db": None}, "names the audit database None"),
])
def test_a_malformed_or_foreign_board_is_refused_saying_why(changes: dict, why: str) -> None:
    found = problem(**changes)
    assert found is not None and why in found, found


def test_another_class_another_exporter_or_a_proxy_is_refused() -> None:
    assert "its class is AmdflashBoard" in board_problem("AmdflashBoard", GOOD, {}, ALLOW, "hosta")
    assert "exporter rogue publishes it for host hosta" in board_problem("NetworkAmdflashBoard", GOOD, {}, ALLOW,
                                                                         "rogue")
    assert "SSH proxy 'jump'" in board_problem("NetworkAmdflashBoard", GOOD, {"proxy": "jump", "proxy_required": True},
                                              ALLOW, "hosta")


@pytest.mark.parametrize("entries, why", [
    ([], "names no host"),
    (["hosta,,"], None),
    (["hosta=db.sqlite"], "must be an absolute, normalised path"),
    (["hosta=/srv/../etc/x"], "must be an absolute, normalised path"),
    (["host a"], "is not a host name"),
    ([7], "is not HOST or HOST=DATABASE"),
])
def test_the_allowlist_is_host_names_each_with_its_database(entries: list, why: str | None) -> None:
    if why is None:
        assert Allowlist.parse(entries, "fleet_hosts").hosts == {"hosta": DEFAULT_DB}
        return
    with pytest.raises(Untrusted, match=why):
        Allowlist.parse(entries, "fleet_hosts")


def test_the_driver_runs_its_own_command_over_strict_ssh_of_its_own() -> None:
    from labgrid import Target

    from amdflash.pipeline.fleet.labgrid_board import AmdflashDriver, JobError, NetworkAmdflashBoard

    target = Target("bench")
    NetworkAmdflashBoard(target, None, host="hosta", spec="usb:0A1B2C3D", kind="usb", db=DEFAULT_DB)
    driver = AmdflashDriver(target, None)
    driver.host_command, driver.hosts = "/opt/amdflash/bin/amdflash", ["hosta"]
    target.activate(driver)
    argv = driver.command("info", also=["usb:0A1B2C3E"])
    assert argv[:2] == ["ssh", "-x"] and argv[-3:-1] == ["--", "hosta"]
    options = [argv[i + 1] for i, a in enumerate(argv[:-3]) if a == "-o"]
    assert {"StrictHostKeyChecking=yes", "BatchMode=yes", "ControlPath=none", "ControlMaster=no"} <= set(options)
    assert argv[-1] == ("/opt/amdflash/bin/amdflash fleet job --host-name hosta --board usb:0A1B2C3D --board usb:0A1B2C3E "
                        f"--db {DEFAULT_DB} info")
    driver.hosts = ["hostb"]                              # hosta no longer allowed: nothing is built
    with pytest.raises(JobError, match="host hosta is not in the operator's allowlist"):
        driver.command("info")


def test_ssh_quotes_every_argument_for_the_remote_shell() -> None:
    argv = ssh_argv("hosta", ["amdflash", "fleet", "job", "--board", "sim:/b o;ard", "dump"])
    assert argv[-1] == "amdflash fleet job --board 'sim:/b o;ard' dump"


def test_a_host_not_allowed_names_the_exporter_s_line_name_as_a_cause() -> None:
    """A machine called `vm` that is `hosta` on the line publishes as `vm` until its exporter is
    given the line's name: the refusal says so, beside the allowlist (issue 27, a line brought
    up from the README)."""
    why = problem(host="vm")
    assert "host vm is not in the operator's allowlist (hosta, hostb" in why
    assert "--name NAME --hostname NAME" in why and "step 5" in why
