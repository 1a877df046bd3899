"""Replay a recorded run on an emulated board and show where hardware and replay diverge.

The replay board starts as the run's board started, as far as the audit trail knows it:

* flash: the run's backup (`backup_units`); units the run did not back up stay 0xFF and
  are left out of every comparison;
* registers: the "before" snapshot, stored as values (not written: a write to ROM_SW_CNTL
  would start a transaction);
* chip status registers: SR1/SR2/SR3 as identified (`boards`), so CMP and BP protect what
  they protected on the board.

Then the recorded register writes are re-applied in issue order (`n`), raw. The board is
on the ideal profile: every SPI operation completes at once, so the recorded status polls
that waited for WIP are not needed — reads are not recorded, and on a ROM_SW flash run no
read changes state (only ROM_DATA/the aperture pointer and the PSP mailbox react to reads,
and such a run uses neither), so the writes alone reproduce the SPI conversation. A WREN
that real silicon ignored while busy lands on the idle replay chip, which only sets a WEL
the next recorded command sets again.

Every recorded verify row is checked when the replay reaches it: verify rows and register
writes share the global seq order, so a verify row is checked once every write recorded
before it has been applied. A run whose hardware behaved like a perfect chip replays
identically; a stuck bit, an erase that did nothing or a transient read error shows up as
the first divergence: the verify row, the last write applied, the unit, the byte and both
values.
"""
from __future__ import annotations

import bisect
import hashlib
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import sqlite_utils
from amdflash.store.queries import (
                                    RunNotFound,
                                    counts,
                                    iter_register_writes,
                                    register_snapshot,
                                    register_write_order,
                                    resolve_run,
                                    status_of,
                                    )
from amdflash.store.partial import with_spans
from amdflash.store.run_rows import RunRows, RunUnverified, open_run
from amdflash.store.status import ENDS
from amdflash.store.verify import snapshot
from amdflash.stages.drivers.flash.geometry import FLASH_SIZE, UNIT

# The chip's status-register writes: what a real chip needs to hold given values.
_WREN, _WRSR, _WRSR3, _RDSR1, _RDSR2, _RDSR3 = 0x06, 0x01, 0x11, 0x05, 0x35, 0x15
_SR1_WRITABLE, _SR2_KEPT, _SR3_WRITABLE = 0xFC, 0x7B, 0x60   # SR2 without SUS1/SUS2: transient


NOT_TAKEN = "the recorded read-back differed from the image; the replayed unit equals it"


class ReplayRefused(Exception):
    """Nothing to replay: unknown run, or a run without a backup to start from."""


@dataclass
class Divergence:
    what: str                    # "verify" or "result"
    detail: str
    verify_seq: int | None = None
    attempt: int | None = None
    after_write_n: int | None = None      # the last register write applied before it
    after_write_seq: int | None = None
    unit: int | None = None
    address: int | None = None            # the first differing byte, when the record pins it
    recorded_byte: int | None = None
    replayed_byte: int | None = None
    # The unit's read-back differed on the board, a later attempt there verified, and the replay
    # of that attempt matches the record: what the board did not take once, it took when retried.
    transient: bool = False
    explained_by: str | None = None       # a divergence the hardware report lists (replay --from-report)


@dataclass
class ReplayResult:
    run_id: str
    command: str
    status: str
    writes_total: int
    writes_applied: int
    until: int | None
    units_backed_up: int
    status_registers: tuple[int, int, int]
    verifies_checked: int = 0
    verifies_matching: int = 0
    verifies_excluded: int = 0
    divergences: list[Divergence] = field(default_factory=list)
    result_sha256: str | None = None      # recorded
    replay_sha256: str | None = None      # of the replayed flash, when comparable
    result_matches: bool | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not self.divergences

    @property
    def first(self) -> Divergence | None:
        return self.divergences[0] if self.divergences else None

    @property
    def unexplained(self) -> list[Divergence]:
        return [d for d in self.divergences if d.explained_by is None]

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "identical": self.identical, "unexplained": len(self.unexplained)}


@dataclass
class _Verify:
    seq: int
    address: int
    size: int
    ok: int
    attempt: int
    expected_sha256: str | None
    actual_sha256: str | None
    mismatch_address: int | None
    flash_byte: int | None
    image_byte: int | None


