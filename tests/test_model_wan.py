"""wan2.1-tiny served by Difflet against diffusers' WanPipeline and its component classes.

Oracles: UMT5EncoderModel, WanTransformer3DModel and AutoencoderKLWan loaded from the same
random:0 checkpoint, and WanPipeline over that checkpoint run with the same prompt, seed, steps,
guidance, negative prompt and size, under oracle_util's closeness rule (measured: max |diff| <= 1,
99.996% identical in every case; guidance + 1.5, another negative prompt, flow_shift + 2 and seed + 1
measured 43.3-44.0, 34.4-39.9, 33.5-37.9 and 16 dB, max |diff| >= 10). The compiled programs are the ART's (AOTInductor), the
decoder runs as Difflet's first-chunk + chunk programs with explicit causal caches.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import REPO, shared_store_dir
from difflet.codegen.branches import torch_traces_cond
from difflet.errors import DiffletError
from difflet.ir.nodes import Op
from oracle_util import assert_images_close, compile_art, random_checkpoint

WAN_TINY_DSL = REPO / "models" / "wan2.1-tiny.dsl"
PROMPT = "a red fox running through the snow"


def _lower(text: str | None = None):
    from difflet.frontend.lower import lower_file, lower_text
    from difflet.passes.pipeline import optimize

    module = lower_file(str(WAN_TINY_DSL)) if text is None else lower_text(text, str(WAN_TINY_DSL))
    return optimize(module, parallel="tp1", target="cpu", backend="inductor")


@pytest.fixture(scope="module")
def module():
    return _lower()


@pytest.fixture(scope="module")
def ckpt(module):
    return random_checkpoint(module)


@pytest.fixture(scope="module")
def art(module, ckpt, tmp_path_factory):
    return compile_art(module, ckpt, tmp_path_factory.mktemp("wan-tiny-art"))


@pytest.fixture(scope="module")
def programs(art):
    from difflet.codegen.artifacts import load_artifacts

    return load_artifacts(art).programs


@pytest.fixture(scope="module")
def pipe(ckpt):
    from diffusers import WanPipeline

    pipe = WanPipeline.from_pretrained(str(ckpt))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def run(program, *inputs):
    with torch.inference_mode():
        return program(*inputs)


@pytest.mark.parametrize("prompt", [PROMPT, "a cat sitting on a big red box near the sea at night "
                                    "under the moon with two small birds flying over a boat"])
def test_text_encoder_program_equals_umt5_masked(programs, pipe, prompt):
    """valid_text < max_text (padding masked, rows zeroed) and == max_text (truncated)."""
    tok = pipe.tokenizer([prompt], padding="max_length", max_length=16, truncation=True,
                         return_attention_mask=True, return_tensors="pt")
    valid = int(tok.attention_mask.sum())
    with torch.no_grad():
        full = pipe.text_encoder(tok.input_ids, tok.attention_mask).last_hidden_state
    want = torch.cat([full[0, :valid], full.new_zeros(16 - valid, full.shape[-1])])[None]
    (got,) = run(programs["text_encoder"], tok.input_ids, torch.tensor(valid))
    assert (got - want).abs().max().item() <= 1e-4
    assert torch.equal(got[0, valid:], torch.zeros_like(got[0, valid:]))  # rows zeroed by the program: exact


def test_transformer_program_equals_diffusers(programs, pipe):
    gen = torch.Generator().manual_seed(1)
    latents = torch.randn(1, 4, 3, 4, 4, generator=gen)
    text = torch.randn(1, 16, 32, generator=gen)
    text[:, 9:] = 0  # zero-padded as the pipeline passes it
    for t in (999.0, 500.0, 12.0):
        timestep = torch.tensor([t])
        with torch.no_grad():
            want = pipe.transformer(hidden_states=latents, timestep=timestep,
                                    encoder_hidden_states=text, return_dict=False)[0]
        (got,) = run(programs["transformer"], latents, timestep, text)
        assert (got - want).abs().max().item() <= 1e-4


def test_chunked_vae_program_equals_autoencoder_decode(module, programs, pipe):
    """The chunk program over 3 latent frames, caches carried == AutoencoderKLWan.decode."""
    z = torch.randn(1, 4, 3, 4, 4, generator=torch.Generator().manual_seed(2)) * 1.5
    with torch.no_grad():
        want = pipe.vae.decode(z).sample
    caches = [torch.full(n.results[0].type.shape, 7.0) for n in module.component("vae").find(Op.INPUT)[2:]]
    out, *_ = run(programs["vae"], z[:, :, :1], torch.tensor(1), *caches)
    assert torch.equal(out[:, :, 1:], torch.zeros_like(out[:, :, 1:]))  # unused frames are zero-filled: exact
    frames = _chunked_decode(programs["vae"], module, z)
    assert frames.shape == want.shape == (1, 3, 9, 32, 32)
    assert (frames - want).abs().max().item() <= 1e-4


def _chunked_decode(program, module, z):
    """Decode latents [1, 4, T, h, w] chunk by chunk through the chunk program (caches carried);
    frame 0's cache inputs are garbage, which it must not read."""
    caches = [torch.full(n.results[0].type.shape, 7.0) for n in module.component("vae").find(Op.INPUT)[2:]]
    frames = None
    for i in range(z.shape[2]):
        out, *caches = run(program, z[:, :, i:i + 1], torch.tensor(int(i == 0)), *caches)
        frames = out[:, :, :1] if i == 0 else torch.cat([frames, out], dim=2)
    return frames


