"""The `audit` group: every `audit` subcommand is registered here. Run here: `audit key`,
`audit verify` (database, --run, --key, --anchor), `audit archive`, `audit upgrade`, and the
host key's place in the data directory."""
from __future__ import annotations

import argparse
from pathlib import Path

from amdflash.pipeline.engine.auditdb import host_key_path, legacy_version, open_for_reading
from amdflash.pipeline.commands.checks import output_file, output_option, writable_output, write_output
from amdflash.pipeline.errors import EXIT_FAILED, EXIT_OK, Refusal
from amdflash.pipeline.cli import output


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """The `audit` group and every subcommand of it. Some run by other modules' functions:
    verify (the database: trail.py; --export: review.py; --central: central.py), export and
    datasette-metadata (review.py), push (central.py)."""
    from amdflash.pipeline.cli import central, receipts, review

    a = sub.add_parser("audit", help="check or export the audit trail",
                       description="Check the audit trail's hash chain, or export it for archiving.")
    audit_sub = a.add_subparsers(dest="audit_command", required=True, metavar="AUDIT_COMMAND")
    verify = audit_sub.add_parser(
        "verify", help="recompute the hash chain; name the first row that does not match",
        description="Recompute the hash chain of every run from its rows and check every checkpoint: its hash, "
                    "its place in the database's chain of checkpoints and its signature. With --run, only that run "
                    "(its rows and checkpoints: as fast for one run in a large database as in a small one). With "
                    "--key, every signature must be by that public key ('amdflash audit key'): this is what proves "
                    "that nobody rewrote the trail and recomputed its hashes. The anchor file (checkpoints appended "
                    "beside the database as they are made) shows whether the database lost its tail or was replaced "
                    "whole. Exit 1 naming the first thing that does not match. Read-only.")
    verify.set_defaults(func=cmd_verify)

    p = audit_sub.add_parser(
        "export", help="export audit rows with their signed checkpoints (JSONL or CSV) for archiving",
        description="Write every audit row (or one run's rows) in seq order with its table, seq and all columns, "
                    "the bytes they refer to, and the signed checkpoints that seal them, with the signing hosts' "
                    "public keys, the whole file sealed with this host's key. The file can be checked later on "
                    "its own, without the database: 'amdflash audit verify --export FILE [--key PUBFILE]'; one "
                    "run's export is that run's complete record. Rows are written as they are read: memory does "
                    "not grow with the trail. Reads the database only.")
    p.add_argument("--run", metavar="RUN_ID", help="only this run (a unique prefix is enough)")
    p.add_argument("--since", metavar="DATE",
                   help="only the runs that started at or after DATE (ISO date or time, UTC unless it says "
                        "otherwise): whole runs, chosen by their start time")
    p.add_argument("--until", metavar="DATE",
                   help="only the runs that started before DATE (whole runs, by their start time)")
    p.add_argument("--format", choices=("jsonl", "csv"), default="jsonl", help="default jsonl")
    p.add_argument("--compress", action="store_true",
                   help="gzip the export (also when FILE ends in .gz); 'audit verify --export' reads it as it is")
    output_option(p, "write to FILE (default stdout)")
    p.set_defaults(func=review.cmd_audit_export)

    p = audit_sub.add_parser(
        "datasette-metadata", help="write datasette metadata (canned queries, descriptions) for the audit DB",
        description="Write the metadata that makes 'datasette AUDIT.sqlite -m FILE' a browsable audit: "
                    "runs by status, failed units with the transactions of their last attempt, one board's "
                    "history, each run's seals, and a description of every table and column. datasette is optional: "
                    "pip install 'amdflash[datasette]'.")
    output_option(p, "write to FILE (default stdout)")
    p.add_argument("--name", help="the database name datasette will use: the audit DB's file name without "
                                  "extension (default: taken from --db / AMDFLASH_DB / the default path)")
    p.set_defaults(func=review.cmd_datasette_metadata)

    verify.add_argument("--export", type=Path, metavar="FILE",
                        help="verify an exported or archived file (JSONL or CSV from 'audit export' or 'audit "
                             "archive') instead of the database; exit 1 naming the first record that does not match")

    p = audit_sub.add_parser(
        "key", help="print this host's public key (it verifies the signatures of the audit trail)",
        description="Print the public half of this host's Ed25519 key, which signs every checkpoint of the "
                    "audit trail. Keep a copy apart from the database: 'amdflash audit verify --key FILE' then "
                    "proves the trail was sealed on this host. The private key is created on first use in the "
                    "data directory (mode 0600) and never leaves it.")
    output_option(p, "also write the public key to FILE")
    p.add_argument("--pem", action="store_true",
                   help="print (and write) the public key as PEM (SubjectPublicKeyInfo), which openssl reads: "
                        "'openssl pkeyutl -verify -rawin -pubin -inkey FILE' checks a receipt's signature")
    p.set_defaults(func=cmd_key)
    receipts.add_parsers(audit_sub)      # audit receipt, audit log (pipeline/cli/receipts.py)

    p = audit_sub.add_parser(
        "archive", help="move old runs to a signed, verifiable archive file and remove them from the database",
        description="Write every run that ended before DATE (and the runs those resumed) to FILE — a signed "
                    "export that 'amdflash audit verify --export FILE' checks on its own — then remove them "
                    "from the database, leaving a signed seal so that the database's chain still verifies "
                    "across the gap. Runs interleaved with newer ones stay until those can go too. Backup "
                    "images of archived runs stay where they are (--backups keep, default) or move into "
                    "FILE.backups/ (--backups move). Flashes on this host keep recording while the archive is "
                    "written: the database is read from a snapshot, and held only while the archived rows are "
                    "deleted and the seal written. Progress goes to stderr. The database file keeps its size "
                    "(new runs reuse the space) unless --compact is given.")
    p.add_argument("--before", required=True, metavar="DATE", help="ISO date or time (UTC), e.g. 2026-01-01")
    p.add_argument("-o", "--output", required=True, type=output_file, metavar="FILE",
                   help="the archive file (JSONL); a new file, never one that exists")
    p.add_argument("--backups", choices=("keep", "move"), default="keep",
                   help="backup images of archived runs: keep them in place (default) or move them beside FILE")
    p.add_argument("--compact", action="store_true",
                   help="shrink the database file afterwards (VACUUM): it rewrites the whole file and holds the "
                        "database meanwhile, so flashes on this host wait for it")
    p.set_defaults(func=cmd_archive)

    p = audit_sub.add_parser(
        "upgrade", help="upgrade a database of an older amdflash (unsigned) to today's signed trail, once",
        description="Upgrade the audit database (--db), written by an older amdflash (schema version 1: a hash "
                    "chain and no signatures), to today's schema, in place. Its version-1 chain is verified "
                    "first (a broken one is refused and the file left as it is). Its rows stay what they are: "
                    "recorded by an older amdflash, unsigned — so every view (runs, report, audit verify) says "
                    "so, and 'report --key' refuses them; the first signed checkpoint, this host's, covers only "
                    "what follows and records where the legacy part ends (the version-1 chain head). Only the "
                    "file's owner may upgrade it. No other command upgrades a database: reading one (runs, "
                    "report, replay, audit verify) never changes it, and a board command refuses it.")
    p.set_defaults(func=cmd_upgrade)

    verify.add_argument("--run", metavar="RUN_ID", help="verify only this run (a unique prefix is enough)")
    verify.add_argument("--since", metavar="DATE",
                        help="verify only the runs that started at or after DATE (ISO date or time, UTC unless it "
                             "says otherwise), each as --run does: whole runs, chosen by their start time")
    verify.add_argument("--until", metavar="DATE",
                        help="verify only the runs that started before DATE (whole runs, by their start time)")
    verify.add_argument("--key", type=Path, action="append", metavar="PUBFILE",
                        help="trusted public key(s) ('amdflash audit key -o FILE'); repeatable")
    verify.add_argument("--anchor", type=Path, metavar="FILE",
                        help="anchor file to compare with (default: beside the database, DB.anchor; missing there, "
                             "it is a finding only where the trail's checkpoints record that very path: on a copy "
                             "elsewhere, the tail's completeness is 'not proven')")
    verify.add_argument("--format", choices=("text", "json"), default="text",
                        help="text (default); json: the verdict as fields (verdict, proven, not_proven, would_prove)")

    p = audit_sub.add_parser(
        "push", help="send this host's trail (what the central database lacks) to the central PostgreSQL",
        description="Send the checkpoints the central database does not hold yet for this host, the rows they "
                    "seal and the bytes those rows refer to. The central database verifies everything itself "
                    "(every hash, the chain's continuity, the host's signatures) and stores a batch only if all "
                    "of it verifies; otherwise it names the first checkpoint or row that does not, and stores "
                    "nothing of the batch. Rows of a run not sealed yet wait for the next push. Idempotent: "
                    "a second push sends nothing. Safe to kill: a batch is one transaction.")
    p.add_argument("--to", metavar="URL", help=f"the central database (default ${central.ENV_CENTRAL})")
    p.add_argument("--batch-rows", type=int, default=500_000, metavar="N",
                   help="rows per transaction, in whole checkpoints (default 500000)")
    p.add_argument("--format", choices=("text", "json"), default="text",
                   help="text: one line for people (default); json: what was sent, as an object")
    follow = p.add_argument_group(
        "follow (a service: amdflash-follow.service)",
        "--follow keeps running: it watches this host's trail (read-only) and publishes what its runs are doing — "
        "stage, bytes, rate, ETA and every end — to the central database's progress table within a second or two "
        "(advisory, unsigned: the signed trail stays the record), and pushes the trail after every run's end and "
        "every --push-every seconds. The jobs never wait for it; while central cannot be reached, what it saw "
        "waits and is sent when central answers.")
    follow.add_argument("--follow", action="store_true", help="run as the host's follow service (until SIGTERM)")
    follow.add_argument("--interval", type=float, default=0.5, metavar="SECONDS",
                        help="how often the trail is read (default 0.5)")
    follow.add_argument("--push-every", type=float, default=30.0, metavar="SECONDS",
                        help="push the signed trail at least this often (default 30; and after every run's end)")
    follow.add_argument("--heartbeat", type=float, default=30.0, metavar="SECONDS",
                        help="say the host is alive this often when nothing else is said (default 30)")
    follow.add_argument("--exporter-config", type=Path, default=Path("/run/amdflash-exporter/exporter.yaml"),
                        metavar="FILE", help="this host's exporter configuration, which names each board's place "
                                             "(default /run/amdflash-exporter/exporter.yaml)")
    follow.add_argument("--host-name", metavar="NAME",
                        help="this host's exporter name, for place names (default: its enrolled name)")
    p.set_defaults(func=central.cmd_push)

    from amdflash.pipeline.cli import witness     # audit witness: ask the witnesses again

    witness.add_parser(audit_sub)

    # `audit bundle`, and `audit verify --bundle DIR`: the evidence of a run, checked offline.
    from amdflash.pipeline.cli import bundle

    bundle.add_parsers(audit_sub, verify)

    # `audit verify --central URL`: the central record as the trail's off-host anchor.
    verify.add_argument("--central", metavar="URL",
                        help="also compare every checkpoint with what the central database holds for this host: a "
                             "checkpoint rewritten, or a tail cut or rolled back after it was pushed, is BROKEN "
                             "(exit 1, naming the first checkpoint that differs)")


