"""The `amdflash fleet` commands: export a host's boards, make places, run jobs on a line."""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from amdflash.pipeline.errors import Refusal
from amdflash.pipeline.commands.checks import output_file
from amdflash.pipeline.cli import output
from amdflash.stages.files import write_new
from amdflash.stages.drivers.flash.geometry import FLASH_SIZE

EXTRA_HINT = "the fleet commands need labgrid: pip install 'amdflash[fleet]'"


def _need_labgrid(args: argparse.Namespace) -> None:
    try:
        import labgrid  # noqa: F401
    except ImportError:
        raise Refusal(EXTRA_HINT) from None
    # labgrid logs through the standard logging module; the fleet commands report what it
    # would say (an unreachable coordinator, a lost one) themselves, -v shows its own lines.
    if args.verbose:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    else:
        logging.getLogger().addHandler(logging.NullHandler())
        # labgrid prints what the programs it runs say (rsync's transfer lines, as it copies an
        # image to a host) with print(), on stdout, whenever its "Process" logger would not show
        # them: they would land in the fleet's table or its JSON. With that logger showing them,
        # to no one, it prints nothing.
        process = logging.getLogger("Process")
        process.setLevel(logging.INFO)
        process.propagate = False
        process.addHandler(logging.NullHandler())


def _coordinator_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--coordinator", metavar="HOST:PORT",
                   default=os.environ.get("LG_COORDINATOR", "127.0.0.1:20408"),
                   help="labgrid coordinator (default $LG_COORDINATOR, else 127.0.0.1:20408)")
    p.add_argument("--hosts", action="append", metavar="HOST[=DB],…",
                   help="the only hosts whose boards are used (repeatable; default: fleet_hosts in the config "
                        "file): a board published for any other host is refused and reported, never run. DB: "
                        "the audit database its jobs write (default /var/lib/amdflash/audit.sqlite)")


def _allowlist(args: argparse.Namespace) -> Any:
    from amdflash.pipeline.fleet.settings import allowlist
    from amdflash.pipeline.fleet.trust import Untrusted

    try:
        return allowlist(args.hosts)
    except Untrusted as e:
        raise Refusal(str(e)) from None


def _run_options(p: argparse.ArgumentParser, where_required: bool) -> None:
    p.add_argument("--where", action="append", default=[], metavar="TAG=VALUE", required=where_required,
                   help="only places with this tag (repeatable, all must match; name=PLACE names one place)")
    p.add_argument("--parallel", type=int, default=8, metavar="N", help="at most N jobs at once (default 8)")
    p.add_argument("--format", choices=("text", "json"), default="text", help="summary as a table or JSON")
    p.add_argument("--exporter-grace", type=float, default=30.0, metavar="SECONDS",
                   help="stop a job (at a safe point) once its board's exporter has stopped publishing it for "
                        "this long (default 30; shorter gaps, such as an exporter restarted after a hot-plug, "
                        "are ridden out)")
    _coordinator_option(p)


def _flash_options(p: argparse.ArgumentParser) -> None:
    """The options of `amdflash flash` that a fleet flash hands on to each board's host."""
    p.add_argument("--force", action="store_true",
                   help="passed to each host's flash: accept an image without the AA55AA55 signature, or whose "
                        "VBIOS part number differs from the board's (or cannot be read)")
    p.add_argument("--expect-part", metavar="NUMBER",
                   help="passed to each host's flash: the boards' VBIOS part number, for boards whose flash is "
                        "blank or unreadable")
    p.add_argument("--start-over", action="store_true",
                   help="passed to each host's flash: flash a board whose last flash never finished (killed, "
                        "failed after it began writing, or of another image) instead of refusing it; without it "
                        "such a board is reported refused with the resume that finishes it, and only an "
                        "unfinished flash of this very image is resumed")


def _flash_args(args: argparse.Namespace) -> list[str]:
    return ((["--force"] if getattr(args, "force", False) else [])
            + (["--expect-part", args.expect_part] if getattr(args, "expect_part", None) else [])
            + (["--start-over"] if getattr(args, "start_over", False) else []))


