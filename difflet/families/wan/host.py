"""Wan 2.1 host steps, matching diffusers' WanPipeline (pipeline_wan.py) and, for image-to-video,
WanImageToVideoPipeline (pipeline_wan_i2v.py) operation for operation.

Invariants:
- Shapes come from the IR (program input/output types), never from a diffusers config: latent
  shape = the transformer's hidden_states input; cache shapes = the decoder's cache inputs; the
  VAE's temporal scale = the chunk decoder's `sample` frames.
- Prompts are cleaned as WanPipeline's prompt_clean does (ftfy when installed, html unescape
  twice, whitespace collapsed), tokenized padded to max_length with truncation; the encoder
  program gets the padded ids and the token count (`valid_text`) and returns the embeddings
  zero past it, which is what the pipeline cuts and zero-pads.
- True CFG when guidance > 1 (WanPipeline's do_classifier_free_guidance): two batch-1
  transformer calls per step, noise = uncond + scale * (cond - uncond); the negative prompt
  defaults to "" as in the pipeline. Guidance <= 1 is one call per step.
- Sampling state (CPU generator seeded with the request seed, a fresh scheduler) lives in
  `RequestState`; the scheduler is the step's `scheduler:` attrs, set_timesteps(steps) only.
- Decode: latents / (1 / latents_std) + latents_mean, then the chunk program once per latent
  frame (`first` = 1 for frame 0), causal caches carried between the calls.
- Image-to-video (`encode_image`): the CLIP image encoder reads the checkpoint's
  CLIPImageProcessor output; the VAE encoder program the image as frame 0 of a zero clip, its
  mean (no draw, so the noise is the generator's only draw, as in the pipeline) normalized, after
  the pipeline's temporal-scale-channel first-frame mask. Every transformer call reads
  [latents | mask | condition] and the image embeddings; the noise has the output's channels.
  First-last-frame (the profile's `last_image`, FLF2V): CLIP reads both images as one batch, the
  clip ends with the last image, and the mask is 1 on its last frame too.
- Image-to-video with `expand_timesteps` (Wan 2.2 TI2V-5B, the wan.denoise attr, as the pipeline's
  config switches both): the VAE encodes the image alone; its normalized mean replaces latent
  frame 0 before every transformer call and after the last step, and t is per token (0 on frame 0's).
"""
from __future__ import annotations

import numpy as np
import torch

from difflet.errors import DiffletError
from difflet.ir.nodes import Node, Op
from difflet.families.wan.facts import FACTS, FPS, prompt_clean  # shared with admission and the HTTP card
from difflet.families.wan.image import first_frame_mask, with_first_frame  # registers wan.encode_image
from difflet.families.wan.nodes import input_type, temporal_scale, transformer
from difflet.runtime.host import host_step
from difflet.runtime.host.cfg import is_cfg_parallel, predict_branches
from difflet.runtime.host.image_inputs import generator
from difflet.runtime.host.loop import cached_loop
from difflet.runtime.host.toolkit import class_config_value, guidance, make_scheduler
from difflet.runtime.host.env import HostEnv, RequestState


def tokenize(env: HostEnv, component: Node, prompt: str) -> tuple[torch.Tensor, int]:
    """(input_ids [1, max_length], valid token count) of the cleaned prompt, as WanPipeline does."""
    tokenizer, max_length = env.tokenizer(component)
    out = tokenizer([prompt_clean(prompt)], padding="max_length", max_length=max_length,
                    truncation=True, add_special_tokens=True, return_attention_mask=True,
                    return_tensors="pt")
    return out.input_ids, int(out.attention_mask.gt(0).sum())


def encode(env: HostEnv, encoder: Node, prompt: str) -> torch.Tensor:
    ids, valid = tokenize(env, encoder, prompt)
    names = [n.name for n in encoder.find(Op.INPUT)]
    if names != ["input_ids", "valid_text"]:  # an unmasked encoder would change the valid rows
        raise DiffletError(f"text encoder {encoder.name!r} must take (input_ids, valid_text), "
                           f"takes {names}", where=encoder.loc)
    out = env.invoke(encoder.name, input_ids=ids, valid_text=valid)
    return next(iter(out.values()))


@host_step("wan.encode_prompt", phase="encode")
def encode_prompt(env: HostEnv, step: Node, state: RequestState) -> None:
    """UMT5 embeddings of the prompt, and of the negative prompt when CFG is on (guidance > 1)."""
    (name,) = step.args
    encoder = env.component(name)
    params = state.params
    state.values["prompt_embeds"] = encode(env, encoder, params.prompt)
    if params.guidance > 1.0:
        negative = params.negative_prompt or ""  # WanPipeline: `negative_prompt or ""`
        state.values["negative_prompt_embeds"] = encode(env, encoder, negative)


