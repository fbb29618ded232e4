"""The dispatcher: bounded FIFO admission, least-in-flight dispatch to replicas, deadlines,
cancellation and recovery bookkeeping. Lives in the API process; knows nothing of gRPC.

Invariants:
- Capacity: at most `queue_size + replicas x slots` requests are accepted and unanswered
  (waiting or running; slots = --max-batch); one more is refused at once with
  `Rejected("queue_full")`, never queued.
- FIFO: requests leave the queue in arrival order, each to the replica with a free slot and the
  fewest requests in flight (ties: lowest index), so a request never waits behind another while
  some replica is idle. A replica already running requests takes only ones of the same size
  (those can share its batched denoiser calls); a head request no replica can take waits, and
  the ones behind it wait too (no overtaking).
- Dispatch pauses for a replica that is starting, recovering or failed; its queued requests
  stay queued. Only when every replica has failed (recovery failed) are queued requests
  answered UNAVAILABLE and new ones refused; nothing accepted is dropped unanswered.
- Health (the `on_health` callback) is True iff some replica is ready or busy with a live
  supervisor thread and the dispatcher is not closed (a dead supervisor is restarted within
  WATCH_S by `_watch`). It is published only on change and never while holding the
  dispatcher lock: gRPC's health Watch sends from the caller's thread and waits for the
  server's poller, and the poller runs call-termination callbacks that take this lock.
"""
from __future__ import annotations

import itertools
import queue
import threading
import time
from collections import deque
from typing import Any, Callable

from difflet.runtime.jobs import Job
from difflet.runtime.messages import Ready
from difflet.runtime.request import Request
from difflet.runtime.replica import Replica

WATCH_S = 1.0  # how often the watchdog looks for a dead supervisor thread


