"""The host sampling loop every family shares: step caching, progress and cancellation hooks.

Invariants:
- Caching state (the controller) is fresh per request, built from the request's CachePlan.
- hooks.before_step() runs before every step (cancellation), hooks.after_step() after it (progress).
"""
from __future__ import annotations

import time
from typing import Callable, Collection

import torch

from difflet.errors import DiffletError
from difflet.runtime.host.env import HostEnv, RequestState
from difflet.stepcache.plan import OFF, StepHooks


def cached_loop(env: HostEnv, state: RequestState, scheduler, timesteps, latents: torch.Tensor,
                predict: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                probe_inputs: Callable[[torch.Tensor, torch.Tensor], dict] | None = None,
                blend: Callable[[int, torch.Tensor], torch.Tensor] | None = None,
                restart_at: Collection[int] = ()) -> torch.Tensor:
    """The sampling loop with step caching decided on the host (difflet.stepcache.controller).

    `predict(latents, t)` is one step's model output (all of a true-CFG step's denoiser calls and
    its combine); a full step calls it, a cached step takes the estimator's output; both go
    through the same `scheduler.step`. The probe (calibrated mode) runs on `probe_inputs(latents,
    t)` before every step's decision; a family without a probe passes None and calibrated mode is
    refused. `blend(i, latents)` replaces the latents after step i's scheduler update (an
    inpainting blend). At each step of `restart_at` (where the denoiser changes: Wan 2.2's expert
    switch) the cache forgets its history, so no estimate crosses models. Hooks: stop check
    before each step, progress after it. Stats land in `state.values["cache_stats"]`.
    """

    plan = getattr(state.params, "cache", None) or OFF
    hooks = state.values.get("step_hooks") or StepHooks()
    total = len(timesteps)
    cache = plan.controller(total)  # fresh per request
    probe = env.asset("stepcache:probe", lambda: None) if cache.needs_probe or plan.record else None
    if (cache.needs_probe or plan.record) and (probe is None or probe_inputs is None):
        raise DiffletError("calibrated step caching needs the probe program, and none is loaded",
                           where="cache")
    ms = {"full_step_ms": 0.0, "cached_step_ms": 0.0, "probe_ms": 0.0}
    scores: list[float | None] = []
    if cache.mode.kind == "block":
        if restart_at:
            raise DiffletError("block caching does not cross a change of denoiser (a two-expert model); use "
                               "cadence, online-delta or calibrated", where="cache")
        return _block_loop(state, hooks, scheduler, timesteps, latents, predict, cache, ms, blend)
    for i, t in enumerate(timesteps):
        hooks.before_step()
        score = None
        if probe is not None:
            start = time.perf_counter()
            score = probe(probe_inputs(latents, t))
            if i == 0:
                score = None  # it compares with an earlier request's last feature: never read
            scores.append(score)
            ms["probe_ms"] += (time.perf_counter() - start) * 1000.0
        start = time.perf_counter()  # step cost without the probe: decision + output + update
        if i in restart_at:
            cache.restart()
        cached = cache.decide(i, score)
        if cached:
            noise_pred = cache.cached()
        else:
            noise_pred = predict(latents, t)
            cache.full(noise_pred)
        latents = scheduler.step(noise_pred, t, latents, return_dict=False)[0]
        if blend is not None:
            latents = blend(i, latents)
        ms["cached_step_ms" if cached else "full_step_ms"] += (time.perf_counter() - start) * 1000.0
        hooks.after_step(i, total, cached)
    state.values["cache_stats"] = dict(cache.stats(), probe_calls=len(scores), scores=scores,
                                       changes=list(cache.changes), **ms)
    return latents


def _block_loop(state: RequestState, hooks, scheduler, timesteps, latents, predict, cache, ms,
                blend) -> torch.Tensor:
    """Block mode: every step's predict runs under the request's BlockSession, which calls the
    denoiser's front and, on full steps, its rest (difflet/stepcache/blocks.py)."""
    from difflet.stepcache.blocks import BlockSession, active

    session, total = BlockSession(cache), len(timesteps)
    for i, t in enumerate(timesteps):
        hooks.before_step()
        start = time.perf_counter()
        session.begin(i)
        with active(session):
            noise_pred = predict(latents, t)
        if session.calls == 0:
            raise DiffletError("block caching needs a denoiser built with `difflet opt --front-blocks K` "
                               "and called in the request's own thread (not batched)", where="cache")
        latents = scheduler.step(noise_pred, t, latents, return_dict=False)[0]
        if blend is not None:
            latents = blend(i, latents)
        ms["cached_step_ms" if session.cached else "full_step_ms"] += (time.perf_counter() - start) * 1000.0
        hooks.after_step(i, total, session.cached)
    state.values["cache_stats"] = dict(cache.stats(), probe_calls=0, scores=list(session.scores),
                                       changes=[None] * total, **session.stats(), **ms)
    return latents
