"""The API process's parts, assembled: `DiffletServer` (startup checks, admission, dispatcher +
replicas, gRPC with health and reflection, metrics, the optional HTTP API). Torch-free; the
`difflet-runtime` command (server.py) builds one and drives its lifecycle.

Invariants: see server.py (startup order, health, shutdown); `start()` binds with health
NOT_SERVING, `load()` returns once every model process passed its warm-up (health SERVING).
"""
from __future__ import annotations

import os
import sys
import threading
from concurrent import futures

import click
import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from difflet.errors import DiffletError
from difflet.runtime import difflet_pb2 as pb
from difflet.runtime import difflet_pb2_grpc as pb_grpc
from difflet.runtime.service import SERVICE_NAME, DiffletServicer


def core_sets(replicas: int) -> list[list[int]]:
    """Disjoint CPU sets, one per replica (the cores this process may use, split evenly); []
    when there are fewer cores than replicas (then nothing is pinned)."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    per = len(cores) // replicas
    return [cores[i * per:(i + 1) * per] for i in range(replicas)] if per else []


class DiffletServer:
    """The API process's parts: checks, admission, dispatcher + replicas, gRPC, health, metrics."""

    def __init__(self, art: str, host: str = "127.0.0.1", port: int = 0, *, queue_size: int = 16,
                 request_timeout: float | None = None, grace: float = 10.0, cache: str = "off",
                 replicas: int = 0, expect: dict | None = None, verify: bool = True,
                 threads: int = 0, prompt_policy: str = "truncate", api_keys: tuple[str, ...] = (),
                 tls: tuple[str, str] | None = None, max_batch: int | None = None,
                 lossless_video: bool = False, loras: tuple[tuple[str, str, float], ...] = (),
                 calibrations: dict[str, str] | None = None, image_bounds: tuple[int, int] = (0, 0)) -> None:
        """`loras`: (name, path, scale) of the LoRA adapters each model process loads;
        `calibrations`: the calibration files requests may name (NAME -> file); `image_bounds`:
        (bytes, pixels) of one input image, 0 = the default sized for the served sizes."""
        from difflet.runtime.admission import Admission
        from difflet.runtime.dispatcher import Dispatcher
        from difflet.runtime.metrics import Metrics
        from difflet.runtime import model_process, procs
        from difflet.runtime.startup import check_artifacts
        from difflet.runtime.validate import check_cache_mode

        self.host, self.port = host, port
        self.cache = check_cache_mode(cache, field="--cache")  # the operator's: a name or a file
        self.grace, self.request_timeout, self.queue_size = grace, request_timeout, queue_size
        expect = dict(expect or {})
        self.info = check_artifacts(art, expect)
        # the model processes' imports start now, in the forkserver, beside our own startup
        procs.prestart(model_process.preload_modules(str(self.info.module.attrs.get("family", ""))))
        self.admission = Admission(self.info, prompt_policy=prompt_policy,
                                   adapters={name: scale for name, _, scale in loras},
                                   calibrations=calibrations, image_bounds=image_bounds)
        self.metrics = Metrics()
        self.health = health.HealthServicer()
        # a dp-planned artifact (dp2xtp2) is served as dp replicas unless --replicas says otherwise
        replicas = replicas or int(self.info.manifest.parallel.get("dp", 1))
        self.replicas = replicas
        threads = threads or max(1, (os.cpu_count() or 1) // replicas)
        # batching: requests of one size run together in a model process (default: the largest
        # compiled batch size, so an artifact lowered with --batch-sizes batches as compiled)
        self.max_batch = max_batch or max(self.info.manifest.batch_sizes)
        config = {"root": str(art), "cache": self.cache, "threads": threads, "verify": verify,
                  "max_batch": self.max_batch, "cores": core_sets(replicas), "lossless_video": lossless_video,
                  "replicas": replicas,  # replicas: each model process's NeuronCores (neuron_placement)
                  "loras": [list(spec) for spec in loras], "calibrations": dict(calibrations or {})}
        self.dispatcher = Dispatcher(config, replicas=replicas, queue_size=queue_size, grace=grace,
                                     precheck=lambda: check_artifacts(art, expect),
                                     metrics=self.metrics, on_health=self._on_health,
                                     log=_log)
        self.metrics.watch(self.dispatcher)
        from difflet.runtime.http.auth import ApiKeyInterceptor, Keys

        self.keys = Keys(api_keys)  # each key's holders own what they make (http/auth.py)
        self.servicer = DiffletServicer(self.info, self.admission, self.dispatcher, self.metrics,
                                        request_timeout=request_timeout, cache=self.cache,
                                        serving_state=self.serving_state, keys=self.keys)
        # every accepted request holds a handler thread while it waits; beyond that, gRPC
        # itself refuses with RESOURCE_EXHAUSTED rather than parking calls unseen
        workers = queue_size + replicas * self.max_batch + 32
        # ---- HTTP API, API key, TLS (issue 14)
        self.tls, self.http = tls, None
        self.serving_now = False
        interceptors = []
        if self.keys:
            interceptors.append(ApiKeyInterceptor(
                self.keys, on_reject=lambda: self.metrics.rejected("unauthenticated")))
        # ---- end HTTP API block
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers),
                                   maximum_concurrent_rpcs=workers, interceptors=interceptors,
                                   options=[("grpc.max_receive_message_length", self.admission.max_message)])
        self._stopped = threading.Event()
        self._loading = False  # load() started the replicas' threads: only then can they be stopped

    def start(self) -> int:
        """Bind and start answering (health NOT_SERVING); returns the bound port."""
        pb_grpc.add_DiffletServicer_to_server(self.servicer, self._server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), self._server)
        try:
            if self.tls:  # issue 14: TLS on the gRPC port
                cert, key = (open(path, "rb").read() for path in self.tls)
                bound = self._server.add_secure_port(f"{self.host}:{self.port}",
                                                     grpc.ssl_server_credentials([(key, cert)]))
            else:
                bound = self._server.add_insecure_port(f"{self.host}:{self.port}")
        except RuntimeError as err:
            raise DiffletError(f"cannot listen on {self.host}:{self.port}: {err}", where="--port") from None
        if bound == 0:
            raise DiffletError(f"cannot listen on {self.host}:{self.port}", where="--port")
        self.port = bound
        self._on_health(False)
        self._server.start()
        return bound

    def start_http(self, port: int, retention_s: float = 3600.0, max_mb: int = 1024,
                   state_dir: str | None = None) -> int:
        """Serve the OpenAI-compatible HTTP API on `port` (0 picks one); returns the bound port.
        `state_dir`: where video jobs and kept files survive a restart (locked: one process per
        dir; DiffletError if another holds it); None = a temporary directory, nothing survives."""
        from difflet.runtime.http.app import HttpApi

        self.http = HttpApi(self.info, self.admission, self.dispatcher, self.metrics,
                            request_timeout=self.request_timeout, serving=lambda: self.serving_now,
                            keys=self.keys, tls=self.tls, content_retention_s=retention_s,
                            content_max_bytes=max_mb << 20, state_dir=state_dir)
        try:
            return self.http.start(self.host, port)
        except OSError as err:
            raise DiffletError(f"cannot listen on {self.host}:{port}: {err.strerror}",
                               where="--http-port") from None

    def load(self) -> None:
        """Start the model processes; returns once all passed their warm-up (health SERVING)."""
        self._loading = True
        failures = self.dispatcher.start()
        if failures:
            raise DiffletError("; ".join(failures), where=self.info.root)

    def stop(self, grace: float = 5.0) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.health.enter_graceful_shutdown()
        if self._loading:  # a startup failure before load() (e.g. --http-port, --state-dir) has none
            self.dispatcher.close(drain_s=grace)
        self._server.stop(grace).wait()
        if self.http is not None:
            self.http.stop()

    def _on_health(self, serving: bool) -> None:
        self.serving_now = serving  # HTTP /health reads it
        status = health_pb2.HealthCheckResponse.SERVING if serving else \
            health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", SERVICE_NAME):
            self.health.set(name, status)

    def serving_state(self) -> pb.ServingState:
        d = self.dispatcher
        return pb.ServingState(
            processes=[pb.ModelProcess(replica=r.index, pid=r.pid, state=r.state, served=r.served,
                                       compiles=r.compiles, generation=max(0, r.generation),
                                       error=r.error) for r in d.replicas],
            queue_size=self.queue_size, queue_depth=d.queue_depth(), recoveries=d.recoveries,
            request_timeout_s=self.request_timeout or 0.0, grace_s=self.grace)


def _log(line: str) -> None:
    """One stdout line (model processes ready, with their import/load/warm-up seconds)."""
    click.echo(line)
    sys.stdout.flush()
