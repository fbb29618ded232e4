"""Calibration math on synthetic data: curve fit and R^2, neighbour relation, mode selection, skip
budgets, threshold replay and the file's version/tie checks. Expected values are worked by hand.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from difflet.errors import DiffletError
from difflet.stepcache.calibrate import cadence_budget
from difflet.stepcache.calibration import (CurveFit, check_tied, fit_curve, load_calibration, neighbour_r,
                                           select_mode, simulate, threshold_for_budget)
from difflet.stepcache.calibration_file import read_calibration, write_calibration
from difflet.stepcache.modes import parse_mode


def test_fit_recovers_an_exact_quadratic():
    x = np.linspace(0.0, 1.0, 20)
    curve, r2 = fit_curve(x, 3 * x ** 2 - 2 * x + 0.5, degree=2)
    assert r2 == pytest.approx(1.0)
    assert curve.coefficients == pytest.approx((3.0, -2.0, 0.5), abs=1e-9)
    assert curve(2.0) == pytest.approx(12 - 4 + 0.5)


def test_fit_on_unrelated_data_has_low_r2():
    gen = np.random.default_rng(0)
    _, r2 = fit_curve(gen.random(200), gen.random(200), degree=1)
    assert r2 < 0.05
    with pytest.raises(DiffletError):
        fit_curve([0.1, 0.2], [1.0, 2.0], degree=2)  # 2 points cannot fix 3 coefficients


def test_neighbour_relation():
    assert neighbour_r([[1, 2, 3, 4, 5, 6]]) == pytest.approx(1.0)
    assert neighbour_r([[1, -1, 1, -1, 1, -1]]) == pytest.approx(-1.0)
    assert neighbour_r([[1, 1, 1, 1]]) == 0.0  # undefined -> not related


@pytest.mark.parametrize("r2,nr,mode", [(0.5, 0.0, "calibrated"), (0.49, 0.5, "online-delta"),
                                        (0.49, 0.49, "cadence"), (0.9, 0.9, "calibrated")])
def test_selection_rule(r2, nr, mode):
    assert select_mode(r2, nr) == mode


def test_cadence_budgets():
    # window of 40 (50 - 5 - 5): full at 5, 7, ..., 43 -> 20 cached; window 30 -> 15; none at 10
    assert (cadence_budget(50), cadence_budget(40), cadence_budget(10)) == (20, 15, 0)
    assert cadence_budget(20, 3) == 6  # window 10: full at offsets 0, 3, 6, 9


def test_simulate_and_threshold_for_budget():
    # 12 steps, keep 2 + 2, identity curve, constant score 0.1, accumulate: with threshold 0.25
    # sums run .1 C, .2 C, .3 F, .1 C, .2 C, .3 F, .1 C, .2 C over the window 2..9 -> 6 cached
    scores = [0.1] * 12
    ident = CurveFit((1.0, 0.0))
    assert simulate(scores, 12, ident, 0.25, True, 2, 2) == 6
    # threshold just above 0.1: .1 C, .2 F, .1 C, .2 F ... -> 4 cached; per step any th > .1 -> 8
    assert simulate(scores, 12, ident, 0.15, True, 2, 2) == 4
    assert simulate(scores, 12, ident, 0.15, False, 2, 2) == 8
    th = threshold_for_budget([scores], ident, 6, True, 2, 2)
    assert 0.2 < th <= 0.3 + 1e-9  # the smallest threshold giving 6: just above 0.2
    assert simulate(scores, 12, ident, th, True, 2, 2) >= 6


def test_file_version_and_tie(tmp_path):
    path = tmp_path / "cal.json"
    keys = {"probe_cache_key": "p" * 64, "denoiser_cache_key": "d" * 64, "denoiser_weights_sha256": "w" * 64}
    write_calibration(path, {**keys, "coefficients": [1.0, 0.0], "threshold": 0.2, "accumulate": True, "r2": 0.8})
    cal = load_calibration(parse_mode(f"calibrated:{path}"), keys)
    assert (cal.threshold, cal.accumulate, cal.curve.coefficients) == (0.2, True, (1.0, 0.0))
    cal = load_calibration(parse_mode(f"calibrated:{path}:0.5:step"), keys)
    assert (cal.threshold, cal.accumulate) == (0.5, False)
    with pytest.raises(DiffletError, match="another artifact"):
        check_tied(read_calibration(path), {**keys, "denoiser_weights_sha256": "x" * 64})
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "version": 99}))
    with pytest.raises(DiffletError, match="version") as err:
        read_calibration(path)
    assert err.value.where == "cache"
    path.write_text("{not json")
    with pytest.raises(DiffletError, match="not JSON"):
        read_calibration(path)
