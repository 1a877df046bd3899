"""Confirmation by expectation: a read that returns exactly what it should confirms itself —
when that content is not something a fault produces as well, and the read provably came from
the chip — and everything else is still confirmed by agreeing reads.

The emulator's faults that would break this if it were done carelessly — an RX transaction
that silently does not run (the window keeps its old content), a done bit left over, a unit
that reads as all 0xFF while the chip is busy, read flips on units equal to the image — each
have a test here that amdflash keeps no wrong byte (and cells in test_faults_matrix).
"""
from __future__ import annotations

import json
import random
import struct
from collections import Counter
from pathlib import Path

import pytest

from amdflash.stages.confirm import Expectation, Noise, confirm_expected, patterned
from amdflash.stages.drivers.flash.spinor import SpiNor
from amdflash.stages.drivers.navi31 import regs as R
from amdflash.stages.drivers.navi31.romsw import RomSw, RomSwOptions
from amdflash.stages.sim import Board, SimBar5
from amdflash.stages.sim.state import F_STALE_DRAWS
from amdflash.stages.sim.synth import synthetic_ifwi
from tests.pipeline.engine.test_confirmed_reads import as_read, rows

MiB2, UNIT, CHUNK = 0x200000, 0x1000, 0x100


def spi_transactions(board: Path) -> int:
    with Board(board) as b:
        return int(b.stats()["spi_transactions"])


def random_image(seed: int = 3) -> bytes:
    img = bytearray(random.Random(seed).randbytes(MiB2))
    img[:4] = b"\xaa\x55\xaa\x55"
    return bytes(img)


def confirmed_rows(db: Path, run_id: str) -> list[dict]:
    return [json.loads(d) for (d,) in rows(db, "SELECT detail FROM stages WHERE run_id = ? AND stage = 'reads' "
                                               "AND event = 'confirmed' ORDER BY seq", run_id)]


def last_run_id(db: Path) -> str:
    return rows(db, "SELECT run_id FROM runs ORDER BY seq DESC LIMIT 1")[0][0]


# -- what may confirm itself ---------------------------------------------------------------------

def test_patterned_content_is_what_faults_produce_too():
    rng = random.Random(5)
    assert patterned(b"\xff" * 256) and patterned(bytes(256)) and patterned(b"\x55" * 256)
    assert patterned(b"\x12\x34" * 128) and patterned(rng.randbytes(16) * 16)
    assert patterned(rng.randbytes(128) * 2)                     # a period of 128: still a pattern
    tail = rng.randbytes(129)
    assert not patterned((tail * 2)[:256])                        # 129: longer than any pattern counted
    assert not patterned(rng.randbytes(256))
    almost = bytearray(b"\xff" * 256)
    almost[200] = 0xFE
    assert not patterned(bytes(almost))                           # one programmed bit is content


def test_expected_content_found_elsewhere_in_the_image_does_not_confirm_itself():
    rng = random.Random(6)
    image = bytearray(rng.randbytes(0x4000))
    image[0x2000:0x2100] = image[0x0100:0x0200]                   # a duplicated chunk (mirrored tables)
    image[0x3000:0x3100] = b"\xff" * 0x100
    e = Expectation(bytes(image))
    assert e.confirming(0x0000, CHUNK) and e.confirming(0x1000, CHUNK)
    assert not e.confirming(0x0100, CHUNK) and not e.confirming(0x2000, CHUNK)
    assert not e.confirming(0x3000, CHUNK)
    assert not e.confirming(0x0000, 0x80)                         # only whole chunks
    assert e.confirming_count(0x0000, 0x1000) == 15


# -- the policy, on its own ----------------------------------------------------------------------

def reader(truth: bytes, proven: bool = True, lie: dict[int, list[bytes]] | None = None):  # noqa: ANN201
    """Reads of `truth`; `lie[address]`: what successive reads of that chunk return first
    (unproven), as a stale window would."""
    counts: Counter = Counter()

    def read(ranges):  # noqa: ANN001, ANN202
        out = []
        for a, n in ranges:
            counts[a] += 1
            pending = (lie or {}).get(a)
            if pending:
                out.append((pending.pop(0), False))
            else:
                out.append((truth[a:a + n], proven))
        return out
    read.counts = counts  # type: ignore[attr-defined]
    return read


def test_a_proven_match_of_unpatterned_content_is_read_once():
    truth = random.Random(7).randbytes(0x2000)
    read = reader(truth)
    result = confirm_expected(read, 0x1000, UNIT, 2, Expectation(truth))
    assert result.resolved and result.data == truth[0x1000:0x2000]
    assert result.matched == result.chunks == 16 and set(read.counts.values()) == {1}


