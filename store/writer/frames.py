"""The wire format between the recorders and the writer process: one frame per row (its
length, then the row in `marshal` form), so that a row torn by a dying host is recognised and
dropped while every complete one before it is kept."""
from __future__ import annotations

import marshal
import struct

_LEN = struct.Struct("<I")


def frame(message: tuple) -> bytes:
    data = marshal.dumps(message)
    return _LEN.pack(len(data)) + data


class FrameReader:
    """Splits a byte stream into complete frames; an incomplete tail waits for more bytes."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple]:
        buf = self.buffer
        buf += data
        out, pos, end = [], 0, len(buf)
        while end - pos >= 4:
            (size,) = _LEN.unpack_from(buf, pos)
            if end - pos - 4 < size:
                break
            out.append(marshal.loads(bytes(buf[pos + 4:pos + 4 + size])))
            pos += 4 + size
        del buf[:pos]
        return out