@pytest.mark.skipif(not torch_traces_cond(), reason="this torch cannot export the decoder as one torch.cond "
                    "program (codegen builds branch programs instead: codegen/branches.py)")
def test_branch_views_equal_the_one_program(module, ckpt):
    """The decoder built per value of `first` (what a target without control flow compiles:
    codegen/branches.py) computes exactly what the torch.cond program computes at that value
    (eager: the same ops in the same order, so equal bit for bit)."""
    from difflet.codegen.branches import branch_views
    from difflet.codegen.build import build_program_module

    comp = module.component("vae")
    one = build_program_module(comp, ckpt)
    views = branch_views(comp, control_flow=False)
    assert [v for v, _ in views] == [0, 1] and branch_views(comp, control_flow=True) == []
    gen = torch.Generator().manual_seed(4)
    z = torch.randn(comp.find(Op.INPUT)[0].results[0].type.shape, generator=gen)
    caches = [torch.randn(n.results[0].type.shape, generator=gen) for n in comp.find(Op.INPUT)[2:]]
    for value, view in views:
        assert [n.name for n in view.find(Op.INPUT)] == ["z", "cache0", "cache1", "cache2", "cache3"]
        assert view.attrs["cache_key"] != comp.attrs["cache_key"]
        with torch.no_grad():
            want = one(z, torch.tensor(value), *caches)
            got = build_program_module(view, ckpt)(z, *caches)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


