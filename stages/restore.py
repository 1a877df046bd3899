"""Stage: put back every register the job changed. Runs on every exit path, audited."""
from __future__ import annotations

from stages.device import Device
from stages.snapshot import snapshot_registers


def restore_registers(dev: Device) -> str:
    """Close the engine (restores pads, page mirror, ROM_CNTL), then snapshot the result."""
    notes = []
    if dev.romsw is not None:
        if dev.recorder.failed:
            # The audit trail is down and the audited path refuses writes; putting the board
            # back matters more than recording that we did.
            dev.romsw.bar = getattr(dev.bar, "raw", dev.bar)
            notes.append("audit trail down: restore not recorded")
        dev.romsw.close()
        notes.append("ROM_SW engine registers restored")
    try:
        snapshot_registers(dev, "after restore")
    except Exception as e:  # noqa: BLE001 - a failing transport must not hide the job's own error
        notes.append(f"post-restore snapshot failed: {e}")
    return "; ".join(notes) or "nothing to restore"
