"""Whatever a user types: exit 0, 1, 2 or 130, never a traceback, and nothing written to a
board when the answer is 2. Argument vectors are generated from the parser's own commands
and options, mixed with hostile values (devices, FIFOs, huge and negative numbers, junk)."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from amdflash.pipeline.cli.main import build_parser, main
from amdflash.stages.drivers.navi31 import regs as R
from amdflash.stages.sim import Board, create_board
from amdflash.stages.sim.synth import synthetic_ifwi

# Commands whose side effects reach outside the test's directory, or that take seconds when valid.
LEFT_OUT = {"demo", "udev-rules"}
REGISTERS = (R.GPIOPAD_MASK, R.GPIOPAD_A, R.GPIOPAD_EN, R.PAGE_MIRROR_CNTL, R.ROM_CNTL)


def _commands(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], list[str]]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                if name not in LEFT_OUT:
                    options = [o for a in child._actions for o in a.option_strings if o not in ("-h", "--help")]
                    found.append(((*words, name), options))
                    found += _commands(child, (*words, name))
    return found


COMMANDS = _commands(build_parser())


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("any-input")
    image = root / "image.bin"
    image.write_bytes(synthetic_ifwi(9))
    (root / "short.bin").write_bytes(b"\xaa\x55" * 10)
    os.mkfifo(root / "fifo")
    (root / "dir").mkdir()
    return {"root": root, "image": image, "board": create_board(root / "board", transport="ideal", seed=1),
            "cmp": create_board(root / "cmp", transport="ideal", seed=2, cmp=True)}


def _values(scene: dict[str, Path]) -> st.SearchStrategy[str]:
    root = scene["root"]
    return st.one_of(
        st.sampled_from([str(scene["image"]), str(root / "short.bin"), str(root / "fifo"), str(root / "dir"),
                         "/dev/zero", str(root / "missing.bin"), f"sim:{scene['board']}", f"sim:{scene['cmp']}",
                         "usb:zz", "usb:-1", "pci:garbage", "auto", "usb:0", "pci", "json", "html", "text",
                         "rom-sw", "aperture", "chained", "bash", "fish", "0x200000", "0x1fffff", "--", "-",
                         "", "--yes", "-o", "--board"]),
        st.integers(min_value=-(2 ** 70), max_value=2 ** 70).map(str),
        st.integers(min_value=0, max_value=0x210000).map(hex),
        st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12),
    )


@st.composite
def argv(draw: st.DrawFn, scene: dict[str, Path]) -> list[str]:
    words, options = draw(st.sampled_from(COMMANDS))
    tokens = list(words)
    values = _values(scene)
    for _ in range(draw(st.integers(0, 6))):
        if options and draw(st.booleans()):
            tokens.append(draw(st.sampled_from(options)))
        tokens.append(draw(values))
    if draw(st.booleans()):
        tokens.insert(draw(st.integers(0, len(tokens))), draw(st.sampled_from(["-q", "-v", "--log-json",
                                                                                "--no-progress", "--json"])))
    return tokens


def _state(board: Path) -> tuple[bytes, dict[int, int]]:
    with Board(board) as b:
        return (board / "flash.bin").read_bytes(), {r: b.get32(r) for r in REGISTERS}


def check_any_input(scene: dict[str, Path], tokens: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    before = {name: _state(scene[name]) for name in ("board", "cmp")}
    capsys.readouterr()
    code = main(tokens)
    out, err = capsys.readouterr()
    event(f"exit {code}")
    assert code in (0, 1, 2, 130), (tokens, code, err)
    assert "Traceback" not in err and "Traceback" not in out, (tokens, err)
    # No command replaces what it was pointed at: writers rename a new file into place, which
    # would turn a FIFO (or, as root, /dev/zero) into a regular file.
    assert (scene["root"] / "fifo").is_fifo() and Path("/dev/zero").is_char_device(), tokens
    if code == 2:
        for name in ("board", "cmp"):
            assert _state(scene[name]) == before[name], (tokens, err)
    if code in (1, 2):
        assert any(line.startswith("error: ") or '"level": "error"' in line for line in err.splitlines()), \
            (tokens, err)


def _run(scene, capsys, monkeypatch, tokens) -> None:  # noqa: ANN001
    monkeypatch.chdir(scene["root"])
    check_any_input(scene, tokens, capsys)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_any_argument_vector(scene, capsys, monkeypatch, data):
    _run(scene, capsys, monkeypatch, data.draw(argv(scene)))


@pytest.mark.slow
@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_any_argument_vector_at_length(scene, capsys, monkeypatch, data):
    _run(scene, capsys, monkeypatch, data.draw(argv(scene)))
