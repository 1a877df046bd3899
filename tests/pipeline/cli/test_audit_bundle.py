"""Issue 44: `audit bundle --run RUN -o DIR`, the evidence of a run in a folder a reviewer can
carry, `audit verify --bundle DIR` (offline: exit 0 intact, 1 on any changed byte, refusals for
what is not a bundle) and `restore-original --from-bundle DIR`.

One trail is made per module (range flashes of 8 units on emulated boards: seconds): a flash
that succeeded, and a flash that failed (a stuck bit) and was resumed once the fault was gone.
Each test works on copies of what it changes."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import stat
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from amdflash.stages.sim import create_board
from amdflash.stages.sim.synth import synthetic_ifwi
from tests.pipeline.engine.conftest import flash_content
from tests.support import cli

UNITS = 8
RANGE = UNITS * 0x1000
FLASH = 0x200000


def _env(root: Path) -> dict[str, str | None]:
    return {"AMDFLASH_DB": str(root / "audit.sqlite"), "AMDFLASH_LOCK_DIR": str(root / "locks"),
            "XDG_CONFIG_HOME": str(root / "config"), "XDG_DATA_HOME": str(root / "data"),
            "AMDFLASH_CONFIG": None, "AMDFLASH_SIM_USB": None, "AMDFLASH_ANCHOR": None}


def _stuck(image: bytes, first: bytes) -> int:
    """An address in the range where the image wants bit 0 cleared and the board's first
    content has it set: a stuck bit there fails the flash's verify, and the original stays as it was."""
    return next(a for a in range(0x1000, RANGE) if not image[a] & 1 and first[a] & 1 and image[a] != first[a])


def _runs(db: Path) -> list[str]:
    return [r for (r,) in cli.audit_rows(db, "SELECT run_id FROM runs ORDER BY seq")]


