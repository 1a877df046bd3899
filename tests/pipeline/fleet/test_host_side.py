"""The host side of a line, without a coordinator: the exporter configuration, the labgrid
classes and the host job (`amdflash fleet job`) run through the labgrid driver."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from amdflash.pipeline.fleet.attributes import BOARD_ATTRIBUTES, RESOURCE_CLASS
from amdflash.pipeline.fleet.hostjob import unfinished_flash
from amdflash.stages.sim import create_board
from amdflash.stages.sim.synth import synthetic_ifwi
from tests.pipeline.fleet.conftest import flash_of

labgrid = pytest.importorskip("labgrid", reason="labgrid is not installed (pip install '.[test]' brings it)")


def amdflash(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "amdflash.pipeline.cli", *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd, env={**os.environ, **(env or {})})


def board_json(board: Path) -> dict:
    return json.loads((board / "board.json").read_text())


def test_exporter_config_publishes_each_board_with_its_identity(tmp_path: Path) -> None:
    from labgrid.remote.config import ResourceConfig

    boards = [create_board(tmp_path / f"b{i}", seed=30 + i) for i in range(2)]
    db = tmp_path / "host" / "audit.sqlite"
    out = tmp_path / "exporter.yaml"
    done = amdflash("--db", str(db), "fleet", "exporter-config", "--no-hardware",
                    "--sim", str(boards[0]), "--sim", str(boards[1]), "-o", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr

    # Read the way labgrid's exporter reads it: a template rendered with the exporter's hostname.
    config = ResourceConfig(str(out), {"hostname": "hosta", "name": "hosta", "isolated": False, "env": {}}).data
    assert len(config) == 2
    for board in boards:
        truth = board_json(board)
        group = f"sim-{truth['unique_id'][:12]}"
        attributes = config[group][RESOURCE_CLASS]
        assert attributes["host"] == "hosta"
        assert attributes["spec"] == f"sim:{board}"
        assert attributes["unique_id"] == truth["unique_id"]
        assert attributes["bridge_serial"] == truth["serial"]
        assert attributes["chip"] == "GigaDevice GD25LQ16E" and attributes["jedec"] == "c86015"
        assert attributes["db"] == str(db)
        assert attributes["emulated"] is True
        assert set(attributes) - {"host"} <= set(BOARD_ATTRIBUTES)


def test_exporter_config_is_inert_whatever_a_bridge_or_a_path_says(tmp_path: Path, monkeypatch) -> None:
    """labgrid renders the file with Jinja2 (unsandboxed) before reading it as YAML. A device
    that is not our bridge sent a serial string with a newline, YAML and a Jinja expression
    that runs a command (an attack review: the udev rule restarts the exporter, which
    regenerates and renders the file as its account); paths hold `{{`, `{%` and `##`."""
    from labgrid.remote.config import ResourceConfig

    marker = tmp_path / "ran"
    rogue = create_board(tmp_path / "rogue", seed=50)
    config = board_json(rogue)
    config["bridge"] = {"product": "Generic Storage", "serial_string": (
        'x\nevil:\n NetworkAmdflashBoard:\n  chip: "{{lipsum.__globals__.os.popen(\'touch ran\').read()}}"\n##')}
    (rogue / "board.json").write_text(json.dumps(config))
    good = create_board(tmp_path / "b{{7*7}} ## {% if 1 %}x{% endif %} 🙂", seed=51)   # and a non-BMP one
    db = tmp_path / "{# c #}" / "audit.sqlite"
    out = tmp_path / "exporter.yaml"
    done = amdflash("--db", str(db), "fleet", "exporter-config", "--no-hardware", "--sim", str(good),
                    "--sim", str(rogue), "-o", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "left out" in done.stderr and "Generic Storage" in done.stderr
    monkeypatch.chdir(tmp_path)           # where the expression would `touch ran`
    data = ResourceConfig(str(out), {"hostname": "hosta", "name": "hosta", "isolated": False, "env": {}}).data
    assert not marker.exists()
    assert list(data) == [f"sim-{board_json(good)['unique_id'][:12]}"]           # no group `evil`
    attributes = data[next(iter(data))][RESOURCE_CLASS]
    assert attributes["spec"] == f"sim:{good}" and attributes["db"] == str(db)   # read back as written


@pytest.mark.slow   # a long scenario: CI runs it (pytest -m slow)
def test_a_board_busy_with_a_job_keeps_its_identity_when_the_configuration_is_rewritten(
        tmp_path: Path, monkeypatch) -> None:
    """The exporter restarts (a bridge was plugged in) while a job runs on a board: listing
    never waits for that board, and its published identity stays what it was."""
    from labgrid.remote.config import ResourceConfig

    from amdflash.stages.transport.lock import sim_lock

    locks = {"AMDFLASH_LOCK_DIR": str(tmp_path / "locks")}
    monkeypatch.setenv("AMDFLASH_LOCK_DIR", locks["AMDFLASH_LOCK_DIR"])
    busy, idle = (create_board(tmp_path / name, seed=40 + i) for i, name in enumerate(("busy", "idle")))
    out = tmp_path / "exporter.yaml"
    args = ("fleet", "exporter-config", "--no-hardware", "--sim", str(busy), "--sim", str(idle), "-o", str(out))

    def published() -> dict:
        return {r["NetworkAmdflashBoard"]["spec"]: r["NetworkAmdflashBoard"]
                for r in ResourceConfig(str(out), {"hostname": "h"}).data.values()}

    with sim_lock(busy):
        first = amdflash(*args, cwd=tmp_path, env=locks)             # no earlier file: left out, said so
        assert first.returncode == 0 and "busy with a job" in first.stderr
        assert list(published()) == [f"sim:{idle}"]
    assert amdflash(*args, cwd=tmp_path, env=locks).returncode == 0
    before = published()
    with sim_lock(busy):
        again = amdflash(*args, cwd=tmp_path, env=locks)
    assert again.returncode == 0 and "identity is kept" in again.stderr
    assert published() == before
    assert published()[f"sim:{busy}"]["unique_id"] == board_json(busy)["unique_id"]


def test_exporter_config_refuses_a_directory_that_is_no_board(tmp_path: Path) -> None:
    done = amdflash("fleet", "exporter-config", "--no-hardware", "--sim", str(tmp_path), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().startswith("error: ") and "not an emulated board" in done.stderr


def test_exporter_config_without_boards_is_an_empty_valid_file(tmp_path: Path) -> None:
    from labgrid.remote.config import ResourceConfig

    out = tmp_path / "exporter.yaml"
    assert amdflash("fleet", "exporter-config", "--no-hardware", "-o", str(out), cwd=tmp_path).returncode == 0
    assert ResourceConfig(str(out), {"hostname": "h"}).data == {}


@pytest.mark.slow   # a long scenario: CI runs it (pytest -m slow)
def test_fleet_flash_refuses_before_reserving_anything(tmp_path: Path) -> None:
    """Usage errors: one line, exit 2, and no coordinator is even asked (none listens here)."""
    good, short = tmp_path / "good.bin", tmp_path / "short.bin"
    good.write_bytes(synthetic_ifwi(1))
    short.write_bytes(b"\xff" * 1024)
    nowhere = ("--coordinator", "127.0.0.1:9")
    cases = [
        (("flash", str(good), "--where", "line=a", *nowhere), "without --yes"),
        (("flash", str(short), "--where", "line=a", "--yes", *nowhere), "0x400 bytes"),
        (("flash", str(good), "--where", "Line=a", "--yes", *nowhere), "tag keys"),
        (("flash", str(good), "--where", "line", "--yes", *nowhere), "not KEY=VALUE"),
        (("info", "--parallel", "0", *nowhere), "--parallel"),
        (("info", *nowhere), "no hosts allowed: the fleet connects only to the hosts the operator names"),
        (("info", "--hosts", "hosta,-oProxyCommand=x", *nowhere), "'-oProxyCommand' is not a host name"),
        (("info", "--hosts", "hosta=relative.sqlite", *nowhere), "must be an absolute, normalised path"),
        (("info", "--hosts", "hosta", *nowhere), "cannot reach the labgrid coordinator at 127.0.0.1:9"),
        (("places", *nowhere), "no hosts allowed"),
    ]
    config = tmp_path / "config.toml"            # an operator who allowed no host yet
    config.write_text("")
    for args, message in cases:
        done = amdflash("fleet", *args, cwd=tmp_path, env={"AMDFLASH_CONFIG": str(config)})
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr.strip().splitlines() == [done.stderr.strip()] and message in done.stderr, done.stderr
        assert done.stderr.startswith("error: ")


def test_resource_classes_carry_every_exported_attribute() -> None:
    import attr

    from amdflash.pipeline.fleet.labgrid_board import AmdflashBoard, NetworkAmdflashBoard

    for cls in (AmdflashBoard, NetworkAmdflashBoard):
        assert set(BOARD_ATTRIBUTES) <= {f.name for f in attr.fields(cls)}
    assert NetworkAmdflashBoard.__name__ == RESOURCE_CLASS
    assert "host" in {f.name for f in attr.fields(NetworkAmdflashBoard)}


@pytest.mark.parametrize("runs, expected", [
    ([], None),
    ([{"board_spec": "sim:/b", "command": "flash", "status": "running", "image_sha256": "aa", "run_id": "r1"}], "r1"),
    ([{"board_spec": "sim:/b", "command": "flash", "status": "interrupted", "image_sha256": "aa", "run_id": "r1"}],
     "r1"),
    # another image, a finished or failed run, another board, a read-only run: no resume
    ([{"board_spec": "sim:/b", "command": "flash", "status": "running", "image_sha256": "bb", "run_id": "r1"}], None),
    ([{"board_spec": "sim:/b", "command": "flash", "status": "succeeded", "image_sha256": "aa", "run_id": "r1"}], None),
    ([{"board_spec": "sim:/b", "command": "flash", "status": "failed", "image_sha256": "aa", "run_id": "r1"}], None),
    ([{"board_spec": "sim:/c", "command": "flash", "status": "running", "image_sha256": "aa", "run_id": "r1"}], None),
    # only the newest flash/resume of the board counts; verify runs in between do not
    ([{"board_spec": "sim:/b", "command": "flash", "status": "interrupted", "image_sha256": "aa", "run_id": "r1"},
      {"board_spec": "sim:/b", "command": "resume", "status": "succeeded", "image_sha256": "aa", "run_id": "r2"}],
     None),
    ([{"board_spec": "sim:/b", "command": "flash", "status": "interrupted", "image_sha256": "aa", "run_id": "r1"},
      {"board_spec": "sim:/b", "command": "resume", "status": "running", "image_sha256": "aa", "run_id": "r2"},
      {"board_spec": "sim:/b", "command": "verify", "status": "failed", "image_sha256": "aa", "run_id": "r3"}], "r2"),
])
def test_which_flash_is_resumed(runs: list[dict], expected: str | None) -> None:
    assert unfinished_flash(runs, "sim:/b", "aa") == expected


def test_a_query_of_an_audit_database_being_created_never_fails(tmp_path: Path) -> None:
    """Two jobs start at once on a new host: one creates the audit database while the other
    lists its runs. The listing must not fail for the half-made database: it sees no runs yet
    (None: the CLI's refusal "no audit trail yet") or the finished database. The two states
    are taken in turn (a timer racing the listing made this test depend on the machine's load)."""
    import shutil

    from amdflash.pipeline.cli.main import main
    from amdflash.pipeline.fleet.hostjob import cli_json

    made = tmp_path / "made.sqlite"
    assert main(["--db", str(made), "-q", "info", "--board", f"sim:{create_board(tmp_path / 'b', seed=3)}"]) == 0
    db = tmp_path / "audit.sqlite"
    db.touch()                                   # the file exists, its tables do not yet
    assert cli_json(main, ["--db", str(db)], "runs", "--format", "json") is None     # an empty file: no runs yet
    assert db.stat().st_size == 0                # and the listing did not create the tables itself
    shutil.copy(made, db)                        # the other job has finished creating it
    runs = cli_json(main, ["--db", str(db)], "runs", "--format", "json")
    assert [r["command"] for r in runs] == ["info"]
    assert cli_json(main, ["--db", str(tmp_path / "none.sqlite")], "runs", "--format", "json") is None   # no database


@pytest.mark.slow   # a long scenario: CI runs it (pytest -m slow)
def test_driver_flashes_resumes_a_killed_flash_and_dumps(tmp_path: Path) -> None:
    """The labgrid driver on a local board: a flash whose process is SIGKILLed mid-flash (the
    board's host-death fault) is reported interrupted, the next flash of the image resumes it
    to the exact image, and a dump copies the flash here. (Through SSH and a coordinator:
    test_line.py.)"""
    from labgrid import Target

    from amdflash.pipeline.fleet.export import amdflash_command
    from amdflash.pipeline.fleet.labgrid_board import AmdflashBoard, AmdflashDriver

    image = tmp_path / "image.bin"
    image.write_bytes(synthetic_ifwi(77))
    board = create_board(tmp_path / "board", seed=5, faults=["kill-after-writes=53000"])   # mid-programming
    target = Target("bench")
    AmdflashBoard(target, None, spec=f"sim:{board}", db=str(tmp_path / "audit.sqlite"), command=amdflash_command())
    driver = AmdflashDriver(target, None)
    target.activate(driver)

    killed = driver.flash(image)
    assert killed["status"] == "interrupted" and "SIGKILL" in killed["error"]
    assert killed["run_id"] and killed["job"] == "flash"
    assert flash_of(board) != image.read_bytes()
    report = json.loads(amdflash("--db", str(tmp_path / "audit.sqlite"), "report", killed["run_id"], "--format",
                                 "json", cwd=tmp_path).stdout)
    assert report["status"] == "interrupted"   # the process died: nothing closed the run, and it is gone
    written = [u for u in report["units"] if u["action"] != "skip"]
    assert any(u["state"] == "verified" for u in written)    # killed mid-flash: some units were written,
    assert any(u["state"] != "verified" for u in written)    # others were not

    resumed = driver.load(image)       # labgrid's BootstrapProtocol
    assert resumed["status"] == "succeeded", resumed
    assert resumed["job"] == "resume" and resumed["resumes"] == killed["run_id"]
    assert resumed["result_sha256"] == hashlib.sha256(image.read_bytes()).hexdigest()
    assert flash_of(board) == image.read_bytes()
    assert resumed["modelled_seconds"] > 0

    dumped = driver.dump(tmp_path / "dump.bin")
    assert dumped["status"] == "succeeded", dumped
    assert dumped["output"] == str(tmp_path / "dump.bin")
    assert (tmp_path / "dump.bin").read_bytes() == image.read_bytes()


@pytest.mark.parametrize("parallel, expected", [
    (8, [("a", 4), ("b", 4)]),                       # one amdflash process per host
    (4, [("a", 2), ("b", 2), ("a", 2), ("b", 2)]),   # the slots shared out, the hosts in turn
    (1, [("a", 1), ("b", 1)] * 4),
    (3, [("a", 1), ("b", 1)] * 4),
])
def test_boards_are_batched_by_host_within_the_parallel_limit(parallel: int, expected: list) -> None:
    from types import SimpleNamespace

    from amdflash.pipeline.fleet.run import batches

    def job(host: str, i: int):
        args = {"spec": f"sim:/{host}/{i}", "db": f"/{host}.sqlite", "command": "amdflash"}
        return SimpleNamespace(board=SimpleNamespace(exporter=host, host=host, args=args))

    jobs = [job(h, i) for i in range(4) for h in ("a", "b")]
    got = batches(jobs, parallel)
    assert [(b.jobs[0].board.host, len(b.jobs)) for b in got] == expected
    assert all(len({j.board.host for j in b.jobs}) == 1 for b in got)
    assert sorted(id(j) for b in got for j in b.jobs) == sorted(id(j) for j in jobs)


def test_a_labgrid_environment_drives_a_local_board(tmp_path: Path) -> None:
    """The README's labgrid environment: the module under `imports`, an AmdflashBoard and the driver."""
    from labgrid import Environment

    board = create_board(tmp_path / "board", seed=8)
    config = tmp_path / "env.yaml"
    config.write_text(json.dumps({   # JSON is YAML
        "imports": ["amdflash.pipeline.fleet.labgrid_board"],
        "targets": {"main": {
            "resources": {"AmdflashBoard": {"spec": f"sim:{board}", "db": str(tmp_path / "audit.sqlite"),
                                            "command": f"{sys.executable} -m amdflash.pipeline.cli"}},
            "drivers": {"AmdflashDriver": {}}}}}))
    target = Environment(str(config)).get_target("main")
    info = target.get_driver("AmdflashDriver").info()
    assert info["status"] == "succeeded" and info["run_id"]
    assert any(board_json(board)["unique_id"] in line for line in info["lines"])


def _host_dies_once_run_ended(db: Path, spec: str, dies: Callable[[object], None]) -> Callable[[object], None]:
    """The emulator's host death, held back until the audit trail `db` shows the run of board
    `spec` ended (committed, as any reader sees it): the order a test needs, made explicit
    rather than left to the scheduler. The wait is in the dying job process (a fork inherits
    this patch); the kill then happens exactly as the fault would do it."""
    def die_after(board: object) -> None:
        deadline = time.monotonic() + 300            # a safety net only: the CLI's own timeout
        while time.monotonic() < deadline:
            if db.exists():
                with contextlib.closing(sqlite3.connect(db, timeout=30)) as conn:
                    ended = conn.execute("SELECT count(*) FROM runs r JOIN run_status s ON s.run_id = r.run_id "
                                         "WHERE r.board_spec = ? AND s.status != 'running'", (spec,)).fetchone()[0]
                if ended:
                    break
            time.sleep(0.02)
        dies(board)

    return die_after


@pytest.mark.slow
def test_a_killed_job_reports_the_end_a_board_recorded_before_the_kill(tmp_path: Path, monkeypatch) -> None:
    """Two boards in one job process: one whose flash has nothing to write ends first, then the
    other board's host-death fault kills the process late in its own flash. The first board's
    run recorded `succeeded` and is reported so; only the other is interrupted. (The fault fires
    at 95 % of the flash's writes but not before the first board's end is in the trail: on a
    busy machine the kill could otherwise come first.)"""
    from amdflash.pipeline.cli.main import main
    from amdflash.pipeline.fleet.hostjob import run
    from amdflash.stages.sim import Board

    monkeypatch.setenv("AMDFLASH_LOCK_DIR", str(tmp_path / "locks"))
    image = synthetic_ifwi(77)
    (tmp_path / "image.bin").write_bytes(image)
    torn = bytearray(image)
    for block in (0x80000, 0x110000, 0x190000):
        torn[block:block + 0x10000] = bytes(0x10000)
    reference = create_board(tmp_path / "reference", seed=6, transport="ideal", content=bytes(torn))
    assert main(["-q", "--db", str(tmp_path / "ref.sqlite"), "flash", str(tmp_path / "image.bin"), "--yes",
                 "--board", f"sim:{reference}"]) == 0
    with Board(reference) as b:
        total = int(b.stats()["reg_writes"])
    done = create_board(tmp_path / "done", seed=5, transport="ideal", content=image)
    killed = create_board(tmp_path / "killed", seed=6, transport="ideal", content=bytes(torn),
                          faults=[f"kill-after-writes={int(total * 0.95)}"])
    monkeypatch.setattr(Board, "_host_dies", _host_dies_once_run_ended(tmp_path / "audit.sqlite", f"sim:{done}",
                                                                      Board._host_dies))
    results = {r["board"]: r for r in run(main, [f"sim:{done}", f"sim:{killed}"], str(tmp_path / "audit.sqlite"),
                                             "flash", str(tmp_path / "image.bin"))}
    assert results[f"sim:{killed}"]["status"] == "interrupted" and "SIGKILL" in results[f"sim:{killed}"]["error"]
    assert results[f"sim:{done}"]["status"] == "succeeded", results[f"sim:{done}"]
    assert results[f"sim:{done}"]["run_id"] and not results[f"sim:{done}"]["error"]
    assert flash_of(done) == image and flash_of(killed) != image


def test_a_dump_waiting_on_the_host_for_the_client_is_the_user_s_alone(tmp_path: Path, monkeypatch) -> None:
    """A fleet dump's output waits in the host's temp dir until the client fetches it: 2 MiB of
    flash, 0600 whatever the umask (issue 28 item 6), a regular file of our own."""
    import stat

    from amdflash.pipeline.cli.main import main
    from amdflash.pipeline.fleet.hostjob import run

    monkeypatch.setenv("AMDFLASH_LOCK_DIR", str(tmp_path / "locks"))
    board = create_board(tmp_path / "board", seed=9, transport="ideal")
    old = os.umask(0o022)                        # a usual umask: the command line's outputs are 0644
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        [result] = run(main, [f"sim:{board}"], str(tmp_path / "audit.sqlite"), "dump", None)
    finally:
        os.umask(old)
    assert result["status"] == "succeeded", result
    # Ctrl-C and SIGTERM went to the job while it ran; the caller's handlers are back after.
    assert {s: signal.getsignal(s) for s in handlers} == handlers
    output = Path(result["output"])
    try:
        st = os.lstat(output)
        assert stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid()
        assert stat.S_IMODE(st.st_mode) == 0o600, oct(st.st_mode)
        assert output.read_bytes() == flash_of(board)
    finally:
        output.unlink()


@pytest.mark.slow
def test_a_job_on_two_boards_says_each_board_s_progress_as_it_goes(tmp_path: Path, monkeypatch, capsys) -> None:
    """Issue 27 item 9: the host job hears its boards' progress (the one amdflash process's
    --log-json events) and says it per board, in numbers, before the job's results."""
    from amdflash.pipeline.cli.main import main
    from amdflash.pipeline.fleet.hostjob import run

    monkeypatch.setenv("AMDFLASH_LOCK_DIR", str(tmp_path / "locks"))
    (tmp_path / "image.bin").write_bytes(synthetic_ifwi(78))
    boards = [f"sim:{create_board(tmp_path / f'b{i}', seed=20 + i, transport='ideal')}" for i in range(2)]
    heard: list[tuple[str, dict]] = []
    with capsys.disabled():   # the forked job writes its events to its fd 2 through sys.stderr: pytest's own
        results = run(main, boards, str(tmp_path / "audit.sqlite"), "flash", str(tmp_path / "image.bin"),
                      on_progress=lambda board, progress: heard.append((board, progress)))
    assert [r["status"] for r in results] == ["succeeded", "succeeded"], results
    for board in boards:
        stages = {p["stage"]: p for b, p in heard if b == board}
        assert set(stages) >= {"backup", "erase", "program", "verify"}, stages
        assert stages["verify"]["done"] == stages["verify"]["total"] == 2 * 1024 * 1024
        assert stages["verify"]["unit"] == "bytes" and stages["verify"]["rate"] > 0


def test_a_host_job_s_runs_name_the_host_as_the_line_does(tmp_path: Path, monkeypatch, capsys) -> None:
    """Issue 27: a run made by a host job given the line's name for its host (--host-name, from
    the board's place) records that name, so its page read on the line says `hosta`, not the OS
    host name of the machine behind it; without one, the OS host name."""
    import socket

    from amdflash.pipeline.cli.main import main
    from amdflash.pipeline.engine.run_facts import LINE_NAME
    from amdflash.pipeline.fleet.hostjob import run

    monkeypatch.setenv("AMDFLASH_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.delenv(LINE_NAME, raising=False)
    board = f"sim:{create_board(tmp_path / 'b', seed=5, transport='ideal')}"
    db = tmp_path / "audit.sqlite"
    other = f"not-{socket.gethostname()}"
    with capsys.disabled():
        named = run(main, [board], str(db), "info", None, line_name=other)
        plain = run(main, [board], str(db), "info", None)
    assert [r["host"] for r in (*named, *plain)] == [other, socket.gethostname()]
    con = sqlite3.connect(db)
    try:
        hosts = dict(con.execute("SELECT run_id, host FROM runs").fetchall())
    finally:
        con.close()
    assert [hosts[r["run_id"]] for r in (*named, *plain)] == [other, socket.gethostname()], hosts
    assert LINE_NAME not in os.environ           # the job's name for its host stays the job's


def test_progress_said_while_the_job_queries_its_own_command_line_reaches_the_client(monkeypatch, capsys) -> None:
    """The host job asks its own command line for JSON (cli_json swaps sys.stdout for the whole
    process meanwhile) while its reader threads say each board's progress: a line said then goes
    to the client, not into the query's JSON (a fleet job on a busy host failed with
    'JSONDecodeError: Extra data' once progress came every second)."""
    from amdflash.pipeline.fleet import hostjob

    def jobs(cli_main, specs, db, job, image, flash_args, line_name, on_run, on_progress, operator=None):  # noqa: ANN001, ANN202
        def query(argv: list[str]) -> int:          # the query's moment: a reader thread says progress
            said = threading.Thread(target=on_progress, args=(specs[0], {"stage": "program", "done": 4096}))
            said.start()
            said.join()
            print("[]")
            return 0
        assert hostjob.cli_json(query, [], "runs", "--format", "json") == []
        return [{"board": specs[0], "status": "succeeded", "exit_code": 0}]

    monkeypatch.setattr(hostjob, "run", jobs)
    monkeypatch.setattr(hostjob.os, "setpgid", lambda pid, pgrp: None)   # this test process keeps its group
    hangup = signal.getsignal(signal.SIGHUP)
    try:
        assert hostjob.main(lambda argv: 0, ["sim:/b"], None, "flash", "image.bin") == 0
    finally:
        signal.signal(signal.SIGHUP, hangup if hangup is not None else signal.SIG_DFL)
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {"board": "sim:/b", "progress": {"stage": "program", "done": 4096}} in lines, lines
    assert lines[-1] == {"board": "sim:/b", "status": "succeeded", "exit_code": 0}, lines


def test_a_host_job_s_runs_record_who_the_fleet_client_says_runs_them(tmp_path: Path, monkeypatch, capsys) -> None:
    """On a host every fleet job runs as the host's own account (`amdflash`), the same for
    everyone: the client's --operator (else its account@machine) is passed to the job and
    recorded as claimed beside it, also a name that begins with '-' (a line brought up from the
    README: the report said only 'OS account amdflash')."""
    from amdflash.pipeline.cli.main import build_parser, main
    from amdflash.pipeline.fleet.hostjob import run
    from amdflash.pipeline.fleet.labgrid_board import host_job_argv
    from types import SimpleNamespace

    monkeypatch.setenv("AMDFLASH_LOCK_DIR", str(tmp_path / "locks"))
    spec = f"sim:{create_board(tmp_path / 'b', seed=5, transport='ideal')}"
    db = tmp_path / "audit.sqlite"
    argv = host_job_argv(["amdflash"], SimpleNamespace(host="hosta", spec=spec, db=str(db)), "info",
                         operator="-lineop@bench3")
    args = build_parser().parse_args(argv[1:])              # as the host's command line reads it
    assert (args.job, args.operator, args.host_name) == ("info", "-lineop@bench3", "hosta")
    with capsys.disabled():
        claimed = run(main, [spec], str(db), "info", None, operator=args.operator)
        unnamed = run(main, [spec], str(db), "info", None)
    con = sqlite3.connect(db)
    try:
        recorded = dict(con.execute("SELECT run_id, operator_claimed FROM runs").fetchall())
    finally:
        con.close()
    assert [recorded[r["run_id"]] for r in (*claimed, *unnamed)] == ["-lineop@bench3", None]


def test_the_fleet_client_claims_its_account_when_no_operator_is_given(monkeypatch) -> None:
    import argparse
    import getpass
    import socket

    from amdflash.pipeline.cli.fleet import _operator

    assert _operator(argparse.Namespace(operator="alice")) == "alice"
    assert _operator(argparse.Namespace(operator=None)) == f"{getpass.getuser()}@{socket.gethostname()}"
