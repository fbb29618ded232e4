"""ltx2-tiny served by Difflet against diffusers' LTX2Pipeline (text to video + audio).

Oracles: each compiled program against its diffusers/transformers class loaded from the same
random:0 checkpoint, called as LTX2Pipeline calls it (masks, padding side, RoPE coordinates and
(de)normalization computed by diffusers itself); end to end, ModelRunner's frames and waveform
against LTX2Pipeline.from_pretrained(checkpoint) with the same prompt, seed, steps, guidance and
negative prompt, the pipeline's other arguments at their defaults (STG and modality guidance on;
this LTX-2.0-like transformer does not perturb, so STG's pass would repeat the conditional one:
tests/test_ltx2_guidance.py covers a perturbing one).
"""
from __future__ import annotations

import io
from pathlib import Path

import msgspec
import numpy as np
import pytest
import torch

from difflet.errors import DiffletError
from oracle_util import assert_images_close, compile_art, planned_tiny, random_checkpoint

DSL = Path(__file__).resolve().parent.parent / "models" / "ltx2-tiny.dsl"
ATOL = 1e-4
PROMPTS = ("a red fox in the snow",  # 7 of 16 tokens valid: left padding
           "a small red cat sitting on a big blue box near the old house under the dark night sky")


@pytest.fixture(scope="module")
def module():
    return planned_tiny(DSL)


@pytest.fixture(scope="module")
def ckpt(module):
    return random_checkpoint(module)


@pytest.fixture(scope="module")
def art_dir(module, ckpt, tmp_path_factory):
    return compile_art(module, ckpt, tmp_path_factory.mktemp("ltx2-tiny-art"))


@pytest.fixture(scope="module")
def pipe(ckpt):
    from diffusers import LTX2Pipeline

    pipe = LTX2Pipeline.from_pretrained(str(ckpt))
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module")
def runner(art_dir):
    from difflet.runtime.runner import ModelRunner

    return ModelRunner.from_artifacts(art_dir)


@pytest.fixture(scope="module")
def programs(runner):
    """The compiled programs the runner loaded from ART (checksums verified)."""
    return runner.env.programs


def _tokens(pipe, prompt):
    """input_ids and mask exactly as LTX2Pipeline._get_gemma_prompt_embeds makes them."""
    pipe.tokenizer.padding_side = "left"
    out = pipe.tokenizer([prompt.strip()], padding="max_length", max_length=16, truncation=True,
                         add_special_tokens=True, return_tensors="pt")
    return out.input_ids, out.attention_mask


def _reference_text(pipe, prompt):
    ids, mask = _tokens(pipe, prompt)
    with torch.no_grad():
        embeds, mask = pipe._get_gemma_prompt_embeds(prompt, max_sequence_length=16, device="cpu")
        video, audio, _ = pipe.connectors(embeds, mask, padding_side="left")
    return ids, mask, embeds, video, audio


@pytest.mark.parametrize("prompt", PROMPTS)
def test_text_programs_equal_gemma_and_connectors(programs, pipe, prompt):
    ids, mask, embeds, video, audio = _reference_text(pipe, prompt)
    valid = torch.tensor(int(mask.sum()))
    assert (int(valid) < 16) == (prompt == PROMPTS[0])  # both a padded and a full prompt
    (hidden,) = programs["text_encoder"](ids, valid)
    assert (hidden - embeds).abs().max() <= ATOL
    ours_video, ours_audio = programs["connectors"](embeds, valid)
    assert (ours_video - video).abs().max() <= ATOL
    assert (ours_audio - audio).abs().max() <= ATOL


def test_transformer_program_equals_diffusers(programs, pipe, runner):
    """Every guidance pass of the one program against the transformer called as the pipeline's
    passes call it: plain (CFG's and, without perturbed_attn, STG's) and modality-isolated."""
    from difflet.families.ltx2 import host as ltx2

    _, _, _, text, audio_text = _reference_text(pipe, PROMPTS[0])
    gen = torch.Generator().manual_seed(1)
    video = torch.randn(1, 80, 4, generator=gen)
    audio = torch.randn(1, 9, 4, generator=gen)
    t = torch.tensor([700.0])
    coords = ltx2.rope_coords(runner.module.component("transformer"), (1, 4, 5, 4, 4), 9, 24.0)
    outs = {}
    for guidance_pass, isolate in ((0, False), (1, False), (2, True)):
        ours = programs["transformer"](video, audio, text, audio_text, t, *coords, torch.tensor(guidance_pass))
        with torch.no_grad():  # the transformer computes its own coordinates here
            ref = pipe.transformer(hidden_states=video, audio_hidden_states=audio, encoder_hidden_states=text,
                                   audio_encoder_hidden_states=audio_text, timestep=t, sigma=t,
                                   num_frames=5, height=4, width=4, fps=24.0, audio_num_frames=9,
                                   use_cross_timestep=True, isolate_modalities=isolate,
                                   spatio_temporal_guidance_blocks=[0] if guidance_pass == 1 else None,
                                   return_dict=False)
        for a, b in zip(ours, ref, strict=True):
            assert (a - b).abs().max() <= ATOL
        outs[guidance_pass] = ours
    assert all(torch.equal(a, b) for a, b in zip(outs[0], outs[1]))  # no perturbed_attn: STG is plain
    # isolation really removes the cross-modal residuals (the check above could not tell otherwise)
    assert (outs[2][0] - outs[0][0]).abs().max() > 100 * ATOL


