"""LTX-2 at LTX2Pipeline's default guidance (stg_scale 1, modality_scale 3, both streams) with a
transformer that perturbs (config `perturbed_attn`, as LTX-2.3's checkpoints state it): four
passes per step, all from one program (families/ltx2/guidance.py).

Oracles: diffusers' LTX2VideoTransformer3DModel called as each of the pipeline's passes calls it
(`spatio_temporal_guidance_blocks`, `isolate_modalities`), and LTX2Pipeline itself at its default
arguments on the same random:0 checkpoint: frames by oracle_util's closeness rule, the waveform to
ATOL, and its transformer's per-step batch elements (4) against the passes Difflet ran. The
CFG-parallel artifact (tp1+cfg2: two rank processes, the STG and the isolated pass paired in one
call) is held to the sequential one.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from difflet.ir.nodes import Op
from oracle_util import assert_images_close, compile_art, planned_tiny, random_checkpoint

TINY = Path(__file__).resolve().parent.parent / "models" / "ltx2-tiny.dsl"
ATOL = 1e-4  # fp32 programs against the same fp32 module: export/inductor reorderings only
PROMPT, NEGATIVE, SEED = "a red fox in the snow", "blurry dark picture", 3


def perturbing_dsl(dest: Path) -> Path:
    """ltx2-tiny.dsl with `perturbed_attn: true` in the transformer's config (the only change)."""
    text, n = re.subn(r"vae_scale_factors: \[2, 8, 8\]\n", "vae_scale_factors: [2, 8, 8], perturbed_attn: true\n",
                      TINY.read_text())
    assert n == 1
    (dest / "ltx2-tiny-stg.dsl").write_text(text.replace("model ltx2_tiny ", "model ltx2_tiny_stg "))
    return dest / "ltx2-tiny-stg.dsl"


@pytest.fixture(scope="module")
def dsl(tmp_path_factory):
    return perturbing_dsl(tmp_path_factory.mktemp("ltx2-stg-dsl"))


@pytest.fixture(scope="module")
def module(dsl):
    return planned_tiny(dsl)


@pytest.fixture(scope="module")
def ckpt(module):
    return random_checkpoint(module)


@pytest.fixture(scope="module")
def art(module, ckpt, tmp_path_factory):
    return compile_art(module, ckpt, tmp_path_factory.mktemp("ltx2-stg-art"))


@pytest.fixture(scope="module")
def runner(art):
    from difflet.runtime.runner import ModelRunner

    return ModelRunner.from_artifacts(art)


@pytest.fixture(scope="module")
def pipe(ckpt):
    from diffusers import LTX2Pipeline

    pipe = LTX2Pipeline.from_pretrained(str(ckpt))
    pipe.set_progress_bar_config(disable=True)
    assert pipe.transformer.config.perturbed_attn
    return pipe


class PassCounter:
    """Wraps the served transformer program: the `guidance_pass` value of every call, in order."""

    def __init__(self, program, index: int) -> None:
        self.program, self.index, self.passes = program, index, []

    def __call__(self, *tensors):
        self.passes.append(int(tensors[self.index]))
        return self.program(*tensors)


@pytest.mark.slow  # compiles the perturbing transformer's artifact
def test_every_pass_equals_the_transformer_called_as_the_pipeline_calls_it(runner, pipe):
    from difflet.families.ltx2 import host as ltx2

    gen = torch.Generator().manual_seed(1)
    video, audio = torch.randn(1, 80, 4, generator=gen), torch.randn(1, 9, 4, generator=gen)
    text, audio_text = torch.randn(1, 16, 32, generator=gen), torch.randn(1, 16, 32, generator=gen)
    t = torch.tensor([700.0])
    coords = ltx2.rope_coords(runner.module.component("transformer"), (1, 4, 5, 4, 4), 9, 24.0)
    outs = {}
    for guidance_pass, blocks, isolate in ((0, None, False), (1, [0], False), (2, None, True)):
        ours = runner.env.programs["transformer"](video, audio, text, audio_text, t, *coords,
                                                  torch.tensor(guidance_pass))
        with torch.no_grad():
            ref = pipe.transformer(hidden_states=video, audio_hidden_states=audio, encoder_hidden_states=text,
                                   audio_encoder_hidden_states=audio_text, timestep=t, sigma=t, num_frames=5,
                                   height=4, width=4, fps=24.0, audio_num_frames=9, use_cross_timestep=True,
                                   spatio_temporal_guidance_blocks=blocks, isolate_modalities=isolate,
                                   return_dict=False)
        for a, b in zip(ours, ref, strict=True):
            assert (a - b).abs().max() <= ATOL, guidance_pass
        outs[guidance_pass] = ours
    for changed in (1, 2):  # each pass really changes both streams, far beyond the tolerance
        assert all((a - b).abs().max() > 100 * ATOL for a, b in zip(outs[changed], outs[0]))


