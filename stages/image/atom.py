"""ATOM VBIOS images: the option ROM each IFWI partition carries, and the part number in it.

The field positions are public facts: the PCI option-ROM header (55 AA, size in 512-byte
blocks at 2, the PCI data structure "PCIR" through the pointer at 0x18), the ATOM offsets
amdgpu's `atomfirmware.h` names (string count at 0x2F, string pointer at 0x6E, ATOM ROM
header pointer at 0x48, build date at 0x50, part number fallback at 0x80) and the ATOM ROM
header (`ATOM_ROM_HEADER`: "ATOM" at +4, subsystem vendor and id at +0x18 and +0x1A).

The strings are read the way fwupd's amd-gpu plugin reads them, because its comparison is
the one users know: up to four NUL-terminated strings of at most 31 characters (part number,
ASIC, PCI type, memory type), then CR LF and the model name (at most 63 characters); the
version is what follows the anchor "ATOMBIOSBK-AMD VER". fwupd compares the first ten
characters of the part number; the third '-'-separated field is the VBIOS version
("113-D7040100-114" → key "113-D70401", version "114").

Parsing goes through a `Source` (offset, size → bytes), so the same code reads an image
file or, with a few targeted reads, a board's flash. Every way the bytes can be wrong is an
`AtomError` naming the offset; nothing else escapes, whatever the bytes.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Protocol
from collections.abc import Callable

OPTION_ROM_MAGIC = b"\x55\xaa"
IBM = b"IBM"
IBM_AT = 0x1E
PCIR_POINTER = 0x18
PCIR = b"PCIR"
NUM_STRINGS = 0x2F
ATI_MAGIC_AT, ATI_MAGIC = 0x30, b" 761295520"   # checked by amdgpu's atom parser, not by fwupd
ROM_HEADER_POINTER = 0x48
DATE_AT, DATE_BYTES = 0x50, 18                   # "MM/DD/YY HH:MM:SS\0"
STRINGS_POINTER = 0x6E
HEAD_BYTES = 0x74
ATOM = b"ATOM"
ROM_HEADER_BYTES = 0x28
ROM_SUBSYSTEM_VENDOR, ROM_SUBSYSTEM_ID = 0x18, 0x1A

MAX_STRINGS = 4
STRING_MAX = 31
NAME_MAX = 63
VERSION_ANCHOR = b"ATOMBIOSBK-AMD VER"
VERSION_MAX = 43
VERSION_WINDOW = (3, 1024)                       # where the kernel looks when the pointers do not say
PART_KEY_LENGTH = 10

_U16 = struct.Struct("<H")


class AtomError(ValueError):
    """Bytes that are not an ATOM VBIOS image fwupd could read a part number from."""


class Source(Protocol):
    """Bytes by offset: an image in memory, or a board's flash read on demand."""

    size: int

    def read(self, at: int, count: int) -> bytes:
        """Up to `count` bytes at `at` (fewer at the end, none outside)."""
        ...


class BytesSource:
    def __init__(self, data: bytes):
        self.data = data
        self.size = len(data)

    def read(self, at: int, count: int) -> bytes:
        if at < 0 or count <= 0:
            return b""
        return bytes(self.data[at:at + count])


class UnitSource:
    """A flash read in whole units on demand and kept: a parser's small reads cost one unit
    read each the first time, nothing after."""

    def __init__(self, read_unit: Callable[[int, int], bytes], size: int, unit: int = 0x1000):
        self._read_unit = read_unit
        self.size = size
        self.unit = unit
        self.units: dict[int, bytes] = {}

    def read(self, at: int, count: int) -> bytes:
        if at < 0 or count <= 0 or at >= self.size:
            return b""
        end = min(at + count, self.size)
        out = bytearray()
        for base in range(at - at % self.unit, end, self.unit):
            if base not in self.units:
                self.units[base] = self._read_unit(base, min(self.unit, self.size - base))
            out += self.units[base]
        start = at % self.unit
        return bytes(out[start:start + end - at])


def take(src: Source, offset: int, size: int, what: str, error: type[ValueError] = AtomError) -> bytes:
    """Exactly `size` bytes at `offset`, or an error naming what lies beyond the source."""
    data = src.read(offset, size) if 0 <= offset else b""
    if len(data) != size:
        raise error(f"{what} ({size:#x} bytes at {offset:#x}) lies beyond the {src.size:#x}-byte source")
    return data


