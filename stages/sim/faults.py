"""Fault injection for the emulated board: parsed from `--fault SPEC`, persisted with it.

Every fault is deterministic for a given board seed, so a failing test replays exactly.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from amdflash.stages.drivers.flash.geometry import FLASH_SIZE, SECTOR

FAULT_HELP = """\
read-flip=P             flip one bit of a byte read from the flash (ROM_SW RX or ROM aperture)
                        with probability P per byte (transient)
stuck-bit=ADDR[:BIT]    that flash bit stays 1 (default bit 0): programming it to 0 fails
weak-bit=ADDR[:BIT]     that flash bit stays 1 the first time a program would clear it (a weak cell;
                        programming it again takes, once)
erase-fail=SECTOR       erasing that 4 KiB sector (by index) silently does nothing
slow-busy=F             programs, erases and status writes take F (>= 1) times their typical time,
                        at most the datasheet maximum: a slower part within specification
stall-after=N           the ROM_SW engine stops completing after N transactions
silent-rx=P             an RX transaction ends (STATUS shows done) without having run, with probability P:
                        the chip hears nothing and the capture and the data window keep what they held
stale-done=P            a write of 0 to ROM_SW_STATUS is lost with probability P: the done bit of the
                        transaction before stays set
busy-read=ADDR[:N]      the first array read of the 4 KiB unit at ADDR finds the chip busy (a program or
                        erase it is still doing) for N transactions (default 16: a whole read of the unit):
                        it ignores them, reads come back all 0xFF and status reads show WIP (once)
