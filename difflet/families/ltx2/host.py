"""LTX-2 host steps, matching diffusers' LTX2Pipeline (pipeline_ltx2.py) operation for operation.

The steps live in this family's modules, imported here so the runtime registers them all:
latents.py (geometry, packing, the seeded start), denoise.py (the loop and guidance), image.py
(image-to-video's first frame, LTX2ImageToVideoPipeline).

Invariants:
- The prompt crosses into the encoder programs as padded input_ids plus its valid-token count
  (the Gemma tokenizer pads LEFT); no host mask tensor exists.
"""
from __future__ import annotations

import numpy as np
import torch

from difflet.errors import DiffletError
from difflet.ir.nodes import Node, Op
from difflet.families.ltx2 import image  # noqa: F401 -- registers ltx2.encode_image
from difflet.families.ltx2.denoise import (denoise, guidance_scales, guide, rescale_noise_cfg,  # noqa: F401
                                           timesteps_for)
from difflet.families.ltx2.latents import (AUDIO_LATENT_DOWNSAMPLE, first_input, geometry,  # noqa: F401
                                           pack_video, prepare_latents, rope_coords, unpack_video)
from difflet.runtime.host import host_step
from difflet.runtime.host.toolkit import class_config_value, schedule_step
from difflet.runtime.host.env import HostEnv, RequestState


# ---- encode

def _left_padded(tok):
    tok.padding_side = "left"  # the pipeline forces Gemma's chat-style left padding
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def tokenize(env: HostEnv, component: Node, prompt: str) -> tuple[torch.Tensor, int]:
    """(input_ids [1, max_length] left-padded, valid token count), as _get_gemma_prompt_embeds."""
    tokenizer, max_length = env.tokenizer(component, _left_padded)
    out = tokenizer([prompt.strip()], padding="max_length", max_length=max_length, truncation=True,
                    add_special_tokens=True, return_tensors="pt")
    mask = out.attention_mask[0]
    valid = int(mask.sum())
    if valid < 1 or not bool((mask[max_length - valid:] == 1).all()):
        raise DiffletError(f"tokenizer of {component.name!r} must left-pad a prompt to max_length "
                           f"{max_length} with at least one token", where="prompt")
    return out.input_ids, valid


def encode_text(env: HostEnv, encoder: Node, connectors: Node, prompt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(video text, audio text) embeddings of one prompt through Gemma and the connectors."""
    ids, valid = tokenize(env, encoder, prompt)
    count = torch.tensor(valid, dtype=torch.int64)
    hidden = next(iter(env.invoke(encoder.name, input_ids=ids, valid_text=count).values()))
    hidden_name = connectors.find(Op.INPUT)[0].name
    out = env.invoke(connectors.name, **{hidden_name: hidden, "valid_text": count})
    return tuple(out.values())


@host_step("ltx2.encode_prompt", phase="encode")
def encode_prompt(env: HostEnv, step: Node, state: RequestState) -> None:
    """Prompt (and, under CFG, the negative prompt; default "") -> connector embeddings."""
    encoder, connectors = (env.component(name) for name in step.args)
    if class_config_value(connectors, "video_connector_num_learnable_registers") is None or \
            class_config_value(connectors, "audio_connector_num_learnable_registers") is None:
        raise DiffletError("ltx2 serving needs connectors with learnable registers (the transformer "
                           "program takes no text mask)", where=connectors.loc)
    state.values["cond"] = encode_text(env, encoder, connectors, state.params.prompt)
    scales = guidance_scales(schedule_step(env.module, "ltx2.denoise"), state.params.guidance)
    if scales["cfg"]:
        negative = state.params.negative_prompt or ""
        state.values["uncond"] = encode_text(env, encoder, connectors, negative)


@host_step("ltx2.decode", phase="decode")
def decode(env: HostEnv, step: Node, state: RequestState) -> None:
    """Unpack; the VAE program denormalizes and decodes -> uint8 frames at the step's frame rate;
    audio: unpack, the audio VAE program denormalizes and decodes to mel, the vocoder to waveform."""
    from diffusers.video_processor import VideoProcessor

    vae, audio_vae, vocoder = (env.component(n) for n in step.args)
    if class_config_value(vae, "timestep_conditioning"):
        raise DiffletError("a timestep-conditioned LTX-2 VAE (decode_timestep/noise) is not served",
                           where=vae.loc)
    values = state.values
    _, _, f, h, w = values["geometry"]["video"]
    p, pt = values["patch"]
    latents = unpack_video(values["video_latents"], f // pt, h // p, w // p, p, pt)
    video = next(iter(env.invoke(vae.name, **{first_input(vae)[0]: latents}).values()))
    values["decoded"] = video
    frames = VideoProcessor(vae_scale_factor=state.params.height // h).postprocess_video(video, output_type="np")
    state.video = (frames[0] * 255).round().astype("uint8")
    state.fps = values["frame_rate"]

    mel_bins = values["geometry"]["audio"][3]
    audio = values["audio_latents"].unflatten(2, (-1, mel_bins)).transpose(1, 2)
    mel = next(iter(env.invoke(audio_vae.name, **{first_input(audio_vae)[0]: audio}).values()))
    wave = next(iter(env.invoke(vocoder.name, **{first_input(vocoder)[0]: mel}).values()))
    values["waveform"] = wave
    state.audio = wave[0].numpy().astype(np.float32)
    state.sample_rate = int(class_config_value(vocoder, "output_sampling_rate"))
