"""The audit-trail commands on the command line: runs, report, audit verify."""
from __future__ import annotations

import argparse
import datetime as dt
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from amdflash.pipeline.commands import board as commands
from amdflash.pipeline.cli import output
from amdflash.stages.terminal import printable
from amdflash.pipeline.engine.auditdb import legacy_version
from amdflash.pipeline.commands.checks import output_option, writable_output, write_output
from amdflash.pipeline.errors import EXIT_FAILED, EXIT_OK, Refusal, UsageError
from amdflash.stages.files import write_new
from amdflash.stages.open_transport import BoardSpecError, parse_spec
from amdflash.store.read_checks import describe as describe_reads
from amdflash.store.status import ENDS

STATUSES = ("running", *ENDS)


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add runs and report (the `audit` group is pipeline/cli/audit.py's)."""
    p = sub.add_parser("runs", help="list runs in the audit database",
                       description="List every run with its status (running, succeeded, failed, interrupted, "
                                   "refused) and, for a run that did not succeed, the reason (its error or "
                                   "refusal, one line) and the resume that fixed it, if one did. Read-only.")
    p.add_argument("--format", choices=("text", "json"), default="text",
                   help="text: one line per run (default); json: one array of objects")
    p.add_argument("--json", dest="format", action="store_const", const="json", help="same as --format json")
    p.add_argument("--status", choices=STATUSES, help="only runs with this status")
    p.add_argument("--board", metavar="BOARD", help="only runs of this board: its --board spec, read as board "
                                                    "commands read it (sim:PATH from the current directory, a link "
                                                    "to a board is that board), or its flash's unique ID")
    p.add_argument("--since", metavar="DATE", help="only runs started at or after DATE: ISO date or time (UTC), "
                                                   "e.g. 2026-01-01")
    p.add_argument("--command", dest="run_command", metavar="COMMAND", help="only runs of this command (flash, "
                                                                            "resume, info, …)")
    p.set_defaults(func=cmd_runs)

    p = sub.add_parser("report", help="one run's report (text, JSON or HTML)",
                       description="Report RUN_ID (a unique prefix is enough): identity, image and result hashes, "
                                   "every unit's action and state, verify results, stages, errors. text and "
                                   "json print to stdout; html is one self-contained file with a sector map "
                                   "(use -o). Reads the audit database only; writes nothing but -o FILE.")
    p.add_argument("run_id", metavar="RUN_ID", help="the run (a unique prefix is enough)")
    p.add_argument("--format", choices=("text", "json", "html"), default="text",
                   help="text (default), json (the object every board command prints with --json) or html")
    p.add_argument("--json", dest="format", action="store_const", const="json", help="same as --format json")
    output_option(p, "write the report to FILE (default stdout)")
    p.add_argument("--pages", type=Path, metavar="DIR",
                   help="write the HTML pages of RUN_ID and of the runs its page names (the run it resumes, its "
                        "resumes, the run that fixed or superseded it, the runs whose backups it names, and theirs) "
                        "into the directory DIR, each as RUN.html, linked to each other (an existing page is "
                        "replaced only with --overwrite)")
    p.add_argument("--key", type=Path, action="append", metavar="PUBFILE",
                   help="check the run's signatures against this public key")
    p.add_argument("--against", metavar="COPY",
                   help="name each row of a run that does not verify that differs from this copy of it: an "
                        "'audit export' file, or the central record ('central', or its URL)")
    p.add_argument("--unverified", action="store_true",
                   help="write a run that does not verify to -o or --pages too, marked (stdout: always)")
    p.set_defaults(func=cmd_report)


def cmd_runs(args: argparse.Namespace) -> int:
    keep = run_filter(args.status, args.board, args.since, args.run_command)
    rows = [r for r in commands.runs(commands.db_path(args)) if keep(r)]
    return print_runs(rows, args.format, "no runs recorded" if keep is _every else "no run matches", run_cells)


def _every(row: dict[str, Any]) -> bool:
    return True


def run_filter(status: str | None = None, board: str | None = None, since: str | None = None,
               command: str | None = None) -> Callable[[dict[str, Any]], bool]:
    """Which runs `runs --status/--board/--since/--command` keeps (all given must hold). The
    status is the one shown (decided per run: a run with no end is checked against its
    process), so it is filtered here, after the one query."""
    if not any((status, board, since, command)):
        return _every
    after = None
    if since:
        try:
            after = dt.datetime.fromisoformat(since)
        except ValueError:
            raise Refusal(f"--since {since!r} is not an ISO date or time (e.g. 2026-01-01)") from None
        if after.tzinfo is None:
            after = after.replace(tzinfo=dt.UTC)

    boards = board_names(board) if board else set()

    def keep(r: dict[str, Any]) -> bool:
        return ((not status or r["status"] == status)
                and (not board or bool(boards & _recorded_names(r)))
                and (not command or r["command"] == command)
                and (after is None or (started := _started(r)) is not None and started >= after))
    return keep


def board_names(board: str) -> set[str]:
    """The names `runs --board` matches, read as a board command reads its --board: the text as
    given (a unique ID, a spec as recorded), a sim: path made absolute (`sim:b8` is the b8 of
    the current directory) and the board directory it resolves to (a link to a board is that
    board, with the same lock)."""
    names = {board}
    try:
        spec = parse_spec(board)
    except BoardSpecError:
        return names                  # not a spec: a unique ID, or a spec as some host recorded it
    names.add(str(spec))
    if spec.kind == "sim":
        names.add(f"sim:{os.path.realpath(spec.selector)}")
    return names


def _recorded_names(r: dict[str, Any]) -> set[str]:
    """A run's board as recorded (its spec, its flash's unique ID) and, for an emulated board,
    the directory its spec resolves to now."""
    spec, uid = r.get("board_spec"), r.get("unique_id")
    names = {x for x in (spec, uid) if isinstance(x, str)}
    if isinstance(spec, str) and spec.startswith("sim:/"):
        names.add(f"sim:{os.path.realpath(spec[4:])}")
    return names


def _started(r: dict[str, Any]) -> dt.datetime | None:
    """When the run started; None when its row says no time (a row written outside amdflash
    may hold anything): such a run is not shown as started after any date."""
    try:
        at = dt.datetime.fromisoformat(r["started"])
    except (TypeError, ValueError):
        return None
    return at if at.tzinfo is not None else at.replace(tzinfo=dt.UTC)


def print_runs(rows: list[dict[str, Any]], fmt: str, none: str,
               cells: Callable[[dict[str, Any]], list[str]]) -> int:
    """A list of runs as `runs` prints it: JSON, or one line per run of its `cells` in columns
    as wide as their widest cell (`none` if there is none)."""
    if fmt == "json":
        output.result_json(rows, indent=2)
        return EXIT_OK
    if not rows:
        output.note(none)
    for line in columns([cells(r) for r in rows]):
        output.result(line)
    return EXIT_OK


def columns(table: list[list[str]]) -> list[str]:
    """Rows of cells as lines whose columns line up: each column as wide as its widest cell
    (a status that says which run fixed or superseded it is wider than a plain one), the last
    left as it is."""
    widths = [max((len(row[i]) for row in table if i < len(row)), default=0)
              for i in range(max((len(row) for row in table), default=0))]
    return [" ".join(c.ljust(widths[i]) if i < len(row) - 1 else c for i, c in enumerate(row)).rstrip()
            for row in table]


REASON_WIDTH = 100


def one_line(text: str, width: int = REASON_WIDTH) -> str:
    """A recorded error or refusal on one line of at most `width` characters (… where cut)."""
    flat = printable(" ".join((text if isinstance(text, str) else cell(text)).split()))
    return flat if len(flat) <= width else flat[:width - 1].rstrip() + "…"


def shown_status(r: dict[str, Any]) -> str:
    """The status as a line shows it: a run another (resume) run fixed says which."""
    status = cell(r.get("status") or "?")
    if r.get("superseded_by"):      # a later run wrote its board: nothing of it is left to finish
        return f"{status} (superseded by {cell(r['superseded_by'])})"
    return f"{status} (fixed by {cell(r['fixed_by'])})" if r.get("fixed_by") else status


def cell(value: object) -> str:
    """A recorded value as one line of text. amdflash writes text here, but a row INSERTed by
    hand may hold a number, a BLOB, NULL or a newline, and listing the trail must still work,
    one line per run: it is where one looks (a newline forged a run's line)."""
    return "-" if value is None else printable(value if isinstance(value, str) else repr(value))


def run_cells(r: dict[str, Any]) -> list[str]:
    """One run's line, by column: run, command, status, start, then its board and the rest."""
    legacy = "  [legacy: recorded by an older amdflash, unsigned]" if r.get("legacy") else ""
    reason = f"  {one_line(r['reason'])}" if r.get("reason") and r.get("status") != "succeeded" else ""
    return [cell(r["run_id"]), cell(r["command"]), shown_status(r), cell(r["started"]),
            f"{cell(r['board_spec'])}{legacy}{reason}"]


def cmd_report(args: argparse.Namespace) -> int:
    if args.pages is not None:
        return _write_pages(args)
    if args.output is not None:
        writable_output(args.output, "report", args.overwrite)
    # A run that does not verify: shown, marked, on stdout; written to a file only when asked
    # (a file travels without the exit status that says so).
    export, central = copy_option(args.against)
    rep, page = commands.report(args.run_id, commands.db_path(args), html=args.format == "html", keys=args.key,
                                beside=args.output.parent if args.output is not None else None,
                                unverified=args.output is None or args.unverified, against=export, central=central,
                                advice=args.advice)
    if args.format == "json":
        import json

        text = json.dumps(rep, indent=2, default=str)
    elif page is not None:
        text = page
    else:
        text = render_text(rep)
    if args.output:
        write_output(args, text, "report")
        output.note(f"wrote {args.output}")
    else:
        output.result(text)
    return _unverified_end(rep, args.against)


def copy_option(against: str | None) -> tuple[Path | None, str | None]:
    """`report --against`: (an export file, the central record's URL)."""
    if against is None:
        return None, None
    if against == "central" or against.startswith(("postgresql://", "postgres://")):
        # As pipeline/cli/central.py's _url reads it (that module imports this one: not imported here).
        url = os.environ.get("AMDFLASH_CENTRAL") if against == "central" else against
        if not url:
            raise UsageError("--against central: no central database: set $AMDFLASH_CENTRAL, or give its "
                             "postgresql:// URL")
        try:
            import psycopg  # noqa: F401
        except ImportError:
            raise Refusal("--against: the central database needs psycopg: pip install 'amdflash[fleet]'") from None
        return None, url
    path = Path(against)
    if not path.is_file():          # checked before anything is read: bad input, exit 2
        raise Refusal(f"--against {printable(against)}: " + ("not a regular file" if path.exists() else
                                                               "no such file (an 'audit export' file, or 'central')"))
    return path, None


def _unverified_end(rep: dict[str, Any], against: str | None) -> int:
    """Exit 1, saying so, for the report of a run that does not verify."""
    u = rep.get("unverified")
    if u is None:
        if against is not None:
            output.note(f"run {rep['run_id']} verifies: nothing to compare with {printable(str(against))}")
        return EXIT_OK
    ranges = ", ".join(f"seq {lo}..{hi}" for lo, hi in u["vouched"])
    output.error(f"run {rep['run_id']} does not verify: {u['problem']}; shown: only what its checkpoints still vouch "
                 f"for ({ranges}), the rest marked as not verified; failing: "
                 + "; ".join(_span_words(s) for s in u["spans"]) + f" (check it: {u['check']})")
    return EXIT_FAILED


def _span_words(s: dict[str, Any]) -> str:
    where = f"seq {s['first_seq']}..{s['last_seq'] if s['last_seq'] is not None else 'end'}"
    cp = f" (checkpoint #{s['checkpoint']})" if s.get("checkpoint") is not None else ""
    tables = ", ".join(f"{t} {n}" for t, n in (s.get("tables") or {}).items())
    return f"{where}{cp}: {s['why']}; rows there: {tables or 'none'}"


def unverified_lines(u: dict[str, Any]) -> list[str]:
    """The text report's lines for what no checkpoint vouches for (store.partial_report)."""
    from amdflash.store.partial import difference_words

    lines = [f"NOT VERIFIED {u['problem']}",
             "vouched    only rows " + ", ".join(f"seq {lo}..{hi}" for lo, hi in u["vouched"])
             + ": what this report shows; the rest is not verified and not shown as fact"]
    for s in u["spans"]:
        lines.append(f"failing    {_span_words(s)}")
        if s.get("compared"):
            lines.append(f"  copy     {s['compared']}")
        for d in s.get("differences") or []:
            lines.append(f"  differs  {difference_words(d)}")
        if s.get("differences") == []:
            lines.append("  differs  no row differs from the copy")
    lines += [f"also       {n}" for n in u["notes"]]
    if u.get("copy"):
        lines.append(f"copy       {u['copy']}")
    if u.get("next"):
        lines.append(f"the row    {u['next']}")
    lines.append(f"check      {u['check']}")
    return lines


MAX_PAGES = 64       # pages one --pages writes: a run's whole story, not the whole trail


def _write_pages(args: argparse.Namespace) -> int:
    """`report RUN --pages DIR`: the page of RUN and of every run reached from it through the runs
    a page names, each DIR/RUN.html, linked to each other (store.html: a page links another only
    when that page is there). Every name is checked before any page is written."""
    from amdflash.store.html import related_runs, written_together
    from amdflash.store.run_rows import RunUnverified

    if args.output is not None:
        raise Refusal("--pages DIR and -o FILE: one or the other")
    if not args.pages.is_dir():
        raise Refusal(f"--pages {printable(str(args.pages))}: not a directory")
    db = commands.db_path(args)
    # The run named: refused if unknown, or if it does not verify (unless --unverified: marked).
    export, central = copy_option(args.against)
    first, _ = commands.report(args.run_id, db, keys=args.key, unverified=args.unverified, against=export,
                               central=central, advice=args.advice)
    reports: dict[str, dict[str, Any]] = {}
    queue = [first["run_id"]]
    while queue and len(reports) < MAX_PAGES:
        run = queue.pop(0)
        if run in reports:
            continue
        try:
            reports[run] = (first if run == first["run_id"] else
                            commands.report(run, db, keys=args.key, advice=args.advice)[0])
        except (Refusal, RunUnverified):
            continue          # not in this trail, or it does not verify: named on the pages as text, not linked
        queue += [r for r in related_runs(reports[run]) if r not in reports]
    targets = {run: args.pages / f"{run}.html" for run in reports}
    for path in targets.values():
        writable_output(path, "report page", args.overwrite)
    with written_together(targets):
        for run, path in targets.items():
            named = run == first["run_id"]
            _, page = commands.report(run, db, html=True, keys=args.key, beside=args.pages,
                                      unverified=named and args.unverified, against=export if named else None,
                                      central=central if named else None, advice=args.advice)
            write_new(path, page or "", overwrite=args.overwrite)
    output.note(f"wrote {len(targets)} linked page(s) in {args.pages}: " + ", ".join(p.name for p in targets.values()))
    return _unverified_end(first, args.against)


def render_text(rep: dict[str, Any]) -> str:
    from amdflash.store.html import clock_words

    b = rep["board"]
    counts: dict[str, int] = {}
    for u in rep["units"]:
        key = f"{u['action']}/{u['state']}"
        counts[key] = counts.get(key, 0) + 1
    badge = "  [EMULATED BOARD]" if rep.get("emulated") else ""
    # A claim recorded by an older amdflash, or pushed by another host, was never checked: one line.
    claimed = f" (claims to be {printable(rep['operator_claimed'])})" if rep.get("operator_claimed") else ""
    # An override is said where the run is named: a forced flash is never just "(flash, succeeded)".
    forced = "".join(f"; {o['option']} overrode the {o['overrode']}" for o in (rep.get("facts") or {}).get("overrides")
                     or () if o.get("overrode"))
    lines = [
        f"run        {rep['run_id']}  ({rep['command']}, {rep['status']}{forced}){badge}",
        f"started    {rep['started']}   ended {rep['ended'] or '-'}",
        f"clock      {clock_words(rep.get('clock_sync')) or 'unknown'}",
        f"operator   OS account {rep['operator']}{claimed} on {rep['host']} "
        f"(machine-id {rep.get('machine_id') or '-'})",
        f"amdflash   {rep['tool_version']}{' ' + rep['tool_revision'] if rep.get('tool_revision') else ''}",
        f"board      {b['spec']}  chip {b['chip'] or '?'}  jedec {b['jedec'] or '?'}  uid {b['unique_id'] or '?'}"
        f"{'  bridge ' + b['bridge_serial'] if b['bridge_serial'] else ''}",
        f"image      {rep['image_path'] or '-'}  sha256 {rep['image_sha256'] or '-'}",
        f"result     sha256 {rep['result_sha256'] or '-'}",
        f"audit      {rep['register_writes']} register writes, {rep['spi_transactions']} SPI transactions, "
        f"{rep['verifies']['ok']}/{rep['verifies']['total']} verifies ok",
    ]
    if rep["resumes_run_id"]:
        lines.append(f"resumes    {rep['resumes_run_id']}")
    for r in rep.get("resumed_by") or []:
        lines.append(f"resumed by {r['run_id']} ({r['status']})")
    legacy = (rep.get("chain") or {}).get("legacy")
    if legacy:
        lines.insert(1, f"legacy     {legacy}")
    if rep.get("finished_by"):
        lines.append(f"fixed by   {rep['finished_by']} (the resume that finished this run's work)")
    if rep.get("superseded_by"):
        lines.append(f"superseded {rep['superseded_by']} wrote this board since: nothing of this run is left to finish")
    for words in rep.get("registers_put_back") or ():
        lines.append(f"registers  {words} (before this run did anything)")
    reads = describe_reads(rep["reads"]) if rep.get("reads") is not None else None
    if reads:
        lines.append(f"reads      {reads}")
    if counts:
        lines.append("units      " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    for f in rep["verifies"]["failed"][:5]:
        lines.append(f"mismatch   unit {f['address']:#08x} attempt {f['attempt']}: {f['mismatch_address']:#08x} "
                     f"flash={f['flash_byte']:02x} image={f['image_byte']:02x}")
    if (rep.get("summary") or {}).get("note"):
        lines.append(f"note       {rep['summary']['note']}")
    if rep["error"]:
        lines.append(f"error      {rep['error']}")
    lines += end_lines(rep.get("outcome"))
    lines += fact_lines(rep)
    c = rep.get("chain") or {}
    lines.append(f"chain      {'intact' if c.get('ok') else 'BROKEN: ' + str(c.get('problem'))}; checkpoint "
                 f"#{c.get('checkpoint')} ({c.get('sealed')}) head {c.get('head')}")
    lines.append(f"signature  {c.get('signature')}; signed by {c.get('signed_by') or 'nobody'}")
    if c.get("unsealed_rows"):
        lines.append(f"unsealed   the run's last {c['unsealed_rows']} row(s) are not sealed by any checkpoint "
                     "(still being written, or their writer died): what they say is not verified")
    if rep.get("unverified") is not None:
        if rep.get("status_verified") is False and rep.get("recorded_status"):
            lines.insert(1, f"status     NOT VERIFIED: the trail says '{rep['recorded_status']}', but no "
                            "checkpoint that holds vouches for that row")
        lines += unverified_lines(rep["unverified"])
    # One field a line: a newline in a recorded value (a run id INSERTed by hand) is shown
    # escaped, never as a line of its own that reads as the report's.
    return "\n".join(printable(line) for line in lines)


def fact_lines(rep: dict[str, Any]) -> list[str]:
    """The facts store.facts found (registers, overrides, backup, VBIOS, unit times, how the run
    ended, a verify failure's diagnosis, the database read): the words the JSON and HTML carry."""
    said = (rep.get("facts") or {}).get("words") or ()
    return [f"{w['label']:<10} {w['text']}" for w in said]


def end_lines(end: dict[str, Any] | None) -> list[str]:
    """What a failed or interrupted run left and the way out (pipeline.run_end), as lines."""
    if not end:
        return []
    from amdflash.pipeline.commands.run_end import backup_words

    when = " (when the run ended)" if end.get("fixed_by") or end.get("superseded_by") else ""
    lines = [f"state      {end['state']}{when}" if end.get("state") else None,
             f"backup     {backup_words(end)}" if backup_words(end) else None,
             f"next       {end['next_step']}" if end.get("next_step") else None,
             f"next       none: fixed by {end['fixed_by']}" if end.get("fixed_by") else None,
             f"next       none: superseded by {end['superseded_by']} (what the board holds now is that run's)"
             if end.get("superseded_by") else None]
    return [line for line in lines if line]


def cmd_audit_verify(args: argparse.Namespace) -> int:
    path = commands.db_path(args)
    if legacy_version(path):
        return _verify_legacy_file(path, args.key)
    result = commands.audit_verify(path, args.run, args.key, args.anchor)
    output.result(result.describe())
    return EXIT_OK if result.ok else EXIT_FAILED


def _verify_legacy_file(path: str, keyfiles: list[Any] | None) -> int:
    """`audit verify` of a database of an older amdflash, as it is and read-only: its own,
    unsigned chain (whole: it has no per-run seals). Nothing in it is signed, so with --key
    it cannot verify (exit 1)."""
    from amdflash.store.migrate import MigrationRefused, read_legacy
    from amdflash.store.writer.database import needs_upgrade

    try:
        head_seq, head_hash, runs = read_legacy(path)
    except MigrationRefused as e:
        output.result(f"audit chain BROKEN in the database (an older amdflash's, unsigned): {e}")
        return EXIT_FAILED
    legacy = (f"{head_seq} legacy rows (seq 1..{head_seq}, {runs} run(s)) verified by their unsigned v1 chain "
              f"only (head hash {head_hash}): nothing in this file is signed, so nothing proves who wrote it")
    if keyfiles:
        output.result(f"audit chain NOT SIGNED in the database: {legacy}; no signature can be checked against --key")
        output.note(needs_upgrade(path, 1))
        return EXIT_FAILED
    output.result(f"audit chain intact (legacy, unsigned): the database, recorded by an older amdflash\n"
                  f"legacy      {legacy}")
    output.note(needs_upgrade(path, 1) + " (this check changed nothing)")
    return EXIT_OK
