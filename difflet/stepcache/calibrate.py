"""`calibrate(runner, prompts, steps)`: reference runs -> fitted curve -> selected mode -> file data.

Invariants:
- Reference runs are uncached (mode off) with the probe recording at every step, so the pairs
  (probe score at step i, output change at step i) for i >= 1 come from the true trajectory.
- The threshold is set for the calibrated mode whatever mode is selected (so the file can be
  used either way): from a target skip budget (default: cadence 2's cached steps at `steps`),
  replayed on the recorded scores; or from a target PSNR, by real cached generations on the
  calibration prompts, choosing the largest skip budget whose mean PSNR reaches the target.
- The result is tied to the runner's artifact (see calibration.check_tied).
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from difflet.errors import DiffletError
from difflet.stepcache.calibration import (Calibration, CurveFit, fit_curve, neighbour_r, select_mode,
                                           simulate, threshold_for_budget)
from difflet.stepcache.modes import DEFAULT_ALPHA, DEFAULT_KEEP, CacheMode
from difflet.stepcache.plan import CachePlan


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR of uint8 images in dB (inf when identical)."""
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10.0 * np.log10(255.0 ** 2 / mse)


def cadence_budget(steps: int, cadence: int = 2, keep: tuple[int, int] = DEFAULT_KEEP) -> int:
    """Cached steps of cadence:N at `steps`: the window's steps not at a multiple of N from its start."""
    window = max(0, steps - keep[0] - keep[1])
    return window - (window + cadence - 1) // cadence


def record(runner, prompts: Sequence[str], steps: int, seed: int = 0) -> list[dict]:
    """One uncached, probe-recording run per prompt: scores, changes and the image."""
    runs = []
    for prompt in prompts:
        params = runner.resolve(prompt=prompt, seed=seed, steps=steps)
        params = type(params)(**{**params.__dict__, "cache": CachePlan(CacheMode(), record=True)})
        result = runner.generate(params)
        runs.append({"prompt": prompt, "scores": result.stats["scores"], "changes": result.stats["changes"],
                     "image": result.image if result.image is not None else result.video})
    return runs


def calibrate(runner, prompts: Sequence[str], steps: int, degree: int = 2, accumulate: bool = True,
              target_skips: float | None = None, target_psnr: float | None = None, seed: int = 0,
              log: Callable[[str], object] = lambda _: None) -> dict:
    """Calibration file data for `runner`'s artifact (see module invariants)."""
    from difflet.runtime.runner import tie_keys

    if runner.probe is None:
        raise DiffletError("calibrate needs an artifact with a probe program; build it from "
                           "`difflet opt --probe separate`", where="ART")
    keep = DEFAULT_KEEP
    if steps < keep[0] + keep[1] + 2:
        raise DiffletError(f"--steps {steps} leaves no cacheable steps (keeps {keep[0]}+{keep[1]} full); "
                           f"use at least {keep[0] + keep[1] + 2}", where="--steps")
    if not prompts:
        raise DiffletError("the prompts file has no prompts", where="--prompts")
    if target_skips is not None and target_psnr is not None:
        raise DiffletError("give --target-skips or --target-psnr, not both", where="--target-psnr")
    runs = record(runner, prompts, steps, seed)
    xs = [s for r in runs for s, c in zip(r["scores"], r["changes"]) if s is not None and c is not None]
    ys = [c for r in runs for s, c in zip(r["scores"], r["changes"]) if s is not None and c is not None]
    curve, r2 = fit_curve(xs, ys, degree)
    nr = neighbour_r([[c for c in r["changes"] if c is not None] for r in runs])
    selected = select_mode(r2, nr)
    log(f"fit: degree {degree}, R^2 {r2:.3f} over {len(xs)} steps; neighbour change r {nr:.3f}; "
        f"selected {selected}")
    score_runs = [[0.0 if s is None else s for s in r["scores"]] for r in runs]
    if target_psnr is None:
        budget = cadence_budget(steps) if target_skips is None else float(target_skips)
        threshold = threshold_for_budget(score_runs, curve, budget, accumulate, *keep)
        target = {"skip_budget": budget}
    else:
        threshold, budget, got = _threshold_for_psnr(runner, runs, score_runs, curve, accumulate, steps,
                                                     target_psnr, seed, keep)
        target = {"psnr": target_psnr, "skip_budget": budget, "mean_psnr": got}
    skips = [simulate(r, steps, curve, threshold, accumulate, *keep) for r in score_runs]
    log(f"threshold {threshold:.6g} ({'accumulated' if accumulate else 'per step'}): "
        f"replayed cached steps {skips}")
    mode = {"calibrated": "calibrated:{file}", "online-delta": f"online-delta:{DEFAULT_ALPHA:g}",
            "cadence": "cadence:2"}[selected]
    return {
        **tie_keys(runner.module, runner.manifest), "model": runner.module.name, "steps": steps,
        "prompts": len(prompts), "seed": seed, "degree": degree, "coefficients": list(curve.coefficients),
        "r2": r2, "neighbour_r": nr, "selected": selected, "mode": mode,
        "threshold": threshold, "accumulate": accumulate, "target": target, "replayed_skips": skips,
        "samples": [{"prompt": r["prompt"], "scores": r["scores"], "changes": r["changes"]} for r in runs],
    }


def _threshold_for_psnr(runner, runs, score_runs, curve: CurveFit, accumulate: bool, steps: int,
                        target: float, seed: int, keep) -> tuple[float, int, float]:
    """The largest skip budget whose real cached runs keep mean PSNR >= target (vs uncached)."""
    window = steps - keep[0] - keep[1]
    best = (threshold_for_budget(score_runs, curve, 0.5, accumulate, *keep), 0, float("inf"))
    for budget in range(window - 1, 0, -max(1, window // 8)):
        th = threshold_for_budget(score_runs, curve, budget, accumulate, *keep)
        mode = CacheMode("calibrated", calibration="-", threshold=th, accumulate=accumulate)
        plan = CachePlan(mode, Calibration(curve, th, accumulate, 0.0, {}))
        scores = []
        for r in runs:
            params = runner.resolve(prompt=r["prompt"], seed=seed, steps=steps)
            params = type(params)(**{**params.__dict__, "cache": plan})
            scores.append(min(psnr(runner.generate(params).image, r["image"]), 100.0))
        if float(np.mean(scores)) >= target:
            return th, budget, float(np.mean(scores))
    return best
