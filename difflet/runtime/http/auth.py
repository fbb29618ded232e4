"""The API key on gRPC: a server interceptor that refuses a call without
`authorization: Bearer KEY` metadata with UNAUTHENTICATED before its request is deserialized.

Invariant: grpc.health.v1 stays open (load-balancer probes carry no key); every other
service, reflection included, needs the key. The comparison is constant-time.
"""
from __future__ import annotations

import hmac

import grpc

OPEN_PREFIX = "/grpc.health.v1.Health/"


def _deny(request, context):
    context.abort(grpc.StatusCode.UNAUTHENTICATED,
                  "a valid API key is required (metadata authorization: Bearer KEY)")


class ApiKeyInterceptor(grpc.ServerInterceptor):
    def __init__(self, key: str, on_reject=lambda: None) -> None:
        self._want = f"Bearer {key}".encode()
        self._on_reject = on_reject

    def intercept_service(self, continuation, details):
        if details.method.startswith(OPEN_PREFIX):
            return continuation(details)
        got = dict(details.invocation_metadata or ()).get("authorization", "")
        if hmac.compare_digest(got.encode(), self._want):
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