def part_key(part_number: str) -> str:
    """What fwupd compares: the first ten characters of the part number."""
    return part_number[:PART_KEY_LENGTH]


def same_part(a: str, b: str) -> bool:
    return part_key(a) == part_key(b)


def part_version(part_number: str) -> str | None:
    """The VBIOS version fwupd takes from a part number: its third '-'-separated field."""
    fields = part_number.split("-")
    return fields[2] if len(fields) >= 3 else None


@dataclass(frozen=True)
class AtomImage:
    offset: int                       # where the image starts in its source
    size: int                         # declared size (byte 2 × 512)
    part_number: str
    asic: str | None = None
    pci_type: str | None = None
    memory_type: str | None = None
    model_name: str | None = None
    version: str | None = None        # after "ATOMBIOSBK-AMD VER"
    date: str | None = None           # "20YY/MM/DD HH:MM", as amdgpu and fwupd print it
    vendor_id: int | None = None      # from PCIR
    device_id: int | None = None
    subsystem_vendor_id: int | None = None   # from the ATOM ROM header
    subsystem_id: int | None = None
    rom_header: int = 0               # offset of the ATOM ROM header inside the image
    ati_magic: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def key(self) -> str:
        return part_key(self.part_number)

    @property
    def pn_version(self) -> str | None:
        return part_version(self.part_number)

    def describe(self) -> list[str]:
        ids = "unknown"
        if self.vendor_id is not None:
            ids = f"{self.vendor_id:04x}:{self.device_id:04x}"
        sub = "unknown"
        if self.subsystem_vendor_id is not None:
            sub = f"{self.subsystem_vendor_id:04x}:{self.subsystem_id:04x}"
        lines = [
            f"part number   {self.part_number}  (compared: {self.key!r}; version field {self.pn_version or '-'})",
            f"VBIOS version {self.version or '-'}   build date {self.date or '-'}",
            f"PCI id        {ids}   subsystem {sub}",
            f"strings       ASIC {self.asic or '-'}, PCI type {self.pci_type or '-'}, "
            f"memory {self.memory_type or '-'}",
            f"model         {self.model_name or '-'}",
            f"ATOM header   at +{self.rom_header:#x}; {self.size:#x} bytes declared; "
            f"ATI magic {'present' if self.ati_magic else 'absent (amdgpu would not load this ROM)'}",
        ]
        return lines + [f"note          {n}" for n in self.notes]

    def as_dict(self) -> dict[str, object]:
        return {"offset": self.offset, "size": self.size, "part_number": self.part_number, "key": self.key,
                "pn_version": self.pn_version, "version": self.version, "date": self.date, "asic": self.asic,
                "pci_type": self.pci_type, "memory_type": self.memory_type, "model_name": self.model_name,
                "vendor_id": self.vendor_id, "device_id": self.device_id,
                "subsystem_vendor_id": self.subsystem_vendor_id, "subsystem_id": self.subsystem_id,
                "ati_magic": self.ati_magic, "notes": list(self.notes)}


