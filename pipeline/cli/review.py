"""Commands for reviewers and first-time users: demo, audit export, audit verify --export,
audit datasette-metadata."""
from __future__ import annotations

import argparse
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

from amdflash.pipeline.commands.board import db_path
from amdflash.pipeline.commands.checks import writable_output, write_output
from amdflash.pipeline.errors import EXIT_FAILED, EXIT_OK, Refusal
from amdflash.pipeline.cli import output
from amdflash.stages.files import new_file

DATASETTE_METADATA = "datasette_metadata.json"
# The database key of the packaged metadata: datasette names a database by its file stem.
DATASETTE_DEFAULT_NAME = "audit"


def add_parsers(sub: argparse._SubParsersAction) -> None:
    from amdflash.pipeline.commands.demo import DEFAULT_DIR, DEFAULT_SEED

    p = sub.add_parser(
        "demo", help="a full recovery on an emulated board, no hardware needed",
        description="Walk through a recovery on an emulated board (synthetic: no hardware, no AMD image): "
                    "creates a board whose flash holds a damaged synthetic IFWI with SR2.CMP set, writes the "
                    "clean image beside it as the known-good image, then runs info, dump (backup), "
                    "flash --clear-cmp and verify exactly as you would, and prints the flash run's report. "
                    "Everything goes into DIR, including the demo's own audit database unless --db is given "
                    "(AMDFLASH_DB is ignored, so your audit trail is never touched by surprise).")
    p.add_argument("--dir", type=Path, default=DEFAULT_DIR, metavar="DIR",
                   help=f"demo directory (default ./{DEFAULT_DIR}); must be new or empty")
    p.add_argument("--fresh", action="store_true",
                   help="first remove everything inside DIR, if an earlier 'amdflash demo' made it")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED,
                   help=f"synthetic content and damage (default {DEFAULT_SEED})")
    p.set_defaults(func=cmd_demo)


# -- demo ----------------------------------------------------------------------------------------

def cmd_demo(args: argparse.Namespace) -> int:
    from amdflash.pipeline.commands.demo import run_demo

    flags = [f for f, on in (("--log-json", args.log_json), ("-v", args.verbose), ("-q", args.quiet)) if on]
    return run_demo(args.dir, fresh=args.fresh, db=Path(args.db) if args.db else None, seed=args.seed,
                    cli_flags=flags, main=args.main, say=output.result)


# -- audit export / verify --export --------------------------------------------------------------

def _open_db(args: argparse.Namespace):
    from amdflash.pipeline.engine.auditdb import open_for_reading

    return open_for_reading(db_path(args))


def parse_when(text: str | None, option: str):
    """An ISO date or time (UTC unless it says otherwise), or a refusal naming the option."""
    import datetime as dt

    if text is None:
        return None
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise Refusal(f"{option} {text!r} is not an ISO date or time (e.g. 2026-01-01 or 2026-01-01T08:00)") from None
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)


def _compressed(args: argparse.Namespace) -> bool:
    """gzip on request (--compress) or by the output's name (FILE.gz)."""
    suffix = args.output.suffix.lower() if args.output is not None else ""
    if suffix in (".zst", ".zstd"):
        raise Refusal(f"export {args.output}: zstd is not built in; name the file .gz (or give --compress) for a "
                      "gzip-compressed export, which 'audit verify --export' reads as it is")
    if args.compress and args.output is None and sys.stdout.isatty():
        raise Refusal("--compress writes gzip bytes: redirect stdout to a file, or give -o FILE.gz")
    return args.compress or suffix == ".gz"


