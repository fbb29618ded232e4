"""LTX-2 host steps, matching diffusers' LTX2Pipeline (pipeline_ltx2.py) operation for operation.

Invariants:
- Shapes come from the IR (program input types): latent geometry from the VAE decoders' inputs,
  tokens from the transformer's; the host checks that the profile's frames/audio agree with the
  pipeline's own formulas and refuses otherwise.
- The prompt crosses into the encoder programs as padded input_ids plus its valid-token count
  (the Gemma tokenizer pads LEFT); no host mask tensor exists.
- Video and audio latents are denoised as one flat tensor [1, video + audio elements]: the
  FlowMatchEuler update is elementwise, so one scheduler over the concatenation is exactly the
  pipeline's two schedulers with identical sigmas, and `cached_loop` caches both streams together.
- Guidance is the pipeline's true CFG in x0 space with guidance rescale, per stream (video: the
  request's guidance; audio: the step's audio_scale), two batch-1 transformer calls per step.
  STG and modality-isolation guidance (pipeline defaults stg_scale=1, modality_scale=3) are not
  served: the reference is called with stg_scale=0, modality_scale=1.
"""
from __future__ import annotations

import numpy as np
import torch

from difflet.errors import DiffletError
from difflet.ir.nodes import Node, Op
from difflet.families.ltx2.facts import FACTS, FRAME_RATE
from difflet.runtime.host import host_step
from difflet.runtime.host.cfg import predict_branches
from difflet.runtime.host.loop import cached_loop
from difflet.runtime.host.toolkit import (calculate_shift, class_config_value, guidance, input_shape,
                                          make_scheduler, schedule_step)
from difflet.runtime.host.env import HostEnv, RequestState

AUDIO_LATENT_DOWNSAMPLE = 4  # AutoencoderKLLTX2Audio's temporal and mel compression (a constant)


def _first_input(component: Node) -> tuple[str, tuple[int, ...]]:
    return component.find(Op.INPUT)[0].name, tuple(component.find(Op.INPUT)[0].results[0].type.shape)


def guidance_scales(step: Node, scale: float) -> dict:
    """The pipeline's per-stream scales: audio_x = audio_x or x (so 0 falls back to the video value)."""
    spec = guidance(step, FACTS, ("cfg",))
    for key, off in (("stg_scale", 0.0), ("audio_stg_scale", 0.0), ("modality_scale", 1.0),
                     ("audio_modality_scale", 1.0)):
        if float(spec.get(key, off)) != off:  # extra transformer variants, not compiled
            raise DiffletError(f"guidance.{key} = {spec[key]}: STG and modality-isolation guidance "
                               f"are not served (only {off})", where=step.loc)
    rescale = float(spec.get("rescale", 0.7))
    audio_scale = float(spec.get("audio_scale", 7.0)) or float(scale)
    return dict(video=float(scale), audio=audio_scale, rescale=rescale,
                audio_rescale=float(spec.get("audio_rescale", 0.7)) or rescale,
                cfg=float(scale) > 1.0 or audio_scale > 1.0)


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


# ---- latents