@pytest.fixture(scope="module")
def trail(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("bundle-trail")
    env = _env(root)
    image, first = synthetic_ifwi(1234), synthetic_ifwi(99)
    (root / "image.bin").write_bytes(image)
    (root / "first.bin").write_bytes(first)
    good = create_board(root / "good", content=first, transport="ideal", seed=11)
    bad = create_board(root / "bad", content=first, transport="ideal", seed=12,
                       faults=[f"stuck-bit={_stuck(image, first):#x}:0"])
    flash = ("--no-progress", "-q", "flash", root / "image.bin", "--yes", "--force", "--sector-count", UNITS)
    assert cli.run(*flash, "--board", f"sim:{good}", env=env).code == 0
    assert cli.run(*flash, "--board", f"sim:{bad}", env=env).code == 1
    assert cli.run("sim", "fault", bad, "--clear", env=env).code == 0
    r = cli.run("--no-progress", "-q", "resume", "--board", f"sim:{bad}", "--yes", env=env)
    assert r.code == 0, r.err
    succeeded, failed, resumed = _runs(root / "audit.sqlite")
    for run, name in ((succeeded, "good.bundle"), (failed, "failed.bundle")):
        r = cli.run("audit", "bundle", "--run", run, "-o", root / name, env=env)
        assert r.code == 0, r.err
    return SimpleNamespace(root=root, env=env, db=root / "audit.sqlite", image=image, first=first, good=good,
                           bad=bad, succeeded=succeeded, failed=failed, resumed=resumed,
                           bundle=root / "good.bundle", lineage_bundle=root / "failed.bundle")


@pytest.fixture
def copy(trail, tmp_path):
    """A copy of the succeeded flash's bundle, to change."""
    def make(source: Path | None = None) -> Path:
        out = tmp_path / "copy"
        shutil.copytree(source or trail.bundle, out)
        return out
    return make


def verify(*args: object, env: dict | None = None) -> cli.Result:
    return cli.run("audit", "verify", "--bundle", *args, env=env)


def rewrite_manifest(bundle: Path) -> None:
    """The manifest made again over the files as they are now (what someone who changed a file
    and wanted it unnoticed would do)."""
    names = sorted(n for n in os.listdir(bundle) if n != "MANIFEST.sha256")
    (bundle / "MANIFEST.sha256").write_text(
        "".join(f"{hashlib.sha256((bundle / n).read_bytes()).hexdigest()}  {n}\n" for n in names))


# -- what a bundle holds -------------------------------------------------------------------------

def test_a_succeeded_flash_bundle_holds_its_evidence_and_verifies_offline(trail, amdflash, tmp_path):
    b = trail.bundle
    assert sorted(os.listdir(b)) == ["MANIFEST.sha256", "anchor.jsonl", "bundle.json", "export.jsonl", "host.pem",
                                     "host.pub", "log.vkey", "original-partial.bin", "receipt.intoto.json",
                                     "receipt.tlog-proof"]      # the receipt parts: tests/store/test_receipt_bundle.py
    assert stat.S_IMODE(os.stat(b).st_mode) == 0o700
    # `sha256sum -c` reads the manifest as it is.
    assert subprocess.run(["sha256sum", "--quiet", "-c", "MANIFEST.sha256"], cwd=b).returncode == 0
    info = json.loads((b / "bundle.json").read_text())
    assert info["run"] == trail.succeeded and info["runs"] == [trail.succeeded]
    assert {"by", "host", "at", "machine_id", "amdflash"} <= set(info["made"])
    # The key: what `audit key` prints, and the same key as SubjectPublicKeyInfo PEM.
    key_line = amdflash("audit", "key", env=trail.env).out.strip()
    assert (b / "host.pub").read_text().strip() == key_line
    pem = serialization.load_pem_public_key((b / "host.pem").read_bytes())
    assert isinstance(pem, Ed25519PublicKey)
    assert pem.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex() == key_line.split()[1]
    # The original: the board's content before the flash where the trail holds it, 0xFF (named) elsewhere.
    original = (b / "original-partial.bin").read_bytes()
    assert original[:RANGE] == trail.first[:RANGE] and original[:RANGE] != trail.image[:RANGE]
    assert original[RANGE:] == b"\xff" * (FLASH - RANGE)
    assert info["original"]["missing"] == [[RANGE, FLASH]]
    # Checked without any database: none where AMDFLASH_DB points.
    r = verify(b, env={**trail.env, "AMDFLASH_DB": str(tmp_path / "none.sqlite")})
    assert r.code == 0, r.out + r.err
    assert r.out.startswith(f"bundle intact: {b}") and "original-partial.bin: 8 of 512 units" in r.out
    assert not (tmp_path / "none.sqlite").exists()
    # With the host key kept apart: proven; with another key: BROKEN.
    (tmp_path / "host.pub").write_text(key_line + "\n")
    assert verify(b, "--key", tmp_path / "host.pub").code == 0
    other = Ed25519PrivateKey.generate().public_key().public_bytes(serialization.Encoding.Raw,
                                                                   serialization.PublicFormat.Raw)
    (tmp_path / "other.pub").write_text(f"amdflash-ed25519 {other.hex()}\n")
    r = verify(b, "--key", tmp_path / "other.pub")
    assert r.code == 1 and "not a given --key" in r.out, r.out


def test_a_failed_and_resumed_flash_bundle_holds_its_lineage(trail, amdflash, tmp_path):
    info = json.loads((trail.lineage_bundle / "bundle.json").read_text())
    assert info["runs"] == [trail.failed, trail.resumed] and info["lineage"] == [trail.failed, trail.resumed]
    header = json.loads((trail.lineage_bundle / "export.jsonl").read_text().splitlines()[0])
    assert header["runs"] == [trail.failed, trail.resumed]
    assert verify(trail.lineage_bundle).code == 0
    # From the resume, the run it resumed comes with it.
    r = amdflash("audit", "bundle", "--run", trail.resumed[:17], "-o", tmp_path / "b", env=trail.env)
    assert r.code == 0, r.err
    assert json.loads((tmp_path / "b" / "bundle.json").read_text())["runs"] == [trail.failed, trail.resumed]
    original = (tmp_path / "b" / "original-partial.bin").read_bytes()
    assert original[:RANGE] == trail.first[:RANGE]


# -- one changed byte, in each kind of file --------------------------------------------------------

def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] = ord("0") if data[at] != ord("0") else ord("1")
    path.write_bytes(bytes(data))


def _inside(path: Path, text: str) -> int:
    """The offset of the first hex digit after `text` in the file."""
    data = path.read_bytes()
    return data.index(text.encode()) + len(text)


