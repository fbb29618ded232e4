"""The HTTP front's connection limits on a real difflet-runtime (flux-tiny) started with a
256-descriptor limit (soft and hard, as `prlimit --nofile=256:256` would): issue 31 finding 3.

Oracle: the issue's attack and its observed failure. On the ThreadingHTTPServer front, 300 idle
TCP connections under a 256 fd limit made HTTP /health time out and gRPC answer
DEADLINE_EXCEEDED ("File descriptor limit reached"). Here the same 300 connections are opened
and held; /health, an HTTP generation and a gRPC generation must still answer, the server must
have closed at least the connections over its cap (the eviction), and a connection that never
sends its headers must be closed by the server (never held for good).
"""
from __future__ import annotations

import resource
import select
import socket
import time

import pytest

from difflet.runtime import client
from difflet.runtime.demo import stop_server
from http_util import call_json, start_http_server
from serving_util import WAIT_S

pytestmark = pytest.mark.slow  # starts a server

FD_LIMIT, IDLE = 256, 300


def _limit_fds() -> None:  # in the server's process, before it starts
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


@pytest.fixture(scope="module")
def server(flux_tiny_art):
    proc, grpc_address, http_address = start_http_server(flux_tiny_art, preexec_fn=_limit_fds)
    yield grpc_address, http_address
    assert stop_server(proc) == 0


def _closed_by_peer(sock: socket.socket, wait_s: float) -> bool:
    """True if the server closed `sock` within `wait_s` (EOF or reset); nothing is sent."""
    ready, _, _ = select.select([sock], [], [], wait_s)
    if not ready:
        return False
    try:
        return sock.recv(1) == b""
    except ConnectionError:
        return True


def _count_closed(socks: list[socket.socket], enough: int) -> int:
    """How many of `socks` the server closed, waiting (at most WAIT_S) until `enough` are."""
    open_, closed = set(socks), 0
    end = time.monotonic() + WAIT_S
    while closed < enough and time.monotonic() < end:
        ready, _, _ = select.select(list(open_), [], [], 1.0)
        for sock in ready:
            open_.discard(sock)
            closed += _closed_by_peer(sock, 0)
    return closed


def test_idle_connections_cannot_starve_health_or_generations(server):
    grpc_address, http_address = server
    host, port = http_address.rsplit(":", 1)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert soft > IDLE + 64, f"the test process itself needs {IDLE + 64} descriptors (has {soft})"
    idle = [socket.create_connection((host, int(port)), timeout=WAIT_S) for _ in range(IDLE)]
    try:
        assert call_json(http_address, "GET", "/health", timeout=30) == (200, {"status": "serving"})
        status, reply = call_json(http_address, "POST", "/v1/images/generations",
                                  {"prompt": "a red fox", "seed": 1, "num_inference_steps": 2})
        assert status == 200 and reply["data"][0]["b64_json"], reply
        assert client.generate(grpc_address, "a red fox", 1, steps=2, timeout=WAIT_S).png
        # at least the connections beyond the cap (256 less its headroom) were evicted
        assert _count_closed(idle, IDLE - (FD_LIMIT - 64)) >= IDLE - (FD_LIMIT - 64)
    finally:
        for sock in idle:
            sock.close()


def test_a_connection_that_never_sends_headers_is_closed(server):
    _, http_address = server
    host, port = http_address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=WAIT_S) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\n")  # a trickle that never ends the headers
        assert _closed_by_peer(sock, WAIT_S), "the server kept a header-less connection open"
