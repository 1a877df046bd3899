"""A timestamp authority that puts its chain in the token (`openssl ts -reply` with `certs`)
writes the certificates in the chain file's order, not DER's; rfc3161-client refused such a
token that `openssl ts -verify` accepts. It is now read with its certificates in DER order
(store/cms_order.py) and checked as any token is: a changed byte, other data, another root or
another nonce are still refused."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from amdflash.store import timestamp
from amdflash.store.cms_order import der_sorted
from tests.support.tsa import AuthorityServer, make_authority

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None and os.environ.get("CI") != "true",
                                reason="openssl is not installed")

DATA = "test.example/log\n5\nAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n\n\u2014 a line\n".encode()


def _chained(where: Path) -> AuthorityServer:
    make_authority(where)
    (where / "chain.pem").write_text((where / "tsa.crt").read_text() + (where / "ca.crt").read_text())
    config = (where / "ts.cnf").read_text()
    (where / "ts.cnf").write_text(config.replace("signer_digest", f"certs = {where}/chain.pem\nsigner_digest", 1))
    return AuthorityServer(where)          # its reply(), without the HTTP server


def test_a_token_with_its_chain_out_of_der_order_verifies_and_a_changed_one_does_not(tmp_path: Path) -> None:
    from rfc3161_client import decode_timestamp_response

    authority = _chained(tmp_path / "tsa")
    query, nonce = timestamp.request(DATA)
    token = authority.reply(query)
    with pytest.raises(Exception, match="InvalidSetOrdering"):     # what rfc3161-client says of it as sent
        decode_timestamp_response(token)
    roots = authority.roots
    when = timestamp.check(token, DATA, roots, nonce)
    assert when.year >= 2024
    reordered = der_sorted(token)
    assert reordered is not None and reordered != token and len(reordered) == len(token)
    assert len(decode_timestamp_response(reordered).signed_data.certificates) == 2     # the chain, both
    with pytest.raises(timestamp.TimestampError, match="does not verify"):
        timestamp.check(token, DATA + b" ", roots, nonce)
    with pytest.raises(timestamp.TimestampError):
        timestamp.check(token, DATA, roots, (nonce or 0) + 1)
    flipped = token[:-8] + bytes([token[-8] ^ 1]) + token[-7:]       # a byte of the signature
    with pytest.raises(timestamp.TimestampError):
        timestamp.check(flipped, DATA, roots, nonce)
    other = make_authority(tmp_path / "other")
    with pytest.raises(timestamp.TimestampError, match="does not verify"):
        timestamp.check(token, DATA, other / "ca.crt", nonce)
