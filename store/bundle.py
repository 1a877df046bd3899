"""An evidence bundle: one run's record in a folder a reviewer can carry, and its check offline.

`audit bundle --run RUN -o DIR` writes, into a new 0700 directory, the files PARTS names:

    export.jsonl          the run's rows and signed checkpoints, with the runs of its lineage (those
                          it resumes, those that resume it) and the runs whose sealed backups hold the
                          board's original: the `audit export` format, verifiable on its own
    original.bin          the board's original content (2 MiB), each unit its first sealed backup in
                          the export; when the trail holds only some units the file is
    original-partial.bin  instead (the same size: the units held at their addresses, the rest 0xFF,
                          which is not the board's), and bundle.json names the units missing. A file
                          called original.bin is always the whole original.
    host.pub, host.pem    the key that signed the checkpoints (`audit verify --key` takes either);
                          host-2.pub... when several keys signed them
    anchor.jsonl          the anchor file's lines naming a checkpoint in the export
    bundle.json           who made the bundle, when, on which host, of which runs (the maker's word:
                          the manifest covers it, no signature does)
    MANIFEST.sha256       `sha256sum -c` over every other file

`audit verify --bundle DIR [--key PUB]` needs no database: the manifest; the export's rows
against their signed checkpoints, whose signer must be the bundle's host key (or a given --key);
the anchor lines against the export's checkpoints; the original, unit by unit, against the
sealed backup rows' SHA-256 in the export (the units not held must read 0xFF). Any byte changed
is BROKEN (exit 1), named.

A bundle from elsewhere is untrusted input: only regular files directly in DIR, each a name
PARTS knows and the manifest lists, none larger than its part's limit, none reached through a
link; anything else is refused (BundleRefused, exit 2) before a byte of it is interpreted.

Later parts are one PARTS entry each, and one function in CHECKS: the run's receipt, its proof
and the log's key (store/receipt_parts.py); the cosigned tree head, the witnesses' keys and the
timestamp tokens (store/witness_parts.py). `audit verify --bundle DIR --policy FILE` also holds
them to a reviewer's keys, witnesses and roots (store/policy.py, witness_parts.check_policy).
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from amdflash.store import keys
from amdflash.store.chain import Broken
from amdflash.store.export import ExportFormatError, export, read_export, verify_export
from amdflash.store.files import NotAFile
from amdflash.stages.drivers.flash.geometry import FLASH_SIZE, UNIT
from amdflash.stages.files import fsync_dir, new_file, open_dir

FORMAT = "amdflash-bundle"
VERSION = 1
MANIFEST = "MANIFEST.sha256"
INFO = "bundle.json"
EXPORT = "export.jsonl"
ANCHOR = "anchor.jsonl"
ORIGINAL = "original.bin"
PARTIAL = "original-partial.bin"
MODE = 0o600            # flash content and the record: the owner's only, in a 0700 directory
MiB = 1 << 20
TOTAL_LIMIT = 4096 * MiB


@dataclass(frozen=True)
class Part:
    """A file a bundle may hold: its name (a regular expression, matched whole), what it is, the
    most bytes it may have, and whether every bundle has it."""
    pattern: str
    what: str
    limit: int
    required: bool = False
    shown: str = ""          # the name in messages (default: the pattern, unescaped)

    @property
    def name(self) -> str:
        return self.shown or self.pattern.replace("\\", "")

    def matches(self, name: str) -> bool:
        return re.fullmatch(self.pattern, name) is not None


PARTS: tuple[Part, ...] = (
    Part(re.escape(MANIFEST), "the SHA-256 of every other file (sha256sum -c)", MiB, True),
    Part(re.escape(INFO), "who made the bundle, when, on which host, of which runs", MiB, True),
    Part(re.escape(EXPORT), "the runs' rows and signed checkpoints (audit export)", 2048 * MiB, True),
    Part(r"host(-[0-9]{1,2})?\.pub", "a key that signed the checkpoints (amdflash-ed25519 line)", 4096, True,
         "host[-N].pub"),
    Part(r"host(-[0-9]{1,2})?\.pem", "the same key as SubjectPublicKeyInfo PEM", 4096, shown="host[-N].pem"),
    Part(re.escape(ANCHOR), "the anchor file's lines naming the export's checkpoints", 64 * MiB),
    Part(re.escape(ORIGINAL), "the board's original content, every unit", FLASH_SIZE),
    Part(re.escape(PARTIAL), "the units of the board's original the trail holds (the rest 0xFF)", FLASH_SIZE),
    # The run's receipt, its proof and the log's key (issue 45: store/receipt_parts.py).
    Part(re.escape("receipt.intoto.json"), "the run's receipt: an in-toto statement in a DSSE envelope", MiB),
    Part(re.escape("receipt.tlog-proof"), "the receipt's inclusion in the host's transparency log", MiB),
    Part(re.escape("log.vkey"), "the host's transparency log's note verifier key", 4096),
    # The witnesses and trusted time of the receipt's tree head (store/witness_parts.py).
    Part(re.escape("checkpoint.cosigned"), "the tree head of the receipt's proof with the witnesses' cosignatures",
         64 * 1024),
    Part(re.escape("witnesses.vkeys"), "the configured witnesses' verifier keys, one a line", 64 * 1024),
    Part(re.escape("checkpoint.timestamped"), "the cosigned tree head as it stood when dated: the bytes the tokens "
         "date", 64 * 1024),
    Part(r"tsa[0-9]{1,2}\.tsr", "a timestamp authority's RFC 3161 token over checkpoint.timestamped", 64 * 1024,
         shown="tsaN.tsr"),
)


def part_of(name: str) -> Part | None:
    return next((p for p in PARTS if p.matches(name)), None)


class BundleRefused(ValueError):
    """Not a bundle this amdflash reads, or an output it will not write: nothing was checked
    or written (exit 2)."""


# -- what the export says: the facts the other files are checked against -----------------------

@dataclass
class ExportFacts:
    runs: list[str] = field(default_factory=list)               # the header's
    run_keys: dict[int, str] = field(default_factory=dict)      # runs row seq -> run_id
    boards: dict[str, tuple[str, str]] = field(default_factory=dict)   # run_id -> (unique_id, chip), first
    units: dict[int, tuple[int, str, int]] = field(default_factory=dict)  # address -> (size, sha256, run key)
    checkpoints: dict[int, str] = field(default_factory=dict)   # id -> hash (hex)
    signers: list[bytes] = field(default_factory=list)          # public keys of the checkpoints, first seen first

    def unit_runs(self) -> list[str]:
        return list(dict.fromkeys(self.run_keys.get(k, "?") for _, _, k in self.units.values()))


def export_facts(path: Path) -> ExportFacts:
    """One pass over an export (already verified, or about to be): each unit's first sealed
    backup row in record order, the runs, the boards, the checkpoints and their signers."""
    facts = ExportFacts()
    for _, r in read_export(path):
        kind = r.get("record")
        if kind == "header":
            facts.runs = [str(x) for x in r.get("runs") or []]
        elif kind == "checkpoint":
            facts.checkpoints[int(r["id"])] = str(r["hash"])
            public = bytes.fromhex(str(r.get("public_key") or ""))
            if public and public not in facts.signers:
                facts.signers.append(public)
        elif kind == "row":
            table, values = r.get("table"), r.get("values") or {}
            if table == "runs":
                facts.run_keys[int(r["seq"])] = str(values.get("run_id"))
            elif table == "boards" and values.get("chip") and values.get("run_id") not in facts.boards:
                facts.boards[str(values["run_id"])] = (str(values.get("unique_id") or ""), str(values["chip"]))
            elif table == "log_backup_units":
                address, size, data = values.get("address"), values.get("size"), values.get("data")
                if isinstance(address, int) and isinstance(size, int) and isinstance(data, dict) \
                        and address not in facts.units:
                    facts.units[address] = (size, str(data.get("sha256")), int(values.get("run") or 0))
    return facts


def _blobs(path: Path, wanted: set[str]) -> dict[str, bytes]:
    return {r["sha256"]: bytes.fromhex(r["data"]) for _, r in read_export(path)
            if r.get("record") == "blob" and r.get("sha256") in wanted}


def ranges(addresses: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(address, size) pieces merged into contiguous (start, end) ranges."""
    out: list[tuple[int, int]] = []
    for a, size in sorted(addresses):
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], a + size)
        else:
            out.append((a, a + size))
    return out