def test_an_unproven_match_is_confirmed_by_agreeing_reads():
    truth = random.Random(8).randbytes(UNIT)
    read = reader(truth, proven=False)
    result = confirm_expected(read, 0, UNIT, 2, Expectation(truth))
    assert result.data == truth and result.matched == 0 and set(read.counts.values()) == {2}


def test_patterned_content_is_read_twice_even_when_proven():
    truth = bytearray(random.Random(9).randbytes(UNIT))
    truth[0x300:0x500] = b"\xff" * 0x200
    read = reader(bytes(truth))
    result = confirm_expected(read, 0, UNIT, 2, Expectation(bytes(truth)))
    assert result.matched == 14 and read.counts[0x300] == read.counts[0x400] == 2 and read.counts[0x500] == 1


def test_a_stale_window_that_matches_is_not_kept():
    """The first read of a chunk returns exactly the expected bytes — but from a window that
    still held them (unproven), while the flash holds something else: the vote keeps the flash."""
    image = random.Random(10).randbytes(UNIT)
    flash = bytearray(image)
    flash[0x234] ^= 0x40
    read = reader(bytes(flash), lie={0x200: [image[0x200:0x300]]})
    result = confirm_expected(read, 0, UNIT, 2, Expectation(image))
    assert result.resolved and result.data == bytes(flash)
    assert 0x34 + 0x200 in result.differing


def test_a_mismatch_is_never_self_confirming():
    image = random.Random(11).randbytes(UNIT)
    flipped = bytearray(image)
    flipped[0x10] ^= 1
    read = reader(image, lie={0: [bytes(flipped[:CHUNK])]})    # one noisy read, then the truth
    result = confirm_expected(read, 0, UNIT, 2, Expectation(image))
    assert result.data == image and read.counts[0] >= 3 and result.matched == 15


def test_a_unit_about_to_change_is_confirmed_throughout():
    image = random.Random(12).randbytes(UNIT)
    flash = bytearray(image)
    flash[0xF00] ^= 0xFF
    read = reader(bytes(flash))
    result = confirm_expected(read, 0, UNIT, 2, Expectation(image), whole=True)
    assert result.data == bytes(flash) and result.matched == 0 and set(read.counts.values()) == {2}


def test_noise_counts_the_reads_of_matched_chunks():
    truth = random.Random(13).randbytes(UNIT)
    noise = Noise()
    confirm_expected(reader(truth), 0, UNIT, 2, Expectation(truth), noise)
    assert noise.byte_reads == UNIT and noise.flips == 0


# -- where a read came from: the ROM_SW driver ---------------------------------------------------

def palindromic_page(seed: int) -> bytes:
    """Unpatterned content whose dwords read the same either way round: the window holds it,
    as TX data, exactly as an RX capture of it would read."""
    rng = random.Random(seed)
    words = []
    for _ in range(64):
        a, b = rng.randrange(256), rng.randrange(256)
        words.append(bytes((a, b, b, a)))
    page = bytearray(b"".join(words))
    page[0] &= 0xFE               # an even first byte: the status it is mistaken for shows no WIP
    page[3] = page[0]
    return bytes(page)


@pytest.fixture
def engine(make_board):  # noqa: ANN201
    def open_(content: bytes, faults: list[str] | None = None):  # noqa: ANN202
        board = make_board(content=content, transport="ideal", faults=faults or [])
        bar = SimBar5(board)
        engine = RomSw(bar, RomSwOptions()).open()
        nor = SpiNor(engine)
        nor.identify()
        return bar, engine, nor
    opened = []

    def make(content: bytes, faults: list[str] | None = None):  # noqa: ANN202
        bar, engine, nor = open_(content, faults)
        opened.append((bar, engine))
        return bar, engine, nor
    yield make
    for bar, engine in opened:
        engine.close()
        bar.close()


def test_chained_reads_prove_where_they_came_from(engine):
    content = random_image(14)
    bar, rom, nor = engine(content)
    assert rom.proves_reads
    first = list(nor.read_ranges_proven([(a, CHUNK) for a in range(0, UNIT, CHUNK)]))
    assert [d for d, _ in first] == [content[a:a + CHUNK] for a in range(0, UNIT, CHUNK)]
    assert all(ok for _, ok in first[1:])
    # The chain goes on where it ended: its first read is proven too.
    after = list(nor.read_ranges_proven([(a, CHUNK) for a in range(UNIT, 2 * UNIT, CHUNK)]))
    assert all(ok for _, ok in after) and b"".join(d for d, _ in after) == content[UNIT:2 * UNIT]


