"""Fast paths of the ROM_SW driver, and the self-check that validates them per board.

The validated sequence is the protocol as the reference client drove it on hardware:
every register access its own streamed access, a CNTL = 0 "clear" before each
transaction, STATUS polled on its own before the data window is read, every read primed.
The fast paths below do the same work with fewer or cheaper accesses; none of them was
used on hardware by the reference client, so each is checked on the board at open
(`check`) and turned off for that board when it disagrees with the validated sequence:

* chained RX — each RX transaction yields its predecessor's capture, a chain of reads
  costs one transaction more than it has reads (instead of twice as many);
* single-TLP register access — one register as one TLP (USB mode 0, a posted write or a
  read with its completion) instead of a one-dword stream;
* status and window in one streamed read — STATUS, COMMAND, the reserved dword and the
  window in ascending order: the window is read only after STATUS showed done;
* no CNTL clears — the reference writes CNTL = 0 (an opcode-only transaction) around each
  transaction; without them, a transaction is STATUS = 0, COMMAND, data, CNTL;
* streamed command — STATUS, COMMAND, the reserved dword (written back as read) and the TX
  data in one streamed write; COMMAND is not written again when it holds the value already.

The first five are checked by reading the same bytes (SFDP header, JEDEC, one 4 KiB unit)
the validated way and the fast way. Two more are checked otherwise:

* preload — the next page's data is loaded into the window while the chip programs the
  previous one (the engine is idle then). Checked by loading a pattern into the window
  with a transmit-only transaction and reading it back: the window must keep it (a status
  read would not: its RX capture lands in the window, so nothing may read between);
* early observe — the read that observes the done bit is sent before the SPI time has
  passed, by the time the request takes to reach the board. That delay is measured at
  open with STATUS-only reads (which are harmless while a transaction runs): the longest
  transaction whose done bit a STATUS read sent right after the CNTL write already sees.
  A read that still finds the transaction running is detected (STATUS in the same read)
  and turns the credit off for the board;

and one by its result, as it writes: timed pages — page programs follow the chip's typical
busy time without a status read in between; the read-back of every written unit checks
them, and a unit that needs a retry turns the board to checked programming.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from amdflash.stages.navi31.romsw import RomSw


@dataclass(frozen=True)
class FastPaths:
    chained: bool = True
    single_tlp: bool = True
    combined_read: bool = True
    no_cntl_clears: bool = True
    streamed_command: bool = True
    preload: bool = True
    early_observe: float = 0.0        # seconds of landing delay credited to an observing read
    timed_pages: bool = True

    def describe(self) -> str:
        on = [f.name.replace("_", " ") for f in fields(self) if f.name != "early_observe" and getattr(self, f.name)]
        off = [f.name.replace("_", " ") for f in fields(self) if f.name != "early_observe" and not getattr(self, f.name)]
        credit = f"early observe {self.early_observe * 1e6:.0f} µs" if self.early_observe else "no early observe"
        return f"on: {', '.join(on) or 'none'}; off: {', '.join(off) or 'none'}; {credit}"


VALIDATED = FastPaths(chained=False, single_tlp=False, combined_read=False, no_cntl_clears=False,
                      streamed_command=False, preload=False, early_observe=0.0, timed_pages=False)
COMPARED = ("chained", "single_tlp", "combined_read", "no_cntl_clears", "streamed_command")


@dataclass(frozen=True)
class Finding:
    """One fast path's verdict on this board."""

    name: str
    ok: bool
    detail: str


# What the self-check reads both ways: (opcode, address, address bytes, count).
SFDP_HEADER = (0x5A, 0x000000, 3, 17)
JEDEC = (0x9F, 0, 0, 4)
UNIT_ADDRESS, UNIT_SIZE, CHUNK = 0x000000, 0x1000, 0x100


def sample(engine: "RomSw") -> bytes:
    """The bytes the self-check compares, read with the engine's current settings."""
    from amdflash.stages.navi31.romsw import Request

    requests = [Request(*SFDP_HEADER), Request(*JEDEC)]
    requests += [Request(0x03, a, 3, CHUNK) for a in range(UNIT_ADDRESS, UNIT_ADDRESS + UNIT_SIZE, CHUNK)]
    return b"".join(engine.read_chain(requests))


