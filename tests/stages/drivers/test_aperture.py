"""ROM aperture dump (docs/aperture.md): content, the three refusals, restore on every path."""
from __future__ import annotations

import hashlib
import os

import pytest

from amdflash.stages.drivers.navi31 import aperture
from amdflash.stages.drivers.navi31 import regs as R
from amdflash.stages.sim import SimBar5


def swapped(value: int) -> int:
    return int.from_bytes(value.to_bytes(4, "little"), "big")


@pytest.fixture
def image() -> bytes:
    data = bytearray(os.urandom(0x200000))
    data[:4] = b"\xaa\x55\xaa\x55"
    return bytes(data)


@pytest.mark.slow
def test_dump_returns_the_raw_flash_and_restores_index_and_cntl_as_validated(make_board, image):
    bar = SimBar5(make_board(content=image), profile="ideal")
    try:
        cntl, index = bar.read32(R.ROM_CNTL), bar.read32(R.ROM_INDEX)
        pages = []
        result = aperture.dump(bar, lambda done, total: pages.append(done))
        assert result.data == image
        assert result.sha256 == hashlib.sha256(image).hexdigest()
        assert len(pages) == 32 and pages[-1] == 0x200000
        # The validated client writes the byte-swapped originals back; so do we.
        assert bar.read32(R.ROM_CNTL) == swapped(cntl)
        assert bar.read32(R.ROM_INDEX) == swapped(index)
    finally:
        bar.close()


@pytest.mark.slow
def test_dump_reads_rom_data_one_dword_per_access(make_board, image):
    bar = SimBar5(make_board(content=image))
    try:
        before = bar.board.stats()
        aperture.dump(bar)
        after = bar.board.stats()
        # One mode-0 read per dword (200 µs each on asm24); 35 posted writes: CNTL, 32 INDEX, 2 restores.
        reads = after["reg_reads"] - before["reg_reads"]
        assert reads == 0x200000 // 4 + 2
        assert after["modelled_seconds"] - before["modelled_seconds"] == pytest.approx(
            reads * 200e-6 + 35 * 100e-6, rel=1e-9)
    finally:
        bar.close()


def test_refuses_board_without_raw_controller(make_board, image):
    bar = SimBar5(make_board(content=image, no_raw_rom=True), profile="ideal")
    try:
        with pytest.raises(aperture.ApertureError, match="raw SMUIO ROM controller is unavailable"):
            aperture.dump(bar)
        assert bar.board.stats()["reg_writes"] == 0
    finally:
        bar.close()


@pytest.mark.slow
def test_refuses_mirrored_aperture(make_board, image):
    bar = SimBar5(make_board(content=image, mirrored_rom=True), profile="ideal")
    try:
        with pytest.raises(aperture.ApertureError, match="mirrored"):
            aperture.dump(bar)
    finally:
        bar.close()


@pytest.mark.slow
def test_refuses_dump_without_ifwi_magic(make_board):
    bar = SimBar5(make_board(content="blank"), profile="ideal")
    try:
        with pytest.raises(aperture.ApertureError, match="AA55AA55"):
            aperture.dump(bar)
    finally:
        bar.close()


class FailingBar:
    """Passes through, then the transport dies after `reads` data reads."""

    def __init__(self, bar: SimBar5, reads: int):
        self.bar, self.left = bar, reads
        self.clock, self.identity = bar.clock, bar.identity
        self.writes: list[tuple[int, int]] = []

    def read32(self, offset: int) -> int:
        if offset == R.ROM_DATA:
            self.left -= 1
            if self.left < 0:
                raise OSError("transport died")
        return self.bar.read32(offset)

    def write32(self, offset: int, value: int) -> None:
        self.writes.append((offset, value))
        self.bar.write32(offset, value)


def test_registers_are_restored_when_the_dump_fails_midway(make_board, image):
    bar = SimBar5(make_board(content=image), profile="ideal")
    try:
        cntl, index = bar.read32(R.ROM_CNTL), bar.read32(R.ROM_INDEX)
        failing = FailingBar(bar, 50000)
        with pytest.raises(OSError):
            aperture.dump(failing)
        assert failing.writes[-2:] == [(R.ROM_INDEX, swapped(index)), (R.ROM_CNTL, swapped(cntl))]
    finally:
        bar.close()