def test_equal_neighbouring_chunks_prove_nothing(engine):
    content = bytearray(random_image(15))
    content[0x1100:0x1200] = content[0x1000:0x1100]
    _, _, nor = engine(bytes(content))
    list(nor.read_ranges_proven([(0, CHUNK)]))
    got = list(nor.read_ranges_proven([(a, CHUNK) for a in range(0x1000, 0x1400, CHUNK)]))
    assert [ok for _, ok in got] == [True, False, False, True]


def test_primed_reads_prove_nothing(make_board):
    bar = SimBar5(make_board(content=random_image(16), transport="ideal"))
    try:
        with RomSw(bar, RomSwOptions(rx_mode="primed")) as rom:
            nor = SpiNor(rom)
            nor.identify()
            assert not rom.proves_reads
            assert not any(ok for _, ok in nor.read_ranges_proven([(a, CHUNK) for a in range(0, UNIT, CHUNK)]))
    finally:
        bar.close()


def silent_while(bar: SimBar5, chain, n: int) -> list:  # noqa: ANN001
    """Consume a read chain with its first `n` items' transactions silent (silent-rx=1)."""
    out = []
    bar.board.faults.silent_rx = 1.0
    for item in chain:
        out.append(item)
        if len(out) == n:
            bar.board.faults.silent_rx = 0.0
    bar.board.faults.silent_rx = 0.0
    return out


def test_a_read_back_whose_transactions_did_not_run_is_not_proven(engine):
    """A page is programmed, but a bit of it is stuck, so the flash does not hold it; the
    window still holds the page as TX data, and its dwords read the same either way round.
    The read-back's first transactions silently do not run: what it reads is exactly the
    page. A driver that took that match would keep the page; amdflash proves nothing of it,
    and the vote keeps what the flash holds."""
    page = palindromic_page(17)
    address = 0x40000
    stuck = next(i for i in range(len(page)) if not page[i] & 0x10)
    content = bytearray(random_image(18))
    content[address:address + UNIT] = b"\xff" * UNIT
    bar, rom, nor = engine(bytes(content), [f"stuck-bit={address + stuck:#x}:4"])
    image = bytearray(content)
    image[address:address + CHUNK] = page
    nor.program_pages(address, page, [address])
    flash = as_read(Path(bar.board.path))
    assert flash[address:address + CHUNK] != page              # the stuck bit
    seen = []

    def read(ranges):  # noqa: ANN001, ANN202
        chain = nor.read_ranges_proven(ranges)
        seen.append(silent_while(bar, chain, 1) if not seen else list(chain))
        return seen[-1]

    result = confirm_expected(read, address, UNIT, 2, Expectation(bytes(image)))
    assert result.resolved and result.data == flash[address:address + UNIT]
    assert seen[0][0] == (page, False)                          # the host's own TX data, not proven
    assert result.matched == 0                                  # the rest of the unit is erased: 0xFF


def test_a_stale_done_bit_does_not_make_a_read_early(engine):
    """Every write of 0 to STATUS is lost once the engine is open: each transaction starts
    with the done bit of the one before still set. amdflash never takes a done bit before the
    transaction's time is up, so every read is still the flash (and proven)."""
    content = random_image(19)
    bar, rom, nor = engine(content)
    bar.board.faults.stale_done = 1.0
    got = list(nor.read_ranges_proven([(a, CHUNK) for a in range(0, 2 * UNIT, CHUNK)]))
    assert b"".join(d for d, _ in got) == content[:2 * UNIT] and all(ok for _, ok in got[1:])
    assert bar.board.get32(R.ROM_SW_STATUS) & R.ROM_SW_DONE and bar.board.stats()["protocol_violations"] == 0
    assert bar.board.fault_state[F_STALE_DRAWS] >= 32            # every clear was lost


# -- through the CLI ---------------------------------------------------------------------------

def verify_spending(cli, make_board, tmp_path: Path, content: bytes) -> int:  # noqa: ANN001
    """Verify a board holding `content` against it; the SPI transactions it took."""
    board = make_board(content=content, transport="ideal")
    image = tmp_path / "image.bin"
    image.write_bytes(content)
    before = spi_transactions(board)
    r = cli("verify", image, "--board", f"sim:{board}")
    assert r.code == 0, r.err
    return spi_transactions(board) - before


