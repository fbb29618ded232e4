"""A `Job`: one accepted request between admission and its answer.

Invariants:
- A job is answered exactly once: `finish` is first-wins (a result arriving after the deadline
  answered DEADLINE_EXCEEDED is dropped, never sent).
- Outcome codes are the service's vocabulary: ok, invalid, internal, cancelled, deadline,
  unavailable. `events` carries what a stream shows: ("queued", position), ("progress", step,
  total, cached, pid), and finally ("end",).
- `on_started` hooks run in `started`, after `dispatched` is set and before the Run is sent to
  the model process (the HTTP job store records the dispatch there); a hook must not raise.
- Every event goes through `post`, which then calls each of `watchers` (no arguments, from the
  posting thread; must not block or raise): how the HTTP front's event loop learns of a change
  without a thread parked per waiting request.
"""
from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable

from difflet.runtime.request import Request

OUTCOMES = ("ok", "invalid", "internal", "cancelled", "deadline", "unavailable")


class Job:
    def __init__(self, fields: Request, deadline: float | None, owner: str = "") -> None:
        self.fields, self.owner = fields, owner  # owner: the API key's tag (http/auth.py)
        self.request_id: str = fields.request_id
        self.deadline = deadline  # time.monotonic() value, or None
        self.admitted = time.monotonic()
        self.dispatched: float | None = None
        self.seq = -1             # set when sent to a model process
        self.cancel_at: float | None = None  # when a running job was asked to stop
        self.replica: int = -1
        self.pid: int = 0
        self.code: str | None = None
        self.message = ""
        self.result: dict[str, Any] | None = None  # a messages.Result as a dict (service reads it)
        self.events: queue.SimpleQueue = queue.SimpleQueue()
        self.done = threading.Event()
        self._lock = threading.Lock()
        self.on_started: list[Callable[[Job], None]] = []
        self.watchers: list[Callable[[], None]] = []

    def started(self, replica) -> None:
        self.dispatched = time.monotonic()
        self.replica, self.pid = replica.index, replica.pid
        for hook in list(self.on_started):
            hook(self)

    def progress(self, step: int, total: int, cached: bool, pid: int) -> None:
        if not self.done.is_set():
            self.post(("progress", step, total, cached, pid))

    def finish(self, code: str, message: str = "", result: dict[str, Any] | None = None,
               on_answered: Callable[[Job], None] | None = None) -> bool:
        """Answer the job; False (and nothing changes) if it was already answered. `on_answered`
        runs before the end event is posted, so whoever sees the answer also sees it counted."""
        assert code in OUTCOMES, code
        with self._lock:
            if self.done.is_set():
                return False
            self.code, self.message, self.result = code, message, result
            self.done.set()
        if on_answered:
            on_answered(self)
        self.post(("end",))
        return True

    def post(self, event: tuple) -> None:
        self.events.put(event)
        for watcher in list(self.watchers):
            watcher()

    @property
    def queue_ms(self) -> float:
        end = self.dispatched if self.dispatched is not None else time.monotonic()
        return (end - self.admitted) * 1000.0

    def latency_s(self) -> float:
        return time.monotonic() - self.admitted