def _missing(units: dict[int, tuple[int, str, int]]) -> list[tuple[int, int]]:
    held = ranges([(a, s) for a, (s, _, _) in units.items()])
    gaps, at = [], 0
    for start, end in held:
        if start > at:
            gaps.append((at, start))
        at = max(at, end)
    if at < FLASH_SIZE:
        gaps.append((at, FLASH_SIZE))
    return gaps


def _span(r: tuple[int, int]) -> str:
    return f"{r[0]:#08x}..{r[1] - 1:#08x}"


def _units_fit(units: dict[int, tuple[int, str, int]]) -> str | None:
    for a, (size, _, _) in sorted(units.items()):
        if size <= 0 or a < 0 or a + size > FLASH_SIZE:
            return f"a backup unit at {a:#x} of {size} bytes lies outside the 2 MiB flash"
    pieces = ranges([(a, s) for a, (s, _, _) in units.items()])
    if sum(e - s for s, e in pieces) != sum(s for s, _, _ in units.values()):
        return "backup units overlap"
    return None


# -- building -------------------------------------------------------------------------------------

@dataclass
class Selection:
    """The runs a bundle of `run_id` holds, in the trail's order, and why each is there."""
    run_id: str
    runs: list[str]
    lineage: list[str]              # the runs it resumes, it, the runs that resume it
    original_from: list[str]        # runs whose sealed backups hold the board's original
    left_out: list[dict[str, str]] = field(default_factory=list)
    witnesses: tuple[Any, ...] = ()     # the configured witnesses (store.witness.Witness), whose keys it carries