@pytest.mark.slow  # compiles the perturbing transformer's artifact
def test_the_passes_are_one_program_over_one_copy_of_the_weights(art):
    """What the perturbed passes add to memory: nothing. The artifact holds one transformer
    program and one weights file for it (stronger than an RSS reading on a 2-core box)."""
    from difflet.codegen.manifest import read_manifest

    entry = read_manifest(art).components["transformer"]
    assert (entry.world, entry.cfg, entry.branches) == (1, 1, ())
    assert sorted(p.name for p in (art / "weights").glob("transformer*")) == ["transformer.rank0.safetensors"]
    assert len(list((art / "programs").glob("transformer*"))) == 1


def _reference(pipe, steps: int):
    """LTX2Pipeline at its default guidance, and its transformer's batch elements per call. Its
    default STG block is 28 (of LTX-2's 48); the one-block tiny declares block 0, as the real
    description declares 28 (models/ltx2.dsl): the same perturbation, named for this depth."""
    batches = []
    hook = pipe.transformer.register_forward_pre_hook(
        lambda mod, args, kwargs: batches.append(kwargs["hidden_states"].shape[0]), with_kwargs=True)
    try:
        out = pipe(PROMPT, negative_prompt=NEGATIVE, generator=torch.Generator("cpu").manual_seed(SEED),
                   num_inference_steps=steps, height=32, width=32, num_frames=9, max_sequence_length=16,
                   spatio_temporal_guidance_blocks=[0], output_type="np")
    finally:
        hook.remove()
    return (out.frames[0] * 255).round().astype("uint8"), out.audio[0].numpy(), batches


STEPS = 2


@pytest.fixture(scope="module")
def served_default(runner):
    """(video, waveform, guidance_pass of every transformer call) of the default request."""
    return _served(runner, STEPS)


def _served(runner, steps: int):
    index = [n.name for n in runner.module.component("transformer").find(Op.INPUT)].index("guidance_pass")
    counter = PassCounter(runner.env.programs["transformer"], index)
    runner.env.programs["transformer"] = counter
    try:
        state, result = runner._run(runner.resolve(prompt=PROMPT, negative_prompt=NEGATIVE, seed=SEED, steps=steps))
    finally:
        runner.env.programs["transformer"] = counter.program
    return result.video, state.audio, counter.passes


@pytest.mark.slow  # compiles the perturbing transformer's artifact
def test_default_request_makes_four_passes_per_step_equal_to_the_pipeline(served_default, pipe):
    frames, audio, batches = _reference(pipe, STEPS)
    video, wave, passes = served_default
    assert batches == [2, 1, 1] * STEPS  # the pipeline: cond + uncond batched, then STG, then isolated
    assert passes == [0, 0, 1, 2] * STEPS  # Difflet: the same four passes, batch 1 each
    assert video.shape == frames.shape == (9, 32, 32, 3) and video.std() > 0
    assert_images_close(video, frames, what="video vs LTX2Pipeline at its default guidance")
    assert np.abs(wave - audio).max() <= ATOL


def test_guidance_off_in_the_description_is_the_old_two_passes(module):
    """stg_scale 0 and modality_scale 1 (the description's values, e.g. a lighter profile) drop
    the two passes: the request costs CFG's two."""
    import msgspec

    from difflet.families.ltx2 import host as ltx2

    step = ltx2.schedule_step(module, "ltx2.denoise")
    off = step.attrs["guidance"].set(stg_scale=0.0, audio_stg_scale=0.0, modality_scale=1.0,
                                     audio_modality_scale=1.0)
    scales = ltx2.guidance_scales(msgspec.structs.replace(step, attrs=step.attrs.set(guidance=off)), 3.0)
    assert scales["cfg"] and not scales["do_stg"] and not scales["do_modality"]


@pytest.mark.slow
def test_cfg_parallel_pairs_the_extra_passes_and_equals_sequential(dsl, ckpt, served_default, tmp_path):
    """tp1+cfg2: each call runs two passes on the two groups, (conditional, unconditional) then
    (STG, isolated) through the twinned `guidance_pass`: two calls a step, output equal."""
    from difflet.codegen.driver import codegen
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize
    from difflet.runtime.runner import ModelRunner

    from conftest import shared_store_dir

    module = optimize(lower_file(str(dsl)), parallel="tp1+cfg2", target="cpu", backend="inductor")
    inputs = [n.name for n in module.component("transformer").find(Op.INPUT)]
    assert "uncond_guidance_pass" in inputs
    codegen(module, str(ckpt), tmp_path / "art", store=shared_store_dir(), log=lambda *_: None)
    parallel = ModelRunner.from_artifacts(tmp_path / "art")
    try:
        calls = []
        program = parallel.env.programs["transformer"]
        index = inputs.index("guidance_pass"), inputs.index("uncond_guidance_pass")
        parallel.env.programs["transformer"] = lambda *t: calls.append((int(t[index[0]]), int(t[index[1]]))) \
            or program(*t)
        _, got = parallel._run(parallel.resolve(prompt=PROMPT, negative_prompt=NEGATIVE, seed=SEED, steps=STEPS))
    finally:
        parallel.close()
    video, _, _ = served_default
    assert calls == [(0, 0), (1, 2)] * STEPS
    assert_images_close(got.video, video, what="tp1+cfg2 vs sequential")


