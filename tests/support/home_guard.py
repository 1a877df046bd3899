"""A pytest plugin: no test touches the user's home, and a run that did fails.

Every pytest process (the controller and each xdist worker) moves HOME and the XDG base
directories into a temporary home of its own before any test runs. It sets them in os.environ
itself, not through a fixture's monkeypatch, so a test's `monkeypatch.undo()` puts back the
temporary home, never the real one; every amdflash process a test starts inherits it. The
user's own $AMDFLASH_DB and $AMDFLASH_CONFIG are dropped as well: they would name the user's
trail and config to any test that does not name its own.

The controller also snapshots amdflash's directories in the real home (data, config, state:
platformdirs' and the literal ~/.local/share, ~/.config, ~/.local/state ones, for $HOME and
for the account's home) and compares them when the session ends: anything created, changed or
removed there fails the run, naming the paths. (amdflash run by the user at the same time
would trip it too; the message says so.)

Loaded by tests/conftest.py (pytest_plugins); `-p tests.support.home_guard` loads it alone.
"""
from __future__ import annotations

import os
import pwd
import shutil
import stat
import sys
import tempfile
from pathlib import Path

import pytest

APP = "amdflash"
# The XDG base directories under the temporary home, as the spec's defaults lay them out.
XDG = {"XDG_DATA_HOME": ".local/share", "XDG_CONFIG_HOME": ".config",
       "XDG_CACHE_HOME": ".cache", "XDG_STATE_HOME": ".local/state"}
# What names the user's own trail or config without a home in it.
DROPPED = ("AMDFLASH_DB", "AMDFLASH_CONFIG")

_home = pytest.StashKey[Path]()
_before = pytest.StashKey[dict[str, dict[str, tuple]]]()
_leaks = pytest.StashKey[list[str]]()


def watched_dirs() -> list[str]:
    """amdflash's directories in the home the environment names now (call before moving it)."""
    import platformdirs

    homes = {os.path.expanduser("~")}
    try:
        homes.add(pwd.getpwuid(os.getuid()).pw_dir)
    except KeyError:                 # an account without a passwd entry (some containers)
        pass
    dirs = [platformdirs.user_data_dir(APP), platformdirs.user_config_dir(APP), platformdirs.user_state_dir(APP)]
    subs = (".local/share", ".config", ".local/state")
    dirs += [os.path.join(home, sub, APP) for home in homes if home for sub in subs]
    unique: dict[str, str] = {}
    for d in dirs:
        unique.setdefault(os.path.realpath(d), os.path.abspath(d))
    return sorted(unique.values())


def snapshot(root: str) -> dict[str, tuple]:
    """Every entry under root: {relative path: (kind, size, mtime, inode, mode) or link target}.
    A directory that does not exist is {}; one that does has at least its own entry '.'."""
    seen: dict[str, tuple] = {}
    try:
        top = os.lstat(root)
    except FileNotFoundError:
        return seen
    seen["."] = ("dir",) if stat.S_ISDIR(top.st_mode) else _entry(root, top)
    if not stat.S_ISDIR(top.st_mode):
        return seen
    for where, dirs, files in os.walk(root, onerror=lambda error: None):
        for name in dirs + files:
            path = os.path.join(where, name)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            # A directory's own times change with its entries, which are compared themselves.
            seen[os.path.relpath(path, root)] = ("dir",) if stat.S_ISDIR(st.st_mode) else _entry(path, st)
    return seen


def _entry(path: str, st: os.stat_result) -> tuple:
    if stat.S_ISLNK(st.st_mode):
        return ("link", os.readlink(path))
    return ("file", st.st_size, st.st_mtime_ns, st.st_ino, stat.S_IMODE(st.st_mode))


def differences(before: dict[str, dict[str, tuple]], after: dict[str, dict[str, tuple]]) -> list[str]:
    """'created PATH', 'changed PATH', 'removed PATH' for each watched directory's entries."""
    found = []
    for root in sorted(before):
        old, new = before[root], after.get(root, {})
        for rel in sorted(set(old) | set(new)):
            path = os.path.normpath(os.path.join(root, rel))
            if rel not in old:
                found.append(f"created {path}")
            elif rel not in new:
                found.append(f"removed {path}")
            elif old[rel] != new[rel]:
                found.append(f"changed {path}")
    return found


def guard_environment(prefix: str) -> Path:
    """Move HOME and the XDG directories into a new temporary home; returns it."""
    home = Path(tempfile.mkdtemp(prefix=prefix))
    os.environ["HOME"] = str(home)
    for name, sub in XDG.items():
        os.environ[name] = str(home / sub)
    for name in DROPPED:
        os.environ.pop(name, None)
    return home


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    worker = getattr(config, "workerinput", None)
    if worker is None:               # the controller (or the only process, -n 0): it keeps watch
        config.stash[_before] = {d: snapshot(d) for d in watched_dirs()}
        config.stash[_home] = guard_environment("amdflash-test-home-")
    else:                            # a worker: a home of its own, so workers share no default trail
        config.stash[_home] = guard_environment(f"amdflash-test-home-{worker['workerid']}-")


# trylast: after the session's fixtures are torn down (they may write on teardown) and, under
# xdist, after every worker has finished.
@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    before = session.config.stash.get(_before, None)
    if before is None:
        return
    leaks = differences(before, {d: snapshot(d) for d in before})
    session.config.stash[_leaks] = leaks
    if not leaks:
        return
    # pytest returns session.exitstatus as the process's exit status once this hook returns.
    if session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if session.config.pluginmanager.get_plugin("terminalreporter") is None:
        print(message(leaks), file=sys.stderr)


def message(leaks: list[str]) -> str:
    shown = leaks[:20] + ([f"... and {len(leaks) - 20} more"] if len(leaks) > 20 else [])
    return ("error: this run changed amdflash's directories in the real home, which no test may touch, so it "
            "fails whatever the tests say (an amdflash you ran yourself meanwhile would show here too):\n  "
            + "\n  ".join(shown))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int,
                            config: pytest.Config) -> None:
    leaks = config.stash.get(_leaks, None)
    if leaks:
        terminalreporter.section("home guard", sep="=", red=True, bold=True)
        terminalreporter.line(message(leaks), red=True)


def pytest_unconfigure(config: pytest.Config) -> None:
    home = config.stash.get(_home, None)
    if home is not None:
        shutil.rmtree(home, ignore_errors=True)
