"""Prometheus metrics of one API process (prometheus-client, a private registry).

Invariants: every counter only increases; `answered(job)` is called exactly once per accepted
request (when it is answered), `rejected(reason)` once per request refused at admission, so
accepted + rejected = requests received. Gauges are read live from the dispatcher.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)


class Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.latency = Histogram("difflet_request_latency_seconds",
                                 "admission -> answer, by outcome", ["outcome"],
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.requests = Counter("difflet_requests", "accepted requests answered, by outcome",
                                ["outcome"], registry=r)
        self.rejects = Counter("difflet_rejects", "requests refused before queueing, by reason "
                               "(invalid_argument, queue_full, unavailable, duplicate_id)",
                               ["reason"], registry=r)
        self.denoiser_calls = Counter("difflet_denoiser_calls", "denoiser program calls", registry=r)
        self.cached_steps = Counter("difflet_cached_steps", "steps answered from the step cache",
                                    registry=r)
        self.batched = Counter("difflet_batched_requests", "completed requests whose denoiser "
                               "calls were shared with others, by the most rows one call carried",
                               ["rows"], registry=r)
        self.steps = Counter("difflet_steps", "denoising steps of completed requests", registry=r)
        self.recoveries = Counter("difflet_model_recoveries", "model process replacements, by "
                                  "reason (crash, timeout, supervisor)", ["reason"], registry=r)
        self.queue_depth = Gauge("difflet_queue_depth", "requests waiting for a model process",
                                 registry=r)
        self.in_flight = Gauge("difflet_requests_in_flight", "requests inside model processes",
                               registry=r)
        self.ready = Gauge("difflet_model_processes_ready", "model processes ready or busy",
                           registry=r)
        for reason in ("invalid_argument", "queue_full", "unavailable", "duplicate_id"):
            self.rejects.labels(reason)
        for reason in ("crash", "timeout"):
            self.recoveries.labels(reason)

    def watch(self, dispatcher) -> None:
        self.queue_depth.set_function(dispatcher.queue_depth)
        self.in_flight.set_function(dispatcher.in_flight)
        self.ready.set_function(
            lambda: sum(r.state in ("ready", "busy") for r in dispatcher.replicas))

    def answered(self, job) -> None:
        self.requests.labels(job.code).inc()
        self.latency.labels(job.code).observe(job.latency_s())
        if job.code == "ok" and job.result:
            self.denoiser_calls.inc(job.result.get("denoiser_calls", 0))
            self.cached_steps.inc(job.result.get("cached_steps", 0))
            self.steps.inc(job.result.get("steps", 0))
            if job.result.get("batch_rows", 1) > 1:
                self.batched.labels(str(job.result["batch_rows"])).inc()

    def rejected(self, reason: str) -> None:
        self.rejects.labels(reason).inc()

    def serve(self, host: str, port: int) -> int:
        """Start the /metrics HTTP endpoint; returns the bound port."""
        from prometheus_client import start_http_server

        server, _ = start_http_server(port, addr=host, registry=self.registry)
        return server.server_port

    def text(self) -> str:
        return generate_latest(self.registry).decode()
