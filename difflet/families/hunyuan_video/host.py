"""HunyuanVideo (T2V) host steps, matching diffusers' HunyuanVideoPipeline operation for operation.

Invariants:
- Shapes come from the IR, never from a diffusers config: the Llama crop (the template's
  crop_start) = Llama input length - denoiser text length; latents = the denoiser's
  hidden_states shape; frames = the VAE output's frame count.
- The Llama prompt is the pipeline's DEFAULT_PROMPT_TEMPLATE around the prompt, tokenized to
  crop_start + max_text tokens, padded right; after the crop the tokenizer's mask must be a
  prefix of ones, whose length crosses to the denoiser as `valid_text` (no host mask tensor).
- Guidance is embedded (guidance * 1000 into the transformer, one call per step); mode
  "true_cfg" adds the pipeline's true CFG (cond + uncond batch-1 calls, combined on the host).
- Sampling state (CPU generator seeded with the request seed, a fresh scheduler) is per request.
"""
from __future__ import annotations

import numpy as np
import torch

from difflet.errors import DiffletError
from difflet.ir.nodes import Node, Op
from difflet.families.hunyuan_video.facts import DEFAULT_FPS, FACTS, PROMPT_TEMPLATE
from difflet.runtime.host import host_step
from difflet.runtime.host.loop import cached_loop
from difflet.runtime.host.toolkit import (class_config_value, guidance, input_shape, io_shape, make_scheduler,
                                          schedule_step)
from difflet.runtime.invoke import torch_dtype
from difflet.runtime.host.env import HostEnv, RequestState

DEFAULT_NEGATIVE = ""  # true CFG only; the pipeline has no default negative prompt


def llama_embeds(env: HostEnv, llama: Node, text_len: int, prompt: str) -> tuple[torch.Tensor, int]:
    """(prompt embeds [1, text_len, H] after the template crop, valid text count)."""
    length = io_shape(llama, Op.INPUT)[1]
    crop = length - text_len
    if crop < 0:
        raise DiffletError(f"encoder {llama.name!r} takes {length} tokens, fewer than the "
                           f"denoiser's {text_len} text tokens", where=llama.loc)
    tokenizer, _ = env.tokenizer(llama)
    if tokenizer.padding_side != "right":  # the valid rows must not depend on the padding
        raise DiffletError(f"the Llama tokenizer must pad on the right (padding_side='right'), "
                           f"not {tokenizer.padding_side!r}", where="tokenizer")
    enc = tokenizer([PROMPT_TEMPLATE.format(prompt)], max_length=length, padding="max_length",
                    truncation=True, return_tensors="pt", return_attention_mask=True)
    hidden = next(iter(env.invoke(llama.name, input_ids=enc.input_ids).values()))
    mask = enc.attention_mask[0, crop:]
    valid = int(mask.sum())
    if valid == 0:
        raise DiffletError(f"the prompt template tokenizes to fewer than crop_start={crop} tokens, so "
                           "no text is left after the crop", where="tokenizer")
    if not bool(mask[:valid].all()):  # the denoiser keeps keys [0, valid): a prefix
        raise DiffletError("the Llama tokenizer's attention mask is not a prefix of ones",
                           where="tokenizer")
    return hidden[:, crop:], valid


def clip_pooled(env: HostEnv, clip: Node, prompt: str) -> torch.Tensor:
    """CLIP pooler_output [1, D] of the prompt padded/truncated to the program's length."""
    length = io_shape(clip, Op.INPUT)[1]
    ids = env.tokenizer(clip)[0]([prompt], padding="max_length", max_length=length,
                                truncation=True, return_tensors="pt").input_ids
    return next(iter(env.invoke(clip.name, input_ids=ids).values()))


def _guidance(env: HostEnv) -> dict:
    """The denoise step's guidance spec (the encode step reads it too: true CFG encodes the negative)."""
    return guidance(schedule_step(env.module, "hunyuan_video.denoise"), FACTS, ("embedded", "true_cfg"))


@host_step("hunyuan_video.encode_prompt", phase="encode")
def encode_prompt(env: HostEnv, step: Node, state: RequestState) -> None:
    """Llama hidden_states[-3] (cropped) + its valid count, CLIP pooled; the negative too under true CFG."""
    if len(step.args) != 2:
        raise DiffletError("hunyuan_video.encode_prompt takes (llama, clip)", where=step.loc)
    llama, clip = (env.component(name) for name in step.args)
    text_len = input_shape(env.module.components("denoiser")[0], "encoder_hidden_states")[1]
    prompts = {"cond": state.params.prompt}
    if _guidance(env)["mode"] == "true_cfg":
        negative = state.params.negative_prompt
        prompts["uncond"] = DEFAULT_NEGATIVE if negative is None else negative
    for branch, prompt in prompts.items():
        embeds, valid = llama_embeds(env, llama, text_len, prompt)
        state.values[branch] = dict(encoder_hidden_states=embeds, valid_text=valid,
                                    pooled_projections=clip_pooled(env, clip, prompt))


