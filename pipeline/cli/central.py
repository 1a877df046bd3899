"""The central record on the command line: `audit push`, `audit verify --central`,
`fleet central-setup`, `fleet enroll`, `fleet runs` and `fleet report`.

The central readers print with the local commands' own renderers: `fleet runs` with the
line of `amdflash runs` (the host added in front), `fleet report` by copying the run out of
the central database into a temporary SQLite trail of the host's schema and running the
local report on it — the same text, JSON and HTML, and the run's chain checked once more.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from amdflash.pipeline.cli import output
from amdflash.pipeline.commands.checks import output_option, write_output
from amdflash.pipeline.errors import EXIT_FAILED, EXIT_OK, Refusal, UsageError
from amdflash.store.status import ENDS

ENV_CENTRAL = "AMDFLASH_CENTRAL"
ENV_NOTIFY = "AMDFLASH_NOTIFY"


PSYCOPG_HINT = "the central database needs psycopg: pip install 'amdflash[fleet]'"


def _url(given: str | None, option: str) -> str:
    """The central database's URL — every central command starts here, so it is also where a
    missing extra is a usage error (exit 2, as labgrid's is for the fleet commands)."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        raise Refusal(PSYCOPG_HINT) from None
    url = given or os.environ.get(ENV_CENTRAL)
    if not url:
        raise UsageError(f"no central database: give {option} postgresql://… or set ${ENV_CENTRAL}")
    if not url.startswith(("postgresql://", "postgres://")) and "=" not in url:
        from amdflash.pipeline.fleet.serve.words import mask_url

        raise UsageError(f"{option} {mask_url(url)}: expected a PostgreSQL URL (postgresql://USER@HOST/DB) or "
                         "a libpq connection string")
    return url


_SIZE = re.compile(r"(\d+)\s*([KMGT]?)(?:i?B)?", re.IGNORECASE)


def byte_size(text: str) -> int:
    """A size in bytes: N, or N with K, M, G or T (binary multiples: 64G is 64 GiB)."""
    m = _SIZE.fullmatch(text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (bytes, or a number with K, M, G or T)")
    return int(m[1]) << (10 * "_KMGT".index((m[2] or "_").upper()))


def add_fleet_parsers(fsub: argparse._SubParsersAction) -> None:
    p = fsub.add_parser(
        "central-setup", help="create the central audit database's tables, checks and roles (administrator)",
        description="Create schema 'amdflash' in the central PostgreSQL database: insert-only tables mirroring "
                    "the hosts' trails, the checks that verify every push (PL/pgSQL, sha256(), and an Ed25519 "
                    "check in PL/Python — the server needs postgresql-plpython3 and python3-cryptography), and "
                    "the roles amdflash_push (INSERT; each login reads only its own host's rows, through the "
                    "own_* views) and amdflash_read (SELECT on everything), everything owned by amdflash_owner, a "
                    "role that cannot log in; each host's progress rows bounded (amdflash.progress_limits). Run "
                    "once, as a superuser; run again on a database set up by an earlier amdflash (central schema "
                    "version 2 or 3) to upgrade it in place (no row of the record changes).")
    p.add_argument("url", metavar="URL", nargs="?", help=f"the central database (default ${ENV_CENTRAL})")
    p.add_argument("--blob-quota", type=byte_size, default=None, metavar="SIZE",
                   help="bytes of blobs (backups, data read and written) each host may store unless its enrolment "
                        "sets its own; K, M, G, T multiples (default 64G)")
    p.set_defaults(func=cmd_setup)

    p = fsub.add_parser(
        "enroll", help="trust a host's public key in the central database (administrator)",
        description="Record a host's public key (the file 'amdflash audit key -o FILE' writes on that host) "
                    "under a name, bound to the one login that pushes for it. The central database accepts a "
                    "host's checkpoints only signed by its enrolled key and pushed by its login.")
    p.add_argument("--to", metavar="URL", help=f"the central database (default ${ENV_CENTRAL})")
    p.add_argument("--key", type=Path, required=True, metavar="PUBFILE", help="the host's public key file")
    p.add_argument("--name", required=True, help="the host's name in the central record")
    p.add_argument("--login", metavar="ROLE",
                   help="the one PostgreSQL login that pushes for this host (default: the host's name); made, in "
                        "amdflash_push, if it does not exist (set its password or other authentication yourself)")
    p.add_argument("--blob-quota", type=byte_size, default=None, metavar="SIZE",
                   help="bytes of blobs this host may store (default: the one set at central-setup)")
    p.set_defaults(func=cmd_enroll)

    p = fsub.add_parser(
        "runs", help="list every host's runs from the central database",
        description="The runs of every host of the line, as 'amdflash runs' lists a host's own, read from the "
                    "central database (host first): each with its status, and for a run that did not succeed the "
                    "reason and the resume that fixed it, if one did. Read-only.")
    p.add_argument("--from", dest="source", metavar="URL", help=f"the central database (default ${ENV_CENTRAL})")
    p.add_argument("--host", metavar="HOST", help="only this host's runs")
    p.add_argument("--format", choices=("text", "json"), default="text",
                   help="text: one line per run, host first (default); json: one array of objects")
    p.add_argument("--json", dest="format", action="store_const", const="json", help="same as --format json")
    p.add_argument("--status", choices=("running", *ENDS), help="only runs with this status")
    p.add_argument("--board", metavar="BOARD", help="only runs of this board: its --board spec or its flash's "
                                                    "unique ID")
    p.add_argument("--since", metavar="DATE", help="only runs started at or after DATE: ISO date or time (UTC)")
    p.add_argument("--command", dest="run_command", metavar="COMMAND", help="only runs of this command")
    p.set_defaults(func=cmd_runs)

    p = fsub.add_parser(
        "report", help="one run's report from the central database (text, JSON or HTML)",
        description="The report of RUN_ID (HOST/RUN_ID, or --host HOST; a unique prefix is enough) as "
                    "'amdflash report' prints it, read from the central database; the run's chain and signatures "
                    "are checked again on the way (exit 1 if they do not hold). A run ID that runs of several "
                    "hosts match is refused (exit 2), naming the hosts.")
    p.add_argument("run_id", metavar="[HOST/]RUN_ID",
                   help="the run (a unique prefix is enough), HOST/ to name its host")
    p.add_argument("--host", metavar="HOST", help="the run's host")
    p.add_argument("--from", dest="source", metavar="URL", help=f"the central database (default ${ENV_CENTRAL})")
    p.add_argument("--format", choices=("text", "json", "html"), default="text",
                   help="text (default), json or html, as 'amdflash report' prints them")
    p.add_argument("--json", dest="format", action="store_const", const="json", help="same as --format json")
    output_option(p, "write the report to FILE (default stdout)")
    p.add_argument("--key", type=Path, action="append", metavar="PUBFILE",
                   help="the signatures must be by this public key (repeatable)")
    p.set_defaults(func=cmd_report)

    p = fsub.add_parser(
        "serve", help="a read-only web view of the line: live boards, run reports, history, health, metrics",
        description="Serve the line from the central database over HTTP: every board live (host, place, state, "
                    "stage, progress, ETA; failures first), each run's report (checked again here against its "
                    "host's enrolled key), the history with filters, each host's push health, and /metrics for "
                    "Prometheus. Read-only: connect as a member of amdflash_read. Binds 127.0.0.1 by default; put "
                    "it behind a reverse proxy that authenticates (README, 'Running a line'). It answers only "
                    "requests for its own name (Host: the listen address, localhost, each --allowed-host). "
                    "--notify sends run failed or interrupted, a host silent too long, and the line done, "
                    "through Apprise, as plain text, each run end once (kept in --state-dir across restarts). "
                    "A URL on the command line is visible to every local user (ps): give secrets by file "
                    f"(--from-file, --notify-file) or environment (${ENV_CENTRAL}, ${ENV_NOTIFY}).")
    p.add_argument("--from", dest="source", metavar="URL", help=f"the central database (default ${ENV_CENTRAL})")
    p.add_argument("--from-file", type=Path, metavar="PATH",
                   help="read the central database's URL from this file (its first line that is not a # comment)")
    p.add_argument("--listen", default="127.0.0.1:8470", metavar="HOST:PORT",
                   help="where to listen (default 127.0.0.1:8470: this machine only)")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="also answer requests for this Host: name (repeatable; e.g. the reverse proxy's "
                        "line.example.org); any other is refused (400)")
    p.add_argument("--notify", action="append", metavar="URL",
                   help="an Apprise URL to notify (repeatable): mailto://, slack://, matrix://, ntfy://, json:// "
                        f"(a webhook), ...; default: --notify-file, else ${ENV_NOTIFY} (URLs separated by white "
                        "space), else notify = [...] in the config file")
    p.add_argument("--notify-file", type=Path, metavar="PATH",
                   help="Apprise URLs to notify, one a line (# comments), from this file (keep it 0600)")
    p.add_argument("--state-dir", type=Path, metavar="DIR",
                   help="where notifications remember what they sent (default $STATE_DIRECTORY, as systemd's "
                        "StateDirectory= sets it, else ~/.local/state/amdflash/serve)")
    p.add_argument("--stale-after", type=float, default=30.0, metavar="MINUTES",
                   help="a board that said running but nothing for this long no longer holds the line done "
                        "back (default 30)")
    p.add_argument("--silent-after", type=float, default=10.0, metavar="MINUTES",
                   help="notify when a host has neither pushed nor said anything for this long (default 10)")
    p.add_argument("--settle", type=float, default=30.0, metavar="SECONDS",
                   help="the line is done when no board has run for this long after some ended (default 30)")
    p.add_argument("--window", type=float, default=24.0, metavar="HOURS",
                   help="the line shows every board heard from in this many hours (default 24)")
    p.add_argument("--public-url", metavar="URL",
                   help="this view's address as people reach it (behind the proxy), for links in notifications")
    p.set_defaults(func=cmd_serve)


def cmd_push(args: argparse.Namespace) -> int:
    from amdflash.pipeline.commands import board as commands
    from amdflash.pipeline.engine.auditdb import open_reader
    from amdflash.store.central import push

    url = _url(args.to, "--to")
    if args.batch_rows < 1:
        raise UsageError("--batch-rows must be at least 1")
    if args.follow:
        return _follow(args, url)
    reader = open_reader(commands.db_path(args))
    try:
        report = push(reader.conn, url, args.batch_rows)
    finally:
        reader.conn.close()
    from amdflash.pipeline.cli.witness import ask_after_push

    ask_after_push(args)      # a witness that was down at a run's end is asked again
    logged, refused = _push_log(args, url)     # then the log, with what the witnesses just cosigned
    if args.format == "json":
        output.result_json({**vars(report), "log": vars(logged) if logged else None, "log_refused": refused},
                           indent=2)
    else:
        output.result(report.describe() + (f"\n{logged.describe()}" if logged else ""))
    if refused:
        output.error(refused)
        return EXIT_FAILED
    return EXIT_OK


def _push_log(args: argparse.Namespace, url: str) -> tuple[Any, str | None]:
    """This host's transparency log to the central record: (what was sent, None), (None, the
    database's refusal), or (None, None) when the host keeps no log."""
    from amdflash.pipeline.commands import board as commands
    from amdflash.pipeline.engine import witnessing
    from amdflash.pipeline.engine.auditdb import host_key_path
    from amdflash.store import tlog
    from amdflash.store.central import CentralError, push_log

    db = str(Path(commands.db_path(args)).expanduser())
    if not tlog.log_dir(db).is_dir():
        return None, None
    try:
        conf = witnessing.configured(getattr(args, "settings", None))
    except UsageError:
        conf = None          # (audit witness says what is wrong with them)
    try:
        return push_log(db, url, len(conf.witnesses) if conf else None, _host_public(host_key_path(db))), None
    except CentralError as e:
        return None, str(e)


def _follow(args: argparse.Namespace, url: str) -> int:
    from amdflash.pipeline.commands import board as commands
    from amdflash.pipeline.engine.auditdb import host_key_path
    from amdflash.pipeline.fleet.live import follow

    for option in ("interval", "push_every", "heartbeat"):
        if getattr(args, option) <= 0:
            raise UsageError(f"--{option.replace('_', '-')} must be more than 0 seconds")
    db = str(Path(commands.db_path(args)).expanduser())
    if not Path(db).is_file():
        output.note(f"no audit database at {db} yet: following it from when this host's first job creates it")
    output.note(f"following {db}: live progress to {_where(url)}, pushes after each run's end and every "
                f"{args.push_every:g} s")
    return follow(db, url, interval=args.interval, push_every=args.push_every, heartbeat=args.heartbeat,
                  exporter_config=args.exporter_config, host_name=args.host_name,
                  host_key=_host_public(host_key_path(db)), log=output.note)


def cmd_verify(args: argparse.Namespace, local_verify: Callable[[argparse.Namespace], int]) -> int:
    """`audit verify`, and with --central the comparison with the central record after it."""
    code = local_verify(args)
    if not args.central:
        return code
    from amdflash.pipeline.commands import board as commands
    from amdflash.pipeline.engine.auditdb import host_key_path, open_reader
    from amdflash.store.central import verify_against

    url = _url(args.central, "--central")
    db = commands.db_path(args)
    reader = open_reader(db)
    try:
        found = verify_against(reader.conn, url, _host_public(host_key_path(db)))
    finally:
        reader.conn.close()
    output.result(found.describe(_where(url)))
    log = _verify_log(db, url)
    return code if found.ok and log else EXIT_FAILED


def _verify_log(db: str, url: str) -> bool:
    """The central's newest tree head of this host's log against the log here (said in a line)."""
    from amdflash.pipeline.engine.auditdb import host_key_path
    from amdflash.store import tlog
    from amdflash.store.central import verify_log_against

    db = str(Path(db).expanduser())
    checked = verify_log_against(db, url, _host_public(host_key_path(db)))
    if checked.ok and not tlog.log_dir(db).is_dir():
        return True        # no log here, none there: nothing to say
    output.result(checked.words)
    return checked.ok


def _host_public(path: Path) -> bytes | None:
    """This host's public key (names its host for a trail that has no checkpoint), if it has one."""
    from amdflash.store import keys

    return keys.public_of(path)


def _where(url: str) -> str:
    from amdflash.store.central import shown_url

    return shown_url(url)


def cmd_setup(args: argparse.Namespace) -> int:
    from amdflash.store.central import DEFAULT_BLOB_QUOTA, setup

    quota = args.blob_quota if args.blob_quota is not None else DEFAULT_BLOB_QUOTA
    output.result(setup(_url(args.url, "URL"), quota))
    return EXIT_OK


def cmd_enroll(args: argparse.Namespace) -> int:
    from amdflash.store.central import enroll
    from amdflash.store.keys import KeyError_, fingerprint, read_public

    url = _url(args.to, "--to")
    try:
        public = read_public(args.key)
    except KeyError_ as e:
        raise Refusal(str(e)) from None
    ident = enroll(url, public, args.name, args.login, args.blob_quota)
    output.result(f"enrolled host {args.name} (#{ident}), key {fingerprint(public)}, pushed by login "
                  f"{args.login or args.name}")
    return EXIT_OK


def cmd_runs(args: argparse.Namespace) -> int:
    from amdflash.pipeline.cli.trail import cell, print_runs, run_cells, run_filter
    from amdflash.store.central import runs

    keep = run_filter(args.status, args.board, args.since, args.run_command)     # as `runs` filters
    rows = [r for r in runs(_url(args.source, "--from"), args.host) if keep(r)]
    filtered = any((args.status, args.board, args.since, args.run_command))
    return print_runs(rows, args.format, "no run matches" if filtered else "no runs in the central database",
                      lambda r: [f"{cell(r['host']):16}", *run_cells(r)])     # each line: runs' line, host first


def cmd_serve(args: argparse.Namespace) -> int:
    from amdflash.pipeline import config

    try:
        import apprise  # noqa: F401
        import prometheus_client  # noqa: F401
        import sse_starlette  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise Refusal(f"fleet serve needs {e.name}: pip install 'amdflash[fleet]'") from None
    from amdflash.pipeline.fleet.serve.app import parse_listen, serve
    from amdflash.pipeline.fleet.serve.notify import Notifier

    if args.source and args.from_file:
        raise UsageError("give the central database by --from or by --from-file, not both")
    if args.source and re.search(r"://[^/@]*:[^/@]*@|password\s*=", args.source, re.IGNORECASE):
        output.note("--from carries a password on the command line, where every local user sees it (ps): "
                    f"use --from-file, ${ENV_CENTRAL} or a .pgpass file")
    given = args.source
    if args.from_file:
        given = (_secret_lines(args.from_file, "--from-file") or [""])[0]
        if not given:
            raise UsageError(f"--from-file {args.from_file}: holds no URL")
    url = _url(given, "--from")
    try:
        parse_listen(args.listen)
    except ValueError as e:
        raise UsageError(str(e)) from None
    for option in ("silent_after", "settle", "window", "stale_after"):
        if getattr(args, option) <= 0:
            raise UsageError(f"--{option.replace('_', '-')} must be more than 0")
    if args.notify:
        output.note("--notify on the command line is seen by every local user (ps), with its tokens: use "
                    f"--notify-file or ${ENV_NOTIFY}")
    notify = [*(args.notify or []), *(_secret_lines(args.notify_file, "--notify-file") if args.notify_file else [])]
    if not args.notify and not args.notify_file:
        if os.environ.get(ENV_NOTIFY):
            notify = os.environ[ENV_NOTIFY].split()
        else:
            configured = config.load().get("notify") or []
            notify = [configured] if isinstance(configured, str) else list(configured)
    try:
        Notifier(list(notify), output.note).close()    # every URL one Apprise knows, before serving
    except ValueError as e:
        raise UsageError(str(e)) from None
    state_dir = args.state_dir or _state_dir()
    if state_dir.exists() or state_dir.is_symlink():     # one missing is made (0700) once every check passed
        from amdflash.pipeline.fleet.serve.notify import StateDirError, open_state_dir

        try:
            os.close(open_state_dir(state_dir))
        except StateDirError as e:
            raise UsageError(f"--state-dir {e}") from None
    from amdflash.pipeline.fleet.serve.guard import limits

    try:
        limits()              # its connections' cap fits under its descriptor limit: said before serving
    except ValueError as e:
        raise Refusal(str(e)) from None
    from amdflash.store.central import connect, need_schema, not_a_reader

    with connect(url) as pg:
        need_schema(pg)
        why = not_a_reader(pg)
    if why:
        raise Refusal(f"fleet serve reads the record only, as a login in amdflash_read, and {why}: connect as a "
                      "reviewer login (CREATE ROLE line_viewer LOGIN IN ROLE amdflash_read)")
    from amdflash.pipeline.fleet.serve.app import state_file
    from amdflash.pipeline.fleet.serve.notify import Memory

    try:
        memory = Memory.load(state_file(state_dir, url))   # a state it cannot read or write: said before serving
        memory.save(wait=True)
    except (ValueError, OSError) as e:
        raise Refusal(str(e)) from None
    if memory.problem:
        raise Refusal(f"--state-dir: cannot keep what notifications sent in {memory.problem}")
    return serve(url, args.listen, list(notify), args.window, args.silent_after * 60, args.settle,
                 args.public_url or "", output.note, state_dir, args.allowed_host, args.stale_after * 60)


def _state_dir() -> Path:
    """fleet serve's state: systemd's StateDirectory= (its first), else the XDG state home."""
    if os.environ.get("STATE_DIRECTORY"):
        return Path(os.environ["STATE_DIRECTORY"].split(":")[0])
    return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "amdflash" / "serve"


def _secret_lines(path: Path, option: str) -> list[str]:
    """The lines of a file holding secrets (URLs with passwords or tokens), less blanks and #
    comments; a file others may read is said, not refused (the operator may mean it)."""
    try:
        text = path.read_text()
        mode = path.stat().st_mode
    except OSError as e:
        raise UsageError(f"{option} {path}: {e.strerror or e}") from None
    if mode & 0o077:
        output.note(f"{option} {path}: others may read it (mode {mode & 0o777:o}); chmod 600 it")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def cmd_report(args: argparse.Namespace) -> int:
    from amdflash.pipeline.commands import board as commands
    from amdflash.pipeline.commands.checks import writable_output
    from amdflash.pipeline.commands.run_end import on_host
    from amdflash.pipeline.engine.next_step import BARE
    from amdflash.pipeline.cli.trail import render_text
    from amdflash.pipeline.fleet.serve.ends import gone_processes
    from amdflash.store.central import AmbiguousRun, materialize
    from amdflash.store.run_rows import RunUnverified, checked_on
    from amdflash.store.status import processes_gone

    url = _url(args.source, "--from")
    if args.output is not None:
        writable_output(args.output, "report", args.overwrite)
    with tempfile.TemporaryDirectory(prefix="amdflash-central-") as tmp:
        path = Path(tmp) / "run.sqlite"
        try:
            run_id = materialize(url, args.run_id, path, args.host)
        except AmbiguousRun as e:
            raise Refusal(str(e)) from None
        host = _host_name(path)
        # its next step runs on its host, not here; a process the record shows gone is so here too
        with on_host(host), processes_gone(gone_processes(url, host, path)):
            try:
                rep, page = commands.report(run_id, str(path), html=args.format == "html", keys=args.key,
                                            advice=BARE)   # none of this command line's places
            except RunUnverified as e:
                # Its check names the copy read here, gone once this command ends: the run's
                # own trail, on its host, is the one to check.
                raise RunUnverified(f"run {run_id} does not verify, so it is not shown or used: "
                                    f"{checked_on(host, run_id, e.problem)}", e.problem) from None
    if args.format == "json":
        text = json.dumps(rep, indent=2, default=str)
    else:
        text = page if page is not None else render_text(rep)
    if args.output:
        write_output(args, text, "report")
        output.note(f"wrote {args.output}")
    else:
        output.result(text)
    # As 'audit verify --run': a chain or signature that does not hold (not by a given --key) fails.
    return EXIT_OK if (rep.get("chain") or {}).get("ok") else EXIT_FAILED


def _host_name(path: Path) -> str:
    """The enrolled name of the host whose run store.central.materialize copied to `path`."""
    import sqlite3

    from amdflash.store.central import materialized_host

    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return materialized_host(conn)
    finally:
        conn.close()
