"""A hardware report's integers are bounded like its other fields (issue 28 item 8): a
5000-digit number, which Python refuses to convert, is refused by the command line with exit 2
naming the field — by `sim create --from-report` and by `replay RUN --from-report`."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from amdflash.stages.sim.synth import synthetic_ifwi

REPORT = Path(__file__).resolve().parents[2] / "stages" / "boards" / "emulated-gd25lq16e-ideal.json"
HUGE = "9" * 5000


def with_huge(tmp_path: Path, *path: str) -> Path:
    """The stored report with the integer at `path` replaced by a 5000-digit one (a 30-digit
    one too: past 64 bits, still convertible)."""
    report = json.loads(REPORT.read_text())
    node = report
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = "@HUGE@"
    out = tmp_path / "huge.json"
    out.write_text(json.dumps(report).replace('"@HUGE@"', HUGE))
    return out


FIELDS = [("flash", "status_registers", "SR1"), ("board", "device_id"), ("registers_found", "0x5a380"),
          ("timings", "transport", "read32", "n"), ("timings", "transport", "read32", "median")]


@pytest.mark.parametrize("field", FIELDS, ids=".".join)
def test_sim_create_names_the_field_of_a_5000_digit_integer(amdflash, tmp_path, field) -> None:
    r = amdflash("sim", "create", tmp_path / "board", "--from-report", with_huge(tmp_path, *field), "--seed", 1)
    assert r.code == 2, r.err
    assert r.err.startswith("error: ") and f"{'.'.join(field)}: a 5000-digit integer is out of range" in r.err
    assert not (tmp_path / "board").exists()


def test_replay_names_the_field_of_a_5000_digit_integer(amdflash, tmp_path) -> None:
    assert amdflash("sim", "create", tmp_path / "board", "--from-report", REPORT, "--seed", 1).code == 0
    image = tmp_path / "image.bin"
    image.write_bytes(synthetic_ifwi(5))
    r = amdflash("flash", image, "--board", f"sim:{tmp_path / 'board'}", "--yes", "--force", "--sector-count", 16)
    assert r.code == 0, r.err
    run_id = re.search(r"run (\S+): succeeded", r.err).group(1)
    r = amdflash("replay", run_id, "--from-report", with_huge(tmp_path, "flash", "status_registers", "SR2"))
    assert r.code == 2, r.err
    assert "flash.status_registers.SR2: a 5000-digit integer is out of range" in r.err
