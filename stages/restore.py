"""Stage: put back every register a run changed — at the end of the run, on every exit path,
and at the start of the next run on the same board when an earlier one could not (its
host was killed, its USB link was lost).

The registers a run may leave changed are the ROM_SW engine's (SPI pads, page mirror,
ROM_CNTL, the command register) and the aperture's (ROM_CNTL, ROM_INDEX). Status, control
and PSP mailbox registers are never written back: a write to ROM_SW_CNTL starts an SPI
transaction and a write to C2PMSG sends a PSP command.
"""
from __future__ import annotations

import json

from amdflash.stages.device import Device
from amdflash.stages.diagnostics import record_diagnostics
from amdflash.stages.drivers.navi31 import regs as R
from amdflash.stages.snapshot import record_stage, snapshot_registers

# In the order they are put back: the pads are handed back to the board last.
RESTORABLE = (R.ROM_SW_COMMAND, R.ROM_CNTL, R.ROM_INDEX, R.PAGE_MIRROR_CNTL,
              R.GPIOPAD_A, R.GPIOPAD_EN, R.GPIOPAD_MASK)
NAMES = {R.ROM_SW_COMMAND: "ROM_SW_COMMAND", R.ROM_CNTL: "ROM_CNTL", R.ROM_INDEX: "ROM_INDEX",
         R.PAGE_MIRROR_CNTL: "PAGE_MIRROR_CNTL", R.GPIOPAD_A: "GPIOPAD_A", R.GPIOPAD_EN: "GPIOPAD_EN",
         R.GPIOPAD_MASK: "GPIOPAD_MASK"}
_RESTORABLE = frozenset(RESTORABLE)

# The bits amdflash's own paths change in each register (anything for the command and
# index registers). A difference outside them was made by something else since.
_OUR_BITS = {R.GPIOPAD_MASK: R.SPI_PAD_BITS, R.GPIOPAD_A: R.SPI_PAD_BITS, R.GPIOPAD_EN: R.SPI_PAD_BITS,
             R.PAGE_MIRROR_CNTL: 0x0E000000, R.ROM_CNTL: 0x1F00000F,
             R.ROM_SW_COMMAND: 0xFFFFFFFF, R.ROM_INDEX: 0xFFFFFFFF}


class LedgerBar:
    """The run's BAR, remembering the last value that reached each register the run may
    leave changed — so that a run that cannot restore can say which ones it left."""

    def __init__(self, bar) -> None:
        self.inner = bar
        self.clock = bar.clock
        self.identity = bar.identity
        self.read32 = bar.read32
        self.read_block = bar.read_block
        self.written: dict[int, int] = {}    # register -> last value written successfully
        self.doubtful: set[int] = set()      # a later write failed: it may or may not have landed

    def write32(self, offset: int, value: int) -> None:
        if offset not in _RESTORABLE:
            self.inner.write32(offset, value)
            return
        self.doubtful.add(offset)
        self.inner.write32(offset, value)
        self.written[offset] = value & 0xFFFFFFFF
        self.doubtful.discard(offset)

    def write_block(self, offset: int, data: bytes) -> None:
        touched = [r for r in _RESTORABLE if offset <= r < offset + len(data)]
        self.doubtful.update(touched)
        self.inner.write_block(offset, data)
        for r in touched:
            self.written[r] = int.from_bytes(data[r - offset:r - offset + 4], "little")
            self.doubtful.discard(r)

    @property
    def restoring(self) -> bool:
        return getattr(self.inner, "restoring", False)

    @restoring.setter
    def restoring(self, value: bool) -> None:
        if hasattr(self.inner, "restoring"):
            self.inner.restoring = value

    def close(self) -> None:
        self.inner.close()


class RegistersLeftChanged(RuntimeError):
    """The run could not put its registers back (or could not check that it did)."""


def left_changed(dev: Device) -> dict[int, tuple[int, int, bool]]:
    """register -> (value last written, value it should hold, whether a later write failed)."""
    truth = dev.registers_truth
    bar = dev.bar
    if not isinstance(bar, LedgerBar):
        return {}
    return {r: (v, truth[r], r in bar.doubtful) for r, v in bar.written.items() if r in truth and v != truth[r]}


