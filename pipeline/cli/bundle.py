"""`audit bundle` (the evidence of a run in a folder a reviewer can carry), `audit verify
--bundle` (its check, offline) and `restore-original --from-bundle`: the parser pieces and
their handlers. The bundle itself is store/bundle.py's."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from amdflash.pipeline.cli import output
from amdflash.pipeline.errors import EXIT_FAILED, EXIT_OK, Refusal


def add_parsers(audit_sub: argparse._SubParsersAction, verify: argparse.ArgumentParser) -> None:
    """`audit bundle`, and `--bundle` on `audit verify`."""
    p = audit_sub.add_parser(
        "bundle", help="write the evidence of a run into a folder a reviewer can carry, checkable offline",
        description="Write into a new directory DIR (mode 0700; it must not exist, or be empty): the run's rows with "
                    "their signed checkpoints, and those of the runs it resumes, of the runs that resume it and of "
                    "the runs whose backups hold the board's original (export.jsonl, the 'audit export' format); "
                    "the board's original content rebuilt from the trail's sealed backups (original.bin, or "
                    "original-partial.bin with 0xFF where the trail holds no backup, the units missing named in "
                    "bundle.json); the key that signed the checkpoints (host.pub, and host.pem as "
                    "SubjectPublicKeyInfo PEM); the anchor file's lines naming those checkpoints (anchor.jsonl); "
                    "who made the bundle, when and on which host (bundle.json); and MANIFEST.sha256 over every "
                    "file ('sha256sum -c MANIFEST.sha256' checks it). The bundle is checked before it is put in "
                    "place; nothing is left behind on a refusal. 'amdflash audit verify --bundle DIR' checks it "
                    "without the database; 'amdflash restore-original --from-bundle DIR' writes its original back. "
                    "Reads the database only; creates no key.")
    p.add_argument("--run", required=True, metavar="RUN_ID", help="the run (a unique prefix is enough)")
    p.add_argument("-o", "--output", required=True, type=Path, metavar="DIR",
                   help="the bundle's directory: new, or empty")
    p.set_defaults(func=cmd_bundle)
    verify.add_argument("--bundle", type=Path, metavar="DIR",
                        help="verify a bundle ('audit bundle') without the database: the manifest, the export's rows "
                             "against their signed checkpoints (by the bundle's host key, or --key), the anchor lines "
                             "and the original against the sealed backups; exit 1 naming the first file that does "
                             "not match. A link, a name outside the manifest or an oversized file is refused")
    verify.add_argument("--policy", type=Path, metavar="FILE",
                        help="with --bundle: hold it to a reviewer's policy (TOML: host_key, log_key, quorum, "
                             "witnesses, tsa_roots; docs/compliance.md): the receipt signed by its host key, in the "
                             "log under a tree head its log key signed, cosigned by a quorum of its witnesses and "
                             "dated by a token chaining to its roots; exit 1 naming each that fails, 2 for a bad "
                             "policy file")


def from_bundle_option(p: argparse.ArgumentParser) -> None:
    """restore-original's --from-bundle (and the --force that goes with it)."""
    p.add_argument("--from-bundle", type=Path, metavar="DIR",
                   help="write the original a bundle holds ('audit bundle'), verified first, to the bundle's board")
    p.add_argument("--force", action="store_true", help="with --from-bundle: also to another board")


# -- audit bundle ---------------------------------------------------------------------------------

