"""qwen-image-tiny served end to end by Difflet equals diffusers' QwenImagePipeline.

Oracles, all loaded from the same random:0 checkpoint: transformers' Qwen2_5_VLForConditionalGeneration
(hidden_states[-1], the pipeline's text features), diffusers' QwenImageTransformer2DModel given the
trimmed, UNPADDED text (as the pipeline calls it), AutoencoderKLQwenImage.decode, and the whole
QwenImagePipeline with the same prompt, negative prompt, seed, steps, true_cfg_scale and size.
The programs are the AOTInductor-compiled ones (codegen, shared test store).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from difflet.errors import DiffletError
from oracle_util import assert_images_close, compile_art, images_close, planned_tiny, random_checkpoint

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "models" / "qwen-image-tiny.dsl"
TOL = 1e-4
T, DROP = 16, 34  # max_text, template tokens


@pytest.fixture(scope="module")
def module():
    return planned_tiny(TINY)


@pytest.fixture(scope="module")
def ckpt(module):
    return random_checkpoint(module)


@pytest.fixture(scope="module")
def runner(module, ckpt, tmp_path_factory):
    from difflet.runtime.runner import ModelRunner

    return ModelRunner.from_artifacts(compile_art(module, ckpt, tmp_path_factory.mktemp("qwen-image-tiny-art")))


@pytest.fixture(scope="module")
def pipe(ckpt):
    from diffusers import QwenImagePipeline

    pipe = QwenImagePipeline.from_pretrained(str(ckpt))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _program(runner, name, **values):
    return next(iter(runner.env.invoke(name, **values).values()))


def _template_ids(pipe, prompt, padded: bool):
    text = pipe.prompt_template_encode.format(prompt)
    kw = dict(padding="max_length", max_length=T + DROP) if padded else dict(padding=True)
    return pipe.tokenizer([text], truncation=True, return_tensors="pt", **kw)


@pytest.mark.parametrize("prompt", ["a red fox in the snow", " ", "two small blue birds flying over a "
                                    "green field near a river under a bright sky at night"])
def test_text_encoder_program_equals_qwen25vl(runner, pipe, prompt):
    """Program on right-padded ids (no mask) == the model on the pipeline's unpadded ids, on the
    valid rows: the causal LM never lets a valid position see padding."""
    padded = _template_ids(pipe, prompt, padded=True)
    valid = int(padded.attention_mask.sum())
    got = _program(runner, "text_encoder", input_ids=padded.input_ids)
    ref_ids = _template_ids(pipe, prompt, padded=False)
    with torch.no_grad():
        ref = pipe.text_encoder(input_ids=ref_ids.input_ids, attention_mask=ref_ids.attention_mask,
                                output_hidden_states=True).hidden_states[-1]
    n = min(valid, ref.shape[1])  # the long prompt is truncated at T + DROP tokens
    assert valid > DROP and n == valid
    err = (got[:, :n] - ref[:, :n]).abs().max().item()
    print(f"text encoder ({valid - DROP} prompt tokens): max abs {err:.2e}")
    assert err <= TOL


def test_denoiser_program_equals_diffusers_on_unpadded_text(runner, pipe):
    """Program (text zero-padded to T, valid_text) == diffusers given only the valid rows, as the
    pipeline calls it, at several valid lengths; the padding rows' contents change nothing."""
    gen = torch.Generator().manual_seed(1)
    latents = torch.randn(1, 64, 16, generator=gen)
    text = torch.randn(1, T, 32, generator=gen)
    t = torch.tensor([0.7])
    moved, errs = [], []
    for valid in (3, 9, T):
        with torch.no_grad():
            ref = pipe.transformer(hidden_states=latents, encoder_hidden_states=text[:, :valid], timestep=t,
                                   img_shapes=[[(1, 8, 8)]], return_dict=False)[0]
        got = _program(runner, "transformer", hidden_states=latents, encoder_hidden_states=text, timestep=t,
                       valid_text=valid)
        errs.append((got - ref).abs().max().item())
        if valid < T:
            other = text.clone()
            other[:, valid:] = torch.randn(1, T - valid, 32, generator=gen) * 5
            again = _program(runner, "transformer", hidden_states=latents, encoder_hidden_states=other,
                             timestep=t, valid_text=valid)
            assert torch.equal(got, again)  # same program; masked rows feed no valid row: exact
            moved.append((got - _program(runner, "transformer", hidden_states=latents,
                                         encoder_hidden_states=text, timestep=t, valid_text=T)).abs().max().item())
    print(f"denoiser max abs per valid_text (3, 9, {T}): {['%.2e' % e for e in errs]}")
    assert max(errs) <= TOL and min(moved) > 100 * max(max(errs), 1e-7)  # valid_text selects the keys


def test_vae_program_equals_autoencoder_decode(runner, pipe):
    z = torch.randn(1, 4, 1, 16, 16, generator=torch.Generator().manual_seed(2)) * 2.0
    got = _program(runner, "vae", z=z)
    with torch.no_grad():
        ref = pipe.vae.decode(z, return_dict=False)[0]
    err = (got - ref).abs().max().item()
    print(f"vae: max abs {err:.2e}")
    assert got.shape == (1, 3, 1, 64, 64) and err <= TOL