@pytest.fixture(scope="module")
def branch_art(module, ckpt, tmp_path_factory):
    """wan2.1-tiny compiled as for a target without control flow (trn2's table says so; the
    inductor backend stands in for neuronx-cc): the VAE as one program per value of `first`."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("difflet.codegen.branches.target_control_flow", lambda module: False)
        return compile_art(module, ckpt, tmp_path_factory.mktemp("wan-tiny-branch-art"))


@pytest.mark.slow  # compiles the decoder's two branch programs
def test_branch_programs_are_served_and_equal_the_pipeline(module, branch_art, pipe):
    from difflet.codegen.artifacts import load_artifacts
    from difflet.codegen.manifest import read_manifest
    from difflet.runtime.runner import ModelRunner

    entry = read_manifest(branch_art).components["vae"]
    assert entry.branch_input == "first" and [b.value for b in entry.branches] == [0, 1]
    assert len({b.files.program.path for b in entry.branches}) == 2  # two programs, one weights file
    assert len({b.files.weights.path for b in entry.branches}) == 1 and entry.ranks[0] == entry.branches[0].files
    z = torch.randn(1, 4, 3, 4, 4, generator=torch.Generator().manual_seed(2)) * 1.5
    with torch.no_grad():
        want = pipe.vae.decode(z).sample
    got = _chunked_decode(load_artifacts(branch_art).programs["vae"], module, z)
    assert (got - want).abs().max().item() <= 1e-4  # the one-program test's bar
    runner = ModelRunner.from_artifacts(branch_art)
    params = runner.resolve(prompt=PROMPT, seed=11, steps=2, guidance=3.0)
    ref = reference_video(pipe, runner.profile, PROMPT, 11, 2, 3.0)
    video = runner.generate(params).video
    assert_images_close(video, ref, "branch programs' video vs WanPipeline")


def test_a_branch_program_of_another_key_is_refused(branch_art, tmp_path):
    """A branch whose key is not the component's branch key is never loaded."""
    import shutil

    import msgspec

    from difflet.codegen.artifacts import load_artifacts
    from difflet.codegen.manifest import read_manifest, write_manifest

    art = tmp_path / "art"
    shutil.copytree(branch_art, art)
    manifest = read_manifest(art)
    entry = manifest.components["vae"]
    bad = msgspec.structs.replace(entry.branches[1], cache_key="0" * 64)
    components = {**manifest.components, "vae": msgspec.structs.replace(entry, branches=(entry.branches[0], bad))}
    write_manifest(art, msgspec.structs.replace(manifest, components=components))
    with pytest.raises(DiffletError, match="branch program first=1 of 'vae' does not belong"):
        load_artifacts(art)


def reference_video(pipe, profile, prompt, seed, steps, guidance, negative_prompt=None) -> np.ndarray:
    out = pipe(prompt, negative_prompt=negative_prompt, generator=torch.Generator("cpu").manual_seed(seed),
               num_inference_steps=steps, guidance_scale=guidance, height=profile["height"],
               width=profile["width"], num_frames=profile["frames"],
               max_sequence_length=profile["max_text"], output_type="np")
    return (out.frames[0] * 255).round().astype(np.uint8)


@pytest.fixture(scope="module")
def runner(art):
    from difflet.runtime.runner import ModelRunner

    return ModelRunner.from_artifacts(art)


def generate_counting_calls(runner, params):
    """(result, transformer calls made): the runner's program wrapped by a counter for one request."""
    program, calls = runner.env.programs["transformer"], []
    runner.env.programs["transformer"] = lambda *a: calls.append(1) or program(*a)
    try:
        return runner.generate(params), calls
    finally:
        runner.env.programs["transformer"] = program


@pytest.mark.parametrize("seed,steps,guidance,negative", [
    (42, None, None, None),                     # profile defaults: 4 steps, true CFG 5.0, ""
    (7, 3, 3.5, "blurry dark picture"),         # a negative prompt and host overrides
    (3, 2, 1.0, None),                          # guidance <= 1: no CFG, one call per step
])
def test_runner_video_matches_wanpipeline(runner, pipe, seed, steps, guidance, negative):
    params = runner.resolve(prompt=PROMPT, seed=seed, steps=steps, guidance=guidance,
                            negative_prompt=negative)
    result, calls = generate_counting_calls(runner, params)
    ref = reference_video(pipe, runner.profile, PROMPT, seed, params.steps, params.guidance, negative)
    assert result.video.shape == ref.shape == (9, 32, 32, 3)
    assert result.fps == 16 and result.media[1] == "mp4" and len(result.mp4) > 0
    assert result.video.std() > 0
    assert_images_close(result.video, ref, "video vs WanPipeline")
    assert len(calls) == params.steps * (2 if params.guidance > 1 else 1)  # cond + uncond per step


def test_step_caching_skips_whole_cfg_steps(runner):
    """A cached step reuses the combined (CFG) output: neither the cond nor the uncond call runs,
    and UniPC still takes every step."""
    params = runner.resolve(prompt=PROMPT, seed=5, steps=14, cache="cadence:2")
    result, calls = generate_counting_calls(runner, params)
    cached = result.stats["cached_steps"]
    assert cached > 0 and len(calls) == 2 * (14 - cached)
    assert result.video.shape == (9, 32, 32, 3) and result.video.std() > 0