def _seal_key(db: str) -> tuple[Any, bool]:
    """The key that seals the bundle's export: this host's key when it has one (read, never
    made), else a one-time key held in memory (a reviewer's bundle: the checkpoints' own
    signatures are what vouch for the record)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from amdflash.pipeline.engine.auditdb import host_key_path
    from amdflash.store import keys

    path = host_key_path(db)
    if path.is_file():
        try:
            return keys.load_private(path), True
        except (OSError, keys.KeyError_):
            pass
    return Ed25519PrivateKey.generate(), False


def _made(args: argparse.Namespace, db: str) -> dict[str, Any]:
    import datetime as dt
    import os

    from amdflash.pipeline.engine import run_facts
    from amdflash.store.writer.sealer import machine_id

    return {"by": run_facts.operator(), "claimed_by": getattr(args, "operator", None), "host": run_facts.host_name(),
            "machine_id": machine_id(), "amdflash": run_facts.tool_version(),
            "at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "database": os.path.abspath(db)}


def _anchor(db: str) -> list[tuple[int, dict[str, Any]]] | None:
    from amdflash.store.files import NotAFile
    from amdflash.store.verify import read_anchor
    from amdflash.store.writer.database import default_anchor

    try:
        return read_anchor(default_anchor(db))
    except (OSError, NotAFile) as e:
        output.note(f"anchor {default_anchor(db)} left out: {e}")
        return None


def cmd_bundle(args: argparse.Namespace) -> int:
    from amdflash.pipeline.commands.board import db_path
    from amdflash.pipeline.engine.auditdb import open_for_reading
    from amdflash.stages.files import FileFailure
    from amdflash.store import bundle
    from amdflash.store.queries import RunNotFound, resolve_run
    from amdflash.store.run_rows import RunUnverified

    out: Path = args.output
    try:
        bundle.check_output(out)
    except bundle.BundleRefused as e:
        raise Refusal(str(e)) from None
    path = db_path(args)
    db = open_for_reading(path)
    try:
        try:
            run_id = resolve_run(db, args.run)
        except RunNotFound as e:
            raise Refusal(str(e)) from None
        try:
            selection = bundle.select(db, path, run_id)
            selection.witnesses = _witnesses(args)
        except RunUnverified as e:
            output.error(f"run {run_id} (or a run it resumes) does not verify: {e.problem}; a bundle carries a record "
                         "that verifies, and nothing was written",
                         f"see what differs: amdflash --db {path} audit verify --run {run_id}")
            return EXIT_FAILED
        seal, own = _seal_key(path)
        try:
            built = bundle.build(db, selection, out, _made(args, path), seal, own, _anchor(path))
        except bundle.BundleRefused as e:
            raise Refusal(str(e)) from None
        except (FileFailure, OSError) as e:
            raise Refusal(f"bundle {out}: {e}") from None
    finally:
        db.conn.close()
    others = [r for r in selection.runs if r != run_id]
    output.result(f"wrote bundle {out}: run {run_id}" + (f" and {len(others)} run(s) of its lineage and of the "
                                                          f"board's original ({', '.join(others)})" if others else "")
                  + f": {built.rows} rows, {built.checkpoints} signed checkpoints")
    output.result(f"  original: {built.original}")
    output.result(f"  anchor:   {built.anchor_lines} line(s)" if built.anchor_lines else
                  "  anchor:   none (no anchor line names these runs' checkpoints)")
    _say_witnesses(out, built.files, selection.witnesses)
    for left in selection.left_out:
        output.result(f"  left out: run {left['run']}: {left['why']}")
    if built.unsealed:
        output.result(f"  {built.unsealed} row(s) not sealed yet were left out")
    output.note(f"check it anywhere: amdflash audit verify --bundle {out} --key PUBFILE (the host key kept apart "
                "from the bundle; without --key, the bundle's own host.pub)")
    return EXIT_OK


def _say_witnesses(out: Path, files: list[str], witnesses: tuple[Any, ...]) -> None:
    """What the bundle holds of the witnesses and of trusted time, in a line."""
    import time

    from amdflash.store import witness as ws

    tokens = [n for n in files if n.startswith("tsa") and n.endswith(".tsr")]
    if "checkpoint.cosigned" in files:
        try:
            head = ws.parse_note((out / "checkpoint.cosigned").read_text())
            k = len(ws.cosigned_by(head, list(witnesses), time.time()))
        except (OSError, UnicodeDecodeError, ws.WitnessError):
            k = 0
        again = " ('amdflash audit witness' asks the witnesses again; then a new bundle)" if k < len(witnesses) else ""
        output.result(f"  witnesses: checkpoint.cosigned, the receipt's tree head cosigned by {k} of the "
                      f"{len(witnesses)} witnesses configured; {len(tokens)} timestamp token(s){again}")
    elif witnesses and "receipt.intoto.json" in files:
        output.result("  witnesses: none yet (no witness cosigned a tree head holding the receipt): 'amdflash audit "
                      "witness', then a new bundle")


def _witnesses(args: argparse.Namespace) -> tuple[Any, ...]:
    """The config file's witnesses, whose verifier keys the bundle carries (none when it names none)."""
    from amdflash.pipeline.engine import witnessing

    conf = witnessing.configured(getattr(args, "settings", None))
    return conf.witnesses if conf is not None else ()


# -- audit verify --bundle --------------------------------------------------------------------------

def cmd_verify_bundle(args: argparse.Namespace) -> int:
    policy = None
    if getattr(args, "policy", None) is not None:
        from amdflash.store.policy import PolicyError, load

        if getattr(args, "key", None):
            raise Refusal("--policy names the host key: not with --key")
        try:
            policy = load(args.policy)
        except PolicyError as e:
            raise Refusal(str(e)) from None
    report = _checked(args.bundle, getattr(args, "key", None), policy)
    if getattr(args, "format", "text") == "json":
        output.result_json(report.as_json())
    else:
        output.result(report.describe())
    return EXIT_OK if report.ok else EXIT_FAILED


def _checked(directory: Path, keyfiles: list[Path] | None, policy: Any = None) -> Any:
    from amdflash.store import bundle, keys

    if keyfiles:
        for k in keyfiles:
            try:
                keys.read_public(k)
            except keys.KeyError_ as e:
                raise Refusal(str(e)) from None
    try:
        return bundle.check(directory, keyfiles, policy)
    except bundle.BundleRefused as e:
        raise Refusal(str(e)) from None


def verify_conflicts(args: argparse.Namespace) -> None:
    others = [o for o, v in (("--run", args.run), ("--export", args.export), ("--since", args.since),
                             ("--until", args.until), ("--central", getattr(args, "central", None)),
                             ("--anchor", args.anchor)) if v]
    if others:
        raise Refusal(f"--bundle checks a bundle on its own, without the database: not with {others[0]}")


# -- restore-original --from-bundle -------------------------------------------------------------------

def restore_from_bundle(args: argparse.Namespace, session: Any, engine: Any) -> Any:
    """The board commands' results of writing the bundle's original back (after every check):
    `session` and `engine` as cli/board.py makes them from the same arguments."""
    from amdflash.pipeline.commands import board as commands

    report = _checked(args.from_bundle, None)
    if not report.ok:
        raise Refusal(f"bundle {args.from_bundle} does not verify ({report.problem}): nothing was written")
    if report.original is None:
        raise Refusal(f"bundle {args.from_bundle} holds no original: the trail held no sealed backup of the board")
    return commands.restore_from_bundle(session, report.original, report.held, report.boards, str(args.from_bundle),
                                        args.force, engine)
