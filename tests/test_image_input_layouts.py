"""Image-input profiles under the serving features text-to-image has (issue 29 item 4): split
layouts, CFG parallelism, batching and step caching.

Oracle: the reference pipeline (QwenImageImg2ImgPipeline / FluxImg2ImgPipeline) from the same
checkpoint, input file, strength, prompt, seed and steps, under the closeness rule of
tests/oracle_util.py (split and batched programs reorder float sums only; a wrong shard, a row
of another request or a wrong start timestep fails it by far). Step caching is held to its
definition: the cached steps are the ones the mode names, and the output stays near the uncached.
A video mode under cfg2 (Wan I2V) adds nothing the Qwen tp1+cfg2 case does not hold: its image
inputs reach both groups as untwinned inputs, as Qwen's image latents do, and Wan's cfg2 program is
served equal to WanPipeline by tests/test_cfg_parallel.py (removed for the suite's time bound).
"""
from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from PIL import Image

from conftest import REPO
from oracle_util import assert_images_close, compile_art, psnr, random_checkpoint
from test_image_inputs import INPUT, PROMPT, SEED, STEPS, reference

pytestmark = pytest.mark.slow  # compiles split and batched programs


def _art(tmp_path, dsl: str, parallel: str = "tp1", batches=None):
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize

    module = optimize(lower_file(str(REPO / "models" / f"{dsl}.dsl"), batches=batches), parallel=parallel,
                      target="cpu", backend="inductor")
    ckpt = random_checkpoint(module)
    return compile_art(module, ckpt, tmp_path / parallel), ckpt


@pytest.mark.parametrize("parallel", ["tp2", "tp1+cfg2"])
def test_qwen_img2img_split_and_cfg_parallel_layouts_equal_the_reference(tmp_path, parallel):
    from difflet import DiffletPipeline

    art, ckpt = _art(tmp_path, "qwen-image-tiny-img2img", parallel)
    with DiffletPipeline.from_artifacts(art) as pipe:
        out = pipe(PROMPT, image=INPUT, strength=0.6, num_inference_steps=STEPS, seed=SEED)
    assert_images_close(np.asarray(out.images[0]), reference("qwen-img2img", ckpt, 0.6), f"qwen img2img {parallel}")


def test_batched_img2img_requests_of_different_strengths_each_equal_their_reference(tmp_path):
    """Two requests run at once (their denoiser calls batched while both are in their steps),
    at strengths that start them at different timesteps; released into the batching gate together
    (as tests/test_batching.py does), so that they share calls does not depend on timing."""
    from difflet.runtime.runner import ModelRunner

    art, ckpt = _art(tmp_path, "flux-tiny-img2img", batches=[1, 2])
    with ModelRunner.from_artifacts(art, max_batch=2) as runner:
        params = [runner.resolve(prompt=PROMPT, seed=SEED, steps=STEPS, strength=s, image=INPUT) for s in (0.6, 1.0)]
        gate = runner.env.gate
        with ThreadPoolExecutor(2) as pool:
            with gate.member():  # hold every call until both requests have their first one pending
                futures = [pool.submit(runner.generate, p) for p in params]
                assert gate.wait_pending(2, timeout=300)
            results = [f.result(timeout=300) for f in futures]
    assert max(r.stats.get("batch_rows", 1) for r in results) == 2  # they did share calls
    for strength, result in zip((0.6, 1.0), results):
        assert_images_close(result.image, reference("img2img", ckpt, strength), f"batched strength {strength}")


def test_step_caching_skips_the_named_steps_of_an_img2img_request(tmp_path):
    from difflet import DiffletPipeline

    art, ckpt = _art(tmp_path, "flux-tiny-img2img")
    with DiffletPipeline.from_artifacts(art) as pipe:
        plain = pipe(PROMPT, image=INPUT, strength=0.75, num_inference_steps=8, seed=SEED)
        cached = pipe(PROMPT, image=INPUT, strength=0.75, num_inference_steps=8, seed=SEED,
                      cache="cadence:2+keep:1:1")
    # 8 x 0.75 leaves 6 steps; keep:1:1 runs the first and last, cadence:2 every other one between
    stats = cached.results[0].stats
    assert (stats["schedule"], stats["cached_steps"], stats["denoiser_calls"]) == ("FFCFCF", 2, 4)
    a, b = (np.asarray(x.images[0]) for x in (plain, cached))
    assert not np.array_equal(a, b) and psnr(a, b) > 20
