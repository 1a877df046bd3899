"""The facts of a run (store/facts.py) in words: one sentence per fact, (key, label, text), which
the text report prints as its lines, the HTML page shows in its table (data-field fact-KEY) and
the JSON carries as `facts.words` — the same words in the three formats. `left_words` is also
what `replay` says of the registers a run left changed."""
from __future__ import annotations

from typing import Any


def _regs(values: dict[str, str] | None) -> str:
    return ", ".join(f"{k}={v}" for k, v in (values or {}).items())


def words(rep: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(key, label, sentence) of each fact: what the text report prints and the HTML page shows."""
    f = rep.get("facts") or {}
    out: list[tuple[str, str, str]] = []
    regs = f.get("registers") or {}
    if regs.get("before"):
        out.append(("registers-before", "registers", f"before: {_regs(regs['before'])}"))
        if regs.get("after_restore") is not None:
            same = regs["after_restore"] == regs["before"]
            out.append(("registers-after", "registers", "after restore: " + (
                "as before" if same else _regs(regs["after_restore"]))))
        else:
            out.append(("registers-after", "registers", "after restore: no snapshot recorded (the run ended "
                                                        "without putting its registers back, or could not read "
                                                        "them back)"))
        out.append(("registers-left", "registers", left_words(regs)))
    for o in f.get("overrides") or ():
        if o["option"] == "--force":
            if o["overrode"]:
                text = (f"overrode the part-number check: image part {o.get('image_part') or 'unknown'}, board part "
                        f"{o.get('board_part') or 'unknown'}" + (f" ({o['board_detail']})" if o.get("board_detail")
                                                                  else "") + f": {o.get('reason')}")
            elif o.get("part_outcome"):
                text = f"given, overrode nothing: the part check said {o['part_outcome']} ({o.get('reason')})"
            else:
                text = "given; no part check is on record (the run stopped before it)"
        elif o["option"] == "--clear-cmp":
            text = (f"overrode protection: {o.get('protection')} -> {o.get('result') or 'not recorded as done'}"
                    if o["overrode"] else "given, overrode nothing: SR2.CMP was not set")
        else:
            text = (f"the chip {o.get('chip')} was written from its SFDP facts" if o["overrode"]
                    else "given, overrode nothing: the chip is in the chip table")
        out.append((f"override{o['option']}", "override", f"{o['option']} {text}"))
    image = f.get("image") or {}
    if image.get("sha256"):
        out.append(("image-held", "image", f"{image.get('path') or '-'} sha256 {image['sha256']}: the trail holds "
                                           "its hash only, not its content (the data of each unit written is in "
                                           "the run's transactions)"))
    b = f.get("backup")
    if b and b.get("path") is None:
        why = "none made: the run stopped while backing up" if b.get("unfinished") else "no backup file recorded"
        out.append(("backup-held", "backup", f"{why}; the trail holds the "
                                             f"{b['units_in_trail']} sealed backup units it read (from "
                                             f"{b['first_address']:#08x}): 'amdflash audit bundle --run "
                                             f"{rep['run_id']}' rebuilds them as original-partial.bin"))
    elif b:
        held = (f"the trail holds its content: {b['units_in_trail']} sealed backup units rebuild it (sha256 matches)"
                if b["in_trail"] else f"the trail holds {b['bytes_in_trail']} of its {b['size']} bytes in sealed "
                                      "backup units" if b["bytes_in_trail"] else
                "the trail holds no backup units of it: only the file has its content")
        who = "made by this run" if b["run_id"] == rep["run_id"] else f"kept from run {b['run_id']}, which it resumes"
        out.append(("backup-held", "backup", f"{who}: {b['path']} sha256 {b['sha256']}; {held}"))
    v = f.get("vbios")
    if v:
        before = f"{v.get('before') or v.get('before_state') or 'unknown'}" + (
            f" version {v['before_version']}" if v.get("before_version") else "")
        why = ("the run did not succeed" if rep.get("status") != "succeeded" else
               "the run wrote a range of sectors, which need not hold the VBIOS")
        after = (f"{v['after']}" + (f" version {v['after_version']}" if v.get("after_version") else "")
                 + f" ({v['after_from']})" if v.get("after") else f"not known ({why}; the image's part is "
                                                                  f"{v.get('image') or 'unknown'})")
        out.append(("vbios", "vbios", f"part before {before}; after {after}"))
    units = [u for u in rep.get("units") or () if u.get("start_s") is not None]
    if units:
        out.append(("unit-clock", "unit times", str(f.get("unit_clock"))))
        skipped = [u for u in units if u["action"] == "skip"]
        if skipped:
            first = min(skipped, key=lambda u: u["start_s"])
            last = max(skipped, key=lambda u: u["end_s"])
            out.append(("units-skipped", "unit", f"{len(skipped)} units found equal (skip) {_span(first, last)}"))
        for u in units:
            if u["action"] != "skip":
                out.append((f"unit-{u['address']:#08x}", "unit", f"{u['address']:#08x} {u['action']} {u['state']} "
                                                                 f"{_span(u, u)}"))
    e = f.get("ended") or {}
    if e:
        out.append(("ended", "ended", _ended_words(e)))
    if f.get("verify_diagnosis"):
        out.append(("diagnosis", "diagnosis", f["verify_diagnosis"]))
    if f.get("read_for_host"):
        # A copy of another host's run (the central record's): its commands run there, on its trail.
        text = (f"read from the central record's copy of {f['read_for_host']}'s run: the commands a 'next' line "
                f"gives run on {f['read_for_host']}, against its own trail")
        if rep.get("error"):
            text += f"; the error is quoted as {f['read_for_host']} recorded it, with its paths"
        out.append(("database", "database", text))
    elif f.get("database"):
        text = f"read from {f['database']}: the commands a 'next' line gives name it"
        if rep.get("error"):
            text += f"; the error is quoted as run {rep['run_id']} recorded it on {rep.get('host')}, with that " \
                    "host's paths"
        out.append(("database", "database", text))
    return out


def left_words(regs: dict[str, Any]) -> str:
    """What the run left changed of the registers, and the later run that put them back, if one did."""
    changed = ", ".join(f"{c['register']} {c['before']} -> {c['left']}" for c in regs.get("left_changed") or ())
    source = ("its after-restore snapshot" if regs.get("left_from") == "after restore"
              else "its sealed register writes up to the first that failed: the writes after it did not reach "
                   "the board (the link was lost), its attempt to put them back among them"
              if regs.get("left_from") == "sealed writes before the link was lost"
              else "its last sealed register writes; one recorded just as the run died may not have reached "
                   "the board")
    text = f"left changed (from {source}): {changed}" if changed else f"left changed: none (from {source})"
    put = regs.get("put_back_by")
    if put:
        done = ", ".join(f"{k} {a} -> {b}" for k, (a, b) in (put.get("put_back") or {}).items())
        text += (f"; run {put['run_id']} found them " + (f"as {_regs(regs['found_by_next'])}" if
                                                          regs.get("found_by_next") else "")
                 + (f" and put back {done}" if done else "; it put back nothing")
                 + (f" (changed since by something else: {', '.join(put['changed_since'])})"
                    if put.get("changed_since") else ""))
    elif changed and (regs.get("left_from") or "").startswith("sealed writes"):
        text += "; no later run on record has put them back (the next run on this board does, first)"
    return text


def _span(first: dict[str, Any], last: dict[str, Any]) -> str:
    if first.get("start"):
        return f"{first['start']} .. {last['end']}"
    return f"+{first['start_s']:.3f} s .. +{last['end_s']:.3f} s"


def _ended_words(e: dict[str, Any]) -> str:
    how = e.get("how")
    if how == "recorded":
        return f"recorded its end: {e.get('status')} at {e.get('at')}"
    if how == "not verified":
        said = f"the trail says it ended {e['status']}" if e.get("status") else "the trail holds no end for it"
        return (f"its end does not verify: {said}, in a row its signed checkpoints do not vouch for (or after a "
                "span that fails); how it ended the record cannot prove")
    if how == "running":
        return "still running: no end recorded, and its process lives on this host (holding the board's lock)"
    if how == "killed":
        later = (f"; a later run on its host, {e['later_run']}, recorded the same boot id" if e.get("later_run")
                 else "; its host has the same boot id and the process is gone")
        return f"killed: no end recorded, its lock is no longer held and the host kept running{later}"
    if how == "host down":
        later = (f"a later run on its host, {e['later_run']}, recorded boot id {e.get('later_boot_id')}"
                 if e.get("later_run") else f"this host now has boot id {e.get('later_boot_id')}")
        return f"its host went down (or restarted) before the run ended: no end recorded; it ran under boot id " \
               f"{e.get('boot_id')}, {later}"
    if how == "gone":
        return ("no end recorded, and its host's record says its process is gone; with no later run of its host on "
                "record, whether it was killed or its host went down the record cannot tell")
    return ("no end recorded; read on another machine with no later run of its host on record, the record cannot "
            "tell whether it still runs, was killed or its host went down")
