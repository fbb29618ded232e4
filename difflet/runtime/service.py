"""The gRPC face of a model runner: `difflet.v1.Difflet`, standard health checking, reflection.

Invariants:
- The servicer only translates: proto request -> `ModelRunner.resolve` -> `generate` -> proto
  reply. Validation errors become INVALID_ARGUMENT with the field-named message as details;
  anything else that fails inside generation is INTERNAL; a call before warm-up is UNAVAILABLE.
- Health reports NOT_SERVING until the runner's warm-up generation passed, SERVING after, and
  NOT_SERVING again once shutdown begins.
"""
from __future__ import annotations

import sys
import threading
from concurrent import futures
from typing import Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from difflet.errors import DiffletError
from difflet.runtime import difflet_pb2 as pb
from difflet.runtime import difflet_pb2_grpc as pb_grpc

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Difflet"].full_name  # "difflet.v1.Difflet"
_PROFILE_FIELDS = ("height", "width", "steps", "guidance", "max_text", "dtype")


class DiffletServicer(pb_grpc.DiffletServicer):
    """Requests -> the runner (which serialises them); `runner` is None until warm-up passed."""

    def __init__(self) -> None:
        self.runner = None

    def _ready_runner(self, context: grpc.ServicerContext):
        if self.runner is None:
            context.abort(grpc.StatusCode.UNAVAILABLE, "the model is still loading")
        return self.runner

    def Generate(self, request: pb.GenerateRequest, context: grpc.ServicerContext) -> pb.GenerateReply:
        runner = self._ready_runner(context)
        try:
            params = runner.resolve(
                prompt=request.prompt, seed=request.seed,
                steps=request.steps if request.HasField("steps") else None,
                guidance=request.guidance if request.HasField("guidance") else None,
                height=request.height, width=request.width, request_id=request.request_id)
        except DiffletError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, err.message)
        try:
            result = runner.generate(params)
        except Exception as err:  # a failed generation must not kill the server
            print(f"request {params.request_id}: generation failed: {err!r}", file=sys.stderr, flush=True)
            context.abort(grpc.StatusCode.INTERNAL, f"generation failed: {err}")
        t = result.timings
        return pb.GenerateReply(
            png=result.png, seed=params.seed, steps=params.steps, guidance=params.guidance,
            height=params.height, width=params.width, request_id=params.request_id,
            timings=pb.Timings(encode_ms=t["encode"], denoise_ms=t["denoise"],
                               decode_ms=t["decode"], total_ms=t["total"]))

    def GetProfile(self, request: pb.GetProfileRequest, context: grpc.ServicerContext) -> pb.Profile:
        runner = self._ready_runner(context)
        module, profile = runner.module, runner.profile
        parallel = module.attrs.get("parallel")
        return pb.Profile(
            model=module.name, family=str(module.attrs.get("family", "")),
            height=int(profile["height"]), width=int(profile["width"]), steps=int(profile["steps"]),
            guidance=float(profile["guidance"]), max_text=int(profile.get("max_text", 0)),
            dtype=str(profile.get("dtype", "")),
            parallel=str(parallel.to_python() if hasattr(parallel, "to_python") else parallel or ""),
            target=str(module.attrs.get("target", "")),
            components=[c.name for c in module.components()],
            attrs={k: str(v) for k, v in profile.items() if k not in _PROFILE_FIELDS})


class DiffletServer:
    """A gRPC server around a runner that is loaded (and warmed up) after the port is bound."""

    def __init__(self, load_runner: Callable[[], object], host: str = "127.0.0.1", port: int = 0,
                 workers: int = 4) -> None:
        self.host, self.port = host, port
        self._load_runner = load_runner
        self.servicer = DiffletServicer()
        self.health = health.HealthServicer()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
        self._stopped = threading.Event()

    def start(self) -> int:
        """Bind and start answering (health NOT_SERVING); returns the bound port."""
        pb_grpc.add_DiffletServicer_to_server(self.servicer, self._server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), self._server)
        try:
            bound = self._server.add_insecure_port(f"{self.host}:{self.port}")
        except RuntimeError as err:
            raise DiffletError(f"cannot listen on {self.host}:{self.port}: {err}", where="--port") from None
        if bound == 0:
            raise DiffletError(f"cannot listen on {self.host}:{self.port}", where="--port")
        self.port = bound
        self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        self._server.start()
        return bound

    def load(self) -> None:
        """Load the runner, run its checked warm-up generation, then report SERVING."""
        runner = self._load_runner()
        runner.warm_up()
        self.servicer.runner = runner
        self._set_health(health_pb2.HealthCheckResponse.SERVING)

    def stop(self, grace: float = 5.0) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.health.enter_graceful_shutdown()
        self._server.stop(grace).wait()

    def _set_health(self, status) -> None:
        for name in ("", SERVICE_NAME):
            self.health.set(name, status)