def parse_atom(src: Source, base: int = 0) -> AtomImage:
    """The ATOM image at `base` in `src`, read as fwupd reads it (see the module docstring)."""
    head = take(src, base, HEAD_BYTES, "the option ROM header")
    if head[:2] != OPTION_ROM_MAGIC:
        raise AtomError(f"no option ROM at {base:#x}: it starts {head[:2].hex(' ')}, expected 55 aa")
    if head[IBM_AT:IBM_AT + 3] != IBM:
        raise AtomError(f"option ROM at {base:#x} lacks the 'IBM' mark at +{IBM_AT:#x} "
                        f"(reads {head[IBM_AT:IBM_AT + 3]!r})")
    size = head[2] * 512
    notes: list[str] = []

    rom_at = _U16.unpack_from(head, ROM_HEADER_POINTER)[0]
    rom = take(src, base + rom_at, ROM_HEADER_BYTES, f"the ATOM ROM header (pointer at +{ROM_HEADER_POINTER:#x})")
    if rom[4:8] != ATOM:
        raise AtomError(f"no ATOM ROM header at {base + rom_at:#x} (pointer at +{ROM_HEADER_POINTER:#x}): "
                        f"signature reads {rom[4:8]!r}, expected b'ATOM'")
    subsystem = struct.unpack_from("<HH", rom, ROM_SUBSYSTEM_VENDOR)

    count = head[NUM_STRINGS]
    if count == 0:
        raise AtomError(f"ATOM image at {base:#x} declares no strings (count at +{NUM_STRINGS:#x} is 0)")
    if count > MAX_STRINGS:
        raise AtomError(f"ATOM image at {base:#x} declares {count} strings; fwupd knows {MAX_STRINGS} "
                        "(part number, ASIC, PCI type, memory type)")
    str_at = _U16.unpack_from(head, STRINGS_POINTER)[0]
    if str_at == 0:
        raise AtomError(f"ATOM image at {base:#x} has no string pointer (+{STRINGS_POINTER:#x} is 0)")
    if size and str_at + count * STRING_MAX > size:
        raise AtomError(f"the strings at +{str_at:#x} extend beyond the image's declared {size:#x} bytes")
    window = src.read(base + str_at, count * (STRING_MAX + 1) + 2 + NAME_MAX)
    strings: list[str | None] = []
    at = 0
    for i in range(count):
        text, used = _string(window, at, STRING_MAX)
        if text is None:
            raise AtomError(f"string {i} of the ATOM image at {base:#x} (at {base + str_at + at:#x}) "
                            "lies beyond the source")
        strings.append(text)
        at += used
    part_number = strings[0]
    if not part_number:
        raise AtomError(f"the part number string of the ATOM image at {base:#x} (at {base + str_at:#x}) is empty")
    name, _ = _string(window, at + 2, NAME_MAX)   # after CR LF
    strings += [None] * (MAX_STRINGS - len(strings))

    vendor_id = device_id = None
    pcir_at = _U16.unpack_from(head, PCIR_POINTER)[0]
    pcir = src.read(base + pcir_at, 8) if pcir_at else b""
    if len(pcir) == 8 and pcir[:4] == PCIR:
        vendor_id, device_id = struct.unpack_from("<HH", pcir, 4)
    else:
        notes.append(f"no PCI data structure (PCIR) through the pointer at +{PCIR_POINTER:#x} ({pcir_at:#x})")

    ati = head[ATI_MAGIC_AT:ATI_MAGIC_AT + len(ATI_MAGIC)] == ATI_MAGIC
    return AtomImage(base, size, part_number, strings[1], strings[2], strings[3],
                     name.strip() if name else None, _version(src, base, str_at, rom_at),
                     _date(head[DATE_AT:DATE_AT + DATE_BYTES]), vendor_id, device_id, subsystem[0], subsystem[1],
                     rom_at, ati, tuple(notes))


def _string(window: bytes, at: int, limit: int) -> tuple[str | None, int]:
    """(text, bytes used) of a NUL-terminated string of at most `limit` characters; non-printable
    characters read '.', as fwupd prints them. None when the window ends first."""
    if at >= len(window):
        return None, 0
    raw = window[at:at + limit]
    end = raw.find(b"\0")
    if end < 0:
        if len(raw) < limit:
            return None, 0
        end = limit
    text = "".join(chr(b) if 0x20 <= b < 0x7F else "." for b in raw[:end])
    return text, end + 1


def _version(src: Source, base: int, str_at: int, rom_at: int) -> str | None:
    # amdgpu searches between the strings and the ROM header, or 3..1024 when they say nothing.
    start, end = (str_at, rom_at) if rom_at > str_at else VERSION_WINDOW
    window = src.read(base + start, end - start + len(VERSION_ANCHOR) + VERSION_MAX)
    found = window.find(VERSION_ANCHOR)
    if found < 0 or found > end - start:
        return None
    text, _ = _string(window, found + len(VERSION_ANCHOR), VERSION_MAX)
    if text is None:
        return None
    return text.strip() or None


def _date(raw: bytes) -> str | None:
    # "MM/DD/YY HH:MM:SS": printed as amdgpu's atom_get_vbios_date does, 20YY/MM/DD HH:MM.
    if len(raw) < 14:
        return None
    month, day, year, hours, minutes = (raw[i:i + 2] for i in (0, 3, 6, 9, 12))
    parts = [month, day, year, hours, minutes]
    if not all(p.isdigit() for p in parts):
        return None
    m, d, y, h, mi = (p.decode() for p in parts)
    return f"20{y}/{m}/{d} {h}:{mi}"
