"""Issue 44, one report, one place, read from the central record: `fleet report HOST/RUN` reads
a temporary copy of the host's run, so its facts name the host, not that copy, as where the
commands of its 'next' line run, and say the error is quoted as the host recorded it."""
from __future__ import annotations

import json

import pytest

from amdflash.stages.sim import create_board
from amdflash.stages.sim.synth import PART_KEY
from tests.pipeline.cli import test_original_across_runs as across
from tests.pipeline.fleet import test_central
from tests.pipeline.fleet.test_central import enroll, push

pytest.importorskip("psycopg", reason="psycopg is not installed (pip install '.[test]' brings it)")

central = test_central.central    # a fresh central database, set up


def test_a_run_read_from_the_central_record_names_its_host_as_where_its_commands_run(cli, db, central, image,
                                                                                        tmp_path):
    board = create_board(tmp_path / "board", content=across.content(image.read_bytes()), transport="ideal", seed=5,
                         faults=["erase-fail=0"])
    assert cli("flash", image, "--yes", "--expect-part", PART_KEY, "--sector-count", "2",
               "--board", f"sim:{board}").code == 1
    run = json.loads(cli("runs", "--format", "json").out)[-1]["run_id"]
    enroll(cli, central, tmp_path)
    assert push(cli, central)[0].code == 0
    there = json.loads(cli("fleet", "report", f"hosta/{run}", "--from", central, "--format", "json").out)
    [said] = [w["text"] for w in there["facts"]["words"] if w["key"] == "database"]
    assert said == ("read from the central record's copy of hosta's run: the commands a 'next' line gives run on "
                    "hosta, against its own trail; the error is quoted as hosta recorded it, with its paths"), said
    assert there["facts"]["database"] is None and there["outcome"]["next_step"].startswith("on hosta")
    text = cli("fleet", "report", f"hosta/{run}", "--from", central).out
    assert f"database   {said}" in text.splitlines(), text
    here = json.loads(cli("report", run, "--format", "json").out)
    assert here["facts"]["database"] == str(db) and here["facts"]["verify_diagnosis"] == \
        there["facts"]["verify_diagnosis"]
