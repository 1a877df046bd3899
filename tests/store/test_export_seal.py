"""Issue 18, attack 9: an export's header fields and end counts were not signed (an edit went
unnoticed), and a field of the wrong type crashed `audit verify --export` ("internal error
TypeError", exit 1).

Now every record is sealed by the exporting host's key, so any edit is named (exit 1), and
a file that is not a well-formed export is refused with `error: ...`, exit 2. The fuzz tests
throw random edits and random bytes at the command and accept only those two answers."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amdflash.pipeline.cli.main import main
from amdflash.stages.sim import create_board
from amdflash.stages.sim.synth import PART_KEY, synthetic_ifwi
from amdflash.store import keys

FUZZ = settings(max_examples=120, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


class Made:
    def __init__(self, root: Path):
        self.root = root
        self.db = root / "audit.sqlite"
        self.whole = root / "whole.jsonl"
        self.run = root / "run.jsonl"
        self.csv = root / "run.csv"
        self.pub = root / "host.pub"


def amdflash(*args: object) -> int:
    return main(["-q", *map(str, args)])


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Made:
    """An info run and a two-sector flash, exported whole, as one run (JSONL and CSV)."""
    m = Made(tmp_path_factory.mktemp("seal"))
    image = m.root / "image.bin"
    image.write_bytes(synthetic_ifwi(21))
    board = create_board(m.root / "board", content="blank", transport="ideal", seed=3)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AMDFLASH_LOCK_DIR", str(m.root / "locks"))
        mp.setenv("AMDFLASH_DB", str(m.db))
        assert amdflash("info", "--board", f"sim:{board}") == 0
        assert amdflash("flash", image, "--yes", "--force", "--sector-count", "2", "--expect-part", PART_KEY,
                        "--board", f"sim:{board}") == 0
        assert amdflash("audit", "export", "-o", m.whole) == 0
        run_id = json.loads(m.whole.read_text().splitlines()[0])["runs"][-1]
        assert amdflash("audit", "export", "--run", run_id, "-o", m.run) == 0
        assert amdflash("audit", "export", "--run", run_id, "--format", "csv", "-o", m.csv) == 0
        assert amdflash("audit", "key", "-o", m.pub) == 0
    return m


def verify(capsys, path: Path, *extra: object) -> tuple[int, str, str]:  # noqa: ANN001
    capsys.readouterr()
    code = main(["audit", "verify", "--export", str(path), *map(str, extra)])
    out = capsys.readouterr()
    return code, out.out, out.err


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def write(path: Path, recs: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in recs))
    return path


def test_an_intact_export_names_its_seal(made, capsys):  # noqa: ANN001
    for path in (made.whole, made.run, made.csv):
        code, out, _ = verify(capsys, path, "--key", made.pub)
        assert code == 0 and "sealed by:  SHA256:" in out and "a given --key" in out, out
    assert records(made.run)[-1]["record"] == "seal"


def _edit(recs: list[dict], kind: str, change) -> list[dict]:  # noqa: ANN001
    out = [dict(r) for r in recs]
    target = next(r for r in out if r["record"] == kind)
    change(target)
    return out


@pytest.mark.parametrize("kind, change, named", [
    # header: a database export relabelled as one run's (its completeness no longer claimed)
    ("header", lambda r: r.update(scope="run"), "header record(s) (line 1) are not those the export's seal signed"),
    # header: one run dropped from the list, its rows and checkpoints kept
    ("header", lambda r: r.update(runs=r["runs"][1:]), "its runs field does not list the runs the file holds"),
    # end: a count nothing else checks
    ("end", lambda r: r.update(unsealed_rows_left_out=r["unsealed_rows_left_out"] + 7),
     "end record(s)"),
    ("end", lambda r: r.update(blobs=r["blobs"] + 1), "it counts"),
    # a host record's name
    ("host", lambda r: r.update(hostname="elsewhere"), "host record(s)"),
], ids=["scope", "runs", "unsealed-count", "blob-count", "hostname"])
def test_an_edit_of_any_field_is_named(made, capsys, tmp_path, kind, change, named):  # noqa: ANN001
    edited = write(tmp_path / "edited.jsonl", _edit(records(made.whole), kind, change))
    code, out, _ = verify(capsys, edited)
    assert code == 1 and "export BROKEN" in out and named in out, out


def test_cutting_the_first_run_and_moving_the_start_of_the_chain_is_named(made, capsys, tmp_path):  # noqa: ANN001
    """The header's base says where a database export's checkpoint chain starts. Cut the
    first run out whole — its rows, its checkpoints, its name in the header's runs — and move
    base past its checkpoints, fix the end counts: every chain still holds, the seal does not."""
    recs = records(made.whole)
    header = recs[0]
    key, first = min((r["seq"], r["values"]["run_id"]) for r in recs if r["record"] == "row" and r["table"] == "runs")
    cps = [r for r in recs if r["record"] == "checkpoint" and r["run_id"] == first]
    last = max(cps, key=lambda r: r["id"])
    assert all(r["run_id"] == first for r in recs if r["record"] == "checkpoint" and r["id"] <= last["id"])

    def of_first(r: dict) -> bool:
        if r["record"] == "checkpoint":
            return r["id"] <= last["id"]
        if r["record"] != "row":
            return False
        v = r["values"]
        return v["run_id"] == first if "run_id" in v else v["run"] == key
    kept = [dict(r) for r in recs if not of_first(r)]
    kept[0] = {**header, "runs": [r for r in header["runs"] if r != first],
               "base": {"checkpoint": last["id"], "hash": last["hash"]}}
    end = next(r for r in kept if r["record"] == "end")
    end["rows"] = sum(r["record"] == "row" for r in kept)
    end["checkpoints"] = sum(r["record"] == "checkpoint" for r in kept)
    cut = write(tmp_path / "cut.jsonl", kept[:-1] + [kept[-1]])
    code, out, _ = verify(capsys, cut)
    assert code == 1 and "header record(s) (line 1) are not those the export's seal signed" in out, out
    # Without the seal's word, everything else about the cut file holds:
    code, out, _ = verify(capsys, write(tmp_path / "cut-unsealed.jsonl", kept[:-1]))
    assert code == 1 and "no seal record" in out, out


def test_a_removed_seal_and_a_foreign_seal_are_refused(made, capsys, tmp_path):  # noqa: ANN001
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from amdflash.store.export import SEALED, seal_message

    recs = records(made.run)
    code, out, _ = verify(capsys, write(tmp_path / "unsealed.jsonl", recs[:-1]))
    assert code == 1 and "no seal record" in out, out
    # An attacker edits the header and seals the file again with a key of their own: it is
    # self-consistent, but not by a given --key.
    import hashlib

    edited = _edit(recs[:-1], "end", lambda r: r.update(unsealed_rows_left_out=99))
    digests = {k: hashlib.sha256() for k in SEALED}
    for r in edited:
        digests[r["record"]].update(json.dumps(r, separators=(",", ":")).encode() + b"\n")
    hexes = {k: h.hexdigest() for k, h in digests.items()}
    attacker = Ed25519PrivateKey.generate()
    public = keys.public_bytes(attacker)
    resealed = write(tmp_path / "resealed.jsonl", [*edited, {
        "record": "seal", "public_key": public.hex(), "digests": hexes,
        "sig": attacker.sign(seal_message(hexes, public)).hex()}])
    code, out, _ = verify(capsys, resealed)
    assert code == 0 and keys.fingerprint(public) in out       # without a key: only consistent
    code, out, _ = verify(capsys, resealed, "--key", made.pub)
    assert code == 1 and "sealed by key" in out and "not a given --key" in out, out


@pytest.mark.parametrize("change, said", [
    (lambda recs: _edit(recs, "header", lambda r: r["base"].update(checkpoint="1")), "header field base"),
    (lambda recs: _edit(recs, "checkpoint", lambda r: r.update(id="7")), "checkpoint field id"),
    (lambda recs: _edit(recs, "checkpoint", lambda r: r.pop("sig")), "missing sig"),
    (lambda recs: _edit(recs, "row", lambda r: r.update(values=[1, 2])), "row field values"),
    (lambda recs: _edit(recs, "blob", lambda r: r.update(data="zz")), "blob field data"),
    (lambda recs: _edit(recs, "header", lambda r: r.update(version=1)), "version"),
    (lambda recs: [*recs[:3], {"record": "surprise"}, *recs[3:]], "unknown kind"),
], ids=["base-type", "id-type", "missing-field", "values-type", "bad-hex", "version", "unknown-record"])
def test_a_malformed_record_is_a_clear_error_exit_2(made, capsys, tmp_path, change, said):  # noqa: ANN001
    code, out, err = verify(capsys, write(tmp_path / "bad.jsonl", change(records(made.run))))
    assert code == 2 and err.startswith("error: ") and said in err and "internal error" not in err, (code, out, err)


@pytest.mark.parametrize("content", [b"\xff\xfe\x00garbage", b'{"record": "header"\n', b'{"a":' + b"[" * 100000 + b"\n",
                                     b'{"record":"header","n":' + b"9" * 5000 + b"}\n",
                                     b"record,table,seq,json\nrow,runs,1,{bad\n"],
                         ids=["not-utf8", "bad-json", "deep-nesting", "huge-number", "csv-header"])
def test_garbage_is_a_clear_error_exit_2(capsys, tmp_path, content):  # noqa: ANN001
    path = tmp_path / "garbage.jsonl"
    path.write_bytes(content)
    code, out, err = verify(capsys, path)
    assert code == 2 and err.startswith("error: ") and "internal error" not in err, (code, out, err)


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                 max_size=3),
                     max_leaves=6)


@pytest.mark.slow   # a long scenario: CI runs it (pytest -m slow)
@FUZZ
@given(data=st.data())
def test_random_edits_are_named_or_refused_never_passed_or_crashed(made, capsys, tmp_path, data):  # noqa: ANN001
    """One field of one record replaced by random JSON, or removed, or the record replaced by
    random text: exit 1 (named) or 2 (malformed), never 0, never an internal error."""
    source = data.draw(st.sampled_from([made.run, made.whole]))
    lines = source.read_text().splitlines()
    i = data.draw(st.integers(0, len(lines) - 1))
    action = data.draw(st.sampled_from(["replace", "remove", "text"]))
    if action == "text":
        lines[i] = data.draw(st.text(min_size=1, max_size=60).filter(lambda t: "\n" not in t and "\r" not in t))
    else:
        record = json.loads(lines[i])
        name = data.draw(st.sampled_from(sorted(record)))
        if action == "remove":
            del record[name]
        else:
            record[name] = data.draw(_JSON)
        lines[i] = json.dumps(record, separators=(",", ":"))
    text = "".join(line + "\n" for line in lines)
    if text == source.read_text() or not lines[i].strip():
        return                                     # no change, or only a blank line (skipped by readers)
    path = tmp_path / "fuzzed.jsonl"
    path.write_text(text)
    code, out, err = verify(capsys, path)
    assert code in (1, 2), (code, lines[i][:200], out, err)
    assert "internal error" not in err, err
    assert (code == 1 and "export BROKEN" in out) or (code == 2 and err.startswith("error: ")), (code, out, err)


@FUZZ
@given(content=st.binary(max_size=400) | st.text(max_size=400).map(str.encode))
def test_random_files_are_refused_never_crashed(capsys, tmp_path, content):  # noqa: ANN001
    path = tmp_path / "random.jsonl"
    path.write_bytes(content)
    code, out, err = verify(capsys, path)
    assert code in (1, 2) and "internal error" not in err, (code, out, err)
