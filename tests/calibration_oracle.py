"""An independent reading of a step-cache calibration file: its fit statistics recomputed from the
file's own samples (lstsq on a Vandermonde matrix, Pearson r written out, not calibration.py's
numpy.polyfit / corrcoef), and the mode docs/architecture.md says they select."""
from __future__ import annotations

import numpy as np


def fit_statistics(data: dict) -> tuple[float, float]:
    """(R^2 of a degree-2 fit of change on score, Pearson r of neighbouring changes), pooled over runs."""
    pairs = [(s, c) for run in data["samples"] for s, c in zip(run["scores"], run["changes"])
             if s is not None and c is not None]
    x, y = np.array(pairs, dtype=float).T
    design = np.vander(x, 3)
    fit = np.linalg.lstsq(design, y, rcond=None)[0]
    r2 = 1 - np.sum((y - design @ fit) ** 2) / np.sum((y - y.mean()) ** 2)
    runs = [[c for c in run["changes"] if c is not None] for run in data["samples"]]
    a, b = np.concatenate([r[:-1] for r in runs]), np.concatenate([r[1:] for r in runs])
    da, db = a - a.mean(), b - b.mean()
    return float(r2), float(np.sum(da * db) / np.sqrt(np.sum(da ** 2) * np.sum(db ** 2)))


def expected_selection(r2: float, pearson: float) -> str:
    """docs/architecture.md: calibrated if R^2 >= 0.5, else online-delta if r >= 0.5, else cadence."""
    return "calibrated" if r2 >= 0.5 else ("online-delta" if pearson >= 0.5 else "cadence")
