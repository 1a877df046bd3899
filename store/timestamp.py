"""Trusted time: RFC 3161 tokens over cosigned tree heads (store/witness.py).

A cosignature's time is the witness's word; a token from a timestamp authority is a third
party's, checkable by anyone with `openssl ts -verify`. What is dated is the cosigned tree
head exactly as it stood when it reached its quorum, kept as its own file so that
cosignatures added later never change the bytes the token covers:

    <anchor>.witnessed/checkpoint.<size>.timestamped       the bytes dated (0600)
    <anchor>.witnessed/checkpoint.<size>.tsa<i>.tsr        authority i's TimeStampResp, DER (0600)

A reviewer checks one with
`openssl ts -verify -data checkpoint.<size>.timestamped -in checkpoint.<size>.tsa0.tsr -CAfile ROOTS.pem`.
A token is kept only after it verifies here: its nonce, its imprint of those bytes, and its
signer's chain to the authority's configured roots.
"""
from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from amdflash.stages.files import PRIVATE, private_dir, write_new
from amdflash.store import witness as ws
from amdflash.store.files import NotAFile, read_regular

MAX_TOKEN = 64 * 1024
MAX_ROOTS = 1 << 20


class TimestampError(ValueError):
    """A token that cannot be taken; the text says why."""


def _base(db: str, size: int) -> Path:
    return ws.witnessed_dir(db) / f"checkpoint.{size}"


def subject(db: str, size: int) -> bytes | None:
    """The bytes a token dates for the tree head of `size`: fixed at the first call, from the
    cosigned head kept then. None when no head of that size is kept."""
    path = Path(str(_base(db, size)) + ".timestamped")
    try:
        return read_regular(path, ws.MAX_NOTE)
    except (OSError, NotAFile):
        pass
    kept = ws.stored(db, size)
    if kept is None:
        return None
    data = kept.text.encode()
    private_dir(ws.witnessed_dir(db))
    write_new(path, data, mode=PRIVATE)
    return data


def request(data: bytes) -> tuple[bytes, int | None]:
    """A TimeStampReq (DER) over SHA-256 of `data`, asking for the signer's certificate, and its nonce."""
    from rfc3161_client import HashAlgorithm, TimestampRequestBuilder

    req = TimestampRequestBuilder().data(data).hash_algorithm(HashAlgorithm.SHA256).nonce(nonce=True) \
        .cert_request(cert_request=True).build()
    return req.as_bytes(), req.nonce


def check(answer: bytes, data: bytes, roots: Path, nonce: int | None = None) -> datetime:
    """The time a TimeStampResp (DER) vouches for `data`, once it verifies: granted, its imprint
    of `data`, `nonce` (when given), and a chain to a certificate in `roots`."""
    from cryptography import x509

    try:
        pem = read_regular(roots, MAX_ROOTS)
        certs = x509.load_pem_x509_certificates(pem)
    except (OSError, NotAFile, ValueError) as e:
        raise TimestampError(f"cannot read the authority's roots {roots}: {e}") from None
    return verify(answer, data, certs, nonce)


def verify(answer: bytes, data: bytes, certs: list[Any], nonce: int | None = None) -> datetime:
    """check(), against root certificates already loaded (a reviewer's policy, offline)."""
    from rfc3161_client import VerificationError, VerifierBuilder, decode_timestamp_response

    try:
        response = decode_timestamp_response(answer)
    except Exception as e:
        # openssl writes a chain's certificates out of DER order: the same token, reordered
        # (store/cms_order.py says why that checks no less), or the refusal stands.
        from amdflash.store.cms_order import der_sorted

        fixed = der_sorted(answer) if "InvalidSetOrdering" in str(e) else None
        try:
            if fixed is None:
                raise
            response = decode_timestamp_response(fixed)
        except Exception:
            raise TimestampError(f"not a timestamp response ({e})") from None
    if response.status not in (0, 1):       # granted, granted with modifications
        raise TimestampError(f"the authority did not grant a token (status {response.status})")
    builder = VerifierBuilder(nonce=nonce) if nonce is not None else VerifierBuilder()
    for cert in certs:
        builder = builder.add_root_certificate(cert)
    try:
        builder.build().verify_message(response, data)
    except (VerificationError, ValueError) as e:
        raise TimestampError(f"the token does not verify: {e}") from None
    return response.tst_info.gen_time


def keep(db: str, size: int, index: int, answer: bytes, data: bytes, roots: Path, nonce: int | None) -> Path:
    """Check authority `index`'s answer for the head of `size` and keep it; the file's path."""
    check(answer, data, roots, nonce)
    private_dir(ws.witnessed_dir(db))
    return write_new(Path(f"{_base(db, size)}.tsa{index}.tsr"), answer, mode=PRIVATE)


def tokens(db: str, size: int) -> list[Path]:
    """The tokens kept for the head of `size`."""
    base = _base(db, size)
    return sorted(p for p in base.parent.glob(base.name + ".tsa*.tsr") if p.is_file())
