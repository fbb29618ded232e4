"""Wan 2.2 A14B's two experts (models/wan2.2-tiny.dsl) served equal to diffusers' WanPipeline with
`transformer_2` and `boundary_ratio` from the same random:0 checkpoint (issue 30).

Oracles: WanPipeline over that checkpoint with the same prompt, seed, steps and both guidance
scales, every frame under the closeness rule of tests/oracle_util.py (compiled vs eager float
programs; an expert run at the other's steps, or the other's scale, moves the video by far more:
the test checks that too); each expert's calls counted on both sides by forward hooks.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import REPO
from oracle_util import assert_images_close, compile_art, describe_match, planned_tiny, random_checkpoint

PROMPT = "a red fox running through the snow"
BOUNDARY = 0.875  # models/wan2.2-tiny.dsl's boundary_ratio (Wan2.2-T2V-A14B's)


@pytest.fixture(scope="module")
def art(tmp_path_factory):
    module = planned_tiny(REPO / "models" / "wan2.2-tiny.dsl")
    ckpt = random_checkpoint(module)
    return compile_art(module, ckpt, tmp_path_factory.mktemp("wan22")), ckpt


@pytest.fixture(scope="module")
def reference_pipe(art):
    from diffusers import WanPipeline

    pipe = WanPipeline.from_pretrained(str(art[1]), boundary_ratio=BOUNDARY)  # loads transformer_2 too
    assert pipe.transformer_2 is not None
    pipe.set_progress_bar_config(disable=True)
    return pipe


def reference(pipe, seed: int, steps: int, guidance: float, guidance_2: float | None, calls: list) -> np.ndarray:
    """WanPipeline's uint8 frames; `calls` gets the expert of every transformer call, in order."""
    hooks = [getattr(pipe, name).register_forward_hook(lambda *_, n=name: calls.append(n))
             for name in ("transformer", "transformer_2")]
    try:
        out = pipe(PROMPT, generator=torch.Generator("cpu").manual_seed(seed), num_inference_steps=steps,
                   guidance_scale=guidance, guidance_scale_2=guidance_2, height=32, width=32, num_frames=9,
                   max_sequence_length=16, output_type="np")
    finally:
        for hook in hooks:
            hook.remove()
    return (out.frames[0] * 255).round().astype(np.uint8)


def counting(runner, calls: list) -> None:
    """Wrap both experts' programs so `calls` gets the expert of every call, in order."""
    for name in ("transformer", "transformer_2"):
        program = runner.env.programs[name]
        runner.env.programs[name] = lambda *a, p=program, n=name: calls.append(n) or p(*a)


@pytest.mark.parametrize("steps,guidance,guidance_2", [
    (None, None, None),  # the profile's: 4 steps, 4.0 high-noise, 3.0 low-noise
    (6, 5.0, None),      # guidance alone sets both (WanPipeline's guidance_scale_2=None)
    (9, 4.0, 1.5),       # a low-noise scale of its own
])
def test_each_expert_runs_its_steps_at_its_scale_equal_to_wanpipeline(art, reference_pipe, steps, guidance,
                                                                      guidance_2):
    """At three step counts the switch falls where the pipeline's does: the same expert for every
    call, in order (cond and uncond of each step)."""
    from difflet.runtime.runner import ModelRunner

    calls: list = []
    with ModelRunner.from_artifacts(art[0]) as runner:
        counting(runner, calls)
        params = runner.resolve(prompt=PROMPT, seed=11, steps=steps, guidance=guidance, guidance_2=guidance_2)
        result = runner.generate(params)
    request = params.request
    assert (request.guidance, request.guidance_2) == ((4.0, 3.0) if guidance is None else
                                                      (guidance, guidance if guidance_2 is None else guidance_2))
    ref_calls: list = []
    ref = reference(reference_pipe, 11, request.steps, request.guidance, request.guidance_2, ref_calls)
    print(f"wan2.2 two experts, {request.steps} steps, vs WanPipeline: {describe_match(result.video, ref)}; "
          f"experts {''.join('H' if c == 'transformer' else 'L' for c in calls[::2])}")
    assert_images_close(result.video, ref, "wan2.2 video vs WanPipeline")
    assert calls == ref_calls and len(calls) == 2 * request.steps
    assert "transformer" in calls and "transformer_2" in calls  # the switch falls inside the steps


