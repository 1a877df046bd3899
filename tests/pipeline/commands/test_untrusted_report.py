"""A hardware report is a file a stranger sent: whatever is in it, `sim create --from-report`
takes it or refuses it with CalibrationError (exit 2, naming the field) — never another error."""
from __future__ import annotations

import copy
import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from amdflash.stages.sim.calibration import CalibrationError
from amdflash.stages.sim.report_model import board_options

BOARDS = Path(__file__).resolve().parents[2] / "stages" / "boards"
REPORT = json.loads((BOARDS / "emulated-mx25u1635f-asm24.json").read_text())
# A board whose busy times and link vary: its report carries spreads (per_operation, stdev).
VARYING = json.loads((BOARDS / "emulated-varying-w25q16jw-asm24.json").read_text())

values = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                   st.text(max_size=12), st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=4),
                                                                                             st.integers(), max_size=3))


def paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from paths(value, (*prefix, key))


PATHS = [p for p in paths(REPORT) if p]
VARYING_PATHS = [p for p in paths(VARYING) if p]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(PATHS), st.booleans(), values), min_size=1, max_size=4))
def test_any_mutation_is_taken_or_refused_with_a_calibration_error(mutations):
    mutate(REPORT, mutations)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(VARYING_PATHS), st.booleans(), values), min_size=1, max_size=4))
def test_any_mutation_of_a_report_with_spreads_is_taken_or_refused_with_a_calibration_error(mutations):
    mutate(VARYING, mutations)


def mutate(base, mutations) -> None:  # noqa: ANN001
    report = copy.deepcopy(base)
    for path, delete, value in mutations:
        node = report
        for key in path[:-1]:
            if not isinstance(node, dict) or key not in node:
                break
            node = node[key]
        else:
            if isinstance(node, dict):
                if delete:
                    node.pop(path[-1], None)
                else:
                    node[path[-1]] = value
    try:
        options, divergences = board_options(report)
    except CalibrationError:
        return
    assert options["chip"] and all(isinstance(d, str) for d in divergences)


def test_every_field_missing_or_of_another_type_is_taken_or_refused_with_a_calibration_error():
    for base, path in [(REPORT, p) for p in PATHS] + [(VARYING, p) for p in VARYING_PATHS]:
        for change in ("delete", None, "x", -1, 2**64, [], {}):
            report = copy.deepcopy(base)
            node = report
            for key in path[:-1]:
                node = node[key]
            if change == "delete":
                del node[path[-1]]
            else:
                node[path[-1]] = change
            try:
                board_options(report)
            except CalibrationError:
                pass


def test_a_steady_link_is_not_said_to_vary_and_an_absurd_spread_is_refused():
    """Floating-point leftovers in a steady link's spread (1e-19 s) are no spread; a page program
    spread reaching 200 s (over ten times the datasheet maximum) is not a board to make."""
    options, divergences = board_options(copy.deepcopy(REPORT))
    assert not any("varies" in d for d in divergences), divergences
    assert all(not isinstance(v, dict) for v in options["calibration"]["transport"].values())
    report = copy.deepcopy(VARYING)
    report["timings"]["busy"]["kinds"]["0x02"]["per_operation"].update(max=200.0, stdev=100.0)
    try:
        board_options(report)
    except CalibrationError as e:
        assert "over ten times" in str(e)
    else:
        raise AssertionError("a 200 s page program was taken")


def test_a_runs_record_that_no_amdflash_wrote_is_refused_with_a_calibration_error():
    """`sim create --from-run` of a plain run reads the run's boards row and register snapshot:
    whatever is in them, a board or a CalibrationError — never another error."""
    from amdflash.stages.sim.report_model import run_board_options

    good = {"run": "run X (dump)", "kind": "sim", "jedec": "ef6015ef", "chip": "Winbond W25Q16JW", "sr1": 0,
            "sr2": 2, "sr3": 96, "detail": '{"profile": "asm24"}', "registers": {0x5A508: 0x700}}
    options, _ = run_board_options(good)
    assert options["chip"] == "W25Q16JW" and options["status_registers"] == (0, 2, 96)
    for key, bad in [("detail", '{"profile": ["x"]}'), ("detail", "[" * 100_000), ("detail", "not json"),
                     ("kind", ["usb"]), ("jedec", "zz"), ("jedec", 7), ("sr1", "x"), ("sr2", 1 << 40),
                     ("registers", {"zz": 1}), ("registers", {0x5A508: "x"}), ("registers", [1, 2]),
                     ("registers", {0x5A508: -1})]:
        try:
            run_board_options({**good, key: bad})
        except CalibrationError:
            pass