def add_parsers(sub: argparse._SubParsersAction) -> None:
    from amdflash.pipeline.cli import central as central_cli

    f = sub.add_parser(
        "fleet", help="a line of boards on many hosts, through labgrid",
        description="Boards attached to many hosts, reserved and locked through a labgrid coordinator; each "
                    "board's job runs on its own host (over SSH) and is recorded in that host's audit trail. "
                    "Needs the fleet extra: pip install 'amdflash[fleet]'.")
    fsub = f.add_subparsers(dest="fleet_command", required=True, metavar="FLEET_COMMAND")

    p = fsub.add_parser(
        "exporter-config", help="this host's boards as a labgrid exporter configuration",
        description="Write a labgrid exporter configuration listing this host's boards (USB bridges by serial, "
                    "native PCI boards by address, emulated boards named with --sim) as NetworkAmdflashBoard "
                    "resources with spec, chip, JEDEC id, unique ID, bridge serial and the host's audit "
                    "database. Probes the boards (registers restored); records nothing.")
    p.add_argument("-o", "--output", type=output_file, help="write here instead of stdout")
    p.add_argument("--sim", action="append", default=[], metavar="DIR", help="also export this emulated board")
    p.add_argument("--no-hardware", action="store_true", help="only the --sim boards: do not look for USB/PCI boards")
    p.set_defaults(func=cmd_exporter_config)

    p = fsub.add_parser(
        "places", help="make a labgrid place for every exported board that has none",
        description="For every NetworkAmdflashBoard an exporter publishes and no place matches, create a place "
                    "EXPORTER-GROUP matching it, tagged host=EXPORTER, kind=usb|pci|sim and any --tag. "
                    "Existing places get the --tag tags added. Lists the board places.")
    p.add_argument("--tag", action="append", default=[], metavar="TAG=VALUE", help="tag to set (repeatable)")
    p.add_argument("--exporter", metavar="NAME", help="only boards of this exporter")
    p.add_argument("--format", choices=("text", "json"), default="text",
                   help="text for people (default) or JSON")
    _coordinator_option(p)
    p.set_defaults(func=cmd_places)

    p = fsub.add_parser(
        "flash", help="flash IMAGE on every matching board, each on its own host",
        description="Reserve and acquire every place matching --where (places held by someone else are "
                    "skipped and reported, never taken), then flash IMAGE on each board on its own host, at "
                    "most --parallel at once. A board whose last flash of this same image never finished "
                    "(killed or interrupted) is resumed instead; one whose unfinished flash cannot be resumed so "
                    "(another image, or a flash that failed after writing) is refused with its next step, "
                    "unless --start-over. Prints one summary; exit status as for "
                    "several --board: 130 if any was interrupted, else 1 if any failed, else 2 if any was "
                    "refused or skipped, else 0.")
    p.add_argument("image", type=Path, help="the image to write (exactly 2 MiB), copied to each host")
    p.add_argument("--yes", action="store_true", help="required: confirm that the flashes may be written")
    _flash_options(p)
    _run_options(p, where_required=True)
    p.set_defaults(func=cmd_run, job="flash")

    p = fsub.add_parser("verify", help="compare every matching board with IMAGE",
                        description="Verify IMAGE on every matching board, each on its own host.")
    p.add_argument("image", type=Path, help="the image to compare with (exactly 2 MiB), copied to each host")
    _run_options(p, where_required=False)
    p.set_defaults(func=cmd_run, job="verify")

    p = fsub.add_parser("dump", help="dump every matching board into DIR/PLACE.bin",
                        description="Dump the whole flash of every matching board on its own host and copy "
                                    "it here as DIR/PLACE.bin.")
    p.add_argument("output_dir", type=Path, metavar="DIR", help="where the dumps are copied, one PLACE.bin each")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing DIR/PLACE.bin (without it such a board is refused before its dump "
                        "runs)")
    _run_options(p, where_required=False)
    p.set_defaults(func=cmd_run, job="dump")

    p = fsub.add_parser("info", help="identify every matching board",
                        description="Run 'amdflash info' on every matching board on its own host.")
    _run_options(p, where_required=False)
    p.set_defaults(func=cmd_run, job="info")

    p = fsub.add_parser(
        "job", help="(run by the fleet client on the boards' host) a job on boards of this host, JSON lines",
        description="Run one job on boards of this host through the amdflash command line (all boards in one "
                    "process, so the host's audit trail has one writer) and print one JSON line per board: "
                    "run id, status, modelled and wall seconds. A flash resumes a board's unfinished flash of "
                    "the same image. A line 'stop' on stdin stops the jobs at their next safe point; end of "
                    "stdin does not.")
    p.add_argument("--board", required=True, action="append", dest="job_boards", metavar="SPEC",
                   help="a board of this host (repeatable: one amdflash process runs them all)")
    p.add_argument("--host-name", metavar="NAME",
                   help="what the line calls this host (its exporter name); said beside the OS host name")
    p.add_argument("job", choices=("flash", "verify", "dump", "info"), help="the job to run on these boards")
    p.add_argument("image", nargs="?", help="flash, verify: the image on this host (dump and info take none)")
    _flash_options(p)
    p.set_defaults(func=cmd_job)

    central_cli.add_fleet_parsers(fsub)