@dataclass
class Built:
    path: Path
    selection: Selection
    files: list[str]
    rows: int
    checkpoints: int
    unsealed: int
    original: str                   # what the original file holds, in words
    anchor_lines: int


def select(db: Any, path: str, run_id: str) -> Selection:
    """The runs a bundle of `run_id` holds: the runs it resumes and it (each must verify:
    RunUnverified otherwise), the runs that resume it (one that does not verify is left out,
    named), and the runs whose sealed backups hold the board's original (originals.board_history)."""
    from amdflash.store.originals import BoardKey, board_history
    from amdflash.store.queries import first_board, resolve_run, run_chain
    from amdflash.store.run_rows import RunUnverified, open_run

    chain = run_chain(db, run_id)
    lineage = [r.run_id for r in chain]
    left_out: list[dict[str, str]] = []
    todo = [run_id]
    while todo:
        current = todo.pop(0)
        for (child,) in db.conn.execute("SELECT DISTINCT run_id FROM runs WHERE resumes_run_id = ? ORDER BY seq",
                                        (current,)):
            if child in lineage or any(x["run"] == child for x in left_out):
                continue
            try:
                open_run(db.conn, child)
            except RunUnverified as e:
                left_out.append({"run": child, "why": f"it resumes {current} but does not verify: {e.problem}"})
                continue
            lineage.append(child)
            todo.append(child)
    board = first_board(db, chain[-1], ("unique_id", "chip", "spec"))
    original_from: list[str] = []
    if board is not None and board["chip"]:
        history = board_history(path, BoardKey(str(board["unique_id"] or ""), str(board["chip"]),
                                               str(board["spec"] or "")))
        original_from = list(dict.fromkeys(resolve_run(db, b.run_id) for b in history.original))
    order = {r: k for k, r in db.conn.execute("SELECT seq, run_id FROM runs")}
    runs = sorted(dict.fromkeys([*original_from, *lineage]), key=lambda r: order.get(r, 0))
    return Selection(run_id, runs, lineage, original_from, left_out)


def check_output(out: Path) -> None:
    """`-o DIR`: a new directory, or an empty one that is not a link (BundleRefused)."""
    try:
        st = os.lstat(out)
    except FileNotFoundError:
        if not out.absolute().parent.is_dir():
            raise BundleRefused(f"{out}: no directory {out.absolute().parent} to make it in") from None
        return
    if stat.S_ISLNK(st.st_mode):
        raise BundleRefused(f"{out} is a symbolic link: name a new directory (or an empty one)")
    if not stat.S_ISDIR(st.st_mode):
        raise BundleRefused(f"{out} exists and is not a directory: name a new directory (or an empty one)")
    if os.listdir(out):
        raise BundleRefused(f"{out} is not empty: a bundle goes into a new directory (or an empty one)")