def geometry(env: HostEnv, frame_rate: float) -> dict:
    """Latent shapes from the IR, checked against the pipeline's frame and audio-length formulas."""
    vae, audio_vae = (env.component(n) for n in _decoders(env)[:2])
    _, (_, channels, frames, height, width) = _first_input(vae)
    _, (_, a_channels, a_frames, a_mel) = _first_input(audio_vae)
    transformer = env.component(schedule_step(env.module, "ltx2.denoise").args[0])
    p, pt = class_config_value(transformer, "patch_size"), class_config_value(transformer, "patch_size_t")
    tokens = input_shape(transformer, "hidden_states")[1]
    if tokens != (frames // pt) * (height // p) * (width // p):
        raise DiffletError(f"transformer hidden_states has {tokens} tokens, the VAE latent "
                           f"{frames}x{height}x{width} packs to "
                           f"{(frames // pt) * (height // p) * (width // p)}", where=transformer.loc)
    profile = env.profile
    sample_rate = class_config_value(audio_vae, "sample_rate")
    hop = class_config_value(audio_vae, "mel_hop_length")
    duration = int(profile["frames"]) / frame_rate
    want_audio = round(duration * (sample_rate / hop / float(AUDIO_LATENT_DOWNSAMPLE)))
    if a_frames != want_audio:
        raise DiffletError(f"profile audio = {a_frames} latent frames, but LTX2Pipeline makes "
                           f"{want_audio} for {profile['frames']} frames at {frame_rate} fps",
                           where="profile.audio")
    mel_bins = class_config_value(audio_vae, "mel_bins")
    if a_mel != mel_bins // AUDIO_LATENT_DOWNSAMPLE:
        raise DiffletError(f"audio VAE input has {a_mel} mel bins, the config implies "
                           f"{mel_bins // AUDIO_LATENT_DOWNSAMPLE}", where=audio_vae.loc)
    return dict(video=(1, channels, frames, height, width), audio=(1, a_channels, a_frames, a_mel))


def _decoders(env: HostEnv) -> list[str]:
    return list(schedule_step(env.module, "ltx2.decode").args)


def pack_video(latents: torch.Tensor, p: int, pt: int) -> torch.Tensor:
    """[B, C, F, H, W] -> [B, F/pt * H/p * W/p, C*pt*p*p] (LTX2Pipeline._pack_latents)."""
    b, _, f, h, w = latents.shape
    latents = latents.reshape(b, -1, f // pt, pt, h // p, p, w // p, p)
    return latents.permute(0, 2, 4, 6, 1, 3, 5, 7).flatten(4, 7).flatten(1, 3)


def unpack_video(latents: torch.Tensor, f: int, h: int, w: int, p: int, pt: int) -> torch.Tensor:
    """Inverse of pack_video for the latent grid (f, h, w) in patches."""
    latents = latents.reshape(latents.size(0), f, h, w, -1, pt, p, p)
    return latents.permute(0, 4, 1, 5, 2, 6, 3, 7).flatten(6, 7).flatten(4, 5).flatten(2, 3)


def rope_coords(transformer: Node, latent: tuple, audio_frames: int, fps: float):
    """(video coords [1, 3, N, 2], audio coords [1, 1, La, 2]) from the transformer's own RoPE
    helpers, configured from its config (they hold no weights)."""
    from diffusers.models.transformers.transformer_ltx2 import LTX2AudioVideoRotaryPosEmbed

    cfg = lambda key: class_config_value(transformer, key)  # noqa: E731
    common = dict(dim=2, theta=cfg("rope_theta"), causal_offset=cfg("causal_offset"))
    video = LTX2AudioVideoRotaryPosEmbed(patch_size=cfg("patch_size"), patch_size_t=cfg("patch_size_t"),
                                         scale_factors=tuple(cfg("vae_scale_factors")), modality="video",
                                         **common)
    audio = LTX2AudioVideoRotaryPosEmbed(patch_size=cfg("audio_patch_size"),
                                         patch_size_t=cfg("audio_patch_size_t"),
                                         sampling_rate=cfg("audio_sampling_rate"),
                                         hop_length=cfg("audio_hop_length"),
                                         scale_factors=[cfg("audio_scale_factor")], modality="audio", **common)
    _, _, f, h, w = latent
    cpu = torch.device("cpu")
    return (video.prepare_video_coords(1, f, h, w, cpu, fps=fps),
            audio.prepare_audio_coords(1, audio_frames, cpu))


@host_step("ltx2.prepare_latents", phase="denoise")
def prepare_latents(env: HostEnv, step: Node, state: RequestState) -> None:
    """Seeded video noise then audio noise from one CPU generator (the pipeline's draw order),
    packed to tokens, plus the RoPE coordinates (frame_rate from the step, default 24)."""
    from diffusers.utils.torch_utils import randn_tensor

    frame_rate = float(step.attrs.get("frame_rate", FRAME_RATE))
    geo = geometry(env, frame_rate)
    transformer = env.component(schedule_step(env.module, "ltx2.denoise").args[0])
    p, pt = class_config_value(transformer, "patch_size"), class_config_value(transformer, "patch_size_t")
    generator = torch.Generator("cpu").manual_seed(state.params.seed)
    cpu = torch.device("cpu")
    video = randn_tensor(geo["video"], generator=generator, device=cpu, dtype=torch.float32)
    audio = randn_tensor(geo["audio"], generator=generator, device=cpu, dtype=torch.float32)
    state.values["video_latents"] = pack_video(video, p, pt)
    state.values["audio_latents"] = audio.transpose(1, 2).flatten(2, 3)
    state.values["coords"] = rope_coords(transformer, geo["video"], geo["audio"][2], frame_rate)
    state.values.update(geometry=geo, frame_rate=frame_rate, patch=(p, pt))


# ---- denoise

def timesteps_for(scheduler, num_steps: int, video_seq_len: int) -> torch.Tensor:
    """LTX2Pipeline's schedule: sigmas linspace(1, 1/N, N), mu from the video token count."""
    cfg = scheduler.config
    mu = calculate_shift(video_seq_len, cfg.get("base_image_seq_len", 1024),
                         cfg.get("max_image_seq_len", 4096), cfg.get("base_shift", 0.95),
                         cfg.get("max_shift", 2.05))
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / num_steps, num_steps), device="cpu", mu=mu)
    scheduler.set_begin_index(0)
    return scheduler.timesteps


