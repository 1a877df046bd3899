"""`amdflash report --format html`: the page is parsed back, as a reviewer's browser would."""
from __future__ import annotations

import hashlib
import sqlite3
from html.parser import HTMLParser
from pathlib import Path

import pytest

from amdflash.store import chain
from amdflash.store.html import decode_write, render
from amdflash.store.queries import open_readonly, report
from tests.review.conftest import (ERASED_BLOCK, PROGRAM_UNIT, PROTECTED_UNIT, STUCK_UNIT, UNIT, Recorded, amdflash,
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


def html_of(recorded: Recorded, scenario: str, chain_report: chain.ChainReport | None = None,
            path: Path | None = None) -> str:
    db = open_readonly(str(path or recorded.db))
    try:
        rep = report(db, recorded.runs[scenario])
        return render(db, rep, chain_report or chain.verify(db.conn))
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
    assert items == ["skipped — already equal <b>495</b></li>", "programmed without erase, verified <b>1</b></li>",
                     "erased + programmed, verified <b>16</b></li>",
                     "hatched: planned or written, not verified <b>0</b></li>",
                     "verify failed <b>0</b></li>", "protected (block protection) <b>0</b></li>",
                     "not part of the run <b>0</b></li>"]


def test_failed_cell_and_verify_rows_of_a_stuck_bit_run(recorded: Recorded, pages) -> None:  # noqa: ANN001
    _, page = pages["stuck"]
    assert page.category(STUCK_UNIT) == "failed"
    assert f"{recorded.stuck_address:#08x}" in page.cells[STUCK_UNIT][1]
    assert all(page.category(a) == "skip" for a in range(0, STUCK_UNIT, UNIT))
    # The whole backup is read before the first erase: the last unit was planned (already equal) before the failure.
    assert page.category(FLASH - UNIT) == "skip"
    want = [f"{recorded.stuck_address:#08x}", f"0x{recorded.image_bytes[recorded.stuck_address] | 1:02x}",
            f"0x{recorded.image_bytes[recorded.stuck_address]:02x}"]
    assert page.failed_verifies == [
        [f"{STUCK_UNIT:#08x}", str(attempt), *want] for attempt in (1, 2, 3)]
    assert page.fields["verify-counts"].endswith("3 failed.")
    assert page.fields["status-badge"] == "failed"


def test_register_writes_before_the_first_error(recorded: Recorded, pages) -> None:  # noqa: ANN001
    _, page = pages["stuck"]
    con = sqlite3.connect(recorded.db)
    run = recorded.runs["stuck"]
    first_bad = con.execute("SELECT min(seq) FROM verifies WHERE run_id = ? AND ok = 0", [run]).fetchone()[0]
    expected = con.execute("SELECT n, seq FROM register_writes WHERE run_id = ? AND seq < ? ORDER BY seq DESC "
                           "LIMIT 32", [run, first_bad]).fetchall()[::-1]
    con.close()
    assert page.field_attrs["first-error"]["data-seq"] == str(first_bad)
    assert f"unit {STUCK_UNIT:#08x}" in page.fields["first-error"]
    assert f"{recorded.stuck_address:#08x}" in page.fields["first-error"]
    assert [(int(r[0]), int(r[1])) for r in page.writes] == expected and len(expected) == 32
    names = {r[4] for r in page.writes}
    assert {"ROM_SW_COMMAND", "ROM_SW_CNTL", "ROM_SW_STATUS"} <= names
    # The read-back that found the mismatch: READs of the unit's last pages (a chained read
    # ends with the read of the chunk after the unit, which brings the last one in).
    commands = [r for r in page.writes if r[4] == "ROM_SW_COMMAND"]
    assert all("03h READ" in r[6] for r in commands)
    assert commands[-2][6].endswith(f"{STUCK_UNIT + UNIT - 0x100:#08x}")
    assert commands[-1][6].endswith(f"{STUCK_UNIT + UNIT:#08x}")


def test_a_clean_run_has_no_error_section_rows(pages) -> None:  # noqa: ANN001
    text, page = pages["clean"]
    assert "no error recorded" in text and not page.writes


def test_stage_timeline(pages) -> None:  # noqa: ANN001
    _, clean = pages["clean"]
    for name in ("open_transport", "identify", "clear_cmp", "backup", "plan", "erase", "program", "verify", "restore"):
        assert clean.stages[name][4] == "ended", name
    _, stuck = pages["stuck"]
    assert stuck.stages["verify"][4] == "failed" and stuck.stages["restore"][4] == "ended"


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
    assert page.field_attrs["chain"]["data-ok"] == "true" and page.fields["chain"].startswith("audit chain intact")
    # A tampered copy of the database: the page must say the chain is broken, and where.
    copy = tmp_path / "tampered.sqlite"
    src = sqlite3.connect(recorded.db)
    dst = sqlite3.connect(copy)
    src.backup(dst)
    src.close()
    seq = dst.execute("SELECT seq FROM register_writes ORDER BY seq LIMIT 1 OFFSET 50").fetchone()[0]
    dst.execute("DROP TRIGGER register_writes_no_update")
    dst.execute("UPDATE register_writes SET value = 0 WHERE seq = ?", [seq])
    dst.commit()
    dst.close()
    db = open_readonly(str(copy))
    broken = Page(render(db, report(db, recorded.runs["clean"]), chain.verify(db.conn)))
    db.conn.close()
    assert broken.field_attrs["chain"]["data-ok"] == "false"
    assert "BROKEN" in broken.fields["chain"] and f"register_writes seq {seq}" in broken.fields["chain"]


@pytest.mark.parametrize("scenario", ["clean", "stuck", "protected"])
def test_self_contained(pages, scenario: str) -> None:  # noqa: ANN001
    text, page = pages[scenario]
    lowered = text.lower()
    for needle in ("http", "src=", "@import", "url(", "<script", "<link", "<img", "<iframe"):
        assert needle not in lowered, needle
    assert not {name for name, _ in page.attributes} & {"src", "href", "srcset", "action"}
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
    # Power was lost while the 64 KiB block was being programmed: 3 units verified, the 4th programmed.
    block = [page.category(ERASED_BLOCK + i * UNIT) for i in range(16)]
    assert block[:3] == ["erase"] * 3 and block[3] == "erase unverified"
    assert "programmed" in page.cells[ERASED_BLOCK + 3 * UNIT][1]
    assert set(block[4:]) == {"erase unverified"}                 # erased, not yet programmed
    assert page.category(FLASH - UNIT) == "skip"                  # the backup was complete before the first erase
    legend = text.split('<ul class="legend">', 1)[1].split("</ul>", 1)[0]
    assert "erased + programmed, verified <b>3</b>" in legend and "not verified <b>13</b>" in legend
