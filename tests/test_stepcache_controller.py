"""The host step-cache controller on synthetic outputs (no model): schedules, estimator, mode strings.

Oracle: every expected schedule and estimate below is derived by hand from the rule in the
paper (section 5) and written out, not produced by the code under test.
"""
from __future__ import annotations

import pytest
import torch

from difflet.errors import DiffletError
from difflet.stepcache.controller import CurveFit, StepCache
from difflet.stepcache.modes import CacheMode, parse_mode


def run(cache: StepCache, outputs, scores=None) -> tuple[set[int], list[torch.Tensor]]:
    """Drive the controller like the denoise loop; returns cached step indices and used outputs."""
    cached, used = set(), []
    for i in range(cache.total):
        if cache.decide(i, None if scores is None else scores[i]):
            cached.add(i)
            used.append(cache.cached())
        else:
            out = torch.as_tensor(outputs[i], dtype=torch.float64).reshape(1, 1)
            cache.full(out)
            used.append(out)
    return cached, used


@pytest.mark.parametrize("steps,expected", [
    # window = steps 5 .. steps-6; full at its first step and every 2nd after, the others cached
    (50, set(range(6, 45, 2))),   # 6, 8, ..., 44: 20 steps
    (40, set(range(6, 35, 2))),   # 6, 8, ..., 34: 15 steps
])
def test_cadence_2_exact_schedule(steps, expected):
    cached, _ = run(StepCache(parse_mode("cadence:2"), steps), [float(i + 1) for i in range(steps)])
    assert cached == expected
    assert len(cached) == {50: 20, 40: 15}[steps]


def test_cadence_3_caches_two_of_every_three():
    # 20 steps, window 5..14: full at 5, 8, 11, 14; cached 6, 7, 9, 10, 12, 13
    cached, _ = run(StepCache(parse_mode("cadence:3"), 20), [float(i + 1) for i in range(20)])
    assert cached == {6, 7, 9, 10, 12, 13}


def test_estimator_chains_estimates_and_measures_against_them():
    # cadence 3, keep 2 initial 0 final, 6 steps: full 0, 1, 2, 5; cached 3, 4
    mode = CacheMode("cadence", cadence=3, initial=2, final=0)
    outputs = [1.0, 3.0, 4.0, None, None, 10.0]
    cache = StepCache(mode, 6)
    cached, used = run(cache, outputs)
    assert cached == {3, 4}
    # delta after step 2 is 4 - 3 = 1; step 3 = 4 + 1, step 4 = 5 + 1 (previous *used* output)
    assert [float(u) for u in used] == [1.0, 3.0, 4.0, 5.0, 6.0, 10.0]
    # step 5 measures its change against the estimate 6, not against the last computed 4
    assert float(cache.delta) == 4.0
    assert cache.changes[5] == pytest.approx(4.0 / 6.0)


@pytest.mark.parametrize("order,expected", [
    (0, [1.0, 3.0, 4.0, 4.0, 4.0, 10.0]),  # the last computed output, reused
    (1, [1.0, 3.0, 4.0, 5.0, 6.0, 10.0]),  # the line through (1, 3), (2, 4)
    # the parabola through (0, 1), (1, 3), (2, 4) is 1 + 2x - x(x - 1)/2: 4 at x=3, 3 at x=4
    (2, [1.0, 3.0, 4.0, 4.0, 3.0, 10.0]),
])
def test_forecast_by_hand(order, expected):
    # the same schedule as above (full 0, 1, 2, 5; cached 3, 4), the outputs forecast instead
    mode = CacheMode("cadence", cadence=3, initial=2, final=0, forecast=order)
    cache = StepCache(mode, 6)
    cached, used = run(cache, [1.0, 3.0, 4.0, None, None, 10.0])
    assert cached == {3, 4} and [float(u) for u in used] == expected
    # changes are still measured against the previous used output (the decision rules' input)
    assert cache.changes[5] == pytest.approx(abs(10.0 - expected[4]) / expected[4])