def cmd_verify(args: argparse.Namespace) -> int:
    """`audit verify`: the database or, with --export, a file; with --central, then the central record."""
    from amdflash.pipeline.cli import bundle, central

    if getattr(args, "bundle", None) is not None:
        bundle.verify_conflicts(args)
        return bundle.cmd_verify_bundle(args)
    if getattr(args, "policy", None) is not None:
        raise Refusal("--policy holds a bundle to a reviewer's keys: give the bundle with --bundle DIR")
    return central.cmd_verify(args, _verify_database_or_export)


def _verify_database_or_export(args: argparse.Namespace) -> int:
    from amdflash.pipeline.cli import review, trail

    if getattr(args, "format", "text") == "json" and (args.export is not None or args.since or args.until
                                                      or args.central):
        raise Refusal("--format json gives the verdict of the database or of one run (--run): not with --export, "
                      "--since/--until or --central")
    if getattr(args, "since", None) or getattr(args, "until", None):
        return _verify_window(args)
    if args.export is None:
        if legacy_version(commands_db(args)):
            if args.format == "json":
                raise Refusal("--format json: this database is an older amdflash's (unsigned, schema version 1); "
                              "'audit verify' checks its own chain and says so in text only")
            return trail.cmd_audit_verify(args)      # an older amdflash's file, read as it is
        return _verify_here(args)
    return review.cmd_verify_export(args.export, getattr(args, "key", None))


