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
  window in ascending order, sent only when the transaction must have ended by safe bounds
  (the CNTL write's return, the SPI time's upper bound; never the link's latency): STATUS
  in it must then show done, and one that does not turns the path off for the board;
* no CNTL clears — the reference writes CNTL = 0 (an opcode-only transaction) around each
  transaction; without them, a transaction is STATUS = 0, COMMAND, data, CNTL;
* streamed command — STATUS, COMMAND, the reserved dword (written back as read) and the TX
  data in one streamed write; COMMAND is not written again when it holds the value already.

The first five are checked by reading the same bytes (SFDP header, JEDEC, one 4 KiB unit)
the validated way and the fast way (and the combined read also by every STATUS it reads
showing done). One more is checked otherwise:

* preload — the next page's data is loaded into the window while the chip programs the
  previous one (the engine is idle then). Checked by loading a pattern into the window
  with a transmit-only transaction and reading it back: the window must keep it (a status
  read would not: its RX capture lands in the window, so nothing may read between);

and one by its result, as it writes: timed pages — page programs follow the chip's typical
busy time without a status read in between; the read-back of every written unit checks
them, and a unit that needs a retry turns the board to checked programming.

Not a fast path, on purpose: sending the observing read before the transaction can have
ended, counting on the link's latency to make it land late enough ("early observe", once
here). A latency measured at open is no bound — the host may be delayed while it is
measured, the link may be faster later — and a read that lands early has already spoiled
the transaction by the time its STATUS says so.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING

from amdflash.stages.drivers.navi31.request import Request

if TYPE_CHECKING:
    from amdflash.stages.drivers.navi31.romsw import RomSw


@dataclass(frozen=True)
class FastPaths:
    chained: bool = True
    single_tlp: bool = True
    combined_read: bool = True
    no_cntl_clears: bool = True
    streamed_command: bool = True
    preload: bool = True
    timed_pages: bool = True

    def describe(self) -> str:
        on = [f.name.replace("_", " ") for f in fields(self) if getattr(self, f.name)]
        off = [f.name.replace("_", " ") for f in fields(self) if not getattr(self, f.name)]
        return f"on: {', '.join(on) or 'none'}; off: {', '.join(off) or 'none'}"


VALIDATED = FastPaths(chained=False, single_tlp=False, combined_read=False, no_cntl_clears=False,
                      streamed_command=False, preload=False, timed_pages=False)
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


def sample(engine: RomSw) -> bytes:
    """The bytes the self-check compares, read with the engine's current settings."""
    requests = [Request(*SFDP_HEADER), Request(*JEDEC)]
    requests += [Request(0x03, a, 3, CHUNK) for a in range(UNIT_ADDRESS, UNIT_ADDRESS + UNIT_SIZE, CHUNK)]
    return b"".join(engine.read_chain(requests))


def check(engine: RomSw, wanted: FastPaths) -> list[Finding]:
    """Validate the `wanted` fast paths on this board; leaves `engine.fast` set to the ones
    that passed and returns a finding per fast path."""
    findings: list[Finding] = []
    engine.fast = replace(VALIDATED)
    baseline = sample(engine)
    candidates = [n for n in COMPARED if getattr(wanted, n)]
    running = engine.found_running
    accepted = _compare(engine, baseline, candidates, findings)
    if "combined_read" in accepted and engine.found_running > running:
        # The bytes agreed only because the driver took them again; on hardware each such
        # read spoiled a transaction.
        accepted.remove("combined_read")
        findings[:] = [f for f in findings if f.name != label("combined_read")]
        findings.append(Finding(label("combined_read"), False, "a read of STATUS and the window found a "
                                "transaction still running after its SPI time's bound"))
    engine.fast = replace(VALIDATED, **{n: True for n in accepted})
    if wanted.preload:
        engine.fast = replace(engine.fast, preload=True)
        ok, detail = _check_preload(engine)
        engine.fast = replace(engine.fast, preload=ok)
        findings.append(Finding("preload", ok, detail))
    engine.fast = replace(engine.fast, timed_pages=wanted.timed_pages)
    if wanted.timed_pages:
        findings.append(Finding("timed pages", True, "checked by the read-back of every written unit"))
    return findings


def _compare(engine: RomSw, baseline: bytes, candidates: list[str], findings: list[Finding]) -> list[str]:
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
        findings += [Finding(label(n), True, "agrees with the validated sequence") for n in candidates]
        return candidates
    accepted = []
    for name in candidates:
        got = sample_with([name])
        if got == baseline:
            accepted.append(name)
            findings.append(Finding(label(name), True, "agrees with the validated sequence"))
        else:
            findings.append(Finding(label(name), False,
                                    "disagrees with the validated sequence: " + _first_difference(got, baseline)))
    if accepted and sample_with(accepted) != baseline:
        findings += [Finding(label(n), False, "agrees alone but not with the others") for n in accepted]
        accepted = []
    return accepted


def label(name: str) -> str:
    """A fast path's name as findings and the console say it."""
    return {"chained": "chained RX", "single_tlp": "single-TLP register access",
            "combined_read": "status and window in one read", "no_cntl_clears": "no CNTL clears",
            "streamed_command": "streamed command"}.get(name, name.replace("_", " "))


def _first_difference(got: bytes, want: bytes) -> str:
    if len(got) != len(want):
        return f"{len(got)} bytes read, {len(want)} expected"
    i = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
    where = "SFDP header" if i < 16 else "JEDEC id" if i < 20 else f"unit byte {i - 20:#x}"
    return f"{where}: {got[i]:#04x} instead of {want[i]:#04x}"


def _check_preload(engine: RomSw) -> tuple[bool, str]:
    pattern = bytes((i * 37 + 11) & 0xFF for i in range(CHUNK))
    window = engine.probe_window_retention(pattern)
    if window == pattern:
        return True, "the window keeps data loaded before a transmit-only transaction"
    return False, ("the window lost data loaded before a transmit-only transaction: "
                   + _first_difference(window, pattern))

