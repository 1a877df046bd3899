"""`amdflash report --format html`: the page is parsed back, as a reviewer's browser would."""
from __future__ import annotations

import hashlib
import re
import sqlite3
from html.parser import HTMLParser
from pathlib import Path

import pytest

from amdflash.store.html import decode_write, render
from amdflash.store.queries import open_readonly, report
from amdflash.store.run_rows import RunUnverified
from tests.store.conftest import (ERASED_BLOCK, PROGRAM_UNIT, PROTECTED_UNIT, STUCK_UNIT, STUCK_WORK, UNIT, Recorded, amdflash,
                                   board_config)

FLASH = 0x200000


class Page(HTMLParser):
    """What a test needs from the report: map cells, data fields, register-write rows, tags."""

    def __init__(self, text: str):
        super().__init__()
        self.cells: dict[int, tuple[set[str], str]] = {}    # address -> (classes, title)
        self.fields: dict[str, str] = {}
        self.field_attrs: dict[str, dict[str, str]] = {}
        self.writes: list[list[str]] = []
        self.stages: dict[str, list[str]] = {}
        self.failed_verifies: list[list[str]] = []
        self.tags: list[str] = []
        self.attributes: list[tuple[str, str]] = []
        self._open: list[tuple[str, str | None, list[str] | None]] = []   # (tag, field, row)
        self._row: list[str] | None = None
        self._cell_text: list[str] | None = None
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.tags.append(tag)
        self.attributes += list(a.items())
        if "data-address" in a:
            self.cells[int(a["data-address"], 16)] = (set(a["class"].split()), a.get("title", ""))
        if "data-field" in a:
            self.field_attrs[a["data-field"]] = a
            self._field, self._text = a["data-field"], []
        if tag == "tr" and ("data-n" in a or "data-stage" in a or "failed-verify" in a.get("class", "")):
            self._row = []
            self._row_kind = "write" if "data-n" in a else "stage" if "data-stage" in a else "verify"
            self._stage = a.get("data-stage")
        if tag in ("td", "th") and self._row is not None:
            self._cell_text = []

    def handle_endtag(self, tag: str) -> None:
        if getattr(self, "_field", None) and tag in ("td", "p", "span"):
            self.fields.setdefault(self._field, "".join(self._text))
            self._field = None
        if tag in ("td", "th") and self._row is not None and self._cell_text is not None:
            self._row.append("".join(self._cell_text).strip())
            self._cell_text = None
        if tag == "tr" and self._row is not None:
            if self._row_kind == "write":
                self.writes.append(self._row)
            elif self._row_kind == "stage":
                self.stages[self._stage] = self._row
            else:
                self.failed_verifies.append(self._row)
            self._row = None

    def handle_data(self, data: str) -> None:
        if getattr(self, "_field", None):
            self._text.append(data)
        if self._cell_text is not None:
            self._cell_text.append(data)

    def category(self, address: int) -> str:
        classes = self.cells[address][0] - {"cell"}
        return " ".join(sorted(classes))


def html_of(recorded: Recorded, scenario: str, path: Path | None = None) -> str:
    db = open_readonly(str(path or recorded.db))
    try:
        return render(db, report(db, recorded.runs[scenario]))
    finally:
        db.conn.close()


@pytest.fixture(scope="module")
def pages(recorded: Recorded) -> dict[str, tuple[str, Page]]:
    out = {}
    for scenario in ("clean", "stuck", "protected"):
        text = html_of(recorded, scenario)
        out[scenario] = (text, Page(text))
    return out


