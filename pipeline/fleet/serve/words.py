"""Words of the line view: what a host wrote, made safe to show (escaped for HTML, one
printable line for a notification, URLs and passwords masked), and the few amounts and
durations every page and notification says."""
from __future__ import annotations

import datetime as dt
import math
import re
from typing import Any


def escape(text: str) -> str:
    """Text for HTML: markup characters escaped, and controls and format characters (a bidi
    override from a board's name) shown as escapes, as the terminal shows them."""
    from amdflash.stages.terminal import for_html

    return for_html(str(text))


RUN_ID = re.compile(r"[0-9]{8}T[0-9]{6}-[0-9a-f]{8}")     # what amdflash's run ids look like (store/html.py)



def word(value: Any, limit: int = 200) -> str:
    """A recorded value for a notification: one printable line (controls, bidi overrides and
    newlines shown as escapes, as the terminal shows them), at most `limit` characters."""
    from amdflash.stages.terminal import printable

    text = printable("" if value is None else str(value))
    return text if len(text) <= limit else text[:limit - 1] + "…"


def run_word(run_id: Any) -> str:
    """A run id for a notification: only one of amdflash's shape is named."""
    return run_id if isinstance(run_id, str) and RUN_ID.fullmatch(run_id) else "(not a run id)"


_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://([^\s'\"<>]*)")
_HOST = re.compile(r"(?:localhost|[0-9.]+|\[[0-9a-fA-F:.]+\]|[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+)(?::[0-9]+)?")


def mask_url(url: str) -> str:
    """A URL for a message: its scheme and host only, a user, password or token as `***`
    (Apprise URLs carry tokens in the user part, the path, the query, and even the host)."""
    m = _URL.match(url.strip())
    if not m:
        return "***"
    scheme, rest = m.groups()
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    tail = rest[len(authority):]
    user, at, host = authority.rpartition("@")
    shown = ("***@" if at else "") + (host if _HOST.fullmatch(host) else "***" if host else "")
    return f"{scheme}://{shown}" + ("/***" if tail.strip("/") else "")


def no_password(text: str) -> str:
    """`text` with any password=… of a connection string (libpq's key=value or URL query) as ***."""
    return re.sub(r"((?:ssl)?password\s*=\s*)('[^']*'|[^\s&]*)", r"\1***", text, flags=re.IGNORECASE)


def mask_urls(text: str) -> str:
    """`text` with every URL in it masked (mask_url), and any password=… of a connection string."""
    return _URL.sub(lambda m: mask_url(m.group(0)), no_password(text))


def age(when: dt.datetime | None, now: dt.datetime | None = None) -> float | None:
    if when is None:
        return None
    now = now or dt.datetime.now(dt.UTC)
    return max(0.0, (now - when).total_seconds())


def amount(n: int | None) -> str:
    if n is None:
        return ""
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def duration(seconds: float | None) -> str:
    if seconds is None or math.isnan(seconds) or seconds < 0:
        return ""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def run_href(host_id: int | None, run_id: str | None, prefix: str = "") -> str | None:
    """This server's page of a run, or None for a value that is not a run id (never a link)."""
    if host_id is None or not run_id or not RUN_ID.fullmatch(run_id):
        return None
    return f"{prefix}runs/{int(host_id)}/{run_id}.html"
