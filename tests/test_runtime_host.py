"""The FLUX host schedule against diffusers' FluxPipeline, on uncompiled programs (fast, no gRPC).

Oracle: FluxPipeline.from_pretrained(the same random:0 checkpoint) with the same prompt, seed,
steps, guidance and size. The host runs the IR's schedule over codegen's eager programs, so any
difference is the host's (tokenizing, seeding, packing, timesteps, decode, postprocess).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from difflet.errors import DiffletError
from difflet.runtime.host import toolkit
from difflet.runtime.schedule import get_step
from difflet.runtime.runner import ModelRunner
from difflet.runtime.schedule import check_schedule
from difflet.runtime.validate import resolve_request
from oracle_util import assert_images_close


@pytest.fixture(scope="module")
def eager_runner(flux_tiny_module, flux_tiny_ckpt):
    from difflet.codegen.artifacts import eager_programs

    return ModelRunner(flux_tiny_module, eager_programs(flux_tiny_module, flux_tiny_ckpt), flux_tiny_ckpt)


@pytest.fixture(scope="module")
def reference_pipe(flux_tiny_ckpt):
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(str(flux_tiny_ckpt))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def reference_image(pipe, profile, prompt, seed, steps, guidance) -> np.ndarray:
    out = pipe(prompt, generator=torch.Generator("cpu").manual_seed(seed), num_inference_steps=steps,
               guidance_scale=guidance, height=profile["height"], width=profile["width"],
               max_sequence_length=profile["max_text"], output_type="pil")
    return np.asarray(out.images[0])


@pytest.mark.parametrize("prompt,seed,steps,guidance", [
    ("a red fox in the snow", 42, None, None),       # profile defaults (4 steps, 3.5)
    ("blue circle on a white background", 7, 2, 1.0),  # host overrides of steps and guidance
])
def test_schedule_matches_fluxpipeline(eager_runner, reference_pipe, prompt, seed, steps, guidance):
    params = eager_runner.resolve(prompt=prompt, seed=seed, steps=steps, guidance=guidance)
    ours = eager_runner.generate(params).image
    ref = reference_image(reference_pipe, eager_runner.profile, prompt, seed, params.steps, params.guidance)
    assert ours.shape == ref.shape == (32, 32, 3)
    assert ours.std() > 0
    # Difflet's attention processors replace diffusers' in our eager programs: rounding may differ
    assert_images_close(ours, ref, what="host schedule vs FluxPipeline")


def test_denoised_latents_match_fluxpipeline(eager_runner, reference_pipe):
    """Latent-level check: random tiny weights move the image little (a wrong timestep scale or
    guidance still gives PSNR > 40 dB), so compare what denoising added to the initial noise."""
    from difflet.runtime.schedule import run_schedule

    params = eager_runner.resolve(prompt="a red fox in the snow", seed=42, steps=3, guidance=2.5)
    state = run_schedule(eager_runner.env, params)
    kw = dict(num_inference_steps=params.steps, guidance_scale=params.guidance, height=32, width=32,
              max_sequence_length=32, output_type="latent")
    ref = reference_pipe(params.prompt, generator=torch.Generator("cpu").manual_seed(42), **kw).images
    noise, _ = reference_pipe.prepare_latents(1, 4, 32, 32, torch.float32, "cpu",
                                              torch.Generator("cpu").manual_seed(42))
    ours = state.values["latents"]
    assert ours.shape == ref.shape
    added_ref, added_ours = ref - noise, ours - noise
    assert added_ref.norm() > 1.0  # the denoiser really changed the latents
    rel = ((added_ours - added_ref).norm() / added_ref.norm()).item()
    assert rel < 1e-4, rel


def test_no_state_crosses_requests(eager_runner):
    a = eager_runner.resolve(prompt="a cat on a box", seed=3)
    b = eager_runner.resolve(prompt="a green tree", seed=4, steps=3)
    first = eager_runner.generate(a).png
    other = eager_runner.generate(b).png
    again = eager_runner.generate(a).png
    assert first == again  # same programs, same process, same request: exact by construction
    assert other != first


def test_pack_unpack_match_diffusers():
    from diffusers import FluxPipeline

    x = torch.randn(1, 4, 16, 12)
    packed = toolkit.pack_latents(x)  # exact: packing only moves values; the ids are small integers
    assert torch.equal(packed, FluxPipeline._pack_latents(x, 1, 4, 16, 12))
    assert torch.equal(toolkit.unpack_latents(packed, 16, 12), x)


def test_calculate_shift_matches_diffusers():
    from diffusers.pipelines.flux.pipeline_flux import calculate_shift

    for n in (64, 256, 4096, 6889):
        assert toolkit.calculate_shift(n, 256, 4096, 0.5, 1.15) == pytest.approx(calculate_shift(n, 256, 4096, 0.5, 1.15))


PROFILE = {"height": 32, "width": 32, "steps": 4, "guidance": 3.5}


def test_resolve_request_fills_profile_defaults():
    p = resolve_request(PROFILE, prompt="x", seed=5)
    assert (p.steps, p.guidance, p.height, p.width, p.seed) == (4, 3.5, 32, 32, 5)
    assert p.request_id


@pytest.mark.parametrize("field,kwargs,needle", [
    ("height", {"height": 64}, "height: 64 does not match the serving profile (32)"),
    ("width", {"width": 16}, "width: 16 does not match the serving profile (32)"),
    ("steps", {"steps": 0}, "steps: 0 is outside [1, 1000]"),
    ("steps", {"steps": 1001}, "steps: 1001 is outside"),
    ("guidance", {"guidance": float("inf")}, "guidance: inf must be finite"),
    ("guidance", {"guidance": -0.5}, "guidance: -0.5 must be finite and in [0, 100]"),
    ("prompt", {"prompt": "   "}, "prompt: must be a non-empty string"),
    ("seed", {"seed": -1}, "seed: -1 is outside"),
])
def test_resolve_request_rejects_naming_the_field(field, kwargs, needle):
    fields = {"prompt": "x", "seed": 0, **kwargs}
    with pytest.raises(DiffletError) as err:
        resolve_request(PROFILE, **fields)
    assert err.value.where == field
    assert needle in err.value.message


def test_unknown_step_and_missing_program_are_clear_errors(flux_tiny_module):
    with pytest.raises(DiffletError, match="not registered"):
        get_step("flux.upscale")
    with pytest.raises(DiffletError, match="no program"):
        check_schedule(flux_tiny_module, {"text_encoder": None, "text_encoder_2": None, "vae": None})


def test_invoke_checks_shapes_and_runtime_ranges(eager_runner):
    env = eager_runner.env
    good = dict(hidden_states=torch.zeros(1, 64, 16), encoder_hidden_states=torch.zeros(1, 32, 32),
                pooled_projections=torch.zeros(1, 32), timestep=torch.zeros(1), img_rope=torch.zeros(64, 32),
                txt_rope=torch.zeros(32, 32), guidance=torch.zeros(1))
    with pytest.raises(ValueError, match="outside the compiled range"):
        env.invoke("transformer", **good, valid_text=33)
    with pytest.raises(ValueError, match="shape"):
        env.invoke("transformer", **dict(good, hidden_states=torch.zeros(1, 65, 16)), valid_text=32)


def test_invoke_reuses_a_cast_only_for_the_same_unmodified_tensor():
    """A float32 host tensor passed again to a bfloat16 input reuses one cast from its second call
    on (a one-off input keeps no copy); modifying it in place, or passing an equal new tensor,
    casts again (the program sees the current values)."""
    from difflet.ir.nodes import Node, Op, TensorType, Value
    from difflet.runtime.invoke import bind_inputs

    component = Node(Op.COMPONENT, "c", body=(
        Node(Op.INPUT, "x", results=(Value("x", TensorType("bfloat16", (2, 3))),)),
        Node(Op.INPUT, "y", results=(Value("y", TensorType("float32", (2,))),))))
    memo: dict = {}
    x, y = torch.randn(2, 3), torch.zeros(2)
    first = bind_inputs(component, {"x": x, "y": y}, memo)
    assert memo["x"][2] is None and memo["y"] is None  # no copy kept after one call
    second = bind_inputs(component, {"x": x, "y": y}, memo)
    third = bind_inputs(component, {"x": x, "y": y}, memo)
    assert third[0] is second[0] and second[0].dtype == torch.bfloat16 and torch.equal(second[0], first[0])
    assert third[1] is y  # already the declared dtype: passed through
    x.mul_(2)  # in place: the version counter moves
    changed = bind_inputs(component, {"x": x, "y": y}, memo)
    assert changed[0] is not third[0] and torch.equal(changed[0], x.to(torch.bfloat16))
    fresh = bind_inputs(component, {"x": x.clone(), "y": y}, memo)
    assert fresh[0] is not changed[0] and torch.equal(fresh[0], changed[0])