def commands_db(args: argparse.Namespace) -> str:
    from amdflash.pipeline.commands.board import db_path

    return db_path(args)


def _verify_here(args: argparse.Namespace) -> int:
    """`audit verify [--run RUN]`: the verdict — what it proved, what it could not and what would
    (store.verdicts) — exit 0 when nothing it checked is wrong, 1 for what it found wrong."""
    import os

    from amdflash.pipeline.commands import board as commands
    from amdflash.store.verdicts import verify_command

    path = commands_db(args)
    result = commands.audit_verify(path, args.run, args.key, args.anchor)
    if getattr(args, "central", None) and result.unwitnessed is not None:
        result.unwitnessed = None           # the tail is compared with the central record next
    run = result.scope[len("run "):] if result.key is not None else None
    command = verify_command(os.path.abspath(path), run, [str(k) for k in args.key or ()])
    if args.format == "json":
        output.result_json(result.as_json(command), indent=2)
    else:
        output.result(result.describe(command))
    return EXIT_OK if result.verdict == "intact" else EXIT_FAILED


def _verify_window(args: argparse.Namespace) -> int:
    """`audit verify --since/--until`: each run that started in the window, as --run verifies
    it (each costs that run, not the trail); exit 1 if any does not hold."""
    from amdflash.pipeline.cli import review
    from amdflash.pipeline.commands import board as commands
    from amdflash.pipeline.engine.auditdb import legacy_version
    from amdflash.store.export import runs_started

    since, until = review.parse_when(args.since, "--since"), review.parse_when(args.until, "--until")
    if args.run or args.export is not None:
        raise Refusal("--since/--until choose the runs to verify by their start time: not with --run or --export")
    if since and until and until <= since:
        raise Refusal(f"--until {args.until} is not after --since {args.since}: no run can have started between")
    path = commands.db_path(args)
    if legacy_version(path):
        raise Refusal(f"audit database {path} is an older amdflash's (no per-run seals): 'audit verify' checks it "
                      "whole")
    db = open_for_reading(path)
    try:
        runs = runs_started(db.conn, since, until)
    finally:
        db.conn.close()
    window = " and ".join(w for w in (f"from {args.since}" if since else "", f"before {args.until}" if until else "")
                          if w)
    if not runs:
        raise Refusal(f"no run of the trail started {window}: nothing to verify")
    broken = []
    for run_id in runs:
        result = commands.audit_verify(path, run_id, args.key, args.anchor)
        output.result(result.describe())
        if result.verdict != "intact":
            broken.append(run_id)
    output.result(f"{len(runs)} run(s) started {window}: " + (f"{len(broken)} BROKEN (first: {broken[0]})" if broken
                                                               else "every one intact"))
    return EXIT_FAILED if broken else EXIT_OK


