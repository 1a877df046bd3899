"""How audit-v1.sqlite.xz was made: with amdflash at commit 4b7a341 (audit schema version 1),
before the compact, signed trail. It runs only against that version of the code:

    git archive 4b7a341 | tar -x -C /tmp/v1 && python -m venv /tmp/v1/.venv
    /tmp/v1/.venv/bin/pip install -e /tmp/v1 && /tmp/v1/.venv/bin/python make_audit_v1.py /tmp/v1/out
    sqlite3 /tmp/v1/out/v1.sqlite "VACUUM INTO 'audit-v1.sqlite'" && xz -9e audit-v1.sqlite

Runs: info; a 5-sector flash clearing CMP (skip, program and erase units); a flash failing
on a stuck bit after its retries; a read; one flash on two boards at once (interleaved
rows); a flash killed mid-run by the host dying (kill-after-writes) and its resume.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

from amdflash.pipeline.cli.main import main
from amdflash.stages.sim import create_board
from amdflash.stages.sim.synth import synthetic_ifwi

root = Path(sys.argv[1])
shutil.rmtree(root, ignore_errors=True)
root.mkdir()
os.environ["AMDFLASH_LOCK_DIR"] = str(root / "locks")
db = root / "v1.sqlite"
image = root / "image.bin"
img = synthetic_ifwi(1234)
image.write_bytes(img)


def board(name: str, content: bytes, **options) -> Path:  # noqa: ANN003
    return create_board(root / name, content=content, transport="ideal", seed=len(name), **options)


def amd(*args: object) -> int:
    return main(["-q", "--db", str(db), *map(str, args)])


mixed = bytearray(img)
mixed[0x1000:0x3000] = bytes(0x2000)
mixed[0x4000:0x5000] = b"\xff" * 0x1000
clean = board("clean", bytes(mixed), cmp=True)
assert amd("info", "--board", f"sim:{clean}") == 0
assert amd("flash", image, "--yes", "--clear-cmp", "--sector-count", 5, "--board", f"sim:{clean}") == 0
stuck = bytearray(img)
stuck[0x2000:0x3000] = bytes(0x1000)
address = next(a for a in range(0x2000, 0x3000) if not img[a] & 1)
bad = board("stuck", bytes(stuck), faults=[f"stuck-bit={address:#x}:0"])
assert amd("flash", image, "--yes", "--sector-count", 3, "--board", f"sim:{bad}") == 1
assert amd("read", 0, 0x100, "--board", f"sim:{clean}") == 0
two = [board("twoA", bytes(0x200000)), board("twoB", bytes(0x200000))]
assert amd("flash", image, "--yes", "--sector-count", 2, "--board", f"sim:{two[0]}", "--board", f"sim:{two[1]}") == 0
killed = board("killed", bytes(0x200000), faults=["kill-after-writes=700"])
subprocess.run([sys.executable, "-m", "amdflash.pipeline.cli", "-q", "--db", str(db), "flash", str(image), "--yes",
                "--sector-count", "4", "--board", f"sim:{killed}"])
assert amd("resume", "--yes", "--board", f"sim:{killed}") == 0
