"""A rogue labgrid coordinator, live on loopback (issue 41, last item): labgrid's own gRPC
service answering the fleet client with hostile places and resources, a reservation that
names another place, answers that never come, malformed answers. The client waits for each
answer a bounded time and says so in one line; it takes, prints and runs only what is of the
documented shape; it never reaches a host the operator did not allow, nor another place than
the one it asked for."""
from __future__ import annotations

import json
import time

import pytest

from amdflash.pipeline.fleet import coordinator as coordinator_module
from amdflash.pipeline.fleet import run as run_module
from amdflash.pipeline.fleet.trust import DEFAULT_DB
from tests.pipeline.fleet.rogue_coordinator import Script, place, resource, rogue_coordinator
from tests.support.cli import run

labgrid = pytest.importorskip("labgrid", reason="labgrid is not installed (pip install '.[test]' brings it)")
from labgrid.remote.generated import labgrid_coordinator_pb2 as pb  # noqa: E402 (after the skip)

BOARD = {"host": "hosta", "kind": "usb", "spec": "usb:0a1b2c3d", "db": DEFAULT_DB}
HOSTILE = "\x1b]0;owned\x07\x1b[2K\r\x9b31m\u202e"      # OSC title, erase line, CR, C1 CSI, bidi override
RAW = ("\x1b", "\x07", "\r", "\x9b", "\u202e")
ANSWER = 2.0        # the client's bound on an answer, for these tests (the product's is 30 s)


@pytest.fixture(autouse=True)
def _short_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(coordinator_module, "ANSWER_SECONDS", ANSWER)


