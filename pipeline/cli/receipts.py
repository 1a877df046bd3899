"""`audit receipt` (a run's in-toto receipt in a DSSE envelope) and `audit log` (the host's
transparency log: its newest signed tree head, a receipt's inclusion proof, a consistency
proof, its verifier key). Registered by pipeline/cli/audit.py."""
from __future__ import annotations

import argparse
import sys

from amdflash.pipeline.commands.checks import output_option, write_output
from amdflash.pipeline.errors import EXIT_FAILED, EXIT_OK, Refusal
from amdflash.pipeline.cli import output


def add_parsers(audit_sub: argparse._SubParsersAction) -> None:
    p = audit_sub.add_parser(
        "receipt", help="write a run's signed receipt (in-toto statement in a DSSE envelope)",
        description="Build the receipt of one run from its sealed rows (the run must verify): an in-toto "
                    "Statement v1 whose subjects are the image written, the board's content before, the read-back "
                    "of a verify that passed, the board's identity as a salted hash and the run's final "
                    "checkpoint, and whose predicate (https://amdflash.dev/flash-run/v1) sums up the run; in a DSSE "
                    "envelope signed with the host key. The same bytes every time (canonical JSON, RFC 8785; "
                    "Ed25519): the transparency log's leaf proves any copy. 'openssl pkeyutl -verify -rawin' "
                    "checks it with 'amdflash audit key --pem' (docs/compliance.md).")
    p.add_argument("--run", required=True, metavar="RUN_ID", help="the run (a unique prefix is enough)")
    output_option(p, "write to FILE (default stdout, the exact bytes)")
    p.set_defaults(func=cmd_receipt)

    p = audit_sub.add_parser(
        "log", help="this host's transparency log: the newest signed tree head, or a proof",
        description="The host's transparency log (an RFC 6962 Merkle tree of every sealed checkpoint's text and "
                    "of every ended run's receipt, beside the anchor) is first brought up to the trail, then: "
                    "without options, its newest tree head is printed (a C2SP tlog-checkpoint signed note); "
                    "--proof RUN writes the run's receipt inclusion proof (a C2SP tlog-proof file); "
                    "--consistency-from N writes the proof that the tree of N leaves is a prefix of the newest "
                    "(the body of a C2SP tlog-witness add-checkpoint request); --vkey prints the log's verifier "
                    "key. Go's golang.org/x/mod/sumdb/note and tlog check all of them (docs/compliance.md).")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--proof", metavar="RUN_ID", help="the inclusion proof of this run's receipt")
    what.add_argument("--consistency-from", type=int, metavar="N", help="a consistency proof from tree size N")
    what.add_argument("--vkey", action="store_true", help="print the log's note verifier key")
    output_option(p, "write to FILE (default stdout)")
    p.set_defaults(func=cmd_log)


def _emit(args: argparse.Namespace, data: bytes, what: str) -> None:
    if args.output:
        write_output(args, data, what)
        output.note(f"wrote {args.output}")
        return
    try:
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    except BrokenPipeError:
        pass


def cmd_receipt(args: argparse.Namespace) -> int:
    """The receipt built from the trail by its host, checked against the copy the log holds;
    anyone else gets the log's copy (whose leaf the proofs are about)."""
    from amdflash.pipeline.commands import transparency
    from amdflash.pipeline.commands.board import db_path
    from amdflash.store import trail_log

    db = db_path(args)
    try:
        made = transparency.receipt(db, args.run)
    except transparency.NoHostKey as e:
        logged = trail_log.logged_receipt(transparency.log_dir(db), transparency.resolve(db, args.run))
        if logged is None:
            raise Refusal(f"{e}; and the transparency log holds no receipt of the run") from None
        output.note(f"the receipt as the transparency log holds it (leaf {logged[0]['i']}): {e}")
        _emit(args, logged[1], "receipt")
        return EXIT_OK
    logged = trail_log.logged_receipt(transparency.log_dir(db), made.run_id)
    if logged is not None and logged[1] != made.envelope:
        output.error(f"the receipt of run {made.run_id} built now differs from the one the transparency log holds "
                     f"(leaf {logged[0]['i']}): the run's rows or amdflash's receipt builder changed since it was "
                     "logged")
        return EXIT_FAILED
    _emit(args, made.envelope, "receipt")
    return EXIT_OK


def cmd_log(args: argparse.Namespace) -> int:
    from amdflash.pipeline.commands import transparency
    from amdflash.pipeline.commands.board import db_path
    from amdflash.store import tlog, trail_log

    db = db_path(args)
    settings = getattr(args, "settings", None)
    if args.proof:
        _, text = transparency.proof(db, args.proof, settings)
        _emit(args, text.encode(), "proof")
        return EXIT_OK
    head = transparency.log_now(db, settings)
    if args.vkey:
        _emit(args, ((tlog.verifier_key(transparency.log_dir(db)) or "") + "\n").encode(), "verifier key")
    elif args.consistency_from is not None:
        if not 0 <= args.consistency_from <= head.size:
            raise Refusal(f"--consistency-from {args.consistency_from}: the log has {head.size} leaves")
        _emit(args, trail_log.consistency_file(transparency.log_dir(db), args.consistency_from, head.note).encode(),
              "consistency proof")
    else:
        _emit(args, head.note.encode(), "tree head")
    return EXIT_OK
