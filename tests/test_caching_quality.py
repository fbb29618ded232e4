"""bench/caching_quality.py's subset in the suite: step caching on the trained flux-shapes model
(its eager programs: the modules codegen compiles, nothing compiled here) against fewer steps.

Oracles: the uncached 28-step image of the same caption and seed (what a cached run should stay
close to), the denoiser-call counts derived by hand from the schedule rule, and the prompt
checker (difflet.train.checker, about 100% on ground-truth images).

Why the 5 dB margin fails when the forecast is wrong (these six images, 10 of 28 denoiser calls,
mean PSNR against uncached): fewer steps (10) 35.8 dB; `cadence:4+keep:2:1` with +forecast:1 (the
line through the last two computed outputs) 42.2 dB, +forecast:2 38.9, +forecast:0 31.7, and the
delta estimator (no forecast) 11.1 dB. Only the order-1 forecast clears baseline + 5 dB; the
computation is deterministic, so the 1.5 dB left over is not noise headroom but the gap a wrong
forecast would have to close.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "caching_quality.py"
_spec = importlib.util.spec_from_file_location("caching_quality", BENCH)
caching_quality = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(caching_quality)

STEPS = 28
FORECAST = "cadence:4+forecast:1+keep:2:1"


@pytest.fixture(scope="module")
def rows():
    from difflet.train.shapes_data import CAPTIONS

    # captions spread over the shapes and colours, one seed each
    jobs = [(CAPTIONS[i], i % 2) for i in range(0, len(CAPTIONS), len(CAPTIONS) // 6)][:6]
    runner = caching_quality.build_runner(None)
    try:
        found = caching_quality.sweep(runner, jobs, STEPS, ["cadence:4+keep:2:1", FORECAST], fewer=(10,),
                                      log=lambda line: None)
    finally:
        runner.close()
    return {r["setting"]: r for r in found}


def test_rows_carry_the_documented_fields(rows):
    assert set(rows) == {"28", "10", "cadence:4+keep:2:1", FORECAST}
    for r in rows.values():
        assert set(r) == {"mode", "setting", "compute", "wall_s", "colour", "background", "shape", "psnr", "psnr_min"}
    assert (rows["28"]["mode"], rows["28"]["compute"], rows["28"]["psnr"]) == ("off", 1.0, None)  # identical
    assert (rows["10"]["mode"], rows["10"]["compute"]) == ("fewer-steps", round(10 / STEPS, 4))


def test_compute_follows_the_schedule_rule(rows):
    # keep 2 + 1 at 28 steps: window 2..26, cadence 4 computes 2, 6, ..., 26 (7) + 0, 1 + 27 = 10 calls
    for setting in ("cadence:4+keep:2:1", FORECAST):
        assert rows[setting]["compute"] == round(10 / STEPS, 4)


def test_forecast_beats_fewer_steps_at_equal_compute(rows):
    forecast, fewer = rows[FORECAST], rows["10"]
    assert forecast["psnr"] >= fewer["psnr"] + 5.0, (forecast, fewer)
    assert forecast["psnr_min"] > fewer["psnr_min"]
    uncached = rows["28"]
    for key in ("colour", "background", "shape"):  # the floor: prompt following as uncached
        assert forecast[key] >= uncached[key] - 100.0 / 6 - 1e-9, (key, forecast, uncached)  # at most one image