def cmd_key(args: argparse.Namespace) -> int:
    from amdflash.pipeline.commands.board import db_path
    from amdflash.store import keys

    path = host_key_path(db_path(args))     # the key that signs this database (one key, however named)
    try:
        key = keys.load_or_create(path)
    except (OSError, keys.KeyError_) as e:
        raise Refusal(f"host key {path}: {e}") from None
    public = keys.public_bytes(key)
    line = keys.public_line(public)
    if getattr(args, "pem", False):
        from cryptography.hazmat.primitives import serialization

        line = key.public_key().public_bytes(serialization.Encoding.PEM,
                                             serialization.PublicFormat.SubjectPublicKeyInfo).decode().strip()
    output.result(line)
    output.note(f"fingerprint {keys.fingerprint(public)}  (private key: {path})")
    if args.output:
        write_output(args, line + "\n", "public key file")
        output.note(f"wrote {args.output}")
    return EXIT_OK


def _every_second(say):
    """`say`, at most once a second (and always for a message not about rows)."""
    import time

    last = [0.0]

    def progress(message: str) -> None:
        now = time.monotonic()
        if " rows written " not in message or now - last[0] >= 1.0:
            last[0] = now
            say(message)
    return progress


def cmd_archive(args: argparse.Namespace) -> int:
    import datetime as dt

    from amdflash.pipeline.commands.board import db_path
    from amdflash.store.archive import ArchiveRefused, archive

    try:
        before = dt.datetime.fromisoformat(args.before)
    except ValueError:
        raise Refusal(f"--before {args.before!r} is not an ISO date or time (e.g. 2026-01-01)") from None
    if before.tzinfo is None:
        before = before.replace(tzinfo=dt.UTC)
    writable_output(args.output, "archive")      # a new file: an existing one is refused
    path = db_path(args)
    open_for_reading(path).conn.close()   # refuses a missing or foreign database; upgrades an old one
    try:
        result = archive(path, host_key_path(path), before, args.output, move_backups=args.backups == "move",
                         compact=args.compact, progress=_every_second(output.note))
    except ArchiveRefused as e:
        raise Refusal(str(e)) from None
    output.result(result.describe())
    return EXIT_OK


