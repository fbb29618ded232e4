"""Qwen-Image host steps, matching diffusers' QwenImagePipeline (pipeline_qwenimage.py) operation
for operation, batch 1.

Invariants:
- Shapes come from the IR: latent channels = transformer hidden_states width / 4, the VAE scale
  factor = profile height / the VAE input's latent height, text keys T = the transformer's
  encoder_hidden_states length, template tokens dropped = profile `template`, and the text
  encoder's input length must be T + template (checked, naming `template`).
- Text: the prompt in the chat template, tokenized right-padded to the encoder's static length;
  the encoder program gives the last layer's hidden states; the host keeps rows
  [template, valid tokens) — the pipeline's trimmed, unpadded embeddings, truncated to T as its
  max_sequence_length = T does. They go to the denoiser zero-padded to T with `valid_text` = their
  count: the program masks the padding, so padding never reaches the output.
- True CFG, as the pipeline with a negative prompt: on when guidance > 1; the negative prompt
  defaults to " " (the official example's). Two batch-1 denoiser passes per step, each with its
  own valid_text (two calls, or one call of a cfg2 program: host/cfg.py), then comb = neg + s * (cond - neg) rescaled to the conditional norm per token.
- Sampling state (generator, scheduler) lives in RequestState, never in HostEnv.
- Image inputs (qwen-image-img2img.dsl, qwen-image-inpaint.dsl): `encode_image` runs the VAE
  encoder program on the image as a one-frame video and leaves the normalized, packed
  `image_latents` (and `latent_mask`); `denoise` starts from them as QwenImageImg2ImgPipeline /
  QwenImageInpaintPipeline do (runtime/host/image_inputs.py).
"""
from __future__ import annotations

import numpy as np
import torch

from difflet.errors import DiffletError
from difflet.ir.nodes import Node, Op
from difflet.families.qwen_image.facts import FACTS, PROMPT_TEMPLATE
from difflet.runtime.host import host_step
from difflet.runtime.host.cfg import predict_branches
from difflet.runtime.host.image_inputs import (generator, packed_mask, preprocess_image, sample_latents,
                                               start_from_image)
from difflet.runtime.host.loop import cached_loop
from difflet.runtime.host.toolkit import (calculate_shift, class_config_value, guidance, input_shape,
                                          make_scheduler, pack_latents, packed_latent_geometry, schedule_step,
                                          vae_scale)
from difflet.runtime.host.env import HostEnv, RequestState

DEFAULT_NEGATIVE_PROMPT = " "  # the official Qwen-Image example's negative prompt


def true_cfg(env: HostEnv, scale: float) -> bool:
    """Whether a request runs true CFG: the pipeline's `true_cfg_scale > 1 and negative prompt`
    (Difflet always has a negative prompt) under the denoise step's "true_cfg" mode."""
    return guidance_mode(schedule_step(env.module, "qwen_image.denoise")) == "true_cfg" and scale > 1


def guidance_mode(step: Node) -> str:
    return guidance(step, FACTS, ("true_cfg", "none"))["mode"]


def encode_text(env: HostEnv, encoder: Node, text_len: int, prompt: str) -> tuple[torch.Tensor, int]:
    """One prompt -> (embeddings [1, T, D] zero-padded after the valid rows, valid row count)."""
    if "template" not in env.profile:
        raise DiffletError("the profile needs `template`, the prompt-template tokens the pipeline drops "
                           "(34 for Qwen-Image)", where="template")
    drop = int(env.profile["template"])
    tokenizer, max_length = env.tokenizer(encoder)
    static = input_shape(encoder, "input_ids")[1]
    if not max_length == static == text_len + drop:
        raise DiffletError(f"text encoder {encoder.name!r} takes {static} tokens (tokenizer max_length "
                           f"{max_length}), but the denoiser's text length + template is {text_len} + "
                           f"{drop}", where="template")
    tokens = tokenizer([PROMPT_TEMPLATE.format(prompt)], padding="max_length", max_length=max_length,
                       truncation=True, padding_side="right", return_tensors="pt")
    hidden = next(iter(env.invoke(encoder.name, input_ids=tokens.input_ids).values()))
    valid = int(tokens.attention_mask[0].sum()) - drop
    if valid < 1:
        raise DiffletError(f"the prompt gives no tokens after the {drop} template tokens", where="prompt")
    embeds = hidden.new_zeros(1, text_len, hidden.shape[-1])
    embeds[0, :valid] = hidden[0, drop:drop + valid]
    return embeds, valid


