"""Synthetic IFWI generator. STUB: being written."""
from __future__ import annotations

import random

FLASH_SIZE = 0x200000


def synthetic_ifwi(seed: int = 0) -> bytes:
    rng = random.Random(seed)
    image = bytearray(rng.randbytes(FLASH_SIZE))
    image[0:4] = b"\xaa\x55\xaa\x55"
    return bytes(image)
