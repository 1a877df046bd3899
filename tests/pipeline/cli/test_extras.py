"""udev rules, shell completion, the man page and the config file."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from amdflash.stages.transport.usb import BRIDGE_IDS


def test_udev_rules_cover_every_bridge_id_and_install_into_a_directory(amdflash, tmp_path):
    r = amdflash("udev-rules")
    assert r.code == 0
    rules = [line for line in r.out.splitlines() if line and not line.startswith("#")]
    found = {(int(v, 16), int(p, 16)) for v, p in
             (re.search(r'idVendor}=="(\w+)".*idProduct}=="(\w+)"', line).groups() for line in rules)}
    assert found == set(BRIDGE_IDS)
    assert all('TAG+="uaccess"' in line for line in rules)
    target = tmp_path / "rules.d"
    target.mkdir()
    r = amdflash("udev-rules", "--install", "--dir", target)
    assert r.code == 0 and "udevadm control --reload" in r.err
    assert (target / "70-amdflash.rules").read_text().strip() == amdflash("udev-rules").out.strip()
    assert amdflash("udev-rules", "--install", "--dir", tmp_path / "missing").code == 2


@pytest.mark.parametrize("shell,marker", [("bash", "complete "), ("zsh", "compdef"), ("fish", "complete --command amdflash")])
def test_completion_scripts_for_each_shell(amdflash, shell, marker):
    r = amdflash("completion", shell)
    assert r.code == 0 and marker in r.out and "amdflash" in r.out


def _complete(line: str, tmp_path: Path) -> list[str]:
    """What the shell would get for `line`: amdflash run the way the completion script runs it."""
    out = tmp_path / "completions"
    env = {**os.environ, "_ARGCOMPLETE": "1", "_ARGCOMPLETE_SHELL": "bash", "COMP_LINE": line,
           "COMP_POINT": str(len(line)), "_ARGCOMPLETE_STDOUT_FILENAME": str(out), "_ARGCOMPLETE_IFS": "\n"}
    subprocess.run([sys.executable, "-m", "amdflash"], env=env, capture_output=True, timeout=60)
    return [c.strip() for c in out.read_text().split("\n")]


def test_completion_completes_commands_and_options(tmp_path):
    assert {"verify", "flash", "dump"} <= set(_complete("amdflash ", tmp_path))
    assert "verify" in _complete("amdflash ver", tmp_path)
    assert "--prescale" in _complete("amdflash info --pre", tmp_path)
    assert {"rom-sw", "aperture"} <= set(_complete("amdflash dump x.bin --via ", tmp_path))


def test_man_page_is_generated_from_the_parser(amdflash, tmp_path):
    r = amdflash("man")
    assert r.code == 0 and r.out.startswith(".TH") and "amdflash" in r.out.splitlines()[0].lower()
    text = r.out.replace("\\-", "-")
    for command in ("flash", "verify", "resume", "udev-rules", "completion", "--prescale", "--log-json"):
        assert command in text
    assert "Exit status" in text
    headings = [line[4:] for line in text.splitlines() if line.startswith(".SH ")]
    for section in ("NAME", "SYNOPSIS", "DESCRIPTION", "GLOBAL OPTIONS", "BOARD OPTIONS", "ROM_SW ENGINE OPTIONS",
                    "EXIT STATUS", "ENVIRONMENT", "FILES", "EXAMPLES", "SEE ALSO"):
        assert section in headings, headings
    name = text.splitlines()[text.splitlines().index(".SH NAME") + 1]
    assert name.startswith("amdflash - ") and "Navi31" in name
    # Global and shared options are listed once, not under every command.
    assert text.count("--log-json") == 2 and text.count("--prescale") <= 3, (text.count("--log-json"),
                                                                                text.count("--prescale"))
    # A page of about a thousand lines: a grouped command gives its synopsis and first sentence;
    # its options are in its --help, which the page points to. (1,000 until the audit group
    # took its reviewer's and compliance commands: bundle, receipt, log, witness.)
    assert len(r.out.splitlines()) < 1100, len(r.out.splitlines())
    assert "amdflash GROUP COMMAND --help" in text
    fleet_runs = text[text.index("amdflash fleet runs"):]
    assert "--from" not in fleet_runs[:fleet_runs.index(".SH", 1) if ".SH" in fleet_runs[1:] else None].split(
        "amdflash fleet report")[0]
    assert amdflash("man", "-o", tmp_path / "amdflash.1").code == 0
    assert (tmp_path / "amdflash.1").read_text().rstrip("\n") == r.out.rstrip("\n")


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config" / "amdflash" / "config.toml"     # $XDG_CONFIG_HOME/amdflash/config.toml
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_config_file_gives_db_board_and_prescale_defaults(amdflash, make_board, tmp_path, monkeypatch):
    board = make_board(transport="ideal")
    db = tmp_path / "configured.sqlite"
    monkeypatch.delenv("AMDFLASH_DB")
    _config(tmp_path, f'db = "{db}"\nboard = "sim:{board}"\nprescale = 3\n')
    r = amdflash("info", "--json", "-q")
    assert r.code == 0, r.err
    import json
    rep = json.loads(r.out)
    assert rep["board"]["spec"] == f"sim:{board}" and rep["arguments"]["prescale"] == 3
    assert db.exists()
    r = amdflash("info", "--prescale", "5", "--json", "-q")            # the command line wins
    assert json.loads(r.out)["arguments"]["prescale"] == 5


def test_a_bad_config_file_is_a_usage_error(amdflash, tmp_path):
    _config(tmp_path, "prescal = 3\n")
    r = amdflash("runs")
    assert r.code == 2 and "unknown setting 'prescal'; did you mean 'prescale'?" in r.err
    _config(tmp_path, "prescale = 'fast'\n")
    assert "prescale = 'fast': must be a whole number" in amdflash("runs").err
    _config(tmp_path, "db = [\n")
    r = amdflash("runs")
    assert r.code == 2 and "config.toml" in r.err and len(r.err_lines) == 1
    assert amdflash("--config", tmp_path / "nowhere.toml", "runs").code == 2


def test_the_database_defaults_to_the_xdg_data_directory(amdflash, make_board, tmp_path, monkeypatch):
    from amdflash.pipeline import config

    monkeypatch.delenv("AMDFLASH_DB")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg-data"))
    assert config.default_db() == str(tmp_path / "xdg-data" / "amdflash" / "audit.sqlite")
    assert amdflash("info", "--board", f"sim:{make_board(transport='ideal')}", "-q").code == 0
    assert (tmp_path / "xdg-data" / "amdflash" / "audit.sqlite").exists()
