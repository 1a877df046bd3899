"""`amdflash image info FILE`: what an IFWI image is for, read without any board."""
from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any

from amdflash.pipeline.errors import EXIT_FAILED, EXIT_OK, Refusal
from amdflash.stages.image import ifwi
from amdflash.stages.image.atom import OPTION_ROM_MAGIC, AtomError, BytesSource, parse_atom
from amdflash.stages.image.partitions import LayoutError, read_layout
from amdflash.store.files import NotAFile, read_regular
from amdflash.pipeline.cli import output


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("image", help="inspect an IFWI image file (no board needed)")
    isub = p.add_subparsers(dest="image_command", required=True, metavar="IMAGE_COMMAND")
    p = isub.add_parser(
        "info", help="partitions, VBIOS part numbers and versions of an image",
        description="Walk FILE as fwupd's amd-gpu plugin does (EFS, L1 $PSP directory, ISH_A/ISH_B slot "
                    "headers, each partition and its ATOM VBIOS image) and print what it holds: the part "
                    "number the image is for (ISH_A, partition A), each partition's part number, VBIOS "
                    "version, build date, PCI and subsystem ids. Says why when it cannot; a plain VBIOS "
                    "(a PCI option ROM, not an IFWI) is described as far as its ATOM header tells, and "
                    "said not to be an IFWI. Exit 0 when the IFWI's part number was found, 1 when not "
                    "(a plain VBIOS included). Reads FILE only.")
    p.add_argument("file", type=Path, help="the IFWI image file (2 MiB) to inspect")
    p.add_argument("--format", choices=("text", "json"), default="text",
                   help="text for people (default) or one JSON object")
    p.set_defaults(func=cmd_image_info)


def image_report(data: bytes) -> dict[str, Any]:
    """Everything `image info` says about `data`, as one object."""
    report: dict[str, Any] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                              "problems": ifwi.check_image(data), "partitions": [], "notes": [],
                              "part_number": None, "error": None, "kind": "ifwi"}
    try:
        layout = read_layout(BytesSource(data))
    except LayoutError as e:
        report["error"] = str(e)
        if bytes(data[:2]) == OPTION_ROM_MAGIC:
            _plain_vbios(data, report)
        return report
    report["psp_directory"] = layout.psp_directory
    report["notes"] = list(layout.notes)
    for s in layout.slots:
        report["partitions"].append({
            "ish": s.ish, "header_at": s.header_at, "partition": s.partition,
            "partition_fw_id": s.partition_fw_id, "location": s.location, "size": s.size, "atom_at": s.csm_at,
            "boot_priority": s.priority, "update_retries": s.update_retries, "l2_entries": s.l2_entries,
            "atom": s.atom.as_dict() if s.atom else None, "problem": s.problem})
    try:
        report["part_number"] = layout.image_vbios().part_number
    except LayoutError as e:
        report["error"] = str(e)
    report["lines"] = layout.describe()
    return report


def _plain_vbios(data: bytes, report: dict[str, Any]) -> None:
    """A file that starts like a PCI option ROM: a VBIOS on its own (as `rom` files and VBIOS
    collections hold them), not an IFWI. Say what it is and what it is for, as far as its ATOM
    header tells, and that amdflash does not flash it."""
    try:
        atom = parse_atom(BytesSource(data))
    except AtomError as e:
        report["notes"].append(f"starts like a PCI option ROM, but no ATOM VBIOS could be read: {e}")
        return
    report["kind"] = "vbios"
    report["vbios"] = atom.as_dict()
    report["lines"] = ["plain VBIOS   a PCI option ROM with an ATOM VBIOS, NOT an IFWI: amdflash flashes whole "
                       "IFWI images only (a Navi31 flash holds this inside each partition)",
                       *atom.describe()]


IMAGE_INFO_LIMIT = 256 << 20


def cmd_image_info(args: argparse.Namespace) -> int:
    try:
        # Any size is described (a wrong size is one of the problems it names), but only a
        # regular file is read, and never more than any flash part holds.
        data = read_regular(args.file, IMAGE_INFO_LIMIT)
    except OSError as e:
        raise Refusal(f"cannot read image {args.file}: {e.strerror}") from None
    except NotAFile as e:
        raise Refusal(f"image {e}") from None
    report = image_report(data)
    if args.format == "json":
        print(json.dumps({k: v for k, v in report.items() if k != "lines"}, indent=2))
    else:
        output.result(f"image         {args.file} ({report['size']:#x} bytes) sha256={report['sha256']}")
        for problem in report["problems"]:
            output.result(f"problem       {problem}")
        for line in report.get("lines", []):
            output.result(line)
        if report["part_number"]:
            output.result(f"image is for part {report['part_number']} (ISH_A → partition A → its ATOM image; "
                  f"boards are compared on its first ten characters)")
        elif report.get("vbios"):
            output.result(f"not an IFWI: a plain VBIOS for part {report['vbios']['part_number']} ({report['error']})")
        else:
            for note in report["notes"]:
                output.result(f"note          {note}")
            output.result(f"no part number: {report['error']}")
    if report["part_number"]:
        return EXIT_OK
    # Exit 1 says, as every failure does, why in one `error:` line on stderr (stdout keeps the report).
    output.error(f"image {args.file}: its part number cannot be told: {report['error']}")
    return EXIT_FAILED