# -- commands ------------------------------------------------------------------------------------

def _host_db(args: argparse.Namespace) -> str:
    from amdflash.pipeline.commands.board import db_path

    # The one rule for the database (--db, else $AMDFLASH_DB, else the config, else the data directory).
    return str(Path(db_path(args)).expanduser().resolve())


def cmd_exporter_config(args: argparse.Namespace) -> int:
    from amdflash.pipeline.fleet.export import host_boards, previous_identities, render

    try:
        groups, notes = host_boards(args.sim, not args.no_hardware, _host_db(args), previous_identities(args.output))
    except ValueError as e:
        raise Refusal(str(e)) from None
    text = render(groups, notes)
    if args.output:
        write_new(args.output, text)   # renamed into place: an exporter restarting never reads half a file
        output.note(f"wrote {args.output}: {len(groups)} board(s)")
    else:
        sys.stdout.write(text)
    for note in notes:
        output.note(f"note: {note}")
    return 0


def _tags(pairs: list[str], what: str) -> dict[str, str]:
    from amdflash.pipeline.fleet.coordinator import parse_tags

    try:
        return parse_tags(pairs, what)
    except ValueError as e:
        raise Refusal(str(e)) from None


def cmd_places(args: argparse.Namespace) -> int:
    _need_labgrid(args)
    tags = _tags(args.tag, "--tag")
    return asyncio.run(_places(args, tags, _allowlist(args)))


async def _places(args: argparse.Namespace, tags: dict[str, str], allow: Any) -> int:
    from amdflash.pipeline.fleet.coordinator import Coordinator, CoordinatorError, place_name_ok
    from amdflash.pipeline.fleet.trust import board_problem, shown
    from amdflash.stages.terminal import printable

    try:
        coordinator = await Coordinator(args.coordinator).open()
    except CoordinatorError as e:
        raise Refusal(str(e)) from None
    listed: list[dict[str, Any]] = []
    try:
        for exporter, group, name, entry in coordinator.board_resources():
            if args.exporter and exporter != args.exporter:
                continue
            refused = board_problem(entry.cls, entry.args, entry.extra, allow, exporter)
            if refused:   # no place for it: the coordinator's word is not the operator's
                # A word as the others are (one line, escaped; an event with --log-json): the
                # reason quotes the coordinator's names and values.
                output.note(f"note: refused the board resource {shown(f'{exporter}/{group}/{name}')}: {refused}")
                continue
            path = (exporter, group, entry.cls, name)
            # A place named otherwise than a place can be (a control character, 100 kB) is not adopted.
            existing = [p for p, place in coordinator.places.items() if place.hasmatch(path) and place_name_ok(p)]
            place = existing[0] if existing else f"{exporter}-{group}"
            if not place_name_ok(place):   # `fleet run` would not take it: not made
                output.note(f"note: refused the board resource {shown(f'{exporter}/{group}/{name}')}: its group "
                            f"cannot name a place (at most 200 printable characters)")
                continue
            auto = {"host": exporter, **({"kind": entry.args["kind"]} if entry.args.get("kind") else {})}
            created = await coordinator.ensure_place(place, f"{exporter}/{group}/{entry.cls}/{name}",
                                                     tags if existing else {**auto, **tags})
            listed.append({"place": place, "created": created, "tags": dict(coordinator.places[place].tags),
                           "spec": entry.args.get("spec"), "unique_id": entry.args.get("unique_id")})
    except CoordinatorError as e:      # a place it would not make, or did not answer for in time
        raise Refusal(str(e)) from None
    finally:
        await coordinator.close()
    if args.format == "json":
        print(json.dumps(listed, indent=2))
    else:
        for p in listed:
            tag_text = ",".join(f"{k}={v}" for k, v in sorted(p["tags"].items()))
            output.result(printable(f"{p['place']:40} {'created' if p['created'] else 'exists ':8} {tag_text:30} "
                                    f"{p['spec']}"))       # one line: names and tags are the coordinator's
    return 0