def test_decoder_programs_equal_diffusers(programs, pipe):
    gen = torch.Generator().manual_seed(2)
    z = torch.randn(1, 4, 5, 4, 4, generator=gen)
    za = torch.randn(1, 2, 9, 2, generator=gen)
    with torch.no_grad():
        vae = pipe.vae
        ref = vae.decode(pipe._denormalize_latents(z, vae.latents_mean, vae.latents_std,
                                                   vae.config.scaling_factor), None, return_dict=False)[0]
        packed = pipe._denormalize_audio_latents(pipe._pack_audio_latents(za), pipe.audio_vae.latents_mean,
                                                 pipe.audio_vae.latents_std)
        mel = pipe.audio_vae.decode(pipe._unpack_audio_latents(packed, 9, num_mel_bins=2), return_dict=False)[0]
        wave = pipe.vocoder(mel)
    assert (programs["vae"](z)[0] - ref).abs().max() <= ATOL
    assert (programs["audio_vae"](za)[0] - mel).abs().max() <= ATOL
    assert (programs["vocoder"](mel)[0] - wave).abs().max() <= ATOL


@pytest.mark.parametrize("prompt,seed,steps,guidance,negative", [
    (PROMPTS[0], 3, None, None, None),                 # profile defaults, default negative ""
    (PROMPTS[1], 11, 3, 4.0, "blurry dark picture"),   # request overrides
])
def test_runner_equals_ltx2pipeline(runner, pipe, prompt, seed, steps, guidance, negative):
    import av

    params = runner.resolve(prompt=prompt, seed=seed, steps=steps, guidance=guidance,
                            negative_prompt=negative)
    state, result = runner._run(params)
    out = pipe(prompt, negative_prompt=negative, generator=torch.Generator("cpu").manual_seed(seed),
               num_inference_steps=params.steps, guidance_scale=params.guidance, height=32, width=32,
               num_frames=9, frame_rate=24.0, max_sequence_length=16, output_type="np")
    ref = (out.frames[0] * 255).round().astype("uint8")
    assert result.video.shape == ref.shape == (9, 32, 32, 3) and result.fps == 24.0
    assert result.video.std() > 0
    assert_images_close(result.video, ref, what="video vs LTX2Pipeline")
    assert state.audio.shape == tuple(out.audio[0].shape) and state.sample_rate == 16000
    assert np.abs(state.audio - out.audio[0].numpy()).max() <= ATOL
    with av.open(io.BytesIO(result.mp4)) as container:  # the runner muxed the waveform as AAC
        assert len(container.streams.video) == 1 and len(container.streams.audio) == 1


def test_invalid_inputs_are_refused(programs, runner):
    from difflet.families.ltx2 import host as ltx2

    ids = torch.zeros(1, 16, dtype=torch.int64)
    for bad in (torch.tensor([5]), torch.tensor(17)):  # a runtime value: 0-d and in its range
        with pytest.raises(DiffletError, match=r"runtime input valid_text must be a 0-d int64 in \[1, 16\]"):
            programs["text_encoder"](ids, bad)
    # 12 fps would make the pipeline draw 19 audio latent frames; the profile compiled 9
    with pytest.raises(DiffletError, match="profile audio = 9 latent frames") as err:
        ltx2.geometry(runner.env, 12.0)
    assert "profile.audio" in str(err.value)
    with pytest.raises(DiffletError, match="height"):
        runner.resolve(prompt="a cat", seed=0, height=64)
    step = ltx2.schedule_step(runner.env.module, "ltx2.denoise")
    bad = msgspec.structs.replace(step, attrs=step.attrs.set(guidance=step.attrs["guidance"].set(stg_scale=-1.0)))
    with pytest.raises(DiffletError, match=r"guidance.stg_scale = -1.0 is outside \[0, 100\]"):
        ltx2.guidance_scales(bad, 3.0)


def test_warm_up_checks_the_video(runner):
    result = runner.warm_up()
    assert result.media[1] == "mp4" and result.video.shape == (9, 32, 32, 3)


def test_host_with_a_gemma_tokenizer_encodes_like_the_pipeline(runner, pipe, tmp_path):
    """A GemmaTokenizer (the real checkpoint's class) saved as host/tokenizer: the host's ids and
    valid count through the programs give the pipeline's connector embeddings with that tokenizer."""
    from transformers import GemmaTokenizer

    from difflet.families.ltx2 import host as ltx2
    from difflet.runtime.host.env import HostEnv

    words = ["<pad>", "<eos>", "<bos>", "<unk>", "▁", *"abcdefghijklmnopqrstuvwxyz"]
    tok = GemmaTokenizer(vocab={w: i for i, w in enumerate(words)}, merges=[])  # characters
    tok.padding_side = "right"  # the host must switch it to left, as the pipeline does
    tok.save_pretrained(str(tmp_path / "tokenizer"))
    env = HostEnv(runner.module, runner.env.programs, tmp_path)
    enc, conn = runner.module.component("text_encoder"), runner.module.component("connectors")
    ids, valid = ltx2.tokenize(env, enc, " a red fox ")
    assert 1 < valid < 16 and ids[0, 0] == 0 and len(set(ids[0, -valid:].tolist())) > 4  # left padded
    ours = ltx2.encode_text(env, enc, conn, " a red fox ")
    original, pipe.tokenizer = pipe.tokenizer, tok
    try:
        _, _, _, video, audio = _reference_text(pipe, " a red fox ")
    finally:
        pipe.tokenizer = original
    assert (ours[0] - video).abs().max() <= ATOL and (ours[1] - audio).abs().max() <= ATOL
