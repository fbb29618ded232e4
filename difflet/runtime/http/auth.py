"""API keys: `Keys` (the server's --api-key values and the owner each one stands for) and the
gRPC interceptor that refuses a call without `authorization: Bearer KEY` metadata with
UNAUTHENTICATED before its request is deserialized.

Invariants:
- grpc.health.v1 stays open (load-balancer probes carry no key); every other service,
  reflection included, needs a key. A presented key is compared with every key in constant
  time (no early exit), so timing tells neither which key nor how much of one matched.
- A key's owner tag ("k" + 16 hex digits of its SHA-256) scopes what its holders made (HTTP
  video jobs and image files, gRPC request ids): another key's holder cannot see, read or cancel
  it. Without keys every client is the one owner "". The tag survives a restart (the store
  records it) as long as the key does.
"""
from __future__ import annotations

import hashlib
import hmac

import grpc


def owner_tag(key: str) -> str:
    return "k" + hashlib.sha256(key.encode()).hexdigest()[:16]


class Keys:
    """The server's API keys; falsy when there are none (then nothing is checked)."""

    def __init__(self, keys) -> None:
        self._keys = [(f"Bearer {k}".encode(), owner_tag(k)) for k in keys if k]

    def __bool__(self) -> bool:
        return bool(self._keys)

    def owner(self, authorization: bytes) -> str | None:
        """The owner tag of the key in an `authorization` value ("Bearer KEY"), None if it is
        none of ours; "" when the server has no keys."""
        if not self._keys:
            return ""
        found = None
        for want, tag in self._keys:
            if hmac.compare_digest(authorization, want):
                found = tag
        return found

    def owner_of_call(self, context) -> str:
        """The owner of a gRPC call the interceptor let in."""
        got = dict(context.invocation_metadata() or ()).get("authorization", "")
        return self.owner(got.encode()) or ""

OPEN_PREFIX = "/grpc.health.v1.Health/"


def _deny(request, context):
    context.abort(grpc.StatusCode.UNAUTHENTICATED,
                  "a valid API key is required (metadata authorization: Bearer KEY)")


class ApiKeyInterceptor(grpc.ServerInterceptor):
    def __init__(self, keys: Keys, on_reject=lambda: None) -> None:
        self._keys = keys
        self._on_reject = on_reject

    def intercept_service(self, continuation, details):
        if details.method.startswith(OPEN_PREFIX):
            return continuation(details)
        got = dict(details.invocation_metadata or ()).get("authorization", "")
        if self._keys.owner(got.encode()) is not None:
            return continuation(details)
        self._on_reject()
        handler = continuation(details)
        if handler is None:
            return None
        # same streaming shape as the real method; no deserializer, so the body is never parsed
        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(_deny)
        if handler.request_streaming:
            return grpc.stream_unary_rpc_method_handler(_deny)
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(_deny)
        return grpc.unary_unary_rpc_method_handler(_deny)
