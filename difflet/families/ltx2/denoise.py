"""LTX-2 denoising, matching LTX2Pipeline / LTX2ImageToVideoPipeline's loop operation for operation.

Invariants:
- Video and audio latents are denoised as one flat tensor [1, video + audio elements]: the
  FlowMatchEuler update is elementwise, so one scheduler over the concatenation is exactly the
  pipeline's two schedulers with identical sigmas, and `cached_loop` caches both streams together.
- Guidance is the pipeline's in x0 space, per stream (video: the request's guidance, stg_scale,
  modality_scale; audio: the step's audio_* values, 0 falling back to the video value as the
  pipeline's `or`): x0 + CFG delta + STG delta + modality delta, then guidance rescale against
  the conditional x0. Passes per step: conditional, unconditional (CFG), STG, modality-isolated
  (ltx2/guidance.py: one program, the runtime input `guidance_pass` picks the pass), each a
  batch-1 call. The STG pass runs only for a transformer that can perturb (config
  `perturbed_attn`, declared `stg_blocks`): otherwise diffusers' STG pass computes the
  conditional pass again and its delta is 0, so it is skipped (LTX-2.0's checkpoint: 3 passes).
- Under a cfg2 layout a call runs two passes on the two rank groups: (conditional,
  unconditional), then (STG, isolated) with `guidance_pass` twinned (host/cfg.py).
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


def guidance_scales(step: Node, scale: float, stg: float | None = None, modality: float | None = None) -> dict:
    """The pipeline's per-stream scales: audio_x = audio_x or x (so 0 falls back to the video value);
    `stg`/`modality`: a request's video-stream values (None: the step's). Guidance on `cfg`
    (text), `stg` (spatio-temporal) and `modality` (isolation) as the pipeline's do_* say."""
    spec = guidance(step, FACTS, ("cfg",))
    rescale = float(spec.get("rescale", 0.7))
    audio_scale = float(spec.get("audio_scale", 7.0)) or float(scale)
    stg = float(spec.get("stg_scale", 0.0)) if stg is None else float(stg)
    modality = float(spec.get("modality_scale", 1.0)) if modality is None else float(modality)
    for key, value in (("stg_scale", stg), ("modality_scale", modality)):
        if not 0.0 <= value <= 100.0:
            raise DiffletError(f"guidance.{key} = {value} is outside [0, 100]", where=step.loc)
    audio_stg = float(spec.get("audio_stg_scale", 0.0)) or stg
    audio_modality = float(spec.get("audio_modality_scale", 0.0)) or modality
    return dict(video=float(scale), audio=audio_scale, rescale=rescale,
                audio_rescale=float(spec.get("audio_rescale", 0.7)) or rescale,
                cfg=float(scale) > 1.0 or audio_scale > 1.0,
                stg=(stg, audio_stg), do_stg=stg > 0.0 or audio_stg > 0.0,
                modality=(modality, audio_modality), do_modality=modality > 1.0 or audio_modality > 1.0)


def stg_runs(env: HostEnv, transformer: str, step: Node, scales: dict) -> bool:
    """Whether the step's STG pass changes anything: asked for, and the transformer perturbs
    (ltx2/guidance.py); a perturbing transformer without declared blocks is refused, as the
    pipeline refuses STG without `spatio_temporal_guidance_blocks`."""
    from difflet.families.ltx2.facts import perturbable, stg_blocks

    node = env.component(transformer)
    if not scales["do_stg"] or not perturbable(node.attrs.get("config")):
        return False
    if not stg_blocks(node):
        raise DiffletError(f"guidance.stg_scale > 0 needs `options {{ stg_blocks: [...] }}` on {transformer!r}",
                           where=step.loc)
    return True


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


