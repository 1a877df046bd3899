"""A timestamp token's certificates put in DER order, for a reader that insists on it.

`openssl ts -reply` with `certs` writes the signer's chain into SignedData's `certificates`
SET in the order the chain file lists it; DER wants a SET OF in ascending order of its
elements' encodings, and rfc3161-client refuses the token (InvalidSetOrdering) that openssl
itself verifies. The certificates are not signed by the token's signature (RFC 5652 §5.4:
the signed attributes cover the TSTInfo's digest and the signer's certificate id, ESS), so
the same elements in DER order are the same token to a verifier: `der_sorted` swaps them in
place (the SET's length does not change), and the verifier then checks everything it checks
of any token. The stored token stays the bytes the authority sent.
"""
from __future__ import annotations


class NotDer(ValueError):
    pass


def _tlv(buf: bytes, at: int, end: int) -> tuple[int, int, int]:
    """(tag, first content byte, end) of the DER element at `at`; NotDer past `end`."""
    if at + 2 > end:
        raise NotDer("truncated")
    tag, first = buf[at], buf[at + 1]
    if tag & 0x1F == 0x1F:
        raise NotDer("high tag numbers are not expected here")
    if first < 0x80:
        start, length = at + 2, first
    else:
        n = first & 0x7F
        if n == 0 or n > 4 or at + 2 + n > end:
            raise NotDer("a length that DER does not write")
        start, length = at + 2 + n, int.from_bytes(buf[at + 2:at + 2 + n], "big")
    if start + length > end:
        raise NotDer("an element longer than what holds it")
    return tag, start, start + length


def _children(buf: bytes, start: int, end: int) -> list[tuple[int, int, int, int]]:
    """(tag, offset, content start, end) of each element from `start` to `end`."""
    out, at = [], start
    while at < end:
        tag, content, stop = _tlv(buf, at, end)
        out.append((tag, at, content, stop))
        at = stop
    return out


def der_sorted(response: bytes) -> bytes | None:
    """The TimeStampResp with its token's certificates in DER order; None when it holds none
    or is not shaped as RFC 3161 says (the caller's refusal stands)."""
    try:
        tag, start, end = _tlv(response, 0, len(response))
        parts = _children(response, start, end)                     # status, token
        if tag != 0x30 or len(parts) < 2 or parts[1][0] != 0x30:
            return None
        info = _children(response, parts[1][2], parts[1][3])         # contentType, [0] content
        if len(info) != 2 or info[1][0] != 0xA0:
            return None
        [signed] = _children(response, info[1][2], info[1][3])       # SignedData
        fields = _children(response, signed[2], signed[3])
        certs = next((f for f in fields if f[0] == 0xA0), None)      # certificates [0] IMPLICIT SET OF
        if signed[0] != 0x30 or certs is None:
            return None
        items = [response[a:b] for _, a, _, b in _children(response, certs[2], certs[3])]
    except (NotDer, ValueError):
        return None
    width = max((len(i) for i in items), default=0)
    ordered = sorted(items, key=lambda i: i.ljust(width, b"\x00"))   # X.690 §11.6
    return response[:certs[2]] + b"".join(ordered) + response[certs[3]:]
