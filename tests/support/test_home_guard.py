"""The suite's home guard (tests/support/home_guard.py), run as the suite runs it: a pytest of its
own whose "real home" is a directory here, on a test that writes where it must not, or only
where it may."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.home_guard import XDG

ROOT = Path(__file__).resolve().parents[2]

TINY = '''
import os
from pathlib import Path

import platformdirs


def test_the_home_is_not_the_real_one(monkeypatch):
    real = os.environ["FAKE_REAL_HOME"]
    monkeypatch.setenv("HOME", real)
    monkeypatch.undo()                       # puts back the guard's home, never the real one
    assert os.environ["HOME"] != real and not platformdirs.user_data_dir("amdflash").startswith(real)


def test_writes():
    {body}
'''


def run_guarded(tmp_path: Path, body: str) -> tuple[subprocess.CompletedProcess, Path]:
    """pytest -p the guard on a two-test file, HOME a fake real home; returns the run and that home."""
    real = tmp_path / "real-home"
    real.mkdir(exist_ok=True)
    work = tmp_path / "work"
    work.mkdir()
    (work / "pytest.ini").write_text("[pytest]\n")           # this run's own root: none of the repo's options
    (work / "test_tiny.py").write_text(TINY.format(body=textwrap.indent(body, "    ").strip()))
    env = {k: v for k, v in os.environ.items() if k not in XDG and not k.startswith(("PYTEST_", "AMDFLASH_"))}
    env.update(HOME=str(real), FAKE_REAL_HOME=str(real), PYTHONPATH=str(ROOT), AMDFLASH_DB=str(real / "mine.sqlite"))
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.support.home_guard", "-n", "0",
                          "-p", "no:cacheprovider", "-q", "test_tiny.py"],
                         cwd=work, env=env, capture_output=True, text=True, timeout=120)
    return run, real


def test_a_file_made_in_the_real_home_s_data_directory_fails_the_run(tmp_path):
    leak = "real-home/.local/share/amdflash/audit.sqlite"
    run, real = run_guarded(tmp_path, textwrap.dedent('''
        leak = Path(os.environ["FAKE_REAL_HOME"]) / ".local/share/amdflash/audit.sqlite"
        leak.parent.mkdir(parents=True)
        leak.write_bytes(b"a run the user never ran")
        assert "AMDFLASH_DB" not in os.environ       # the user's own trail is named to no test
    '''))
    assert run.returncode == pytest.ExitCode.TESTS_FAILED, run.stdout + run.stderr
    assert "2 passed" in run.stdout, run.stdout                # the tests pass; the guard fails the run
    assert "which no test may touch" in run.stdout, run.stdout
    assert f"created {tmp_path / leak}" in run.stdout and f"created {real / '.local/share/amdflash'}" in run.stdout


def test_a_changed_config_file_in_the_real_home_fails_the_run(tmp_path):
    config = tmp_path / "real-home" / ".config" / "amdflash" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text("prescale = 3\n")
    os.utime(config, ns=(0, 0))
    run, _ = run_guarded(tmp_path, textwrap.dedent('''
        (Path(os.environ["FAKE_REAL_HOME"]) / ".config/amdflash/config.toml").write_text("prescale = 4\\n")
    '''))
    assert run.returncode == pytest.ExitCode.TESTS_FAILED and f"changed {config}" in run.stdout, run.stdout


def test_writing_only_in_the_guarded_home_passes(tmp_path):
    run, real = run_guarded(tmp_path, textwrap.dedent('''
        data = Path(platformdirs.user_data_dir("amdflash"))
        data.mkdir(parents=True)
        (data / "audit.sqlite").write_bytes(b"a test's own trail")
        config = Path.home() / ".config/amdflash"
        config.mkdir(parents=True)
        (config / "config.toml").write_text("prescale = 3\\n")
        assert Path.home() != Path(os.environ["FAKE_REAL_HOME"])
    '''))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "2 passed" in run.stdout and "real home" not in run.stdout, run.stdout
    assert sorted(p.name for p in real.iterdir()) == []       # nothing of it in the fake real home
