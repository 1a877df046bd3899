"""Canonical JSON: the JSON Canonicalization Scheme (RFC 8785, JCS).

A receipt's bytes must be the same whoever builds them, whenever: the transparency log holds
their hash, and anyone may rebuild them with any RFC 8785 library. JCS is ECMAScript's
JSON.stringify with object members sorted by their names' UTF-16 code units:

* no whitespace; strings escape only '"', '\\\\' and the controls below U+0020 (\\b \\f \\n \\r \\t,
  the others as \\u00xx in lowercase hex); everything else is written as UTF-8 as it is;
* numbers as ECMAScript writes an IEEE 754 double (RFC 8785 §3.2.2.3): an integer beyond
  2^53 cannot be one exactly and is refused, as are NaN and the infinities;
* true, false, null; lists in their order.
"""
from __future__ import annotations

import math
from typing import Any

MAX_EXACT = 2 ** 53 - 1

_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


class NotCanonical(ValueError):
    """A value JCS cannot write (a non-finite number, a lone surrogate, an unknown type)."""


def canonical(value: Any) -> bytes:
    """The RFC 8785 canonical form of `value` (dict, list, str, int, float, bool, None)."""
    out: list[str] = []
    _write(value, out)
    try:
        return "".join(out).encode("utf-8")
    except UnicodeEncodeError:
        raise NotCanonical("a string holds a lone surrogate, which is not Unicode text") from None


def _write(value: Any, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        if abs(value) > MAX_EXACT:
            raise NotCanonical(f"{value} is beyond 2^53: a JSON number (an IEEE double) cannot hold it exactly")
        out.append(str(value))
    elif isinstance(value, float):
        out.append(number(value))
    elif isinstance(value, str):
        out.append(_string(value))
    elif isinstance(value, (list, tuple)):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _write(item, out)
        out.append("]")
    elif isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise NotCanonical(f"an object member's name must be a string, not {type(key).__name__}")
        out.append("{")
        for i, key in enumerate(sorted(value, key=_utf16)):
            if i:
                out.append(",")
            out.append(_string(key))
            out.append(":")
            _write(value[key], out)
        out.append("}")
    else:
        raise NotCanonical(f"cannot write a {type(value).__name__} as JSON")


def _utf16(name: str) -> bytes:
    """Sort key: the name's UTF-16 code units (big-endian bytes compare as the units do)."""
    return name.encode("utf-16-be", "surrogatepass")


def _string(text: str) -> str:
    parts = ['"']
    for ch in text:
        esc = _ESCAPES.get(ch)
        if esc is not None:
            parts.append(esc)
        elif ch < " ":
            parts.append(f"\\u{ord(ch):04x}")
        else:
            parts.append(ch)
    parts.append('"')
    return "".join(parts)


def number(x: float) -> str:
    """ECMAScript's Number::toString of a double (RFC 8785 §3.2.2.3)."""
    if not math.isfinite(x):
        raise NotCanonical(f"{x} is not a JSON number")
    if x == 0:
        return "0"                 # -0 too
    sign = "-" if x < 0 else ""
    # repr gives the shortest digits that read back as the same double, as ECMAScript asks.
    mantissa, _, exp = repr(abs(x)).partition("e")
    whole, _, frac = mantissa.partition(".")
    digits = (whole + frac).lstrip("0")
    point = len(whole) + (int(exp) if exp else 0)          # value = 0.whole+frac × 10^point
    point -= len(whole + frac) - len((whole + frac).lstrip("0"))
    digits = digits.rstrip("0")
    k, n = len(digits), point
    if k <= n <= 21:
        text = digits + "0" * (n - k)
    elif 0 < n <= 21:
        text = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        text = "0." + "0" * (-n) + digits
    else:
        e = n - 1
        text = (digits if k == 1 else digits[0] + "." + digits[1:]) + "e" + ("+" if e >= 0 else "-") + str(abs(e))
    return sign + text
