"""ROM_CNTL while the ROM_SW engine runs: what docs/rom-sw.md says, what the driver writes and
what the validated reference client's two writes leave, all the same value."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from amdflash.stages.drivers.navi31 import regs as R

DOC = Path(__file__).resolve().parents[3] / "docs" / "rom-sw.md"
CLOCK_GATING_EN = 1 << 0          # ROM_CNTL bit 0 (amdgpu smuio_*_sh_mask.h)


def documented_value(old: int, prescale: int) -> int:
    """Evaluate the formula docs/rom-sw.md gives for ROM_CNTL during a transaction."""
    line = next(ln for ln in DOC.read_text().splitlines() if ln.strip().startswith("ROM_CNTL during every transaction:"))
    formula = re.search(r"`([^`]*)`", line).group(1)
    tree = ast.parse(formula, mode="eval")
    allowed = (ast.Expression, ast.BinOp, ast.BitAnd, ast.BitOr, ast.LShift, ast.Constant, ast.Name, ast.Load)
    assert all(isinstance(node, allowed) for node in ast.walk(tree)), formula
    return eval(compile(tree, "rom-sw.md", "eval"), {"__builtins__": {}}, {"old": old, "prescale": prescale})


def reference_value(old: int, prescale: int) -> int:
    """The reference client: its clock write at open, then its pad write before a transaction."""
    clock = (old & 0xE0FFFFFF) | 1 << 28 | prescale << 24 | 1
    return (clock & ~0xF) | 8


@pytest.mark.parametrize("prescale", [8, 3, 15])
def test_rom_cntl_during_a_transaction_is_the_documented_and_the_validated_value(open_board, prescale):
    o = open_board(engine={"prescale": prescale}, transport="ideal")
    found = o.board.get32(R.ROM_CNTL)
    seen: list[int] = []
    o.engine.observer = lambda *_: seen.append(o.board.get32(R.ROM_CNTL))
    with o.engine:
        o.nor.rdid()
    assert seen, "no transaction ran"
    assert set(seen) == {documented_value(found, prescale)} == {reference_value(found, prescale)}
    assert not seen[0] & CLOCK_GATING_EN and seen[0] >> 24 & 0x1F == 0x10 | prescale
    assert o.board.get32(R.ROM_CNTL) == found           # and put back when the engine closes