usb-disconnect-after=N  the USB bridge disappears after N USB transfers
kill-after-writes=N     the host process dies at its Nth register write (one-shot, as on power loss)
psp-error=CMD:CODE      the PSP answers mailbox command CMD with error CODE
Counted faults (N) count from board creation, or from when 'sim fault' set them."""


class FaultSpecError(ValueError):
    pass


def _int(text: str, what: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise FaultSpecError(f"{what}: {text!r} is not a number") from None


def _float(text: str, name: str, lo: float, hi: float, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise FaultSpecError(f"{name}: {text!r} is not a {what}") from None
    if not lo <= value <= hi:
        raise FaultSpecError(f"{name}: {what} {value:g} is outside {lo:g}..{hi:g}")
    return value


def _address_and(value: str, name: str, what: str, lo: int, hi: int, default: int) -> tuple[int, int]:
    """ADDR[:N]: a flash address and a number in lo..hi (`default` when left out)."""
    addr_text, _, n_text = value.partition(":")
    addr = _int(addr_text, f"{name} address")
    n = _int(n_text, f"{name} {what}") if n_text else default
    if not 0 <= addr < FLASH_SIZE or not lo <= n <= hi:
        raise FaultSpecError(f"{name}: {value!r} is outside the 2 MiB flash or {what} {lo}..{hi}")
    return addr, n


@dataclass
class Faults:
    read_flip: float = 0.0
    stuck_bits: list[tuple[int, int]] = field(default_factory=list)   # (address, bit)
    erase_fail: list[int] = field(default_factory=list)               # sector indices
    stall_after: int | None = None
    usb_disconnect_after: int | None = None
    kill_after_writes: int | None = None
    psp_errors: dict[int, int] = field(default_factory=dict)          # command -> error code
    slow_busy: float = 1.0                                            # busy time factor
    silent_rx: float = 0.0                    # probability an RX transaction ends without running
    stale_done: float = 0.0                   # probability a write of 0 to ROM_SW_STATUS is lost
    busy_read: tuple[int, int] | None = None  # (unit address, transactions the chip stays busy)
    weak_bit: tuple[int, int] | None = None   # (address, bit) that fails its first program

    @classmethod
    def parse(cls, specs: list[str]) -> Faults:
        faults = cls()
        for spec in specs:
            faults.add(spec)
        return faults

    def add(self, spec: str) -> None:
        name, sep, value = spec.partition("=")
        if not sep or not value:
            raise FaultSpecError(f"fault {spec!r}: expected NAME=VALUE\n{FAULT_HELP}")
        if name == "read-flip":
            self.read_flip = _float(value, name, 0.0, 1.0, "probability")
        elif name == "stuck-bit":
            addr, bit = _address_and(value, name, "bit", 0, 7, 0)
            self.stuck_bits.append((addr, bit))
        elif name == "weak-bit":
            self.weak_bit = _address_and(value, name, "bit", 0, 7, 0)
        elif name == "slow-busy":
            self.slow_busy = _float(value, name, 1.0, 100.0, "factor")
        elif name in ("silent-rx", "stale-done"):
            setattr(self, name.replace("-", "_"), _float(value, name, 0.0, 1.0, "probability"))
        elif name == "busy-read":
            addr, count = _address_and(value, name, "transactions", 1, 1_000_000, 16)
            self.busy_read = (addr // SECTOR * SECTOR, count)
        elif name == "erase-fail":
            sector = _int(value, "erase-fail sector")
            if not 0 <= sector < FLASH_SIZE // SECTOR:
                raise FaultSpecError(f"erase-fail: sector {sector} is outside 0..511")
            self.erase_fail.append(sector)
        elif name in ("stall-after", "usb-disconnect-after", "kill-after-writes"):
            n = _int(value, name)
            if n < 0 or (name == "kill-after-writes" and n < 1):
                raise FaultSpecError(f"{name}: {n} is out of range")
            setattr(self, name.replace("-", "_"), n)
        elif name == "psp-error":
            cmd_text, sep2, code_text = value.partition(":")
            if not sep2:
                raise FaultSpecError("psp-error: expected CMD:CODE, e.g. psp-error=0x8:0xC")
            cmd, code = _int(cmd_text, "psp-error command"), _int(code_text, "psp-error code")
            if not 0 <= cmd <= 0xFF or not 1 <= code <= 0xFFFF:
                raise FaultSpecError(f"psp-error: {value!r} out of range")
            self.psp_errors[cmd] = code
        else:
            raise FaultSpecError(f"unknown fault {name!r}; known faults:\n{FAULT_HELP}")

    def to_json(self) -> dict:
        return {
            "read_flip": self.read_flip,
            "stuck_bits": [list(x) for x in self.stuck_bits],
            "erase_fail": list(self.erase_fail),
            "stall_after": self.stall_after,
            "usb_disconnect_after": self.usb_disconnect_after,
            "kill_after_writes": self.kill_after_writes,
            "psp_errors": {str(k): v for k, v in self.psp_errors.items()},
            "slow_busy": self.slow_busy,
            "silent_rx": self.silent_rx,
            "stale_done": self.stale_done,
            "busy_read": list(self.busy_read) if self.busy_read else None,
            "weak_bit": list(self.weak_bit) if self.weak_bit else None,
        }

    @classmethod
    def from_json(cls, data: dict) -> Faults:
        return cls(
            read_flip=float(data.get("read_flip", 0.0)),
            stuck_bits=[(int(a), int(b)) for a, b in data.get("stuck_bits", [])],
            erase_fail=[int(s) for s in data.get("erase_fail", [])],
            stall_after=data.get("stall_after"),
            usb_disconnect_after=data.get("usb_disconnect_after"),
            kill_after_writes=data.get("kill_after_writes"),
            psp_errors={int(k): int(v) for k, v in data.get("psp_errors", {}).items()},
            slow_busy=float(data.get("slow_busy", 1.0)),
            silent_rx=float(data.get("silent_rx", 0.0)),
            stale_done=float(data.get("stale_done", 0.0)),
            busy_read=(int(data["busy_read"][0]), int(data["busy_read"][1])) if data.get("busy_read") else None,
            weak_bit=(int(data["weak_bit"][0]), int(data["weak_bit"][1])) if data.get("weak_bit") else None,
        )

    def describe(self) -> list[str]:
        out = []
        if self.read_flip:
            out.append(f"read-flip={self.read_flip}")
        out += [f"stuck-bit={a:#x}:{b}" for a, b in self.stuck_bits]
        out += [f"erase-fail={s}" for s in self.erase_fail]
        for name in ("stall_after", "usb_disconnect_after", "kill_after_writes"):
            if getattr(self, name) is not None:
                out.append(f"{name.replace('_', '-')}={getattr(self, name)}")
        out += [f"psp-error={c:#x}:{e:#x}" for c, e in self.psp_errors.items()]
        if self.slow_busy != 1.0:
            out.append(f"slow-busy={self.slow_busy:g}")
        out += [f"{n}={getattr(self, n.replace('-', '_'))}" for n in ("silent-rx", "stale-done")
                if getattr(self, n.replace("-", "_"))]
        if self.busy_read:
            out.append(f"busy-read={self.busy_read[0]:#x}:{self.busy_read[1]}")
        if self.weak_bit:
            out.append(f"weak-bit={self.weak_bit[0]:#x}:{self.weak_bit[1]}")
        return out
