"""Synthetic IFWI images for the emulated board. SYNTHETIC: never an AMD image.

No real Navi31 image is available to the project (docs/ifwi.md), so the emulated board
carries an image with the documented *structure* and seeded pseudo-random *content*: every
item of the §5 table resolves on it, its directories carry valid checksums, and erased gaps
read 0xFF as on a real flash. Every image says what it is: the label below sits in sector 0,
in both partition payloads, in each ATOM image (as its model name; part numbers start
"SYNTH-", the ASIC string reads "SYNTHETIC") and in the metadata sector, and no ATOM image
carries the ATI magic a real AMD VBIOS has (amdgpu would refuse to load one).

Layout (offsets into the 2 MiB array; everything else is erased):

    0x000000  EFS, 0x54 bytes: AA55AA55, PSP directory pointer at 0x14, backup at 0x2C
    0x000080  label text
    0x001000  u32 pointer to the $SGN table
    0x002000  L1 $PSP directory (ISH A and ISH B, as fwupd expects); 0x003000 its backup
    0x004000  $SGN table: 7 entries (type, format, size, offset), types 1..7 in seeded order
    0x005000  seven 0x200-byte signature blobs
    0x010000  item 0x04 blob (0x1000); 0x011000 item 0x05 blob (0x1000)
    0x012000  ISH A (fw id 0x13C); 0x013000 ISH B (fw id 0x13D): 32-byte slot headers
    0x020000  partition A payload (0x10000) — the current revision: an L2 $PSP directory,
              the label, the ATOM image at +0x1000 (0x8000 bytes), a blob
    0x030000  partition A update-cookie sector (erased: never updated)
    0x100000  partition B payload (0x10000) — an older revision, so an update shows
    0x110000  partition B update-cookie sector (erased)
    0x1EF000  metadata record (+ label)
    0x1F0000  item 0x89 region (0x100)

Public facts (fwupd's amd-gpu plugin, amdgpu's atom headers) fix the walk from the EFS to
each partition's ATOM image: the L1 directory lists the ISH entries; an ISH slot header holds
checksum, boot priority, update retries, glitch retries (u8), the partition's fw id (u16 at
+0xD: 0x14D A, 0x14E B), location, PSP id, slot size and the ATOM image's location (+0x1C,
into the whole IFWI); a partition starts with a `$PSP` (L2) directory; an ATOM image is an
option ROM (55 AA, size, "IBM", PCIR) with four strings (part number, ASIC, PCI type, memory
type), CR LF and a model name, a build date at 0x50 and an ATOM ROM header ("ATOM",
subsystem ids) through the pointer at 0x48.

Formats that are assumptions (no public source for the GPU's own): the slot checksum is
Fletcher-32 over bytes 4..0x20; the PSP id (+0x14) holds the ISH's own fw id; the L2 entries'
locations are relative to the payload (A and B hold the same bytes, so they must be
position-independent); the update cookie and the metadata record below are this project's
own. The modelled PSP firmware (psp.py) writes the same formats when it updates partition B.
"""
from __future__ import annotations

import mmap
import random
import struct
from dataclasses import dataclass

from amdflash.stages.drivers.flash.geometry import FLASH_SIZE, SECTOR

LABEL = b"amdflash SYNTHETIC IFWI test image - not an AMD image"
# The part this synthetic board family is for: the first ten characters fwupd compares.
# Partition A's part number is PART_KEY + "-102" (revision 2), partition B's "-101".
PART_KEY = "SYNTH-0001"

EFS_MAGIC = b"\xaa\x55\xaa\x55"
EFS_SIZE = 0x54
EFS_PSP_DIRECTORY, EFS_PSP_DIRECTORY_BACKUP = 0x14, 0x2C
LABEL_OFFSET = 0x80
SGN_POINTER = 0x1000
PSP_DIRECTORY, PSP_DIRECTORY_BACKUP = 0x2000, 0x3000
SGN_TABLE = 0x4000
SIGNATURES, SIGNATURE_SIZE, SIGNATURE_TYPES = 0x5000, 0x200, range(1, 8)
ITEM_04, ITEM_05, ITEM_BLOB_SIZE = 0x10000, 0x11000, 0x1000
ISH_A, ISH_B = 0x12000, 0x13000
PARTITION_A, PARTITION_B = 0x20000, 0x100000
PAYLOAD_SIZE = 0x10000
METADATA = 0x1EF000
REGION_89, REGION_89_SIZE = 0x1F0000, 0x100