@pytest.mark.parametrize("order,outputs", [
    (1, [3.0 * i - 7.0 for i in range(20)]),
    (2, [0.5 * i * i - 3.0 * i + 2.0 for i in range(20)]),
])
def test_forecast_of_order_k_is_exact_on_a_degree_k_history(order, outputs):
    # cadence 3: full steps 5, 8, 11, 14 are 3 apart while 0..5 are 1 apart: unequal spacing
    cache = StepCache(parse_mode(f"cadence:3+forecast:{order}"), 20)
    cached, used = run(cache, [None if i in {6, 7, 9, 10, 12, 13} else v for i, v in enumerate(outputs)])
    assert cached == {6, 7, 9, 10, 12, 13}
    assert [float(u) for u in used] == pytest.approx(outputs, abs=1e-12)
    assert len(cache.computed) == order + 1  # the history it keeps


def test_online_delta_rule_by_hand():
    # alpha 0.6, 10 steps, keep 2 + 2 (window 2..7); outputs chosen so the changes are known:
    # s1: change 1 (first); s2 full 0.05 < 0.6 -> s3 cached (2.2); s4 full (after a cached step)
    # 0.1/2.2 -> s5 cached (2.4); s6 full 1.7/2.4 > 0.6 -> s7 full 0.1/4.1 -> s8 outside window.
    mode = CacheMode("online-delta", alpha=0.6, initial=2, final=2)
    outputs = [1.0, 2.0, 2.1, None, 2.3, None, 4.1, 4.2, 4.3, 4.4]
    cached, used = run(StepCache(mode, 10), outputs)
    assert cached == {3, 5}
    assert float(used[3]) == pytest.approx(2.2) and float(used[5]) == pytest.approx(2.4)


def test_online_delta_alternates_at_most():
    # alpha so large every change qualifies: still never two cached steps in a row
    mode = CacheMode("online-delta", alpha=10.0, initial=2, final=2)
    cached, _ = run(StepCache(mode, 10), [float(i * i + 1) for i in range(10)])
    assert cached == {2, 4, 6}


@pytest.mark.parametrize("alpha", [0.3, 0.6, 1.0, 3.0])
def test_online_delta_never_two_cached_in_a_row(alpha):
    gen = torch.Generator().manual_seed(1)
    outputs = torch.cumsum(torch.rand(50, generator=gen) + 0.1, 0).tolist()
    cached, _ = run(StepCache(parse_mode(f"online-delta:{alpha}"), 50), outputs)
    assert not any(i + 1 in cached for i in cached)
    assert all(5 <= i < 45 for i in cached)


SCORES = [None, 0.3, 0.3, 0.4, 0.5, 0.2, 0.9, 0.05, 0.05, 0.05, 0.3, 0.3]


def test_calibrated_accumulate_by_hand():
    # identity curve, threshold 1, keep 2 + 2 (window 2..9). Sums since the last full step:
    # s2 .3 C, s3 .7 C, s4 1.2 F (reset), s5 .2 C, s6 1.1 F, s7 .05 C, s8 .10 C, s9 .15 C
    mode = CacheMode("calibrated", calibration="-", initial=2, final=2)
    cache = StepCache(mode, 12, CurveFit((1.0, 0.0)), threshold=1.0, accumulate=True)
    cached, _ = run(cache, [float(i + 1) for i in range(12)], SCORES)
    assert cached == {2, 3, 5, 7, 8, 9}


def test_calibrated_per_step_by_hand():
    # per step: every window score is below 1 -> all of 2..9 cached
    mode = CacheMode("calibrated", calibration="-", initial=2, final=2)
    cache = StepCache(mode, 12, CurveFit((1.0, 0.0)), threshold=1.0, accumulate=False)
    cached, _ = run(cache, [float(i + 1) for i in range(12)], SCORES)
    assert cached == set(range(2, 10))


def test_calibrated_curve_maps_score_before_threshold():
    # est = 2 * score^2: s3 = 0.4 -> 0.32 >= 0.3 (full); s5 = 0.2 -> 0.08 (cached); per step, threshold 0.3
    mode = CacheMode("calibrated", calibration="-", initial=2, final=2)
    cache = StepCache(mode, 12, CurveFit((2.0, 0.0, 0.0)), threshold=0.3, accumulate=False)
    cached, _ = run(cache, [float(i + 1) for i in range(12)], SCORES)
    # est: s2 .18 C, s3 .32 F, s4 .5 F, s5 .08 C, s6 1.62 F, s7-9 .005 C
    assert cached == {2, 5, 7, 8, 9}


