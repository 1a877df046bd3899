"""What a board command returns: one result per board, typed per command.

Every result carries the run as the audit trail recorded it (`report`, the same object as
`amdflash report RUN --format json`), so the CLI's `--json`, the Python API and a later
`report` all say the same thing. The typed properties read from it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class RunOutcome:
    run_id: str                 # "" when the run was cancelled before it could be recorded
    board: str
    command: str
    status: str                 # succeeded | failed | interrupted | refused
    exit_code: int              # 0, 1, 2 or 130, as the command line would exit
    error: str | None
    lines: tuple[str, ...] = ()                          # what the run says, for people
    summary: dict[str, Any] = field(default_factory=dict)   # what the job returned
    report: dict[str, Any] = field(default_factory=dict)    # the run as recorded
    advice: str | None = None                               # what to do next, when it did not succeed

    @property
    def ok(self) -> bool:
        return self.status == "succeeded"

    @property
    def result_sha256(self) -> str | None:
        """SHA-256 of the flash content after the run, when the run read or wrote all of it."""
        return self.report.get("result_sha256") or self.summary.get("result_sha256")

    def raise_for_status(self) -> RunOutcome:
        if not self.ok:
            raise RunFailed(self)
        return self


class RunFailed(RuntimeError):
    def __init__(self, outcome: RunOutcome):
        super().__init__(f"{outcome.command} on {outcome.board} {outcome.status}: {outcome.error}")
        self.outcome = outcome


@dataclass(frozen=True)
class InfoResult(RunOutcome):
    @property
    def jedec(self) -> str | None:
        return self.report.get("board", {}).get("jedec")

    @property
    def chip(self) -> str | None:
        return self.report.get("board", {}).get("chip")

    @property
    def unique_id(self) -> str | None:
        return self.report.get("board", {}).get("unique_id")

    @property
    def status_registers(self) -> tuple[int | None, int | None, int | None]:
        b = self.report.get("board", {})
        return b.get("sr1"), b.get("sr2"), b.get("sr3")

    @property
    def protection(self) -> str | None:
        return self.report.get("board", {}).get("protection")


@dataclass(frozen=True)
class ReadResult(RunOutcome):
    output: Path | None = None

    @property
    def data(self) -> bytes | None:
        """The bytes read (from the file with -o, else from the hex lines)."""
        if not self.ok:
            return None
        if self.output is not None:
            return self.output.read_bytes()
        return bytes.fromhex("".join(self.lines))


@dataclass(frozen=True)
class DumpResult(RunOutcome):
    path: Path | None = None


@dataclass(frozen=True)
class VerifyResult(RunOutcome):
    @property
    def equal(self) -> bool:
        return self.ok

    @property
    def first_mismatch(self) -> dict[str, Any] | None:
        """The first differing unit: address, mismatch_address, flash_byte, image_byte."""
        failed = self.report.get("verifies", {}).get("failed") or []
        return failed[0] if failed else None


@dataclass(frozen=True)
class FlashResult(RunOutcome):
    @property
    def units(self) -> dict[str, int]:
        """Units by what they needed: skip (already equal), program (no erase), erase."""
        return dict(self.summary.get("units", {}))

    @property
    def erases(self) -> dict[int, int]:
        return {int(k): v for k, v in self.summary.get("erases", {}).items()}

    @property
    def resumes_run_id(self) -> str | None:
        return self.report.get("resumes_run_id")


@dataclass(frozen=True)
class ProbeResult(RunOutcome):
    @property
    def answers(self) -> dict[str, tuple[int, int]]:
        """query -> (error, response) of the PSP boot mailbox."""
        return {k: (v[0], v[1]) for k, v in self.summary.get("probe", {}).items()}


@dataclass(frozen=True)
class IfwiResult(RunOutcome):
    @property
    def items(self) -> list[int]:
        return list(self.summary.get("items", []))