def replay(db: sqlite_utils.Database, run_id: str, until: int | None = None,
           image: bytes | None = None, workdir: str | None = None,
           board: dict[str, Any] | None = None) -> ReplayResult:
    """Replay RUN_ID; `image`, when it is the run's image, pins bytes the record only hashes.
    `board`: the replay board's chip, SFDP and status registers from a hardware report of the
    run's board (create_board options, report_model.board_options) instead of the default part."""
    with snapshot(db.conn):
        return _replay(db, run_id, until, image, workdir, board)


def _replay(db: sqlite_utils.Database, run_id: str, until: int | None, image: bytes | None,
            workdir: str | None, options: dict[str, Any] | None = None) -> ReplayResult:
    try:
        run_id = resolve_run(db, run_id)
    except RunNotFound as e:
        raise ReplayRefused(str(e)) from None
    try:
        rows = open_run(db.conn, run_id)      # a run that does not verify is not replayed (RunUnverified)
    except RunUnverified as e:
        raise with_spans(db.conn, run_id, e) from None     # naming every span that fails
    run = next(db.query("SELECT command, image_sha256 FROM runs WHERE seq = ?", [rows.key]))
    backup = {r["address"]: bytes(r["data"]) for r in
              db.query(f"SELECT address, data FROM backup_units WHERE {rows.sql} ORDER BY seq", rows.args)}
    if not backup:
        raise ReplayRefused(f"run {run_id} ({run['command']}) recorded no backup: there is no starting content "
                            "to replay from")
    if image is not None and hashlib.sha256(image).hexdigest() != run["image_sha256"]:
        image = None
    result = _start(db, rows, run["command"], until, len(backup))
    if rows.unsealed_rows:
        result.notes.append(f"the run's last {rows.unsealed_rows} row(s) are not sealed by any checkpoint (its "
                            "host died with its writer): they are replayed as recorded, but not verified")
    if image is None:
        result.notes.append("the run's image is not available (or not the run's): a unit whose recorded "
                            "read-back matched the image is compared by hash only")
    with tempfile.TemporaryDirectory(prefix="amdflash-replay-", dir=workdir) as tmp:
        board = build_board(Path(tmp) / "board", backup, result.status_registers,
                            register_snapshot(db, rows, "before") or {}, result.notes, options)
        try:
            _Replayer(db, rows, board, backup, image, result).run(until)
        finally:
            board.close()
    return result


def _start(db: sqlite_utils.Database, rows: RunRows, command: str, until: int | None, backed_up: int) -> ReplayResult:
    status = list(db.query(f"SELECT status, result_sha256 FROM run_status WHERE {rows.sql} ORDER BY seq DESC LIMIT 1",
                           rows.args))
    board = list(db.query(f"SELECT sr1, sr2, sr3 FROM boards WHERE {rows.sql} ORDER BY seq LIMIT 1", rows.args))
    sr1, sr2, sr3 = ((board[0][k] or 0) if board else 0 for k in ("sr1", "sr2", "sr3"))
    result = ReplayResult(
        run_id=rows.run_id, command=command, status=status_of(db, rows),
        writes_total=counts(db.conn, rows)[0], writes_applied=0, until=until, units_backed_up=backed_up,
        status_registers=(sr1, sr2, sr3), result_sha256=status[0]["result_sha256"] if status else None)
    if not status or status[0]["status"] not in ENDS:
        result.notes.append("the run recorded no end (its host died?): writes it had issued but not yet handed "
                            "to the audit writer are not on record, so the board may have received more than "
                            "this replay applies")
    return result


def build_board(path: Path, backup: dict[int, bytes], status: tuple[int, int, int],
                registers: dict[int, int], notes: list[str],
                options: dict[str, Any] | None = None):  # -> a sim Board
    """A fresh emulated board (ideal profile) holding the run's starting state; with
    `options` (from a hardware report), the report's part, SFDP and status registers."""
    from amdflash.stages.sim import Board, create_board

    flash = bytearray(b"\xff" * FLASH_SIZE)
    for address, data in backup.items():
        flash[address:address + len(data)] = data
    if options is None:
        create_board(path, content=bytes(flash), transport="ideal", seed=0)
        board = Board(path)
        _set_status(board, status, notes)
    else:
        # Timings mean nothing on the ideal profile: only the part, its SFDP and its registers.
        sfdp = (options.get("calibration") or {}).get("sfdp")
        create_board(path, content=bytes(flash), transport="ideal", seed=0, chip=options["chip"],
                     status_registers=options["status_registers"],
                     calibration={"sfdp": sfdp} if sfdp else None)
        board = Board(path)
        notes.append(f"the replay board is the hardware report's {options['chip']} with its SFDP and its "
                     "status registers as the report found them")
    for offset, value in registers.items():
        board.set32(offset, value)
    return board


