"""hardware-report -> sim create --from-report -> hardware-report: the same board, within the
measurement's stated error, and the same modelled seconds for dump and flash within 2 %."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from amdflash.stages.drivers.navi31 import regs as R
from amdflash.stages.sim import Board, create_board
from amdflash.stages.sim.calibration import power_on_values
from amdflash.stages.sim.power_on import power_on_registers
from amdflash.stages.sim.state import REGIONS
from amdflash.stages.sim.synth import synthetic_ifwi

# Non-default figures everywhere the report measures: link, busy times, registers, chip, SR.
SOURCE = {
    "transport": {"control": 130e-6, "bulk": 70e-6, "read_byte": 1 / 1.5e6, "write_byte": 1 / 3.0e6},
    "busy": {"0x02": 0.8e-3, "0x20": 60e-3, "0x52": 170e-3, "0xd8": 290e-3},
    "registers": {f"{R.GPIOPAD_A:#07x}": 0x00000700, f"{R.ROM_START:#07x}": 0x00001234},
}
CHIP, STATUS = "W25Q16JW", (0x24, 0x02, 0x60)      # BP=1 TB=1 (bottom 64 KiB protected), QE, DRV


def report(amdflash, board: Path, out: Path, scratch: bool, errors: list[str] | None = None) -> dict:
    extra = ["--scratch-sector", 16, "--yes"] if scratch else []
    r = amdflash("hardware-report", "--board", f"sim:{board}", "-o", out, *extra)
    assert r.code == 0, r.err
    if errors is not None:
        errors.append(r.err)
    return json.loads(out.read_text())


def modelled(board: Path, act) -> float:
    with Board(board) as b:
        before = b.stats()["modelled_seconds"]
    act()
    with Board(board) as b:
        return b.stats()["modelled_seconds"] - before


def modelled_command(amdflash, board: Path, *args) -> float:  # noqa: ANN001, ANN002
    """The modelled seconds one amdflash command takes on the board (it must succeed)."""
    def run() -> None:
        r = amdflash(*args, "--board", f"sim:{board}")
        assert r.code == 0, r.err

    return modelled(board, run)


def close(a: float, b: float, error: float) -> bool:
    return abs(a - b) <= error + 1e-9


def compare(first: dict, second: dict) -> None:
    for key in ("chip", "jedec", "status_registers", "sfdp"):
        assert first["flash"][key] == second["flash"][key], key
    assert first["registers_found"] == second["registers_found"]
    t1, t2 = first["timings"]["transport"], second["timings"]["transport"]
    pairs = [(t1["read32"], t2["read32"]), (t1["write32"], t2["write32"])]
    pairs += [(t1[k][s], t2[k][s]) for k in ("read_block", "write_block") for s in t1[k]]
    for a, b in pairs:
        assert close(a["median"], b["median"], max(a["max"] - a["min"], 0.01 * a["median"])), (a, b)
    for size, s in first["timings"]["spi"]["sizes"].items():
        other = second["timings"]["spi"]["sizes"][size]
        if "seconds" in s:
            assert close(s["seconds"], other["seconds"], s["error"]), size
    for op, k in (first["timings"]["busy"].get("kinds") or {}).items():
        other = second["timings"]["busy"]["kinds"][op]
        assert close(k["seconds"], other["seconds"], k["error"] + other["error"]), (op, k, other)


def test_round_trip_without_scratch(amdflash, tmp_path, isolated):
    source = create_board(tmp_path / "source", seed=7, chip=CHIP, status_registers=STATUS,
                          calibration={"transport": SOURCE["transport"], "registers": SOURCE["registers"]})
    first_run_err: list[str] = []
    first = report(amdflash, source, tmp_path / "r1.json", scratch=False, errors=first_run_err)
    assert first["timings"]["busy"] == {}
    contradicted = {f["fact"] for f in first["facts"] if f["verdict"] == "contradicted"}
    assert any("write32" in f for f in contradicted)           # 130 us is not the model's 100 us
    assert any(f.startswith(f"register {R.GPIOPAD_A:#07x}") for f in contradicted)
    assert not any(f.startswith("SFDP") for f in contradicted)
    r = amdflash("sim", "create", tmp_path / "copy", "--from-report", tmp_path / "r1.json", "--seed", 7)
    assert r.code == 0, r.err
    assert "diverges:  transport: control" in r.out and "diverges:  register 0x5a508" in r.out
    second = report(amdflash, tmp_path / "copy", tmp_path / "r2.json", scratch=False)
    compare(first, second)
    # The same board from the run's record in the audit trail.
    run_id = re.search(r"run (\S+): succeeded", first_run_err[0]).group(1)
    r = amdflash("sim", "create", tmp_path / "from-run", "--from-run", isolated / "audit.sqlite", run_id,
                 "--seed", 7)
    assert r.code == 0, r.err
    made = [json.loads((tmp_path / name / "board.json").read_text()) for name in ("copy", "from-run")]
    for key in ("calibration", "chip", "transport"):
        assert made[0][key] == made[1][key]
    lo, size = REGIONS["chip"]           # the status registers as the report found them
    chips = [(tmp_path / name / "state.bin").read_bytes()[lo + 8:lo + 16] for name in ("copy", "from-run")]
    assert chips[0] == chips[1]
    assert power_on_registers(power_on_values(made[1]["calibration"]))[R.GPIOPAD_A:R.GPIOPAD_A + 4] == \
        (0x700).to_bytes(4, "little")
    # Any run that identified its board: identity, status registers and registers as found (no
    # timings, no raw SFDP: said as divergences).
    info = amdflash("info", "--board", f"sim:{tmp_path / 'copy'}")
    info_run = re.search(r"run (\S+): succeeded", info.err).group(1)
    r = amdflash("sim", "create", tmp_path / "from-info", "--from-run", isolated / "audit.sqlite", info_run)
    assert r.code == 0, r.err
    assert f"diverges:  timings: run {info_run} (info) measured none" in r.out
    assert "diverges:  register 0x5a508: found 0x00000700" in r.out
    made_from_info = json.loads((tmp_path / "from-info" / "board.json").read_text())
    assert made_from_info["chip"] == CHIP and made_from_info["transport"] == "asm24"
    assert made_from_info["calibration"]["registers"] == made[0]["calibration"]["registers"]
    assert (tmp_path / "from-info" / "state.bin").read_bytes()[lo + 8:lo + 16] == chips[0]
    assert "transport" not in made_from_info["calibration"] and "busy" not in made_from_info["calibration"]
    # A run that never identified its chip (ROM_SW gated): nothing to make a board from.
    gated = create_board(tmp_path / "gated", seed=7, gated=True)
    failed = amdflash("info", "--board", f"sim:{gated}")
    failed_run = re.search(r"run (\S+), failed", failed.err).group(1)
    r = amdflash("sim", "create", tmp_path / "nope", "--from-run", isolated / "audit.sqlite", failed_run)
    assert r.code == 2 and "recorded no identified board to make one from" in r.err, r.err
    # The emulator's default board is untouched by all this: it still has the model's figures.
    plain = create_board(tmp_path / "plain", seed=7)
    third = report(amdflash, plain, tmp_path / "r3.json", scratch=False)
    assert not [f for f in third["facts"] if f["verdict"] == "contradicted"]


@pytest.mark.slow
def test_round_trip_with_scratch_dump_and_flash_within_two_percent(amdflash, tmp_path):
    source = create_board(tmp_path / "source", seed=7, chip=CHIP, status_registers=STATUS, calibration=SOURCE)
    flash_before = (source / "flash.bin").read_bytes()
    first = report(amdflash, source, tmp_path / "r1.json", scratch=True)
    assert (source / "flash.bin").read_bytes() == flash_before        # the scratch block is put back
    assert first["timings"]["busy"]["restored"] == "byte-identical"
    # Every operation of a kind takes the same time here: the reads placed outside the bounds
    # never answer otherwise, so no kind is said to vary.
    assert not [op for op, k in first["timings"]["busy"]["kinds"].items() if "per_operation" in k]
    for op, seconds in SOURCE["busy"].items():
        k = first["timings"]["busy"]["kinds"][op]
        assert close(k["seconds"], seconds, k["error"]), (op, k)
    r = amdflash("sim", "create", tmp_path / "copy", "--from-report", tmp_path / "r1.json", "--seed", 7)
    assert r.code == 0, r.err
    copy = tmp_path / "copy"
    second = report(amdflash, copy, tmp_path / "r2.json", scratch=True)
    compare(first, second)
    image = tmp_path / "image.bin"
    image.write_bytes(synthetic_ifwi(99))
    seconds = {}
    for name, board in (("source", source), ("copy", copy)):
        dump = modelled_command(amdflash, board, "dump", tmp_path / f"{name}.bin")
        # The bottom 64 KiB are protected (BP=1, TB=1): a 1 MiB range of another image above them.
        flash = modelled_command(amdflash, board, "flash", image, "--yes", "--force", "--start-sector", 32,
                                 "--sector-count", 256)
        seconds[name] = (dump, flash)
    (d1, f1), (d2, f2) = seconds["source"], seconds["copy"]
    print(f"modelled seconds: dump {d1:.6f} vs {d2:.6f} ({(d2 - d1) / d1:+.2e}), "
          f"flash {f1:.6f} vs {f2:.6f} ({(f2 - f1) / f1:+.2e})")
    assert abs(d2 - d1) <= 0.02 * d1 and abs(f2 - f1) <= 0.02 * f1


# A chip whose 4 KiB erases and page programs take a different time each (real NOR does):
# the calibration carries their spread, not one figure.
VARYING = {
    "transport": SOURCE["transport"],
    "busy": {"0x02": {"median": 0.8e-3, "stdev": 0.15e-3, "min": 0.45e-3, "max": 1.3e-3},
             "0x20": {"median": 60e-3, "stdev": 12e-3, "min": 35e-3, "max": 95e-3},
             "0x52": 170e-3, "0xd8": 290e-3},
}


@pytest.mark.slow
def test_busy_times_that_vary_round_trip_as_a_spread(amdflash, tmp_path):
    source = create_board(tmp_path / "source", seed=5, chip=CHIP, calibration=VARYING)
    first = report(amdflash, source, tmp_path / "r1.json", scratch=True)
    kinds = first["timings"]["busy"]["kinds"]
    for op in ("0x02", "0x20"):
        k, given = kinds[op], VARYING["busy"][op]
        spread = k["per_operation"]
        # 4 KiB erases: polling pins each one; page programs are shorter than a status read's
        # round trip on this link, so status reads placed by staircases find the spread.
        assert spread["n"] == 16 if op == "0x20" else 200 <= spread["n"] <= 256 and "staircases" in spread["estimated"]
        assert close(k["seconds"], given["median"], k["error"]), (op, k)
        assert 0.6 * given["stdev"] <= spread["stdev"] <= 1.4 * given["stdev"], (op, spread)
        if op == "0x20":                        # each erase's own time, so the range is the real one
            assert given["min"] <= spread["min"] and spread["max"] <= given["max"] * 1.01, (op, spread)
    for op in ("0x52", "0xd8"):                 # the same time every operation: one figure, narrowed
        assert "per_operation" not in kinds[op] and kinds[op]["error"] < 0.01 * VARYING["busy"][op]
    r = amdflash("sim", "create", tmp_path / "copy", "--from-report", tmp_path / "r1.json", "--seed", 9)
    assert r.code == 0, r.err
    assert "diverges:  busy: 4 KiB erase varies from operation to operation" in r.out, r.out
    made = json.loads((tmp_path / "copy" / "board.json").read_text())["calibration"]["busy"]
    assert isinstance(made["0x20"], dict) and isinstance(made["0x02"], dict) and isinstance(made["0xd8"], float)
    copy = tmp_path / "copy"
    second = report(amdflash, copy, tmp_path / "r2.json", scratch=True)
    compare(first, second)
    for op in ("0x02", "0x20"):
        a, b = first["timings"]["busy"]["kinds"][op]["per_operation"], second["timings"]["busy"]["kinds"][op]["per_operation"]
        assert 0.6 * a["stdev"] <= b["stdev"] <= 1.4 * a["stdev"], (op, a, b)
    image = tmp_path / "image.bin"
    image.write_bytes(synthetic_ifwi(99))
    seconds = {}
    for name, board in (("source", source), ("copy", copy)):
        seconds[name] = modelled_command(amdflash, board, "flash", image, "--yes", "--force", "--sector-count", 256)
    print(f"modelled seconds: flash {seconds['source']:.6f} vs {seconds['copy']:.6f}")
    assert abs(seconds["copy"] - seconds["source"]) <= 0.02 * seconds["source"]


# A bridge whose transfers take a different time each (a real USB link does).
JITTERY = {"control": {"median": 130e-6, "stdev": 15e-6, "min": 95e-6, "max": 190e-6},
           "bulk": {"median": 70e-6, "stdev": 12e-6, "min": 40e-6, "max": 120e-6},
           "read_byte": 1 / 1.5e6, "write_byte": 1 / 3.0e6}


@pytest.mark.slow
def test_a_link_that_varies_round_trips_as_a_spread_and_dumps_in_the_same_time(amdflash, tmp_path):
    source = create_board(tmp_path / "source", seed=4, calibration={"transport": JITTERY})
    first = report(amdflash, source, tmp_path / "r1.json", scratch=False)
    t = first["timings"]["transport"]
    assert 8e-6 <= t["write32"]["stdev"] <= 25e-6, t["write32"]      # 16 control transfers: 15 us +- noise
    assert close(t["write32"]["median"], 130e-6, 12e-6), t["write32"]
    r = amdflash("sim", "create", tmp_path / "copy", "--from-report", tmp_path / "r1.json", "--seed", 8)
    assert r.code == 0, r.err
    assert "diverges:  transport: control varies from transfer to transfer" in r.out, r.out
    made = json.loads((tmp_path / "copy" / "board.json").read_text())["calibration"]["transport"]
    assert isinstance(made["control"], dict) and isinstance(made["bulk"], dict)
    copy = tmp_path / "copy"
    second = report(amdflash, copy, tmp_path / "r2.json", scratch=False)
    compare(first, second)
    assert 0.4 * t["write32"]["stdev"] <= second["timings"]["transport"]["write32"]["stdev"] <= 2.5 * t["write32"]["stdev"]
    seconds = {}
    # A board without the spread: the link's model figures at the same medians.
    steady = create_board(tmp_path / "steady", seed=4, calibration={"transport": {
        k: v["median"] if isinstance(v, dict) else v for k, v in JITTERY.items()}})
    for name, board in (("source", source), ("copy", copy), ("steady", steady)):
        seconds[name] = modelled_command(amdflash, board, "dump", tmp_path / f"{name}.bin")
    print(f"modelled seconds: dump {seconds}")
    assert abs(seconds["copy"] - seconds["source"]) <= 0.02 * seconds["source"]
    assert seconds["steady"] != seconds["source"]                # the spread is in the source's dump


@pytest.mark.slow
def test_a_chip_whose_operations_take_one_time_is_not_said_to_vary_over_a_link_that_does(amdflash, tmp_path):
    """Over a jittery bridge the host's clock is off from the chip's by part of a round trip
    (a posted write lands a varying handshake before its transfer completes): bounds taken on it
    may miss each other by that much without the chip varying."""
    source = create_board(tmp_path / "source", seed=6, chip=CHIP,
                          calibration={"transport": JITTERY, "busy": SOURCE["busy"]})
    first = report(amdflash, source, tmp_path / "r1.json", scratch=True)
    kinds = first["timings"]["busy"]["kinds"]
    assert not [op for op, k in kinds.items() if "per_operation" in k], kinds
    for op, seconds in SOURCE["busy"].items():
        k = kinds[op]
        assert close(k.get("seconds", k.get("seconds_at_most")), seconds, k.get("error", seconds)), (op, k)