def test_warm_up_passes(runner):
    assert runner.warm_up().video.shape == (9, 32, 32, 3)


def test_prompt_clean_matches_the_pipeline():
    from diffusers.pipelines.wan.pipeline_wan import prompt_clean as reference

    from difflet.families.wan.host import prompt_clean

    for text in ["  a  cat\n\tand a dog ", "fish &amp;amp; chips", "caf\u00e9 &lt;b&gt;"]:
        assert prompt_clean(text) == reference(text)


def test_wrong_cache_shape_names_the_input(ckpt):
    """A decoder whose declared cache disagrees with the model's causal caches is refused at build."""
    from difflet.codegen.build import build_program_module

    text = WAN_TINY_DSL.read_text().replace("input  cache1: float32[1, 80,", "input  cache1: float32[1, 81,")
    broken = _lower(text)
    with pytest.raises(DiffletError, match=r"input 'cache1' must be float32\[1, 80, 2, 8, 8\] .*"
                                           r"got float32\[1, 81, 2, 8, 8\]"):
        build_program_module(broken.component("vae"), ckpt)


def test_frames_must_be_4k_plus_1():
    """Wan's VAE keeps the first frame and compresses the rest 4x: 7 frames is refused at lowering,
    pointing at the latent frame expression of the transformer's input."""
    from difflet.frontend.lower import lower_file

    with pytest.raises(DiffletError, match="6 / 4 does not divide exactly") as err:
        lower_file(str(WAN_TINY_DSL), {"frames": "7"})
    assert "wan2.1-tiny.dsl:" in str(err.value)


def test_real_size_dsl_fits_the_host_steps_and_the_real_vae():
    """models/wan2.1.dsl: registered wan steps, a masked encoder, and a chunk decoder whose cache
    declarations are AutoencoderKLWan's at 480x832 (checked on a meta-device model: shapes only)."""
    from diffusers import AutoencoderKLWan

    from difflet.families.wan.vae import WanChunkDecoder
    from difflet.frontend.lower import lower_file
    from difflet.runtime.schedule import get_step
    from difflet.runtime.schedule import schedule_steps

    module = lower_file(str(REPO / "models" / "wan2.1.dsl"))
    steps = schedule_steps(module)
    assert [s.name for s in steps] == ["wan.encode_prompt", "wan.prepare_latents", "wan.denoise",
                                       "wan.decode"]
    for step in steps:
        get_step(step.name)
    assert [n.name for n in module.component("text_encoder").find(Op.INPUT)] == ["input_ids", "valid_text"]
    assert [n.name for n in module.component("transformer").find(Op.INPUT)] == \
        ["hidden_states", "timestep", "encoder_hidden_states"]  # what wan.denoise passes
    (name,) = steps[-1].args
    with torch.device("meta"):
        vae = AutoencoderKLWan.from_config(module.component(name).attrs["config"].to_python())
    assert len(WanChunkDecoder(vae, module.component(name)).slots) == 32


def test_python_api_frames_match_wanpipeline(ckpt, pipe):
    """`DiffletPipeline.from_pretrained(DIR, model=...)` on a video family: `.frames` per video."""
    from difflet import DiffletPipeline

    with DiffletPipeline.from_pretrained(ckpt, model="wan2.1-tiny", store=shared_store_dir()) as ours:
        out = ours(PROMPT, num_inference_steps=2, guidance_scale=3.0, seed=9)
        frames = np.stack([np.asarray(f) for f in out.frames[0]])
        ref = reference_video(pipe, ours.profile, PROMPT, 9, 2, 3.0)
    assert len(out.frames) == 1 and out.images == [] and frames.shape == ref.shape == (9, 32, 32, 3)
    assert_images_close(frames, ref, "DiffletPipeline frames vs WanPipeline")