def test_keep_moves_the_window():
    # 12 steps, keep 2 + 1: window 2..10; cadence 4 -> full 2, 6, 10; cached 3-5, 7-9
    cached, _ = run(StepCache(parse_mode("cadence:4+keep:2:1"), 12), [float(i + 1) for i in range(12)])
    assert cached == {3, 4, 5, 7, 8, 9}


def test_off_never_caches_and_keep_windows_bound_every_mode():
    assert run(StepCache(parse_mode("off"), 30), [float(i) + 1 for i in range(30)])[0] == set()
    # 10 steps with 5 + 5 kept: nothing is cacheable
    assert run(StepCache(parse_mode("cadence:2"), 10), [float(i) + 1 for i in range(10)])[0] == set()


@pytest.mark.parametrize("text,phrase", [
    ("cadence:1", "outside [2, 100]"), ("cadence:x", "integer"), ("cadence", "integer"),
    ("online-delta:0", "outside (0, 10]"), ("online-delta:nan", "finite"), ("online-delta:abc", "not a number"),
    ("calibrated", "calibration file"), ("calibrated:c.json:-1", "> 0"), ("tea", "unknown cache mode"),
    ("off+forecast", "needs a caching decision"), ("+forecast:1", "needs a caching decision"),
    ("cadence:2+forecast:3", "not one of 0..2"), ("cadence:2+forecast:x", "not one of 0..2"),
    ("cadence:2+forecast:-1", "not one of 0..2"), ("cadence:1+forecast", "outside [2, 100]"),
    ("cadence:2+keep:2", "INITIAL:FINAL"), ("cadence:2+keep:a:1", "INITIAL:FINAL"),
    ("cadence:2+keep:1001:0", "[0, 1000]"), ("off+keep:2:1", "needs a caching decision"),
    ("cadence:2+forecast+forecast:2", "given twice"), ("cadence:2+forecast:\u00b2", "not one of 0..2"),
    ("cadence:2+keep:\u00b2:1", "INITIAL:FINAL"), ("cadence:2+keep:" + "9" * 5000 + ":1", "INITIAL:FINAL"),
])
def test_bad_mode_strings_name_the_field(text, phrase):
    with pytest.raises(DiffletError) as err:
        parse_mode(text)
    assert err.value.where == "cache" and str(err.value).startswith("cache:") and phrase in str(err.value)


def test_mode_strings_parse_to_their_parts():
    assert parse_mode(None).off and parse_mode("off").off
    assert parse_mode("cadence:4").cadence == 4
    assert parse_mode("online-delta").alpha == 0.6
    m = parse_mode("calibrated:/tmp/a.json:0.25:step")
    assert (m.calibration, m.threshold, m.accumulate) == ("/tmp/a.json", 0.25, False)
    m = parse_mode("calibrated:/tmp/a.json")
    assert (m.calibration, m.threshold, m.accumulate) == ("/tmp/a.json", None, None)
    assert parse_mode(m.spec()) == m
    assert parse_mode("cadence:3").forecast is None
    assert parse_mode("cadence:3+forecast").forecast == 1
    for text in ("cadence:3+forecast:0", "online-delta:0.5+forecast:2",
                 "calibrated:a+forecast.json:0.2:step+forecast:2"):
        m = parse_mode(text)
        assert m.spec() == text and parse_mode(m.spec()) == m
    assert parse_mode("calibrated:a+forecast.json").calibration == "a+forecast.json"
    m = parse_mode("cadence:4+keep:2:1+forecast")  # options in any order; the spec's is canonical
    assert (m.cadence, m.forecast, m.initial, m.final) == (4, 1, 2, 1)
    assert m.spec() == "cadence:4+forecast:1+keep:2:1" and parse_mode(m.spec()) == m
    m = parse_mode("online-delta+keep:0:3")  # online-delta needs two full steps before its first change
    assert (m.initial, m.final) == (2, 3) and parse_mode(m.spec()) == m