@host_step("hunyuan_video.prepare_latents", phase="denoise")
def prepare_latents(env: HostEnv, step: Node, state: RequestState) -> None:
    """Seeded float32 noise [1, C, latent frames, h, w] from a CPU generator (the reference draw)."""
    from diffusers.utils.torch_utils import randn_tensor

    shape = input_shape(env.module.components("denoiser")[0], "hidden_states")
    generator = torch.Generator("cpu").manual_seed(state.params.seed)
    state.values["latents"] = randn_tensor(shape, generator=generator, device=torch.device("cpu"),
                                           dtype=torch.float32)


def timesteps_for(scheduler, num_steps: int) -> torch.Tensor:
    """The pipeline's schedule: sigmas linspace(1, 0, N + 1)[:-1] (shifted by the scheduler)."""
    sigmas = np.linspace(1.0, 0.0, num_steps + 1)[:-1]
    scheduler.set_timesteps(sigmas=sigmas, device="cpu")
    scheduler.set_begin_index(0)
    return scheduler.timesteps


def denoiser_inputs(state: RequestState, branch: str, latents: torch.Tensor, t: torch.Tensor) -> dict:
    """The transformer's inputs by IR name for one branch (the probe reads the cond branch)."""
    return dict(hidden_states=latents, timestep=t.expand(latents.shape[0]).to(latents.dtype),
                guidance=state.values["guidance"], **state.values[branch])


@host_step("hunyuan_video.denoise", phase="denoise")
def denoise(env: HostEnv, step: Node, state: RequestState) -> None:
    """Flow-matching Euler loop with embedded guidance; true CFG combines two calls per step."""
    (transformer,) = step.args
    spec = _guidance(env)
    mode = spec["mode"]
    names = {n.name for n in env.component(transformer).find(Op.INPUT)}
    if "guidance" not in names:
        raise DiffletError(f"transformer {transformer!r} has no guidance input (HunyuanVideo "
                           "embeds guidance; guidance_embeds must be true)", where=step.loc)
    # embedded scale: the request's guidance; under true CFG the step's `embedded` attr keeps it
    embedded = float(spec.get("embedded", state.params.guidance)) if mode == "true_cfg" \
        else state.params.guidance
    cfg_scale = state.params.guidance if mode == "true_cfg" else 1.0
    # built in the transformer's dtype as the pipeline does (bf16 rounds 6000), crossing as fp32
    dtype = torch_dtype(env.component(transformer).attrs.get("dtype", "float32"))
    state.values["guidance"] = (torch.tensor([embedded], dtype=dtype) * 1000.0).float()

    def predict(latents: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        out = env.invoke(transformer, **denoiser_inputs(state, "cond", latents, t))
        noise = next(iter(out.values()))
        if mode == "true_cfg" and cfg_scale > 1.0:  # the pipeline's do_true_cfg
            neg = env.invoke(transformer, **denoiser_inputs(state, "uncond", latents, t))
            neg = next(iter(neg.values()))
            noise = neg + cfg_scale * (noise - neg)
        return noise

    scheduler = make_scheduler(step)
    timesteps = timesteps_for(scheduler, state.params.steps)
    state.values["latents"] = cached_loop(
        env, state, scheduler, timesteps, state.values["latents"], predict=predict,
        probe_inputs=lambda x, t: denoiser_inputs(state, "cond", x, t))


@host_step("hunyuan_video.decode", phase="decode")
def decode(env: HostEnv, step: Node, state: RequestState) -> None:
    """latents / scaling_factor, the VAE program, VideoProcessor postprocess -> uint8 [F, H, W, 3]."""
    from diffusers.video_processor import VideoProcessor

    (vae_name,) = step.args
    vae = env.component(vae_name)
    scaling = class_config_value(vae, "scaling_factor")
    z = vae.find(Op.INPUT)[0]
    # the pipeline casts to the VAE's dtype before dividing (the order matters below fp32)
    latents = state.values["latents"].to(torch_dtype(z.results[0].type.dtype)) / scaling
    video = next(iter(env.invoke(vae_name, **{z.name: latents}).values()))
    state.values["decoded"] = video
    spatial = io_shape(vae, Op.OUTPUT)[-2] // io_shape(vae, Op.INPUT)[-2]
    frames = VideoProcessor(vae_scale_factor=spatial).postprocess_video(video, output_type="np")
    state.video = (frames[0] * 255).round().astype("uint8")
    state.fps = float(step.attrs.get("fps", DEFAULT_FPS))