@host_step("qwen_image.encode_prompt", phase="encode")
def encode_prompt(env: HostEnv, step: Node, state: RequestState) -> None:
    """Prompt (and, under true CFG, negative prompt) embeddings and valid lengths."""
    (encoder,) = (env.component(name) for name in step.args)
    denoiser = env.module.components("denoiser")[0]
    text_len = input_shape(denoiser, "encoder_hidden_states")[1]
    params = state.params
    cfg = true_cfg(env, params.guidance)  # first: a bad guidance mode fails before any program runs
    state.values["cond"] = encode_text(env, encoder, text_len, params.prompt)
    if cfg:
        negative = DEFAULT_NEGATIVE_PROMPT if params.negative_prompt is None else params.negative_prompt
        state.values["uncond"] = encode_text(env, encoder, text_len, negative)


@host_step("qwen_image.prepare_latents", phase="denoise")
def prepare_latents(env: HostEnv, step: Node, state: RequestState) -> None:
    """Seeded noise [1, 1, C, h, w] from a CPU generator (the pipeline's exact draw), packed 2x2."""
    from diffusers.utils.torch_utils import randn_tensor

    params = state.params
    channels, height, width = packed_latent_geometry(env.module, env.profile, params.height, params.width)
    denoiser = env.module.components("denoiser")[0]
    (hidden,) = (n.results[0].type for n in denoiser.find(Op.INPUT, "hidden_states"))
    # drawn in the text embeddings' dtype, as the pipeline does (= the denoiser's dtype)
    noise = randn_tensor((1, 1, channels, height, width), generator=generator(state),
                         device=torch.device("cpu"), dtype=getattr(torch, hidden.dtype))
    state.values["latents"] = pack_latents(noise.view(1, channels, height, width))


@host_step("qwen_image.encode_image", phase="encode")
def encode_image(env: HostEnv, step: Node, state: RequestState) -> None:
    """The input image through the VAE encoder program as a one-frame video, as
    QwenImageImg2ImgPipeline._encode_vae_image (a latent sample drawn with the request's
    generator, normalized by latents_mean/std), packed; with a mask, the inpainting pipeline's
    latent mask. Its encode of the masked image is not run: the 64-channel transformer never
    reads it, and its draw comes after the noise's."""
    (vae_name,) = step.args
    vae, params = env.component(vae_name), state.params
    channels, height, width = packed_latent_geometry(env.module, env.profile, params.height, params.width)
    factor, z_dim = 2 * vae_scale(env.module, env.profile), class_config_value(vae, "z_dim")
    dtype = state.values["cond"][0].dtype  # the pipeline casts the image to prompt_embeds'
    image = preprocess_image(state, factor, z_dim).unsqueeze(2).to(dtype)
    moments = next(iter(env.invoke(vae_name, **{vae.find(Op.INPUT)[0].name: image}).values()))
    latents = sample_latents(moments, state)
    mean = torch.tensor(class_config_value(vae, "latents_mean")).view(1, z_dim, 1, 1, 1).to(latents.dtype)
    inv_std = 1.0 / torch.tensor(class_config_value(vae, "latents_std")).view(1, z_dim, 1, 1, 1).to(latents.dtype)
    latents = ((latents - mean) * inv_std).transpose(1, 2).to(dtype)  # [1, 1, z, h, w]
    state.values["image_latents"] = pack_latents(latents.reshape(1, channels, height, width))
    if params.mask_image is not None:
        state.values["latent_mask"] = packed_mask(state, factor, z_dim, channels, height, width, dtype)


def timesteps_for(scheduler, num_steps: int, image_seq_len: int) -> torch.Tensor:
    """The pipeline's schedule: sigmas linspace(1, 1/N, N), resolution shift mu, begin index 0."""
    cfg = scheduler.config
    mu = calculate_shift(image_seq_len, cfg.get("base_image_seq_len", 256), cfg.get("max_image_seq_len", 4096),
                         cfg.get("base_shift", 0.5), cfg.get("max_shift", 1.15))
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / num_steps, num_steps), device="cpu", mu=mu)
    scheduler.set_begin_index(0)
    return scheduler.timesteps


