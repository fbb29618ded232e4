"""Helpers for the HTTP API tests: a real difflet-runtime with --http-port, raw HTTP calls, SSE
streams, and a throwaway CA + server certificate (cryptography) for TLS. No sleeps."""
from __future__ import annotations

import datetime
import http.client
import json
import os
import ssl
import tempfile
from pathlib import Path

from difflet.runtime.demo import launch_server, read_line

WAIT_S = 300.0


def start_http_server(art: Path, *args: str, env: dict | None = None, preexec_fn=None):
    """(process, grpc "host:port", http "host:port") once SERVING; a fresh --state-dir (under
    conftest's per-worker $XDG_STATE_HOME) unless `args` name one: one server per state dir."""
    if "--state-dir" not in args:
        args = (*args, "--state-dir", tempfile.mkdtemp(prefix="state-", dir=os.environ.get("XDG_STATE_HOME")))
    proc = launch_server(art, ("--http-port", "0", *args), env, preexec_fn)
    http_address = read_line(proc, "http on ")
    return proc, read_line(proc, "listening on "), http_address


def call(address: str, method: str, path: str, body=None, headers: dict | None = None,
         context: ssl.SSLContext | None = None, timeout: float = WAIT_S):
    """(status, headers, body bytes) of one request; a dict body is sent as JSON."""
    host, port = address.rsplit(":", 1)
    conn = (http.client.HTTPSConnection(host, int(port), context=context, timeout=timeout) if context
            else http.client.HTTPConnection(host, int(port), timeout=timeout))
    data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
    try:
        conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, resp.headers, resp.read()  # header names are case-insensitive
    finally:
        conn.close()


def call_json(address: str, method: str, path: str, body=None, **kw):
    status, _, data = call(address, method, path, body, **kw)
    return status, json.loads(data)


def sse(address: str, method: str, path: str, body=None, headers: dict | None = None,
        timeout: float = WAIT_S):
    """Yields each `data:` JSON object of a text/event-stream reply as it arrives."""
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request(method, path, body=None if body is None else json.dumps(body).encode(),
                     headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        assert resp.status == 200, (resp.status, resp.read())
        for line in resp:
            if line.startswith(b"data: "):
                yield json.loads(line[6:])
    finally:
        conn.close()


def make_tls(directory: Path) -> tuple[Path, Path, Path]:
    """A fresh CA and a certificate for 127.0.0.1/localhost signed by it: (ca, cert, key) PEMs."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    import ipaddress

    now = datetime.datetime.now(datetime.timezone.utc)
    span = (now - datetime.timedelta(days=1), now + datetime.timedelta(days=7))

    def name(cn):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("difflet test CA")).issuer_name(name("difflet test CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(span[0]).not_valid_after(span[1])
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    cert = (x509.CertificateBuilder().subject_name(name("localhost")).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(span[0]).not_valid_after(span[1])
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = directory / "ca.pem", directory / "cert.pem", directory / "key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


def loads_torch(pid: int) -> bool:
    """True if process `pid` has torch's shared library mapped (it imported torch)."""
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
