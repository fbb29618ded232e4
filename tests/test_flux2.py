"""FLUX.2 [klein] (flux2-tiny: Flux2KleinPipeline's real classes at toy size) served by Difflet
equals diffusers' Flux2KleinPipeline.

Oracles, all loaded from the same random:0 checkpoint: the whole Flux2KleinPipeline called with
its default arguments (size, steps and the text length set to the tiny profile's), its own
`encode_prompt` (the stacked Qwen3 layers), and its latents before decoding. The programs are the
AOTInductor-compiled ones (codegen, shared test store).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from difflet.errors import DiffletError
from oracle_util import assert_images_close, compile_art, images_close, planned_tiny, random_checkpoint

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "models" / "flux2-tiny.dsl"
T = 32  # max_text


@pytest.fixture(scope="module")
def module():
    return planned_tiny(TINY)


@pytest.fixture(scope="module")
def ckpt(module):
    return random_checkpoint(module)


@pytest.fixture(scope="module")
def art(module, ckpt, tmp_path_factory):
    return compile_art(module, ckpt, tmp_path_factory.mktemp("flux2-tiny-art"))


@pytest.fixture(scope="module")
def runner(art):
    from difflet.runtime.runner import ModelRunner

    return ModelRunner.from_artifacts(art)


@pytest.fixture(scope="module")
def pipe(ckpt):
    from diffusers import Flux2KleinPipeline

    pipe = Flux2KleinPipeline.from_pretrained(str(ckpt))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _reference(pipe, params, output_type="np"):
    return pipe(prompt=params.prompt, guidance_scale=params.guidance, num_inference_steps=params.steps,
                generator=torch.Generator("cpu").manual_seed(params.seed), height=params.height,
                width=params.width, max_sequence_length=T, output_type=output_type).images


def _as_pipeline_latents(pipe, tokens: torch.Tensor) -> torch.Tensor:
    """Difflet's final latents (normalized, patchified tokens) as the pipeline's output_type="latent"."""
    z = tokens.permute(0, 2, 1).reshape(1, tokens.shape[-1], 8, 8)
    bn = pipe.vae.bn
    z = z * torch.sqrt(bn.running_var.view(1, -1, 1, 1) + pipe.vae.config.batch_norm_eps) + bn.running_mean.view(1, -1, 1, 1)
    return pipe._unpatchify_latents(z)


def _count_calls(runner) -> list:
    """The component names of every program call the runner makes from here on (undo: del env.invoke)."""
    calls, invoke = [], runner.env.invoke

    def counted(name, **values):
        calls.append(name)
        return invoke(name, **values)

    runner.env.invoke = counted
    return calls


CASES = [  # prompt, seed, steps, guidance (None: the profile's 4 steps, CFG 4.0)
    ("a red fox in the snow", 42, None, None),
    ("blue circle on a white background", 7, 3, 2.5),
    ("a small cat sitting on a big red box", 3, 2, 1.0),  # guidance 1: no CFG, one call a step
]


@pytest.mark.slow  # compiles flux2-tiny's programs (~2 min): full suite only
@pytest.mark.parametrize("prompt,seed,steps,guidance", CASES)
def test_generate_equals_flux2kleinpipeline(runner, pipe, prompt, seed, steps, guidance):
    from difflet.runtime.schedule import run_schedule

    params = runner.resolve(prompt=prompt, seed=seed, steps=steps, guidance=guidance)
    result = runner.generate(params)
    ref = (_reference(pipe, params)[0] * 255).round().astype("uint8")
    assert result.image.shape == ref.shape == (32, 32, 3) and result.png and result.image.std() > 0
    assert_images_close(result.image, ref, what=f"{prompt!r} vs Flux2KleinPipeline")
    # random tiny weights move pixels little, so the latents are held too: what denoising added to
    # the noise, relative (a wrong guidance, shift or text row moves it by > 1e-2)
    calls = _count_calls(runner)
    try:
        ours = _as_pipeline_latents(pipe, run_schedule(runner.env, params).values["latents"])
    finally:
        del runner.env.invoke
    want = _reference(pipe, params, output_type="latent")
    noise = _as_pipeline_latents(pipe, torch.randn(1, 16, 8, 8, generator=torch.Generator("cpu").manual_seed(seed))
                                 .reshape(1, 16, 64).permute(0, 2, 1))
    rel = ((ours - want).norm() / (want - noise).norm()).item()
    print(f"  latents: relative error of the denoising update {rel:.2e}")
    assert (want - noise).norm() > 0.1 and rel < 1e-4
    passes = 2 if params.guidance > 1 else 1
    assert calls.count("transformer") == passes * params.steps


@pytest.mark.slow  # compiles flux2-tiny's programs (~2 min): full suite only
def test_text_features_equal_the_pipelines(runner, pipe):
    """The encoder program (input_ids + valid_text) equals encode_prompt's stacked layers 9, 18, 27
    on every row, padding rows included (the transformer attends them)."""
    from difflet.families.flux2.host import encode_text

    for prompt in ("a red fox", "a small cat sitting on a big red box in the snow near a tall tree"):
        ours = encode_text(runner.env, runner.env.component("text_encoder"), prompt)
        want, _ = pipe.encode_prompt(prompt=prompt, device="cpu", max_sequence_length=T)
        assert ours.shape == want.shape == (1, T, 96)
        err = (ours - want).abs().max().item()
        assert err < 1e-5 * want.abs().max().item(), err  # fp32 end to end: rounding only


def test_prompt_template_is_the_tokenizers(pipe):
    """Admission counts FACTS' template; the host renders the tokenizer's own: they agree."""
    from difflet.families import facts

    for prompt in ("a red fox", "two dogs\nrunning"):
        rendered = pipe.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                      add_generation_prompt=True, enable_thinking=False)
        assert facts("flux2").prompt_text(prompt, True) == rendered


@pytest.mark.slow  # compiles flux2-tiny's programs (~2 min): full suite only
def test_negative_prompt_and_guidance_change_the_output(runner):
    base = dict(prompt="a red fox in the snow", seed=5, steps=2)
    a = runner.generate(runner.resolve(**base)).image
    b = runner.generate(runner.resolve(**base, negative_prompt="green tree")).image
    c = runner.generate(runner.resolve(**base, guidance=1.0, negative_prompt="green tree")).image
    d = runner.generate(runner.resolve(**base, guidance=1.0)).image
    assert not images_close(a, b)  # a request's negative prompt replaces the pipeline's "" (Difflet's extension)
    assert np.array_equal(c, d)  # without CFG it is ignored: same program and inputs, so exact


def _variant(tmp_path, old, new):
    text = TINY.read_text()
    assert text.count(old) == 1
    path = tmp_path / "variant.dsl"
    path.write_text(text.replace(old, new))
    return path


@pytest.mark.slow  # compiles flux2-tiny's programs (~2 min): full suite only
def test_distilled_description_runs_one_pass(runner, pipe, tmp_path):
    """Mode "none" (a step-distilled checkpoint) runs one pass whatever the guidance, as the
    pipeline with is_distilled does, and its materialized checkpoint says is_distilled."""
    from difflet.families.flux2.programs import index_config

    distilled = planned_tiny(_variant(tmp_path, 'mode: "cfg"', 'mode: "none"'))
    assert index_config(distilled) == {"is_distilled": True}
    assert index_config(runner.module) == {"is_distilled": False}
    from difflet.runtime.host.env import HostEnv
    from difflet.runtime.schedule import run_schedule

    env = HostEnv(distilled, runner.env.programs, runner.env.host_dir)
    calls = []
    invoke = env.invoke
    env.invoke = lambda name, **values: (calls.append(name), invoke(name, **values))[1]
    params = runner.resolve(prompt="a red fox", seed=1, steps=2, guidance=4.0)
    state = run_schedule(env, params)
    assert calls.count("transformer") == 2 and "uncond" not in state.values
    pipe.register_to_config(is_distilled=True)
    try:
        ref = (_reference(pipe, params)[0] * 255).round().astype("uint8")
    finally:
        pipe.register_to_config(is_distilled=False)
    assert_images_close(state.image, ref, what="distilled vs Flux2KleinPipeline(is_distilled)")


def test_description_is_chosen_by_is_distilled(tmp_path):
    from difflet.families import facts

    for distilled, name in ((True, "flux2-klein-4b"), (False, "flux2-klein-base-4b")):
        (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "Flux2KleinPipeline",
                                                              "is_distilled": distilled}))
        assert facts("flux2").description(tmp_path) == name
        assert (REPO / "models" / f"{name}.dsl").is_file()


@pytest.mark.slow  # compiles flux2-tiny's programs (~2 min): full suite only
def test_refusals_name_the_place(tmp_path, runner):
    from difflet.frontend.lower import lower_file

    bad = _variant(tmp_path, "input  z: dtype[1, 16,", "input  z: dtype[1, 4,")
    with pytest.raises(DiffletError, match=r"decoder input 'z' has 4 channels but the config's latent_channels "
                                           r"x patch area is 4 x 4") as err:
        lower_file(str(bad))
    assert "variant.dsl:" in str(err.value)
    with pytest.raises(DiffletError, match="supports guidance modes 'cfg' and 'none', not 'embedded'"):
        from difflet.runtime.host.env import HostEnv
        from difflet.runtime.schedule import run_schedule

        embedded = planned_tiny(_variant(tmp_path, 'mode: "cfg"', 'mode: "embedded"'))
        run_schedule(HostEnv(embedded, runner.env.programs, runner.env.host_dir),
                     runner.resolve(prompt="a fox", seed=0))


@pytest.mark.slow  # compiles the cfg2 program and serves it on two rank processes
def test_cfg2_layout_served_equals_the_pipeline(pipe, ckpt, tmp_path):
    """tp1+cfg2: the guidance passes on their own ranks (the conditional text on one, the negative
    on the other: `cfg_branch`), one program call a step, equal to the pipeline."""
    from difflet.frontend.lower import lower_file
    from difflet.passes.built import reasons
    from difflet.passes.pipeline import optimize
    from difflet.runtime.runner import ModelRunner

    module = optimize(lower_file(str(TINY)), parallel="tp1+cfg2", target="cpu", backend="inductor")
    assert reasons(module) == []
    with ModelRunner.from_artifacts(compile_art(module, ckpt, tmp_path / "cfg2")) as runner:
        params = runner.resolve(prompt="a red fox in the snow", seed=11, steps=3)
        calls = _count_calls(runner)
        image = runner.generate(params).image
    assert calls.count("transformer") == params.steps  # both passes in one call
    ref = (_reference(pipe, params)[0] * 255).round().astype("uint8")
    assert_images_close(image, ref, what="tp1+cfg2 vs Flux2KleinPipeline")


@pytest.mark.slow  # starts a real server (model process + HTTP front)
def test_served_over_http_equals_the_pipeline(art, runner, pipe):
    """POST /v1/images/generations through difflet-runtime's HTTP front: the PNG it returns is the
    pipeline's image (defaults: CFG 4.0 with the empty negative prompt, the profile's 4 steps)."""
    import base64
    import io

    from PIL import Image

    from difflet.runtime.demo import stop_server
    from http_util import call_json, start_http_server

    proc, _, http_address = start_http_server(art)
    try:
        status, reply = call_json(http_address, "POST", "/v1/images/generations",
                                  {"prompt": "a red fox in the snow", "seed": 9, "response_format": "b64_json"})
    finally:
        assert stop_server(proc) == 0
    assert status == 200, reply
    image = np.asarray(Image.open(io.BytesIO(base64.b64decode(reply["data"][0]["b64_json"]))).convert("RGB"))
    ref = (_reference(pipe, runner.resolve(prompt="a red fox in the snow", seed=9))[0] * 255).round().astype("uint8")
    assert_images_close(image, ref, what="served over HTTP vs Flux2KleinPipeline")