def denoiser_inputs(text: tuple[torch.Tensor, int], latents: torch.Tensor, t: torch.Tensor) -> dict:
    """The transformer's inputs by IR name for one branch (text = (embeddings, valid count))."""
    embeds, valid = text
    return dict(hidden_states=latents, encoder_hidden_states=embeds,
                timestep=t.expand(latents.shape[0]).to(latents.dtype) / 1000, valid_text=valid)


def predict_noise(env: HostEnv, component: str, state: RequestState, latents: torch.Tensor,
                  t: torch.Tensor, scale: float) -> torch.Tensor:
    """One step's model output: the conditional pass, and under true CFG the negative pass (one
    call for both under a cfg2 layout: host/cfg.py) and the pipeline's norm-preserving combine."""
    uncond = state.values.get("uncond")
    cond, neg = predict_branches(env, component, denoiser_inputs(state.values["cond"], latents, t),
                                 denoiser_inputs(uncond, latents, t) if uncond is not None else None)
    cond = next(iter(cond.values()))
    if neg is None:
        return cond
    neg = next(iter(neg.values()))
    comb = neg + scale * (cond - neg)
    return comb * (torch.norm(cond, dim=-1, keepdim=True) / torch.norm(comb, dim=-1, keepdim=True))


@host_step("qwen_image.denoise", phase="denoise")
def denoise(env: HostEnv, step: Node, state: RequestState) -> None:
    """Flow-matching Euler loop (step-cached by cached_loop) with true CFG or none."""
    (transformer,) = step.args
    guidance_mode(step)
    names = {n.name for n in env.component(transformer).find(Op.INPUT)}
    if "guidance" in names:  # guidance-distilled Qwen transformers are not served
        raise DiffletError(f"transformer {transformer!r} has a guidance input; Qwen-Image is served "
                           "with true CFG only", where="guidance")
    scheduler = make_scheduler(step)
    latents = state.values["latents"]
    timesteps = timesteps_for(scheduler, state.params.steps, latents.shape[1])
    timesteps, latents, blend = start_from_image(state, scheduler, timesteps, latents)
    scale = float(state.params.guidance)
    state.values["latents"] = cached_loop(
        env, state, scheduler, timesteps, latents,
        predict=lambda x, t: predict_noise(env, transformer, state, x, t, scale),
        probe_inputs=lambda x, t: denoiser_inputs(state.values["cond"], x, t), blend=blend)


@host_step("qwen_image.decode", phase="decode")
def decode(env: HostEnv, step: Node, state: RequestState) -> None:
    """Unpack to [1, C, 1, h, w], undo the latent normalization, VAE program, first frame, uint8."""
    from diffusers.image_processor import VaeImageProcessor

    (vae_name,) = step.args
    vae = env.component(vae_name)
    channels, height, width = packed_latent_geometry(env.module, env.profile, state.params.height, state.params.width)
    latents = state.values["latents"]
    latents = latents.view(1, height // 2, width // 2, channels, 2, 2).permute(0, 3, 1, 4, 2, 5)
    z_name = vae.find(Op.INPUT)[0].name
    z_dtype = getattr(torch, vae.find(Op.INPUT)[0].results[0].type.dtype)
    latents = latents.reshape(1, channels, 1, height, width).to(z_dtype)  # the pipeline's .to(vae.dtype)
    mean, std = (class_config_value(vae, k) for k in ("latents_mean", "latents_std"))
    if len(mean) != channels or len(std) != channels:
        raise DiffletError(f"VAE {vae_name!r}: latents_mean/latents_std need {channels} entries "
                           f"(z_dim), got {len(mean)}/{len(std)}", where=vae.loc)
    mean = torch.tensor(mean).view(1, channels, 1, 1, 1).to(latents.dtype)
    inv_std = 1.0 / torch.tensor(std).view(1, channels, 1, 1, 1).to(latents.dtype)
    latents = latents / inv_std + mean
    decoded = next(iter(env.invoke(vae_name, **{z_name: latents}).values()))
    state.values["decoded"] = decoded
    image = decoded[:, :, 0]
    array = VaeImageProcessor(do_resize=False).postprocess(image, output_type="np")
    state.image = (array[0] * 255).round().astype("uint8")
