"""An RX transaction as the ROM_SW engine's callers describe it.

Its own module so that the fast-path self-check (fastpaths.py), which the engine runs when it
opens, can build requests without importing the engine.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Request:
    """One RX transaction: opcode, address (sent as address_bytes MSB first), byte count."""

    opcode: int
    address: int = 0
    address_bytes: int = 0
    count: int = 1
