"""The HTTP API's connections: uvicorn (h11) in a thread of the API process, with the limits a
public server needs and uvicorn leaves to its user.

Invariants:
- Connections are capped below the process's file-descriptor limit (`connection_cap`): at the
  cap a new connection first evicts the connection idle longest (no request in progress), else
  it is closed at once; so idle sockets can never starve /health, a generation, gRPC or the
  model processes of descriptors (issue 31 finding 3: 300 idle sockets under a 256 fd limit).
- A connection must deliver a request's headers within HEADER_TIMEOUT_S of opening or of its
  previous reply (a trickle of bytes does not extend it); between requests uvicorn's keep-alive
  timeout applies. The body's own deadline is the route's (plumbing.read_body).
- A client that half-closes its socket after sending (SHUT_WR) still gets its reply: EOF during
  a request keeps the connection open for writing. Whether the client is still there is probed
  with an interim `100 Continue` every PROBE_S until the reply starts (HTTP clients skip 1xx
  replies); a closed socket answers the probe with a reset, which is a disconnect (finding 6).
  Under TLS an EOF is a disconnect (TLS has no half-close).
"""
from __future__ import annotations

import asyncio
import resource
import socket
import ssl
import threading
import time

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_S = 15.0
KEEP_ALIVE_S = 5
PROBE_S = 1.0
FD_HEADROOM = 64  # descriptors kept for gRPC, the model processes' pipes, the content and job files
MAX_CONNECTIONS = 1024
MAX_HEADER_BYTES = 64 << 10


def connection_cap(limit: int = MAX_CONNECTIONS) -> int:
    """At most `limit` connections, and FD_HEADROOM descriptors below RLIMIT_NOFILE (raised to its
    hard limit first, as servers do: the default soft limit is often 1024)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return max(8, min(limit, soft - FD_HEADROOM)) if soft != resource.RLIM_INFINITY else limit


class Connection(H11Protocol):
    """uvicorn's h11 connection with the cap, the header deadline and half-close (see module)."""

    cap = MAX_CONNECTIONS

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self.last_active, self._eof, self._timer = time.monotonic(), False, None
        if len(self.connections) > self.cap and not self._evict_one():
            self.transport.close()  # every other connection is mid-request: refuse this one
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        self.last_active = time.monotonic()
        super().data_received(data)
        if self._in_request() and self._timer is not None:  # the headers are in
            self._timer.cancel()
            self._timer = None

    def on_response_complete(self) -> None:
        self.last_active = time.monotonic()
        super().on_response_complete()
        if self._eof:  # the client sends nothing more: close once its reply is out
            self.transport.close()
        elif not self.transport.is_closing():
            self._arm()

    def eof_received(self):
        if not self._in_request() or self.scheme == "https":
            return None  # nothing in flight (or TLS): close, as uvicorn does
        self._eof = True
        self.loop.call_later(PROBE_S, self._probe)
        return True  # half-closed: keep writing

    def connection_lost(self, exc) -> None:
        if self._timer is not None:
            self._timer.cancel()
        super().connection_lost(exc)

    # ---- helpers
    def _in_request(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_later(HEADER_TIMEOUT_S, self._headers_late)

    def _headers_late(self) -> None:
        self._timer = None
        if not self._in_request() and not self.transport.is_closing():
            self.transport.close()

    def _probe(self) -> None:
        if self.transport.is_closing() or not self._in_request() or self.cycle.response_started:
            return
        self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # a reset here ends the connection
        self.loop.call_later(PROBE_S, self._probe)

    def _evict_one(self) -> bool:
        idle = [c for c in self.connections if c is not self and not c._in_request()
                and not c.transport.is_closing()]
        if not idle:
            return False
        min(idle, key=lambda c: c.last_active).transport.close()
        return True


class UvicornThread:
    """One uvicorn server on its own event loop thread; `start` returns once it accepts."""

    def __init__(self, app, host: str, port: int, tls: tuple[str, str] | None) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((host, port))  # OSError: the caller names the flag
        except OSError:
            self.sock.close()
            raise
        self.port = self.sock.getsockname()[1]
        protocol = type("CappedConnection", (Connection,), {"cap": connection_cap()})
        config = uvicorn.Config(app, http=protocol, lifespan="off", log_level="warning",
                                access_log=False, server_header=False, timeout_keep_alive=KEEP_ALIVE_S,
                                h11_max_incomplete_event_size=MAX_HEADER_BYTES, backlog=512,
                                ssl_certfile=tls[0] if tls else None, ssl_keyfile=tls[1] if tls else None)
        try:
            config.load()
        except (ssl.SSLError, OSError):
            self.sock.close()
            raise
        if config.ssl is not None:
            config.ssl.minimum_version = ssl.TLSVersion.TLSv1_2
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name="http", daemon=True)

    def _run(self) -> None:
        asyncio.run(self.server.serve(sockets=[self.sock]))

    def start(self) -> int:
        self._thread.start()
        while not self.server.started and self._thread.is_alive():
            time.sleep(0.01)
        if not self.server.started:
            raise OSError("the HTTP server did not start (see the log)")
        return self.port

    def stop(self, timeout: float = 5.0) -> None:
        self.server.should_exit = True
        self._thread.join(timeout)
        self.sock.close()