def test_a_verify_of_unpatterned_content_reads_each_chunk_once(cli, make_board, db, tmp_path):
    spent = verify_spending(cli, make_board, tmp_path, random_image(20))
    assert 8192 < spent < 8192 * 1.03, spent                  # one read per chunk (plus opening, a proof)
    run_id = last_run_id(db)
    (row,) = confirmed_rows(db, run_id)
    assert row["purpose"] == "verify" and row["matched_what"] == "the image" and row["units"] == 512
    assert row["matched"] >= 510 and row["agreeing"] == 0 and row["matched"] + row["mixed"] == 512
    assert sum(n for _, n, _, _ in row["units_by_address"]) == 512
    report = json.loads(cli("report", run_id, "--format", "json").out)
    assert report["reads"]["confirmation"]["verify"]["matched"] == row["matched"]
    assert f"verify: {row['matched']} units matched the image" in cli("report", run_id).out


def test_a_verify_of_an_ifwi_confirms_its_erased_units_by_agreeing_reads(cli, make_board, db, tmp_path):
    content = synthetic_ifwi(21)
    spent = verify_spending(cli, make_board, tmp_path, content)
    once = Expectation(content).confirming_count(0, MiB2)
    assert 2 * 8192 - once < spent < (2 * 8192 - once) * 1.03, (spent, once)
    (row,) = confirmed_rows(db, last_run_id(db))
    erased = sum(content[a:a + UNIT] == b"\xff" * UNIT for a in range(0, MiB2, UNIT))
    assert row["agreeing"] >= erased and row["matched"] + row["mixed"] > 0


def test_a_flash_reads_back_the_data_written_once_and_says_so(cli, make_board, db, tmp_path):
    rng = random.Random(122)             # not the stream the board's content came from
    current = random_image(22)
    image = bytearray(current)
    image[0x10000:0x18000] = rng.randbytes(0x8000)
    path = tmp_path / "image.bin"
    path.write_bytes(bytes(image))
    board = make_board(content=current, transport="ideal")
    r = cli("flash", path, "--yes", "--force", "--start-sector", 0x10, "--sector-count", 8, "--board", f"sim:{board}")
    assert r.code == 0, r.err
    assert (board / "flash.bin").read_bytes() == bytes(image)
    run_id = last_run_id(db)
    backup, verify = confirmed_rows(db, run_id)
    assert backup["purpose"] == "backup" and backup["agreeing"] == 8       # every unit about to change
    assert verify["purpose"] == "verify" and verify["matched_what"] == "the data written"
    assert verify["units"] == 8 and verify["matched"] + verify["mixed"] == 8
    assert sum(n * m for _, n, _, m in verify["units_by_address"]) >= 8 * 15     # all but a chain's first read
    details = [d for (d,) in rows(db, "SELECT detail FROM units WHERE run_id = ? AND state = 'verified'", run_id)]
    assert len(details) == 8 and all("read back as the data written" in d for d in details)


def test_a_no_op_reflash_confirms_the_units_it_finds_equal_by_the_image(cli, make_board, db, tmp_path):
    content = random_image(23)
    path = tmp_path / "image.bin"
    path.write_bytes(content)
    spent = {}
    for reads in (2, 1):
        board = make_board(content=content, transport="ideal")
        before = spi_transactions(board)
        r = cli("flash", path, "--yes", "--force", "--sector-count", 32, "--reads", reads, "--board", f"sim:{board}")
        assert r.code == 0, r.err
        spent[reads] = spi_transactions(board) - before
    assert spent[2] < 1.05 * spent[1], spent                                # once per chunk, not twice
    first = rows(db, "SELECT run_id FROM runs ORDER BY seq LIMIT 1")[0][0]
    (backup,) = confirmed_rows(db, first)
    assert backup["purpose"] == "backup" and backup["matched"] + backup["mixed"] == 32


def test_reads_1_records_every_unit_as_unconfirmed(cli, make_board, db, tmp_path):
    content = random_image(24)
    board = make_board(content=content, transport="ideal")
    image = tmp_path / "image.bin"
    image.write_bytes(content)
    assert cli("verify", image, "--reads", 1, "--board", f"sim:{board}").code == 0
    (row,) = confirmed_rows(db, last_run_id(db))
    assert row["single"] == 512 and row["matched"] == 0