@pytest.fixture()
def started(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Every process the fleet starts for a job, recorded and never run (it exits 255 at once, as
    ssh to an unreachable host does): what a rogue coordinator can make the fleet run."""
    argvs: list[list[str]] = []
    real = run_module.asyncio.create_subprocess_exec

    async def record(*argv: str, **kwargs: object) -> object:
        argvs.append(list(argv))
        return await real("sh", "-c", "echo 'ssh: connect to host: Connection refused' >&2; exit 255", **kwargs)

    monkeypatch.setattr(run_module.asyncio, "create_subprocess_exec", record)
    return argvs


def _board(host: str = "hosta", place_name: str | None = None) -> list[pb.UpdateResponse]:
    return [resource(host, "g", "r", {**BOARD, "host": host}),
            place(place_name or f"{host}-g", (host, "g", "NetworkAmdflashBoard", "r"))]


def _one_line_error(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.mark.parametrize("script", [{"stall_stream": True}, {"trickle": True}], ids=["silent", "trickle"])
def test_a_coordinator_that_never_answers_is_a_one_line_error_within_the_bound(script: dict) -> None:
    # Silent: the stream open, nothing said. Trickle: a new place every 50 ms, the answer never.
    with rogue_coordinator(Script(**script, lifetime=15)) as address:
        began = time.monotonic()
        done = run("fleet", "places", "--hosts", "hosta", "--coordinator", address)
        took = time.monotonic() - began
    # Before: it waited as long as the coordinator held the stream open (here 15 s; a rogue: forever).
    assert took < ANSWER + 5, took
    assert done.code == 2 and done.out == ""
    assert "did not answer within 2 s" in _one_line_error(done.err)


def test_a_coordinator_that_floods_places_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(coordinator_module, "ENTRIES_MAX", 2_000)
    flood = [place(f"p{i}", ("hostz", "g", "NetworkAmdflashBoard", f"r{i}")) for i in range(6_000)]
    with rogue_coordinator(Script(updates=flood)) as address:
        began = time.monotonic()
        done = run("fleet", "info", "--hosts", "hosta", "--coordinator", address)
        took = time.monotonic() - began
    # Before: every place kept (as many as the coordinator sent in time), and one row for each.
    assert took < ANSWER + 5, took
    assert done.code == 2 and done.out == ""
    assert "more than 2000 of either" in _one_line_error(done.err)


@pytest.mark.slow
def test_a_coordinator_that_floods_once_the_run_began_is_dropped_and_the_job_goes_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(coordinator_module, "ENTRIES_MAX", 2_000)
    ran: list[list[str]] = []
    real = run_module.asyncio.create_subprocess_exec

    async def job(*argv: str, **kwargs: object) -> object:     # a job that lasts while the flood comes
        ran.append(list(argv))
        return await real("sh", "-c", "sleep 3; echo 'ssh: connect to host: Connection refused' >&2; exit 255",
                          **kwargs)

    monkeypatch.setattr(run_module.asyncio, "create_subprocess_exec", job)
    with rogue_coordinator(Script(updates=_board(), flood_after_sync=True, lifetime=30)) as address:
        done = run("fleet", "info", "--hosts", "hosta", "--where", "name=hosta-g", "--format", "json",
                   "--coordinator", address)
    result = json.loads(done.out)
    # Before: every place kept for as long as the job ran (the client's memory growing with them).
    assert [r["board"] for r in result["boards"]] == ["hosta-g"] and ran
    assert any("was dropped at" in n and "more than 2000 of either" in n for n in result["notes"]), result["notes"]


def test_a_reservation_never_answered_skips_the_board_within_the_bound(started: list) -> None:
    script = Script(updates=_board(), stall={"CreateReservation"}, lifetime=15)
    with rogue_coordinator(script) as address:
        began = time.monotonic()
        done = run("fleet", "info", "--hosts", "hosta", "--format", "json", "--coordinator", address)
        took = time.monotonic() - began
    assert took < ANSWER + 5, took
    (row,) = json.loads(done.out)["boards"]
    assert row["status"] == "skipped" and "did not answer within 2 s" in row["error"]
    assert done.code == 2 and done.err == ""      # no asyncio/grpc callback noise either
    assert started == [] and ("AcquirePlace", "hosta-g") not in script.calls


def test_a_place_whose_acquire_is_never_answered_is_skipped_and_given_back(started: list) -> None:
    script = Script(updates=_board(), stall={"AcquirePlace"}, lifetime=15)
    with rogue_coordinator(script) as address:
        began = time.monotonic()
        done = run("fleet", "info", "--hosts", "hosta", "--format", "json", "--coordinator", address)
        took = time.monotonic() - began
    assert took < ANSWER + 5, took
    (row,) = json.loads(done.out)["boards"]
    assert row["status"] == "skipped" and "not acquired: the coordinator did not answer within 2 s" in row["error"]
    assert started == [] and done.code == 2
    # Perhaps acquired over there: released and its reservation cancelled, as a taken board's are.
    assert ("ReleasePlace", "hosta-g") in script.calls and ("CancelReservation", "T0K3N") in script.calls


def test_a_place_never_given_back_is_a_note_within_the_bound(started: list) -> None:
    script = Script(updates=_board(), stall={"ReleasePlace"}, lifetime=15)
    with rogue_coordinator(script) as address:
        began = time.monotonic()
        done = run("fleet", "info", "--hosts", "hosta", "--format", "json", "--coordinator", address)
        took = time.monotonic() - began
    assert took < ANSWER + 8, took         # one bounded wait for the release, one for the cancel at most
    result = json.loads(done.out)
    assert any("did not answer within 2 s" in note for note in result["notes"]), result["notes"]
    assert started and {argv[argv.index("--") + 1] for argv in started} == {"hosta"}


def test_a_malformed_reservation_answer_skips_the_board_without_a_crash(started: list) -> None:
    script = Script(updates=_board(), reservation=pb.Reservation(token="t", state=77))
    with rogue_coordinator(script) as address:
        done = run("fleet", "info", "--hosts", "hosta", "--format", "json", "--coordinator", address)
    # Before: `error: 77 is not a valid ReservationState`, exit 1, no row.
    (row,) = json.loads(done.out)["boards"]
    assert row["status"] == "skipped" and "reservation answer is malformed" in row["error"]
    assert done.code == 2 and started == []
    assert ("CancelReservation", "t") in script.calls and ("AcquirePlace", "hosta-g") not in script.calls


def test_a_coordinator_s_refusal_is_shown_escaped_and_short(started: list) -> None:
    script = Script(updates=_board(), refuse_with=HOSTILE + "x" * 6_000)
    with rogue_coordinator(script) as address:
        done = run("fleet", "info", "--hosts", "hosta", "--format", "json", "--coordinator", address)
    (row,) = json.loads(done.out)["boards"]
    # Before: the coordinator's 6 kB of words, whole, in the row (and on the terminal).
    assert row["status"] == "skipped" and row["error"].startswith("not taken: reservation refused: '\\x1b]0;owned")
    assert len(row["error"]) < 200 and not any(c in row["error"] for c in RAW) and started == []


@pytest.mark.parametrize("malformed", [
    {"updates": [pb.UpdateResponse(place=pb.Place(name="x", acquired_resources=["a/b"]))]},
    {"sync_id_offset": 1000},
], ids=["bad-place", "unasked-sync"])
def test_a_malformed_stream_is_a_one_line_error_without_a_traceback(malformed: dict) -> None:
    # Held without a change: labgrid's session ends on it, and the client says it cannot reach it.
    with rogue_coordinator(Script(**malformed)) as address:
        done = run("fleet", "places", "--hosts", "hosta", "--coordinator", address)
        logged = run("--log-json", "fleet", "places", "--hosts", "hosta", "--coordinator", address)
    assert done.code == logged.code == 2 and done.out == logged.out == ""
    assert "cannot reach the labgrid coordinator" in _one_line_error(done.err) and "Traceback" not in done.err
    # In one test process several sessions run one after the other: gRPC's own core may add a
    # line of its own to stderr (not amdflash's); amdflash's words are one error event.
    (event,) = [e for e in map(json.loads, (x for x in logged.err.splitlines() if x.startswith("{")))
                if e.get("level") == "error" and e.get("logger") != "asyncio"]   # the earlier session's loop
    assert "cannot reach the labgrid coordinator" in event["event"]


@pytest.mark.parametrize("name", [f"hosta-g{HOSTILE}", "hosta-g\nnote: all boards verified OK", "h" * 100_000])
def test_a_place_whose_name_is_not_a_place_name_is_never_taken(started: list, name: str) -> None:
    script = Script(updates=_board(place_name=name))
    with rogue_coordinator(script) as address:
        done = run("fleet", "info", "--hosts", "hosta", "--coordinator", address)
        logged = run("--log-json", "fleet", "info", "--hosts", "hosta", "--format", "json", "--coordinator", address)
    # Before: reserved, acquired and its job started; a 100 kB name printed whole.
    assert not any(call[0] in ("CreateReservation", "AcquirePlace") for call in script.calls), script.calls
    assert started == [] and done.code == 2 and logged.code == 2
    assert "its name is not a place name" in done.out
    assert not any(c in done.out + done.err + logged.err for c in RAW)
    assert max(map(len, done.out.splitlines())) < 1000
    (row,) = json.loads(logged.out)["boards"]
    assert row["status"] == "unavailable" and len(row["board"]) < 200
    assert all(json.loads(line) for line in logged.err.splitlines())    # every stderr line one event


def test_fleet_places_adopts_no_place_whose_name_is_not_a_place_name() -> None:
    updates = [resource("hosta", "g", "r", BOARD),
               place("P" * 100_000 + HOSTILE, ("hosta", "g", "NetworkAmdflashBoard", "r"))]
    script = Script(updates=updates, publish_added=True)
    with rogue_coordinator(script) as address:
        done = run("fleet", "places", "--hosts", "hosta", "--coordinator", address)
    # Before: the 100 kB place was adopted for the board and printed whole.
    assert done.code == 0 and done.err == "", done.err
    assert done.out.split()[0] == "hosta-g" and len(done.out) < 1000
    assert ("AddPlace", "hosta-g") in script.calls


@pytest.mark.parametrize("script", [{"stall": {"AddPlace"}}, {}], ids=["never-answered", "never-published"])
def test_a_place_the_coordinator_does_not_make_is_a_one_line_error(script: dict) -> None:
    with rogue_coordinator(Script(updates=[resource("hosta", "g", "r", BOARD)], lifetime=15, **script)) as address:
        began = time.monotonic()
        done = run("fleet", "places", "--hosts", "hosta", "--coordinator", address)
        took = time.monotonic() - began
    # Before: held until the coordinator went away, then `internal error`; or `internal error KeyError`.
    assert took < ANSWER + 5, took
    assert done.code == 2 and done.out == ""
    line = _one_line_error(done.err)
    assert line.startswith("error: place hosta-g: ") and "internal error" not in line


def test_hostile_names_and_tags_in_fleet_places_are_shown_escaped() -> None:
    # The tags of a place it adopts held without a change (printable()); a group that cannot
    # name a place made `fleet places` make one that `fleet run` refuses: now a note, nothing made.
    updates = [resource("hosta", "g", "r", BOARD), resource("hosta", f"g{HOSTILE}", "r", BOARD),
               place("hosta-g", ("hosta", "g", "NetworkAmdflashBoard", "r"), {"t": f"v{HOSTILE}"})]
    script = Script(updates=updates, publish_added=True)
    with rogue_coordinator(script) as address:
        done = run("fleet", "places", "--hosts", "hosta", "--coordinator", address)
    assert done.code == 0 and not any(c in done.out + done.err for c in RAW)
    assert "t=v\\x1b]0;owned" in done.out and "\\u202e" in done.out and len(done.out.splitlines()) == 1
    (note,) = done.err.splitlines()
    assert note.startswith("note: refused the board resource 'hosta/g\\x1b]0;owned") and "cannot name a place" in note
    assert not any(call[0] == "AddPlace" for call in script.calls)


def test_a_reservation_naming_another_place_takes_only_the_place_asked(started: list) -> None:
    # Holds without a change: the client acquires the place it asked for by name and runs on
    # that place's checked board; an allocation the coordinator names is never followed.
    updates = [*_board("hosta"), *_board("hostb")]
    script = Script(updates=updates, reservation=pb.Reservation(token="t", state=1, allocations={"main": "hostb-g"}))
    with rogue_coordinator(script) as address:
        done = run("fleet", "info", "--hosts", "hosta", "--where", "name=hosta-g", "--format", "json",
                   "--coordinator", address)
    (row,) = json.loads(done.out)["boards"]
    assert row["board"] == "hosta-g" and row["host"] == "hosta"
    assert [c for c in script.calls if c[0] in ("AcquirePlace", "ReleasePlace")] == [
        ("AcquirePlace", "hosta-g"), ("ReleasePlace", "hosta-g")]
    assert started and {argv[argv.index("--") + 1] for argv in started} == {"hosta"}
    assert "hostb" not in done.out