def describe_left(dev: Device) -> str:
    left = left_changed(dev)
    if not left:
        what = "registers may be left changed"
    else:
        what = "left changed: " + ", ".join(
            f"{NAMES[r]}={v:#010x}{'?' if doubt else ''} (should be {t:#010x})"
            for r, (v, t, doubt) in sorted(left.items(), key=lambda x: RESTORABLE.index(x[0])))
        if any(doubt for _, _, doubt in left.values()):
            what += " (?: the write putting it back failed and may not have landed)"
    # The engine hands its own command builder down (dev.suggest), so the step reaches the
    # run's audit database; without one, the bare command.
    return (f"{what}; the next amdflash run on this board puts them back "
            f"(or run: {dev.suggest('restore', '--board', dev.identity.spec)})")


def restore_registers(dev: Device) -> str:
    """Close the engine (restores pads, page mirror, ROM_CNTL), then snapshot the result.

    The "after restore" snapshot is the record that the run left the board as it found
    it; without it the next run on the board puts the registers back itself."""
    notes = []
    failure: Exception | None = None
    if dev.romsw is not None:
        # Putting the board back matters more than recording that we did: the restore's
        # writes go out even if the audit trail is down (they are recorded while it is not).
        if hasattr(dev.bar, "restoring"):
            dev.bar.restoring = True
        try:
            dev.romsw.close()
            notes.append("ROM_SW engine registers restored")
        except Exception as e:
            failure = e
        if dev.recorder.failed:
            notes.append("audit trail down: restore not recorded")
    try:
        snapshot_registers(dev, "after restore")
    except Exception as e:
        if failure is None and isinstance(dev.bar, LedgerBar) and not left_changed(dev):
            # Nothing of ours to put back (a PSP job, say): only the check could not be read.
            record_diagnostics(dev)
            return f"no register left changed (the post-restore snapshot failed: {e})"
        failure = failure or e
    record_diagnostics(dev)
    if failure is not None:
        raise RegistersLeftChanged(f"registers not put back ({failure}): {describe_left(dev)}")
    return "; ".join(notes) or "nothing to restore"


def _ours(register: int, found: int, truth: int) -> bool:
    if register == R.ROM_CNTL and found in (_bswap(truth), _bswap(truth | R.ROM_CNTL_AUTO_INCREMENT)):
        return True   # the aperture path writes ROM_CNTL byte-swapped
    return not (found ^ truth) & ~_OUR_BITS[register] & 0xFFFFFFFF


def _bswap(value: int) -> int:
    return int.from_bytes((value & 0xFFFFFFFF).to_bytes(4, "little"), "big")


def put_back(dev: Device, run_id: str, truth: dict[int, int], why: str) -> list[str]:
    """Before this run touches anything: put back the registers run `run_id` left changed
    (`truth`: its values as found). Recorded; returns lines for the operator.

    Nothing is written when the registers already hold those values (the board was reset
    since), nor when they differ in bits amdflash never changes (something else has set
    the board up since: its values are the truth now)."""
    found = snapshot_registers(dev, "found")
    record_stage(dev, "restore_stranded", "start", json.dumps({"run": run_id}))
    changed = [r for r in RESTORABLE if r in truth and found[r] != truth[r]]
    if not changed:
        record_stage(dev, "restore_stranded", "end", json.dumps({"run": run_id, "put_back": {}}))
        return [f"registers already as found before run {run_id} ({why}): nothing to put back"]
    foreign = [NAMES[r] for r in changed if not _ours(r, found[r], truth[r])]
    if foreign:
        record_stage(dev, "restore_stranded", "end", json.dumps({"run": run_id, "put_back": {},
                                                                  "changed_since": foreign}))
        return [f"warning: run {run_id} ({why}) did not put its registers back, but {', '.join(foreign)} "
                "have been changed by something else since; taking the registers as found"]
    dev.recorder.durable()   # on record before the first write, like every run's own changes
    for r in changed:
        dev.bar.write32(r, truth[r])
    now = {r: dev.bar.read32(r) for r in changed}
    wrong = [NAMES[r] for r in changed if now[r] != truth[r]]
    if wrong:
        raise RegistersLeftChanged(f"putting back the registers run {run_id} left changed did not take: "
                                   f"{', '.join(wrong)} read back wrong")
    done = {NAMES[r]: [f"{found[r]:#010x}", f"{truth[r]:#010x}"] for r in changed}
    record_stage(dev, "restore_stranded", "end", json.dumps({"run": run_id, "put_back": done}))
    return [f"put back the registers run {run_id} left changed ({why}): "
            + ", ".join(f"{name} {was} -> {now_}" for name, (was, now_) in done.items())]
