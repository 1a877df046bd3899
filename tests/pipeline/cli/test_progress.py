"""Progress per board: every active stage in bytes with rate and ETA, and a final state."""
from __future__ import annotations

import json

import pytest
from amdflash.pipeline.engine.progress import ProgressBoard
from amdflash.pipeline.logsetup import configure
from rich.console import Console


@pytest.mark.slow
def test_a_failing_flash_ends_failed_at_its_address(amdflash, make_board, image):
    img = image.read_bytes()
    address = next(a for a in range(0x2000, 0x200000) if img[a] & 0x01 == 0)
    board = make_board(content="blank", transport="ideal", faults=[f"stuck-bit={address:#x}:0"])
    r = amdflash("flash", image, "--yes", "--expect-part", "SYNTH-0001", "--board", f"sim:{board}")       # stderr is no terminal: lines
    assert r.code == 1
    last = [line for line in r.err_lines if line.startswith(f"sim:{board}: ")][-1]
    for stage in ("backup", "erase", "program", "verify"):
        assert f"{stage} " in last and "MiB" in last
    assert last.endswith(f"failed at {address - address % 0x1000:#08x}") or last.endswith(f"failed at {address:#08x}")


def test_json_progress_is_numeric_per_stage_and_never_goes_backwards(amdflash, make_board, image):
    board = make_board(content="blank", transport="ideal")
    r = amdflash("--log-json", "flash", image, "--yes", "--expect-part", "SYNTH-0001", "--board", f"sim:{board}")
    assert r.code == 0
    events = [json.loads(line) for line in r.err_lines]
    seen: dict[str, int] = {}
    for e in (e for e in events if e["event"] == "progress" and "stage" in e):
        assert e["unit"] == "bytes" and e["total"] == 0x200000
        assert e["done"] >= seen.get(e["stage"], 0), e     # never backwards
        seen[e["stage"]] = e["done"]
    assert seen == {"backup": 0x200000, "erase": 0x200000, "program": 0x200000, "verify": 0x200000}
    final = [e for e in events if e["event"] == "progress" and "state" in e]
    assert [e["state"] for e in final] == ["done"] and final[0]["seconds"] >= 0


@pytest.mark.slow
def test_no_progress_and_quiet_show_none(amdflash, make_board, image):
    board = make_board(content="blank", transport="ideal")
    r = amdflash("--log-json", "flash", image, "--yes", "--expect-part", "SYNTH-0001", "--board", f"sim:{board}", "--no-progress")
    assert not [line for line in r.err_lines if json.loads(line)["event"] == "progress"]


def test_the_terminal_table_has_a_column_per_stage_with_bytes_rate_and_eta(monkeypatch):
    from amdflash.store.writer.recorder import NullWriter, Recorder

    configure()
    monkeypatch.setattr("sys.stderr.isatty", lambda: True, raising=False)
    ui = ProgressBoard(enabled=True)
    assert ui.mode == "live"
    clock = iter(float(t) for t in range(100))
    monkeypatch.setattr("amdflash.pipeline.engine.progress.time.monotonic", lambda: next(clock))
    for board in ("sim:/a", "sim:/b", "sim:/c"):
        ui.observe(Recorder(NullWriter(), "run"), board, "run")
    a, b, c = (ui.reporter(board, "run") for board in ("sim:/a", "sim:/b", "sim:/c"))
    for done in (64, 128, 256):
        a("backup", done, 512)
        a("erase", done // 2, 512)
    b("verify", 512, 512)
    ui.boards["sim:/b"].observe("run_status", {"status": "succeeded"})
    c("backup", 10, 512)
    ui.boards["sim:/c"].observe("errors", {"address": 0x1F000})
    ui.boards["sim:/c"].observe("run_status", {"status": "failed"})
    console = Console(record=True, width=200)
    console.print(ui._render())
    text = console.export_text()
    assert text.splitlines()[0].split() == ["board", "backup", "erase", "verify", "state"]
    row_a = "\n".join(line for line in text.splitlines())
    assert "1.00 MiB/2.00 MiB" in row_a and "512 KiB/2.00 MiB" in row_a         # backup and erase of board a
    assert "KiB/s ETA 0:" in text                                               # rate and ETA while running
    assert "failed at 0x01f000" in text and "done" in text and "running" in text


def test_json_progress_tells_a_live_view_a_stage_s_rate_and_eta_before_it_ends(monkeypatch, capsys):
    """A fleet's live view draws --log-json events: a stage of a few seconds must show its rate
    and ETA while it runs, not only its end (issue 27 item 9: rate and ETA were mostly blank)."""
    from amdflash.store.writer.recorder import NullWriter, Recorder

    configure(json_lines=True)
    ui = ProgressBoard(enabled=True)
    assert ui.mode == "json"
    ui.observe(Recorder(NullWriter(), "run"), "sim:/a", "run")   # the run starts now
    start = ui.boards["sim:/a"].started
    now = [start]
    monkeypatch.setattr("amdflash.pipeline.engine.progress.time.monotonic", lambda: now[0])
    report = ui.reporter("sim:/a", "run")
    for tick in range(1, 9):              # a 4-second program stage, reported every half second
        now[0] = start + tick / 2
        report("program", tick * 64, 512)      # units of 4 KiB: 2 MiB in all
    events = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    during = [e for e in events if e.get("event") == "progress" and e.get("done", 0) < e.get("total", 0)]
    assert during and all(e["rate"] > 0 and e["eta"] > 0 for e in during), events
