"""A small gRPC client for `difflet.v1.Difflet`: generate, get the profile, wait for SERVING.

Invariants:
- Request fields are request.Request's (the proto's names); one given as None is left unset, so
  the server applies its default (height/width 0 mean the same).
- `wait_serving` waits on the server's own health stream (no polling sleeps).
- `generate_stream` yields the server's events (queued, progress, result) as they come.
- `truncation_notice(reply)` is one line naming each encoder that cut the prompt, or None.
- `api_key` is sent on every call as `authorization: Bearer KEY` metadata; `tls_ca` (a PEM
  file) makes the channel TLS, verifying the server against that CA.
"""
from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from difflet.runtime import difflet_pb2 as pb
from difflet.runtime import difflet_pb2_grpc as pb_grpc
from difflet.runtime.request import from_arguments, with_arguments
from difflet.runtime.service import SERVICE_NAME

MAX_MESSAGE = 256 * 1024 * 1024  # replies carry PNG/MP4 bytes; real profiles exceed gRPC's 4 MiB default


class _BearerKey(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                 grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds `authorization: Bearer KEY` to every call (works on insecure channels too, unlike
    call credentials)."""

    def __init__(self, key: str) -> None:
        self._pair = ("authorization", f"Bearer {key}")

    def _with_key(self, details):
        metadata = list(details.metadata or []) + [self._pair]
        return details._replace(metadata=metadata) if hasattr(details, "_replace") else \
            _Details(details.method, details.timeout, metadata, details.credentials,
                     details.wait_for_ready, details.compression)

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._with_key(details), request)

    intercept_unary_stream = intercept_unary_unary

    def intercept_stream_unary(self, continuation, details, request_iterator):
        return continuation(self._with_key(details), request_iterator)

    intercept_stream_stream = intercept_stream_unary


class _Details(grpc.ClientCallDetails):
    def __init__(self, method, timeout, metadata, credentials, wait_for_ready, compression):
        self.method, self.timeout, self.metadata = method, timeout, metadata
        self.credentials, self.wait_for_ready, self.compression = credentials, wait_for_ready, compression


def channel(server: str, api_key: str | None = None, tls_ca: str | None = None) -> grpc.Channel:
    options = [("grpc.max_receive_message_length", MAX_MESSAGE)]
    if tls_ca:
        with open(tls_ca, "rb") as f:
            ch = grpc.secure_channel(server, grpc.ssl_channel_credentials(root_certificates=f.read()),
                                     options=options)
    else:
        ch = grpc.insecure_channel(server, options=options)
    return grpc.intercept_channel(ch, _BearerKey(api_key)) if api_key else ch


def make_request(prompt: str, seed: int = 0, **fields) -> pb.GenerateRequest:
    """A GenerateRequest of request fields (request.Request's names; None = leave it unset);
    `image` is one image file's bytes or a list of them, `mask_image` a file's bytes."""
    if isinstance(fields.get("image"), (bytes, bytearray)):
        fields["image"] = [fields["image"]]
    return pb.GenerateRequest(prompt=prompt, seed=seed, **{k: v for k, v in fields.items() if v is not None})


def generate(server: str, prompt: str, seed: int = 0, *, timeout: float | None = None,
             api_key: str | None = None, tls_ca: str | None = None, **fields) -> pb.GenerateReply:
    """One Generate call; raises grpc.RpcError on failure (code() / details() say why)."""
    with channel(server, api_key, tls_ca) as ch:
        return pb_grpc.DiffletStub(ch).Generate(make_request(prompt, seed, **fields), timeout=timeout)


def generate_stream(server: str, prompt: str, seed: int = 0, *, timeout: float | None = None,
                    api_key: str | None = None, tls_ca: str | None = None, **fields):
    """GenerateStream: yields GenerateEvent messages (queued, progress..., result); raises
    grpc.RpcError when the call fails."""
    with channel(server, api_key, tls_ca) as ch:
        yield from pb_grpc.DiffletStub(ch).GenerateStream(make_request(prompt, seed, **fields),
                                                          timeout=timeout)


def truncation_notice(reply: pb.GenerateReply) -> str | None:
    """"note: prompt truncated: text_encoder kept 16 of 41 tokens (25 dropped); ..." or None."""
    if not reply.truncated:
        return None
    parts = [f"{c.field}: {c.encoder} kept {c.kept} of {c.tokens} tokens ({c.dropped} dropped)"
             for c in reply.truncated]
    return "note: truncated as the reference pipeline does: " + "; ".join(parts)


def cancel(server: str, request_id: str, timeout: float = 10.0, *, api_key: str | None = None,
           tls_ca: str | None = None) -> pb.CancelReply:
    with channel(server, api_key, tls_ca) as ch:
        return pb_grpc.DiffletStub(ch).Cancel(pb.CancelRequest(request_id=request_id), timeout=timeout)


def get_profile(server: str, timeout: float | None = None, *, api_key: str | None = None,
                tls_ca: str | None = None) -> pb.Profile:
    with channel(server, api_key, tls_ca) as ch:
        return pb_grpc.DiffletStub(ch).GetProfile(pb.GetProfileRequest(), timeout=timeout)


def health_status(server: str, timeout: float = 5.0) -> str:
    """The current health status name of the Difflet service (SERVING, NOT_SERVING, ...)."""
    with channel(server) as ch:
        reply = health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=timeout)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def wait_serving(server: str, timeout: float) -> None:
    """Block until the Difflet service reports SERVING.

    Raises grpc.FutureTimeoutError / grpc.RpcError (DEADLINE_EXCEEDED) when `timeout` passes,
    RuntimeError when the server ends the stream (shut down) before SERVING.
    """
    with channel(server) as ch:
        grpc.channel_ready_future(ch).result(timeout=timeout)
        stream = health_pb2_grpc.HealthStub(ch).Watch(
            health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=timeout)
        for reply in stream:
            if reply.status == health_pb2.HealthCheckResponse.SERVING:
                stream.cancel()
                return
    raise RuntimeError(f"{server} closed its health stream before reporting SERVING")


class Client:
    """`difflet.Client("host:port").generate(prompt, ...)`: a served model, named as diffusers
    names its call arguments. `generate` returns the GenerateReply (`png` or `mp4` bytes, seed,
    steps, timings, truncation); `image(reply)` decodes a PNG reply to a PIL image."""

    def __init__(self, server: str, *, api_key: str | None = None, tls_ca: str | None = None,
                 timeout: float | None = None) -> None:
        self.server, self.timeout = server, timeout
        self._auth = {"api_key": api_key, "tls_ca": tls_ca}

    @with_arguments
    def generate(self, prompt: str, negative_prompt: str | None = None, *, image=None, mask_image=None,
                 **arguments) -> pb.GenerateReply:
        """One Generate call; `image` (an image file's bytes, or a list of them) and `mask_image`
        (bytes) for an image-input model; `arguments` are the request's other fields, by their
        Python API names (seed, num_inference_steps, guidance_scale, strength, height, width,
        num_frames, cache, ...)."""
        fields = from_arguments(arguments, "generate")
        return generate(self.server, prompt, timeout=self.timeout, negative_prompt=negative_prompt,
                        image=image, mask_image=mask_image, **fields, **self._auth)

    def profile(self) -> pb.Profile:
        return get_profile(self.server, self.timeout, **self._auth)

    def cancel(self, request_id: str) -> pb.CancelReply:
        return cancel(self.server, request_id, **self._auth)

    @staticmethod
    def image(reply: pb.GenerateReply):
        import io

        from PIL import Image

        return Image.open(io.BytesIO(reply.png)).convert("RGB")