def _set_status(board, status: tuple[int, int, int], notes: list[str]) -> None:
    """Give the chip the identified SR1/SR2/SR3 the way a host would: WREN + status writes.

    Going through the chip's own commands (rather than its private state layout) applies
    the chip's rules — writable bits, one-time lock bits — and the read-back proves the
    values took; SR3 goes first because an SR2 with SRP1 set locks every later write.
    """
    sr1, sr2, sr3 = status
    chip = board.chip
    chip.transaction(bytes((_WREN,)), 0)
    chip.transaction(bytes((_WRSR3, sr3 & _SR3_WRITABLE)), 0)
    chip.transaction(bytes((_WREN,)), 0)
    chip.transaction(bytes((_WRSR, sr1 & _SR1_WRITABLE, sr2 & _SR2_KEPT)), 0)
    got = tuple(chip.transaction(bytes((op,)), 1)[0] for op in (_RDSR1, _RDSR2, _RDSR3))
    want = (sr1 & _SR1_WRITABLE, sr2 & _SR2_KEPT, sr3 & _SR3_WRITABLE)
    if got != want:
        notes.append("the replay chip holds SR1/SR2/SR3 = {:02x}/{:02x}/{:02x}, not the identified "
                     "{:02x}/{:02x}/{:02x}".format(*got, *want))