@host_step("wan.prepare_latents", phase="denoise")
def prepare_latents(env: HostEnv, step: Node, state: RequestState) -> None:
    """Seeded noise [1, C, F_latent, h, w] from a CPU generator, float32 (the reference's draw)."""
    from diffusers.utils.torch_utils import randn_tensor

    frames = int(env.profile["frames"]) if "frames" in env.profile else None
    scale = temporal_scale(env)
    if frames is None or frames < 1 or (frames - 1) % scale:
        raise DiffletError(f"frames: the profile's frame count must be {scale}k + 1 (Wan's VAE compresses "
                           f"time {scale}x after the first frame), got {frames}", where="frames")
    shape = tuple(transformer(env).find(Op.OUTPUT)[0].results[0].type.shape)  # noise: z_dim channels
    if shape[2] != (frames - 1) // scale + 1:
        raise DiffletError(f"frames: {frames} frames need {(frames - 1) // scale + 1} latent frames, the "
                           f"transformer's hidden_states has {shape[2]}", where="frames")
    state.values["latents"] = randn_tensor(shape, generator=generator(state), device=torch.device("cpu"),
                                           dtype=torch.float32)


def predict_noise(env: HostEnv, name: str, state: RequestState, latents: torch.Tensor,
                  t: torch.Tensor, scale: float) -> torch.Tensor:
    """One step's model output: cond (and uncond + CFG combine at `scale` when there is a negative
    pass; one call for both passes under a cfg2 layout, host/cfg.py)."""
    negative = state.values.get("negative_prompt_embeds")
    cond, uncond = predict_branches(env, name, denoiser_inputs(state, latents, t, state.values["prompt_embeds"]),
                                    denoiser_inputs(state, latents, t, negative) if negative is not None else None)
    cond = next(iter(cond.values()))
    if uncond is None:
        return cond
    uncond = next(iter(uncond.values()))
    return uncond + scale * (cond - uncond)


def denoiser_inputs(state: RequestState, latents: torch.Tensor, t: torch.Tensor, text: torch.Tensor) -> dict:
    """One pass's transformer inputs; image-to-video adds the condition channels and image embeddings,
    or (expand_timesteps) blends frame 0 and gives t per token: 0 on frame 0's, as the pipeline's
    `first_frame_mask[0][0][:, ::2, ::2] * t`."""
    inputs = dict(hidden_states=latents, timestep=t.expand(latents.shape[0]), encoder_hidden_states=text)
    if "first_frame" in state.values:
        inputs["hidden_states"] = with_first_frame(state, latents)
        per_token = (first_frame_mask(latents)[0][0][:, ::2, ::2] * t).flatten()
        inputs["timestep"] = per_token.unsqueeze(0).expand(latents.shape[0], -1)
    if "condition" in state.values:  # the pipeline's cat([latents, condition], dim=1) every step
        inputs["hidden_states"] = torch.cat([latents, state.values["condition"]], dim=1)
    if "image_embeds" in state.values:
        inputs["encoder_hidden_states_image"] = state.values["image_embeds"]
    return inputs