def test_cli_writes_one_html_file(recorded: Recorded, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    assert amdflash(recorded.db, "report", recorded.runs["clean"], "--format", "html", "-o", out) == 0
    page = Page(out.read_text())
    assert page.fields["run_id"] == recorded.runs["clean"]
    assert len(page.cells) == 512


def test_identity_fields(recorded: Recorded, pages) -> None:  # noqa: ANN001
    _, page = pages["clean"]
    config = board_config(recorded.boards["clean"])
    f = page.fields
    assert f["run_id"] == recorded.runs["clean"] and f["command"] == "flash" and f["status"] == "succeeded"
    assert f["board_spec"] == f"sim:{recorded.boards['clean'].resolve()}"
    assert f["jedec"].startswith("c86015") and f["chip"] == "GigaDevice GD25LQ16E"
    assert f["unique_id"] == config["unique_id"] and f["bridge_serial"] == config["serial"]
    assert f["image_path"] == str(recorded.image.resolve())
    assert f["image_sha256"] == f["result_sha256"] == hashlib.sha256(recorded.image_bytes).hexdigest()
    assert f["operator"] and f["host"] and f["tool_version"] == "0.1.0"
    assert f["started"] < f["ended"] and f["resumes_run_id"] == "—"
    assert f["status_registers"] == "SR1=00 SR2=40 SR3=00"
    assert "CMP=1" in f["protection"] and "CMP cleared by this run" in f["protection_effective"]
    assert page.field_attrs["status-badge"]["class"].split() == ["badge", "ok"]


def test_sector_map_of_a_known_run(pages) -> None:  # noqa: ANN001
    _, page = pages["clean"]
    assert sorted(page.cells) == list(range(0, FLASH, UNIT))       # exactly 512 cells, one per unit
    want = {a: "skip" for a in range(0, FLASH, UNIT)}
    want.update({a: "erase" for a in range(ERASED_BLOCK, ERASED_BLOCK + 0x10000, UNIT)})
    want[PROGRAM_UNIT] = "program"
    assert {a: page.category(a) for a in page.cells} == want
    classes, title = page.cells[ERASED_BLOCK]
    assert title.startswith(f"{ERASED_BLOCK:#08x}") and "erase+program" in title and "verified" in title
    assert "already equal" in page.cells[0][1]


def test_legend_names_every_category_with_its_count(pages) -> None:  # noqa: ANN001
    text, _ = pages["clean"]
    legend = text.split('<ul class="legend">', 1)[1].split("</ul>", 1)[0]
    items = [li.split("</span>", 1)[1] for li in legend.split("<li>")[1:]]
    assert items == ["skipped — already equal <b>495</b></li>",
                     "written by an earlier run of this flash, found equal <b>0</b></li>",
                     "programmed without erase, verified <b>1</b></li>",
                     "erased + programmed, verified <b>16</b></li>",
                     "hatched: touched (erased or programmed), not verified <b>0</b></li>",
                     "verify failed <b>0</b></li>", "planned (its action decided), never touched <b>0</b></li>",
                     "in the run&#x27;s range, never planned (the run stopped first) <b>0</b></li>",
                     "protected (block protection) <b>0</b></li>",
                     "outside the run&#x27;s range <b>0</b></li>"]


def test_failed_cell_and_verify_rows_of_a_stuck_bit_run(recorded: Recorded, pages) -> None:  # noqa: ANN001
    _, page = pages["stuck"]
    assert page.category(STUCK_UNIT) == "failed"
    assert f"{recorded.stuck_address:#08x}" in page.cells[STUCK_UNIT][1]
    assert all(page.category(a) == "skip" for a in range(0, STUCK_UNIT, UNIT))
    # After the failure: the stages had more work queued (the board differs from the image from
    # STUCK_WORK on). What was erased but never verified is hatched, what was only planned is
    # "planned, never touched", and what the planner never got to — read into the backup, like
    # every unit, before the first erase — is "in the run's range, not reached": never "outside".
    after = [page.category(a) for a in range(STUCK_WORK, FLASH, UNIT)]
    assert set(after) <= {"erase unverified", "planned", "unreached"} and "planned" in after
    assert after[-1] == "unreached" and "never got to it" in page.cells[FLASH - UNIT][1]
    assert after == sorted(after, key=["erase unverified", "planned", "unreached"].index)   # in that order
    assert all(page.category(a) == "skip" for a in range(STUCK_UNIT + UNIT, STUCK_WORK, UNIT))
    planned = next(a for a in range(STUCK_WORK, FLASH, UNIT) if page.category(a) == "planned")
    assert "never touched" in page.cells[planned][1]
    want = [f"{recorded.stuck_address:#08x}", f"0x{recorded.image_bytes[recorded.stuck_address] | 1:02x}",
            f"0x{recorded.image_bytes[recorded.stuck_address]:02x}"]
    assert page.failed_verifies == [
        [f"{STUCK_UNIT:#08x}", str(attempt), *want] for attempt in (1, 2, 3)]
    assert page.fields["verify-counts"].endswith("3 failed.")
    assert page.fields["status-badge"] == "failed"


def test_the_failing_units_last_attempt(recorded: Recorded, pages) -> None:  # noqa: ANN001
    """Not the last writes before the first mismatch, but the whole last retry of the unit that
    failed: its erase, its page programs and the read-back that found the stuck bit."""
    _, page = pages["stuck"]
    con = sqlite3.connect(recorded.db)
    run = recorded.runs["stuck"]
    first_bad = con.execute("SELECT min(seq) FROM verifies WHERE run_id = ? AND ok = 0", [run]).fetchone()[0]
    failed = con.execute("SELECT seq FROM units WHERE run_id = ? AND state = 'failed'", [run]).fetchone()[0]
    retry = con.execute("SELECT seq, detail FROM units WHERE run_id = ? AND state = 'intent' AND address = ? "
                        "ORDER BY seq DESC LIMIT 1", [run, STUCK_UNIT]).fetchone()
    expected = con.execute("SELECT n, opcode, address FROM spi_transactions WHERE run_id = ? AND seq > ? AND seq < ? "
                           "ORDER BY seq, n", [run, retry[0], failed]).fetchall()
    con.close()
    assert retry[1].startswith("retry 2:")
    assert page.field_attrs["first-error"]["data-seq"] == str(first_bad)
    assert f"unit {STUCK_UNIT:#08x}" in page.fields["first-error"]
    assert f"{recorded.stuck_address:#08x}" in page.fields["first-error"]
    assert page.fields["attempt"].startswith(f"The last retry of unit {STUCK_UNIT:#08x}")
    rows = [(int(r[0]), r[3], r[4]) for r in page.writes]
    assert rows == [(n, r[3], r[4]) for (n, _, _), r in zip(expected, page.writes)] and len(rows) == len(expected)
    ops = [r[1] for r in rows]
    erase = ops.index("20h SE 4K")
    assert ops[0] == "06h WREN" and rows[erase][2] == f"{STUCK_UNIT:#08x}" and erase < ops.index("02h PP")
    programs = [int(a, 16) for _, op, a in rows if op == "02h PP"]
    assert programs and all(STUCK_UNIT <= a < STUCK_UNIT + UNIT for a in programs)
    # The read-back, every chunk of the unit — the one with the stuck bit read again (a mismatch
    # never confirms itself); chained reads end with the read of the chunk after the one read
    # last, whose transaction brings the last chunk's capture in.
    last_program = max(i for i, op in enumerate(ops) if op == "02h PP")
    assert "03h READ" not in ops[:last_program]
    reads = [int(a, 16) for _, op, a in rows[last_program:] if op == "03h READ"]
    chunks = range(STUCK_UNIT, STUCK_UNIT + UNIT, 0x100)
    assert all(reads.count(a) >= 1 for a in chunks) and reads.count(recorded.stuck_address & ~0xFF) >= 2
    assert set(reads) <= {*chunks, STUCK_UNIT + UNIT}


def test_a_clean_run_has_no_error_section_rows(pages) -> None:  # noqa: ANN001
    text, page = pages["clean"]
    assert "no error recorded" in text and not page.writes


def test_stage_timeline(pages) -> None:  # noqa: ANN001
    _, clean = pages["clean"]
    for name in ("open_transport", "identify", "clear_cmp", "backup", "plan", "erase", "program", "verify", "restore"):
        assert clean.stages[name][4] == "ended", name
    _, stuck = pages["stuck"]
    assert stuck.stages["verify"][4] == "failed" and stuck.stages["restore"][4] == "ended"
    # The backup is complete before the first erase: it ended. The stages still running when
    # verify failed (they had work queued up to the end of the flash) were stopped by it, and
    # their outcome says so.
    assert stuck.stages["backup"][4] == "ended"
    assert {stuck.stages[s][4] for s in ("plan", "erase", "program")} == {"cancelled"}


def test_protected_units_and_units_outside_the_run(pages) -> None:  # noqa: ANN001
    text, page = pages["protected"]
    want = {a: "none" for a in range(0, FLASH, UNIT)}
    want.update({a: "skip" for a in range(0, 0x10000, UNIT)})
    want[PROTECTED_UNIT] = "erase"
    want.update({a: "protected" for a in range(FLASH - 0x10000, FLASH, UNIT)})
    assert {a: page.category(a) for a in page.cells} == want
    assert "BP=1" in page.fields["protection_effective"]


def test_recorded_text_is_escaped(recorded: Recorded, pages) -> None:  # noqa: ANN001
    text, page = pages["protected"]
    assert page.fields["image_path"].endswith('img <b>&"q".bin')
    assert "<b>&" not in text and "img &lt;b&gt;&amp;&quot;q&quot;.bin" in text
    assert page.tags.count("html") == 1


def test_chain_status_intact_and_broken(recorded: Recorded, pages, tmp_path: Path) -> None:  # noqa: ANN001
    _, page = pages["clean"]
    assert page.field_attrs["chain"]["data-ok"] == "true" and page.fields["chain"].startswith("intact")
    con = sqlite3.connect(recorded.db)
    head, digest = con.execute("SELECT head, hash FROM checkpoints WHERE run_id = ? ORDER BY id DESC LIMIT 1",
                               [recorded.runs["clean"]]).fetchone()
    con.close()
    assert page.fields["chain_head"] == head.hex() and page.fields["checkpoint_hash"] == digest.hex()
    assert "final checkpoint" in page.fields["checkpoint"] and page.fields["signed_by"].startswith("SHA256:")
    assert "not checked against a trusted key" in page.fields["signature"]
    copy = tmp_path / "tampered.sqlite"
    src = sqlite3.connect(recorded.db)
    dst = sqlite3.connect(copy)
    src.backup(dst)
    src.close()
    seq = dst.execute("SELECT seq FROM log_spi WHERE run = (SELECT seq FROM runs WHERE run_id = ?) "
                      "ORDER BY seq LIMIT 1 OFFSET 50", [recorded.runs["clean"]]).fetchone()[0]
    dst.execute("DROP TRIGGER log_spi_no_update")
    dst.execute("UPDATE log_spi SET command = 0 WHERE seq = ?", [seq])
    dst.execute("CREATE TRIGGER log_spi_no_update BEFORE UPDATE ON log_spi "
                "BEGIN SELECT RAISE(ABORT, 'audit rows are append-only (log_spi)'); END")
    dst.commit()
    dst.close()
    # A tampered copy of the database: no page is made of a run that does not verify; the
    # refusal says where.
    db = open_readonly(str(copy))
    try:
        with pytest.raises(RunUnverified, match="do not match checkpoint"):
            report(db, recorded.runs["clean"])
    finally:
        db.conn.close()
    out = tmp_path / "broken.html"
    assert amdflash(copy, "report", recorded.runs["clean"], "--format", "html", "-o", out) == 1
    assert not out.exists()


def test_a_trusted_key_is_checked_when_given(recorded: Recorded, tmp_path: Path) -> None:
    from amdflash.pipeline.engine.auditdb import host_key_path
    from amdflash.store import keys

    good = tmp_path / "host.pub"
    good.write_text(keys.public_line(keys.public_bytes(keys.load_private(host_key_path()))))
    other = tmp_path / "other.pub"
    other.write_text(keys.public_line(bytes(range(32))))
    db = open_readonly(str(recorded.db))
    try:
        ok = Page(render(db, report(db, recorded.runs["clean"], [good])))
        with pytest.raises(RunUnverified, match="not a given --key"):
            report(db, recorded.runs["clean"], [other])
    finally:
        db.conn.close()
    assert ok.fields["signature"] == "verified against the given key"


def test_emulated_badge_and_facts(recorded: Recorded, pages) -> None:  # noqa: ANN001
    import os
    import pwd

    _, page = pages["clean"]
    assert page.fields["emulated-badge"] == "emulated board"
    assert page.fields["emulated"].startswith("emulated")
    assert page.fields["operator"] == pwd.getpwuid(os.getuid()).pw_name
    assert page.fields["clock_sync"] and page.fields["host"]
    assert "emulated yes" in page.fields["board_detail"]      # the transport detail, in words


def test_print_stylesheet(pages) -> None:  # noqa: ANN001
    text, _ = pages["clean"]
    style = text.split("<style>", 1)[1].split("</style>", 1)[0]
    assert "@media print" in style and "print-color-adjust: exact" in style and "break-inside: avoid" in style


@pytest.mark.parametrize("scenario", ["clean", "stuck", "protected"])
def test_self_contained(pages, scenario: str) -> None:  # noqa: ANN001
    text, page = pages[scenario]
    lowered = text.lower()
    for needle in ("http", "src=", "@import", "url(", "<script", "<link", "<img", "<iframe"):
        assert needle not in lowered, needle
    assert not {name for name, _ in page.attributes} & {"src", "srcset", "action"}
    # The only links are to other runs' reports, by their file names: nothing is fetched.
    assert all(re.fullmatch(r"[0-9T]+-[0-9a-f]{8}\.html", v) for k, v in page.attributes if k == "href")
    assert page.tags.count("style") == 1


def test_decode_write_names_registers_and_wire_bytes() -> None:
    assert decode_write(0x5A3A8, 0x02123402, None) == ("ROM_SW_COMMAND", "0x02123402",
                                                       "opcode 02h PP, address field 0x021234")
    assert decode_write(0x5A3A0, 0x00030100, None)[2] == "start transaction: 3 address bytes, send 256 bytes"
    assert decode_write(0x5A3A0, 0x00080001, None)[2] == "start transaction: 0 address bytes, receive 1 bytes"
    name, written, meaning = decode_write(0x5A3B0, None, bytes((4, 3, 2, 1, 8, 7, 6, 5)))
    assert (name, written, meaning) == ("ROM_SW_DATA_1", "8 bytes", "TX data on the wire: 01 02 03 04 05 06 07 08")
    assert decode_write(0x5A3B4, 0, None)[0] == "ROM_SW_DATA_2"
    assert decode_write(0x12340, 5, None) == ("0x12340", "0x00000005", "")


def test_a_run_whose_host_died(recorded: Recorded) -> None:
    text = html_of(recorded, "clean", path=recorded.killed_db)
    page = Page(text)
    assert page.fields["status-badge"] == "running" and page.fields["ended"] == "—"
    assert "recorded no end" in page.fields["first-error"] and not page.writes
    assert page.stages["verify"][2:5] == ["—", "—", "no end recorded"]
    assert "stages without an end run off its right edge" in text
    assert page.field_attrs["chain"]["data-ok"] == "true"
    assert "the run recorded no end" in page.fields["checkpoint"]
    # The rows after its last checkpoint are shown as what they are: not verified.
    assert re.fullmatch(r"the run's last \d+ row\(s\): no checkpoint seals them .* not verified",
                        page.fields["unsealed_rows"])
    # Power was lost while the 64 KiB block was being programmed: 3 units verified, the 4th programmed.
    block = [page.category(ERASED_BLOCK + i * UNIT) for i in range(16)]
    assert block[:3] == ["erase"] * 3 and block[3] == "erase unverified"
    assert "programmed" in page.cells[ERASED_BLOCK + 3 * UNIT][1]
    assert set(block[4:]) == {"erase unverified"}                 # erased, not yet programmed
    # Every unit was read into the backup before the first erase; the planner, which needs no
    # board, runs ahead of the writes: a unit it had found equal by the power loss is "already
    # equal" (verified by the confirmed read), one it had not got to is "not reached" — in the
    # run's range either way, never "outside".
    con = sqlite3.connect(recorded.killed_db)
    run = recorded.runs["clean"]
    backed_up = {a for (a,) in con.execute("SELECT address FROM backup_units WHERE run_id = ?", [run])}
    states = dict(con.execute("SELECT address, state FROM units WHERE run_id = ? ORDER BY seq", [run]).fetchall())
    con.close()
    assert backed_up == set(range(0, FLASH, UNIT)) and "none" not in {page.category(a) for a in page.cells}
    for a in range(ERASED_BLOCK + 0x10000, FLASH, UNIT):
        if a in states:
            assert states[a] == "verified" and page.category(a) == "skip" and "already equal" in page.cells[a][1]
        else:
            assert page.category(a) == "unreached" and "never got to it" in page.cells[a][1]
    legend = text.split('<ul class="legend">', 1)[1].split("</ul>", 1)[0]
    assert "erased + programmed, verified <b>3</b>" in legend and "not verified <b>13</b>" in legend


@pytest.mark.slow
def test_an_interrupted_run_and_the_resume_that_finished_it(tmp_path: Path) -> None:
    """Stopped with Ctrl-C mid-flash: its own stages say which stopped early; units only planned
    are not drawn as touched; the run links to the resume that finished it, and back."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from amdflash.stages.sim import command_log, create_board
    from tests.pipeline.engine.conftest import ROOT

    image = bytearray(os.urandom(0x200000))
    image[:4] = b"\xaa\x55\xaa\x55"
    (tmp_path / "dense.bin").write_bytes(image)
    board = create_board(tmp_path / "board", content=os.urandom(0x200000), transport="ideal", seed=4)
    db = tmp_path / "audit.sqlite"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AMDFLASH_DB": str(db), "AMDFLASH_LOCK_DIR": str(tmp_path / "l")}
    proc = subprocess.Popen([sys.executable, "-m", "amdflash.pipeline.cli", "-q", "flash", str(tmp_path / "dense.bin"),
                             "--yes", "--force", "--sector-count", "128", "--board", f"sim:{board}"], env=env,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while len(command_log.read(board)) < 200:        # a few 64 KiB blocks are under way
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == 130, proc.stderr.read()
    assert amdflash(db, "resume", "--yes", "--board", f"sim:{board}") == 0
    store = open_readonly(str(db))
    try:
        stopped, resume = [r["run_id"] for r in store.query("SELECT run_id FROM runs ORDER BY seq")]
        interrupted = Page(render(store, report(store, stopped)))
        finishing = Page(render(store, report(store, resume)))
    finally:
        store.conn.close()
    assert interrupted.fields["status-badge"] == "interrupted"
    # The backup was complete before the first erase; the erase stage stopped taking work.
    assert interrupted.stages["erase"][4] == "stopped early" and interrupted.stages["backup"][4] == "ended"
    assert interrupted.stages["restore"][4] == "ended"
    # Verified where it got to; planned, but stopped before any write, next; beyond what the
    # planner had got to (if it had not reached the end of the run's range, 128 units), "not
    # reached"; outside the range, "outside".
    order = ["erase", "planned", "unreached"]
    in_range = [interrupted.category(a) for a in range(0, 128 * UNIT, UNIT)]
    assert set(in_range) - {"unreached"} == {"erase", "planned"} and in_range == sorted(in_range, key=order.index)
    assert {interrupted.category(a) for a in interrupted.cells if a >= 128 * UNIT} == {"none"}
    planned = next(a for a in interrupted.cells if interrupted.category(a) == "planned")
    assert "never touched" in interrupted.cells[planned][1]
    assert interrupted.fields["finished_by"] == resume and interrupted.fields["resumed_by"].startswith(resume)
    assert finishing.fields["resumes_run_id"] == stopped
    assert ("href", f"{resume}.html") in interrupted.attributes and ("href", f"{stopped}.html") in finishing.attributes
