"""Text from boards, images, file names and the trail, made safe to show on a terminal (or
in an HTML page: `for_html`).

A USB string, a part number, a file name or a row of a forged trail may hold escape
sequences (ESC, BEL, CSI …) that a terminal would obey: move the cursor, rewrite earlier
lines, set the window title, ring. Every line amdflash prints passes through `printable`,
which shows such characters as Python escapes (`\\x1b`) instead; a file name that is not
UTF-8 (its bytes decoded with surrogateescape) shows its raw bytes the same way.
"""
from __future__ import annotations

import unicodedata

_KEEP_MULTILINE = frozenset("\n\t")


def _escape(c: str) -> str:
    code = ord(c)
    if 0xDC80 <= code <= 0xDCFF:          # a byte that was not UTF-8 (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _unsafe(c: str) -> bool:
    # Cc: C0/C1 controls and DEL; Cf: format characters (bidi overrides that reorder what is
    # shown); Cs: lone surrogates, which would also fail to encode; Zl/Zp: line breaks.
    return unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp")


def printable(text: str, multiline: bool = False) -> str:
    """`text` with every control, format or undecodable character escaped; `multiline` keeps
    newlines and tabs (a result of several lines), otherwise they are escaped too."""
    if text.isprintable():                # the common case, at C speed
        return text
    keep = _KEEP_MULTILINE if multiline else frozenset()
    return "".join(_escape(c) if c not in keep and _unsafe(c) else c for c in text)


def for_html(text: str) -> str:
    """`text` for an HTML page (the report, the line view): the same escapes as on a terminal
    (a browser obeys a bidi override too, and hides controls), newlines kept, then markup
    escaped."""
    from html import escape     # here, not at the top: --version loads this module

    return escape(printable(text, multiline=True))
