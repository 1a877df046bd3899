"""No one else's words run (issue 41 item 2): a step printed to paste puts its positionals after
`--` and carries a value from the trail only in its documented shape, so a run INSERTed under
the id `--config=/x/c.toml` (or `--db=`, `--board=`) is never an option once pasted — where it
was, the attacker's config moved the database and with it the key root's pasted resume trusted
and signed with."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from amdflash.pipeline.engine import next_step
from amdflash.stages.sim.synth import PART_KEY
from tests.pipeline.cli.test_next_steps import pasted
from tests.pipeline.engine.conftest import cli, db, image  # noqa: F401 - fixtures: in-process CLI, own database
from tests.store.test_outside_rows import _insert


def _forge_an_unfinished_flash(db: Path, run_id: str, board: Path) -> None:  # noqa: F811
    """Rows INSERTed without the key: a flash of the board, interrupted, under `run_id`."""
    con = __import__("sqlite3").connect(db)
    uid, chip = con.execute("SELECT unique_id, chip FROM boards WHERE chip IS NOT NULL LIMIT 1").fetchone()
    con.close()
    at = "2099-12-31T23:59:59+00:00"
    _insert(db, "INSERT INTO runs (run_id, command, arguments, operator, host, board_spec, at) "
                "VALUES (?, 'flash', '{}', 'root', 'hosta', ?, ?)", run_id, f"sim:{board}", at)
    _insert(db, "INSERT INTO boards (run_id, spec, unique_id, chip, at) VALUES (?, ?, ?, ?, ?)",
            run_id, f"sim:{board}", uid, chip, at)
    _insert(db, "INSERT INTO run_status (run_id, status, detail, summary, at) VALUES (?, 'interrupted', '', '{}', ?)",
            run_id, at)


@pytest.mark.parametrize("option", ["--config", "--db", "--board"])
def test_a_run_id_shaped_as_an_option_is_never_an_option_when_pasted(cli, make_board, image, db, tmp_path,  # noqa: F811
                                                                     option):
    board = make_board(transport="ideal")
    assert cli("flash", image, "--yes", "--expect-part", PART_KEY, "--sector-count", "8",
               "--board", f"sim:{board}").code == 0
    theirs = tmp_path / "their.toml"
    their_db = tmp_path / "their" / "audit.sqlite"
    their_db.parent.mkdir()
    theirs.write_text(f'db = "{their_db}"\n')
    value = {"--config": theirs, "--db": their_db, "--board": f"sim:{make_board(transport='ideal')}"}[option]
    forged = f"{option}={value}"
    _forge_an_unfinished_flash(db, forged, board)
    info = cli("info", "--board", f"sim:{board}")
    assert info.code == 0, info.err
    [line] = [x for x in info.out.splitlines() if x.startswith("unfinished flash")]
    assert forged in line, line                        # the claim is shown, as what it is
    steps = pasted(line)
    for words in steps:                                 # no step carries it as an option
        before = words[:words.index("--")] if "--" in words else words
        assert not [w for w in before if w.startswith(option)], words
    assert "no command offered" in line, line           # a run id not of amdflash's form is offered in no command
    for words in steps:                                 # and pasted, none reads their config or database
        cli(*words[1:])
    assert not their_db.exists()


def test_every_printed_step_puts_its_positionals_after_a_double_dash(cli, make_board, image, db, tmp_path):  # noqa: F811
    img = image.read_bytes()
    stuck = next(a for a in range(0x2000, 0x4000) if img[a] == 0x00)
    board = make_board(content="blank", transport="ideal", faults=[f"stuck-bit={stuck:#x}:7"])
    r = cli("--no-progress", "flash", image, "--yes", "--expect-part", PART_KEY, "--sector-count", "8",
            "--board", f"sim:{board}")
    assert r.code == 1
    run = json.loads(cli("runs", "--format", "json").out)[-1]["run_id"]
    shown = r.err + cli("report", run).out + cli("info", "--board", f"sim:{board}").out
    steps = pasted(shown)
    verbs = {tuple(w for w in words[1:] if not w.startswith("-") and w != str(db))[:1] for words in steps}
    assert {("resume",), ("flash",)} <= verbs, steps
    for words in steps:
        positional = {"resume": run, "flash": None, "report": run}.get(words[3] if words[1] == "--db" else words[1])
        if words[3 if words[1] == "--db" else 1] in ("resume", "flash", "report"):
            assert words[-2] == "--", words
            assert positional is None or words[-1] == positional, words


def test_a_value_not_of_its_shape_is_offered_in_no_command():
    assert next_step.command("resume", "--board", "sim:/b", "--yes", args=["20261207T184115-bbc45546"]).endswith(
        "resume --board sim:/b --yes -- 20261207T184115-bbc45546")
    for words, args in ((("resume", "--board", "sim:/b", "--yes"), ["--config=/x/c.toml"]),
                        (("resume", "--board", "sim:/b", "--yes"), ["20261207T184115-bbc4554\nnext"]),
                        (("audit", "verify", "--run", "--db=/x"), []),
                        (("restore", "--board", "--config=/x"), []),
                        (("flash", "--board", "sim:/b", "--yes"), ["relative.bin"])):
        said = next_step.command(*words, args=args)
        assert said.startswith("(no command offered: ") and "\n" not in said, said