@host_step("wan.denoise", phase="denoise")
def denoise(env: HostEnv, step: Node, state: RequestState) -> None:
    """The step's scheduler (UniPC flow for Wan 2.1) over `steps` timesteps, true CFG. With two
    denoisers (Wan 2.2 A14B: WanPipeline's transformer and transformer_2) and `boundary_ratio`, the
    first runs the steps with t >= boundary_ratio x num_train_timesteps at `guidance`, the second
    the rest at `guidance_2`, as WanPipeline's loop picks them. `expand_timesteps` (Wan 2.2
    TI2V-5B) is WanPipeline's per-token t; in text to video every token's is the step's t, which
    the transformer's modulation reads exactly as the one t the program takes."""
    names = tuple(step.args)
    guidance(step, FACTS, ("cfg",))
    ratio = step.attrs.get("boundary_ratio")
    if len(names) != (1 if ratio is None else 2):
        raise DiffletError(f"wan.denoise takes one denoiser, or two with `boundary_ratio` (a high-noise and a "
                           f"low-noise expert); got {len(names)} and boundary_ratio {ratio}", where=step.loc)
    if "first_frame" in state.values and not step.attrs.get("expand_timesteps"):
        raise DiffletError("wan.denoise: the image's first-frame latent needs `expand_timesteps: true` "
                           "(t per token), as the pipeline's config sets both", where=step.loc)
    for name in names:
        _check_inputs(env, name, state, step)
    scheduler = make_scheduler(step)
    scheduler.set_timesteps(state.params.steps, device="cpu")
    scheduler.set_begin_index(0)
    boundary = None if ratio is None else float(ratio) * scheduler.config.num_train_timesteps
    scales = (state.params.guidance, state.params.guidance_2)

    def predict(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        expert = 0 if boundary is None or t >= boundary else 1
        return predict_noise(env, names[expert], state, x, t, scales[expert])

    # the step cache restarts at the switch: an estimate extrapolated from the other expert's
    # outputs is not one of this expert's (README: Wan 2.2, measured)
    switch = [] if boundary is None else [i for i, t in enumerate(scheduler.timesteps) if t < boundary][:1]
    state.values["latents"] = cached_loop(
        env, state, scheduler, scheduler.timesteps, state.values["latents"], predict=predict,
        # the conditional pass's inputs; the probe's feature reads no text, so either pass's is the same
        probe_inputs=lambda x, t: denoiser_inputs(state, x, t, state.values["prompt_embeds"]),
        restart_at=switch)
    if "first_frame" in state.values:  # the pipeline's last blend, before decoding
        state.values["latents"] = with_first_frame(state, state.values["latents"])


def _check_inputs(env: HostEnv, name: str, state: RequestState, step: Node) -> None:
    """Refuse a denoiser taking inputs this step does not provide (naming them)."""
    node = env.component(name)
    known = ("hidden_states", "timestep", "encoder_hidden_states") + \
        (("encoder_hidden_states_image",) if "image_embeds" in state.values else ())
    extra = [n.name for n in node.find(Op.INPUT)
             if n.name not in known and not (is_cfg_parallel(node) and n.attrs.get("branch") == "uncond")]
    if extra:  # Wan attends its zero-padded text unmasked: nothing else crosses per request
        raise DiffletError(f"transformer {name!r} takes inputs {extra} that wan.denoise does not "
                           f"provide", where=step.loc)
    timestep = input_type(node, "timestep").shape
    if len(timestep) != (2 if "first_frame" in state.values else 1):
        want = "[1, tokens]: t per token, for the image's first frame" if "first_frame" in state.values \
            else "[1]: the step's one t"
        raise DiffletError(f"transformer {name!r}: its timestep input must be {want}; it is "
                           f"{list(timestep)}", where=node.loc)


@host_step("wan.decode", phase="decode")
def decode(env: HostEnv, step: Node, state: RequestState) -> None:
    """De-normalize, decode latent frame by latent frame through the chunk program (causal
    caches carried between calls; zeros before frame 0, where `first` = 1 makes the program
    ignore them), VideoProcessor postprocess -> uint8 [F, H, W, 3] at the step's `fps` (16: Wan 2.1's)."""
    from diffusers.video_processor import VideoProcessor

    (name,) = step.args
    vae = env.component(name)
    inputs = vae.find(Op.INPUT)
    if [n.name for n in inputs[:2]] != ["z", "first"]:
        raise DiffletError(f"decoder {name!r} must be a chunk program (z, first, caches...); it "
                           f"takes {[n.name for n in inputs]}", where=vae.loc)
    latents = state.values["latents"]
    z_dim = latents.shape[1]
    mean = torch.tensor(class_config_value(vae, "latents_mean")).view(1, z_dim, 1, 1, 1)
    inv_std = 1.0 / torch.tensor(class_config_value(vae, "latents_std")).view(1, z_dim, 1, 1, 1)
    latents = latents / inv_std + mean  # WanPipeline: latents / (1 / std) + mean
    caches = {n.name: torch.zeros(n.results[0].type.shape) for n in inputs[2:]}
    frames = []
    for i in range(latents.shape[2]):
        out = env.invoke(name, z=latents[:, :, i:i + 1], first=int(i == 0), **caches)
        sample = out.pop("sample")
        frames.append(sample[:, :, :1] if i == 0 else sample)  # frame 0's chunk is one frame
        caches = dict(zip(caches, out.values()))
    video = torch.cat(frames, dim=2)
    state.values["decoded"] = video
    processor = VideoProcessor(vae_scale_factor=int(env.profile["height"]) // latents.shape[3])
    array = processor.postprocess_video(video, output_type="np")[0]
    state.video = (array * 255).round().astype(np.uint8)
    state.fps = float(step.attrs.get("fps", FPS))