CHANGES = {
    "export.jsonl": lambda p: _inside(p, '"table":"log_backup_units","seq":'),
    "original-partial.bin": lambda p: 0x10,
    "host.pub": lambda p: _inside(p, "amdflash-ed25519 ") + 3,
    "host.pem": lambda p: 40,
    "anchor.jsonl": lambda p: _inside(p, '"hash":"') + 5,
    "bundle.json": lambda p: _inside(p, '"by": "'),
}


@pytest.mark.parametrize("name", [*CHANGES, "MANIFEST.sha256"])
def test_one_changed_byte_is_named(copy, name):
    b = copy()
    first_listed = (b / "MANIFEST.sha256").read_text().split()[1]
    _flip(b / name, 3 if name == "MANIFEST.sha256" else CHANGES[name](b / name))
    r = verify(b)
    assert r.code == 1, r.out + r.err
    shown = first_listed if name == "MANIFEST.sha256" else name     # a digit of its first line changed
    assert r.out.startswith(f"bundle BROKEN: {b}: ") and shown in r.out, r.out


@pytest.mark.parametrize("name", [n for n in CHANGES if n != "bundle.json"])
def test_a_changed_byte_with_the_manifest_made_again_is_still_named(copy, name):
    """The manifest is no signature: what the export's signed checkpoints vouch for is checked
    against them (bundle.json is the maker's word, covered by the manifest only)."""
    b = copy()
    _flip(b / name, CHANGES[name](b / name))
    rewrite_manifest(b)
    r = verify(b)
    assert r.code == 1, r.out + r.err
    assert "BROKEN" in r.out and (name in r.out or (name == "host.pub" and "host key" in r.out)), r.out


def test_an_original_with_bytes_where_the_trail_holds_no_backup_is_broken(copy):
    b = copy()
    _flip(b / "original-partial.bin", 0x100000)
    rewrite_manifest(b)
    r = verify(b)
    assert r.code == 1 and "0x008000..0x1fffff" in r.out and "not all 0xFF" in r.out, r.out


def test_an_original_removed_is_broken(copy):
    b = copy()
    (b / "original-partial.bin").unlink()
    rewrite_manifest(b)
    r = verify(b)
    assert r.code == 1 and "no original-partial.bin" in r.out, r.out


# -- what is not a bundle to read --------------------------------------------------------------------

def _link(b: Path) -> None:
    (b / "host.pub").rename(b.parent / "elsewhere.pub")
    (b / "host.pub").symlink_to(b.parent / "elsewhere.pub")


def _dotdot(b: Path) -> None:
    text = (b / "MANIFEST.sha256").read_text().replace("  host.pub", "  ../host.pub")
    (b / "MANIFEST.sha256").write_text(text)


def _extra(b: Path) -> None:
    (b / "notes.txt").write_text("hello\n")


def _extra_known(b: Path) -> None:
    shutil.copy(b / "host.pub", b / "host-2.pub")


def _fifo(b: Path) -> None:
    (b / "anchor.jsonl").unlink()
    os.mkfifo(b / "anchor.jsonl")


def _oversized(b: Path) -> None:
    with open(b / "original-partial.bin", "ab") as f:
        f.write(b"\xff")


def _subdir(b: Path) -> None:
    (b / "export.jsonl").unlink()
    (b / "export.jsonl").mkdir()


REFUSALS = {"link": (_link, "symbolic link"), "dotdot": (_dotdot, "'../host.pub'"),
            "extra": (_extra, "not a file a bundle holds"), "extra-known": (_extra_known, "not in the bundle's"),
            "fifo": (_fifo, "not a regular file"), "oversized": (_oversized, "larger"),
            "directory": (_subdir, "not a regular file")}


@pytest.mark.parametrize("case", REFUSALS)
def test_what_is_not_a_bundle_is_refused(copy, case):
    b = copy()
    change, words = REFUSALS[case]
    change(b)
    r = verify(b)
    assert r.code == 2, r.out + r.err
    assert r.err.startswith("error: ") and words in r.err and not r.out, r.err


def test_a_bundle_reached_through_a_link_is_refused(copy, tmp_path):
    b = copy()
    (tmp_path / "link").symlink_to(b)
    r = verify(tmp_path / "link")
    assert r.code == 2 and "symbolic link" in r.err, r.err