def _operator(args: argparse.Namespace) -> str:
    """Who runs a fleet job, for its runs on the hosts (which record their own account, the
    same for everyone): `--operator`, else this machine's account and name, as claimed."""
    import getpass
    import socket

    from amdflash.pipeline.commands.checks import OPERATOR_MAX, operator_name
    from amdflash.stages.terminal import printable

    if getattr(args, "operator", None):
        return str(operator_name(args.operator))
    try:
        account = getpass.getuser()
    except (KeyError, OSError):       # no name for this uid (a container's bare uid)
        account = f"uid {os.getuid()}"
    claimed = printable(f"{account}@{socket.gethostname()}")
    return claimed[:OPERATOR_MAX]


def cmd_run(args: argparse.Namespace) -> int:
    _need_labgrid(args)
    from amdflash.pipeline.fleet.coordinator import CoordinatorError
    from amdflash.pipeline.fleet.run import FleetRun

    where = _tags(args.where, "--where")
    image = getattr(args, "image", None)
    if args.job == "flash" and not args.yes:
        raise Refusal("refusing to write without --yes (fleet flash writes every matching board)")
    if image is not None and not image.is_file():
        raise Refusal(f"cannot read image {image}")
    if image is not None and image.stat().st_size != FLASH_SIZE:
        # Every host would refuse it; say so before anything is reserved.
        raise Refusal(f"image {image} is {image.stat().st_size:#x} bytes; the flash is exactly {FLASH_SIZE:#x}")
    if args.parallel < 1:
        raise Refusal("--parallel must be at least 1")
    output_dir = getattr(args, "output_dir", None)
    if output_dir is not None:
        if output_dir.exists() and not output_dir.is_dir():
            raise Refusal(f"{output_dir} exists and is not a directory (the dumps go there, one per board)")
        try:
            output_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise Refusal(f"cannot create directory {output_dir}: {e.strerror}") from None
    from amdflash.pipeline.fleet.settings import host_command
    from amdflash.pipeline.fleet.trust import Untrusted

    allow = _allowlist(args)
    try:
        command = host_command()
    except Untrusted as e:
        raise Refusal(str(e)) from None
    fleet = FleetRun(args.coordinator, where, args.job, image.resolve() if image else None, output_dir,
                     args.parallel, args.exporter_grace, _flash_args(args), allow, command, _operator(args),
                     overwrite=getattr(args, "overwrite", False), hosts=args.hosts or (), advice=args.advice)
    try:
        with FleetView(fleet, enabled=not args.quiet):
            result = asyncio.run(fleet.run())
    except CoordinatorError as e:
        raise Refusal(str(e)) from None
    if not result.rows:
        raise Refusal("no place matches " + (" ".join(args.where) or "(any)") +
                      " ('amdflash fleet places' makes places for the exported boards)")
    if args.format == "json":
        print(json.dumps(result.as_json(), indent=2))
    else:
        print_summary(result)
    return result.exit_code