def check(engine: "RomSw", wanted: FastPaths) -> list[Finding]:
    """Validate the `wanted` fast paths on this board; leaves `engine.fast` set to the ones
    that passed and returns a finding per fast path."""
    findings: list[Finding] = []
    engine.fast = replace(VALIDATED)
    baseline = sample(engine)
    candidates = [n for n in COMPARED if getattr(wanted, n)]
    accepted = _compare(engine, baseline, candidates, findings)
    engine.fast = replace(VALIDATED, **{n: True for n in accepted})
    if wanted.preload:
        engine.fast = replace(engine.fast, preload=True)
        ok, detail = _check_preload(engine)
        engine.fast = replace(engine.fast, preload=ok)
        findings.append(Finding("preload", ok, detail))
    engine.fast = replace(engine.fast, timed_pages=wanted.timed_pages)
    if wanted.timed_pages:
        findings.append(Finding("timed pages", True, "checked by the read-back of every written unit"))
    if wanted.early_observe and engine.fast.combined_read:
        credit, detail = _measure_landing(engine)
        engine.fast = replace(engine.fast, early_observe=credit)
        findings.append(Finding("early observe", True, detail))       # a measurement: nothing can disagree
    return findings


def _compare(engine: "RomSw", baseline: bytes, candidates: list[str], findings: list[Finding]) -> list[str]:
    def sample_with(names: list[str]) -> bytes:
        engine.fast = replace(VALIDATED, **{n: True for n in names})
        return sample(engine)

    if not candidates:
        return []
    together = sample_with(candidates)
    if together != baseline:
        # Once more both ways: a transient difference (a flipped bit on the bus) agrees now.
        together, baseline = sample_with(candidates), sample_with([])
    if together == baseline:
        findings += [Finding(_label(n), True, "agrees with the validated sequence") for n in candidates]
        return candidates
    accepted = []
    for name in candidates:
        got = sample_with([name])
        if got == baseline:
            accepted.append(name)
            findings.append(Finding(_label(name), True, "agrees with the validated sequence"))
        else:
            findings.append(Finding(_label(name), False, "disagrees with the validated sequence: " + _first_difference(got, baseline)))
    if accepted and sample_with(accepted) != baseline:
        findings += [Finding(_label(n), False, "agrees alone but not with the others") for n in accepted]
        accepted = []
    return accepted


def _label(name: str) -> str:
    return {"chained": "chained RX", "single_tlp": "single-TLP register access",
            "combined_read": "status and window in one read", "no_cntl_clears": "no CNTL clears",
            "streamed_command": "streamed command"}[name]


def _first_difference(got: bytes, want: bytes) -> str:
    if len(got) != len(want):
        return f"{len(got)} bytes read, {len(want)} expected"
    i = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
    where = "SFDP header" if i < 16 else "JEDEC id" if i < 20 else f"unit byte {i - 20:#x}"
    return f"{where}: {got[i]:#04x} instead of {want[i]:#04x}"


def _check_preload(engine: "RomSw") -> tuple[bool, str]:
    pattern = bytes((i * 37 + 11) & 0xFF for i in range(CHUNK))
    window = engine.probe_window_retention(pattern)
    if window == pattern:
        return True, "the window keeps data loaded before a transmit-only transaction"
    return False, "the window lost data loaded before a transmit-only transaction: " + _first_difference(window, pattern)


def _measure_landing(engine: "RomSw") -> tuple[float, str]:
    """The longest SPI time a STATUS read sent right after CNTL already finds done."""
    lo, hi = 0, 256                    # RX data bytes of the probing status read (wire = 1 + n)
    if not engine.probe_done_at_once(lo):
        return 0.0, "a read reaches the board at once: no landing delay to credit (none used)"
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if engine.probe_done_at_once(mid):
            lo = mid
        else:
            hi = mid - 1
    credit = engine.spi_estimate(1 + lo, margin=False) * 0.95
    return credit, f"a read reaches the board at least {credit * 1e6:.0f} µs after it is sent"