def test_verify_bundle_is_refused_with_database_options(trail):
    r = verify(trail.bundle, "--run", trail.succeeded)
    assert r.code == 2 and "--bundle" in r.err and "--run" in r.err, r.err


# -- where a bundle is written -------------------------------------------------------------------------

def test_the_output_must_be_new_or_empty_and_nothing_is_left_on_a_refusal(trail, amdflash, tmp_path):
    tmp_path = tmp_path / "out"
    tmp_path.mkdir()
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine\n")
    r = amdflash("audit", "bundle", "--run", trail.succeeded, "-o", full, env=trail.env)
    assert r.code == 2 and "not empty" in r.err, r.err
    assert os.listdir(full) == ["keep.txt"]
    (tmp_path / "to").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "to")
    r = amdflash("audit", "bundle", "--run", trail.succeeded, "-o", tmp_path / "link", env=trail.env)
    assert r.code == 2 and "symbolic link" in r.err and not os.listdir(tmp_path / "to"), r.err
    r = amdflash("audit", "bundle", "--run", "nosuchrun", "-o", tmp_path / "new", env=trail.env)
    assert r.code == 2 and not (tmp_path / "new").exists(), r.err
    assert sorted(os.listdir(tmp_path)) == ["full", "link", "to"]      # no partial bundle beside them
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o755)
    assert amdflash("audit", "bundle", "--run", trail.succeeded, "-o", empty, env=trail.env).code == 0
    assert stat.S_IMODE(os.stat(empty).st_mode) == 0o700 and verify(empty).code == 0


def test_a_run_that_does_not_verify_is_not_bundled(trail, amdflash, tmp_path):
    tmp_path = tmp_path / "out"
    tmp_path.mkdir()
    db = tmp_path / "edited.sqlite"
    shutil.copy(trail.db, db)
    conn = sqlite3.connect(db)
    sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'errors_no_update'").fetchone()[0]
    conn.execute("DROP TRIGGER errors_no_update")
    conn.execute("UPDATE errors SET message = 'all fine' WHERE run_id = ?", (trail.failed,))
    conn.execute(sql)
    conn.commit()
    conn.close()
    r = amdflash("--db", db, "audit", "bundle", "--run", trail.failed, "-o", tmp_path / "b", env=trail.env)
    assert r.code == 1 and "does not verify" in r.err, r.err
    assert not (tmp_path / "b").exists()
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".amdflash-bundle")]      # no partial bundle


