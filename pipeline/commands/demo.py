"""`amdflash demo`: a whole recovery on an emulated board, for a first run without hardware.

The demo only sets the scene (a board with a damaged synthetic image, the clean image
beside it); every step after that is the real command line, called in-process with an
explicit --db and --board, so what the user sees is what they would type and get.
"""
from __future__ import annotations

import shlex
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from amdflash.pipeline.errors import EXIT_OK, Refusal
from amdflash.stages.drivers.flash.geometry import UNIT

DEFAULT_DIR = Path("amdflash-demo")
DEFAULT_SEED = 4
DAMAGED_REGIONS = 3
# Written first into the demo directory: --fresh removes only a directory that carries it,
# so a mistyped --dir can never make the demo delete someone's files.
MARKER = ".amdflash-demo"
MARKER_TEXT = ("Made by 'amdflash demo'. Everything here is synthetic: an emulated board and a synthetic "
               "IFWI, not an AMD image. 'amdflash demo --fresh' may remove this directory's contents.\n")


@dataclass(frozen=True)
class DemoPaths:
    root: Path
    db: Path

    @property
    def board(self) -> Path:
        return self.root / "board"

    @property
    def image(self) -> Path:
        return self.root / "known-good.bin"

    @property
    def backup(self) -> Path:
        return self.root / "backup.bin"

    @property
    def spec(self) -> str:
        return f"sim:{self.board}"


def prepare_dir(root: Path, fresh: bool) -> list[str]:
    """Make `root` an empty demo directory; returns what --fresh removed (names, dirs with '/')."""
    if root.exists() and not root.is_dir():
        raise Refusal(f"{root} exists and is not a directory")
    entries = sorted(root.iterdir()) if root.exists() else []
    removed = _names(entries)
    if entries:
        if not (root / MARKER).is_file():
            raise Refusal(f"{root} is not empty and was not made by 'amdflash demo' (no {MARKER} file); "
                          "choose another --dir (--fresh only removes an earlier demo)")
        if not fresh:
            shown = ", ".join(removed[:12]) + (", …" if len(removed) > 12 else "")
            raise Refusal(f"{root} holds an earlier demo; choose another --dir, or add --fresh to remove "
                          f"everything in it ({len(removed)} entries: {shown})")
        for entry in entries:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    root.mkdir(parents=True, exist_ok=True)
    (root / MARKER).write_text(MARKER_TEXT)
    return removed


def _names(entries: list[Path]) -> list[str]:
    return [e.name + ("/" if e.is_dir() and not e.is_symlink() else "") for e in entries]


class _Narrator:
    def __init__(self, paths: DemoPaths, cli_flags: list[str], main: Callable[[list[str]], int],
                 say: Callable[[str], None]):
        self.paths = paths
        self.flags = cli_flags
        self.main = main
        self._say = say
        self.step = 0

    def say(self, text: str = "") -> None:
        self._say(text)

    def run(self, title: str, why: str, *argv: str) -> int:
        """One real CLI command, announced as the user would type it."""
        self.step += 1
        full = ["--db", str(self.paths.db), *self.flags, *argv]
        self.say(f"\n── step {self.step}: {title} " + "─" * max(0, 60 - len(title)))
        self.say(why)
        self.say(f"$ {shlex.join(['amdflash', *full])}")
        code = self.main(full)
        if code != EXIT_OK:
            self.say(f"\ndemo stopped: step {self.step} ({title}) exited {code}")
        return code


def run_demo(root: Path, *, fresh: bool = False, db: Path | None = None, seed: int = DEFAULT_SEED,
             cli_flags: list[str] | None = None, main: Callable[[list[str]], int],
             say: Callable[[str], None]) -> int:
    """The demo's steps, each a real command line run by `main`, told by `say` (the CLI's, handed
    down by it: a command never reaches up into the command line)."""
    started = time.monotonic()
    root = root.absolute()
    removed = prepare_dir(root, fresh)
    paths = DemoPaths(root, (db or root / "audit.sqlite").absolute())
    n = _Narrator(paths, cli_flags or [], main, say)
    n.say("amdflash demo: a full recovery on an emulated board.")
    n.say("SYNTHETIC: the board is emulated and its image is a synthetic IFWI, not an AMD image. No hardware is used.")
    if removed:
        n.say(f"\n--fresh removed the earlier demo in {root}: {', '.join(removed)}")
    clean = _set_scene(n, seed, own_db=db is None)
    code, flash_run = _recover(n, clean)
    if code != EXIT_OK:
        return code
    n.say(f"\nRecovered: the emulated board now holds the known-good image. "
          f"The demo took {time.monotonic() - started:.1f} s.")
    _point_further(n, flash_run)
    return EXIT_OK


