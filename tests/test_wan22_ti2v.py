"""Wan 2.2 TI2V-5B text to video (models/wan2.2-tiny-ti2v.dsl: Wan 2.2's residual, patchified VAE and
WanPipeline's expand_timesteps) served equal to diffusers' WanPipeline from the same random:0
checkpoint (issue 30).

Oracles: WanPipeline over that checkpoint (its model_index.json states expand_timesteps, as
Wan2.2-TI2V-5B-Diffusers' does) with the same prompt, seed, steps and guidance, every frame under
the closeness rule of tests/oracle_util.py (compiled vs eager float programs: the pipeline's
per-token t and the program's one t give the same modulation up to kernel rounding, while a
wrong VAE cache, patch order or t moves the video by far more); the pipeline's transformer calls
are checked to take the per-token t, so the match is not of the 1-d path with itself.
"""
from __future__ import annotations

import json

import pytest
import torch

from conftest import REPO
from oracle_util import assert_images_close, compile_art, describe_match, planned_tiny, random_checkpoint

PROMPT = "a paper boat drifting on a quiet pond"
TOKENS = 3 * 2 * 2  # latent frames x (64 / 16 / 2) ** 2 patches


@pytest.fixture(scope="module")
def art(tmp_path_factory):
    module = planned_tiny(REPO / "models" / "wan2.2-tiny-ti2v.dsl")
    ckpt = random_checkpoint(module)
    return compile_art(module, ckpt, tmp_path_factory.mktemp("wan22-ti2v")), ckpt


@pytest.fixture(scope="module")
def reference_pipe(art):
    from diffusers import WanPipeline

    pipe = WanPipeline.from_pretrained(str(art[1]))
    assert pipe.config.expand_timesteps is True and pipe.vae.config.patch_size == 2
    pipe.set_progress_bar_config(disable=True)
    return pipe


def reference(pipe, seed: int, steps: int, guidance: float, timesteps: list | None = None):
    """WanPipeline's uint8 frames; `timesteps` gets the shape of every transformer call's t."""
    import numpy as np

    hook = pipe.transformer.register_forward_pre_hook(
        lambda _, args, kwargs: timesteps.append(tuple(kwargs["timestep"].shape)), with_kwargs=True) \
        if timesteps is not None else None
    try:
        out = pipe(PROMPT, generator=torch.Generator("cpu").manual_seed(seed), num_inference_steps=steps,
                   guidance_scale=guidance, height=64, width=64, num_frames=9, max_sequence_length=16,
                   output_type="np")
    finally:
        if hook is not None:
            hook.remove()
    return (out.frames[0] * 255).round().astype(np.uint8)


@pytest.mark.slow  # the compiling module fixture `art` (~2 min of a worker): full tier only
@pytest.mark.parametrize("steps,guidance", [(None, None), (6, 3.0)])
def test_text_to_video_equals_wanpipeline_with_expand_timesteps(art, reference_pipe, steps, guidance):
    """The profile's (4 steps, guidance 5.0) and a request's own; the pipeline's transformer takes
    t per token ([1, 12]) at every call, the served program the one t."""
    from difflet.runtime.runner import ModelRunner

    with ModelRunner.from_artifacts(art[0]) as runner:
        params = runner.resolve(prompt=PROMPT, seed=7, steps=steps, guidance=guidance)
        result = runner.generate(params)
    request = params.request
    assert (request.steps, request.guidance) == ((4, 5.0) if steps is None else (steps, guidance))
    shapes: list = []
    ref = reference(reference_pipe, 7, request.steps, request.guidance, shapes)
    print(f"wan2.2 ti2v, {request.steps} steps, vs WanPipeline: {describe_match(result.video, ref)}")
    assert result.video.shape == (9, 64, 64, 3) and result.video.std() > 10  # not a flat (clamped) video
    assert_images_close(result.video, ref, "wan2.2 ti2v video vs WanPipeline")
    assert shapes == [(1, TOKENS)] * (2 * request.steps)  # cond and uncond, t per token


@pytest.mark.slow  # the compiling module fixture `art` (~2 min of a worker): full tier only
def test_served_at_24_fps(art, reference_pipe):
    """Through the real server (gRPC, --lossless-video): the frames and the model's 24 fps."""
    from difflet.runtime import client
    from difflet.runtime.demo import start_server, stop_server
    from difflet.runtime.media import decode_mp4

    proc, address = start_server(art[0], args=("--lossless-video",))
    try:
        frames, fps = decode_mp4(client.generate(address, PROMPT, 5, timeout=600).mp4)
    finally:
        assert stop_server(proc) == 0
    assert fps == 24.0
    assert_images_close(frames, reference(reference_pipe, 5, 4, 5.0), "served wan2.2 ti2v")


@pytest.mark.slow  # the compiling module fixture `art` (~2 min of a worker): full tier only
def test_the_checkpoint_states_expand_timesteps_and_gets_the_ti2v_description(art):
    """A WanPipeline checkpoint whose model_index.json states expand_timesteps (Wan2.2-TI2V-5B-Diffusers)
    is described by wan2.2-ti2v-5b; Wan 2.1's states none."""
    from difflet.frontend.discover import description_for

    assert json.loads((art[1] / "model_index.json").read_text())["expand_timesteps"] is True
    assert description_for(str(art[1])).name == "wan2.2-ti2v-5b.dsl"
    one = random_checkpoint(planned_tiny(REPO / "models" / "wan2.1-tiny.dsl"))
    assert "expand_timesteps" not in json.loads((one / "model_index.json").read_text())