def cmd_upgrade(args: argparse.Namespace) -> int:
    import json
    import os

    from amdflash.pipeline.engine.auditdb import legacy_version, no_database
    from amdflash.pipeline.commands.board import db_path
    from amdflash.store import keys, migrate
    from amdflash.store.schema import SchemaError
    from amdflash.store.writer.database import StoreUnavailable

    path = db_path(args)
    if not Path(path).is_file():
        raise no_database(path)
    me = os.geteuid()
    for what, place in (("audit database", Path(path)), ("directory", Path(os.path.abspath(path)).parent)):
        owner = place.stat().st_uid
        if owner != me:
            # The upgrade signs with this user's key: it must never vouch for someone else's file.
            raise Refusal(f"{what} {place} belongs to uid {owner}, not to you (uid {me}): only the owner of "
                          f"{path} upgrades it, as that user")
    if not legacy_version(path):
        open_for_reading(path).conn.close()   # refuses a missing or foreign database
        output.result(f"audit database {path} is already of this amdflash's schema: nothing to upgrade")
        return EXIT_OK
    try:
        cp = migrate.upgrade(path, host_key_path(path))
    except (SchemaError, StoreUnavailable) as e:
        raise Refusal(str(e)) from None
    except (OSError, keys.KeyError_) as e:
        raise Refusal(f"audit database {path}: {e}") from None
    if cp is None:
        output.result(f"audit database {path} was upgraded meanwhile by another process")
        return EXIT_OK
    info = json.loads(cp.detail or "{}")
    output.result(f"upgraded {path}: {info['legacy_rows']} legacy rows (seq 1..{info['v1_head_seq']}) stay "
                  "recorded by an older amdflash, unsigned (their version-1 chain verified, head hash "
                  f"{info['v1_head_hash']}); signed checkpoint #{cp.id} marks where they end, and everything "
                  "recorded from now on is signed")
    return EXIT_OK
