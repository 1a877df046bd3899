"""The board commands as jobs: each a graph of stages over one board.

Checks that need no board (image size and magic, --yes) happen in the CLI before any run
starts; checks that need the board (identity, protection) happen here before the first
destructive stage. A failed check is a `Refusal`: exit 2, nothing written to the flash.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from amdflash.pipeline.errors import Refusal
from amdflash.pipeline.runner import RunInfo, stage
from amdflash.stages import ifwi
from amdflash.stages.device import Device, Interrupted
from amdflash.stages.erase import erase_stage
from amdflash.stages.flash import protection as prot
from amdflash.stages.flash.spinor import FlashIdentity
from amdflash.stages.identify import identify_flash, open_engine, record_identity
from amdflash.stages.navi31 import aperture
from amdflash.stages.navi31.psp import PspMailbox
from amdflash.stages.navi31.romsw import RomSwOptions
from amdflash.stages.plan import PlanSummary, WorkItem, plan
from amdflash.stages.program import program_stage
from amdflash.stages.snapshot import BackupFile, UnitRead, read_backup, read_unit
from amdflash.stages.verify import first_mismatch, record_verify, verify_stage

FLASH_SIZE = 0x200000
UNIT = 0x1000
BUFFER = 4   # items in flight between two stages: memory is bounded by these, not by the flash


@dataclass
class EngineOptions:
    prescale: int = 8
    rx_mode: str = "primed"
    restore_each: bool = False

    def romsw(self) -> RomSwOptions:
        return RomSwOptions(prescale=self.prescale, rx_mode=self.rx_mode,  # type: ignore[arg-type]
                            restore_each=self.restore_each)


async def identify(dev: Device, engine: EngineOptions) -> FlashIdentity:
    stage(dev.recorder, "identify", "start")
    await dev.call(open_engine, dev, engine.romsw())
    ident = await dev.call(identify_flash, dev)
    stage(dev.recorder, "identify", "end", f"{ident.chip.name} uid {ident.unique_id.hex()}")
    return ident


def describe_identity(dev: Device, ident: FlashIdentity) -> list[str]:
    idt = dev.identity
    serial = f" serial {idt.serial}" if idt.serial else ""
    lines = [
        f"board       {idt.spec}{serial}{' (emulated)' if idt.extra.get('emulated') else ''}",
        f"flash       {ident.chip.name} ({ident.chip.size // 1024} KiB, {ident.chip.voltage}); "
        f"JEDEC capture {ident.jedec_capture.hex(' ')}",
        f"status      SR1={ident.sr1:02x} SR2={ident.sr2:02x} SR3={ident.sr3:02x}  "
        f"CMP={'set' if ident.cmp else 'clear'}  QE={int(bool(ident.sr2 & prot.SR2_QE))}",
        f"protection  {ident.protection.describe()}",
        f"SFDP        {ident.sfdp.describe() if ident.sfdp else 'unreadable: ' + str(ident.sfdp_error)}",
        f"unique ID   {ident.unique_id.hex()}",
    ]
    return lines


# -- read-only jobs ---------------------------------------------------------------------------

@dataclass
class InfoJob:
    engine: EngineOptions

    async def __call__(self, dev: Device, info: RunInfo) -> dict[str, Any]:
        ident = await identify(dev, self.engine)
        info.output += describe_identity(dev, ident)
        return {"jedec": ident.jedec_capture.hex(), "unique_id": ident.unique_id.hex()}


@dataclass
class ReadJob:
    engine: EngineOptions
    address: int
    size: int
    output: Path | None

    async def __call__(self, dev: Device, info: RunInfo) -> dict[str, Any]:
        await identify(dev, self.engine)
        stage(dev.recorder, "read", "start", f"{self.address:#x}+{self.size:#x}")
        chunks = []
        done = 0
        for address in range(self.address, self.address + self.size, UNIT):
            dev.stop.check()
            n = min(UNIT, self.address + self.size - address)
            chunks.append(await dev.call(read_unit, dev, address, n))
            done += n
            dev.progress("read", done, self.size)
        data = b"".join(chunks)
        stage(dev.recorder, "read", "end")
        sha = hashlib.sha256(data).hexdigest()
        if self.output:
            self.output.write_bytes(data)
            info.output.append(f"wrote {self.output} ({len(data):#x} bytes) sha256={sha}")
        else:
            info.output += [data[i:i + 32].hex() for i in range(0, len(data), 32)]
        return {"result_sha256": sha if (self.address, self.size) == (0, FLASH_SIZE) else None}


@dataclass
class DumpJob:
    engine: EngineOptions
    output: Path
    via: str = "rom-sw"

    async def __call__(self, dev: Device, info: RunInfo) -> dict[str, Any]:
        if self.via == "aperture":
            return await self._aperture(dev, info)
        await identify(dev, self.engine)
        stage(dev.recorder, "dump", "start")
        tmp = self.output.with_name(f".{self.output.name}.partial")
        digest = hashlib.sha256()
        with open(tmp, "wb") as f:
            for i, address in enumerate(range(0, FLASH_SIZE, UNIT)):
                dev.stop.check()
                data = await dev.call(read_unit, dev, address, UNIT)
                f.write(data)
                digest.update(data)
                dev.progress("dump", i + 1, FLASH_SIZE // UNIT)
        tmp.replace(self.output)
        sha = digest.hexdigest()
        dev.recorder.add("backups", sha256=sha, size=FLASH_SIZE, path=str(self.output.resolve()), at=None)
        stage(dev.recorder, "dump", "end", sha)
        info.output.append(f"wrote {self.output} ({FLASH_SIZE:#x} bytes via ROM_SW) sha256={sha}")
        return {"result_sha256": sha}

    async def _aperture(self, dev: Device, info: RunInfo) -> dict[str, Any]:
        stage(dev.recorder, "dump", "start", "via ROM aperture")

        def page_done(done: int, total: int) -> None:
            dev.progress("aperture", done, total)
            dev.stop.check()   # a safe point: registers are restored by the driver on the way out

        def run() -> aperture.ApertureDump:
            return aperture.dump(dev.bar, page_done)

        result = await dev.call(run)
        self.output.write_bytes(result.data)
        dev.recorder.add("backups", sha256=result.sha256, size=FLASH_SIZE, path=str(self.output.resolve()), at=None)
        stage(dev.recorder, "dump", "end", result.sha256)
        info.output.append(f"wrote {self.output} ({FLASH_SIZE:#x} bytes via ROM aperture) sha256={result.sha256}")
        return {"result_sha256": result.sha256}


class VerifyMismatch(RuntimeError):
    def __init__(self, message: str, address: int):
        super().__init__(message)
        self.address = address


@dataclass
class VerifyJob:
    engine: EngineOptions
    image: bytes

    async def __call__(self, dev: Device, info: RunInfo) -> dict[str, Any]:
        await identify(dev, self.engine)
        stage(dev.recorder, "verify", "start")
        digest = hashlib.sha256()
        first = None
        bad = 0
        for i, address in enumerate(range(0, FLASH_SIZE, UNIT)):
            dev.stop.check()
            got = await dev.call(read_unit, dev, address, UNIT)
            digest.update(got)
            mm = record_verify(dev, address, UNIT, got, self.image[address:address + UNIT], 1)
            if mm:
                bad += 1
                first = first or mm
            dev.progress("verify", i + 1, FLASH_SIZE // UNIT)
        sha = digest.hexdigest()
        if first:
            stage(dev.recorder, "verify", "fail", f"{bad} units differ")
            raise VerifyMismatch(f"verify mismatch at {first.address:#08x}: flash={first.flash_byte:02x} "
                                 f"image={first.image_byte:02x} ({bad} of {FLASH_SIZE // UNIT} units differ)",
                                 first.address)
        stage(dev.recorder, "verify", "end")
        info.output.append(f"verified {FLASH_SIZE:#x} bytes: flash equals the image, sha256={sha}")
        return {"result_sha256": sha}


# -- flashing ---------------------------------------------------------------------------------

@dataclass
class FlashJob:
    engine: EngineOptions
    image: bytes
    start_sector: int = 0
    sector_count: int = FLASH_SIZE // UNIT
    clear_cmp: bool = False
    retries: int = 2
    backup_dir: Path | None = None
    # Resume: units an earlier run verified. They are read again all the same (something may
    # have written the board since), and said so if they changed.
    previously_verified: frozenset[int] = field(default_factory=frozenset)
    resuming: bool = False
    expected_identity: dict[str, str] | None = None                  # resume: must match
    original_registers: dict[int, int] | None = None                 # resume: restore these at the end

    @property
    def addresses(self) -> list[int]:
        return [s * UNIT for s in range(self.start_sector, self.start_sector + self.sector_count)]

    async def __call__(self, dev: Device, info: RunInfo) -> dict[str, Any]:
        ident = await identify(dev, self.engine)
        self._check_identity(dev, ident)
        if self.original_registers and dev.romsw is not None:
            # A resumed run puts back what the board held before the first (killed) run began.
            for reg in dev.romsw.originals:
                if reg in self.original_registers:
                    dev.romsw.originals[reg] = self.original_registers[reg]
        await self._check_protection(dev, ident)
        addresses = self.addresses
        clock0 = dev.clock.now()
        summary = PlanSummary()
        # A resume keeps the first run's backup as the board's pre-flash content.
        backup = BackupFile(self.backup_dir) if self.backup_dir and not self.resuming else None
        chip = ident.chip
        erase_sizes = [e.size for e in chip.erase_types]
        interrupted = False
        try:
            reads_tx, reads_rx = anyio.create_memory_object_stream[UnitRead](BUFFER)
            work_tx, work_rx = anyio.create_memory_object_stream[WorkItem](BUFFER)
            prog_tx, prog_rx = anyio.create_memory_object_stream(BUFFER)
            verify_tx, verify_rx = anyio.create_memory_object_stream(BUFFER)
            n = len(addresses)
            results: dict[str, Any] = {}

            async def timed(name: str, fn, *args: Any) -> None:  # noqa: ANN001
                # Each stage's outcome is its own: it ends when its input has run dry, stops early
                # when the operator asked, and is cancelled (not failed) when another stage failed.
                stage(dev.recorder, name, "start")
                try:
                    results[name] = await fn(*args)
                except anyio.get_cancelled_exc_class():
                    stage(dev.recorder, name, "cancelled", "stopped: another stage failed, or the run was cancelled")
                    raise
                except BaseException as e:
                    stage(dev.recorder, name, "fail", str(e) or type(e).__name__)
                    raise
                stopped = results[name] is True or (name == "backup" and results[name] < n)
                stage(dev.recorder, name, "stop" if stopped else "end")

            async with anyio.create_task_group() as tg:
                tg.start_soon(timed, "backup", read_backup, dev, addresses, UNIT, reads_tx, backup)
                tg.start_soon(timed, "plan", plan, dev, self.image, erase_sizes, chip.page_size, reads_rx,
                              work_tx, summary)
                tg.start_soon(timed, "erase", erase_stage, dev, work_rx, prog_tx, n)
                tg.start_soon(timed, "program", program_stage, dev, prog_rx, verify_tx, n)
                tg.start_soon(timed, "verify", verify_stage, dev, verify_rx, n, self.retries)
            # Stopped means work was left undone: the erase stage stopped taking items, or the
            # backup read stopped before the end (a stop after the last verify is no interruption).
            interrupted = bool(results.get("erase")) or results.get("backup", n) < n
        except BaseException:
            if backup:
                backup.discard()
            raise
        if backup:
            sha, path = backup.finish()
            dev.recorder.add("backups", sha256=sha, size=backup.size, path=str(path), at=None)
        if interrupted:
            raise Interrupted(dev.stop.reason or "interrupted")
        info.output += dev.extra.get("notes", [])
        changed = sorted(summary.written & self.previously_verified)
        if changed:
            info.output.append(f"{len(changed)} unit(s) verified by an earlier run had changed since and were "
                               f"rewritten (first at {changed[0]:#08x}): something else wrote this board")
        counts = summary.counts
        erases = ", ".join(f"{c}×{s // 1024}K" for s, c in sorted(summary.erases.items(), reverse=True)) or "none"
        info.output.append(
            f"flashed {len(self.addresses)} units: {counts['skip']} already equal, "
            f"{counts['program']} programmed without erase, {counts['erase']} erased+programmed "
            f"(erases: {erases}); retries {results.get('verify', 0)}; "
            f"{dev.clock.now() - clock0:.2f} s on the board's clock")
        whole = self.start_sector == 0 and self.sector_count == FLASH_SIZE // UNIT
        return {"units": counts, "erases": summary.erases,
                "result_sha256": hashlib.sha256(self.image).hexdigest() if whole else None}

    def _check_identity(self, dev: Device, ident: FlashIdentity) -> None:
        want = self.expected_identity
        if not want:
            return
        have = {"unique_id": ident.unique_id.hex(), "jedec_chip": ident.chip.name,
                "bridge_serial": dev.identity.serial or ""}
        for key, value in want.items():
            if value and have.get(key) != value:
                raise Refusal(f"this is not the board of the run being resumed: {key} is {have.get(key)!r}, "
                              f"the run recorded {value!r}")

    async def _check_protection(self, dev: Device, ident: FlashIdentity) -> None:
        lo, hi = self.addresses[0], self.addresses[-1] + UNIT
        current = ident.protection
        after = prot.decode(ident.sr1, ident.sr2 & ~prot.SR2_CMP, ident.chip.size) if self.clear_cmp else current
        if current.overlaps(lo, hi - lo) and ident.cmp and not self.clear_cmp:
            raise Refusal(f"SR2.CMP is set and protects {current.describe()}; rerun with --clear-cmp to clear it")
        if after.overlaps(lo, hi - lo):
            raise Refusal(f"the target range {lo:#08x}-{hi - 1:#08x} is write-protected "
                          f"({after.describe()}{' even with CMP cleared' if self.clear_cmp else ''}); "
                          "amdflash does not change block protection bits")
        if ident.cmp and self.clear_cmp:
            stage(dev.recorder, "clear_cmp", "start", current.describe())
            # A non-volatile status write: on record before it happens, like a unit's intent.
            await dev.call(dev.recorder.durable)
            assert dev.nor is not None
            await dev.call(dev.nor.clear_cmp)
            stage(dev.recorder, "clear_cmp", "end", "SR2.CMP cleared")
            dev.extra.setdefault("notes", []).append("cleared SR2.CMP")


# -- PSP mailbox jobs -------------------------------------------------------------------------

@dataclass
class ProbeJob:
    async def __call__(self, dev: Device, info: RunInfo) -> dict[str, Any]:
        record_identity(dev, None)   # the transport's identity (and whether the board is emulated)
        stage(dev.recorder, "probe", "start")
        result = await dev.call(PspMailbox(dev.bar).probe)
        for name, (error, response) in result.answers.items():
            info.output.append(f"{name:15} error={error:#x} response={response:#x}")
        if result.gated:
            info.output.append("update commands gated (transfer type 0xA): reset the card and do not "
                               "initialise a driver/SOS before streaming")
        stage(dev.recorder, "probe", "end")
        return {"probe": {k: list(v) for k, v in result.answers.items()}}


@dataclass
class IfwiAllJob:
    image: bytes

    async def __call__(self, dev: Device, info: RunInfo) -> dict[str, Any]:
        record_identity(dev, None)   # the transport's identity (and whether the board is emulated)
        stage(dev.recorder, "ifwi_all", "start")
        mailbox = PspMailbox(dev.bar)
        streamed = []

        def on_item(item) -> None:  # noqa: ANN001
            streamed.append(item)
            dev.recorder.add("stages", stage="ifwi_all", event="item",
                             detail=f"item {item.item:#x} phase {item.phase} offset {item.offset:#x} "
                                    f"size {item.size:#x}", at=None)
            dev.progress("ifwi", len(streamed), 19)
            if item.phase != 2:
                dev.stop.check()   # between items: never inside one stream

        items = await dev.call(mailbox.ifwi_all, self.image, on_item)
        stage(dev.recorder, "ifwi_all", "end", f"{len(items)} items")
        for it in items:
            info.output.append(f"streamed item {it.item:#04x} (phase {it.phase}) offset {it.offset:#08x} "
                               f"size {it.size:#x}")
        info.output.append("IFWI stream complete after the terminal item; a hard power cycle is required")
        return {"items": [it.item for it in items]}


def check_image(data: bytes, path: str, force: bool) -> None:
    if len(data) != FLASH_SIZE:
        raise Refusal(f"image {path} is {len(data):#x} bytes; a Navi31 flash image is exactly {FLASH_SIZE:#x}")
    if data[:4] != aperture.IFWI_MAGIC and not force:
        raise Refusal(f"image {path} does not start with the IFWI signature AA55AA55 "
                      f"(starts {data[:4].hex()}); pass --force if you are sure")


def check_ifwi(data: bytes, path: str) -> None:
    problems = ifwi.check_image(data)
    if problems:
        raise Refusal(f"image {path}: " + "; ".join(problems))


__all__ = ["first_mismatch"]
