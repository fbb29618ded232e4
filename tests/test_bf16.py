"""bf16 end to end: flux-tiny-bf16 and wan2.1-tiny-bf16 compiled (AOTInductor) and served by
Difflet's runner against diffusers' FluxPipeline / WanPipeline and their component classes, in bf16,
on the same random:0 checkpoint.

Per program: cosine similarity of the program's output and the bf16 module's. Inductor compiles with
emulate_precision_casts (difflet/codegen/inductor.py), so a fused kernel rounds to bf16 wherever
eager rounds an op's output: the transformer programs are then eager's computation (measured bit
equal on this machine, cos 1.0), held to cos >= 0.99999; without the flag they were at 0.99985 from
eager (closer to the fp32 maths, further from what diffusers serves), and at real size that drift
compounded over 4 steps at CFG 5 to 24-26 dB from WanPipeline (README, Real size).

Served output is held to the bf16 pipeline with the bound BF16_MIN_PSNR / BF16_MAX_DIFF: it still
differs from it where the text encoders and VAE programs do (cos >= 0.9999, not bit equal).
Measured on this machine: served FLUX images at 50.7 / 48.8 dB (max |diff| 2 / 3), the Wan video
at 51.3 dB (max 5); wrong settings at <= 45.6 dB with max |diff| >= 6 (guidance + 0.5: 43.4 / 43.7
dB, max 8 / 7; another negative prompt: 34.0 dB, max 39; before the flag, against the fp32
pipeline: guidance + 0.5 / + 1.5, shift + 2, seed + 1 all <= 45.6 dB). Each served test also runs
one wrong setting and shows it fails the bound.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import REPO
from oracle_util import compile_art, image_match, planned_tiny, random_checkpoint

pytestmark = pytest.mark.slow  # compiles whole split / bucketed / bf16 models: full suite only

FLUX_BF16_DSL = REPO / "models" / "flux-tiny-bf16.dsl"
PROMPT = "a red fox in the snow"


BF16_MIN_PSNR = 47.0  # served vs the bf16 pipeline measured >= 48.8 dB, wrong settings <= 45.6 dB
BF16_MAX_DIFF = 5  # measured <= 5, wrong settings >= 6


def bf16_close(got: np.ndarray, ref: np.ndarray) -> tuple[bool, str]:
    worst, same, db = image_match(got, ref)
    return worst <= BF16_MAX_DIFF and db >= BF16_MIN_PSNR, \
        f"max |diff| {worst} (allowed {BF16_MAX_DIFF}), PSNR {db:.1f} dB (need {BF16_MIN_PSNR}), {100 * same:.1f}% identical"


def cos(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().flatten(), b.double().flatten()
    return float(a @ b / (a.norm() * b.norm()))


@pytest.fixture(scope="module")
def module():
    return planned_tiny(FLUX_BF16_DSL)


@pytest.fixture(scope="module")
def ckpt(module):
    return random_checkpoint(module)


@pytest.fixture(scope="module")
def art(module, ckpt, tmp_path_factory):
    return compile_art(module, ckpt, tmp_path_factory.mktemp("flux-tiny-bf16-art"))


@pytest.fixture(scope="module")
def programs(art):
    from difflet.codegen.artifacts import load_artifacts

    return load_artifacts(art).programs


@pytest.fixture(scope="module")
def pipe(ckpt):
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(str(ckpt), torch_dtype=torch.bfloat16)
    pipe.set_progress_bar_config(disable=True)
    assert pipe.transformer.dtype == torch.bfloat16
    return pipe


def run(program, *inputs):
    with torch.inference_mode():
        return program(*inputs)


def test_text_encoder_programs_match_bf16_encoders(programs, pipe):
    ids = pipe.tokenizer([PROMPT], padding="max_length", max_length=16, truncation=True,
                         return_tensors="pt").input_ids
    ids2 = pipe.tokenizer_2([PROMPT], padding="max_length", max_length=32, truncation=True,
                            return_tensors="pt").input_ids
    with torch.no_grad():
        want = pipe.text_encoder(ids).pooler_output
        want2 = pipe.text_encoder_2(ids2).last_hidden_state
    (got,) = run(programs["text_encoder"], ids)
    (got2,) = run(programs["text_encoder_2"], ids2)
    assert got.dtype == got2.dtype == torch.bfloat16
    assert cos(got, want) >= 0.9999 and cos(got2, want2) >= 0.9999


def test_transformer_program_rounds_as_eager_bf16(programs, pipe):
    from diffusers import FluxPipeline

    from difflet.families.flux.host import rope_tables

    g = torch.Generator().manual_seed(1)
    bf = torch.bfloat16
    x = torch.randn(1, 64, 16, generator=g).to(bf)
    text = torch.randn(1, 32, 32, generator=g).to(bf)
    pooled = torch.randn(1, 32, generator=g).to(bf)
    img_ids = FluxPipeline._prepare_latent_image_ids(1, 8, 8, "cpu", bf)  # what FluxPipeline passes in bf16
    txt_ids = torch.zeros(32, 3, dtype=bf)
    img_rope, txt_rope = rope_tables((4, 6, 6), 8, 8, 32, bf, bf)  # the program's: the host's tables
    guidance = torch.tensor([3.5])
    for t in (1.0, 0.5, 0.02):
        timestep = torch.tensor([t], dtype=bf)
        with torch.no_grad():
            eager = pipe.transformer(hidden_states=x, encoder_hidden_states=text, pooled_projections=pooled,
                                     timestep=timestep, img_ids=img_ids, txt_ids=txt_ids, guidance=guidance,
                                     return_dict=False)[0]
        (got,) = run(programs["transformer"], x, text, pooled, timestep, img_rope, txt_rope, guidance,
                     torch.tensor(32))
        assert got.dtype == torch.bfloat16
        assert cos(got, eager) >= 0.99999, t  # measured 1.0; once-per-kernel rounding was 0.99985


def test_vae_program_matches_bf16_decode(programs, pipe):
    z = (torch.randn(1, 4, 16, 16, generator=torch.Generator().manual_seed(2)) * 1.5).to(torch.bfloat16)
    with torch.no_grad():
        want = pipe.vae.decode(z).sample
    (got,) = run(programs["vae"], z)
    assert got.dtype == torch.bfloat16 and cos(got, want) >= 0.9999


@pytest.mark.parametrize("seed,steps,guidance", [(42, None, None), (7, 2, 1.0)])
def test_served_image_matches_bf16_fluxpipeline(art, pipe, seed, steps, guidance):
    from difflet.runtime.runner import ModelRunner

    runner = ModelRunner.from_artifacts(art)
    params = runner.resolve(prompt=PROMPT, seed=seed, steps=steps, guidance=guidance)
    ours = runner.generate(params).image

    def reference(guidance_scale: float) -> np.ndarray:
        return np.asarray(pipe(PROMPT, generator=torch.Generator("cpu").manual_seed(seed),
                               num_inference_steps=params.steps, guidance_scale=guidance_scale,
                               height=32, width=32, max_sequence_length=32, output_type="pil").images[0])

    ref = reference(params.guidance)
    assert ours.shape == ref.shape == (32, 32, 3) and ours.std() > 0
    ok, figures = bf16_close(ours, ref)
    assert ok, figures
    wrong_ok, wrong = bf16_close(ours, reference(params.guidance + 0.5))
    assert not wrong_ok, f"guidance + 0.5 is inside the bound: {wrong}"


WAN_BF16_DSL = REPO / "models" / "wan2.1-tiny-bf16.dsl"
WAN_PROMPT = "a red fox running through the snow"


@pytest.fixture(scope="module")
def wan_art(tmp_path_factory):
    module = planned_tiny(WAN_BF16_DSL)
    ckpt = random_checkpoint(module)
    return compile_art(module, ckpt, tmp_path_factory.mktemp("wan-tiny-bf16-art")), ckpt


def test_wan_transformer_program_rounds_as_eager_bf16(wan_art):
    from diffusers import WanTransformer3DModel

    from difflet.codegen.artifacts import load_artifacts

    art, ckpt = wan_art
    program = load_artifacts(art).programs["transformer"]
    eager = WanTransformer3DModel.from_pretrained(str(ckpt), subfolder="transformer", torch_dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(1)
    latents = torch.randn(1, 4, 3, 4, 4, generator=g).to(torch.bfloat16)
    text = torch.randn(1, 16, 32, generator=g).to(torch.bfloat16)
    for t in (999.0, 12.0):  # 999: not a bf16 number (it rounds to 1000); WanPipeline passes it exactly
        timestep = torch.tensor([t], dtype=torch.float32)
        with torch.no_grad():
            e = eager(hidden_states=latents, timestep=timestep, encoder_hidden_states=text, return_dict=False)[0]
        (got,) = run(program, latents, timestep, text)
        assert got.dtype == torch.bfloat16
        assert cos(got, e) >= 0.99999, t  # measured 1.0


def test_wan_served_video_matches_bf16_wanpipeline(wan_art):
    """Text encoder and transformer bf16, VAE fp32 (as models/wan2.1.dsl), against WanPipeline
    loaded the same way."""
    from diffusers import WanPipeline

    from difflet.runtime.runner import ModelRunner

    art, ckpt = wan_art
    runner = ModelRunner.from_artifacts(art)
    params = runner.resolve(prompt=WAN_PROMPT, seed=42)
    video = runner.generate(params).video
    pipe = WanPipeline.from_pretrained(str(ckpt), torch_dtype=torch.bfloat16)
    pipe.vae.to(torch.float32)  # as wan2.1-tiny-bf16.dsl has it (and Wan 2.1's model card loads it)
    pipe.set_progress_bar_config(disable=True)

    def reference(negative_prompt: str | None) -> np.ndarray:
        out = pipe(WAN_PROMPT, negative_prompt=negative_prompt, generator=torch.Generator("cpu").manual_seed(42),
                   num_inference_steps=params.steps, guidance_scale=params.guidance, height=32, width=32,
                   num_frames=9, max_sequence_length=16, output_type="np")
        return (out.frames[0] * 255).round().astype(np.uint8)

    ref = reference(None)
    assert video.shape == ref.shape == (9, 32, 32, 3) and video.std() > 0
    ok, figures = bf16_close(video, ref)
    assert ok, figures
    wrong_ok, wrong = bf16_close(video, reference("a totally different negative"))
    assert not wrong_ok, f"another negative prompt is inside the bound: {wrong}"
