"""A hardware report is a file a stranger sent: whatever is in it, `sim create --from-report`
takes it or refuses it with CalibrationError (exit 2, naming the field) — never another error."""
from __future__ import annotations

import copy
import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from amdflash.stages.transport.sim.calibration import CalibrationError
from amdflash.stages.transport.sim.report_model import board_options

BOARDS = Path(__file__).resolve().parents[1] / "boards"
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
