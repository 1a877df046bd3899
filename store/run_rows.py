"""A run's rows as its signed checkpoints vouch for them: the one way the per-run views —
`report` (text, JSON, HTML), `replay`, `resume` and the backup a resume keeps — read a run.

`open_run` verifies the run first (store.verify.verify_run: exactly one runs row; every row
of the run, matched by its key whatever its seq, in a span a checkpoint seals, each span
rebuilding its signed head; or in the unsealed tail of a run that recorded no end) and
refuses a run that does not verify, naming the first thing that does not match. The
`RunRows` it returns is then how a view selects the run's rows:

* `rows.sql` / `rows.args` (`rows.where(alias)` / `rows.params()`): the run's rows, from its
  runs row on. That includes the unsealed tail of a run still being written, or whose host
  died with its writer: a view shows those rows as not verified (`rows.unsealed(seq)`).
* `rows.sealed_sql` / `rows.sealed_args`: only what its checkpoints seal — for decisions
  that act on the hardware (which units a resume may skip, which backup it keeps, which
  register values are put back).

A run that does not verify is refused here, whole. Only `report` shows such a run, through
store.partial (a PartialRows: the segments whose signed heads still rebuild), the rest marked;
nothing that acts on the hardware reads a run that way.

The bulk tables (`log_spi`, `log_writes`) are read through the views, which walk the run's
seq span from its runs row to its end; rows of the run outside that span are not read.
"""
from __future__ import annotations

import shlex
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from amdflash.store.verify import VerifyReport, verify_run


class RunUnverified(RuntimeError):
    """The run does not verify: no view shows it or acts on it (exit 1, naming the problem).
    `problem`: what does not match, without the check to paste (which names this machine's
    database: a page served to others says its own)."""

    def __init__(self, message: str, problem: str | None = None):
        super().__init__(message)
        self.problem = problem or message


@dataclass(frozen=True)
class RunRows:
    run_id: str
    key: int               # the seq of its runs row: its first row
    sealed: int | None     # the last seq its checkpoints seal (None: none yet)
    check: VerifyReport    # what verifying it found (rows, checkpoints, signers, unsealed rows)

    def where(self, alias: str = "", sealed_only: bool = False) -> str:
        """WHERE clause over a logical table or view (`alias.` before its columns): the run's
        rows, its unsealed tail included unless `sealed_only` (a run that recorded its end has
        none: nothing after its final checkpoint is its). Its parameters: `params`."""
        a = f"{alias}." if alias else ""
        if sealed_only or self.check.ended:
            return f"{a}run_id = ? AND {a}seq BETWEEN ? AND ?"
        return f"{a}run_id = ? AND {a}seq >= ?"

    def params(self, sealed_only: bool = False) -> list[object]:
        if sealed_only or self.check.ended:
            return [self.run_id, self.key, self.key - 1 if self.sealed is None else self.sealed]
        return [self.run_id, self.key]

    @property
    def sql(self) -> str:
        return self.where()

    @property
    def args(self) -> list[object]:
        return self.params()

    @property
    def sealed_sql(self) -> str:
        return self.where(sealed_only=True)

    @property
    def sealed_args(self) -> list[object]:
        return self.params(sealed_only=True)

    def unsealed(self, seq: int) -> bool:
        """Whether the row at `seq` lies in the run's unsealed tail (not verified)."""
        return self.sealed is None or seq > self.sealed

    @property
    def unsealed_rows(self) -> int:
        return sum(self.check.unsealed.values())


def open_run(conn: sqlite3.Connection, run_id: str, keyfiles: list[Path] | None = None) -> RunRows:
    """The run's rows once the run verifies (signatures against `keyfiles` when given); run it
    inside the caller's snapshot (store.verify.snapshot) so that what the view reads next is
    what was verified. Raises RunUnverified naming the first thing that does not match."""
    check = verify_run(conn, run_id, keyfiles)
    if not check.ok or check.key is None:
        raise RunUnverified(f"run {run_id} does not verify, so it is not shown or used: {check.problem} "
                            f"(check it: {verify_command(conn, run_id)})", problem=str(check.problem))
    return RunRows(run_id, check.key, check.sealed, check)


def checked_on(host: str, run_id: str, problem: str) -> str:
    """What does not match in a copy of a host's run (the central record's, read into a
    temporary file nobody else can open), and the check that reads its own trail there."""
    return f"{problem} ({shlex.join(['amdflash', 'audit', 'verify', '--run', run_id])} on {host} checks its own trail)"


def verify_command(conn: sqlite3.Connection, run_id: object) -> str:
    """`amdflash --db FILE audit verify --run RUN_ID`, to paste: with the database this
    connection reads, by its absolute path (a message printed here may be read anywhere, and
    the database may not be the default one)."""
    from amdflash.store.read_only import source_path

    source = source_path(conn)
    files = [source] if source else []
    run = str(run_id)
    # Bound to its option when it starts with '-': a run INSERTed as '--config=/x' stays a value.
    return shlex.join(["amdflash", *(["--db", files[0]] if files else []), "audit", "verify",
                       *([f"--run={run}"] if run.startswith("-") else ["--run", run])])
