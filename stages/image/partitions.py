"""The IFWI's partitions and the VBIOS in each, walked as fwupd's amd-gpu plugin walks them.

    EFS (AA 55 AA 55; $PSP directory pointer at 0x14)
    → L1 $PSP directory (16-byte header: cookie, checksum, entry count, reserved;
      16-byte entries: fw id, size, 64-bit location)
    → an image slot header (ISH) per entry: fw id 0x13C is ISH_A, 0x13D ISH_B
    → the slot header names its partition (fw id at +0xD: 0x14D partition A, 0x14E
      partition B), the partition's location (+0x10) and size (+0x18), and where the
      partition's ATOM ("CSM") image starts (+0x1C, an offset into the whole IFWI)
    → the partition starts with an L2 $PSP directory.

The part number an image is *for* is the one fwupd checks: ISH_A → partition A → its ATOM
image ("we will always flash the contents of partition A").

Where this walker is more lenient than fwupd it says so in `notes`: fwupd refuses an image
whose L1 directory holds anything but ISH entries, and one in which any partition's ATOM
image fails to parse; here other L1 entries are skipped and each partition's problem is
kept with that partition, so that a damaged board still tells what it can. The slot-header
checksum (+0) and PSP id (+0x14) are read but not checked: no public source says how.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field, replace

from amdflash.stages.image.atom import AtomError, AtomImage, Source, parse_atom, take

EFS_MAGIC = b"\xaa\x55\xaa\x55"
EFS_BYTES = 0x54
EFS_PSP_DIRECTORY = 0x14
PSP_COOKIE = b"$PSP"
DIRECTORY_HEADER = struct.Struct("<4sIII")       # cookie, checksum, entry count, reserved
DIRECTORY_ENTRY = struct.Struct("<IIQ")          # fw id, size, location
MAX_L1_ENTRIES = 64                              # a real L1 holds two; more is junk, not a directory

ISH_FW_IDS = {0x13C: "ISH_A", 0x13D: "ISH_B"}
PARTITION_FW_IDS = {0x14D: "A", 0x14E: "B"}
ISH_BYTES = 0x20
ISH = struct.Struct("<IIIBHBIIII")               # checksum, boot priority, update retries, glitch
#                                                  retries, partition fw id, reserved, location,
#                                                  PSP id, slot max size, ATOM (CSM) location


class LayoutError(ValueError):
    """An image whose partitions cannot be found, naming the step and the offset."""


@dataclass(frozen=True)
class Slot:
    ish: str                  # ISH_A | ISH_B
    header_at: int
    partition: str | None     # A | B, from the slot's partition fw id; None when unknown
    partition_fw_id: int
    location: int
    size: int
    csm_at: int
    priority: int
    update_retries: int
    l2_entries: int | None = None
    atom: AtomImage | None = None
    problem: str | None = None   # why the partition or its ATOM image could not be read

    def payload(self, src: Source) -> bytes:
        return take(src, self.location, self.size, f"partition {self.partition or '?'}", LayoutError)


@dataclass(frozen=True)
class Layout:
    psp_directory: int
    slots: tuple[Slot, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)

    def slot(self, ish: str) -> Slot | None:
        return next((s for s in self.slots if s.ish == ish), None)

    def image_vbios(self) -> AtomImage:
        """The ATOM image fwupd takes the part number from: ISH_A → partition A → its CSM."""
        slot = self.slot("ISH_A")
        if slot is None:
            raise LayoutError(f"the L1 directory at {self.psp_directory:#x} has no ISH_A entry (fw id 0x13c)")
        if slot.partition != "A":
            raise LayoutError(f"ISH_A at {slot.header_at:#x} names partition fw id {slot.partition_fw_id:#x}, "
                              "not partition A (0x14d)")
        if slot.atom is None:
            raise LayoutError(f"partition A (ISH_A at {slot.header_at:#x}): {slot.problem}")
        return slot.atom

    def describe(self) -> list[str]:
        lines = [f"L1 $PSP directory at {self.psp_directory:#x}"]
        for s in self.slots:
            lines.append(f"{s.ish} at {s.header_at:#x}: partition {s.partition or f'fw id {s.partition_fw_id:#x}'} "
                         f"at {s.location:#x} ({s.size:#x} bytes), boot priority {s.priority}, "
                         f"update retries {s.update_retries}, ATOM image at {s.csm_at:#x}")
            if s.atom is not None:
                lines += ["    " + line for line in s.atom.describe()]
            else:
                lines.append(f"    no part number: {s.problem}")
        return lines + [f"note: {n}" for n in self.notes]


def shown(raw: bytes) -> str:
    """Bytes read where a marker was expected, in words: hex, and 'erased' when all FF."""
    text = raw.hex(" ")
    if raw and raw == b"\xff" * len(raw):
        return f"{text}, erased"
    if raw and all(32 <= b < 127 for b in raw):
        return f"{text}, '{raw.decode('ascii')}'"
    return text


def read_layout(src: Source) -> Layout:
    """Every ISH in the L1 directory, its partition and the ATOM image in it."""
    efs = take(src, 0, EFS_BYTES, "the EFS", LayoutError)
    if efs[:4] != EFS_MAGIC:
        raise LayoutError(f"no IFWI: the EFS at 0 starts {efs[:4].hex(' ')}, expected aa 55 aa 55")
    directory = struct.unpack_from("<I", efs, EFS_PSP_DIRECTORY)[0]
    cookie, _, count, _ = DIRECTORY_HEADER.unpack(take(src, directory, DIRECTORY_HEADER.size,
                                                       "the L1 $PSP directory", LayoutError))
    if cookie != PSP_COOKIE:
        raise LayoutError(f"no $PSP directory at {directory:#x} (EFS pointer at {EFS_PSP_DIRECTORY:#x}): "
                          f"its first bytes read {shown(cookie)}, expected '$PSP'")
    if count > MAX_L1_ENTRIES:
        raise LayoutError(f"the L1 $PSP directory at {directory:#x} claims {count} entries "
                          f"(more than {MAX_L1_ENTRIES}: not a directory)")
    table = take(src, directory + DIRECTORY_HEADER.size, count * DIRECTORY_ENTRY.size,
                 f"the {count} entries of the L1 $PSP directory", LayoutError)
    slots: list[Slot] = []
    notes: list[str] = []
    for i, (fw_id, _, location) in enumerate(DIRECTORY_ENTRY.iter_unpack(table)):
        name = ISH_FW_IDS.get(fw_id)
        if name is None:
            notes.append(f"L1 entry {i} has fw id {fw_id:#x}, not an image slot header: skipped "
                         "(fwupd refuses such an image)")
        elif any(s.ish == name for s in slots):
            notes.append(f"L1 entry {i} is a second {name}: ignored")
        else:
            slots.append(_slot(src, name, location))
    if not slots:
        raise LayoutError(f"the L1 $PSP directory at {directory:#x} has no image slot header (ISH_A/ISH_B)")
    return Layout(directory, tuple(slots), tuple(notes))


def _slot(src: Source, name: str, at: int) -> Slot:
    raw = take(src, at, ISH_BYTES, f"{name}'s slot header", LayoutError)
    _, priority, retries, _, fw_id, _, location, _, size, csm = ISH.unpack(raw)
    slot = Slot(name, at, PARTITION_FW_IDS.get(fw_id), fw_id, location, size, csm, priority, retries)
    if slot.partition is None:
        return replace(slot, problem=f"{name} names partition fw id {fw_id:#x} (known: 0x14d A, 0x14e B)")
    try:
        cookie, _, entries, _ = DIRECTORY_HEADER.unpack(
            take(src, location, DIRECTORY_HEADER.size, f"partition {slot.partition}'s L2 directory", LayoutError))
        if cookie != PSP_COOKIE:
            raise LayoutError(f"partition {slot.partition} at {location:#x} does not start with a $PSP "
                              f"directory (its first bytes read {shown(cookie)})")
        if DIRECTORY_HEADER.size + entries * DIRECTORY_ENTRY.size > size:
            raise LayoutError(f"partition {slot.partition}'s L2 directory claims {entries} entries, more than "
                              f"its {size:#x} bytes hold")
        return replace(slot, l2_entries=entries, atom=parse_atom(src, csm))
    except (AtomError, LayoutError) as e:
        return replace(slot, problem=str(e))

