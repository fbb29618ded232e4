"""The host step-cache controller: the output estimator and the per-step full-or-cached decision.

One `StepCache` per request (never shared, so no caching state crosses requests). The denoise
loop asks `decide(i, score)` before step i, then either calls the denoiser and hands the output
to `full(out)`, or takes `cached()`; both results go through the same scheduler update.

Estimator invariants (paper section 5):
- `prev` is the output the loop used at the previous step, whether computed or estimated.
- A full step measures `delta = out - prev` (and its relative L1 size, the "change") and then
  saves `prev = out`; a cached step returns `prev + delta` and saves that as `prev`.
- With `+forecast:K` a cached step's output is instead the polynomial of degree
  min(K, computed outputs - 1) through the last computed outputs, as a function of the step
  index (Newton's divided differences; TaylorSeer's finite-difference forecast), evaluated at
  the cached step. K = 0 reuses the last computed output. Decisions and changes are unchanged.
- A step is cached only inside the window [initial, total - final) and only once a delta exists
  (two full steps ran), so the first and last steps always run the denoiser.
Decision rules, inside the window:
- cadence:N    step i is full iff (i - initial) % N == 0; no signal is read.
- online-delta the step after a full step whose change < alpha x the generation's first change
               is cached; a cached step is always followed by a full one.
- calibrated   est = poly(score); per step: cached iff est < threshold; accumulate: the sum of
               est since the last full step, this step's included, must stay below threshold.
               Every full step resets the sum.
- block        cached iff score < threshold, the score being the front program's relative L1
               change since the rest last ran (None before it ever ran: full); the outputs
               come from the programs (stepcache/blocks.py), not from full()/cached().
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from difflet.stepcache.modes import CacheMode


def rel_l1(new: torch.Tensor, old: torch.Tensor) -> float:
    """mean|new - old| / mean|old| in float64 (0 when both are zero)."""
    den = old.double().abs().mean()
    num = (new.double() - old.double()).abs().mean()
    return float(num / den) if float(den) > 0 else (0.0 if float(num) == 0 else float("inf"))


def forecast(points: list[tuple[int, torch.Tensor]], at: int) -> torch.Tensor:
    """The polynomial through `points` (step, output), oldest first, evaluated at step `at`."""
    steps = [s for s, _ in points]
    table = [v for _, v in points]  # Newton's divided differences, built in place
    coefficients = [table[-1]]
    for depth in range(1, len(points)):
        table = [(table[k + 1] - table[k]) / (steps[k + depth] - steps[k]) for k in range(len(table) - 1)]
        coefficients.append(table[-1])
    out, basis = coefficients[0], 1.0
    for depth in range(1, len(coefficients)):
        basis = basis * (at - steps[-depth])
        out = out + coefficients[depth] * basis
    return out


@dataclass
class CurveFit:
    """est(score) = polyval(coefficients, score), highest power first (numpy.polyfit order)."""

    coefficients: tuple[float, ...]

    def __call__(self, score: float) -> float:
        out = 0.0
        for c in self.coefficients:
            out = out * score + c
        return out


@dataclass
class StepCache:
    mode: CacheMode
    total: int
    curve: CurveFit | None = None      # calibrated only
    threshold: float = 0.0             # calibrated only (already resolved from the file)
    accumulate: bool = True            # calibrated only
    measure: bool = True               # False: full() records no change (None), computes nothing
    prev: torch.Tensor | None = None
    delta: torch.Tensor | None = None
    first_change: float | None = None
    cache_next: bool = False
    accumulated: float = 0.0
    last_cached: bool = False
    step: int = 0                      # the step decide() was last asked about
    computed: list[tuple[int, torch.Tensor]] = field(default_factory=list)  # forecast: (step, output)
    changes: list[float | None] = field(default_factory=list)  # per step; None at cached steps
    schedule: list[bool] = field(default_factory=list)          # per step: cached?

    @property
    def needs_probe(self) -> bool:
        return self.mode.kind == "calibrated"

    def in_window(self, i: int) -> bool:
        return self.mode.initial <= i < self.total - self.mode.final

    def decide(self, i: int, score: float | None = None) -> bool:
        """True if step i is cached. Call once per step, in order; `score` when calibrated or block."""
        kind = self.mode.kind
        est = self.curve(score) if kind == "calibrated" and score is not None else None
        if kind == "off" or not self.in_window(i) or (self.delta is None and kind != "block"):
            cached = False
        elif kind == "block":  # score: the front's change since the rest last ran (stepcache/blocks.py)
            cached = score is not None and score < self.mode.threshold
        elif kind == "cadence":
            cached = (i - self.mode.initial) % self.mode.cadence != 0
        elif kind == "online-delta":
            cached = self.cache_next and not self.last_cached
        elif kind == "calibrated":
            if est is None:
                raise ValueError("calibrated step caching needs the probe score at every step")
            if self.accumulate:
                cached = self.accumulated + est < self.threshold
                self.accumulated = self.accumulated + est if cached else 0.0
            else:
                cached = est < self.threshold
        else:
            raise ValueError(f"unknown cache mode kind {kind!r}")
        if not cached:
            self.accumulated = 0.0
        self.last_cached = cached
        self.schedule.append(cached)
        self.step = i
        return cached

    def full(self, out: torch.Tensor) -> float | None:
        """Record a computed output; returns its change vs the previous used output (None at first)."""
        change = None
        if self.mode.forecast is not None:
            kept = self.computed[max(0, len(self.computed) - self.mode.forecast):]  # order K needs K+1 points
            self.computed = [*kept, (self.step, out)]
        if not self.measure:
            self.changes.append(None)
            return None
        if self.prev is not None:
            self.delta = out - self.prev
            change = rel_l1(out, self.prev)
            if self.first_change is None:
                self.first_change = change
            self.cache_next = change < self.mode.alpha * self.first_change
        self.prev = out
        self.changes.append(change)
        return change

    def restart(self) -> None:
        """Forget the outputs seen so far (the model changed: Wan 2.2's expert switch), so the next
        two steps are full and later estimates extrapolate the new model's outputs only."""
        self.prev = self.delta = self.first_change = None
        self.computed, self.cache_next, self.accumulated = [], False, 0.0

    def cached(self) -> torch.Tensor:
        """The estimate for a cached step: previous used output + last measured change."""
        out = self.prev + self.delta if self.mode.forecast is None else forecast(self.computed, self.step)
        self.prev = out
        self.changes.append(None)
        return out

    def stats(self) -> dict:
        cached = sum(self.schedule)
        return {"mode": self.mode.spec(), "steps": len(self.schedule), "cached_steps": cached,
                "denoiser_calls": len(self.schedule) - cached,
                "schedule": "".join("C" if c else "F" for c in self.schedule)}