# ISH slot header (32 bytes).
ISH_BYTES = 0x20
ISH_CHECKSUM, ISH_PRIORITY, ISH_UPDATE_COUNTER = 0x00, 0x04, 0x08
ISH_PARTITION_FW_ID = 0x0D                       # u16, after the u8 glitch retries
ISH_LOCATION, ISH_PSP_ID, ISH_SIZE, ISH_CSM = 0x10, 0x14, 0x18, 0x1C
ISH_A_FW_ID, ISH_B_FW_ID = 0x13C, 0x13D
PARTITION_A_FW_ID, PARTITION_B_FW_ID = 0x14D, 0x14E
_ISH = struct.Struct("<IIIBHBIIII")

# The payload's parts: fw id 0x1 is the ATOM/CSM image in fwupd's list of ids; 0x63 is ours.
FW_ID_VBIOS, FW_ID_BLOB = 0x01, 0x63
VBIOS_OFFSET, VBIOS_SIZE = 0x1000, 0x8000       # inside the payload
BLOB_OFFSET = VBIOS_OFFSET + VBIOS_SIZE

# Inside the ATOM image.
ATOM_PCIR, ATOM_ROM_HEADER, ATOM_STRINGS, ATOM_CONFIG_NAME = 0x200, 0x240, 0x80, 0x1C0
SUBSYSTEM = (0x5359, 0x0001)                     # synthetic subsystem vendor and id
NAVI31 = (0x1002, 0x744C)

# Update cookie: the first 16 bytes of the sector after a partition's payload.
COOKIE_MAGIC = b"$AMDVBFL"
_COOKIE = struct.Struct("<8sII")                 # magic, update count, payload Fletcher-32

# Metadata record at METADATA.
METADATA_MAGIC = b"$SYNMETA"
_METADATA = struct.Struct("<8sIIIIII")           # magic, active, updates, B sum, stamp, rsvd, sum
METADATA_BYTES = _METADATA.size

_DIRECTORY_HEADER = struct.Struct("<4sIII")      # cookie, checksum, entry count, reserved
_DIRECTORY_ENTRY = struct.Struct("<IIQ")         # fw id, size, 64-bit location
_SGN_ENTRY = struct.Struct("<IIII")              # type, format, size, offset
_U32 = struct.Struct("<I")


def fletcher32(data: bytes) -> int:
    """Fletcher-32 the way AMD PSP tooling computes directory checksums (coreboot amdfwtool):
    little-endian 16-bit words, both sums seeded with 0xFFFF, folded with end-around carry
    every 359 words (the most that keeps the 32-bit sums from overflowing) and at the end."""
    words = struct.unpack(f"<{len(data) // 2}H", data)
    c0 = c1 = 0xFFFF
    for start in range(0, len(words), 359):
        for word in words[start:start + 359]:
            c0 += word
            c1 += c0
        c0 = (c0 & 0xFFFF) + (c0 >> 16)
        c1 = (c1 & 0xFFFF) + (c1 >> 16)
    c0 = (c0 & 0xFFFF) + (c0 >> 16)
    c1 = (c1 & 0xFFFF) + (c1 >> 16)
    return c1 << 16 | c0


# -- structures ------------------------------------------------------------------------------

def directory(cookie: bytes, entries: list[tuple[int, int, int]]) -> bytes:
    """A `$PSP`-style directory; the checksum covers everything after the checksum field."""
    body = _U32.pack(len(entries)) + _U32.pack(0xFFFFFFFF)
    body += b"".join(_DIRECTORY_ENTRY.pack(*entry) for entry in entries)
    return cookie + _U32.pack(fletcher32(body)) + body


def ish_checksum(header: bytes | bytearray) -> int:
    return fletcher32(bytes(header[ISH_PRIORITY:ISH_BYTES]))


def ish_header(location: int, size: int, fw_id: int, priority: int, counter: int = 0) -> bytes:
    """The slot header of ISH `fw_id` (0x13C A, 0x13D B) for the partition at `location`."""
    partition = PARTITION_A_FW_ID if fw_id == ISH_A_FW_ID else PARTITION_B_FW_ID
    fields = [0, priority, counter, 0xFF, partition, 0xFF, location, fw_id, size, location + VBIOS_OFFSET]
    header = bytearray(_ISH.pack(*fields))
    _U32.pack_into(header, ISH_CHECKSUM, ish_checksum(header))
    return bytes(header)


def cookie_offset(location: int, size: int) -> int:
    return (location + size + SECTOR - 1) & ~(SECTOR - 1)


