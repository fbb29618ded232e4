"""Wan 2.2 I2V A14B (models/wan2.2-tiny-i2v.dsl: two experts, the VAE condition, no CLIP encoder)
served equal to diffusers' WanImageToVideoPipeline with `transformer_2` and `boundary_ratio` from
the same random:0 checkpoint (issue 30).

Oracles: the reference pipeline over that checkpoint with the same image, prompt, seed, steps and
both guidance scales, every frame under the closeness rule of tests/oracle_util.py (compiled vs
eager fp32 programs; the step test below shows that running an expert at the other's steps, or
dropping the image, moves the video far past the rule); each expert's calls counted on both sides.
"""
from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import REPO
from oracle_util import (assert_images_close, compile_art, describe_match, planned_tiny, png, random_checkpoint,
                         wan_i2v_pipeline)

# the variant's served oracles share one module fixture that compiles the family's tiny programs
# (~1-2.5 min of a worker): the full tier (CI) runs them, the quick tier stays under 10 minutes
pytestmark = pytest.mark.slow

PROMPT = "a red fox running through the snow"
SEED, SIZE, FRAMES = 5, 32, 9
BOUNDARY = 0.9  # models/wan2.2-tiny-i2v.dsl's boundary_ratio (Wan2.2-I2V-A14B's)
_y, _x = np.mgrid[0:SIZE, 0:SIZE]
IMAGE = np.stack([_x * 8, _y * 7, (_x * _y) % 256], -1).astype(np.uint8)


@pytest.fixture(scope="module")
def art(tmp_path_factory):
    module = planned_tiny(REPO / "models" / "wan2.2-tiny-i2v.dsl")
    ckpt = random_checkpoint(module)
    return compile_art(module, ckpt, tmp_path_factory.mktemp("wan22-i2v")), ckpt


@pytest.fixture(scope="module")
def reference_pipe(art):
    pipe = wan_i2v_pipeline(art[1])  # model_index.json: boundary_ratio, transformer_2
    assert pipe.transformer_2 is not None and pipe.image_encoder is None
    assert pipe.config.boundary_ratio == BOUNDARY and pipe.transformer.config.image_dim is None
    return pipe


def reference(pipe, steps: int, guidance: float, guidance_2: float | None, calls: list) -> np.ndarray:
    from diffusers.utils import load_image

    hooks = [getattr(pipe, name).register_forward_hook(lambda *_, n=name: calls.append(n))
             for name in ("transformer", "transformer_2")]
    try:
        out = pipe(image=load_image(Image.open(io.BytesIO(png(IMAGE)))), prompt=PROMPT, height=SIZE, width=SIZE,
                   num_frames=FRAMES, num_inference_steps=steps, guidance_scale=guidance,
                   guidance_scale_2=guidance_2, max_sequence_length=16,
                   generator=torch.Generator("cpu").manual_seed(SEED), output_type="np")
    finally:
        for hook in hooks:
            hook.remove()
    return (out.frames[0] * 255).round().astype(np.uint8)


@pytest.fixture(scope="module")
def runner(art):
    from difflet.runtime.runner import ModelRunner

    return ModelRunner.from_artifacts(art[0])


def _served(runner, calls: list, image=IMAGE, **values):
    programs = dict(runner.env.programs)
    for name in ("transformer", "transformer_2"):
        runner.env.programs[name] = lambda *a, p=programs[name], n=name: calls.append(n) or p(*a)
    try:
        _, result = runner._run(runner.resolve(prompt=PROMPT, seed=SEED, image=png(image), **values))
    finally:
        runner.env.programs.update(programs)
    return result.video


# the profile's 4 steps (switch after 1) and 3 with other scales (switch after 1 of 3); test_wan22.py
# holds the switch to WanPipeline's at 3 step counts for the same loop
@pytest.mark.parametrize("steps,guidance,guidance_2", [(None, None, None), (3, 5.0, 1.5)])
def test_served_equals_the_pipeline_with_the_expert_switch_at_its_step(runner, reference_pipe, steps,
                                                                       guidance, guidance_2):
    calls: list = []
    video = _served(runner, calls, steps=steps, guidance=guidance, guidance_2=guidance_2)
    params = runner.resolve(prompt=PROMPT, seed=SEED, image=png(IMAGE), steps=steps, guidance=guidance,
                            guidance_2=guidance_2)
    ref_calls: list = []
    ref = reference(reference_pipe, params.steps, params.guidance, params.guidance_2, ref_calls)
    print(f"steps {params.steps}: {describe_match(video, ref)}; experts {calls}")
    assert calls == ref_calls  # both passes of each step on the same expert as the pipeline
    assert 0 < calls.count("transformer") < len(calls)  # the switch falls inside the run
    assert video.shape == ref.shape == (FRAMES, SIZE, SIZE, 3) and video.std() > 0
    assert_images_close(video, ref, what=f"wan2.2 i2v at {params.steps} steps")


def test_the_image_conditions_the_video(runner):
    """Not a vacuous match: another image moves the video past the closeness rule, so the
    equality above could not hold with the image dropped (random tiny weights: a small move)."""
    from oracle_util import images_close

    a = _served(runner, [], steps=3)
    b = _served(runner, [], image=255 - IMAGE, steps=3)
    assert not images_close(a, b), describe_match(a, b)


def test_the_checkpoint_names_the_description(art):
    from difflet.frontend.discover import description_for

    index = json.loads((art[1] / "model_index.json").read_text())
    assert index["_class_name"] == "WanImageToVideoPipeline" and index["boundary_ratio"] == BOUNDARY
    assert description_for(str(art[1])).name == "wan2.2-i2v-a14b.dsl"
