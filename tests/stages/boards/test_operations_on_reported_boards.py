"""The board of every hardware report (the stored ones, and any given with --board-report FILE)
does what amdflash is for: it is identified as the report's chip, dumps to its own content,
takes a flash of an unprotected range (a protected one is refused, nothing written; a part
whose SFDP does not say how to write it is refused, and verifies what was read), verifies,
and the flash run replays onto the board of its own hardware report with no divergence but
those the report lists (`replay --from-report`: the fidelity check a maintainer runs on a
user's run and report)."""
from __future__ import annotations

import json
import re

ALL_SLOW = True         # a dump, a flash, a verify and a replay each: CI runs them (slow)

# Candidate 64 KiB-aligned ranges (start sector, count): one is outside any BP/TB/SEC/CMP setting
# short of the whole chip.
RANGES = ((240, 16), (16, 16), (480, 16), (256, 16), (0, 16))


def test_the_board_of_a_report_identifies_dumps_flashes_verifies_and_replays(amdflash, tmp_path, report_path):
    report = json.loads(report_path.read_text())
    board = tmp_path / "board"
    r = amdflash("sim", "create", board, "--from-report", report_path, "--seed", 3)
    assert r.code == 0, r.err
    spec = f"sim:{board}"
    r = amdflash("info", "--board", spec)
    assert r.code == 0, r.err
    assert report["flash"]["chip"] in r.out, r.out
    r = amdflash("dump", tmp_path / "dump.bin", "--board", spec)
    assert r.code == 0, r.err
    content = (board / "flash.bin").read_bytes()
    assert (tmp_path / "dump.bin").read_bytes() == content
    flashed = None
    for start, count in RANGES:
        lo, hi = start * 0x1000, (start + count) * 0x1000
        image = bytearray(content)
        image[lo:hi] = bytes((i * 7 + start) & 0xFF for i in range(hi - lo))
        path = tmp_path / f"image-{start}.bin"
        path.write_bytes(bytes(image))
        # A part outside the chip table is written from its SFDP alone, as its user would ask.
        r = amdflash("flash", path, "--board", spec, "--yes", "--force", "--start-sector", start,
                     "--sector-count", count, "--unknown-chip-ok")
        if r.code == 2 and "lacks what a write needs" in r.err:
            # A part whose SFDP does not say how to write it (SFDP 1.0): refused, nothing written;
            # what amdflash does for it is read it, and verify what it read.
            assert (board / "flash.bin").read_bytes() == content
            r = amdflash("verify", tmp_path / "dump.bin", "--board", spec)
            assert r.code == 0, r.err
            return
        if r.code == 2:                          # refused up front: the range is protected
            assert "protected" in r.err, r.err
            assert (board / "flash.bin").read_bytes() == content
            continue
        assert r.code == 0, r.err
        assert (board / "flash.bin").read_bytes() == bytes(image)
        flashed = (path, re.search(r"run (\S+): succeeded", r.err).group(1))
        break
    assert flashed is not None, "every candidate range is protected on this board"
    path, run_id = flashed
    r = amdflash("verify", path, "--board", spec)
    assert r.code == 0, r.err
    # The fidelity check takes a report of the run's own board (the stored one is of another:
    # refused); this board's, with its busy times where a scratch block may be given up.
    assert amdflash("replay", run_id, "--from-report", report_path).code == 2
    own = tmp_path / "own.json"
    # With its IDs in the clear: a hash of them vouches for nothing (anyone who saw it can write it).
    r = amdflash("hardware-report", "--board", spec, "-o", own, "--scratch-sector", 16, "--yes", "--include-ids")
    if r.code == 2:
        r = amdflash("hardware-report", "--board", spec, "-o", own, "--overwrite", "--include-ids")
    assert r.code == 0, r.err
    r = amdflash("replay", run_id, "--from-report", own, "--format", "json")
    assert r.code == 0, r.err
    result = json.loads(r.out)
    # No divergence but those the report lists; none at all unless it lists busy times that
    # differ from the model (a write the chip did not take while busy, retried).
    assert result["unexplained"] == 0 and all(d["explained_by"] for d in result["divergences"]), result
    busy_listed = any("busy: " in n for n in result["notes"] if n.startswith("listed:"))
    assert result["identical"] or busy_listed, result