def update_cookie(updates: int, payload_checksum: int) -> bytes:
    return _COOKIE.pack(COOKIE_MAGIC, updates, payload_checksum)


@dataclass(frozen=True)
class Metadata:
    active: int          # partition the next boot uses: 0 = A, 1 = B
    updates: int         # completed PSP updates
    b_checksum: int      # Fletcher-32 of partition B's payload
    stamp_ms: int = 0    # modelled time of the last update


def metadata_record(meta: Metadata) -> bytes:
    head = _METADATA.pack(METADATA_MAGIC, meta.active, meta.updates, meta.b_checksum,
                          meta.stamp_ms & 0xFFFFFFFF, 0xFFFFFFFF, 0)
    return head[:-4] + _U32.pack(fletcher32(head[:-4]))


def read_metadata(flash: bytes | bytearray | mmap.mmap) -> Metadata | None:
    """The metadata record, or None when it is absent or fails its checksum."""
    record = bytes(flash[METADATA:METADATA + METADATA_BYTES])
    magic, active, updates, b_sum, stamp, _, checksum = _METADATA.unpack(record)
    if magic != METADATA_MAGIC or checksum != fletcher32(record[:-4]):
        return None
    return Metadata(active, updates, b_sum, stamp)


def part_number(revision: int, key: str = PART_KEY) -> str:
    return f"{key}-1{revision:02d}"


