"""`amdflash audit witness`: ask the configured witnesses again to cosign the transparency log's
newest tree head (a witness that was down at a run's end, a quorum not reached), and the
timestamp authorities to date it. `audit push` asks the same after it pushed (ask_after_push)."""
from __future__ import annotations

import argparse

from amdflash.pipeline.cli import output
from amdflash.pipeline.errors import EXIT_FAILED, EXIT_OK, UsageError


def add_parser(audit_sub: argparse._SubParsersAction) -> None:
    p = audit_sub.add_parser(
        "witness", help="ask the witnesses to cosign the transparency log's newest tree head",
        description="Ask every witness the config file names (witnesses, witness_quorum) that has not cosigned "
                    "the transparency log's newest tree head yet to cosign it (C2SP tlog-witness: with a "
                    "consistency proof from the tree it last cosigned), keep each cosignature that verifies beside "
                    "the anchor (DB.anchor.witnessed/), and once the quorum is reached ask the timestamp "
                    "authorities (timestamp_authorities) for RFC 3161 tokens over the cosigned head. Exit 0 when "
                    "the quorum cosigned it; 1 when not (each witness's answer said); a witness that refuses "
                    "because the log is not the one it cosigned before means the log was rolled back or forked.")
    p.add_argument("--format", choices=("text", "json"), default="text",
                   help="text: one line for people (default); json: the outcome as an object")
    p.set_defaults(func=cmd_witness)


def _ask(args: argparse.Namespace) -> tuple[str, dict]:
    from amdflash.pipeline.commands import board as commands
    from amdflash.pipeline.engine import witnessing

    conf = witnessing.configured(getattr(args, "settings", None))
    if conf is None:
        raise UsageError("no witnesses in the config file: name them as witnesses = [{url = \"...\", key = "
                         "\"name+keyid+base64\"}] (and witness_quorum)")
    db = commands.db_path(args)
    try:
        outcome = witnessing.ask(db, witnessing.HostLog(db), conf)
    except Exception as e:      # said as the outcome: the log has no head, a file unreadable
        from amdflash.stages.terminal import printable

        return "", {"words": f"not yet witnessed ({printable(str(e))})", "witnessed": False}
    return f"tree head of {outcome.size} entries: ", {
        "words": outcome.words(), "witnessed": outcome.witnessed, "tree_size": outcome.size,
        "cosigned_by": outcome.cosigned, "problems": outcome.problems, "refused": outcome.refused,
        "timestamps": outcome.timestamps}


def cmd_witness(args: argparse.Namespace) -> int:
    head, said = _ask(args)
    if args.format == "json":
        output.result_json(said, indent=2)
    else:
        output.result(head + said["words"])
    return EXIT_OK if said["witnessed"] else EXIT_FAILED


def ask_after_push(args: argparse.Namespace) -> None:
    """After `audit push`: when the config file names witnesses, ask them again (one line on
    stderr); the push's own result and exit status are not changed by it."""
    from amdflash.pipeline.engine import witnessing

    if witnessing.configured(getattr(args, "settings", None)) is None:
        return
    head, said = _ask(args)
    output.note(f"witnesses: {head}{said['words']}")