def guide(latents: torch.Tensor, cond: torch.Tensor, others: dict, sigma: torch.Tensor, scales: dict,
          stream: int) -> torch.Tensor:
    """One stream's guided velocity: the deltas of the passes that ran (`others`: pass -> its
    velocity) in x0 space, summed in the pipeline's order, optional rescale, back to velocity."""
    x0 = latents - cond * sigma
    delta = {name: x0 - (latents - v * sigma) for name, v in others.items()}
    cfg = (scales[("video", "audio")[stream]] - 1) * delta["uncond"] if "uncond" in delta else 0
    stg = scales["stg"][stream] * delta["stg"] if "stg" in delta else 0
    modality = (scales["modality"][stream] - 1) * delta["isolated"] if "isolated" in delta else 0
    guided = x0 + cfg + stg + modality
    rescale = scales[("rescale", "audio_rescale")[stream]]
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
    """Flow-matching Euler over [video | audio] latents with LTX2Pipeline's guidance passes."""
    from difflet.families.ltx2.guidance import INPUT, ISOLATED, PLAIN, STG

    (transformer,) = step.args
    scales = guidance_scales(step, state.params.guidance, state.params.stg_scale, state.params.modality_scale)
    with_stg = stg_runs(env, transformer, step, scales)
    takes_pass = any(n.name == INPUT for n in env.component(transformer).body)
    if (with_stg or scales["do_modality"]) and not takes_pass:
        raise DiffletError(f"STG or modality guidance needs the {INPUT!r} input on {transformer!r}",
                           where=step.loc)
    values = state.values
    video, audio = values["video_latents"], values["audio_latents"]
    split = video.numel()
    scheduler = make_scheduler(step)
    timesteps = timesteps_for(scheduler, state.params.steps, video.shape[1])
    video_coords, audio_coords = values["coords"]
    mask = values.get("conditioning_mask")

    def inputs(v, a, t, text, guidance_pass=PLAIN):
        named = dict(hidden_states=v, audio_hidden_states=a, encoder_hidden_states=text[0],
                     audio_encoder_hidden_states=text[1], timestep=t.expand(1), video_coords=video_coords,
                     audio_coords=audio_coords)
        if mask is not None:  # the pipeline's t.expand(B).unsqueeze(-1) * (1 - conditioning_mask)
            named["video_timestep"] = t.expand(1).unsqueeze(-1) * (1 - mask)
        if takes_pass:
            named[INPUT] = torch.tensor(guidance_pass, dtype=torch.int64)
        return named

    def outputs(named: dict | None) -> tuple:
        return tuple(y.float() for y in named.values()) if named is not None else None

    def predict(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        sigma = scheduler.sigmas[int((timesteps == t).nonzero()[0, 0])]
        v, a = x[:, :split].reshape(video.shape), x[:, split:].reshape(audio.shape)
        # two passes per call of a cfg2 program, else one call each (host/cfg.py); outputs (video, audio)
        cond, uncond = predict_branches(env, transformer, inputs(v, a, t, values["cond"]),
                                        inputs(v, a, t, values["uncond"]) if scales["cfg"] else None)
        extra = [name for name, on in (("stg", with_stg), ("isolated", scales["do_modality"])) if on]
        codes = {"stg": STG, "isolated": ISOLATED}
        runs = [inputs(v, a, t, values["cond"], codes[name]) for name in extra]
        perturbed = predict_branches(env, transformer, *runs) if len(runs) == 2 else \
            (predict_branches(env, transformer, runs[0], None)[0],) if runs else ()
        others = {"uncond": outputs(uncond)} if uncond is not None else {}
        others.update({name: outputs(out) for name, out in zip(extra, perturbed)})
        cond = outputs(cond)
        g = [guide(z, cond[i], {k: o[i] for k, o in others.items()}, sigma, scales, i)
             for i, z in enumerate((v, a))]
        return torch.cat([g[0].flatten(1), g[1].flatten(1)], dim=1)

    flat = torch.cat([video.flatten(1), audio.flatten(1)], dim=1)
    blend = None if mask is None else keep_conditioned(mask, flat.clone(), video.shape[2])
    # the probe watches the conditional pass's video tokens (its feature reads no text or audio),
    # at the step's timestep also for image-to-video: a change signal, and frame 0 never changes
    flat = cached_loop(env, state, scheduler, timesteps, flat, predict=predict, blend=blend,
                       probe_inputs=lambda x, t: dict(hidden_states=x[:, :split].reshape(video.shape),
                                                      timestep=t.expand(1)))
    values["video_latents"] = flat[:, :split].reshape(video.shape)
    values["audio_latents"] = flat[:, split:].reshape(audio.shape)
