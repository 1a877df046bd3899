"""A config file that names a command run on other hosts (fleet_host_command) is taken only if
nobody but its owner and root can change it (issue 28 item 12): whoever could edit it would run
their command on every host of the line."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

SETTINGS = 'fleet_hosts = ["hosta"]\nfleet_host_command = "/opt/amdflash/bin/amdflash"\n'


def config(tmp_path: Path, text: str, mode: int) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    os.chmod(path, mode)
    return path


@pytest.mark.parametrize("mode", [0o664, 0o646, 0o666, 0o620], ids=lambda m: f"{m:04o}")
def test_a_config_others_may_write_is_refused_when_it_names_the_host_command(amdflash, tmp_path, mode) -> None:
    path = config(tmp_path, SETTINGS, mode)
    r = amdflash("--config", path, "runs")
    assert r.code == 2, r.err
    assert f"config file {path} sets fleet_host_command" in r.err and f"mode {mode:04o}" in r.err
    assert r.err_lines == [r.err_lines[0]] and r.err.startswith("error: ")


@pytest.mark.skipif(os.getuid() != 0, reason="giving a file to another user needs root")
def test_a_config_of_another_user_is_refused_when_it_names_the_host_command(amdflash, tmp_path) -> None:
    path = config(tmp_path, SETTINGS, 0o644)
    os.chown(path, 65534, 65534)
    r = amdflash("--config", path, "runs")
    assert r.code == 2 and "owned by uid 65534, neither root nor this user" in r.err, r.err


def test_the_owner_s_own_config_is_taken_and_others_settings_are_not_checked(amdflash, tmp_path) -> None:
    synth = ("sim", "synth", "-o", tmp_path / "synth.bin", "--overwrite")
    r = amdflash("--config", config(tmp_path, SETTINGS, 0o644), *synth)
    assert r.code == 0, r.err
    # Settings that decide neither trust nor place: a shared config stays as it was, taken.
    r = amdflash("--config", config(tmp_path, 'reads = 2\nprescale = 4\nprogress = false\n', 0o666), *synth)
    assert r.code == 0, r.err


@pytest.mark.parametrize("setting", ['db = "/tmp/elsewhere.sqlite"', 'fleet_hosts = ["hosta"]',
                                     'notify = ["json://localhost:1/"]', 'board = "usb:0"'])
def test_a_config_others_may_write_is_refused_when_it_decides_trust_or_place(amdflash, tmp_path, setting) -> None:
    """Issue 41 item 2: whoever may edit the config must not move the trail (and with it the
    key a run is checked against), choose the fleet's hosts, silence the line's notifications
    or point a flash at another board."""
    path = config(tmp_path, setting + "\n", 0o666)
    r = amdflash("--config", path, "runs")
    key = setting.split(" ")[0]
    assert r.code == 2 and f"config file {path} sets {key}," in r.err and "mode 0666" in r.err, r.err
    assert len(r.err_lines) == 1
