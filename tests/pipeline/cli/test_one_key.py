"""One database, one key: the trail is the same file, signed by the same key, whatever names it
(--db, $AMDFLASH_DB, the config file's `db`, a relative path, a link), and a trail an older
amdflash signed with a key beside its database goes on working (issue 40, items 1, 3 and 5).

These tests run without the suite's $AMDFLASH_HOST_KEY: the key is found as an operator's is."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from tests.pipeline.cli.conftest import flash_content
from tests.pipeline.cli.test_next_steps import first_differing_bit, pasted
from tests.support import cli

HOW = ["--db", "environment", "config file", "relative path", "link"]


@pytest.fixture(autouse=True)
def own_key(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No $AMDFLASH_HOST_KEY: the account's key, in its data directory ($XDG_DATA_HOME)."""
    monkeypatch.delenv("AMDFLASH_HOST_KEY", raising=False)
    monkeypatch.delenv("AMDFLASH_DB", raising=False)
    return tmp_path / "data" / "amdflash" / "host_key.pem"


def name_it(how: str, db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], dict]:
    """The global options and environment that name `db` the way `how` says."""
    if how == "--db":
        return ["--db", str(db)], {}
    if how == "environment":
        return [], {"AMDFLASH_DB": str(db)}
    if how == "config file":
        config = tmp_path / "line config.toml"
        config.write_text(f'db = "{db}"\n')
        return [], {"AMDFLASH_CONFIG": str(config)}
    if how == "relative path":
        monkeypatch.chdir(db.parent)
        return ["--db", db.name], {}
    link = tmp_path / "the link.sqlite"
    link.symlink_to(db)
    return ["--db", str(link)], {}


def key_line(result: cli.Result) -> str:
    assert result.code == 0, result.err
    return result.out.strip()


@pytest.mark.parametrize("how", HOW)
def test_audit_key_is_the_same_however_the_database_is_named(amdflash, tmp_path, monkeypatch, how, own_key):
    db = tmp_path / "trail" / "audit.sqlite"
    db.parent.mkdir()
    db.touch(mode=0o600)      # a link must point at something (a dangling one is refused: below)
    named, env = name_it(how, db, tmp_path, monkeypatch)
    shown = key_line(amdflash(*named, "audit", "key", env=env))
    assert shown == key_line(amdflash("--db", db, "audit", "key"))
    assert shown == key_line(amdflash("audit", "key"))              # the account's one key
    assert own_key.is_file() and not (db.parent / "host_key.pem").exists()


@pytest.mark.slow
@pytest.mark.parametrize("how", HOW)
def test_steps_printed_under_any_name_work_pasted_with_none_of_its_variables(amdflash, make_board, image,
                                                                            tmp_path, monkeypatch, how):
    """A flash fails; its printed resume, pasted into another directory with none of the
    variables that named the database, finishes the flash on the same trail: the run it resumes
    is signed by the key the pasted command trusts (it was refused as 'not this host's key')."""
    img = image.read_bytes()
    board = make_board(transport="ideal", faults=[f"stuck-bit={first_differing_bit(img, 0x100000):#x}:0"])
    db = tmp_path / "trail dir" / "line's audit.sqlite"
    db.parent.mkdir()
    if how == "link":
        db.touch(mode=0o600)
    named, env = name_it(how, db, tmp_path, monkeypatch)
    r = amdflash("--no-progress", *named, "flash", image, "--yes", "--force", "--board", f"sim:{board}", env=env)
    assert r.code == 1, r.err
    [resume] = [w for w in pasted(r.err) if "resume" in w]
    assert resume[1:3] == ["--db", str(db)], resume           # the real path, whatever named it
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert amdflash("sim", "fault", board, "--clear").code == 0
    done = cli.run("--no-progress", *resume[1:], cwd=elsewhere,
                   env={"AMDFLASH_DB": None, "AMDFLASH_CONFIG": None})
    assert done.returncode == 0, done.stderr
    assert flash_content(board) == img
    runs = json.loads(amdflash("--db", db, "runs", "--format", "json").out)
    assert [(x["command"], x["status"]) for x in runs] == [("flash", "failed"), ("resume", "succeeded")]
    # One trail: its anchor and backups beside the real file, and it verifies there.
    assert Path(f"{db}.anchor").is_file() and (db.parent / "backups").is_dir()
    assert not (tmp_path / "the link.sqlite.anchor").exists() and not (tmp_path / "backups").exists()
    key = tmp_path / "host.pub"
    assert amdflash("--db", db, "audit", "key", "-o", key).code == 0
    checked = amdflash("--db", db, "audit", "verify", "--key", key)
    assert checked.code == 0 and "audit chain intact" in checked.out, checked.out + checked.err


def test_a_dangling_link_is_refused_and_nothing_is_created(amdflash, make_board, tmp_path):
    board = make_board(transport="ideal")
    target = tmp_path / "made by someone" / "audit.sqlite"
    target.parent.mkdir()
    link = tmp_path / "audit.sqlite"
    link.symlink_to(target)
    before = sorted(p.name for p in target.parent.iterdir())
    r = amdflash("--db", link, "info", "--board", f"sim:{board}")
    assert r.code == 2 and len(r.err_lines) == 1, r.err
    assert r.err.startswith(f"error: --db {link} is a link to {target}, which does not exist"), r.err
    assert sorted(p.name for p in target.parent.iterdir()) == before == []
    # Named through its real path, the new trail is the owner's alone.
    assert amdflash("--db", target, "info", "--board", f"sim:{board}").code == 0
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