class _Replayer:
    def __init__(self, db: sqlite_utils.Database, rows: RunRows, board, backup: dict[int, bytes],
                 image: bytes | None, result: ReplayResult):
        self.db, self.rows, self.board = db, rows, board
        self.backup, self.image, self.result = backup, image, result
        self.flash = board.files.flash
        self.last_n: int | None = None
        self.last_seq: int | None = None
        self._matched: set[int] = set()   # seqs of verify rows compared that match the record

    def run(self, until: int | None) -> None:
        verifies = self._verifies()
        checkpoints = self._checkpoints(verifies)
        pending = 0
        board = self.board
        for seq, n, offset, value, data in iter_register_writes(self.db, self.rows, until):
            while pending < len(verifies) and checkpoints[pending] < n:
                self._check(verifies[pending])
                pending += 1
            board.reg_write(offset, value.to_bytes(4, "little") if value is not None else bytes(data or b""))
            self.last_n, self.last_seq = n, seq
            self.result.writes_applied += 1
        stopped_early = until is not None and self.result.writes_applied < self.result.writes_total
        limit = until if stopped_early else None
        while pending < len(verifies) and (limit is None or checkpoints[pending] <= limit):
            self._check(verifies[pending])
            pending += 1
        if stopped_early:
            self.result.notes.append(f"stopped after register write {until}: {len(verifies) - pending} later "
                                     "verify rows and the final content were not compared")
        else:
            self._compare_result()
        self._mark_transient(verifies)

    def _mark_transient(self, verifies: list[_Verify]) -> None:
        for d in self.result.divergences:
            if d.what != "verify" or d.detail != NOT_TAKEN:
                continue
            # A later verify of the same unit that the board passed and the replay compared equal.
            d.transient = any(v.seq > (d.verify_seq or 0) and v.address == d.unit and v.ok and v.seq in self._matched
                              for v in verifies)

    def _verifies(self) -> list[_Verify]:
        found = self.db.conn.execute(
            "SELECT seq, address, size, ok, attempt, expected_sha256, actual_sha256, mismatch_address, "
            f"flash_byte, image_byte FROM verifies WHERE {self.rows.sql} ORDER BY seq", self.rows.args).fetchall()
        return [_Verify(*r) for r in found]

    def _checkpoints(self, verifies: list[_Verify]) -> list[int]:
        """Per verify row, the highest write n recorded before it (0: none).

        Writes are applied in n order, the order they were issued; the seq order they were
        chained in is the same unless two threads' batches crossed in the writer, and the
        highest n seen before a row stays right either way.
        """
        seqs: list[int] = []
        highest: list[int] = []
        top, crossed = 0, False
        for seq, n in register_write_order(self.db, self.rows):
            crossed |= n < top
            top = max(top, n)
            seqs.append(seq)
            highest.append(top)
        if crossed:
            self.result.notes.append("register writes were chained out of issue order; verify rows are checked "
                                     "after the highest write recorded before them")
        out = []
        for v in verifies:
            i = bisect.bisect_left(seqs, v.seq)
            out.append(highest[i - 1] if i else 0)
        return out

    # -- comparisons ------------------------------------------------------------------------
    def _check(self, v: _Verify) -> None:
        result = self.result
        if any(a not in self.backup for a in range(v.address, v.address + v.size, UNIT)):
            result.verifies_excluded += 1
            return
        result.verifies_checked += 1
        got = bytes(self.flash[v.address:v.address + v.size])
        if v.actual_sha256 is None:
            # A unit the planner skipped: what it read is its backup, and that equalled the image.
            recorded = b"".join(self.backup[a] for a in range(v.address, v.address + v.size, UNIT))
            if got == recorded:
                result.verifies_matching += 1
                return
            at = _first_difference(got, recorded)
            assert at is not None          # the two differ
            self._diverged(v, "skipped unit changed during the replay", v.address + at, recorded[at], got[at])
            return
        if hashlib.sha256(got).hexdigest() == v.actual_sha256:
            result.verifies_matching += 1
            self._matched.add(v.seq)
            return
        address, recorded_byte = self._locate(v, got)
        replayed_ok = v.expected_sha256 is not None and hashlib.sha256(got).hexdigest() == v.expected_sha256
        detail = NOT_TAKEN if replayed_ok and not v.ok else (
            f"the recorded read-back {'equalled' if v.ok else 'differed from'} the image; "
            f"the replayed unit {'equals' if replayed_ok else 'differs from'} it")
        self._diverged(v, detail, address, recorded_byte,
                       got[address - v.address] if address is not None else None)

    def _locate(self, v: _Verify, got: bytes) -> tuple[int | None, int | None]:
        """The first byte where the recorded read-back and the replay differ, if the record pins it.

        The record holds the read-back's hash and, for a mismatch, its first byte that
        differed from the image: every byte before it equalled the image.
        """
        wanted = self.image[v.address:v.address + v.size] if self.image is not None else None
        end = v.mismatch_address - v.address if v.mismatch_address is not None else v.size
        if wanted is not None:
            at = _first_difference(got[:end], wanted[:end])
            if at is not None:
                return v.address + at, wanted[at]
        if v.mismatch_address is not None and got[end] != v.flash_byte:
            return v.mismatch_address, v.flash_byte
        return None, None

    def _diverged(self, v: _Verify, detail: str, address: int | None, recorded: int | None,
                  replayed: int | None) -> None:
        self.result.divergences.append(Divergence(
            "verify", detail, v.seq, v.attempt, self.last_n, self.last_seq, v.address, address, recorded, replayed))

    def _compare_result(self) -> None:
        result = self.result
        units = FLASH_SIZE // UNIT
        if result.result_sha256 is None:
            return
        if result.units_backed_up < units:
            result.notes.append(f"only {result.units_backed_up} of {units} units were backed up: the whole-flash "
                                "result SHA-256 is not comparable")
            return
        content = bytes(self.flash)
        result.replay_sha256 = hashlib.sha256(content).hexdigest()
        result.result_matches = result.replay_sha256 == result.result_sha256
        if result.result_matches:
            return
        divergence = Divergence("result", "replayed flash content differs from the recorded result SHA-256",
                                after_write_n=self.last_n, after_write_seq=self.last_seq)
        if self.image is not None and hashlib.sha256(self.image).hexdigest() == result.result_sha256:
            at = _first_difference(content, self.image)
            if at is not None:
                divergence.unit, divergence.address = at - at % UNIT, at
                divergence.recorded_byte, divergence.replayed_byte = self.image[at], content[at]
        result.divergences.append(divergence)


def _first_difference(a: bytes, b: bytes) -> int | None:
    if a == b:
        return None
    # Narrow by halves: the bytes compare in C, which matters for 2 MiB.
    lo, hi = 0, min(len(a), len(b))
    while hi - lo > 64:
        mid = (lo + hi) // 2
        if a[lo:mid] != b[lo:mid]:
            hi = mid
        else:
            lo = mid
    return next((i for i in range(lo, hi) if a[i] != b[i]), hi)