class FleetView:
    """Each board's job as it goes, on stderr: on a terminal a live table (one row per board:
    place, host, stage, bytes, rate, ETA, status); off a terminal a line per board every few
    seconds, as the single-board command line prints them. Fed by FleetRun.live."""

    def __init__(self, fleet: Any, enabled: bool = True, interval: float = 5.0):
        from amdflash.pipeline.logsetup import settings

        self.fleet = fleet
        self.interval = interval
        self.mode = "off" if not enabled else "live" if sys.stderr.isatty() and not settings().json_lines else "lines"
        self._live: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._said: dict[str, tuple[Any, ...]] = {}

    def __enter__(self) -> FleetView:
        if self.mode == "live":
            from rich.console import Console
            from rich.live import Live

            self._live = Live(get_renderable=self._table, console=Console(stderr=True), refresh_per_second=4,
                              transient=False, redirect_stdout=False)
            self._live.start()
        elif self.mode == "lines":
            self._thread = threading.Thread(target=self._lines, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._live is not None:
            self._live.refresh()
            self._live.stop()
        if self._thread is not None:
            self._thread.join()

    @staticmethod
    def cells(live: Any) -> list[str]:
        """place, host, stage, bytes, rate, ETA, status: as words."""
        from amdflash.pipeline.engine.progress import _amount, _duration
        from amdflash.stages.terminal import printable

        in_bytes = live.unit == "bytes"
        amounts = (f"{_amount(live.done, in_bytes)}/{_amount(live.total, in_bytes)}"
                   if live.done is not None and live.total is not None else "-")
        rate = f"{_amount(int(live.rate), in_bytes)}/s" if live.rate else "-"
        eta = _duration(live.eta) if live.eta is not None and live.status == "running" else "-"
        return [printable(str(v)) for v in (live.place, live.host, live.stage, amounts, rate, eta, live.status)]

    def _table(self) -> Any:
        from rich.table import Table
        from rich.text import Text

        table = Table(box=None, show_edge=False, pad_edge=False)
        for name in ("board", "host", "stage", "bytes", "rate", "ETA", "status"):
            table.add_column(name, overflow="fold")
        for live in list(self.fleet.live.values()):
            # Text, not str: rich reads a str as console markup, and a place named
            # `[link=https://…]a[/link]` would become a hyperlink (`a[/]` an exception).
            table.add_row(*(Text(cell) for cell in self.cells(live)))
        return table

    def _lines(self) -> None:
        """A board's first progress at once, then at most a line per board every `interval`
        seconds, and only when its progress moved."""
        last: dict[str, float] = {}
        while not self._stop.wait(0.5):
            now = time.monotonic()
            for live in list(self.fleet.live.values()):
                said = (live.stage, live.done, live.status)
                if (live.status == "running" and live.done is not None and self._said.get(live.place) != said
                        and now - last.get(live.place, -self.interval) >= self.interval):
                    self._said[live.place], last[live.place] = said, now
                    place, host, stage, amounts, rate, eta, _ = self.cells(live)
                    output.note(f"{place} ({host}): {stage} {amounts} {rate} ETA {eta}")


def print_summary(result: Any) -> None:
    from amdflash.stages.terminal import printable

    def one(text: Any) -> str:
        # Each field one line: a place is the coordinator's word and a host's lines are its own,
        # and a newline in either would forge a row or a `next:` line of this table.
        return printable(str(text))

    for row in result.rows:
        for line in row.lines:
            output.result(f"[{one(row.board)}] {one(line)}")
    header = f"{'board':34} {'host':12} {'run':26} {'status':12} {'modelled s':>10} {'wall s':>8}  note"
    output.result(header)
    for r in result.rows:
        modelled = f"{r.modelled_seconds:.2f}" if r.modelled_seconds is not None else "-"
        wall = f"{r.wall_seconds:.2f}" if r.wall_seconds is not None else "-"
        note = r.error or (f"resumed {r.resumes}" if r.resumes else "") or (r.output or "")
        if r.resumes and r.error:
            note = f"resumed {r.resumes}; {note}"
        board, host, run_id, status = one(r.board), one(r.host), one(r.run_id or "-"), one(r.status)
        output.result(f"{board[-34:]:34} {host[:12]:12} {run_id:26} {status:12} {modelled:>10} {wall:>8}  {one(note)}")
        if r.next_step:
            output.result(f"{'':34}   next: {one(r.next_step)}")
    for note in result.notes:
        output.note(f"note: {note}")


def cmd_job(args: argparse.Namespace) -> int:
    from amdflash.pipeline.fleet import hostjob

    if args.job in ("flash", "verify") and not args.image:
        raise Refusal(f"fleet job {args.job} needs an image")
    if _flash_args(args) and args.job != "flash":
        raise Refusal("--force, --expect-part and --start-over are for flash jobs only")
    return hostjob.main(args.main, args.job_boards, args.db, args.job, args.image, _flash_args(args),
                        args.host_name, getattr(args, "operator", None))
