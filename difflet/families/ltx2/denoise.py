"""LTX-2 denoising, matching LTX2Pipeline / LTX2ImageToVideoPipeline's loop operation for operation.

Invariants:
- Video and audio latents are denoised as one flat tensor [1, video + audio elements]: the
  FlowMatchEuler update is elementwise, so one scheduler over the concatenation is exactly the
  pipeline's two schedulers with identical sigmas, and `cached_loop` caches both streams together.
- Guidance is the pipeline's true CFG in x0 space with guidance rescale, per stream (video: the
  request's guidance; audio: the step's audio_scale), two batch-1 transformer calls per step.
  STG and modality-isolation guidance (pipeline defaults stg_scale=1, modality_scale=3) are not
  served: the reference is called with stg_scale=0, modality_scale=1.
- Image-to-video (`conditioning_mask` in state): the transformer's `video_timestep` is
  t * (1 - mask) per token, and after every update the conditioned tokens are put back to their
  start values, as the pipeline steps only latent frames 1: and concatenates frame 0 unchanged
  (the update is elementwise, so the other tokens are the pipeline's).
"""
from __future__ import annotations

import numpy as np
import torch

from difflet.errors import DiffletError
from difflet.families.ltx2.facts import FACTS
from difflet.ir.nodes import Node
from difflet.runtime.host import host_step
from difflet.runtime.host.cfg import predict_branches
from difflet.runtime.host.env import HostEnv, RequestState
from difflet.runtime.host.loop import cached_loop
from difflet.runtime.host.toolkit import calculate_shift, guidance, make_scheduler


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


def keep_conditioned(mask: torch.Tensor, start: torch.Tensor, channels: int):
    """The blend restoring the conditioned video tokens (mask 1) of the flat [video | audio]
    latents to `start` after each update; every other element is the update's."""
    audio = torch.zeros(start.shape[1] - mask.numel() * channels, dtype=torch.bool)
    keep = torch.cat([(mask > 0).unsqueeze(-1).expand(-1, -1, channels).flatten(), audio]).unsqueeze(0)
    return lambda i, latents: torch.where(keep, start, latents)


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
    mask = values.get("conditioning_mask")

    def inputs(v, a, t, text):
        named = dict(hidden_states=v, audio_hidden_states=a, encoder_hidden_states=text[0],
                     audio_encoder_hidden_states=text[1], timestep=t.expand(1), video_coords=video_coords,
                     audio_coords=audio_coords)
        if mask is not None:  # the pipeline's t.expand(B).unsqueeze(-1) * (1 - conditioning_mask)
            named["video_timestep"] = t.expand(1).unsqueeze(-1) * (1 - mask)
        return named

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
    blend = None if mask is None else keep_conditioned(mask, flat.clone(), video.shape[2])
    # the probe watches the conditional pass's video tokens (its feature reads no text or audio),
    # at the step's timestep also for image-to-video: a change signal, and frame 0 never changes
    flat = cached_loop(env, state, scheduler, timesteps, flat, predict=predict, blend=blend,
                       probe_inputs=lambda x, t: dict(hidden_states=x[:, :split].reshape(video.shape),
                                                      timestep=t.expand(1)))
    values["video_latents"] = flat[:, :split].reshape(video.shape)
    values["audio_latents"] = flat[:, split:].reshape(audio.shape)