def public_pem(public: bytes) -> str:
    return Ed25519PublicKey.from_public_bytes(public).public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def build(db: Any, selection: Selection, out: Path, made: dict[str, Any], seal: Ed25519PrivateKey,
          sealed_by_host: bool, anchor: list[tuple[int, dict[str, Any]]] | None) -> Built:
    """Write the bundle of `selection` from the open database `db` into a hidden directory beside
    `out`, check it as `audit verify --bundle` would, then rename it to `out`; on any failure it
    is removed and `out` left as it was."""
    check_output(out)
    parent = out.absolute().parent
    tmp = Path(tempfile.mkdtemp(prefix=".amdflash-bundle-", dir=parent))     # 0700
    try:
        built = _fill(db, selection, tmp, made, seal, sealed_by_host, anchor)
        report = check(tmp)
        if not report.ok:
            raise BundleRefused(f"the bundle made does not verify ({report.problem}): nothing was written")
        if out.exists():
            check_output(out)
        os.rename(tmp, out)     # replaces an empty directory; refused if one appeared meanwhile with files
        fsync_dir(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    built.path = out
    return built


def _fill(db: Any, selection: Selection, tmp: Path, made: dict[str, Any], seal: Ed25519PrivateKey,
          sealed_by_host: bool, anchor: list[tuple[int, dict[str, Any]]] | None) -> Built:
    fd = open_dir(tmp, readable=False)
    try:
        def write(name: str, data: bytes | str) -> None:
            with new_file(Path(name), MODE, overwrite=False, dir_fd=fd) as f:
                f.write(data.encode() if isinstance(data, str) else data)

        with new_file(Path(EXPORT), MODE, overwrite=False, dir_fd=fd) as raw:
            text = io.TextIOWrapper(raw, encoding="utf-8", newline="")
            summary = export(db.conn, text, "jsonl", seal, selection.runs)
            text.flush()
            text.detach()
        facts = export_facts(tmp / EXPORT)
        info: dict[str, Any] = {"format": FORMAT, "version": VERSION, "run": selection.run_id, "runs": selection.runs,
                                "lineage": selection.lineage, "original_from": selection.original_from,
                                "left_out": selection.left_out, "made": made,
                                "export": {"file": EXPORT, "rows": summary.rows, "checkpoints": summary.checkpoints,
                                           "unsealed_rows_left_out": summary.unsealed,
                                           "sealed_by": keys.fingerprint(keys.public_bytes(seal)),
                                           "seal": "the maker's host key" if sealed_by_host else
                                           "a one-time key (the maker has no host key): it vouches for nothing"}}
        original = _write_original(tmp, facts, write)
        info["original"] = original
        for n, public in enumerate(facts.signers, 1):
            stem = "host" if n == 1 else f"host-{n}"
            write(f"{stem}.pub", keys.public_line(public) + "\n")
            write(f"{stem}.pem", public_pem(public))
        lines = [json.dumps(entry, separators=(",", ":")) for _, entry in anchor or []
                 if isinstance(entry, dict) and entry.get("checkpoint") in facts.checkpoints]
        if lines:
            write(ANCHOR, "\n".join(lines) + "\n")
        info["anchor"] = {"file": ANCHOR, "lines": len(lines)} if lines else \
            {"file": None, "why": "no anchor file beside the database" if anchor is None else
             "no anchor line names a checkpoint of these runs"}
        write(INFO, json.dumps(info, indent=2) + "\n")
        for add in ADD:
            for name, data in add(db, selection, facts).items():
                if part_of(name) is None:
                    raise ValueError(f"{name} is not a part of a bundle (PARTS)")
                write(name, data)
        names = sorted(n for n in os.listdir(tmp) if not n.startswith("."))
        write(MANIFEST, "".join(f"{_sha_of(tmp / n)}  {n}\n" for n in names))
    finally:
        os.close(fd)
    words = original.get("words", "")
    return Built(tmp, selection, [*names, MANIFEST], summary.rows, summary.checkpoints, summary.unsealed, words,
                 len(lines))


def _sha_of(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _write_original(tmp: Path, facts: ExportFacts, write: Callable[[str, bytes], None]) -> dict[str, Any]:
    if not facts.units:
        return {"file": None, "words": "no original: the trail holds no sealed backup of this board's units"}
    problem = _units_fit(facts.units)
    if problem:
        raise BundleRefused(f"the trail's backups cannot be laid out as the board's flash: {problem}")
    blobs = _blobs(tmp / EXPORT, {sha for _, sha, _ in facts.units.values()})
    content = bytearray(b"\xff" * FLASH_SIZE)
    for address, (size, sha, _) in facts.units.items():
        data = blobs.get(sha, b"")
        if hashlib.sha256(data).hexdigest() != sha or len(data) != size:
            raise BundleRefused(f"the backup of unit {address:#08x} does not match its SHA-256 on record: the "
                                "audit database is damaged (see 'amdflash audit verify')")
        content[address:address + size] = data
    missing = _missing(facts.units)
    name = PARTIAL if missing else ORIGINAL
    write(name, bytes(content))
    held = sum(s for s, _, _ in facts.units.values())
    if missing:
        words = (f"{name}: {held // UNIT} of {FLASH_SIZE // UNIT} units, as first backed up by run(s) "
                 f"{', '.join(facts.unit_runs())}; missing {', '.join(map(_span, missing))} (0xFF there: not the "
                 "board's)")
    else:
        words = f"{name}: the whole flash, each unit as first backed up by run(s) {', '.join(facts.unit_runs())}"
    return {"file": name, "sha256": hashlib.sha256(content).hexdigest(), "units": held // UNIT,
            "of": FLASH_SIZE // UNIT, "missing": [[s, e] for s, e in missing], "from_runs": facts.unit_runs(),
            "words": words}


# Later parts' writers (receipts, proofs): each returns {name: bytes} for the bundle of the runs
# selected, every name a part PARTS knows (and CHECKS checks).
ADD: list[Callable[[Any, Selection, ExportFacts], dict[str, bytes]]] = []


# -- checking ---------------------------------------------------------------------------------------

@dataclass
class Opened:
    """A bundle being checked: its files, each open (no link followed), by name."""
    path: Path
    fds: dict[str, int] = field(default_factory=dict)
    keyfiles: list[Path] | None = None
    policy: Any = None              # store.policy.Policy: the reviewer's keys, which replace --key and the bundle's
    policy_claims: dict[str, Any] | None = None     # what check_policy found, claim by claim
    info: dict[str, Any] = field(default_factory=dict)
    facts: ExportFacts = field(default_factory=ExportFacts)
    said: list[str] = field(default_factory=list)
    original: bytes | None = None

    def at(self, name: str) -> Path:
        """A path that reaches the very file opened (never a link put there since)."""
        return Path(f"/proc/self/fd/{self.fds[name]}")

    def read(self, name: str) -> bytes:
        return os.pread(self.fds[name], os.fstat(self.fds[name]).st_size + 1, 0)

    def given(self) -> tuple[list[bytes] | None, str]:
        """The host keys the reviewer gave (the policy's, or --key files), None for none; and
        what to call them."""
        if self.policy is not None:
            return [self.policy.host_key], "the policy's host key"
        if self.keyfiles:
            return [keys.read_public(p) for p in self.keyfiles], "a given --key"
        return None, ""


@dataclass
class BundleReport:
    ok: bool
    path: Path
    problem: str | None = None
    lines: list[str] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)
    run_id: str | None = None
    original: bytes | None = None                   # the original file's bytes, when it checked
    held: list[tuple[int, int]] = field(default_factory=list)     # (start, end) of the units it holds
    boards: set[tuple[str, str]] = field(default_factory=set)     # (unique_id, chip) of the runs holding them
    policy: dict[str, Any] | None = None            # with --policy: each claim, held or not, and why

    def as_json(self) -> dict[str, Any]:
        return {"bundle": str(self.path), "verdict": "intact" if self.ok else "BROKEN", "ok": self.ok,
                "problem": self.problem, "run": self.run_id, "runs": self.runs, "checked": self.lines,
                "original_units": [[s, e] for s, e in self.held] if self.original is not None else [],
                **({"policy": self.policy} if self.policy is not None else {})}

    def describe(self) -> str:
        if not self.ok:
            return f"bundle BROKEN: {self.path}: {self.problem}"
        return "\n".join([f"bundle intact: {self.path}", *self.lines])


def check(path: Path, keyfiles: list[Path] | None = None, policy: Any = None) -> BundleReport:
    """Check the bundle at `path` (BundleRefused for what is not a bundle to read at all);
    with `policy` (store.policy.Policy), also hold it to the reviewer's keys, witnesses and roots."""
    report = BundleReport(False, path)
    with _opened(path) as bundle:
        bundle.keyfiles, bundle.policy = keyfiles, policy
        try:
            for step in CHECKS:
                step(bundle)
        except Broken as e:
            report.problem = str(e)
            report.policy = _policy_json(bundle)
            return report
        report.ok = True
        report.policy = _policy_json(bundle)
        report.lines = bundle.said
        report.runs, report.run_id = bundle.facts.runs, str(bundle.info.get("run"))
        report.original = bundle.original
        f = bundle.facts
        report.held = ranges([(a, s) for a, (s, _, _) in f.units.items()])
        report.boards = {f.boards[r] for r in f.unit_runs() if r in f.boards}
    return report


def _policy_json(bundle: Opened) -> dict[str, Any] | None:
    if bundle.policy is None:
        return None
    return {"file": str(bundle.policy.path), "checked": bundle.policy_claims is not None,
            "claims": bundle.policy_claims or {}}


@contextlib.contextmanager
def _opened(path: Path) -> Iterator[Opened]:
    """The bundle's files opened, after the refusals: a link, a name PARTS does not know or the
    manifest does not list, a file that is not regular or is larger than its part allows."""
    try:
        st = os.lstat(path)
    except OSError as e:
        raise BundleRefused(f"no bundle at {path} ({e.strerror})") from None
    if stat.S_ISLNK(st.st_mode):
        raise BundleRefused(f"{path} is a symbolic link: give the bundle's directory itself")
    if not stat.S_ISDIR(st.st_mode):
        raise BundleRefused(f"{path} is not a directory: a bundle is the directory 'audit bundle' wrote")
    try:
        dir_fd = open_dir(os.path.realpath(path))
    except OSError as e:
        raise BundleRefused(f"{path}: {e}") from None
    bundle = Opened(path)
    try:
        total = 0
        for name in sorted(os.listdir(dir_fd)):
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            where = f"{path}/{name}"
            if stat.S_ISLNK(st.st_mode):
                raise BundleRefused(f"{where} is a symbolic link: a bundle holds regular files only, and no link "
                                    "is followed")
            if not stat.S_ISREG(st.st_mode):
                raise BundleRefused(f"{where} is not a regular file: a bundle holds regular files only")
            part = part_of(name)
            if part is None:
                raise BundleRefused(f"{where} is not a file a bundle holds ({', '.join(_names())})")
            total += st.st_size
            if st.st_size > part.limit:
                raise BundleRefused(f"{where} is larger ({st.st_size} bytes) than a bundle's {name} may be "
                                    f"({part.limit} bytes)")
            if total > TOTAL_LIMIT:
                raise BundleRefused(f"{path} holds more than a bundle may ({TOTAL_LIMIT} bytes)")
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
            bundle.fds[name] = fd
            now = os.fstat(fd)
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) or not stat.S_ISREG(now.st_mode):
                raise BundleRefused(f"{where} changed while it was being opened")
        if MANIFEST not in bundle.fds:
            raise BundleRefused(f"{path} has no {MANIFEST}: not a bundle made by 'amdflash audit bundle'")
        _manifest_names(bundle)
        yield bundle
    finally:
        for fd in bundle.fds.values():
            os.close(fd)
        os.close(dir_fd)


