"""A timestamp authority of our own for the tests: `openssl ts -reply` behind a small HTTP server
on loopback, signing with a throwaway CA and TSA certificate made with openssl in a temporary
directory (the TSA's extendedKeyUsage critical timeStamping, as RFC 3161 requires)."""
from __future__ import annotations

import http.server
import subprocess
import tempfile
import threading
from pathlib import Path

OPENSSL = "openssl"

_CONFIG = """\
[ tsa ]
default_tsa = tsa_config
[ tsa_config ]
dir = {dir}
serial = $dir/serial
crypto_device = builtin
signer_cert = $dir/tsa.crt
signer_key = $dir/tsa.key
# no `certs`: only the signer's certificate goes in the token; the reviewer has the root (a chain
# in it, which openssl writes out of DER order, is read too: tests/compliance/test_token_chain_order.py)
signer_digest = sha256
default_policy = 1.3.6.1.4.1.4146.2.3
digests = sha256, sha384, sha512
accuracy = secs:1
ordering = yes
tsa_name = yes
ess_cert_id_chain = no
ess_cert_id_alg = sha256
"""


def _run(*args: str, cwd: Path) -> None:
    subprocess.run([OPENSSL, *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def make_authority(where: Path) -> Path:
    """A CA (ca.crt) and a TSA certificate it issued (tsa.crt, tsa.key), with ts.cnf, in `where`."""
    where.mkdir(parents=True, exist_ok=True)
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")
    _run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-subj", "/CN=amdflash test root CA",
         "-days", "3", "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=where)
    _run("req", *ec, "-keyout", "tsa.key", "-out", "tsa.csr", "-subj", "/CN=amdflash test TSA", cwd=where)
    (where / "tsa.ext").write_text("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                                   "extendedKeyUsage=critical,timeStamping\n")
    _run("x509", "-req", "-in", "tsa.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
         "-out", "tsa.crt", "-days", "3", "-extfile", "tsa.ext", cwd=where)
    (where / "serial").write_text("01\n")
    (where / "ts.cnf").write_text(_CONFIG.format(dir=where))
    return where


class AuthorityServer:
    """`openssl ts -reply` for each POSTed TimeStampReq; `roots` is the CA a client trusts."""

    def __init__(self, where: Path) -> None:
        self.dir = where
        self.roots = where / "ca.crt"
        self.requests = 0
        self._lock = threading.Lock()
        self._server: http.server.ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/tsa"

    def reply(self, query: bytes) -> bytes:
        with self._lock, tempfile.TemporaryDirectory() as tmp:   # the serial file is shared
            self.requests += 1
            (Path(tmp) / "q.tsq").write_bytes(query)
            _run("ts", "-reply", "-config", str(self.dir / "ts.cnf"), "-queryfile", str(Path(tmp) / "q.tsq"),
                 "-out", str(Path(tmp) / "r.tsr"), cwd=self.dir)
            return (Path(tmp) / "r.tsr").read_bytes()

    def start(self) -> AuthorityServer:
        authority = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                query = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    status, answer = 200, authority.reply(query)
                except subprocess.CalledProcessError:
                    status, answer = 400, b"bad request\n"
                self.send_response(status)
                self.send_header("Content-Type", "application/timestamp-reply")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