# tp2: the STG value path through TP-split linears (column to_v, row to_out + all-reduce); the
# selects are elementwise on the attention outputs, so CP's shards change nothing for them
SPLITS = (("tp2", None),)


def _split_body(rank, world, dsl, ckpt, x):
    """This rank's outputs of every SPLITS layout's rank module, for the STG and the isolated pass."""
    from difflet.codegen.split_codegen import degrees
    from difflet.codegen.split_layout import build_rank_module
    from difflet.frontend.lower import lower_file
    from difflet.parallel.groups import make_groups
    from difflet.passes.pipeline import optimize

    out = {}
    for parallel, attention in SPLITS:
        node = optimize(lower_file(dsl), parallel=parallel, attention=attention, target="cpu").component("transformer")
        pm = build_rank_module(node, ckpt, make_groups(degrees(node)))
        with torch.no_grad():
            out[parallel] = {p: pm(*x, torch.tensor(p)) for p in (1, 2)}
    return out


@pytest.mark.slow
def test_split_rank_programs_run_the_perturbed_passes(dsl, ckpt, runner, pipe):
    """The STG value path (to_v, to_out) through TP-split linears and the isolation through split
    cross-modal attention, on 2 gloo ranks: equal to diffusers' unsplit passes."""
    from difflet.families.ltx2 import host as ltx2
    from difflet.parallel.launch import run_ranks

    gen = torch.Generator().manual_seed(4)
    x = (torch.randn(1, 80, 4, generator=gen), torch.randn(1, 9, 4, generator=gen),
         torch.randn(1, 16, 32, generator=gen), torch.randn(1, 16, 32, generator=gen), torch.tensor([400.0]),
         *ltx2.rope_coords(runner.module.component("transformer"), (1, 4, 5, 4, 4), 9, 24.0))
    names = ("hidden_states", "audio_hidden_states", "encoder_hidden_states", "audio_encoder_hidden_states",
             "timestep", "video_coords", "audio_coords")
    with torch.no_grad():
        ref = {p: pipe.transformer(**dict(zip(names, x)), sigma=x[4], use_cross_timestep=True,
                                   spatio_temporal_guidance_blocks=[0] if p == 1 else None,
                                   isolate_modalities=p == 2, return_dict=False) for p in (1, 2)}
    for rank, got in enumerate(run_ranks(_split_body, 2, str(dsl), str(ckpt), x, timeout=600)):
        for parallel, _ in SPLITS:
            for p in (1, 2):
                for a, b in zip(got[parallel][p], ref[p], strict=True):
                    assert (a - b).abs().max() <= ATOL, (parallel, p, rank)


@pytest.mark.slow  # compiles the perturbing transformer's artifact
def test_request_scales_equal_the_pipeline_called_with_them(runner, pipe, served_default):
    """A request's stg_scale and modality_scale are LTX2Pipeline's (the video stream's; the audio
    stream keeps its own, 1 and 3 in both)."""
    params = runner.resolve(prompt=PROMPT, negative_prompt=NEGATIVE, seed=SEED, steps=STEPS, stg_scale=2.5,
                            modality_scale=1.5)
    _, result = runner._run(params)
    out = pipe(PROMPT, negative_prompt=NEGATIVE, generator=torch.Generator("cpu").manual_seed(SEED),
               num_inference_steps=STEPS, height=32, width=32, num_frames=9, max_sequence_length=16,
               spatio_temporal_guidance_blocks=[0], stg_scale=2.5, modality_scale=1.5, output_type="np")
    ref = (out.frames[0] * 255).round().astype("uint8")
    assert_images_close(result.video, ref, what="video at stg 2.5, modality 1.5 vs LTX2Pipeline")
    default, _, _ = served_default  # the scales are not ignored: the defaults give another video
    assert np.abs(default.astype(int) - result.video.astype(int)).max() > 8


def test_a_model_without_the_scales_refuses_them_naming_the_field():
    from difflet.errors import DiffletError
    from difflet.runtime.validate import resolve_request

    profile = {"height": 32, "width": 32, "steps": 2, "guidance": 3.5}  # no stg_scale: not LTX-2
    for field in ("stg_scale", "modality_scale"):
        with pytest.raises(DiffletError, match=rf"{field}: this model has no {field}"):
            resolve_request(profile, (), {}, prompt="a cat", **{field: 1.0})