def _names() -> list[str]:
    return [p.name for p in PARTS]


_LINE = re.compile(r"([0-9a-f]{64}) [ *](.+)")


def _manifest(bundle: Opened) -> list[tuple[str, str]]:
    try:
        text = bundle.read(MANIFEST).decode("utf-8")
    except UnicodeDecodeError:
        raise Broken(f"{MANIFEST} is not UTF-8 text: it was changed") from None
    entries = []
    for n, line in enumerate(text.splitlines(), 1):
        found = _LINE.fullmatch(line)
        if not found:
            raise Broken(f"{MANIFEST} line {n} is not 'SHA256  NAME': it was changed")
        entries.append((found.group(1), found.group(2)))
    return entries


def _manifest_names(bundle: Opened) -> None:
    """Refusals about names (before any content is believed): the manifest names only files of
    the bundle's own directory that PARTS knows, each once, and every file there is named."""
    try:
        entries = _manifest(bundle)
    except Broken:
        return       # a manifest that does not parse is a changed byte: check_manifest says so (exit 1)
    seen: set[str] = set()
    for _, name in entries:
        if "/" in name or name in (".", "..") or "\x00" in name or part_of(name) is None:
            raise BundleRefused(f"{MANIFEST} names {name!r}, which is not a file of a bundle's directory: refused "
                                "(a bundle names its own files only, never a path)")
        if name == MANIFEST or name in seen:
            raise BundleRefused(f"{MANIFEST} names {name} twice, or itself: refused")
        seen.add(name)
    extra = sorted(set(bundle.fds) - seen - {MANIFEST})
    if extra:
        raise BundleRefused(f"{bundle.path}/{extra[0]} is not in the bundle's {MANIFEST}: refused (a file added to "
                            "the bundle after it was made)")