@pytest.mark.parametrize("how", ["--db", "environment"])
def test_a_database_name_that_is_not_utf8_is_refused_in_one_line(amdflash_process, make_board, tmp_path, how):
    board = make_board(transport="ideal")
    name = os.fsencode(str(tmp_path / "db-")) + b"\xfe.sqlite"
    args = ["--db", os.fsdecode(name)] if how == "--db" else []
    env = {"AMDFLASH_DB": os.fsdecode(name)} if how == "environment" else None
    before = sorted(os.listdir(tmp_path))
    r = amdflash_process(*args, "info", "--board", f"sim:{board}", env=env)
    assert r.code == 2, r.err
    [line] = r.err_lines
    assert line.startswith("error: ") and "not UTF-8" in line and "\\xfe" in line, line
    assert sorted(os.listdir(tmp_path)) == before                # no empty database left behind


def _older_amdflash(amdflash, db: Path, *args: object) -> cli.Result:
    """What an older amdflash did under $AMDFLASH_DB: the key made beside the database."""
    return amdflash(*args, env={"AMDFLASH_DB": str(db), "AMDFLASH_HOST_KEY": str(db.parent / "host_key.pem")})


@pytest.mark.slow
def test_a_trail_an_older_amdflash_signed_beside_its_database_keeps_working(amdflash, make_board, image,
                                                                          tmp_path, own_key):
    img = image.read_bytes()
    board = make_board(transport="ideal", faults=[f"stuck-bit={first_differing_bit(img, 0x100000):#x}:0"])
    db = tmp_path / "line" / "audit.sqlite"
    db.parent.mkdir()
    r = _older_amdflash(amdflash, db, "--no-progress", "flash", image, "--yes", "--force", "--board", f"sim:{board}")
    assert r.code == 1, r.err
    legacy = db.parent / "host_key.pem"
    assert legacy.is_file()
    # Named now by --db (the old rule signed that with the data directory's key): the same key.
    assert key_line(amdflash("--db", db, "audit", "key")) == key_line(_older_amdflash(amdflash, db, "audit", "key"))
    assert not own_key.exists()
    assert amdflash("sim", "fault", board, "--clear").code == 0
    done = amdflash("--no-progress", "--db", db, "resume", "--yes", "--board", f"sim:{board}")
    assert done.code == 0, done.err
    assert flash_content(board) == img
    pub = tmp_path / "legacy.pub"
    assert amdflash("--db", db, "audit", "key", "-o", pub).code == 0
    assert amdflash("--db", db, "audit", "verify", "--key", pub).code == 0


@pytest.mark.slow
def test_a_trail_signed_by_both_keys_of_the_account_is_acted_on(amdflash, make_board, image, tmp_path, own_key):
    """Under the old rule, the same file named by $AMDFLASH_DB and by --db got two keys: the
    one beside it and the data directory's. Both are this account's: a board command acts on
    runs of either (it refused the --db ones as 'not by this host's key')."""
    img = image.read_bytes()
    board = make_board(transport="ideal", faults=[f"stuck-bit={first_differing_bit(img, 0x100000):#x}:0"])
    db = tmp_path / "line" / "audit.sqlite"
    db.parent.mkdir()
    assert _older_amdflash(amdflash, db, "info", "--board", f"sim:{board}").code == 0
    # The older amdflash's --db run: signed with the data directory's key.
    r = amdflash("--no-progress", "--db", db, "flash", image, "--yes", "--force", "--board", f"sim:{board}",
                 env={"AMDFLASH_HOST_KEY": str(own_key)})
    assert r.code == 1, r.err
    assert amdflash("sim", "fault", board, "--clear").code == 0
    info = amdflash("--db", db, "info", "--board", f"sim:{board}")
    assert info.code == 0 and "not by this host's key" not in info.out + info.err, info.out + info.err
    done = amdflash("--no-progress", "--db", db, "resume", "--yes", "--board", f"sim:{board}")
    assert done.code == 0, done.err
    assert flash_content(board) == img


def test_a_key_file_beside_the_database_that_is_not_this_account_s_is_never_used(amdflash, make_board,
                                                                                tmp_path, own_key):
    """Someone who can write the database's directory leaves their own key beside it: it is
    neither used to sign this account's runs nor trusted by its board commands."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give the planted key to another user")
    board = make_board(transport="ideal")
    db = tmp_path / "shared" / "audit.sqlite"
    db.parent.mkdir()
    planted = db.parent / "host_key.pem"
    assert amdflash("audit", "key", env={"AMDFLASH_HOST_KEY": str(planted)}).code == 0
    os.chown(planted, 65534, 65534)
    mine = key_line(amdflash("audit", "key"))
    assert key_line(amdflash("--db", db, "audit", "key")) == mine
    assert amdflash("--db", db, "info", "--board", f"sim:{board}").code == 0
    os.chown(planted, 0, 0)
    os.chmod(planted, 0o644)                       # ours, but others may read it: not a key we made
    assert key_line(amdflash("--db", db, "audit", "key")) == mine
