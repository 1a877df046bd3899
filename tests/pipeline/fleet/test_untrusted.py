"""The fleet client treats labgrid's coordinator as untrusted (issue 18, attack 8).

Anyone who reaches the coordinator can run an exporter and publish board resources: with a
command of their own, for a host they are not, with a database the host's push never sends,
or as a local resource that would run on the operator's own machine. The client runs only its
own host-job command, only on hosts in the operator's allowlist (each one's database pinned),
and refuses and reports every other resource; it checks each host's SSH key itself.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from tests.pipeline.fleet.lab import SSH_KEY_ALIAS, Lab

pytestmark = pytest.mark.slow


def published(lab: Lab, name: str) -> dict:
    """The attributes hosta's exporter publishes for its first board (host rendered)."""
    group, resources = next(iter(yaml.safe_load(lab.hosts[name].config.read_text()).items()))
    return {"group": group, **resources["NetworkAmdflashBoard"], "host": name}


def place_for(lab: Lab, place: str, match: str, *tags: str) -> None:
    """A place made by hand (or handed out by a rogue coordinator) for a resource."""
    for args in (("create",), ("add-match", match), ("set-tags", *tags)):
        done = lab.labgrid_client("-p", place, *args)
        assert done.returncode == 0, done.stderr


def test_a_rogue_exporter_cannot_make_the_fleet_run_anything_but_its_own_job(lab: Lab, tmp_path: Path) -> None:
    lab.add_host("hosta", 1, seed=100)
    lab.start_exporter("hosta")
    genuine = published(lab, "hosta")
    group = genuine.pop("group")
    mark = tmp_path / "pwned"
    evil = f"sh -c 'echo $0 >> {mark}; exit 0'"   # what each resource below would have run, and where
    # hostc, hostd and hoste are hosts the operator allows (their exporters are compromised);
    # "rogue" is nobody's. Every host name reaches this machine's sshd in the lab.
    lab.allow(f"hosta={lab.hosts['hosta'].db}", f"hostc={genuine['db']}", f"hostd={genuine['db']}",
              f"hoste={genuine['db']}")
    rogues = {
        "rogue": ("NetworkAmdflashBoard", {**genuine, "host": "hosta", "command": evil}),      # another host's board
        "hostc": ("NetworkAmdflashBoard", {**genuine, "host": "hostc", "command": evil}),      # a command of its own
        "hostd": ("NetworkAmdflashBoard", {**genuine, "host": "hostd", "db": "/tmp/elsewhere.sqlite"}),
        "hoste": ("AmdflashBoard", {**genuine, "command": evil}),                              # runs on the client
    }
    for name, (cls, attributes) in rogues.items():
        lab.start_rogue(name, {group: {cls: attributes}})

    made = lab.make_places("line=a")                      # waits for hosta's board; then every exporter is up
    done = lab.amdflash("fleet", "places", "--tag", "line=a", "--format", "json")
    assert [p["place"] for p in json.loads(done.stdout)] == [p["place"] for p in made] == [f"hosta-{group}"]
    for name in rogues:
        assert f"refused the board resource {name}/{group}/" in done.stderr, done.stderr

    # A rogue coordinator hands out places for them anyway (or someone made them by hand).
    for name, (cls, _) in rogues.items():
        place_for(lab, f"{name}-bad", f"{name}/{group}/{cls}/{cls}", "line=a")
    result = lab.fleet("info", "--where", "line=a")
    assert not mark.exists(), mark.read_text()            # nothing of theirs ran, anywhere
    assert result.code == 2, result.boards                  # refused, as a refused board
    assert result.boards[f"hosta-{group}"]["status"] == "succeeded"
    why = {name: result.boards[f"{name}-bad"] for name in rogues}
    assert all(row["status"] == "refused" and row["run_id"] is None for row in why.values()), why
    assert "exporter rogue publishes it for host hosta" in why["rogue"]["error"]
    assert "attributes a board does not have (command=" in why["hostc"]["error"]
    assert "names the audit database '/tmp/elsewhere.sqlite'" in why["hostd"]["error"]
    assert "its class is AmdflashBoard" in why["hoste"]["error"]
    assert sum("refused the board resource" in note for note in result.notes) == len(rogues)

    # Without the operator's word for a host, nothing is run on it at all.
    lab.allow(f"hostc={genuine['db']}")
    result = lab.fleet("info", "--where", "line=a")
    assert result.boards[f"hosta-{group}"]["status"] == "refused"
    assert "host hosta is not in the operator's allowlist" in result.boards[f"hosta-{group}"]["error"]
    assert not mark.exists()


def test_the_fleet_checks_each_hosts_ssh_key_itself(lab: Lab) -> None:
    """An SSH master connection to hosta opened outside amdflash without checking the host key
    (ControlMaster in the user's ssh configuration) is not used: the job's own connection
    checks the key strictly, and a host whose key known_hosts does not hold is refused."""
    lab.add_host("hosta", 1, seed=100)
    lab.start_exporter("hosta")
    places = lab.make_places("line=a")
    assert lab.fleet("info").code == 0                    # with the right key in known_hosts

    ssh = lab.ssh_dir
    sockets = Path(tempfile.mkdtemp(prefix="amdflash-cm-"))    # a socket path must be short
    config = (ssh / "ssh_config").read_text()
    (ssh / "ssh_config").write_text(config + f"  ControlMaster auto\n  ControlPath {sockets}/%C\n  ControlPersist 120\n")
    other = ssh / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    kind, key = other.with_suffix(".pub").read_text().split()[:2]
    (ssh / "known_hosts").write_text(f"{SSH_KEY_ALIAS} {kind} {key}\n")   # not hosta's key
    opened = subprocess.run(["ssh", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-fN",
                             "hosta"], env=lab.env(), capture_output=True, text=True, timeout=60)
    assert opened.returncode == 0, opened.stderr         # the user's own session, key unchecked

    try:
        result = lab.fleet("info")
    finally:
        subprocess.run(["ssh", "-O", "exit", "hosta"], env=lab.env(), capture_output=True, timeout=60)
        shutil.rmtree(sockets, ignore_errors=True)
    row = result.boards[places[0]["place"]]
    assert result.code == 2 and row["status"] == "refused", result.boards
    assert "SSH host key of hosta is not the one known_hosts holds" in row["error"] and row["run_id"] is None
