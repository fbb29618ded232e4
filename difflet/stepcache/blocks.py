"""Block mode on the host: one request's front/rest decisions and residual history.

The denoiser of an artifact built with `difflet opt --front-blocks K` is a `BlockRunner`
(codegen/block_programs.py): front(inputs, residuals) -> (outputs, streams) and
rest(inputs, streams) -> (outputs, residuals). Called plainly it runs both (the whole denoiser);
called while a request's `BlockSession` is active (`active(session)`, a context variable, so
only the calls the request's own thread makes see it) it runs:

- the front on every call, with the residuals estimated for this step: the last ones the rest
  returned for the same call of a step (a CFG step calls twice), or with `+forecast:K` their
  polynomial forecast (controller.forecast) at this step; zeros before the rest ever ran;
- on a step's first call, the decision: score = relative L1 change of the front's first tail
  stream since the rest last ran (None before it ever ran), then `StepCache.decide(i, score)`;
  later calls of the step follow it;
- the rest only on full steps; a cached step's outputs are the front's (its output layers
  applied to its streams + the estimated residuals).

Invariants: one session per request (`begin(i)` per step), never shared; `front_calls` and
`rest_calls` count what ran; a step in which no block program was called is an error (the
denoiser was not the BlockRunner: the artifact was built without --front-blocks, or batching
called it outside the request's thread).
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Callable

import torch

from difflet.stepcache.controller import StepCache, forecast, rel_l1

_ACTIVE: contextvars.ContextVar["BlockSession | None"] = contextvars.ContextVar("difflet_block_session",
                                                                                default=None)


def current() -> "BlockSession | None":
    return _ACTIVE.get()


@contextlib.contextmanager
def active(session: "BlockSession"):
    token = _ACTIVE.set(session)
    try:
        yield session
    finally:
        _ACTIVE.reset(token)


class BlockSession:
    def __init__(self, cache: StepCache) -> None:
        self.cache = cache
        self.step = -1
        self.calls = 0
        self.cached = False
        self.front_calls = 0
        self.rest_calls = 0
        self.scores: list[float | None] = []
        self.residuals: dict[int, list[tuple[int, tuple[torch.Tensor, ...]]]] = {}  # call -> (step, residuals)
        self.last_front: dict[int, torch.Tensor] = {}  # call -> the front's first tail stream at the rest's last run

    def begin(self, i: int) -> None:
        self.step, self.calls, self.cached = i, 0, False

    def estimate(self, call: int, zeros: Callable[[], tuple[torch.Tensor, ...]]) -> tuple[torch.Tensor, ...]:
        history = self.residuals.get(call)
        if not history:
            return zeros()
        order = self.cache.mode.forecast
        if order is None:
            return history[-1][1]
        points = history[-(order + 1):]
        return tuple(forecast([(s, r[j]) for s, r in points], self.step) for j in range(len(points[0][1])))

    def call(self, runner, inputs: tuple) -> tuple[torch.Tensor, ...]:
        """One denoiser call of this step through the runner's front and (on full steps) rest."""
        call = self.calls
        self.calls += 1
        outputs, streams = runner.front(inputs, self.estimate(call, runner.zero_residuals))
        self.front_calls += 1
        watched = streams[runner.watched]
        if call == 0:
            score = rel_l1(watched, self.last_front[0]) if 0 in self.last_front else None
            self.scores.append(score)
            self.cached = self.cache.decide(self.step, score)
        if self.cached:
            return outputs
        outputs, residuals = runner.rest(inputs, streams)
        self.rest_calls += 1
        kept = self.residuals.setdefault(call, [])
        kept.append((self.step, residuals))
        del kept[:-(1 + (self.cache.mode.forecast or 0))]  # a forecast of order K reads K + 1
        self.last_front[call] = watched
        return outputs

    def stats(self) -> dict:
        return {"front_calls": self.front_calls, "rest_calls": self.rest_calls}