def test_served_by_difflet_runtime_equals_wanpipeline(art, reference_pipe):
    """Through the real server (gRPC, --lossless-video so the MP4 frames are the generated ones):
    the profile's defaults and a request's guidance_2."""
    from difflet.runtime import client
    from difflet.runtime.demo import start_server, stop_server
    from difflet.runtime.media import decode_mp4

    proc, address = start_server(art[0], args=("--lossless-video",))
    try:
        served = [decode_mp4(client.generate(address, PROMPT, 5, timeout=600, **kw).mp4)[0]
                  for kw in ({}, {"guidance_2": 1.5})]
    finally:
        assert stop_server(proc) == 0
    for frames, guidance_2 in zip(served, (3.0, 1.5)):
        assert_images_close(frames, reference(reference_pipe, 5, 4, 4.0, guidance_2, []),
                            f"served wan2.2, guidance_2 {guidance_2}")


def test_the_experts_and_the_low_noise_scale_matter(art):
    """Guards against a vacuous match: swapping in the other expert's weights, or another
    low-noise scale, changes the video."""
    from difflet.runtime.runner import ModelRunner

    with ModelRunner.from_artifacts(art[0]) as runner:
        def video(**kw):
            return runner.generate(runner.resolve(prompt=PROMPT, seed=11, **kw)).video.astype(int)

        base, other_scale = video(), video(guidance_2=1.5)
        runner.env.programs["transformer_2"] = runner.env.programs["transformer"]  # one expert for all steps
        one_expert = video()
    assert np.abs(base - other_scale).mean() > 1 and np.abs(base - one_expert).mean() > 1


def test_a_one_denoiser_model_refuses_guidance_2():
    from difflet.errors import DiffletError
    from difflet.runtime.validate import resolve_request

    with pytest.raises(DiffletError) as err:
        resolve_request({"height": 32, "width": 32, "steps": 4, "guidance": 5.0}, prompt="p", guidance_2=2.0)
    assert err.value.where == "guidance_2" and "one denoiser" in err.value.message


def test_the_step_cache_restarts_at_the_expert_switch(art):
    """A cached step's estimate extrapolates the last full outputs; across the switch those are the
    other expert's, so the cache restarts there: the switch step and the next are full (then
    cadence:2 caches again). The switch is WanPipeline's: its scheduler's first t < boundary."""
    from diffusers import UniPCMultistepScheduler

    from difflet.runtime.runner import ModelRunner

    scheduler = UniPCMultistepScheduler.from_pretrained(str(art[1] / "scheduler"))
    scheduler.set_timesteps(16)
    switch = next(i for i, t in enumerate(scheduler.timesteps) if t < BOUNDARY * 1000)
    with ModelRunner.from_artifacts(art[0]) as runner:
        schedule = runner.generate(runner.resolve(prompt=PROMPT, seed=1, steps=16, cache="cadence:2")).stats["schedule"]
    print(f"switch at step {switch}: {schedule}")
    assert 0 < switch < 15 and schedule[switch:switch + 2] == "FF" and "C" in schedule[switch + 2:]


@pytest.mark.slow  # compiles two-rank programs of both experts (cfg2 takes the same twins path as Wan 2.1's)
@pytest.mark.parametrize("parallel", ["tp2"])
def test_both_experts_split_and_cfg_parallel_equal_wanpipeline(art, reference_pipe, tmp_path, parallel):
    """Each expert is planned and built at the layout (its own rank programs) and served equal to
    the pipeline, each expert on the pipeline's share of the steps."""
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize
    from difflet.runtime.runner import ModelRunner

    module = optimize(lower_file(str(REPO / "models" / "wan2.2-tiny.dsl")), parallel=parallel, target="cpu",
                      backend="inductor")
    assert str(random_checkpoint(module)) == str(art[1])
    with ModelRunner.from_artifacts(compile_art(module, art[1], tmp_path / "split")) as runner:
        calls: list = []
        counting(runner, calls)
        video = runner.generate(runner.resolve(prompt=PROMPT, seed=11, steps=6)).video
    ref_calls: list = []
    ref = reference(reference_pipe, 11, 6, 4.0, 3.0, ref_calls)
    assert_images_close(video, ref, f"wan2.2 {parallel} vs WanPipeline")
    # the layout changes calls per pass (cfg2: one for both; tp: one per rank), not which expert runs
    high, low = calls.count("transformer"), calls.count("transformer_2")
    assert high > 0 and high * ref_calls.count("transformer_2") == low * ref_calls.count("transformer")