def _reference(pipe, params, negative, output_type="np"):
    out = pipe(params.prompt, negative_prompt=negative, true_cfg_scale=params.guidance,
               generator=torch.Generator("cpu").manual_seed(params.seed), num_inference_steps=params.steps,
               height=params.height, width=params.width, max_sequence_length=T, output_type=output_type)
    return out.images


CASES = [  # prompt, seed, steps, guidance, negative prompt (None = Difflet's default " ")
    ("a red fox in the snow", 42, None, None, None),
    ("blue circle on a white background", 7, 3, 2.5, "dark blurry picture"),
    ("a small cat sitting on a big red box", 3, 2, 1.0, None),  # guidance 1: no true CFG, one call
]


@pytest.mark.parametrize("prompt,seed,steps,guidance,negative", CASES)
def test_generate_equals_qwenimagepipeline(runner, pipe, prompt, seed, steps, guidance, negative):
    from difflet.runtime.schedule import run_schedule

    params = runner.resolve(prompt=prompt, seed=seed, steps=steps, guidance=guidance, negative_prompt=negative)
    result = runner.generate(params)
    ref = _reference(pipe, params, " " if negative is None else negative)
    ref = (ref[0] * 255).round().astype("uint8")
    assert result.image.shape == ref.shape == (64, 64, 3) and result.png and result.image.std() > 0
    assert_images_close(result.image, ref, what=f"{prompt!r} vs QwenImagePipeline")
    # latents: random tiny weights move pixels little, so compare what denoising added to the noise
    ours = run_schedule(runner.env, params).values["latents"]
    want = _reference(pipe, params, " " if negative is None else negative, output_type="latent")
    noise = pipe.prepare_latents(1, 4, 64, 64, torch.float32, "cpu", torch.Generator("cpu").manual_seed(seed))
    added, added_ref = ours - noise, want - noise
    rel = ((added - added_ref).norm() / added_ref.norm()).item()
    print(f"  latents: relative error of the denoising update {rel:.2e}")
    assert added_ref.norm() > 0.1 and rel < 1e-4


def test_negative_prompt_and_guidance_change_the_output(runner):
    base = dict(prompt="a red fox in the snow", seed=5, steps=2)
    a = runner.generate(runner.resolve(**base)).image
    b = runner.generate(runner.resolve(**base, negative_prompt="green tree")).image
    c = runner.generate(runner.resolve(**base, guidance=1.0, negative_prompt="green tree")).image
    d = runner.generate(runner.resolve(**base, guidance=1.0)).image
    assert not images_close(a, b)  # the negative prompt is encoded and used (moves more than rounding)
    # without true CFG it is ignored, as in the pipeline: same program and inputs, so exact
    assert np.array_equal(c, d)


def _variant(tmp_path, old, new):
    text = TINY.read_text()
    assert text.count(old) == 1
    path = tmp_path / "variant.dsl"
    path.write_text(text.replace(old, new))
    return planned_tiny(path)


def test_bad_guidance_mode_and_template_are_clear_errors(runner, tmp_path):
    from difflet.runtime.host.env import HostEnv
    from difflet.runtime.schedule import run_schedule

    params = runner.resolve(prompt="a cat", seed=0)
    cases = [('mode: "true_cfg"', 'mode: "embedded"', f"{tmp_path / 'variant.dsl'}:", "guidance modes 'true_cfg' and 'none'"),
             ("max_length max_text + template", "max_length max_text + template + 1", "template",
              "the denoiser's text length + template is 16 + 34")]
    for old, new, where, needle in cases:  # a bad mode names the denoise step's DSL line
        env = HostEnv(_variant(tmp_path, old, new), runner.env.programs, runner.env.host_dir)
        with pytest.raises(DiffletError) as err:
            run_schedule(env, params)
        assert str(err.value.where).startswith(where) and needle in err.value.message
    with pytest.raises(DiffletError) as err:
        runner.resolve(prompt="a cat", seed=0, negative_prompt=3)
    assert err.value.where == "negative_prompt"


def test_tiny_tokenizer_splits_the_template_like_qwen2tokenizer(pipe):
    """The pipeline drops a fixed 34 tokens: the tiny tokenizer must put the prompt right there."""
    ids = _template_ids(pipe, "a red fox", padded=False).input_ids[0]
    tokens = pipe.tokenizer.convert_ids_to_tokens(ids.tolist())
    assert tokens[DROP - 3:DROP + 3] == ["<|im_start|>", "user", "\n", "a", "red", "fox"]
    assert tokens[-5:] == ["<|im_end|>", "\n", "<|im_start|>", "assistant", "\n"]


def test_warm_up_and_step_caching_run_with_true_cfg(runner):
    assert runner.warm_up().png.startswith(b"\x89PNG")
    params = runner.resolve(prompt="a red fox in the snow", seed=1, steps=12, cache="cadence:2")
    result = runner.generate(params)
    assert result.stats["cached_steps"] > 0 and result.image.std() > 0