def test_a_chunk_that_reads_all_ff_while_busy_does_not_pass_for_erased(cli, make_board, tmp_path):
    """The image wants the first chunk of a unit erased, the board holds data there, and its
    neighbours hold data too (so the read of it is proven: the window changes before and
    after). That read finds the chip busy and returns all 0xFF — exactly the image. 0xFF
    proves nothing: the chunk is read again, the data shows, and the verify fails naming it."""
    image = bytearray(random_image(25))
    unit = 0x123000
    image[unit:unit + CHUNK] = b"\xff" * CHUNK
    board = make_board(content=random_image(25), transport="ideal", faults=[f"busy-read={unit:#x}:1"])
    path = tmp_path / "image.bin"
    path.write_bytes(bytes(image))
    r = cli("verify", path, "--board", f"sim:{board}")
    assert r.code == 1 and f"verify mismatch at {unit:#08x}" in r.err, (r.out, r.err)
    with Board(board) as b:
        assert b.stats()["ignored_while_busy"] == 1


def test_a_unit_that_reads_all_ff_while_busy_does_not_pass_for_erased(cli, make_board, tmp_path):
    """The same for a whole unit the image wants erased, one page of which holds data: its
    first read, all of it while the chip is busy, is all 0xFF."""
    content = synthetic_ifwi(25)
    unit = next(a for a in range(0x100000, MiB2, UNIT) if content[a:a + UNIT] == b"\xff" * UNIT)
    board_content = bytearray(content)
    board_content[unit + 0x300:unit + 0x400] = random.Random(25).randbytes(0x100)
    board = make_board(content=bytes(board_content), transport="ideal", faults=[f"busy-read={unit:#x}"])
    image = tmp_path / "image.bin"
    image.write_bytes(content)
    r = cli("verify", image, "--board", f"sim:{board}")
    assert r.code == 1 and f"verify mismatch at {unit + 0x300:#08x}" in r.err, (r.out, r.err)
    with Board(board) as b:
        assert b.stats()["ignored_while_busy"] == 16


@pytest.mark.slow
def test_a_dump_of_a_unit_read_while_busy_is_the_flash(cli, make_board, tmp_path):
    board = make_board(content=random_image(26), transport="ideal", faults=["busy-read=0x7000"])
    out = tmp_path / "dump.bin"
    assert cli("dump", out, "--board", f"sim:{board}").code == 0
    assert out.read_bytes() == as_read(board)


@pytest.mark.parametrize("fault", ["silent-rx=0.01", "stale-done=0.01",
                                   pytest.param("read-flip=0.01", marks=pytest.mark.slow)])   # ~100 s: k = 5
def test_a_verify_that_should_fail_still_fails_under_faults(cli, make_board, tmp_path, fault):
    """A board one bit away from the image, under each fault: never taken for the image."""
    content = random_image(27)
    wrong = bytearray(content)
    wrong[0x12345] ^= 0x08
    board = make_board(content=bytes(wrong), transport="ideal", faults=[fault])
    image = tmp_path / "image.bin"
    image.write_bytes(content)
    r = cli("verify", image, "--board", f"sim:{board}")
    assert r.code == 1 and "verify mismatch at 0x012345" in r.err, (r.out, r.err)


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["silent-rx=0.01", "stale-done=0.01", "read-flip=0.01", "busy-read=0x3000"])
def test_a_flash_under_faults_keeps_no_wrong_byte(cli, make_board, db, tmp_path, fault):
    """Backup (units equal to the image and units about to change), write, read back: the
    backup on record is the board as it was, and the flash ends as the image."""
    current = random_image(28)
    image = bytearray(current)
    image[0x0000:0x8000] = random.Random(128).randbytes(0x8000)
    image[0x8000:0x9000] = b"\xff" * UNIT
    path = tmp_path / "image.bin"
    path.write_bytes(bytes(image))
    board = make_board(content=current, transport="ideal", faults=[fault])
    r = cli("flash", path, "--yes", "--force", "--sector-count", 64, "--board", f"sim:{board}")
    assert r.code == 0, r.err
    assert as_read(board)[:0x40000] == bytes(image[:0x40000])
    units = rows(db, "SELECT address, data FROM backup_units WHERE run_id = ? ORDER BY address", last_run_id(db))
    assert b"".join(d for _, d in units) == current[:0x40000]


def test_the_dword_palindrome_helper_is_what_the_window_holds():
    """The window takes TX data as big-endian dwords: a page whose dwords are palindromes
    reads back from the window unchanged (what makes the stale-window test bite)."""
    page = palindromic_page(29)
    words = struct.unpack(">64I", page)
    assert struct.pack("<64I", *words) == page and not patterned(page)