class Rejected(Exception):
    """A request refused at admission. `reason`: queue_full | unavailable | duplicate_id."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason, self.message = reason, message


class Dispatcher:
    def __init__(self, config: dict[str, Any], *, replicas: int = 1, queue_size: int = 16,
                 grace: float = 5.0, precheck: Callable[[], None] = lambda: None,
                 metrics=None, on_health: Callable[[bool], None] = lambda ok: None,
                 log: Callable[[str], None] = lambda line: None) -> None:
        self.queue_size, self.grace = queue_size, grace
        self.metrics, self.on_health, self.log = metrics, on_health, log
        self.recoveries = 0
        self._lock = threading.RLock()
        self._queue: deque[Job] = deque()
        self._active: dict[tuple[str, str], Job] = {}  # (owner, request id) -> job
        self._seq = itertools.count()
        self._closed = False
        self._serving = False
        self._ever_ready = False  # before the first warm-up passed, requests are refused
        self._published: bool | None = None
        self._publish_lock = threading.Lock()
        self.replicas = [Replica(i, config, self, precheck, grace) for i in range(replicas)]

    # ---- lifecycle
    def start(self) -> list[str]:
        """Start every replica and wait for each first start; returns the failures' reasons."""
        for r in self.replicas:
            r.start()
        for r in self.replicas:
            r.started.wait()
        threading.Thread(target=self._watch, name="replica-watch", daemon=True).start()
        return [f"model process {r.index}: {r.error}" for r in self.replicas if r.state == "failed"]

    def close(self, drain_s: float = 5.0) -> None:
        """Refuse new requests, let accepted ones finish for up to `drain_s`, answer the rest
        UNAVAILABLE, then stop the model processes."""
        with self._lock:
            self._closed = True
            self._update_health()
        self._publish()
        end = time.monotonic() + drain_s
        for job in list(self._active.values()):
            job.done.wait(max(0.0, end - time.monotonic()))
        with self._lock:
            for job in list(self._active.values()):
                self._answer(job, "unavailable", "the server is shutting down")
            self._queue.clear()
        for r in self.replicas:
            r.stop()

    # ---- admission and answers (any thread)
    def submit(self, fields: Request, deadline: float | None, owner: str = "") -> Job:
        """Accept the request admission resolved (`Admission.check`). `owner`: the API key's tag
        (http/auth.py); request ids are unique per owner, and only the owner cancels by id."""
        with self._lock:
            if self._closed:
                raise Rejected("unavailable", "the server is shutting down")
            if all(r.state == "failed" for r in self.replicas):
                raise Rejected("unavailable", "no model process: recovery failed ("
                               + "; ".join(r.error for r in self.replicas) + ")")
            if not self._ever_ready:
                raise Rejected("unavailable", "the model is still loading")
            if (owner, fields.request_id) in self._active:
                raise Rejected("duplicate_id", f"request_id: {fields.request_id!r} is already in flight")
            running = sum(r.slots for r in self.replicas)
            if len(self._active) >= self.queue_size + running:
                raise Rejected("queue_full", f"the queue is full ({self.queue_size} waiting + "
                                             f"{running} running); retry later")
            job = Job(fields, deadline, owner)
            job.post(("queued", len(self._queue)))
            self._queue.append(job)
            self._active[job.owner, job.request_id] = job
            self._dispatch()
            return job

    def events(self, job: Job):
        """Yield `job`'s events up to (not including) its "end" marker, expiring it when its
        deadline passes while we wait; `finish()` always queues "end" after the last event."""
        while True:
            timeout = None if job.deadline is None else job.deadline - time.monotonic()
            if timeout is not None and timeout <= 0:  # events keep coming; check the clock too
                self.expire(job)  # no-op if answered; either way "end" is queued
                timeout = None
            try:
                event = job.events.get(timeout=timeout)
            except queue.Empty:
                continue
            if event[0] == "end":
                return
            yield event

    def expire(self, job: Job) -> None:
        self.cancel(job, "deadline", "the request deadline passed")

    def cancel(self, job: Job, code: str = "cancelled", message: str = "cancelled") -> str:
        """Answer `job` with `code` now; a running one is asked to stop at its next step."""
        if job.done.is_set():  # the common case from call-termination callbacks: no lock
            return ""
        with self._lock:
            if job.done.is_set():
                return ""
            if job in self._queue:
                self._queue.remove(job)
                self._answer(job, code, message)
                return "queued"
            job.cancel_at = time.monotonic()
            self._answer(job, code, message)
            for r in self.replicas:
                r.cancel(job)
            return "running"

    def cancel_id(self, request_id: str, owner: str = "") -> str:
        with self._lock:
            job = self._active.get((owner, request_id))
            return self.cancel(job, "cancelled", "cancelled by a Cancel call") if job else ""

    def next_seq(self) -> int:
        return next(self._seq)

    # ---- replica callbacks (supervisor threads)
    def finished(self, replica: Replica, job: Job, code: str, message: str, result,
                 requeue: bool = False) -> None:
        with self._lock:
            if job in replica.jobs:
                replica.jobs.remove(job)
            if requeue and not job.done.is_set():
                self._queue.appendleft(job)  # never sent: it keeps its place
            else:
                self._answer(job, code, message, result)
            if replica.state == "busy" and not replica.jobs:
                replica.state = "ready"
            self._update_health()
            self._dispatch()
        self._publish()

    def model_ready(self, replica: Replica, info: Ready) -> None:
        self.log(f"model process {replica.index} ready: pid {info.pid}, generation "
                 f"{replica.generation}, imports {info.import_s:.2f} s, load {info.load_s:.2f} s, "
                 f"warm-up {info.warm_up_s:.2f} s")
        with self._lock:
            self._ever_ready = True
            self._update_health()
            self._dispatch()
        self._publish()

    def model_lost(self, replica: Replica, reason: str) -> None:
        with self._lock:
            self.recoveries += 1
            if self.metrics:
                self.metrics.recoveries.labels(reason).inc()
            self._update_health()
        self._publish()

    def model_failed(self, replica: Replica, kind: str, message: str) -> None:
        with self._lock:
            if all(r.state == "failed" for r in self.replicas) and replica.generation > 0:
                for job in list(self._queue):
                    self._answer(job, "unavailable", f"recovery failed: {message}")
                self._queue.clear()
            self._update_health()
        self._publish()

    def _watch(self) -> None:
        """Every WATCH_S: a replica whose supervisor thread died (a bug) is marked not serving and
        restarted; its running requests are answered UNAVAILABLE, queued ones wait for it."""
        while not self._closed:
            time.sleep(WATCH_S)
            for replica in self.replicas:
                if self._closed or replica.alive():
                    continue
                self.log(f"model process {replica.index}: its supervisor thread failed; restarting it")
                with self._lock:
                    replica.state = "recovering"
                    self._update_health()
                self._publish()
                replica.restart()
                self.model_lost(replica, "supervisor")

    # ---- state (lock held)
    def _answer(self, job: Job, code: str, message: str, result=None) -> None:
        job.finish(code, message, result, on_answered=self._forget)

    def _forget(self, job: Job) -> None:
        """Before the answer is seen: its id is free again and it is counted."""
        if self._active.get((job.owner, job.request_id)) is job:
            del self._active[(job.owner, job.request_id)]
        if self.metrics:
            self.metrics.answered(job)

    def _dispatch(self) -> None:
        while self._queue:
            job = self._queue[0]
            if job.done.is_set():
                self._queue.popleft()
                continue
            free = [r for r in self.replicas if r.free_slots() > 0
                    and all(_same_size(j, job) for j in r.jobs)]
            if not free:
                return
            self._queue.popleft()
            min(free, key=lambda r: (len(r.jobs), r.index)).assign(job)

    def _update_health(self) -> None:
        self._serving = not self._closed and any(r.state in ("ready", "busy") and r.alive()
                                                 for r in self.replicas)

    def _publish(self) -> None:
        """Tell `on_health` the current status if it changed (dispatcher lock NOT held)."""
        with self._publish_lock:
            serving = self._serving
            if serving != self._published:
                self._published = serving
                self.on_health(serving)

    # ---- read-only views
    def queue_depth(self) -> int:
        return len(self._queue)

    def in_flight(self) -> int:
        return sum(len(r.jobs) for r in self.replicas)


def _same_size(a: Job, b: Job) -> bool:
    """Requests whose denoiser calls can share a batched program call (one size's programs)."""
    fa, fb = a.fields, b.fields
    return (fa.height, fa.width, fa.frames) == (fb.height, fb.width, fb.frames)