def cmd_audit_export(args: argparse.Namespace) -> int:
    from amdflash.pipeline.engine.auditdb import host_key_path
    from amdflash.store.export import export, runs_started
    from amdflash.store.keys import KeyError_, load_private
    from amdflash.store.queries import RunNotFound, resolve_run

    since, until = parse_when(args.since, "--since"), parse_when(args.until, "--until")
    if args.run and (since or until):
        raise Refusal("--run exports one run, --since/--until the runs that started between two times: give one "
                      "or the other")
    if since and until and until <= since:
        raise Refusal(f"--until {args.until} is not after --since {args.since}: no run can have started between")
    compress = _compressed(args)
    if args.output is not None:
        writable_output(args.output, "export", args.overwrite)
    # Sealed with this account's host key if it has one; reading never makes one (a reviewer's
    # home gets no key): without, a one-off key seals it, and its public half is printed.
    key_path, one_off = host_key_path(db_path(args)), None
    try:
        key = load_private(key_path) if key_path.exists() else None
    except KeyError_ as e:
        raise Refusal(str(e)) from None
    if key is None:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        key = one_off = Ed25519PrivateKey.generate()
    db = _open_db(args)
    try:
        run_ids, scope = None, "the whole trail"
        if args.run:
            try:
                run_ids = [resolve_run(db, args.run)]
            except RunNotFound as e:
                raise Refusal(str(e)) from None
            scope = f"run {run_ids[0]}"
        elif since or until:
            run_ids = runs_started(db.conn, since, until)
            window = " and ".join(w for w in (f"from {args.since}" if since else "", f"before {args.until}"
                                              if until else "") if w)
            if not run_ids:
                raise Refusal(f"no run of the trail started {window}: nothing to export")
            scope = f"{len(run_ids)} run(s) started {window}"
        if args.output is None:
            try:
                summary = _export_to(sys.stdout.buffer if compress else None, compress,
                                     lambda out: export(db.conn, out, args.format, key, run_ids))
                sys.stdout.flush()
            except BrokenPipeError:
                # The reader stopped early (| head): no traceback, and none again at exit.
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                return EXIT_FAILED
        else:
            # Written aside and renamed: an interrupted export never leaves a plausible file.
            with new_file(args.output, overwrite=args.overwrite) as raw:
                summary = _export_to(raw, compress, lambda out: export(db.conn, out, args.format, key, run_ids))
        broken = _not_verifying(db.conn, run_ids or [])
    finally:
        db.conn.close()
    where = f"wrote {args.output}" if args.output else "exported"
    head = f"; last checkpoint #{summary.head.id} hash {summary.head.hash.hex()}" if summary.head else ""
    left = f"; {summary.unsealed} rows not sealed yet were left out" if summary.unsealed else ""
    output.note(f"{where}: {summary.rows} rows and {summary.checkpoints} signed checkpoints of {scope}, "
                f"{args.format}{', gzip' if compress else ''}{head}{left}")
    if one_off is not None:
        from amdflash.store.keys import public_bytes, public_line

        output.note(f"sealed with a one-off key, {public_line(public_bytes(one_off))} (this account has no host "
                    f"key at {key_path}, and reading makes none): the rows and checkpoints are vouched for by the "
                    "recording host's signatures; 'audit verify --export' with --key needs this key too (save the "
                    "line above to a file and give it as a second --key)")
    for run_id, problem in broken:
        output.note(f"warning: run {run_id} does not verify: {problem} — the export carries its rows as they are, and "
                    "'amdflash audit verify --export FILE' names the same")
    return EXIT_FAILED if broken else EXIT_OK


def _not_verifying(conn, run_ids: list[str]) -> list[tuple[str, str]]:
    """The exported runs (--run, --since/--until) that do not verify, with what breaks each:
    an export is evidence as recorded, never a word that the run holds (each costs its run)."""
    from amdflash.store.verify import verify_run

    found = []
    for run_id in run_ids:
        report = verify_run(conn, run_id)
        if not report.ok:
            found.append((run_id, str(report.problem)))
    return found


def _export_to(raw, compress: bool, write):
    """Run write(text stream) into the binary stream `raw` (None: sys.stdout as it is), through
    gzip when `compress`; the stream is left open (its owner closes it)."""
    import gzip

    if raw is None:
        return write(sys.stdout)
    # mtime 0 and no file name in the header: the same export compresses to the same bytes.
    gz = gzip.GzipFile(filename="", fileobj=raw, mode="wb", compresslevel=6, mtime=0) if compress else None
    text = io.TextIOWrapper(gz or raw, encoding="utf-8", newline="")
    summary = write(text)
    text.flush()
    text.detach()      # the binary stream stays open
    if gz is not None:
        gz.close()     # writes gzip's trailer; `raw` itself stays open
    return summary


def cmd_verify_export(path: Path, keyfiles: list[Path] | None = None) -> int:
    from amdflash.store.export import ExportFormatError, verify_export
    from amdflash.store.keys import KeyError_

    if not path.is_file():
        raise Refusal(f"no export file at {path}")
    try:
        report = verify_export(path, keyfiles)
    except KeyError_ as e:
        raise Refusal(str(e)) from None
    except ExportFormatError as e:     # not an export at all: nothing to verify
        raise Refusal(f"{path} is not a well-formed amdflash export: {e}") from None
    output.result(report.describe())
    return EXIT_OK if report.ok else EXIT_FAILED




# -- datasette -----------------------------------------------------------------------------------

def datasette_metadata(name: str = DATASETTE_DEFAULT_NAME) -> dict[str, Any]:
    """The packaged metadata, keyed by the database name datasette will use."""
    from amdflash.store import schema

    # Beside the store modules rather than importlib.resources: an editable install made while
    # store/ had no __init__.py maps it as a namespace package, which resources cannot read.
    metadata = json.loads(Path(schema.__file__).with_name(DATASETTE_METADATA).read_text(encoding="utf-8"))
    metadata["databases"] = {name: metadata["databases"][DATASETTE_DEFAULT_NAME]}
    return metadata


def cmd_datasette_metadata(args: argparse.Namespace) -> int:
    db = Path(db_path(args))
    name = args.name or db.stem
    text = json.dumps(datasette_metadata(name), indent=2) + "\n"
    if args.output is None:
        sys.stdout.write(text)
    else:
        write_output(args, text)
        output.note(f"wrote {args.output} (database name {name!r})\n"
                    f"  browse: datasette {db} -m {args.output}   (pip install 'amdflash[datasette]')")
    return EXIT_OK
