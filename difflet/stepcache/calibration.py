"""Calibration: probe scores vs output changes -> fitted curve, mode selection, threshold, file.

Invariants:
- A calibration file (calibration_file.py: versioned JSON) is tied to one
  artifact by the probe's and the denoiser's cache keys and the denoiser weights' sha256:
  `check_tied` refuses (DiffletError naming `cache`) a file made for other programs or weights.
- The curve is numpy.polyfit(score, change, degree) over every recorded (score, change) pair
  (step >= 1 of each reference run); R^2 is 1 - SS_res / SS_tot on those pairs.
- Selection: calibrated if R^2 >= MIN_R2; else online-delta if neighbouring output changes
  are related (Pearson r of change[i] vs change[i+1] >= MIN_NEIGHBOUR_R); else cadence:2.
- The threshold for a target skip budget is found by replaying the controller on the recorded
  scores (`simulate`), so it is exact for the recorded runs, approximate for others.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from difflet.errors import DiffletError
from difflet.stepcache.calibration_file import read_calibration
from difflet.stepcache.controller import CurveFit, StepCache
from difflet.stepcache.modes import CacheMode

MIN_R2 = 0.5
MIN_NEIGHBOUR_R = 0.5


@dataclass(frozen=True)
class Calibration:
    curve: CurveFit
    threshold: float
    accumulate: bool
    r2: float
    data: dict  # the whole file, for reporting and key checks


def fit_curve(scores: Sequence[float], changes: Sequence[float], degree: int = 2) -> tuple[CurveFit, float]:
    """Least-squares polynomial change = f(score) and its R^2 (0 when the changes are constant)."""
    x, y = np.asarray(scores, float), np.asarray(changes, float)
    if len(x) <= degree:
        raise DiffletError(f"calibration needs more than {degree} (score, change) pairs, got {len(x)}",
                           where="--steps")
    coef = np.polyfit(x, y, degree)
    ss_res = float(np.sum((y - np.polyval(coef, x)) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 0.0
    return CurveFit(tuple(float(c) for c in coef)), r2


def neighbour_r(runs: Sequence[Sequence[float]]) -> float:
    """Pearson r between each run's change[i] and change[i+1], pooled (0 if undefined)."""
    a = [c for run in runs for c in run[:-1]]
    b = [c for run in runs for c in run[1:]]
    if len(a) < 3 or np.std(a) == 0 or np.std(b) == 0:
        return 0.0
    return float(np.corrcoef(a, b)[0, 1])


def simulate(scores: Sequence[float], total: int, curve: CurveFit, threshold: float, accumulate: bool,
             initial: int = 5, final: int = 5) -> int:
    """Cached steps the calibrated controller takes on one run's recorded per-step scores."""
    mode = CacheMode("calibrated", calibration="-", initial=initial, final=final)
    cache = StepCache(mode, total, curve, threshold, accumulate)
    cache.delta = 0  # replay the decisions only: the estimator's delta exists after two steps
    n = 0
    for i in range(total):
        if i < 2:
            cache.decide(i, scores[i])
            continue
        n += cache.decide(i, scores[i])
    return n


def threshold_for_budget(score_runs: Sequence[Sequence[float]], curve: CurveFit, budget: float,
                         accumulate: bool, initial: int = 5, final: int = 5) -> float:
    """The smallest threshold whose mean cached steps over the runs reach `budget` (bisection)."""
    def mean_cached(th: float) -> float:
        return float(np.mean([simulate(r, len(r), curve, th, accumulate, initial, final) for r in score_runs]))

    lo, hi = 1e-9, 1.0
    while mean_cached(hi) < budget and hi < 1e9:
        hi *= 4
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        if mean_cached(mid) >= budget:
            hi = mid
        else:
            lo = mid
    return hi


def select_mode(r2: float, nr: float) -> str:
    if r2 >= MIN_R2:
        return "calibrated"
    if nr >= MIN_NEIGHBOUR_R:
        return "online-delta"
    return "cadence"


def check_tied(data: dict, keys: dict, field: str = "cache") -> None:
    """Refuse a calibration made for other programs or weights than `keys` (same names as the file)."""
    for name, want in keys.items():
        if data.get(name) != want:
            raise DiffletError(f"{field}: calibration file was made for another artifact ({name} "
                               f"{str(data.get(name))[:12]}... != {str(want)[:12]}...); re-run "
                               "`difflet calibrate` on this artifact", where=field)


def load_calibration(mode: CacheMode, keys: dict, field: str = "cache") -> Calibration:
    """The calibration a calibrated mode names, checked, with the mode's overrides applied."""
    data = read_calibration(mode.calibration, field)
    check_tied(data, keys, field)
    return calibration_from(data, mode, field)


def calibration_from(data: dict, mode: CacheMode, field: str = "cache") -> Calibration:
    """A checked file's data with the mode's threshold/accumulate overrides applied."""
    threshold = mode.threshold if mode.threshold is not None else data.get("threshold")
    if threshold is None or not float(threshold) > 0:
        raise DiffletError(f"{field}: the calibration file has no threshold; give one, as in "
                           f"calibrated:{mode.calibration}:0.3", where=field)
    accumulate = mode.accumulate if mode.accumulate is not None else bool(data.get("accumulate", True))
    return Calibration(CurveFit(tuple(data["coefficients"])), float(threshold), accumulate,
                       float(data.get("r2", 0.0)), data)