def vbios(rng: random.Random, revision: int, key: str = PART_KEY) -> bytes:
    """An ATOM image with every field fwupd and amdgpu read, filled with synthetic values; the
    rest is seeded noise, and the checksum byte at 0x21 makes the byte sum 0 as in any option ROM."""
    rom = bytearray(rng.randbytes(VBIOS_SIZE))
    rom[0:3] = bytes((0x55, 0xAA, VBIOS_SIZE // 512))
    struct.pack_into("<H", rom, 0x18, ATOM_PCIR)
    rom[0x1E:0x21] = b"IBM"
    rom[0x2F] = 4
    rom[0x30:0x3A] = b"SYNTHETIC\0"                # where a real VBIOS has the ATI magic
    struct.pack_into("<H", rom, 0x48, ATOM_ROM_HEADER)
    rom[0x50:0x62] = b"06/%02d/24 12:00:00\0" % revision
    struct.pack_into("<H", rom, 0x6E, ATOM_STRINGS)
    strings = b"\0".join((part_number(revision, key).encode(), b"SYNTHETIC", b"PCI_EXPRESS", b"GDDR6")) + b"\0"
    strings += b"\r\n" + LABEL + b"\0" + b"ATOMBIOSBK-AMD VER" + b"SYNTHETIC.%03d\0" % revision
    rom[ATOM_STRINGS:ATOM_STRINGS + len(strings)] = strings
    rom[ATOM_CONFIG_NAME:ATOM_CONFIG_NAME + 19] = b"amdflash-synthetic\0"
    pcir = b"PCIR" + struct.pack("<HHHHB", *NAVI31, 0, 0x18, 0) + (0x030000).to_bytes(3, "little")
    pcir += struct.pack("<HHBBHHH", VBIOS_SIZE // 512, revision, 0x00, 0x80, 0, 0, 0)
    rom[ATOM_PCIR:ATOM_PCIR + len(pcir)] = pcir
    header = struct.pack("<HBB4sHHHHHHHHHHHHHBBI", 0x28, 2, 1, b"ATOM", 0, 0, ATOM_CONFIG_NAME, 0, 0, 0, 0, 0,
                         *SUBSYSTEM, ATOM_PCIR, 0, 0, 0, 0, 0)
    rom[ATOM_ROM_HEADER:ATOM_ROM_HEADER + len(header)] = header
    rom[0x21] = 0
    rom[0x21] = -sum(rom) & 0xFF
    return bytes(rom)


def partition_payload(rng: random.Random, revision: int, key: str = PART_KEY) -> bytes:
    payload = bytearray(b"\xff" * PAYLOAD_SIZE)
    entries = [(FW_ID_VBIOS, VBIOS_SIZE, VBIOS_OFFSET), (FW_ID_BLOB, PAYLOAD_SIZE - BLOB_OFFSET, BLOB_OFFSET)]
    head = directory(b"$PSP", entries)
    payload[0:len(head)] = head
    text = LABEL + b" - partition payload revision %d" % revision
    payload[0x100:0x100 + len(text)] = text
    payload[VBIOS_OFFSET:BLOB_OFFSET] = vbios(rng, revision, key)
    payload[BLOB_OFFSET:] = rng.randbytes(PAYLOAD_SIZE - BLOB_OFFSET)
    return bytes(payload)


# -- the image -------------------------------------------------------------------------------

def synthetic_ifwi(seed: int = 0, part_key: str = PART_KEY) -> bytes:
    """A 2 MiB synthetic IFWI; the same seed gives the same image, other seeds other content.
    `part_key` names the (synthetic) board the image is for: its part numbers start with it."""
    rng = random.Random(seed)
    image = bytearray(b"\xff" * FLASH_SIZE)

    def put(offset: int, data: bytes | bytearray) -> None:
        image[offset:offset + len(data)] = data

    efs = bytearray(b"\xff" * EFS_SIZE)
    efs[0:4] = EFS_MAGIC
    _U32.pack_into(efs, EFS_PSP_DIRECTORY, PSP_DIRECTORY)
    _U32.pack_into(efs, EFS_PSP_DIRECTORY_BACKUP, PSP_DIRECTORY_BACKUP)
    put(0, efs)
    put(LABEL_OFFSET, LABEL)

    entries = [(ISH_A_FW_ID, ISH_BYTES, ISH_A), (ISH_B_FW_ID, ISH_BYTES, ISH_B)]
    put(PSP_DIRECTORY, directory(b"$PSP", entries))
    put(PSP_DIRECTORY_BACKUP, directory(b"$PSP", entries))

    # Types in seeded order, so that a resolver which picks entries by index fails somewhere.
    types = list(SIGNATURE_TYPES)
    rng.shuffle(types)
    table = bytearray(b"$SGN" + _U32.pack(1) + _U32.pack(len(types)) + _U32.pack(0xFFFFFFFF))
    for index, sign_type in enumerate(types):
        offset = SIGNATURES + index * SIGNATURE_SIZE
        table += _SGN_ENTRY.pack(sign_type, 1, SIGNATURE_SIZE, offset)
        put(offset, rng.randbytes(SIGNATURE_SIZE))
    put(SGN_TABLE, table)
    put(SGN_POINTER, _U32.pack(SGN_TABLE))

    put(ITEM_04, rng.randbytes(ITEM_BLOB_SIZE))
    put(ITEM_05, rng.randbytes(ITEM_BLOB_SIZE))
    put(ISH_A, ish_header(PARTITION_A, PAYLOAD_SIZE, ISH_A_FW_ID, priority=1))
    put(ISH_B, ish_header(PARTITION_B, PAYLOAD_SIZE, ISH_B_FW_ID, priority=0))
    put(PARTITION_A, partition_payload(rng, 2, part_key))
    older = partition_payload(rng, 1, part_key)
    put(PARTITION_B, older)

    put(METADATA, metadata_record(Metadata(active=0, updates=0, b_checksum=fletcher32(older))))
    put(METADATA + 0x40, LABEL)
    put(REGION_89, rng.randbytes(REGION_89_SIZE))
    return bytes(image)


# -- damage ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Damage:
    offset: int
    size: int
    kind: str   # "erased": the whole sector reads 0xFF; "garbled": every byte of the span flipped


def damage_regions(image: bytes, seed: int, regions: int = 3) -> list[Damage]:
    """Which regions `damage` corrupts: distinct 4 KiB sectors that hold data (so that every
    region really changes), erased whole or garbled over a short span."""
    rng = random.Random(f"amdflash-damage:{seed}")
    blank = b"\xff" * SECTOR
    candidates = [s for s in range(0, len(image) - SECTOR + 1, SECTOR) if image[s:s + SECTOR] != blank]
    chosen = sorted(rng.sample(candidates, min(regions, len(candidates))))
    out = []
    for sector in chosen:
        if rng.random() < 0.5:
            out.append(Damage(sector, SECTOR, "erased"))
        else:
            size = rng.choice((0x10, 0x40, 0x100))
            out.append(Damage(sector + rng.randrange(0, SECTOR - size + 1, 4), size, "garbled"))
    return out


def damage(image: bytes, seed: int, regions: int = 3) -> bytes:
    """`image` with a few seeded regions corrupted, as a failed or interrupted write leaves a flash."""
    out = bytearray(image)
    rng = random.Random(f"amdflash-garble:{seed}")
    for region in damage_regions(image, seed, regions):
        span = slice(region.offset, region.offset + region.size)
        if region.kind == "erased":
            out[span] = b"\xff" * region.size
        else:
            out[span] = bytes(b ^ rng.randrange(1, 256) for b in out[span])
    return bytes(out)