def rescale_noise_cfg(guided: torch.Tensor, cond: torch.Tensor, rescale: float) -> torch.Tensor:
    dims = list(range(1, cond.ndim))
    rescaled = guided * (cond.std(dim=dims, keepdim=True) / guided.std(dim=dims, keepdim=True))
    return rescale * rescaled + (1 - rescale) * guided


def guide(latents: torch.Tensor, cond: torch.Tensor, uncond: torch.Tensor | None, sigma: torch.Tensor,
          scale: float, rescale: float) -> torch.Tensor:
    """One stream's guided velocity: CFG delta in x0 space, optional rescale, back to velocity."""
    x0 = latents - cond * sigma
    delta = (scale - 1) * (x0 - (latents - uncond * sigma)) if uncond is not None else 0
    guided = x0 + delta + 0 + 0  # + STG and modality deltas, which are 0 here
    if rescale > 0:
        guided = rescale_noise_cfg(guided, x0, rescale)
    return (latents - guided) / sigma


@host_step("ltx2.denoise", phase="denoise")
def denoise(env: HostEnv, step: Node, state: RequestState) -> None:
    """Flow-matching Euler over [video | audio] latents with true CFG (cond + uncond calls)."""
    (transformer,) = step.args
    scales = guidance_scales(step, state.params.guidance)
    values = state.values
    video, audio = values["video_latents"], values["audio_latents"]
    split = video.numel()
    scheduler = make_scheduler(step)
    timesteps = timesteps_for(scheduler, state.params.steps, video.shape[1])
    video_coords, audio_coords = values["coords"]

    def inputs(v, a, t, text):
        return dict(hidden_states=v, audio_hidden_states=a, encoder_hidden_states=text[0],
                    audio_encoder_hidden_states=text[1], timestep=t.expand(1), video_coords=video_coords,
                    audio_coords=audio_coords)

    def predict(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        sigma = scheduler.sigmas[int((timesteps == t).nonzero()[0, 0])]
        v, a = x[:, :split].reshape(video.shape), x[:, split:].reshape(audio.shape)
        # both passes: two calls, or one of a cfg2 program (host/cfg.py); outputs (video, audio)
        cond, uncond = predict_branches(env, transformer, inputs(v, a, t, values["cond"]),
                                        inputs(v, a, t, values["uncond"]) if scales["cfg"] else None)
        cond = tuple(y.float() for y in cond.values())
        uncond = tuple(y.float() for y in uncond.values()) if uncond is not None else (None, None)
        gv = guide(v, cond[0], uncond[0], sigma, scales["video"], scales["rescale"])
        ga = guide(a, cond[1], uncond[1], sigma, scales["audio"], scales["audio_rescale"])
        return torch.cat([gv.flatten(1), ga.flatten(1)], dim=1)

    flat = torch.cat([video.flatten(1), audio.flatten(1)], dim=1)
    # the probe watches the conditional pass's video tokens (its feature reads no text or audio)
    flat = cached_loop(env, state, scheduler, timesteps, flat, predict=predict,
                       probe_inputs=lambda x, t: dict(hidden_states=x[:, :split].reshape(video.shape),
                                                      timestep=t.expand(1)))
    values["video_latents"] = flat[:, :split].reshape(video.shape)
    values["audio_latents"] = flat[:, split:].reshape(audio.shape)


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
    video = next(iter(env.invoke(vae.name, **{_first_input(vae)[0]: latents}).values()))
    values["decoded"] = video
    frames = VideoProcessor(vae_scale_factor=state.params.height // h).postprocess_video(video, output_type="np")
    state.video = (frames[0] * 255).round().astype("uint8")
    state.fps = values["frame_rate"]

    mel_bins = values["geometry"]["audio"][3]
    audio = values["audio_latents"].unflatten(2, (-1, mel_bins)).transpose(1, 2)
    mel = next(iter(env.invoke(audio_vae.name, **{_first_input(audio_vae)[0]: audio}).values()))
    wave = next(iter(env.invoke(vocoder.name, **{_first_input(vocoder)[0]: mel}).values()))
    values["waveform"] = wave
    state.audio = wave[0].numpy().astype(np.float32)
    state.sample_rate = int(class_config_value(vocoder, "output_sampling_rate"))
