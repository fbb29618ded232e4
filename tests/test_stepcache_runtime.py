"""Step caching in the runner on flux-tiny's eager programs (fast, nothing compiled).

Oracle: diffusers' FluxPipeline on the same checkpoint with its transformer's forward replaced by
a hand-written cached schedule (full calls, and `prev + (out - prev)` estimates at the steps the
rule names; with `+forecast:K`, the Lagrange polynomial through the last K+1 computed outputs),
so any difference is the host loop's. Determinism and hooks are checked against
the runner's own uncached/earlier outputs.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from calibration_oracle import expected_selection, fit_statistics

from difflet.errors import DiffletError
from difflet.runtime.cancel import Cancelled
from difflet.runtime.runner import ModelRunner
from oracle_util import assert_images_close, images_close


@pytest.fixture(scope="module")
def probe_module():
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize
    from tests.conftest import FLUX_TINY_DSL

    return optimize(lower_file(str(FLUX_TINY_DSL)), parallel="tp1", target="cpu", backend="inductor",
                    probe="separate")


@pytest.fixture(scope="module")
def runner(probe_module, flux_tiny_ckpt):
    from difflet.codegen.artifacts import eager_programs
    from difflet.codegen.probe import eager_probe

    return ModelRunner(probe_module, eager_programs(probe_module, flux_tiny_ckpt), flux_tiny_ckpt,
                       probe=eager_probe(probe_module, flux_tiny_ckpt))


def lagrange(points: list[tuple[int, torch.Tensor]], at: int) -> torch.Tensor:
    """The interpolating polynomial in Lagrange's form (the controller uses Newton's)."""
    out = 0.0
    for j, (xj, fj) in enumerate(points):
        weight = 1.0
        for m, (xm, _) in enumerate(points):
            if m != j:
                weight *= (at - xm) / (xj - xm)
        out = out + weight * fj
    return out


def pipeline_with_schedule(ckpt, cached_steps: set[int], forecast: int | None = None):
    """FluxPipeline whose transformer follows the estimator rule by hand at `cached_steps`."""
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(str(ckpt))
    pipe.set_progress_bar_config(disable=True)
    real = pipe.transformer.forward
    seen = {"i": 0, "prev": None, "delta": None, "computed": []}

    def forward(*args, **kwargs):
        i = seen["i"]
        seen["i"] += 1
        if i in cached_steps and forecast is not None:
            out = lagrange(seen["computed"][-(forecast + 1):], i)
        elif i in cached_steps:
            out = seen["prev"] + seen["delta"]          # previous used output + last change
        else:
            out = real(*args, **kwargs)[0].float()
            seen["computed"].append((i, out))
            if seen["prev"] is not None:
                seen["delta"] = out - seen["prev"]     # change vs the previous *used* output
        seen["prev"] = out
        return (out,)

    pipe.transformer.forward = forward
    return pipe


def test_cadence_matches_pipeline_with_hand_schedule(runner, flux_tiny_ckpt):
    # 14 steps, keep 5 + 5: window 5..8, cadence 2 -> full 5, 7; cached 6, 8
    params = runner.resolve(prompt="a red fox in the snow", seed=42, steps=14, cache="cadence:2")
    ours = runner.generate(params)
    assert ours.stats["schedule"] == "FFFFFFCFCFFFFF"
    assert (ours.stats["denoiser_calls"], ours.stats["cached_steps"]) == (12, 2)
    pipe = pipeline_with_schedule(flux_tiny_ckpt, {6, 8})
    ref = pipe("a red fox in the snow", generator=torch.Generator("cpu").manual_seed(42), num_inference_steps=14,
               guidance_scale=params.guidance, height=32, width=32, max_sequence_length=32, output_type="pil")
    assert_images_close(ours.image, np.asarray(ref.images[0]), what="cadence:2 vs hand-cached FluxPipeline")
    uncached = runner.generate(runner.resolve(prompt="a red fox in the snow", seed=42, steps=14))
    # caching two steps must move the image by more than kernel rounding could
    assert uncached.stats["cached_steps"] == 0 and not images_close(uncached.image, ours.image)


@pytest.mark.parametrize("order", [0, 2])
def test_forecast_matches_pipeline_with_hand_forecast(runner, flux_tiny_ckpt, order):
    # the same schedule (full 5, 7; cached 6, 8): step 6 from steps 3..5, step 8 from 4, 5, 7
    mode = f"cadence:2+forecast:{order}"
    params = runner.resolve(prompt="a red fox in the snow", seed=42, steps=14, cache=mode)
    ours = runner.generate(params)
    assert ours.stats["schedule"] == "FFFFFFCFCFFFFF" and ours.stats["mode"] == mode
    pipe = pipeline_with_schedule(flux_tiny_ckpt, {6, 8}, forecast=order)
    ref = pipe("a red fox in the snow", generator=torch.Generator("cpu").manual_seed(42), num_inference_steps=14,
               guidance_scale=params.guidance, height=32, width=32, max_sequence_length=32, output_type="pil")
    assert_images_close(ours.image, np.asarray(ref.images[0]), what=f"{mode} vs hand-forecast FluxPipeline")
    delta = runner.generate(runner.resolve(prompt="a red fox in the snow", seed=42, steps=14, cache="cadence:2"))
    # the forecast must move the image off the delta estimator's by more than kernel rounding could
    assert not images_close(delta.image, ours.image)


def test_hooks_report_every_step_and_stop_cancels(runner):
    seen = []
    params = runner.resolve(prompt="blue circle", seed=3, steps=14, cache="cadence:2")
    result = runner.generate(params, on_step=lambda i, n, c: seen.append((i, n, c)))
    assert seen == [(i, 14, i in (6, 8)) for i in range(14)]
    calls = []

    def stop():
        calls.append(1)
        return len(seen) >= 17  # 3 steps into a second generation

    with pytest.raises(Cancelled):
        runner.generate(params, on_step=lambda i, n, c: seen.append((i, n, c)), should_stop=stop)
    assert len(seen) == 17 and calls
    again = runner.generate(params)  # a cancelled request leaves no state behind
    assert again.png == result.png  # same programs, same process, same request: exact by construction


@pytest.fixture(scope="module")
def calibration_file(runner, tmp_path_factory):
    from difflet.stepcache.calibrate import calibrate
    from difflet.stepcache.calibration_file import write_calibration

    data = calibrate(runner, ["a cat", "a house by a lake", "red and green stripes"], steps=20)
    path = tmp_path_factory.mktemp("cal") / "cal.json"
    write_calibration(path, data)
    return path, data


def test_same_request_is_byte_identical_whatever_ran_before(runner, calibration_file):
    path, _ = calibration_file
    for mode in ("cadence:2", "online-delta:1.5", f"calibrated:{path}"):
        params = runner.resolve(prompt="a lighthouse", seed=11, steps=20, cache=mode)
        first = runner.generate(params)
        runner.generate(runner.resolve(prompt="something else entirely", seed=5, steps=17,
                                       cache="calibrated:%s:0.01:step" % path))
        runner.generate(runner.resolve(prompt="and another", seed=6, steps=20, cache="online-delta:9"))
        assert runner.generate(params).png == first.png, mode  # same process and programs: exact


def test_calibrated_mode_runs_the_probe_every_step(runner, calibration_file):
    path, data = calibration_file
    res = runner.generate(runner.resolve(prompt="a lighthouse", seed=11, steps=20, cache=f"calibrated:{path}"))
    assert res.stats["probe_calls"] == 20 and res.stats["scores"][0] is None
    assert res.stats["denoiser_calls"] + res.stats["cached_steps"] == 20
    assert all(s == "F" for s in res.stats["schedule"][:5] + res.stats["schedule"][-5:])
    # a huge threshold caches the whole window (the estimate is never reached)
    big = runner.generate(runner.resolve(prompt="a lighthouse", seed=11, steps=20, cache=f"calibrated:{path}:1e9"))
    assert big.stats["schedule"] == "F" * 5 + "C" * 10 + "F" * 5


def test_calibration_file_content(calibration_file, runner):
    from difflet.ir.nodes import Op
    from difflet.stepcache.calibration_file import read_calibration

    data = read_calibration(calibration_file[0])
    assert data["format"] == "difflet-stepcache-calibration" and data["version"] == 1
    assert data["probe_cache_key"] == runner.module.find(Op.PROBE)[0].attrs["cache_key"]
    assert len(data["coefficients"]) == 3 and data["threshold"] > 0
    r2, pearson = fit_statistics(data)  # recomputed from the file's samples (calibration_oracle.py)
    assert data["r2"] == pytest.approx(r2, abs=1e-6)
    assert data["neighbour_r"] == pytest.approx(pearson, abs=1e-6)
    assert data["selected"] == expected_selection(r2, pearson)
    # default target: cadence 2's skip budget at 20 steps (window 10 -> 5 cached), replayed per prompt
    assert data["target"]["skip_budget"] == 5
    assert np.mean(data["replayed_skips"]) >= 5


@pytest.mark.parametrize("cache,phrase", [
    ("cadence:1", "outside"), ("calibrated:/nonexistent/cal.json", "does not exist"), ("nope", "unknown"),
])
def test_bad_cache_override_names_the_field(runner, cache, phrase):
    with pytest.raises(DiffletError) as err:
        runner.resolve(prompt="x", seed=0, cache=cache)
    assert err.value.where == "cache" and phrase in str(err.value)


def test_calibration_for_other_programs_is_refused(runner, calibration_file, tmp_path):
    import json

    path = calibration_file[0]
    data = json.loads(path.read_text())
    other = tmp_path / "other.json"
    other.write_text(json.dumps(dict(data, denoiser_cache_key="0" * 64)))
    with pytest.raises(DiffletError, match="another artifact") as err:
        runner.resolve(prompt="x", seed=0, cache=f"calibrated:{other}")
    assert err.value.where == "cache"


def test_calibrated_needs_a_probe(flux_tiny_module, flux_tiny_ckpt, calibration_file):
    from difflet.codegen.artifacts import eager_programs

    plain = ModelRunner(flux_tiny_module, eager_programs(flux_tiny_module, flux_tiny_ckpt), flux_tiny_ckpt,
                        cache="cadence:2")
    assert plain.default_cache.mode.cadence == 2
    with pytest.raises(DiffletError, match="probe") as err:
        plain.resolve(prompt="x", seed=0, cache=f"calibrated:{calibration_file[0]}+forecast")
    assert err.value.where == "cache" and "it serves off, cadence:N and online-delta" in str(err.value)
    forecast = plain.resolve(prompt="x", seed=0, cache="cadence:3+forecast:2+keep:2:1")
    assert forecast.cache.mode.spec() == "cadence:3+forecast:2+keep:2:1"
    with pytest.raises(DiffletError) as err:
        ModelRunner(flux_tiny_module, eager_programs(flux_tiny_module, flux_tiny_ckpt), flux_tiny_ckpt,
                    cache="cadence:0")
    assert err.value.where == "cache"


def test_target_psnr_threshold_keeps_the_target(runner, tmp_path):
    from difflet.stepcache.calibrate import calibrate
    from difflet.stepcache.calibration_file import write_calibration

    prompts = ["a cat", "a house by a lake"]
    data = calibrate(runner, prompts, steps=16, target_psnr=30.0)
    assert data["target"]["psnr"] == 30.0 and data["target"]["skip_budget"] > 0
    path = tmp_path / "cal.json"
    write_calibration(path, data)
    got = []
    for p in prompts:  # PSNR recomputed here, from scratch, against fresh uncached images
        ref = runner.generate(runner.resolve(prompt=p, seed=0, steps=16)).image.astype(np.float64)
        out = runner.generate(runner.resolve(prompt=p, seed=0, steps=16, cache=f"calibrated:{path}"))
        assert out.stats["cached_steps"] > 0 or data["target"]["skip_budget"] == 0
        mse = np.mean((out.image.astype(np.float64) - ref) ** 2)
        got.append(100.0 if mse == 0 else 10 * np.log10(255.0 ** 2 / mse))
    assert np.mean(got) >= 30.0