def test_bundle_in_a_fresh_home_creates_no_key_and_leaves_the_database_as_it_was(trail, amdflash, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    db = tmp_path / "audit.sqlite"
    shutil.copy(trail.db, db)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    env = {"HOME": str(home), "XDG_CONFIG_HOME": None, "XDG_DATA_HOME": None, "AMDFLASH_HOST_KEY": None,
           "AMDFLASH_DB": str(db), "AMDFLASH_CONFIG": None, "AMDFLASH_ANCHOR": None}
    r = amdflash("audit", "bundle", "--run", trail.succeeded, "-o", tmp_path / "b", env=env)
    assert r.code == 0, r.err
    assert list(home.iterdir()) == []
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before
    info = json.loads((tmp_path / "b" / "bundle.json").read_text())
    assert "one-time key" in info["export"]["seal"] and info["anchor"]["file"] is None
    # The checkpoints are the recording host's, whoever made the bundle.
    (tmp_path / "host.pub").write_text(amdflash("audit", "key", env=trail.env).out)
    assert verify(tmp_path / "b", "--key", tmp_path / "host.pub").code == 0


# -- restore-original --from-bundle -----------------------------------------------------------------------

def test_restore_original_from_a_bundle_puts_the_original_back(trail, amdflash, tmp_path):
    env = {**trail.env, "AMDFLASH_DB": str(tmp_path / "restore.sqlite")}
    shutil.copy(trail.db, tmp_path / "restore.sqlite")
    board = f"sim:{trail.good}"
    assert flash_content(trail.good)[:RANGE] == trail.image[:RANGE]
    # Not the bundle's board: refused before anything is written, unless --force.
    bad = (trail.bad / "flash.bin").read_bytes()
    r = amdflash("--no-progress", "restore-original", "--board", f"sim:{trail.bad}", "--from-bundle", trail.bundle,
                 "--yes", env=env)
    assert r.code == 2 and "not the board" in r.err, r.err
    assert (trail.bad / "flash.bin").read_bytes() == bad
    # A bundle that does not verify: nothing written.
    broken = tmp_path / "broken"
    shutil.copytree(trail.bundle, broken)
    _flip(broken / "original-partial.bin", 0x10)
    r = amdflash("--no-progress", "restore-original", "--board", board, "--from-bundle", broken, "--yes", env=env)
    assert r.code == 2 and "does not verify" in r.err, r.err
    r = amdflash("--no-progress", "restore-original", "--board", board, "--from-bundle", trail.bundle, "--yes", env=env)
    assert r.code == 0, r.err
    assert flash_content(trail.good) == trail.first      # the emulated flash itself: every byte as first found
    r = amdflash("--no-progress", "read", "0", RANGE, "-o", tmp_path / "read.bin", "--board", board, env=env)
    assert r.code == 0 and (tmp_path / "read.bin").read_bytes() == trail.first[:RANGE], r.err


def test_force_without_a_bundle_is_refused(trail, amdflash):
    r = amdflash("restore-original", "--board", f"sim:{trail.good}", "--force", "--yes", env=trail.env)
    assert r.code == 2 and "--from-bundle" in r.err, r.err


@pytest.mark.slow
def test_a_whole_flash_bundle_carries_original_bin(amdflash, tmp_path):
    first = synthetic_ifwi(77)
    (tmp_path / "image.bin").write_bytes(synthetic_ifwi(1234))
    board = create_board(tmp_path / "whole", content=first, transport="ideal", seed=21)
    assert amdflash("--no-progress", "-q", "flash", tmp_path / "image.bin", "--yes", "--force",
                    "--board", f"sim:{board}").code == 0
    (run,) = _runs(Path(os.environ["AMDFLASH_DB"]))
    assert amdflash("audit", "bundle", "--run", run, "-o", tmp_path / "b").code == 0
    assert (tmp_path / "b" / "original.bin").read_bytes() == first
    assert not (tmp_path / "b" / "original-partial.bin").exists()
    assert json.loads((tmp_path / "b" / "bundle.json").read_text())["original"]["missing"] == []
    assert verify(tmp_path / "b").code == 0


def test_verify_bundle_as_json(copy):
    if "--format" not in cli.run("audit", "verify", "--help").out:
        pytest.skip("audit verify --format arrives with the reviewer's verdicts (issue 44)")
    b = copy()
    r = verify(b, "--format", "json")
    assert r.code == 0 and json.loads(r.out)["verdict"] == "intact", r.out
    assert json.loads(r.out)["original_units"] == [[0, RANGE]]
    _flip(b / "original-partial.bin", 0x10)
    rewrite_manifest(b)
    r = verify(b, "--format", "json")
    found = json.loads(r.out)
    assert r.code == 1 and found["verdict"] == "BROKEN" and "original-partial.bin" in found["problem"], r.out


def test_a_later_part_is_one_entry_a_writer_and_a_check(trail, amdflash, tmp_path, monkeypatch):
    """How the receipts join a bundle: a PARTS entry, a writer in ADD, a step in CHECKS."""
    from amdflash.store import bundle

    monkeypatch.setattr(bundle, "PARTS", (*bundle.PARTS, bundle.Part(r"note\.txt", "a later part", 100)))
    monkeypatch.setattr(bundle, "ADD", [lambda db, selection, facts: {"note.txt": f"{selection.run_id}\n".encode()}])
    seen: list[bytes] = []
    monkeypatch.setattr(bundle, "CHECKS", [*bundle.CHECKS, lambda opened: seen.append(opened.read("note.txt"))])
    r = amdflash("audit", "bundle", "--run", trail.succeeded, "-o", tmp_path / "b", env=trail.env)
    assert r.code == 0, r.err
    assert "  note.txt\n" in (tmp_path / "b" / "MANIFEST.sha256").read_text()
    seen.clear()
    assert verify(tmp_path / "b").code == 0 and seen == [f"{trail.succeeded}\n".encode()]