def check_manifest(bundle: Opened) -> None:
    for sha, name in _manifest(bundle):
        if name not in bundle.fds:
            raise Broken(f"{name}: listed in {MANIFEST} but not in the bundle (removed)")
        h = hashlib.sha256()
        fd, at = bundle.fds[name], 0
        while chunk := os.pread(fd, MiB, at):
            h.update(chunk)
            at += len(chunk)
        if h.hexdigest() != sha:
            raise Broken(f"{name}: its SHA-256 is not the one {MANIFEST} lists: the file was changed")
    for part in PARTS:
        if part.required and not any(part.matches(n) for n in bundle.fds):
            raise Broken(f"no {part.name} in the bundle ({part.what}): removed")
    bundle.said.append(f"manifest    {len(bundle.fds) - 1} files, each the SHA-256 {MANIFEST} lists")


def check_info(bundle: Opened) -> None:
    try:
        info = json.loads(bundle.read(INFO))
    except (ValueError, RecursionError):
        raise Broken(f"{INFO} is not JSON: it was changed") from None
    if not isinstance(info, dict) or info.get("format") != FORMAT or not isinstance(info.get("made"), dict):
        raise Broken(f"{INFO} is not an amdflash bundle's description (format {FORMAT}): it was changed")
    bundle.info = info