def _set_scene(n: _Narrator, seed: int, own_db: bool) -> bytes:
    """The damaged board and the known-good image; returns the image."""
    from amdflash.stages.sim import create_board
    from amdflash.stages.sim.synth import damage, damage_regions, synthetic_ifwi

    paths = n.paths
    clean = synthetic_ifwi(seed)
    regions = damage_regions(clean, seed, DAMAGED_REGIONS)
    create_board(paths.board, content=damage(clean, seed, DAMAGED_REGIONS), cmp=True, seed=seed)
    paths.image.write_bytes(clean)
    n.say(f"\nThe scene, in {paths.root}:")
    n.say(f"  board/          an emulated Navi31 board (--board {paths.spec}) whose flash holds a synthetic IFWI")
    n.say(f"                  damaged in {len(regions)} places, as a failed or interrupted update leaves it:")
    for r in regions:
        n.say(f"                    {r.offset:#08x}  {r.size:#6x} bytes {r.kind}")
    n.say("                  and with SR2.CMP set, so the whole array is write-protected.")
    n.say("  known-good.bin  the clean synthetic image: the known-good image you would have for your card.")
    n.say(f"  audit database  {paths.db}" + (" (the demo's own; yours is not touched)" if own_db else ""))
    return clean


def _recover(n: _Narrator, clean: bytes) -> tuple[int, str]:
    """The user's steps; returns the first failing exit code (or 0) and the flash run's id."""
    from amdflash.stages.sim.synth import PART_KEY

    paths = n.paths
    code = n.run("identify the flash", "info reads the JEDEC id, status registers, SFDP and unique ID through "
                 "the ROM_SW engine. It writes nothing to the flash. Note CMP=set: flash will refuse unless "
                 "told --clear-cmp.", "info", "--board", paths.spec)
    if code != EXIT_OK:
        return code, ""
    code = n.run("back up what is there", "Before writing anything, keep a copy of the flash as it is, damage "
                 "and all: if the known-good image turns out to be the wrong one, this is the way back.",
                 "dump", str(paths.backup), "--board", paths.spec)
    if code != EXIT_OK:
        return code, ""
    differing = _differing_units(paths.backup.read_bytes(), clean)
    n.say(f"\nThe backup differs from the known-good image in {len(differing)} of {len(clean) // UNIT} erase "
          f"units (4 KiB): {', '.join(f'{a:#08x}' for a in differing)}.")
    code = n.run("write the known-good image", "flash takes its own backup into the audit trail, plans per "
                 "erase unit (units already equal are skipped, only damaged ones are erased and programmed), "
                 "commits each unit's intent before erasing it, reads every written unit back, and restores the "
                 "engine registers. --clear-cmp lets it clear SR2.CMP; --yes confirms the write. The damage may "
                 "have left the board's own VBIOS part number unreadable: --expect-part says which board this is, "
                 "and flash refuses an image for another part.",
                 "flash", str(paths.image), "--yes", "--clear-cmp", "--expect-part", PART_KEY, "--board", paths.spec)
    if code != EXIT_OK:
        return code, ""
    flash_run = _last_run(paths.db, "flash", paths.spec)
    code = n.run("verify the whole flash", "verify reads all 2 MiB again and compares it with the image, "
                 "recording a result per unit: the proof, in the audit trail, that the board holds the image.",
                 "verify", str(paths.image), "--board", paths.spec)
    if code != EXIT_OK:
        return code, flash_run
    code = n.run("read the flash run's report", "report reads only the audit trail: the board's identity, "
                 "the image and result hashes, what was written and what was verified.", "report", flash_run)
    return code, flash_run


def _point_further(n: _Narrator, flash_run: str) -> None:
    root = n.paths.root
    base = shlex.join(["amdflash", "--db", str(n.paths.db)])
    n.say("Look further (every register write, SPI transaction and verify result is in the audit trail):")
    for command, what in (
            ("runs", "every run and its status"),
            (f"report {flash_run} --format html -o {shlex.quote(str(root / 'report.html'))}",
             "the report with a sector map"),
            (f"report {flash_run} --format json", "the report as JSON"),
            (f"replay {flash_run}", "re-apply the recorded register writes to an emulated board"),
            ("audit verify", "recompute the hash chain over every row"),
            (f"audit export --format jsonl -o {shlex.quote(str(root / 'audit.jsonl'))}",
             "archive the trail; check it later with 'audit verify --export FILE'")):
        n.say(f"  {base} {command}\n      {what}")


def _differing_units(a: bytes, b: bytes) -> list[int]:
    return [u for u in range(0, len(b), UNIT) if a[u:u + UNIT] != b[u:u + UNIT]]


def _last_run(db: Path, command: str, spec: str) -> str:
    from amdflash.store.queries import open_readonly, runs

    audit = open_readonly(str(db))
    try:
        ids = [r["run_id"] for r in runs(audit) if r["command"] == command and r["board_spec"] == spec]
    finally:
        audit.conn.close()
    if not ids:
        raise RuntimeError(f"the {command} run is missing from {db}")
    return ids[-1]
