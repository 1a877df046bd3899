"""Stage: put back every register the job changed. Runs on every exit path, audited."""
from __future__ import annotations

from amdflash.stages.device import Device
from amdflash.stages.diagnostics import record_diagnostics
from amdflash.stages.snapshot import snapshot_registers


def restore_registers(dev: Device) -> str:
    """Close the engine (restores pads, page mirror, ROM_CNTL), then snapshot the result."""
    notes = []
    if dev.romsw is not None:
        # Putting the board back matters more than recording that we did: the restore's
        # writes go out even if the audit trail is down (they are recorded while it is not).
        if hasattr(dev.bar, "restoring"):
            dev.bar.restoring = True
        dev.romsw.close()
        notes.append("ROM_SW engine registers restored")
        if dev.recorder.failed:
            notes.append("audit trail down: restore not recorded")
    try:
        snapshot_registers(dev, "after restore")
    except Exception as e:  # noqa: BLE001 - a failing transport must not hide the job's own error
        notes.append(f"post-restore snapshot failed: {e}")
    record_diagnostics(dev)
    return "; ".join(notes) or "nothing to restore"