def check_export(bundle: Opened) -> None:
    try:
        report = verify_export(bundle.at(EXPORT))
        if not report.ok:
            raise Broken(str(report.first_bad))
        bundle.facts = facts = export_facts(bundle.at(EXPORT))      # of a file that verified: well-formed
    except ExportFormatError as e:
        raise Broken(f"{EXPORT} is not a well-formed export ({e}): it was changed") from None
    except Broken as e:
        raise Broken(f"{EXPORT}: {e}") from None
    if report.scope != "run" or sorted(facts.runs) != sorted(bundle.info.get("runs") or []) \
            or bundle.info.get("run") not in facts.runs:
        raise Broken(f"{INFO} names runs the export does not hold (its run {bundle.info.get('run')!r}): one of them "
                     "was changed")
    bundle.said.append(f"export      {EXPORT}: {len(facts.runs)} run(s), {report.rows} rows, every one under its "
                       f"run's signed checkpoints ({report.checkpoints})")
    # Which runs the file holds is the sealer's word: a signer of the checkpoints, or the maker's own key.
    sealer = "a key that signed its checkpoints" if any(keys.fingerprint(k) == report.sealed_by
                                                        for k in facts.signers) else "the bundle maker's own key"
    bundle.said.append(f"sealed      by {report.sealed_by} ({sealer}): which runs the bundle holds is its word")


def check_keys(bundle: Opened) -> None:
    published = []
    for name in sorted(n for n in bundle.fds if re.fullmatch(r"host(-[0-9]{1,2})?\.pub", n)):
        try:
            public = keys.read_public(bundle.at(name))
        except (keys.KeyError_, NotAFile):
            raise Broken(f"{name} is not a public key: it was changed") from None
        pem = name[:-4] + ".pem"
        if pem in bundle.fds:
            try:
                if keys.read_public(bundle.at(pem)) != public:
                    raise Broken(f"{pem} is not the key {name} holds: one of them was changed")
            except (keys.KeyError_, NotAFile):
                raise Broken(f"{pem} is not a PEM public key: it was changed") from None
        published.append(public)
    signers = bundle.facts.signers
    for public in published:
        if public not in signers:
            raise Broken(f"the bundle's key {keys.fingerprint(public)} signed no checkpoint of the export: a host "
                         "key file was changed")
    given, called = bundle.given()
    trusted = given if given is not None else published
    for public in signers:
        if public not in trusted:
            whose = called if given is not None else "the bundle's host key"
            raise Broken(f"{EXPORT}: checkpoints are signed by key {keys.fingerprint(public)}, which is not {whose}: "
                         "the record was sealed (or re-sealed) by someone else")
    names = ", ".join(keys.fingerprint(k) for k in signers)
    how = called.replace("a given", "the given") if given is not None else \
        "the bundle's own host.pub (pass --key PUBFILE, kept apart from the bundle, to prove who signed)"
    bundle.said.append(f"signatures  by {names}: {how}")


def check_anchor(bundle: Opened) -> None:
    if ANCHOR not in bundle.fds:
        bundle.said.append("anchor      none in the bundle")
        return
    try:
        text = bundle.read(ANCHOR).decode("utf-8")
    except UnicodeDecodeError:
        raise Broken(f"{ANCHOR} is not UTF-8 text: it was changed") from None
    n = 0
    for n, line in enumerate(text.splitlines(), 1):
        try:
            entry = json.loads(line)
            ident, digest = int(entry["checkpoint"]), str(entry["hash"])
        except (ValueError, KeyError, TypeError, RecursionError):
            raise Broken(f"{ANCHOR} line {n} is not an anchor entry: it was changed") from None
        if bundle.facts.checkpoints.get(ident) != digest:
            raise Broken(f"{ANCHOR} line {n}: checkpoint #{ident} is not the export's (its hash differs, or the "
                         "export has no such checkpoint): one of them was changed")
    bundle.said.append(f"anchor      {n} line(s), each naming a checkpoint of the export with its hash")


def check_original(bundle: Opened) -> None:
    units = bundle.facts.units
    names = [n for n in (ORIGINAL, PARTIAL) if n in bundle.fds]
    if not units:
        if names:
            raise Broken(f"{names[0]}: the export holds no backup for it to be the original of: it was added")
        bundle.said.append("original    none: the trail holds no sealed backup of the board")
        return
    problem = _units_fit(units)
    if problem:
        raise Broken(f"{EXPORT}: {problem}")
    missing = _missing(units)
    name = PARTIAL if missing else ORIGINAL
    if names != [name]:
        raise Broken(f"the export holds backups of {len(units)} unit(s), but the bundle has no {name} (only "
                     f"{', '.join(names) or 'none'}): it was removed or renamed")
    content = bundle.read(name)
    if len(content) != FLASH_SIZE:
        raise Broken(f"{name}: {len(content)} bytes, not the flash's {FLASH_SIZE}: it was changed")
    for address, (size, sha, _) in sorted(units.items()):
        if hashlib.sha256(content[address:address + size]).hexdigest() != sha:
            raise Broken(f"{name}: the unit at {address:#08x} is not the sealed backup's (its SHA-256 differs from "
                         f"the one in {EXPORT}): it was changed")
    for start, end in missing:
        if content[start:end].count(0xFF) != end - start:
            raise Broken(f"{name}: {_span((start, end))}, which the trail holds no backup of, is not all 0xFF: it "
                         "was changed")
    bundle.original = content
    held = sum(s for s, _, _ in units.values())
    words = "the whole flash" if not missing else (f"{held // UNIT} of {FLASH_SIZE // UNIT} units; missing "
                                                   f"{', '.join(map(_span, missing))} (0xFF there, not the board's)")
    bundle.said.append(f"original    {name}: {words}; each unit the first sealed backup in the export")


def check_made(bundle: Opened) -> None:
    made = bundle.info.get("made") or {}
    bundle.said.append(f"made        by {made.get('by')} on {made.get('host')} at {made.get('at')} (the maker's word: "
                       f"the manifest covers it, no signature does)")


# Each step raises Broken naming the file and what differs; later parts add theirs here.
CHECKS: list[Callable[[Opened], None]] = [check_manifest, check_info, check_export, check_keys, check_anchor,
                                          check_original, check_made]

# The receipt parts (issue 45), written from the host's transparency log and checked offline.
from amdflash.store import receipt_parts  # noqa: E402 - it needs nothing of this module

ADD.append(receipt_parts.add)
CHECKS.append(receipt_parts.check)

# The witnesses' cosignatures and the timestamp tokens of the receipt's tree head; with a
# reviewer's policy, the five claims held to its keys (issue 45).
from amdflash.store import witness_parts  # noqa: E402 - it needs nothing of this module

ADD.append(witness_parts.add)
CHECKS.append(witness_parts.check)
CHECKS.append(witness_parts.check_policy)
